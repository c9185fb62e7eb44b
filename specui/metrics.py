"""Comparison metrics over stored runs, confidence calibration, and CSV export.

Definitions are REFERENCE.md section 3; each column carries its label,
definition and unit so the dashboard and the CSV say what a number means.

* Acceptance metrics (tau, a_k, acceptance rate) use every stored step of the
  run; a *draft* is a step that drafted at least one token.
* Throughput and speedup use the prompts whose generation finished.  Speedup
  compares time per output token over the prompts that both the run and its
  baseline finished.  The baseline is a run without drafter (algorithm "none")
  on the same backend, prompt set and verifier, with the same weights (the
  verifier's fingerprint; an unknown one matches only unknown: two weight sets
  can share a name) -- preferring one in the same
  comparison, then a finished one, then one with the same temperature and
  max_new_tokens, then the newest.  (Same backend rather than always "local": a
  vLLM run measured against the transformers loop would mostly measure the
  backend.)
* Intervals: tau and speedup carry a 95% percentile bootstrap interval over
  prompts (the speedup's resamples the run and its baseline by the same prompts).
  A dozen prompts leave tau uncertain by about +-0.2: read a bar verdict with it.
* Confidence labels: slot k (0-based) of a step counts as accepted iff
  k < num_accepted; slots after the first rejection count as not accepted.

CSV: UTF-8 (optionally with a BOM for Excel), stable snake_case headers, empty
cells for undefined values.  Text cells that a spreadsheet would run as a
formula (leading = + - @ tab CR) get a leading apostrophe (OWASP CSV
injection advice): labels and token texts are user- or model-written.  Owner
session ids, pids and host names never go into a CSV.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from specui.store import BASELINE_ALGORITHM, Run, RunStatus, Store, user_error

# --- columns ------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    key: str  # the CSV header: stable snake_case
    label: str  # what the UI shows
    definition: str
    unit: str = ""
    kind: str = "float"  # float | int | text


# Bootstrap over prompts: how much a number would move on other prompts like these.  It does
# not cover a machine that was slow for a whole run (the bench interleaves runs for that).
BOOTSTRAP_RESAMPLES = 2000
INTERVAL_LEVEL = 0.95
_CI_DEFINITION = (
    "Bound of the 95% bootstrap interval of {what} over prompts (2000 resamples of the prompts, "
    "percentile method; blank under 2 prompts)"
)

BASE_COLUMNS: list[Column] = [
    Column("run_id", "Run", "Id of the run in the store", "", "int"),
    Column("label", "Label", "Name of the run (its drafter when not named)", "", "text"),
    Column("algorithm", "Algorithm", "Drafting algorithm; none = baseline without a drafter", "", "text"),
    Column("drafter", "Drafter", "Drafter (speculator) name", "", "text"),
    Column("verifier", "Verifier", "Target model that verifies the drafts", "", "text"),
    Column("verifier_fingerprint", "Verifier weights",
           "Fingerprint of the verifier's weights (specui.verifier.model_fingerprint; the table shows its first "
           "8 hex digits): two weight sets of one name are two verifiers. Empty = unknown (runs before it, or a "
           "vLLM server whose model is not a local folder)", "", "text"),
    Column("backend", "Backend", "local = SpecUI's decoding loop; vllm = a vLLM server", "", "text"),
    Column("prompt_set", "Prompt set", "Prompts the run generated from", "", "text"),
    Column("status", "Status", "running, done, stopped, failed or incomplete (process died)", "", "text"),
    Column("num_speculative_tokens", "K", "Most draft tokens proposed per step (run settings)", "tokens", "int"),
    Column("temperature", "Temperature", "Sampling temperature (0 = greedy)", ""),
    Column("verifier_precision", "Verifier precision",
           "fp32, or bf16: bf16 matmuls with batch-invariant kernels (specui.batch_invariant); empty for runs before it", "", "text"),
    Column("num_prompts", "Prompts", "Prompts whose generation finished", "prompts", "int"),
    Column("num_output_tokens", "Output tokens", "Tokens generated, over finished prompts", "tokens", "int"),
    Column("wall_time_s", "Wall time", "Generation wall time summed over finished prompts", "s"),
    Column("num_steps", "Steps", "Decoding steps stored (one verifier pass each)", "steps", "int"),
    Column("num_drafts", "Drafts", "Steps that drafted at least one token", "steps", "int"),
    Column("num_drafted_tokens", "Drafted tokens", "Draft tokens proposed, over all steps", "tokens", "int"),
    Column("num_accepted_tokens", "Accepted tokens", "Draft tokens the verifier accepted, over all steps", "tokens", "int"),
    Column("acceptance_length", "τ (acceptance length)", "1 + accepted draft tokens / drafts (the 1 is the verifier's bonus token)", "tokens/step"),
    Column("acceptance_length_ci_low", "τ 95% CI low", _CI_DEFINITION.format(what="τ"), "tokens/step"),
    Column("acceptance_length_ci_high", "τ 95% CI high", _CI_DEFINITION.format(what="τ"), "tokens/step"),
    Column("draft_acceptance_rate", "Draft acceptance rate", "Accepted draft tokens / drafted tokens", "fraction"),
    Column("tokens_per_s", "Throughput", "Output tokens / wall time, over finished prompts", "tokens/s"),
    Column("ms_per_output_token", "Time per output token", "Wall time / output tokens, over finished prompts", "ms/token"),
    Column(
        "speedup",
        "Speedup",
        "Baseline time per output token / this run's time per output token, over the prompts both finished "
        "(baseline: no drafter, same backend, prompt set, verifier and verifier weights)",
        "x",
    ),
    Column("speedup_ci_low", "Speedup 95% CI low", _CI_DEFINITION.format(what="speedup") + ", paired with the baseline's", "x"),
    Column("speedup_ci_high", "Speedup 95% CI high", _CI_DEFINITION.format(what="speedup") + ", paired with the baseline's", "x"),
    Column("baseline_run_id", "Baseline run", "Run the speedup is measured against", "", "int"),
    Column("draft_time_s", "Draft time", "Time spent drafting, summed over stored steps", "s"),
    Column("verify_time_s", "Verify time", "Time spent verifying, summed over stored steps", "s"),
    Column(
        "confidence_ece",
        "Confidence ECE",
        "Expected calibration error of per-slot confidences (10 equal-width bins); slot k is accepted iff k < tokens accepted",
        "fraction",
    ),
    Column("confidence_auroc", "Confidence AUROC", "Chance an accepted slot has a higher confidence than a rejected one", "fraction"),
    Column("confidence_brier", "Confidence Brier", "Mean of (confidence - accepted)^2 over slots", "fraction"),
    Column(
        "confidence_auroc_slot_index",
        "AUROC of the slot index alone",
        "Confidence AUROC's baseline: the same slots scored by their slot's acceptance rate (a head must beat it)",
        "fraction",
    ),
]


def position_column(k: int) -> Column:
    return Column(f"acceptance_pos_{k}", f"a_{k}", f"Drafts whose slot {k} was accepted / drafts", "fraction")


STEP_COLUMNS: list[Column] = [
    Column("run_id", "Run", "Id of the run in the store", "", "int"),
    Column("prompt_index", "Prompt", "Index of the prompt in the prompt set", "", "int"),
    Column("step", "Step", "Step number within the prompt's generation", "", "int"),
    Column("context_len", "Context", "Committed tokens (prompt + generated) before the step", "tokens", "int"),
    Column("num_drafted", "Drafted", "Draft tokens proposed", "tokens", "int"),
    Column("num_accepted", "Accepted", "Draft tokens accepted", "tokens", "int"),
    Column("draft_token_ids", "Draft ids", "Drafted token ids (JSON list)", "", "text"),
    Column("draft_texts", "Draft texts", "Drafted token texts (JSON list)", "", "text"),
    Column("draft_probs", "q(draft)", "Drafter probability of each drafted token (JSON list)", "", "text"),
    Column("target_probs", "p(draft)", "Verifier probability of each drafted token (JSON list)", "", "text"),
    Column("confidences", "Confidences", "Confidence-head estimate per slot (JSON list), empty without a head", "", "text"),
    Column("final_token_id", "Final id", "The verifier's own token closing the step", "", "int"),
    Column("final_token_text", "Final text", "Text of the final token", "", "text"),
    Column("final_token_kind", "Final kind", "bonus (all drafts accepted) or corrected (replaces the first rejected draft)", "", "text"),
    Column("emitted_token_ids", "Emitted ids", "Tokens the step committed (JSON list)", "", "text"),
    Column("draft_time_s", "Draft time", "Time spent drafting", "s"),
    Column("verify_time_s", "Verify time", "Time spent verifying", "s"),
]


# --- confidence metrics (numpy; no sklearn) --------------------------------------------


def expected_calibration_error(confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray, n_bins: int = 10) -> float:
    """Sum over equal-width bins of (bin share) * |accuracy - mean confidence|."""
    c, y = _arrays(confidences, labels)
    if c.size == 0:
        raise ValueError("no samples")
    bins = np.minimum((c * n_bins).astype(np.int64), n_bins - 1)
    conf_sum = np.bincount(bins, weights=c, minlength=n_bins)
    acc_sum = np.bincount(bins, weights=y.astype(np.float64), minlength=n_bins)
    return float(np.abs(acc_sum - conf_sum).sum() / c.size)  # sum_b n_b/N * |acc_b - conf_b|


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float | None:
    """Area under the ROC curve (Mann-Whitney U, ties count half); None with one class."""
    s, y = _arrays(scores, labels)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    _, inverse, counts = np.unique(s[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    avg_rank = (ends - counts + 1 + ends) / 2.0  # 1-based mean rank of each tie group
    ranks = np.empty(s.size)
    ranks[order] = avg_rank[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def brier_score(confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float:
    c, y = _arrays(confidences, labels)
    if c.size == 0:
        raise ValueError("no samples")
    return float(np.mean((c - y) ** 2))


@dataclass(frozen=True)
class ReliabilityBin:
    lo: float
    hi: float
    count: int
    mean_confidence: float | None
    accuracy: float | None


def reliability_bins(confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray, n_bins: int = 10) -> list[ReliabilityBin]:
    """The reliability diagram's data: accuracy against mean confidence per bin."""
    c, y = _arrays(confidences, labels)
    bins = np.minimum((c * n_bins).astype(np.int64), n_bins - 1)
    out = []
    for b in range(n_bins):
        m = bins == b
        n = int(m.sum())
        out.append(ReliabilityBin(b / n_bins, (b + 1) / n_bins, n, float(c[m].mean()) if n else None, float(y[m].mean()) if n else None))
    return out


