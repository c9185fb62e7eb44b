"""Calibration of the per-slot estimates the adaptive policy reads: a Platt scaling with an
offset per slot position, fitted on stored slots, fixes estimates that are over-confident and
off by a base rate (which a temperature cannot), is measured out of sample (cross-fitted by
prompt), is saved beside the cost model, and is what the policy's estimates go through.  Old
(temperature) and bad calibration files are handled."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specui.metrics.calibration import (
    ConfidenceSamples,
    apply_temperature,
    expected_calibration_error,
    fit_temperature,
)
from specui.metrics.slot_calibration import (
    calibrated,
    fit_calibration,
    fit_platt,
    refit_calibrations,
    slot_ece,
)
from specui.policy import AdaptivePolicy
from specui.policy.calibration import (
    SlotCalibration,
    calibration_path,
    load_calibrations,
    save_calibrations,
)
from specui.policy.cost import CostModel
from specui.store import Store
from specui.trace import Proposal
from tests.support.scripted_drafters import ScriptedDrafter
from tests.support.store_helpers import overconfident_steps, record

TRUE_T = 2.5  # the drafter's raw estimates are this over-confident
SHIFT = -1.2  # and their acceptance this far below them in logit (a base rate)
FINGERPRINT = "ab" * 16


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def _slots(n: int, seed: int, shift: float = 0.0, by_slot=(0.0,)) -> ConfidenceSamples:
    """Raw estimates c, accepted with probability sigmoid(logit(c) / TRUE_T + shift + by_slot[j])
    at slot j (j drawn uniformly over the offsets given)."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(0.02, 0.98, n)
    j = rng.integers(0, len(by_slot), n)
    z = np.log(c / (1 - c)) / TRUE_T + shift + np.asarray(by_slot)[j]
    return ConfidenceSamples(c, rng.random(n) < _sigmoid(z), j)


def test_fitting_on_overconfident_slots_lowers_the_ece():
    smp = _slots(4000, seed=0)
    fit = fit_calibration(smp, "dflash", runs=1)
    assert fit is not None
    assert fit.temperature == pytest.approx(TRUE_T, rel=0.2)
    assert fit.ece_raw > 0.08  # the raw estimates are far off
    assert fit.ece_calibrated < fit.ece_raw / 3


def test_a_base_rate_offset_is_fixed_where_a_temperature_cannot_fix_it():
    """Estimates too high at every level: the best temperature leaves a large ECE out of
    sample, the Platt fit takes it under 0.05."""
    fit_on, measure = _slots(6000, seed=1, shift=SHIFT), _slots(6000, seed=2, shift=SHIFT)
    t = fit_temperature(fit_on.confidences, fit_on.labels)
    by_temperature = expected_calibration_error(
        apply_temperature(measure.confidences, t), measure.labels
    )
    scale, biases = fit_platt(fit_on.confidences, fit_on.labels)
    cal = SlotCalibration("dflash", scale, biases, 0, 0, 0.0, 0.0)
    by_platt = expected_calibration_error(calibrated(cal, measure), measure.labels)
    assert by_temperature > 0.08
    assert by_platt < 0.05
    assert scale == pytest.approx(1 / TRUE_T, rel=0.2)
    assert biases[0] == pytest.approx(SHIFT, abs=0.2)


