"""Confidence-head scores read back from the store, with their labels: the samples the
calibration metrics (``specui.metrics.calibration``) are computed over, a per-run report and
temperature scaling fitted on one set of runs and measured on another."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import numpy as np

from specui.errors import SpecUIError
from specui.metrics.calibration import (
    EPS,
    ConfidenceMetrics,
    ConfidenceSamples,
    ReliabilityBin,
    apply_temperature,
    fit_temperature,
    reliability_bins,
)
from specui.store import Store


def load_confidences(
    store: Store,
    run_ids: Iterable[int],
    *,
    prefix: bool = False,
    temperature: float = 1.0,
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
            for n_acc, text in (
                s.connection()
                .exec_driver_sql(
                    "SELECT s.num_accepted, s.confidences FROM steps s JOIN results r ON"
                    f" s.result_id = r.id WHERE r.run_id IN ({marks}) AND s.confidences IS NOT NULL"
                    + (
                        ""
                        if prompt_indices is None
                        else (
                            " AND r.prompt_index IN"
                            f" ({','.join(str(int(i)) for i in prompt_indices) or 'NULL'})"
                        )
                    ),
                    tuple(ids),
                )
                .all()
            ):
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
        logs = np.cumsum(np.log(np.clip(conf, EPS, 1.0)))
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


@dataclass
class ConfidenceReport:
    """Calibration of the runs' confidences: pooled, per slot and as reliability bins."""

    overall: ConfidenceMetrics
    per_slot: list[ConfidenceMetrics | None]  # index k: slot k (None: no samples)
    reliability: list[ReliabilityBin]
    temperature: float = 1.0


def confidence_report(
    store: Store, run_ids: Iterable[int], temperature: float = 1.0, n_bins: int = 10
) -> ConfidenceReport | None:
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
    return ConfidenceReport(
        ConfidenceMetrics.of(c, smp.labels, n_bins),
        per_slot,
        reliability_bins(c, smp.labels, n_bins),
        temperature,
    )


@dataclass(frozen=True)
class Calibration:
    """A fitted temperature and what it does on runs it was not fitted on."""

    temperature: float
    before: ConfidenceMetrics  # on the evaluation runs, raw confidences
    after: ConfidenceMetrics  # on the evaluation runs, sigmoid(logit(c) / T)


def calibrate(store: Store, fit_run_ids: Iterable[int], eval_run_ids: Iterable[int]) -> Calibration:
    """Fit temperature scaling on one set of runs and measure it on another
    (keep them disjoint, or the 'after' numbers flatter the head)."""
    fit = load_confidences(store, fit_run_ids)
    ev = load_confidences(store, eval_run_ids)
    if fit.confidences.size == 0 or ev.confidences.size == 0:
        raise SpecUIError("calibration needs runs with confidence-head scores in both sets")
    t = fit_temperature(fit.confidences, fit.labels)
    return Calibration(
        t,
        ConfidenceMetrics.of(ev.confidences, ev.labels),
        ConfidenceMetrics.of(apply_temperature(ev.confidences, t), ev.labels),
    )
