"""Running prompt sets through the engine and storing each drafter's run.

``start_run`` / ``record_run`` are the one place a local decoding run meets the store: the
CLI's ``bench``, the dashboard's Playground and Compare tabs all call it.
``bench`` runs the plain baseline and each drafter on the same prompts in one
process, so speedups compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from specui.data import Prompt, bench_split, load_prompts
from specui.drafters.base import Drafter
from specui.engine import Decoding
from specui.metrics import Comparison, compare
from specui.store import DecodingSettings, Run, RunRecorder, Store
from specui.trace import GenerationResult, SamplingParams, SpecUIError, check_decode_settings
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

    def __post_init__(self) -> None:
        # Checked here, before any run row exists: a bad setting stores nothing.
        check_decode_settings(max_new_tokens=self.max_new_tokens, seed=self.seed,
                              num_speculative_tokens=self.num_speculative_tokens)


def start_run(store: Store, verifier: Verifier, drafter: Drafter, *, prompt_set: str, spec: RunSpec,
              owner: str | None = None) -> Run:
    """Create the stored run for decoding with ``drafter`` under ``spec`` (status running)."""
    policy = (spec.drafter_options or {}).get("confidence_policy")
    settings = DecodingSettings(
        num_speculative_tokens=drafter.num_speculative_tokens,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        top_k=spec.sampling.top_k,
        max_new_tokens=spec.max_new_tokens,
        confidence_policy=_policy_label(policy),
    )
    return store.create_run(
        verifier=verifier.name, prompt_set=prompt_set, algorithm=drafter.algorithm, drafter=drafter.name,
        settings=settings, seed=spec.seed, owner=owner,
    )


def _policy_label(policy: dict | str | None) -> str | None:
    if not policy:
        return None
    if isinstance(policy, dict):
        return f"{policy.get('mode')}:{policy.get('threshold')}"
    return str(policy)


@dataclass
class RecordedRun:
    run_id: int
    results: list[GenerationResult]  # one per prompt decoded (fewer after a stop)


def record_run(
    store: Store,
    verifier: Verifier,
    drafter: Drafter,
    prompts: Sequence[Prompt],
    *,
    prompt_set: str,
    spec: RunSpec,
    owner: str | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RecordedRun:
    """Decode every prompt with ``drafter`` and store the run.

    A stop request ends the run as "stopped" with what was decoded so far.
    Every prompt is encoded and checked against the verifier first, so a prompt
    that cannot run (too long, bad token ids) stores no run at all.
    """
    check_decode_settings(max_new_tokens=spec.max_new_tokens, max_context=verifier.max_context)
    decodings = [
        Decoding(verifier, drafter, prompt.encode(verifier), max_new_tokens=spec.max_new_tokens,
                 sampling=spec.sampling, seed=spec.seed + i, should_stop=should_stop)
        for i, prompt in enumerate(prompts)
    ]
    run = start_run(store, verifier, drafter, prompt_set=prompt_set, spec=spec, owner=owner)
    results: list[GenerationResult] = []
    with RunRecorder(store, run.id) as rec:
        for i, (prompt, decoding) in enumerate(zip(prompts, decodings, strict=True)):
            if should_stop is not None and should_stop():
                rec.stop()
                break
            rec.begin_prompt(i, prompt.preview(10_000))
            for step in decoding:
                rec.step(step)
            rec.end_prompt(decoding.result)
            results.append(decoding.result)
            if decoding.result.stop_reason == "cancelled":
                break
    return RecordedRun(run.id, results)


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
    # Settings first: a bad one must fail before prompts and models load, and store nothing.
    check_decode_settings(max_new_tokens=max_new_tokens, seed=seed, num_speculative_tokens=num_speculative_tokens)
    prompt_list = load_prompts(prompts, split=bench_split(prompts), limit=limit)
    if not prompt_list:
        raise SpecUIError(f"prompt set {prompts!r} has no prompts")
    v = WORKBENCH.verifier(verifier)
    names = ["none", *[d for d in drafters if d not in ("none", "plain")]]
    run_ids = []
    with ExitStack() as loaded:
        # Every drafter loads before any run starts: a broken folder fails the bench at once,
        # not after the baseline has decoded every prompt.
        drafters_by_name = {}
        for name in names:
            k = None if name == "none" else num_speculative_tokens
            drafters_by_name[name] = (k, loaded.enter_context(WORKBENCH.drafter(name, v, k)))
        for name, (k, d) in drafters_by_name.items():
            t0 = time.perf_counter()
            spec = RunSpec(drafter=name, num_speculative_tokens=k, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed)
            recorded = record_run(store, v, d, prompt_list, prompt_set=prompts, spec=spec, owner=owner,
                                  should_stop=should_stop)
            run_ids.append(recorded.run_id)
            if should_stop is not None and should_stop():
                break
            if progress is not None:
                progress(f"{name}: {len(prompt_list)} prompts in {time.perf_counter() - t0:.1f} s")
    return run_ids, compare(store, run_ids)

