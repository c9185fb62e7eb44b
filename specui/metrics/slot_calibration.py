"""Fitting each drafter's per-slot estimates to its stored outcomes (the Platt scalings the
adaptive policy reads, ``specui.policy.calibration``) and the ECE ``specui bench`` and
``specui runs calibrate`` report.

The samples are ``load_confidences(prefix=False)``'s: slot j's raw estimate against "slot j
accepted", over the slots up to each step's first rejection, which is the conditional
acceptance the policy's estimate stands for (a slot after the first rejection has no outcome).
Which slots those are depends on the run's policy: a ``fixed`` run sends every drafted slot, so
its slots are every drafted slot up to the first rejection, the sample the policy's estimates
are read on before it chooses; an ``adaptive`` run stores only the slots it sent, a sample the
estimates themselves selected.  Only runs of one drafter count: a hybrid's steps mix two
proposers and the store does not say which drafted a step, so its runs are left out (the
hybrid's parts are fitted on their own runs).

The reported ECE that counts is out of sample: cross-fitted by prompt (``SlotCalibration``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

import numpy as np

from specui.metrics.calibration import ConfidenceSamples, expected_calibration_error
from specui.metrics.confidence import load_confidences
from specui.policy.calibration import (
    EPS,
    SlotCalibration,
    load_calibrations,
    save_calibrations,
)
from specui.store import Store
from specui.store.schema import BASELINE_ALGORITHM, Backend, RunStatus

MIN_SLOTS = 50  # fewer slots than this fit the curve to noise: left raw
RECENT_RUNS = 40  # per drafter, newest first: a refit reads a bounded slice of a big store
USABLE = (RunStatus.DONE, RunStatus.STOPPED)
POSITIONS = 4  # an offset each for slots 0, 1, 2 and one for slot 3 onward
POSITION_RIDGE = 1.0  # pulls the later positions' offsets towards slot 0's (few samples there)


@dataclass(frozen=True)
class SlotEce:
    """ECE of one run's per-slot estimates, raw and as the policy read them."""

    slots: int
    ece_raw: float
    ece_calibrated: float
    calibration: SlotCalibration | None


def calibrated(cal: SlotCalibration | None, samples: ConfidenceSamples) -> np.ndarray:
    """The samples' estimates as the policy reads them through ``cal`` (raw without one)."""
    c = np.clip(samples.confidences, EPS, 1 - EPS)
    if cal is None:
        return c
    biases = np.asarray(cal.biases)[np.minimum(samples.slots, len(cal.biases) - 1)]
    z = cal.scale * (np.log(c) - np.log1p(-c)) + biases
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def slot_ece(
    store: Store, run_ids: Iterable[int], calibration: SlotCalibration | None = None
) -> SlotEce | None:
    """ECE of the runs' stored estimates, raw and through ``calibration``; None without any."""
    smp = load_confidences(store, run_ids)
    if smp.confidences.size == 0:
        return None
    return SlotEce(
        int(smp.confidences.size),
        expected_calibration_error(smp.confidences, smp.labels),
        expected_calibration_error(calibrated(calibration, smp), smp.labels),
        calibration,
    )


def _sampled(settings: dict) -> bool:
    try:
        return float(settings.get("temperature") or 0.0) > 0
    except (TypeError, ValueError):
        return True  # not a greedy run that says so: left out


def calibration_runs(store: Store, verifier_fingerprint: str) -> dict[str, list[int]]:
    """Proposer name -> the newest ``RECENT_RUNS`` usable local greedy runs of that drafter
    alone (no hybrid, no baseline) on these verifier weights.  Sampled runs are left out: at
    T > 0 a slot is accepted with probability min(1, p/q), another outcome than greedy's
    match, and one fit per proposer serves both (a T=1 bench must not refit it to T=1's)."""
    out: dict[str, list[int]] = {}
    for run in store.list_runs(backend=Backend.LOCAL):
        if run.verifier_fingerprint != verifier_fingerprint or run.status not in USABLE:
            continue
        if run.algorithm == BASELINE_ALGORITHM or "+" in run.algorithm:
            continue
        if _sampled(run.settings):
            continue
        ids = out.setdefault(run.algorithm, [])
        if len(ids) < RECENT_RUNS:
            ids.append(int(run.id or 0))
    return out


