"""Calibration of the per-slot estimates the adaptive policy reads: a temperature fitted on
stored over-confident slots lowers their ECE, is saved beside the cost model, and is what the
policy's estimates go through, so the estimates it decides by are calibrated."""

from __future__ import annotations

import numpy as np
import pytest

from specui.metrics.calibration import expected_calibration_error
from specui.metrics.slot_calibration import fit_calibration, refit_calibrations, slot_ece
from specui.policy import AdaptivePolicy
from specui.policy.calibration import calibration_path, load_temperatures
from specui.policy.cost import CostModel
from specui.store import Store
from specui.trace import Proposal
from tests.support.scripted_drafters import ScriptedDrafter
from tests.support.store_helpers import overconfident_steps, record

TRUE_T = 2.5  # the drafter's raw estimates are this over-confident
FINGERPRINT = "ab" * 16


def _overconfident_slots(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = rng.uniform(0.02, 0.98, n)
    p = 1 / (1 + np.exp(-np.log(c / (1 - c)) / TRUE_T))
    return c, rng.random(n) < p


def test_fitting_on_overconfident_slots_lowers_the_ece():
    c, y = _overconfident_slots(4000, seed=0)
    fit = fit_calibration(c, y, "dflash", runs=1)
    assert fit is not None
    assert fit.temperature == pytest.approx(TRUE_T, rel=0.2)
    assert fit.ece_raw > 0.08  # the raw estimates are far off
    assert fit.ece_calibrated < fit.ece_raw / 3


def test_too_few_slots_or_one_outcome_are_not_fitted():
    c, y = _overconfident_slots(20, seed=1)
    assert fit_calibration(c, y, "dflash", runs=1) is None
    c, _ = _overconfident_slots(500, seed=1)
    assert fit_calibration(c, np.ones(500, dtype=bool), "dflash", runs=1) is None


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    s = Store(tmp_path / "specui.db")
    for algorithm, seed in (("dflash", 1), ("dflash", 2), ("dflash+suffix", 3), ("none", 4)):
        run = s.create_run(
            verifier="tiny",
            prompt_set="synthetic",
            algorithm=algorithm,
            verifier_fingerprint=FINGERPRINT,
        )
        k = 0 if algorithm == "none" else 4
        steps = [] if algorithm == "none" else overconfident_steps(400, k, seed, TRUE_T)
        record(s, run.id, [steps], [1.0], k)
    yield s
    s.close()


class _Dflash(ScriptedDrafter):
    algorithm = "dflash"


class _Verifier:
    """What ``AdaptivePolicy.start`` reads of a verifier once a cost model is given."""

    fingerprint = FINGERPRINT


def test_refit_saves_the_fit_and_the_policy_reads_it(store):
    assert load_temperatures(FINGERPRINT) == {}
    fitted = refit_calibrations(store, FINGERPRINT)
    assert set(fitted) == {"dflash"}  # the hybrid's mixed steps and the baseline are left out
    assert fitted["dflash"].runs == 2
    assert fitted["dflash"].temperature == pytest.approx(TRUE_T, rel=0.25)
    assert calibration_path(FINGERPRINT).is_file()

    policy = AdaptivePolicy(cost=CostModel([1.0, 1.3, 1.7, 2.0, 2.5]))
    policy.start(_Verifier(), _Dflash([[1, 2, 3, 4]]))
    assert policy.temperatures == {"dflash": fitted["dflash"].temperature}
    assert policy.settings()["calibration_temperatures"] == policy.temperatures


def test_the_estimates_the_policy_decides_by_are_calibrated(store):
    """On slots it was not fitted on, the policy's estimates' ECE is small; the raw estimates'
    is not (this fails if the policy reads the raw estimates, or a wrong temperature)."""
    refit_calibrations(store, FINGERPRINT)
    policy = AdaptivePolicy(cost=CostModel([1.0, 1.3, 1.7, 2.0, 2.5]))
    policy.start(_Verifier(), _Dflash([[1, 2, 3, 4]]))
    c, y = _overconfident_slots(4000, seed=7)
    est = policy.estimates("dflash", Proposal(token_ids=[0] * c.size, confidences=list(c)))
    assert expected_calibration_error(c, y) > 0.08
    assert expected_calibration_error(est, y) < 0.04


def test_slot_ece_reports_raw_and_calibrated(store):
    run_ids = [r.id for r in store.list_runs(algorithm="dflash")]
    raw = slot_ece(store, run_ids)
    assert raw is not None and raw.ece_calibrated == pytest.approx(raw.ece_raw)
    fitted = slot_ece(store, run_ids, TRUE_T)
    assert fitted is not None and fitted.ece_calibrated < raw.ece_raw / 2
    baseline = [r.id for r in store.list_runs(algorithm="none")]
    assert slot_ece(store, baseline) is None
