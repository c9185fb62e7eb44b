"""The Compare tab's data: one row per stored run, and what its charts draw.

* Acceptance metrics (tau, tokens per step, a_k, acceptance rate) use every stored step
  of the run, as ``specui.acceptance`` defines them; a *draft* is a step that
  drafted at least one token.
* Throughput and speedup use the prompts whose generation finished.  Speedup compares
  time per output token over the prompts that both the run and its baseline finished.
  The baseline is a run without drafter (algorithm "none") on the same backend, prompt
  set and verifier, with the same weights (the verifier's fingerprint; an unknown one
  matches only unknown: two weight sets can share a name) -- preferring one in the same
  comparison, then a finished one, then one with the same temperature and
  max_new_tokens, then the newest.  (Same backend rather than always "local": a vLLM run
  measured against the transformers loop would mostly measure the backend.)
* Intervals: tau and speedup carry a 95% percentile bootstrap interval over prompts (the
  speedup's resamples the run and its baseline by the same prompts).
* Charts: the tokens-per-step histogram and the reliability bins come with the rows, from
  the same reads, so drawing them reads nothing more.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specui.acceptance import AcceptanceCounts
from specui.errors import SpecUIError
from specui.metrics.calibration import (
    ConfidenceMetrics,
    ReliabilityBin,
    ratio_interval,
    reliability_bins,
    slot_rate_auroc,
)
from specui.metrics.columns import BASE_COLUMNS, Column, position_column
from specui.metrics.confidence import load_confidences
from specui.metrics.csv import csv_text, write_csv
from specui.store import BASELINE_ALGORITHM, Run, RunStatus, Store


@dataclass
class Comparison:
    """Rows keyed by ``Column.key`` (one per run, in the order asked) and, per run id, the
    charts' data: ``tokens_per_step`` (1 + accepted draft tokens -> drafts) and
    ``reliability`` (confidence bins; absent for runs without confidences)."""

    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    tokens_per_step: dict[int, dict[int, int]] = field(default_factory=dict)
    reliability: dict[int, list[ReliabilityBin]] = field(default_factory=dict)

    def column(self, key: str) -> Column:
        for c in self.columns:
            if c.key == key:
                return c
        raise KeyError(key)

    def values(self, key: str) -> list[Any]:
        return [r.get(key) for r in self.rows]

    def to_csv(self, dest: str | Path | IO[str], *, bom: bool = False) -> None:
        write_csv(self.columns, self.rows, dest, bom=bom)


def comparison_csv_text(comparison: Comparison) -> str:
    """The comparison's CSV as one string (what the API returns)."""
    return csv_text(comparison.columns, comparison.rows)


def _settings_k(run: Run) -> int | None:
    """The run's K as its settings name it (older runs spelled it k or K)."""
    st = run.settings
    for key in ("num_speculative_tokens", "k", "K"):
        if isinstance(st.get(key), int):
            return st[key]
    return None


def _finished_prompts(
    store: Store, run_ids: Sequence[int], only: Collection[int] | None = None
) -> dict[int, dict[int, tuple[int, float]]]:
    """run id -> prompt index -> (output tokens, wall time s), finished prompts only (of
    ``only``)."""
    out: dict[int, dict[int, tuple[int, float]]] = {rid: {} for rid in run_ids}
    if not run_ids:
        return out
    marks = ",".join("?" * len(run_ids))
    with store.read() as s:
        rows = s.connection().exec_driver_sql(
            f"SELECT run_id, prompt_index, num_output_tokens, wall_time_s FROM results "
            f"WHERE run_id IN ({marks}) AND ended_at IS NOT NULL",
            tuple(run_ids),
        )
        for rid, idx, n, t in rows:
            if only is None or idx in only:
                out[rid][idx] = (n or 0, t or 0.0)
    return out


def _time_per_token(prompts: dict[int, tuple[int, float]], only: set[int]) -> float | None:
    tokens = sum(prompts[i][0] for i in only)
    wall = sum(prompts[i][1] for i in only)
    return wall / tokens if tokens > 0 and wall > 0 else None


def find_baseline(store: Store, run: Run, prefer: Sequence[int] = ()) -> list[Run]:
    """Baseline candidates for ``run``, best first (see the module notes)."""
    if run.is_baseline:
        return [run]
    weights = run.verifier_fingerprint or None
    cands = [
        r
        for r in store.list_runs(
            algorithm=BASELINE_ALGORITHM,
            backend=run.backend,
            verifier=run.verifier,
            prompt_set=run.prompt_set,
        )
        # Same weights, or both unknown: a plain run of other weights measures another model.
        if r.status != RunStatus.RUNNING and (r.verifier_fingerprint or None) == weights
    ]
    st = run.settings
    keys = (
        "temperature",
        "max_new_tokens",
        "verifier_precision",
    )  # a bf16 run's speedup is over bf16 plain

    def rank(r: Run) -> tuple[bool, bool, bool, int]:
        rs = r.settings
        return (
            r.id in prefer,
            r.status == RunStatus.DONE,
            all(rs.get(k) == st.get(k) for k in keys),
            r.id or 0,
        )

    return sorted(cands, key=rank, reverse=True)