def fit_platt(
    confidences: np.ndarray, labels: np.ndarray, slots: np.ndarray | None = None
) -> tuple[float, tuple[float, ...]]:
    """(scale, biases) minimising the log loss of sigmoid(scale * logit(c) + bias[slot]):
    a logistic regression on the logit and the slot's position (capped at ``POSITIONS``),
    by Newton's method (the loss is convex).  The later positions' offsets are ridged towards
    slot 0's, so a position with a few slots stays near it."""
    c = np.clip(np.asarray(confidences, dtype=np.float64), EPS, 1 - EPS)
    y = np.asarray(labels, dtype=np.float64)
    pos = np.zeros(c.size, dtype=np.int64) if slots is None else np.minimum(slots, POSITIONS - 1)
    n_pos = int(pos.max()) + 1 if pos.size else 1
    # Columns: logit, intercept (slot 0's bias), then slot j's offset from it, j = 1..n_pos-1.
    x = np.zeros((c.size, 1 + n_pos))
    x[:, 0] = np.log(c) - np.log1p(-c)
    x[:, 1] = 1.0
    for j in range(1, n_pos):
        x[pos == j, 1 + j] = 1.0
    ridge = np.full(1 + n_pos, 1e-6)  # a whisker on every weight: separable slots stay finite
    ridge[2:] = POSITION_RIDGE

    def loss(w: np.ndarray) -> float:
        z = x @ w  # log(1 + e^z) - y z, stably, plus the ridge
        return float((np.logaddexp(0.0, z) - y * z).sum() + 0.5 * (ridge * w * w).sum())

    w = np.zeros(1 + n_pos)
    w[0] = 1.0  # start from the raw estimates
    current = loss(w)
    for _ in range(100):
        p = 0.5 * (1.0 + np.tanh(0.5 * (x @ w)))
        grad = x.T @ (p - y) + ridge * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + np.diag(ridge)
        step = np.linalg.solve(hess, grad)
        # Halve the Newton step until the loss falls: a full step from far off overshoots
        # (a lookup's estimates pile up at 1, where the logit is large).
        t = 1.0
        while t > 1e-6 and loss(w - t * step) > current:
            t /= 2
        w, previous, current = w - t * step, current, loss(w - t * step)
        if previous - current < 1e-10 * max(1.0, abs(current)):
            break
    biases = (float(w[1]), *(float(w[1] + w[1 + j]) for j in range(1, n_pos)))
    return float(w[0]), biases


def _fit(smp: ConfidenceSamples) -> tuple[float, tuple[float, ...]] | None:
    if smp.confidences.size < MIN_SLOTS or smp.labels.all() or not smp.labels.any():
        return None
    return fit_platt(smp.confidences, smp.labels, smp.slots)


def _join(a: ConfidenceSamples, b: ConfidenceSamples) -> ConfidenceSamples:
    return ConfidenceSamples(
        np.concatenate([a.confidences, b.confidences]),
        np.concatenate([a.labels, b.labels]),
        np.concatenate([a.slots, b.slots]),
    )


def prompt_halves(store: Store, run_ids: Collection[int]) -> tuple[list[int], list[int]]:
    """The runs' prompt indices, even and odd: the two halves of the cross-fit."""
    marks = ",".join("?" * len(run_ids))
    with store.read() as s:
        rows = (
            s.connection()
            .exec_driver_sql(
                f"SELECT DISTINCT prompt_index FROM results WHERE run_id IN ({marks})",
                tuple(run_ids),
            )
            .all()
        )
    indices = sorted(int(r[0]) for r in rows)
    return [i for i in indices if i % 2 == 0], [i for i in indices if i % 2 == 1]


