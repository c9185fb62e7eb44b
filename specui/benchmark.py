"""A benchmark: the plain baseline and each drafter on the same prompts, in one process.

Built on the run service (``specui.service.record_runs``, prompt by prompt in turn, so
speedups compare like with like); ``specui bench``, the API's ``/bench`` and the
background benchmark job call it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from specui.data import Prompt, bench_split, load_prompts
from specui.errors import SpecUIError
from specui.metrics.comparison import Comparison, compare
from specui.metrics.slot_calibration import SlotEce, refit_calibrations, slot_ece
from specui.policy import DEFAULT_POLICY
from specui.policy.calibration import SlotCalibration
from specui.policy.cost import CostModel
from specui.service import DecodeRequest, record_runs
from specui.store import Store
from specui.trace import SamplingParams, check_decode_settings
from specui.workbench import WORKBENCH


def bench_prompts(prompts: str, limit: int | None = None) -> list[Prompt]:
    """The prompts a benchmark of ``prompts`` decodes, in order (run prompt index i is the i-th)."""
    prompt_list = load_prompts(prompts, split=bench_split(prompts), limit=limit)
    if not prompt_list:
        raise SpecUIError(f"prompt set {prompts!r} has no prompts")
    return prompt_list


def group_comparisons(
    store: Store, run_ids: Sequence[int], prompt_list: Sequence[Prompt]
) -> dict[str, Comparison]:
    """The comparison of the runs on each task group of their prompts (Spec-Bench's six), in
    the order the groups first appear; empty when the prompts carry no group."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompt_list):
        if p.meta.get("group"):
            groups.setdefault(p.meta["group"], []).append(i)
    return {g: compare(store, run_ids, prompt_indices=idx) for g, idx in groups.items()}


@dataclass(frozen=True)
class DrafterEce:
    """One drafter run's per-slot estimates against its outcomes; ``ece`` None: the drafter
    stored none (the n-gram lookup: the policy reads its running acceptance instead)."""

    run_id: int
    drafter: str
    algorithm: str
    ece: SlotEce | None


def drafter_eces(store: Store, recorded: Sequence[Any]) -> list[DrafterEce]:
    """The ECE of each drafter run's stored estimates, raw and through the calibration its
    policy read (a hybrid's steps mix two proposers: reported raw)."""
    out = []
    for run in recorded:
        info = store.get_run(run.run_id)
        if info.algorithm == "none":
            continue
        fits = getattr(run.policy, "calibrations", None) or {}
        cal = None if "+" in info.algorithm else fits.get(info.algorithm)
        out.append(
            DrafterEce(run.run_id, info.drafter, info.algorithm, slot_ece(store, [run.run_id], cal))
        )
    return out


@dataclass
class BenchResult:
    """What a bench returns: its runs (the baseline first), their comparison, and the prompts
    in the order the runs decoded them (so per-group comparisons need no second load)."""

    run_ids: list[int]
    comparison: Comparison
    prompts: list[Prompt]
    # The verifier's measured cost model the adaptive policy chose by (None: no run used it).
    cost_model: CostModel | None = None
    # Per drafter run: the ECE of its per-slot estimates (raw and as the policy read them).
    slot_ece: list[DrafterEce] = field(default_factory=list)
    # The calibrations refitted after this bench (``specui.policy.calibration``), by proposer.
    calibrations: dict[str, SlotCalibration] = field(default_factory=dict)

    def groups(self, store: Store) -> dict[str, Comparison]:
        """The comparison on each task group of the prompts (Spec-Bench's six); {} when
        ungrouped."""
        return group_comparisons(store, self.run_ids, self.prompts)


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
    drafter_options: dict[str, Any] | None = None,
    policy: str = DEFAULT_POLICY,
) -> BenchResult:
    """Baseline + each drafter over the same prompts; returns run ids and their comparison.

    ``drafter_options`` go to every drafter that takes them (the n-gram sizes to ngram).

    ``progress(message, fraction done)`` after each prompt (decoded by every run)."""
    # Settings first: a bad one must fail before prompts and models load, and store nothing.
    check_decode_settings(
        max_new_tokens=max_new_tokens, seed=seed, num_speculative_tokens=num_speculative_tokens
    )
    prompt_list = bench_prompts(prompts, limit)
    v = WORKBENCH.verifier(verifier, precision)
    names = ["none", *[d for d in drafters if d not in ("none", "plain")]]
    with ExitStack() as loaded:
        # Every drafter loads before any run starts: a broken folder fails the bench at once,
        # not after the baseline has decoded every prompt.
        runs = []
        # What every run shares; each adds its drafter and K.
        request = partial(
            DecodeRequest,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            seed=seed,
            policy=policy,
        )
        for name in names:
            k = None if name == "none" else num_speculative_tokens
            d = loaded.enter_context(WORKBENCH.drafter(name, v, k, **(drafter_options or {})))
            runs.append(
                (
                    d,
                    request(
                        drafter=name, num_speculative_tokens=k, drafter_options=drafter_options
                    ),
                )
            )
        t0 = time.perf_counter()

        def report(done: int, total: int) -> None:
            if progress is not None:
                progress(
                    f"prompt {done}/{total} decoded by {len(runs)} runs ({', '.join(names)}), "
                    f"{time.perf_counter() - t0:.1f} s",
                    done / total,
                )

        recorded = record_runs(
            store,
            v,
            runs,
            prompt_list,
            prompt_set=prompts,
            owner=owner,
            should_stop=should_stop,
            progress=report,
        )
    run_ids = [r.run_id for r in recorded]
    costs = next((lane_cost(r) for r in recorded if lane_cost(r) is not None), None)
    eces = drafter_eces(store, recorded)  # before the refit: as this bench's policy read them
    # Refit on every stored run of these weights, this bench's included: the next run reads it.
    fitted = refit_calibrations(store, v.fingerprint)
    return BenchResult(run_ids, compare(store, run_ids), prompt_list, costs, eces, fitted)


def lane_cost(run: Any) -> CostModel | None:
    """The cost model a recorded run's adaptive policy chose by, if it had one."""
    policy = getattr(run, "policy", None)
    return getattr(policy, "cost", None)