def test_acceptance_that_falls_with_the_slot_gets_an_offset_per_position():
    by_slot = (0.0, -0.8, -1.6, -2.4)
    fit_on, measure = _slots(8000, 3, by_slot=by_slot), _slots(8000, 4, by_slot=by_slot)
    scale, biases = fit_platt(fit_on.confidences, fit_on.labels, fit_on.slots)
    assert len(biases) == len(by_slot)
    assert list(np.diff(biases)) == pytest.approx(list(np.diff(by_slot)), abs=0.3)
    with_positions = SlotCalibration("dflash", scale, biases, 0, 0, 0.0, 0.0)
    pooled = SlotCalibration("dflash", *fit_platt(fit_on.confidences, fit_on.labels), 0, 0, 0, 0)
    for j in range(len(by_slot)):  # slot by slot, the pooled fit is off where the offsets are
        m = measure.slots == j
        one = ConfidenceSamples(measure.confidences[m], measure.labels[m], measure.slots[m])
        assert expected_calibration_error(calibrated(with_positions, one), one.labels) < 0.05
    last = measure.slots == 3
    tail = ConfidenceSamples(measure.confidences[last], measure.labels[last], measure.slots[last])
    assert expected_calibration_error(calibrated(pooled, tail), tail.labels) > 0.1


def test_slots_piled_at_one_fit_finitely():
    """A lookup's match shares are often exactly 1: the fit stays finite and calibrated."""
    rng = np.random.default_rng(5)
    c = np.where(rng.random(3000) < 0.6, 1.0, rng.uniform(0.1, 0.9, 3000))
    y = rng.random(3000) < np.where(c == 1.0, 0.55, 0.3)
    scale, biases = fit_platt(c, y)
    assert all(math.isfinite(x) for x in (scale, *biases))
    cal = SlotCalibration("suffix", scale, biases, 0, 0, 0.0, 0.0)
    smp = ConfidenceSamples(c, y, np.zeros(3000, dtype=np.int64))
    assert expected_calibration_error(calibrated(cal, smp), y) < 0.05


def test_too_few_slots_or_one_outcome_are_not_fitted():
    assert fit_calibration(_slots(20, seed=1), "dflash", runs=1) is None
    smp = _slots(500, seed=1)
    ones = ConfidenceSamples(smp.confidences, np.ones(500, dtype=bool), smp.slots)
    assert fit_calibration(ones, "dflash", runs=1) is None


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    s = Store(tmp_path / "specui.db")
    runs = [("dflash", 1, 0.0), ("dflash", 2, 0.0), ("dflash+suffix", 3, 0.0), ("none", 4, 0.0)]
    runs.append(("dflash", 5, 1.0))  # sampled: another outcome; left out of the fit
    for algorithm, seed, temperature in runs:
        run = s.create_run(
            verifier="tiny",
            prompt_set="synthetic",
            algorithm=algorithm,
            verifier_fingerprint=FINGERPRINT,
            settings={"temperature": temperature},
        )
        k = 0 if algorithm == "none" else 4
        prompts = [
            [] if algorithm == "none" else overconfident_steps(200, k, 10 * seed + i, TRUE_T, SHIFT)
            for i in range(4)
        ]
        record(s, run.id, prompts, [1.0] * 4, k)
    yield s
    s.close()


class _Dflash(ScriptedDrafter):
    algorithm = "dflash"


class _Verifier:
    """What ``AdaptivePolicy.start`` reads of a verifier once a cost model is given."""

    fingerprint = FINGERPRINT


def test_refit_saves_the_fit_measured_out_of_sample_and_the_policy_reads_it(store):
    assert load_calibrations(FINGERPRINT) == {}
    fitted = refit_calibrations(store, FINGERPRINT)
    assert set(fitted) == {"dflash"}  # the hybrid's mixed steps and the baseline are left out
    fit = fitted["dflash"]
    assert fit.runs == 2  # the greedy ones: the sampled run is left out
    assert fit.scale == pytest.approx(1 / TRUE_T, rel=0.3)
    # Out of sample: every slot measured by the fit on the other half of the prompts.
    assert fit.heldout_slots == fit.slots
    assert fit.ece_heldout_raw is not None and fit.ece_heldout_raw > 0.1
    assert fit.ece_heldout is not None and fit.ece_heldout < 0.05
    assert calibration_path(FINGERPRINT).is_file()
    assert load_calibrations(FINGERPRINT) == fitted  # stored and read back alike

    policy = AdaptivePolicy(cost=CostModel([1.0, 1.3, 1.7, 2.0, 2.5]))
    policy.start(_Verifier(), _Dflash([[1, 2, 3, 4]]))
    assert policy.calibrations == fitted
    assert policy.settings()["calibration"]["dflash"]["scale"] == fit.scale


