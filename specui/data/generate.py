"""Self-distillation's generation: the verifier's greedy responses to a corpus's prompts.

The work is the verifier package's (``specui.verifier.batched``): :func:`generate_responses`
runs its continuously batched decoder (``engine="fast"``), or transformers' ``generate`` batch
by batch (``engine="transformers"``, and models the decoder does not cover: the reference),
and reports progress.  :func:`measure_generation` times either.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence

import torch

from specui.errors import SpecUIError
from specui.verifier.batched import (
    BatchedDecoder,
    OnDone,
    default_dtype,
    greedy_responses,
    reference_greedy,
    unsupported_reason,
)

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (done, total)

ENGINES = ("fast", "transformers")


def check_generation(max_new_tokens: int, batch_size: int, engine: str) -> None:
    """Refuse generation settings no engine can run (one message wherever they come in)."""
    if max_new_tokens < 1:
        raise SpecUIError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise SpecUIError(f"batch size must be >= 1, got {batch_size}")
    if engine not in ENGINES:
        raise SpecUIError(f"generation engine must be one of {', '.join(ENGINES)}, got {engine!r}")


@torch.inference_mode()
def generate_responses(
    verifier,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int = 64,
    progress: Progress | None = None,
    on_done: OnDone | None = None,
    dtype: torch.dtype | None = None,
    engine: str = "fast",
    generator: BatchedDecoder | None = None,
) -> list[tuple[int, ...]]:
    """Greedy responses to token-id ``prompts``, each cut after its first EOS (kept).

    ``on_done(index, response)`` as each prompt finishes (in finishing order, not prompt
    order), then ``progress(done, total)``.  ``dtype``: the matmuls' dtype (default: the
    verifier's own; bf16 for a batch-invariant bf16 one).  ``engine="transformers"``, or a
    verifier ``unsupported_reason`` names, runs ``reference_greedy`` in batches instead.
    ``generator``: a ``BatchedDecoder`` to reuse (its weights are packed once).
    """
    check_generation(max_new_tokens, batch_size, engine)
    if any(len(p) == 0 for p in prompts):
        raise SpecUIError("cannot generate a response to an empty prompt")
    total = len(prompts)
    out: list[tuple[int, ...] | None] = [None] * total
    done = 0

    def finish(index: int, response: Sequence[int]) -> None:
        nonlocal done
        out[index] = tuple(response)
        done += 1
        if on_done is not None:
            on_done(index, out[index])
        if progress is not None:
            progress(done, total)

    reason = None if engine == "fast" else "engine transformers"
    reason = reason or (None if generator is not None else unsupported_reason(verifier))
    if reason is not None:
        if engine == "fast":
            log.info("generating with transformers for %s: %s", verifier.name, reason)
        _generate_transformers(verifier, prompts, max_new_tokens, batch_size, dtype, finish)
    else:
        greedy_responses(
            verifier, prompts, max_new_tokens, finish, batch_size, dtype=dtype, decoder=generator
        )
    return out  # type: ignore[return-value]


def _in_dtype(verifier, dtype: torch.dtype | None):
    """The verifier with its model in ``dtype``: a copy, or the verifier itself if it is."""
    if dtype is None or dtype == verifier.dtype:
        return verifier
    model = copy.copy(verifier)
    model.model = copy.deepcopy(verifier.model).to(dtype)
    return model


def _generate_transformers(verifier, prompts, max_new_tokens, batch_size, dtype, finish) -> None:
    model = _in_dtype(verifier, dtype) if prompts else verifier
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        for offset, response in enumerate(reference_greedy(model, batch, max_new_tokens)):
            finish(start + offset, response)


def measure_generation(
    verifier,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    engine: str = "fast",
    batch_size: int = 64,
    dtype: torch.dtype | None = torch.bfloat16,
) -> dict[str, float]:
    """Time one engine on ``prompts``: seconds, prompt + response tokens/s, response tokens/s,
    and the same per CPU second of this process (steadier on shared cores).

    For ``engine="fast"`` the weights are packed before the clock starts (a one-off per
    run); the transformers engine's bf16 model copy is likewise made outside it.
    """
    generator = None
    model = verifier
    if engine == "fast" and unsupported_reason(verifier) is None:
        compute = dtype or default_dtype(verifier)
        generator = BatchedDecoder(verifier, compute, slots=min(batch_size, max(len(prompts), 1)))
    elif engine == "transformers":
        model = _in_dtype(verifier, dtype)
    t0, c0 = time.perf_counter(), time.process_time()
    responses = generate_responses(
        model,
        prompts,
        max_new_tokens,
        batch_size,
        engine=engine,
        generator=generator,
        dtype=None if engine == "transformers" else dtype,
    )
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    response_tokens = sum(len(r) for r in responses)
    prompt_tokens = sum(len(p) for p in prompts)
    return {
        "seconds": seconds,
        "prompts": len(prompts),
        "prompt_tokens": prompt_tokens,
        "response_tokens": response_tokens,
        "tokens_per_s": (prompt_tokens + response_tokens) / seconds,
        "response_tokens_per_s": response_tokens / seconds,
        # This process's CPU seconds: what a run gets per core when other programs share them.
        "cpu_seconds": cpu,
        "tokens_per_cpu_s": (prompt_tokens + response_tokens) / cpu,
        "response_tokens_per_cpu_s": response_tokens / cpu,
    }
