"""Fitting each drafter's per-slot estimates to its stored outcomes (the temperatures the
adaptive policy reads, ``specui.policy.calibration``) and the ECE ``specui bench`` reports.

The samples are ``load_confidences(prefix=False)``'s: slot j's raw estimate against "slot j
accepted", over the slots up to each step's first rejection, which is the conditional
acceptance the policy's estimate stands for.  Only runs of one drafter count: a hybrid's steps
mix two proposers and the store does not say which drafted a step, so its runs are left out
(the hybrid's parts are fitted on their own runs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from specui.metrics.calibration import (
    apply_temperature,
    expected_calibration_error,
    fit_temperature,
)
from specui.metrics.confidence import load_confidences
from specui.policy.calibration import SlotCalibration, load_calibrations, save_calibrations
from specui.store import Store
from specui.store.schema import BASELINE_ALGORITHM, Backend, RunStatus

MIN_SLOTS = 50  # fewer slots than this fit a temperature to noise: left raw
RECENT_RUNS = 40  # per drafter, newest first: a refit reads a bounded slice of a big store
USABLE = (RunStatus.DONE, RunStatus.STOPPED)


@dataclass(frozen=True)
class SlotEce:
    """ECE of one run's per-slot estimates, raw and as the policy read them."""

    slots: int
    ece_raw: float
    ece_calibrated: float
    temperature: float


def slot_ece(store: Store, run_ids: Iterable[int], temperature: float = 1.0) -> SlotEce | None:
    """ECE of the runs' stored estimates, raw and after ``temperature``; None without any."""
    smp = load_confidences(store, run_ids)
    if smp.confidences.size == 0:
        return None
    calibrated = apply_temperature(smp.confidences, temperature)
    return SlotEce(
        int(smp.confidences.size),
        expected_calibration_error(smp.confidences, smp.labels),
        expected_calibration_error(calibrated, smp.labels),
        temperature,
    )


def calibration_runs(store: Store, verifier_fingerprint: str) -> dict[str, list[int]]:
    """Proposer name -> the newest ``RECENT_RUNS`` usable local runs of that drafter alone
    (no hybrid, no baseline) on these verifier weights."""
    out: dict[str, list[int]] = {}
    for run in store.list_runs(backend=Backend.LOCAL):
        if run.verifier_fingerprint != verifier_fingerprint or run.status not in USABLE:
            continue
        if run.algorithm == BASELINE_ALGORITHM or "+" in run.algorithm:
            continue
        ids = out.setdefault(run.algorithm, [])
        if len(ids) < RECENT_RUNS:
            ids.append(int(run.id or 0))
    return out


def fit_calibration(
    confidences: np.ndarray, labels: np.ndarray, proposer: str, runs: int
) -> SlotCalibration | None:
    """The temperature of one proposer's slots; None with too few slots or one outcome only."""
    if confidences.size < MIN_SLOTS or labels.all() or not labels.any():
        return None
    t = fit_temperature(confidences, labels)
    return SlotCalibration(
        proposer=proposer,
        temperature=t,
        slots=int(confidences.size),
        runs=runs,
        ece_raw=expected_calibration_error(confidences, labels),
        ece_calibrated=expected_calibration_error(apply_temperature(confidences, t), labels),
    )


def refit_calibrations(store: Store, verifier_fingerprint: str) -> dict[str, SlotCalibration]:
    """Fit every drafter with enough stored slots on these verifier weights and save the fits
    for the policy; a drafter without new slots keeps the fit it had.  Returns what was fitted
    now."""
    fitted: dict[str, SlotCalibration] = {}
    for proposer, run_ids in calibration_runs(store, verifier_fingerprint).items():
        smp = load_confidences(store, run_ids)
        fit = fit_calibration(smp.confidences, smp.labels, proposer, len(run_ids))
        if fit is not None:
            fitted[proposer] = fit
    if fitted:
        save_calibrations(
            verifier_fingerprint, {**load_calibrations(verifier_fingerprint), **fitted}
        )
    return fitted