@dataclass
class _RunSteps:
    """What the step reads give for one run: totals, acceptance counts, per-prompt draws."""

    totals: dict[str, Any] = field(default_factory=dict)  # steps, drafts, ..., draft_s, verify_s
    histogram: dict[int, int] = field(default_factory=dict)  # accepted draft tokens -> drafts
    # prompt index -> (drafts, accepted draft tokens): tau's bootstrap resamples these
    per_prompt: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def counts(self) -> AcceptanceCounts:
        t = self.totals
        return AcceptanceCounts(
            steps=t.get("steps") or 0,
            drafts=t.get("drafts") or 0,
            drafted_tokens=t.get("drafted") or 0,
            accepted_tokens=t.get("accepted") or 0,
            histogram=self.histogram,
            output_tokens=t.get("emitted") or 0,
        )


def _read_steps(store: Store, ids: Sequence[int], where: str) -> dict[int, _RunSteps]:
    """Two aggregate queries over the runs' steps (``where``: the prompt subset as SQL)."""
    out = {rid: _RunSteps() for rid in ids}
    if not ids:
        return out
    marks = ",".join("?" * len(ids))
    keys = (
        "steps",
        "drafts",
        "drafted",
        "accepted",
        "max_drafted",
        "draft_s",
        "verify_s",
        "emitted",
    )
    with store.read() as s:
        conn = s.connection()
        for rid, idx, *values in conn.exec_driver_sql(
            "SELECT r.run_id, r.prompt_index, count(s.id), sum(s.num_drafted > 0),"
            " sum(s.num_drafted), sum(CASE WHEN s.num_drafted > 0 THEN s.num_accepted ELSE 0 END),"
            " max(s.num_drafted), sum(s.draft_time_s), sum(s.verify_time_s),"
            " sum(json_array_length(s.emitted_token_ids)) FROM results r JOIN steps s ON"
            f" s.result_id = r.id WHERE r.run_id IN ({marks}){where} GROUP BY r.run_id,"
            " r.prompt_index",
            tuple(ids),
        ):
            row = dict(zip(keys, (v or 0 for v in values), strict=True))
            out[rid].per_prompt[idx] = (row["drafts"], row["accepted"])
            # The run's totals over its prompts (its longest draft: the max).
            st = out[rid].totals
            for key, v in row.items():
                st[key] = max(st.get(key, 0), v) if key == "max_drafted" else st.get(key, 0) + v
        for rid, n_acc, count in conn.exec_driver_sql(
            "SELECT r.run_id, s.num_accepted, count(*) FROM results r JOIN steps s ON s.result_id"
            f" = r.id WHERE r.run_id IN ({marks}) AND s.num_drafted > 0{where} GROUP BY r.run_id,"
            " s.num_accepted",
            tuple(ids),
        ):
            out[rid].histogram[n_acc] = count
    return out


def prompt_drafts(store: Store, run_id: int) -> dict[int, tuple[int, int]]:
    """Prompt index -> (drafts, accepted draft tokens) of one run: what a paired comparison of
    two drafters on the same prompts resamples (``calibration.tau_difference_interval``)."""
    run = store.get_run(run_id)  # unknown id -> SpecUIError
    assert run.id is not None
    return _read_steps(store, [run.id], "")[run.id].per_prompt


def _acceptance_cells(run: Run, steps: _RunSteps, k_max: int) -> dict[str, Any]:
    """tau (with its interval), the acceptance rate and a_1..a_k_max of one run."""
    counts = steps.counts
    cells: dict[str, Any] = {
        "num_steps": counts.steps,
        "num_drafts": counts.drafts,
        "num_drafted_tokens": counts.drafted_tokens,
        "num_accepted_tokens": counts.accepted_tokens,
        "acceptance_length": counts.acceptance_length,
        "acceptance_length_ci_low": None,
        "acceptance_length_ci_high": None,
        "tokens_per_step": counts.tokens_per_verifier_step,
        "draft_acceptance_rate": counts.draft_acceptance_rate,
    }
    if counts.drafts:
        # tau - 1 is accepted / drafts: the interval of that ratio, shifted by the bonus token.
        per_prompt = list(steps.per_prompt.values())
        ci = ratio_interval([a for _, a in per_prompt], [d for d, _ in per_prompt])
        if ci is not None:
            cells["acceptance_length_ci_low"], cells["acceptance_length_ci_high"] = (
                1.0 + ci[0],
                1.0 + ci[1],
            )
    # Positions past this run's own K were never drafted: blank, not an acceptance of 0.
    own_k = max(steps.totals.get("max_drafted") or 0, _settings_k(run) or 0)
    a = counts.per_position_acceptance(min(own_k, k_max))
    for k in range(1, k_max + 1):
        cells[f"acceptance_pos_{k}"] = a[k - 1] if k <= len(a) else None
    return cells