def load_halves(store: Store, run_ids: Collection[int]) -> tuple[ConfidenceSamples, ...]:
    """The runs' slots on their even- and on their odd-indexed prompts."""
    return tuple(
        load_confidences(store, run_ids, prompt_indices=idx)
        for idx in prompt_halves(store, run_ids)
    )


def heldout_ece(
    halves: tuple[ConfidenceSamples, ...],
) -> tuple[float | None, float | None, int]:
    """(raw ECE, calibrated ECE, slots) out of sample: each half of the prompts' slots
    calibrated by the fit on the other half, pooled.  (None, None, 0) where a half cannot be
    fitted."""
    parts = []
    for fit_on, measure in ((halves[0], halves[1]), (halves[1], halves[0])):
        fit = _fit(fit_on)
        if fit is None or measure.confidences.size == 0:
            return None, None, 0
        cal = SlotCalibration("heldout", fit[0], fit[1], 0, 0, 0.0, 0.0)
        parts.append((measure, calibrated(cal, measure)))
    labels = np.concatenate([m.labels for m, _ in parts])
    raw = np.concatenate([m.confidences for m, _ in parts])
    out = np.concatenate([p for _, p in parts])
    return (
        expected_calibration_error(raw, labels),
        expected_calibration_error(out, labels),
        int(labels.size),
    )


def fit_calibration(samples: ConfidenceSamples, proposer: str, runs: int) -> SlotCalibration | None:
    """The Platt scaling of one proposer's slots, in-sample numbers only (``refit`` adds the
    held-out ones); None with too few slots or one outcome only."""
    fit = _fit(samples)
    if fit is None:
        return None
    cal = SlotCalibration(proposer, fit[0], fit[1], int(samples.confidences.size), runs, 0.0, 0.0)
    return replace(
        cal,
        ece_raw=expected_calibration_error(samples.confidences, samples.labels),
        ece_calibrated=expected_calibration_error(calibrated(cal, samples), samples.labels),
    )


def refit_calibrations(store: Store, verifier_fingerprint: str) -> dict[str, SlotCalibration]:
    """Fit every drafter with enough stored slots on these verifier weights, measure each fit
    out of sample (cross-fitted by prompt) and save the fits for the policy; a drafter without
    new slots keeps the fit it had.  Returns what was fitted now."""
    fitted: dict[str, SlotCalibration] = {}
    for proposer, run_ids in calibration_runs(store, verifier_fingerprint).items():
        halves = load_halves(store, run_ids)
        fit = fit_calibration(_join(*halves), proposer, len(run_ids))
        if fit is None:
            continue
        raw, out, n = heldout_ece(halves)
        fitted[proposer] = replace(fit, ece_heldout_raw=raw, ece_heldout=out, heldout_slots=n)
    if fitted:
        save_calibrations(
            verifier_fingerprint, {**load_calibrations(verifier_fingerprint), **fitted}
        )
    return fitted


def describe_calibration(name: str, c: SlotCalibration) -> str:
    """One fit in a line: its parameters, its slots and its ECE, out of sample first."""
    held = (
        f"held out (cross-fitted by prompt) {c.ece_heldout_raw:.3f} -> {c.ece_heldout:.3f}"
        f" on {c.heldout_slots} slots"
        if c.ece_heldout is not None and c.ece_heldout_raw is not None
        else "held out: too few slots in a half"
    )
    biases = ", ".join(f"{b:+.2f}" for b in c.biases)
    return (
        f"{name}: scale {c.scale:.2f}, bias by slot [{biases}] on {c.slots} slots of {c.runs}"
        f" runs; ECE {held}; in-sample {c.ece_raw:.3f} -> {c.ece_calibrated:.3f}"
    )