def test_the_estimates_the_policy_decides_by_are_calibrated(store):
    """On slots it was not fitted on, the policy's estimates' ECE is small; the raw estimates'
    is not (this fails if the policy reads the raw estimates, or a wrong fit)."""
    refit_calibrations(store, FINGERPRINT)
    policy = AdaptivePolicy(cost=CostModel([1.0, 1.3, 1.7, 2.0, 2.5]))
    policy.start(_Verifier(), _Dflash([[1, 2, 3, 4]]))
    smp = _slots(4000, seed=7, shift=SHIFT)
    est = policy.estimates(
        "dflash", Proposal(token_ids=[0] * 4000, confidences=list(smp.confidences))
    )
    assert expected_calibration_error(smp.confidences, smp.labels) > 0.1
    assert expected_calibration_error(est, smp.labels) < 0.05


def test_slot_ece_reports_raw_and_calibrated(store):
    runs = store.list_runs(algorithm="dflash")
    run_ids = [r.id for r in runs if r.settings["temperature"] == 0]
    raw = slot_ece(store, run_ids)
    assert raw is not None and raw.ece_calibrated == pytest.approx(raw.ece_raw)
    fit = refit_calibrations(store, FINGERPRINT)["dflash"]
    fitted = slot_ece(store, run_ids, fit)
    assert fitted is not None and fitted.ece_calibrated < raw.ece_raw / 2
    baseline = [r.id for r in store.list_runs(algorithm="none")]
    assert slot_ece(store, baseline) is None


def _write(body) -> None:
    path = calibration_path(FINGERPRINT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body if isinstance(body, str) else json.dumps(body))


def test_a_version_1_file_is_read_as_its_temperature(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    entry = {"proposer": "eagle3", "temperature": 2.0, "slots": 300, "runs": 1}
    _write(
        {"version": 1, "proposers": {"eagle3": {**entry, "ece_raw": 0.1, "ece_calibrated": 0.05}}}
    )
    cal = load_calibrations(FINGERPRINT)["eagle3"]
    assert cal.scale == 0.5 and cal.biases == (0.0,)
    assert cal.probability(0.9, 3) == pytest.approx(float(apply_temperature([0.9], 2.0)[0]))


@pytest.mark.parametrize(
    "body",
    [
        "not json {",
        "[1, 2]",
        {"version": 99, "proposers": {}},
        {"version": 2},
    ],
    ids=["garbage", "a-list", "future-version", "no-proposers"],
)
def test_an_unreadable_file_leaves_the_estimates_raw(tmp_path, monkeypatch, caplog, body):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    _write(body)
    assert load_calibrations(FINGERPRINT) == {}
    assert "calibration" in caplog.text
    policy = AdaptivePolicy(cost=CostModel([1.0, 1.3]))
    policy.start(_Verifier(), _Dflash([[1, 2]]))
    assert policy.estimates("dflash", Proposal([1, 2], confidences=[0.9, 0.2])) == [0.9, 0.2]


def test_a_bad_entry_costs_its_proposer_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    good = SlotCalibration("dflash", 0.5, (-1.0, -1.5), 100, 1, 0.2, 0.03, 0.2, 0.04, 100)
    save_calibrations(FINGERPRINT, {"dflash": good})
    body = json.loads(calibration_path(FINGERPRINT).read_text())
    body["proposers"]["eagle3"] = {**body["proposers"]["dflash"], "scale": float("nan")}
    body["proposers"]["peagle"] = {"proposer": "peagle", "scale": 1.0}  # no biases
    _write(json.dumps(body))
    assert load_calibrations(FINGERPRINT) == {"dflash": good}
    assert "eagle3" in caplog.text and "peagle" in caplog.text
