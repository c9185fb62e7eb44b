"""Running prompt sets through the engine and storing each drafter's run.

``start_run`` / ``record_runs`` are the one place a local decoding run meets the store: the
CLI's ``bench``, the dashboard's Playground and Compare tabs all call it.
``bench`` runs the plain baseline and each drafter on the same prompts in one
process, prompt by prompt in turn, so speedups compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from specui.algorithms.base import Drafter
from specui.data import Prompt, bench_split, load_prompts
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
        extra={"verifier_precision": verifier.precision},
    )
    return store.create_run(
        verifier=verifier.name, verifier_fingerprint=verifier.fingerprint, prompt_set=prompt_set,
        algorithm=drafter.algorithm, drafter=drafter.name, settings=settings, seed=spec.seed, owner=owner,
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
    return record_runs(store, verifier, [(drafter, spec)], prompts, prompt_set=prompt_set, owner=owner,
                       should_stop=should_stop)[0]


def record_runs(
    store: Store,
    verifier: Verifier,
    runs: Sequence[tuple[Drafter, RunSpec]],
    prompts: Sequence[Prompt],
    *,
    prompt_set: str,
    owner: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[RecordedRun]:
    """Store one run per (drafter, spec), decoding the prompts interleaved: prompt 0 with
    every drafter, then prompt 1, ...  On a noisy machine a slow minute then hits every run
    alike instead of whichever run happened to be decoding, so the speedups of a bench (each
    run's time per token against the baseline's) stay ratios of like with like.

    ``progress(done, total)`` is called after each prompt has been decoded by every run."""
    for _, spec in runs:
        check_decode_settings(max_new_tokens=spec.max_new_tokens, max_context=verifier.max_context)
    encoded = [prompt.encode(verifier) for prompt in prompts]
    # Built (and so checked) before any run row exists: a prompt that cannot run stores nothing.
    decodings = [
        [Decoding(verifier, drafter, ids, max_new_tokens=spec.max_new_tokens, sampling=spec.sampling,
                  seed=spec.seed + i, should_stop=should_stop) for drafter, spec in runs]
        for i, ids in enumerate(encoded)
    ]  # fmt: skip
    stored = [start_run(store, verifier, d, prompt_set=prompt_set, spec=spec, owner=owner) for d, spec in runs]
    results: list[list[GenerationResult]] = [[] for _ in runs]
    with ExitStack() as recording:
        recorders = [recording.enter_context(RunRecorder(store, run.id)) for run in stored]
        for i, prompt in enumerate(prompts):
            if should_stop is not None and should_stop():
                for rec in recorders:
                    rec.stop()
                break
            for decoding, rec, out in zip(decodings[i], recorders, results, strict=True):
                rec.begin_prompt(i, prompt.preview(10_000))
                for step in decoding:
                    rec.step(step)
                rec.end_prompt(decoding.result)
                out.append(decoding.result)
            decodings[i] = []  # a finished decoding still holds its KV cache: let it go now
            if any(out and out[-1].stop_reason == "cancelled" for out in results):
                for rec in recorders:  # every run ends stopped, not only the one that saw it
                    rec.stop()
                break
            if progress is not None:
                progress(i + 1, len(prompts))
    return [RecordedRun(run.id, out) for run, out in zip(stored, results, strict=True)]


def bench_prompts(prompts: str, limit: int | None = None) -> list[Prompt]:
    """The prompts a benchmark of ``prompts`` decodes, in order (run prompt index i is the i-th)."""
    prompt_list = load_prompts(prompts, split=bench_split(prompts), limit=limit)
    if not prompt_list:
        raise SpecUIError(f"prompt set {prompts!r} has no prompts")
    return prompt_list


def group_comparisons(store: Store, run_ids: Sequence[int], prompt_list: Sequence[Prompt]) -> dict[str, Comparison]:
    """The comparison of the runs on each task group of their prompts (Spec-Bench's six), in
    the order the groups first appear; empty when the prompts carry no group."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompt_list):
        if p.meta.get("group"):
            groups.setdefault(p.meta["group"], []).append(i)
    return {g: compare(store, run_ids, prompt_indices=idx) for g, idx in groups.items()}


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
    progress: Callable[[str, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    precision: str | None = None,
) -> tuple[list[int], Comparison]:
    """Baseline + each drafter over the same prompts; returns run ids and their comparison.

    ``progress(message, fraction done)`` after each prompt (decoded by every run)."""
    # Settings first: a bad one must fail before prompts and models load, and store nothing.
    check_decode_settings(max_new_tokens=max_new_tokens, seed=seed, num_speculative_tokens=num_speculative_tokens)
    prompt_list = bench_prompts(prompts, limit)
    v = WORKBENCH.verifier(verifier, precision)
    names = ["none", *[d for d in drafters if d not in ("none", "plain")]]
    with ExitStack() as loaded:
        # Every drafter loads before any run starts: a broken folder fails the bench at once,
        # not after the baseline has decoded every prompt.
        runs = []
        for name in names:
            k = None if name == "none" else num_speculative_tokens
            d = loaded.enter_context(WORKBENCH.drafter(name, v, k))
            runs.append((d, RunSpec(drafter=name, num_speculative_tokens=k, sampling=sampling,
                                    max_new_tokens=max_new_tokens, seed=seed)))
        t0 = time.perf_counter()

        def report(done: int, total: int) -> None:
            if progress is not None:
                progress(f"prompt {done}/{total} decoded by {len(runs)} runs ({', '.join(names)}), "
                         f"{time.perf_counter() - t0:.1f} s", done / total)

        recorded = record_runs(store, v, runs, prompt_list, prompt_set=prompts, owner=owner,
                               should_stop=should_stop, progress=report)
    run_ids = [r.run_id for r in recorded]
    return run_ids, compare(store, run_ids)