def _speedup_cells(
    store: Store,
    run: Run,
    prompts: dict[int, dict[int, tuple[int, float]]],
    ids: Sequence[int],
    only: Collection[int] | None,
) -> dict[str, Any]:
    """Speedup over the best baseline with a common finished prompt, and its interval."""
    cells: dict[str, Any] = {
        "speedup": None,
        "speedup_ci_low": None,
        "speedup_ci_high": None,
        "baseline_run_id": None,
    }
    assert run.id is not None
    fin = prompts[run.id]
    for base in find_baseline(store, run, prefer=ids):
        assert base.id is not None
        base_prompts = (
            prompts[base.id]
            if base.id in prompts
            else _finished_prompts(store, [base.id], only)[base.id]
        )
        common = set(fin) & set(base_prompts)
        mine, theirs = _time_per_token(fin, common), _time_per_token(base_prompts, common)
        if mine and theirs:
            cells["speedup"], cells["baseline_run_id"] = theirs / mine, base.id
            both = sorted(common)
            ci = ratio_interval(
                [fin[i][1] for i in both],
                [fin[i][0] for i in both],
                base_num=[base_prompts[i][1] for i in both],
                base_den=[base_prompts[i][0] for i in both],
            )
            if ci is not None:
                cells["speedup_ci_low"], cells["speedup_ci_high"] = ci
            break
    return cells


def compare(
    store: Store, run_ids: Sequence[int], prompt_indices: Collection[int] | None = None
) -> Comparison:
    """One row per run (in the order given) with the BASE_COLUMNS and a_1..a_K, and the
    charts' data (``Comparison``).

    ``prompt_indices`` restricts every figure, the speedup's baseline included, to those
    prompts of each run (a benchmark's task group: the same indices in every run of it)."""
    runs = [store.get_run(rid) for rid in run_ids]  # unknown id -> SpecUIError
    ids = [r.id for r in runs if r.id is not None]
    if len(set(ids)) != len(ids):
        raise SpecUIError("a run id is listed twice")
    only = None if prompt_indices is None else {int(i) for i in prompt_indices}
    # The subset as SQL: integers only, so they can be written into the statement.
    where = (
        ""
        if only is None
        else f" AND r.prompt_index IN ({','.join(map(str, sorted(only))) or 'NULL'})"
    )
    steps = _read_steps(store, ids, where)
    prompts = _finished_prompts(store, ids, only)
    k_max = max(
        [st.totals.get("max_drafted") or 0 for st in steps.values()]
        + [_settings_k(r) or 0 for r in runs]
        + [0]
    )
    out = Comparison(BASE_COLUMNS + [position_column(k) for k in range(1, k_max + 1)])
    for run in runs:
        rid = run.id
        assert rid is not None
        st, fin = steps[rid], prompts[rid]
        tokens = sum(n for n, _ in fin.values())
        wall = sum(t for _, t in fin.values())
        row: dict[str, Any] = {
            "run_id": rid,
            "label": run.display_name,
            "algorithm": run.algorithm,
            "drafter": run.drafter,
            "verifier": run.verifier,
            "verifier_fingerprint": run.verifier_fingerprint or None,
            "backend": str(run.backend),
            "prompt_set": run.prompt_set,
            "status": str(run.status),
            "num_speculative_tokens": _settings_k(run),
            "temperature": run.settings.get("temperature"),
            "verifier_precision": run.settings.get("verifier_precision"),
            "num_prompts": len(fin),
            "num_output_tokens": tokens,
            "wall_time_s": wall,
            **_acceptance_cells(run, st, k_max),
            "tokens_per_s": tokens / wall if wall > 0 else None,
            "ms_per_output_token": 1000.0 * wall / tokens if tokens > 0 else None,
            **_speedup_cells(store, run, prompts, ids, only),
            "draft_time_s": st.totals.get("draft_s"),
            "verify_time_s": st.totals.get("verify_s"),
            "confidence_ece": None,
            "confidence_auroc": None,
            "confidence_brier": None,
            "confidence_auroc_slot_index": None,
        }
        out.rows.append(row)
        out.tokens_per_step[rid] = st.counts.tokens_per_step()
        smp = load_confidences(store, [rid], prompt_indices=only)
        if smp.confidences.size:
            m = ConfidenceMetrics.of(smp.confidences, smp.labels)
            row["confidence_ece"], row["confidence_auroc"], row["confidence_brier"] = (
                m.ece,
                m.auroc,
                m.brier,
            )
            row["confidence_auroc_slot_index"] = slot_rate_auroc(smp)
            out.reliability[rid] = reliability_bins(smp.confidences, smp.labels)
    return out
