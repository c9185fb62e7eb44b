"""Deterministic step traces and runs for the store, metrics and CSV tests (also
imported by store_writer.py, which runs in a separate process)."""

from __future__ import annotations

import math
import random

from specui.store import RunRecorder, Store
from specui.trace import FinalTokenKind, GenerationResult, StepTrace

TEXTS = ["é", "\n", "=SUM(A1)", "def", " ", "日本", '"q"', "a,b"]


def make_trace(step: int, k: int = 4, *, seed: int = 0, confidences: bool = True) -> StepTrace:
    """Step ``step`` of a made-up generation: the same arguments give the same trace."""
    rng = random.Random(seed * 1_000_003 + step)
    n_acc = rng.randint(0, k)
    ids = [rng.randrange(49152) for _ in range(k)]
    final = rng.randrange(49152)
    conf = None
    if confidences and k:
        run, conf = 1.0, []
        for _ in range(k):  # a decreasing cumprod, as a confidence head gives
            run *= rng.uniform(0.5, 1.0)
            conf.append(run)
    return StepTrace(
        step=step,
        context_len=100 + step * 3,
        draft_token_ids=ids,
        draft_texts=[TEXTS[i % len(TEXTS)] for i in ids],
        draft_probs=[rng.random() for _ in range(k)],
        target_probs=[rng.random() for _ in range(k)],
        confidences=conf,
        num_accepted=n_acc,
        final_token_id=final,
        final_token_text=TEXTS[final % len(TEXTS)],
        final_token_kind=FinalTokenKind.BONUS if n_acc == k else FinalTokenKind.CORRECTED,
        emitted_token_ids=ids[:n_acc] + [final],
        draft_time_s=rng.uniform(0.001, 0.01),
        verify_time_s=rng.uniform(0.01, 0.05),
    )


def make_result(
    steps: list[StepTrace], wall_time_s: float, k: int, stop_reason: str = "max_tokens"
) -> GenerationResult:
    out = [t for s in steps for t in s.emitted_token_ids]
    return GenerationResult(
        prompt_token_ids=[1, 2, 3],
        output_token_ids=out,
        output_text="".join(s.final_token_text for s in steps),
        steps=steps,
        stop_reason=stop_reason,
        wall_time_s=wall_time_s,
        num_speculative_tokens=k,
    )


def record(
    store: Store, run_id: int, prompts: list[list[StepTrace]], walls: list[float], k: int, **rec_kw
) -> None:
    """Record hand-built generations the way the benchmark does (streamed steps)."""
    with RunRecorder(store, run_id, **rec_kw) as rec:
        for i, (steps, wall) in enumerate(zip(prompts, walls, strict=True)):
            rec.begin_prompt(i, f"prompt {i}")
            for s in steps:
                rec.step(s)
            rec.end_prompt(make_result(steps, wall, k))


def overconfident_steps(
    n_steps: int, k: int, seed: int, temperature: float, shift: float = 0.0
) -> list[StepTrace]:
    """Steps with per-slot estimates c whose slots are accepted one after another with
    probability sigmoid(logit(c) / temperature + shift): estimates that over-confident, and
    off by that base rate."""
    rng = random.Random(seed)
    out = []
    for i in range(n_steps):
        trace = make_trace(i, k, seed=seed)
        conf = [rng.uniform(0.02, 0.98) for _ in range(k)]
        n_acc = 0
        while n_acc < k:
            c = conf[n_acc]
            if rng.random() >= 1 / (1 + math.exp(-math.log(c / (1 - c)) / temperature - shift)):
                break
            n_acc += 1
        trace.confidences = conf
        trace.num_accepted = n_acc
        trace.emitted_token_ids = trace.draft_token_ids[:n_acc] + [trace.final_token_id]
        out.append(trace)
    return out
