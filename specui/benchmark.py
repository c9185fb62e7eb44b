"""Running prompt sets through the engine and storing each drafter's run.

``record_run`` is the one place a local decoding run meets the store: the
CLI's ``bench``, the dashboard's Playground and Compare tabs all call it.
``bench`` runs the plain baseline and each drafter on the same prompts in one
process, so speedups compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specui.data import Prompt, load_prompts, prompt_sets
from specui.drafters.base import Drafter
from specui.engine import Decoding
from specui.metrics import Comparison, compare
from specui.store import DecodingSettings, RunRecorder, Store
from specui.trace import GenerationResult, SamplingParams, SpecUIError, StepTrace
from specui.verifier import Verifier
from specui.workbench import WORKBENCH


@dataclass
class RunSpec:
    """What one run decodes with."""

    drafter: str  # none | ngram | shipped name | folder
    num_speculative_tokens: int | None = None
    sampling: SamplingParams = SamplingParams()
    max_new_tokens: int = 128
    seed: int = 0
    drafter_options: dict | None = None


def record_run(
    store: Store,
    verifier: Verifier,
    drafter: Drafter,
    prompts: Sequence[Prompt],
    *,
    prompt_set: str,
    spec: RunSpec,
    owner: str | None = None,
    on_step: Callable[[int, StepTrace, GenerationResult], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Decode every prompt with ``drafter`` and store the run; returns its id.

    ``on_step(prompt_index, step, partial_result)`` sees each step live.  A
    stop request ends the run as "stopped" with what was decoded so far.
    """
    settings = DecodingSettings(
        num_speculative_tokens=drafter.num_speculative_tokens,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        top_k=spec.sampling.top_k,
        max_new_tokens=spec.max_new_tokens,
        confidence_policy=(spec.drafter_options or {}).get("confidence_policy"),
    )
    run = store.create_run(
        verifier=verifier.name, prompt_set=prompt_set, algorithm=drafter.algorithm, drafter=drafter.name,
        settings=settings, seed=spec.seed, owner=owner,
    )
    with RunRecorder(store, run.id) as rec:
        for i, prompt in enumerate(prompts):
            if should_stop is not None and should_stop():
                rec.stop()
                break
            ids = prompt.encode(verifier)
            decoding = Decoding(
                verifier, drafter, ids, max_new_tokens=spec.max_new_tokens, sampling=spec.sampling,
                seed=spec.seed + i, should_stop=should_stop,
            )
            rec.begin_prompt(i, prompt.preview(10_000))
            for step in decoding:
                rec.step(step)
                if on_step is not None:
                    on_step(i, step, decoding.result)
            rec.end_prompt(decoding.result)
            if progress is not None:
                progress(i + 1, len(prompts))
            if decoding.result.stop_reason == "cancelled":
                break
    return run.id


def bench(
    store: Store,
    *,
    verifier: str,
    drafters: Sequence[str],
    prompts: str,
    limit: int | None = None,
    max_new_tokens: int = 128,
    sampling: SamplingParams = SamplingParams(),
    num_speculative_tokens: int | None = None,
    seed: int = 0,
    owner: str | None = None,
    progress: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[int], Comparison]:
    """Baseline + each drafter over the same prompts; returns run ids and their comparison."""
    # A registered set contributes its held-out split; a user's file is used whole.
    split = "eval" if prompts in prompt_sets() else "all"
    prompt_list = load_prompts(prompts, split=split, limit=limit)
    if not prompt_list:
        raise SpecUIError(f"prompt set {prompts!r} has no prompts")
    v = WORKBENCH.verifier(verifier)
    names = ["none", *[d for d in drafters if d not in ("none", "plain")]]
    run_ids = []
    for name in names:
        t0 = time.perf_counter()
        k = None if name == "none" else num_speculative_tokens
        spec = RunSpec(drafter=name, num_speculative_tokens=k, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed)
        with WORKBENCH.drafter(name, v, k) as d:
            run_ids.append(record_run(store, v, d, prompt_list, prompt_set=prompts, spec=spec, owner=owner,
                                      should_stop=should_stop))
        if should_stop is not None and should_stop():
            break
        if progress is not None:
            progress(f"{name}: {len(prompt_list)} prompts in {time.perf_counter() - t0:.1f} s")
    return run_ids, compare(store, run_ids)