_EPS = 1e-7


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, _EPS, 1 - _EPS)
    return np.log(c) - np.log1p(-c)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free


def fit_temperature(confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float:
    """Temperature T minimising the log loss of sigmoid(logit(c) / T) on labels.

    The loss is convex in a = 1/T (a one-weight logistic regression), so the
    root of its derivative mean((sigmoid(a z) - y) z) is found by bisection;
    a is kept in [1e-3, 1e3]."""
    c, y = _arrays(confidences, labels)
    if c.size == 0 or y.all() or not y.any():
        raise user_error("fitting a temperature needs both accepted and rejected slots")
    z = _logit(c)
    yf = y.astype(np.float64)

    def grad(a: float) -> float:
        return float(np.mean((_sigmoid(a * z) - yf) * z))

    lo, hi = 1e-3, 1e3
    if grad(lo) >= 0:
        return 1 / lo
    if grad(hi) <= 0:
        return 1 / hi
    for _ in range(200):  # geometric bisection: a spans six decades
        mid = math.sqrt(lo * hi)
        if grad(mid) > 0:
            hi = mid
        else:
            lo = mid
        if hi / lo < 1 + 1e-12:
            break
    return 1.0 / math.sqrt(lo * hi)


def apply_temperature(confidences: Sequence[float] | np.ndarray, temperature: float) -> np.ndarray:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _sigmoid(_logit(np.asarray(confidences, dtype=np.float64)) / temperature)


@dataclass(frozen=True)
class ConfidenceMetrics:
    n: int  # slots
    accepted_rate: float
    ece: float
    auroc: float | None
    brier: float

    @classmethod
    def of(cls, confidences: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> ConfidenceMetrics:
        return cls(
            n=int(confidences.size),
            accepted_rate=float(np.mean(labels)),
            ece=expected_calibration_error(confidences, labels, n_bins),
            auroc=auroc(confidences, labels),
            brier=brier_score(confidences, labels),
        )


@dataclass
class ConfidenceSamples:
    confidences: np.ndarray  # [N] float
    labels: np.ndarray  # [N] bool: slot accepted
    slots: np.ndarray  # [N] int: slot index k (0-based)


def confidence_labels(num_accepted: int, n_slots: int) -> list[bool]:
    """Slot k of a step is accepted iff k < num_accepted."""
    return [k < num_accepted for k in range(n_slots)]


def load_confidences(
    store: Store, run_ids: Iterable[int], *, prefix: bool = False, temperature: float = 1.0,
    prompt_indices: Collection[int] | None = None,
) -> ConfidenceSamples:
    """Every stored confidence of the runs with its accepted-or-not label.

    ``prefix=False`` (the head's own estimand): slot k's score against "slot k accepted, given
    the slots before it were", over the slots up to each step's first rejection.
    ``prefix=True`` (what serving truncates with): ``prod_{j<=k} c_j``, the estimate that the
    draft survives up to slot k, against "slot k accepted", over every drafted slot.
    ``temperature`` != 1 calibrates each slot's score first (``apply_temperature``)."""
    ids = list(run_ids)
    for rid in ids:
        store.get_run(rid)
    texts: list[str] = []
    accepted: list[int] = []
    if ids:
        marks = ",".join("?" * len(ids))
        with store.read() as s:
            for n_acc, text in s.connection().exec_driver_sql(
                f"SELECT s.num_accepted, s.confidences FROM steps s JOIN results r ON s.result_id = r.id "
                f"WHERE r.run_id IN ({marks}) AND s.confidences IS NOT NULL"
                + ("" if prompt_indices is None else f" AND r.prompt_index IN ({','.join(str(int(i)) for i in prompt_indices) or 'NULL'})"),
                tuple(ids),
            ).all():
                accepted.append(n_acc)
                texts.append(text)
    if not texts:
        return ConfidenceSamples(np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64))
    per_step = json.loads("[" + ",".join(texts) + "]")  # one parse, not one per step
    lengths = np.fromiter((len(c) for c in per_step), dtype=np.int64, count=len(per_step))
    conf = np.fromiter((x for c in per_step for x in c), dtype=np.float64, count=int(lengths.sum()))
    if temperature != 1.0:
        conf = apply_temperature(conf, temperature)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    slots = np.arange(conf.size, dtype=np.int64) - starts  # k within its step
    n_acc = np.repeat(np.asarray(accepted, dtype=np.int64), lengths)
    if prefix:
        # Per-step cumulative product, vectorised: a running sum of logs restarted at each step.
        logs = np.cumsum(np.log(np.clip(conf, _EPS, 1.0)))
        first = np.cumsum(lengths) - lengths
        before = np.repeat(np.concatenate([[0.0], logs])[first], lengths)
        return ConfidenceSamples(np.exp(logs - before), slots < n_acc, slots)
    # A slot's confidence is the head's per-slot estimate that the slot is accepted once the
    # slots before it were (it is trained on that slot's 1 - TV, and serving multiplies them
    # up): only slots up to the first rejected one have that outcome observed.  Slots after
    # it are left out rather than counted as rejections they never had the chance to avoid.
    seen = slots <= n_acc
    labels = slots < n_acc  # accepted iff k < num_accepted
    return ConfidenceSamples(conf[seen], labels[seen], slots[seen])


def slot_rate_auroc(samples: ConfidenceSamples) -> float | None:
    """AUROC of the slot index alone: each slot scored by its slot's acceptance rate.

    Acceptance falls with k, so pooled over slots even a head that knows nothing
    but k ranks well; its own AUROC means something only above this baseline.
    (In-sample rates: if anything the baseline is flattered.)"""
    if samples.slots.size == 0:
        return None
    counts = np.bincount(samples.slots)
    rate = np.bincount(samples.slots, weights=samples.labels.astype(np.float64)) / np.maximum(counts, 1)
    return auroc(rate[samples.slots], samples.labels)


@dataclass
class ConfidenceReport:
    overall: ConfidenceMetrics
    per_slot: list[ConfidenceMetrics | None]  # index k: slot k (None: no samples)
    reliability: list[ReliabilityBin]
    temperature: float = 1.0


def confidence_report(store: Store, run_ids: Iterable[int], temperature: float = 1.0, n_bins: int = 10) -> ConfidenceReport | None:
    """ECE / AUROC / Brier overall and per slot, plus reliability bins; None when
    the runs stored no confidences.  ``temperature`` != 1 reports calibrated scores."""
    smp = load_confidences(store, run_ids)
    if smp.confidences.size == 0:
        return None
    c = smp.confidences if temperature == 1.0 else apply_temperature(smp.confidences, temperature)
    per_slot: list[ConfidenceMetrics | None] = []
    for k in range(int(smp.slots.max()) + 1):
        m = smp.slots == k
        per_slot.append(ConfidenceMetrics.of(c[m], smp.labels[m], n_bins) if m.any() else None)
    return ConfidenceReport(ConfidenceMetrics.of(c, smp.labels, n_bins), per_slot, reliability_bins(c, smp.labels, n_bins), temperature)


@dataclass(frozen=True)
class Calibration:
    temperature: float
    before: ConfidenceMetrics  # on the evaluation runs, raw confidences
    after: ConfidenceMetrics  # on the evaluation runs, sigmoid(logit(c) / T)


def calibrate(store: Store, fit_run_ids: Iterable[int], eval_run_ids: Iterable[int]) -> Calibration:
    """Fit temperature scaling on one set of runs and measure it on another
    (keep them disjoint, or the 'after' numbers flatter the head)."""
    fit = load_confidences(store, fit_run_ids)
    ev = load_confidences(store, eval_run_ids)
    if fit.confidences.size == 0 or ev.confidences.size == 0:
        raise user_error("calibration needs runs with confidence-head scores in both sets")
    t = fit_temperature(fit.confidences, fit.labels)
    return Calibration(t, ConfidenceMetrics.of(ev.confidences, ev.labels), ConfidenceMetrics.of(apply_temperature(ev.confidences, t), ev.labels))


def _arrays(a: Sequence[float] | np.ndarray, b: Sequence[bool] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b).astype(bool).ravel()
    if x.shape != y.shape:
        raise ValueError(f"{x.size} scores but {y.size} labels")
    return x, y


# --- run comparison -------------------------------------------------------------------


@dataclass
class Comparison:
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per run, keyed by Column.key

    def column(self, key: str) -> Column:
        for c in self.columns:
            if c.key == key:
                return c
        raise KeyError(key)

    def values(self, key: str) -> list[Any]:
        return [r.get(key) for r in self.rows]

    def to_csv(self, dest: str | Path | IO[str], *, bom: bool = False) -> None:
        write_csv(self.columns, self.rows, dest, bom=bom)


# --- intervals ----------------------------------------------------------------------------


def bootstrap_indices(n: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """[resamples, n] prompt indices drawn with replacement (seeded: a comparison is reproducible)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def ratio_interval(
    num: Sequence[float] | np.ndarray,
    den: Sequence[float] | np.ndarray,
    *,
    base_num: Sequence[float] | np.ndarray | None = None,
    base_den: Sequence[float] | np.ndarray | None = None,
    level: float = INTERVAL_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``sum(num) / sum(den)`` over prompts (one entry each).

    With ``base_num`` / ``base_den`` (the baseline's, same prompts in the same order) the
    statistic is ``(sum(base_num) / sum(base_den)) / (sum(num) / sum(den))`` -- a speedup from
    time per token -- with both runs resampled by the same prompt draws (paired: a prompt that
    is slow for both moves neither).  None under two prompts or where a resample divides by 0.
    """
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = a.size
    if n < 2 or b.size != n:
        return None
    idx = bootstrap_indices(n, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = a[idx].sum(1) / b[idx].sum(1)
        if base_num is not None and base_den is not None:
            bn, bd = np.asarray(base_num, dtype=np.float64), np.asarray(base_den, dtype=np.float64)
            if bn.size != n or bd.size != n:
                raise ValueError("the baseline needs one entry per prompt of the run")
            stat = (bn[idx].sum(1) / bd[idx].sum(1)) / stat
    if not np.all(np.isfinite(stat)):
        return None
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _settings_k(run: Run) -> int | None:
    st = run.settings
    for key in ("num_speculative_tokens", "k", "K"):
        if isinstance(st.get(key), int):
            return st[key]
    return None


def _finished_prompts(store: Store, run_ids: Sequence[int], only: Collection[int] | None = None) -> dict[int, dict[int, tuple[int, float]]]:
    """run id -> prompt index -> (output tokens, wall time s), finished prompts only (of ``only``)."""
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
        for r in store.list_runs(algorithm=BASELINE_ALGORITHM, backend=run.backend, verifier=run.verifier, prompt_set=run.prompt_set)
        # Same weights, or both unknown: a plain run of other weights measures another model.
        if r.status != RunStatus.RUNNING and (r.verifier_fingerprint or None) == weights
    ]
    st = run.settings
    keys = ("temperature", "max_new_tokens", "verifier_precision")  # a bf16 run's speedup is over bf16 plain

    def rank(r: Run) -> tuple[bool, bool, bool, int]:
        rs = r.settings
        return (r.id in prefer, r.status == RunStatus.DONE, all(rs.get(k) == st.get(k) for k in keys), r.id or 0)

    return sorted(cands, key=rank, reverse=True)


def compare(store: Store, run_ids: Sequence[int], prompt_indices: Collection[int] | None = None) -> Comparison:
    """One row per run (in the order given) with the BASE_COLUMNS and a_1..a_K.

    ``prompt_indices`` restricts every figure, the speedup's baseline included, to those
    prompts of each run (a benchmark's task group: the same indices in every run of it)."""
    runs = [store.get_run(rid) for rid in run_ids]  # unknown id -> SpecUIError
    ids = [r.id for r in runs if r.id is not None]
    if len(set(ids)) != len(ids):
        raise user_error("a run id is listed twice")
    only = None if prompt_indices is None else {int(i) for i in prompt_indices}
    # The subset as SQL: integers only, so they can be written into the statement.
    where = "" if only is None else f" AND r.prompt_index IN ({','.join(map(str, sorted(only))) or 'NULL'})"
    stats: dict[int, dict[str, Any]] = {rid: {} for rid in ids}
    hist: dict[int, dict[int, int]] = {rid: {} for rid in ids}
    # run id -> prompt index -> (drafts, accepted draft tokens): tau's bootstrap resamples these
    per_prompt: dict[int, dict[int, tuple[int, int]]] = {rid: {} for rid in ids}
    if ids:
        marks = ",".join("?" * len(ids))
        keys = ("steps", "drafts", "drafted", "accepted", "max_drafted", "draft_s", "verify_s")
        with store.read() as s:
            conn = s.connection()
            for rid, idx, *values in conn.exec_driver_sql(
                f"SELECT r.run_id, r.prompt_index, count(s.id), sum(s.num_drafted > 0), sum(s.num_drafted), "
                f"sum(CASE WHEN s.num_drafted > 0 THEN s.num_accepted ELSE 0 END), max(s.num_drafted), "
                f"sum(s.draft_time_s), sum(s.verify_time_s) "
                f"FROM results r JOIN steps s ON s.result_id = r.id WHERE r.run_id IN ({marks}){where} "
                f"GROUP BY r.run_id, r.prompt_index",
                tuple(ids),
            ):
                row = dict(zip(keys, (v or 0 for v in values), strict=True))
                per_prompt[rid][idx] = (row["drafts"], row["accepted"])
                # The run's totals over its prompts (its longest draft: the max).
                st = stats[rid]
                for key, v in row.items():
                    st[key] = max(st.get(key, 0), v) if key == "max_drafted" else st.get(key, 0) + v
            for rid, n_acc, count in conn.exec_driver_sql(
                f"SELECT r.run_id, s.num_accepted, count(*) FROM results r JOIN steps s ON s.result_id = r.id "
                f"WHERE r.run_id IN ({marks}) AND s.num_drafted > 0{where} GROUP BY r.run_id, s.num_accepted",
                tuple(ids),
            ):
                hist[rid][n_acc] = count
    prompts = _finished_prompts(store, ids, only)
    k_max = max([st.get("max_drafted") or 0 for st in stats.values()] + [_settings_k(r) or 0 for r in runs] + [0])
    columns = BASE_COLUMNS + [position_column(k) for k in range(1, k_max + 1)]

    rows = []
    for run in runs:
        rid = run.id
        assert rid is not None
        st, fin = stats[rid], prompts[rid]
        drafts, drafted, accepted = st.get("drafts") or 0, st.get("drafted") or 0, st.get("accepted") or 0
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
            "num_steps": st.get("steps") or 0,
            "num_drafts": drafts,
            "num_drafted_tokens": drafted,
            "num_accepted_tokens": accepted,
            # No drafts (the baseline): one token per verifier pass.
            "acceptance_length": 1.0 + accepted / drafts if drafts else (1.0 if st.get("steps") else None),
            "acceptance_length_ci_low": None,
            "acceptance_length_ci_high": None,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_s": tokens / wall if wall > 0 else None,
            "ms_per_output_token": 1000.0 * wall / tokens if tokens > 0 else None,
            "speedup": None,
            "speedup_ci_low": None,
            "speedup_ci_high": None,
            "baseline_run_id": None,
            "draft_time_s": st.get("draft_s"),
            "verify_time_s": st.get("verify_s"),
            "confidence_ece": None,
            "confidence_auroc": None,
            "confidence_brier": None,
            "confidence_auroc_slot_index": None,
        }
        if drafts:
            # tau - 1 is accepted / drafts: the interval of that ratio, shifted by the bonus token.
            counts = list(per_prompt[rid].values())
            ci = ratio_interval([a for _, a in counts], [d for d, _ in counts])
            if ci is not None:
                row["acceptance_length_ci_low"], row["acceptance_length_ci_high"] = 1.0 + ci[0], 1.0 + ci[1]
        h = hist[rid]
        # Positions past this run's own K were never drafted: blank, not an acceptance of 0.
        own_k = max(st.get("max_drafted") or 0, _settings_k(run) or 0)
        for k in range(1, k_max + 1):
            row[f"acceptance_pos_{k}"] = sum(c for n, c in h.items() if n >= k) / drafts if drafts and k <= own_k else None
        for base in find_baseline(store, run, prefer=ids):
            base_prompts = prompts.get(base.id) if base.id in prompts else _finished_prompts(store, [base.id], only)[base.id]  # type: ignore[list-item]
            common = set(fin) & set(base_prompts)
            mine, theirs = _time_per_token(fin, common), _time_per_token(base_prompts, common)
            if mine and theirs:
                row["speedup"], row["baseline_run_id"] = theirs / mine, base.id
                both = sorted(common)
                ci = ratio_interval([fin[i][1] for i in both], [fin[i][0] for i in both],
                                    base_num=[base_prompts[i][1] for i in both], base_den=[base_prompts[i][0] for i in both])
                if ci is not None:
                    row["speedup_ci_low"], row["speedup_ci_high"] = ci
                break
        rows.append(row)

    conf = {rid: load_confidences(store, [rid], prompt_indices=only) for rid in ids}
    for row in rows:
        smp = conf[row["run_id"]]
        if smp.confidences.size:
            m = ConfidenceMetrics.of(smp.confidences, smp.labels)
            row["confidence_ece"], row["confidence_auroc"], row["confidence_brier"] = m.ece, m.auroc, m.brier
            row["confidence_auroc_slot_index"] = slot_rate_auroc(smp)
    return Comparison(columns, rows)


# --- CSV ------------------------------------------------------------------------------

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "text":
        text = str(value)
        return "'" + text if text.startswith(_FORMULA_START) else text
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return str(value)


def write_csv(columns: Sequence[Column], rows: Iterable[dict[str, Any]], dest: str | Path | IO[str], *, bom: bool = False) -> None:
    """Write rows under ``columns`` (header = column keys)."""
    if isinstance(dest, str | Path):
        try:
            with open(dest, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
                _write_rows(columns, rows, f)
        except OSError as e:
            raise user_error(f"cannot write {dest}: {e.strerror or e}") from None
    else:
        if bom:
            dest.write("\ufeff")
        _write_rows(columns, rows, dest)


def _write_rows(columns: Sequence[Column], rows: Iterable[dict[str, Any]], f: IO[str]) -> None:
    w = csv.writer(f, lineterminator="\r\n")  # RFC 4180 line ends
    w.writerow([c.key for c in columns])
    for row in rows:
        w.writerow([_cell(row.get(c.key), c.kind) for c in columns])


def iter_step_rows(store: Store, run_ids: Sequence[int]) -> Iterable[dict[str, Any]]:
    """Stored steps as STEP_COLUMNS dicts, run by run, prompt by prompt (streamed).
    Unknown run ids raise here, before anything is written."""
    for rid in run_ids:
        store.get_run(rid)
    return _step_rows(store, list(run_ids))


def _step_rows(store: Store, run_ids: list[int]) -> Iterator[dict[str, Any]]:
    keys = [c.key for c in STEP_COLUMNS[3:]]  # stored step columns, after run/prompt/step
    for rid in run_ids:
        with store.read() as s:
            rows = s.connection().exec_driver_sql(
                f"SELECT r.prompt_index, s.step, {', '.join('s.' + k for k in keys)} FROM steps s "
                f"JOIN results r ON s.result_id = r.id WHERE r.run_id = ? ORDER BY r.prompt_index, s.step",
                (rid,),
            )
            for row in rows:
                d = {"run_id": rid, "prompt_index": row[0], "step": row[1]}
                d.update(zip(keys, row[2:], strict=True))
                yield d


def write_steps_csv(store: Store, run_ids: Sequence[int], dest: str | Path | IO[str], *, bom: bool = False) -> None:
    write_csv(STEP_COLUMNS, iter_step_rows(store, run_ids), dest, bom=bom)


def comparison_csv_text(comparison: Comparison) -> str:
    buf = io.StringIO()
    comparison.to_csv(buf)
    return buf.getvalue()
