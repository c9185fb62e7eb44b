"""The measured cost model: measured once per verifier, precision, machine and kernel sources,
kept in the data folder, read back without measuring, measured again when the kernels change."""

from __future__ import annotations

import json
import time

import pytest

import specui.policy.cost as cost
from specui.algorithms.simple import NgramDrafter
from specui.algorithms.suffix import SuffixDrafter
from tests.support.verifiers import make_tiny_verifier


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    return tmp_path


def test_measured_once_cached_on_disk_and_measured_again_when_the_kernels_change(
    data_dir, monkeypatch
):
    v = make_tiny_verifier(vocab_size=64, hidden=32, layers=2, seed=1)
    drafters = (NgramDrafter(3), SuffixDrafter(4))
    model = cost.cost_model(v, 5, drafters)
    assert len(model.verify_s) == 5 and all(s > 0 for s in model.verify_s)
    assert model.verify_s == sorted(model.verify_s)  # a longer block never costs less
    assert all(model.draft(d) is not None for d in drafters)
    files = list((data_dir / "cost_models").glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert saved["key"]["verifier"] == v.fingerprint and saved["key"]["kernels"]

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(cost, "measure_verify", no_measuring)
    monkeypatch.setattr(cost, "measure_draft", no_measuring)
    cost._MEMO.clear()  # a new process: from the file
    again = cost.cost_model(v, 5, drafters)
    assert again.verify_s == pytest.approx(model.verify_s, rel=1e-4)
    assert again.verify(8) >= again.verify(5)  # extrapolated past the measured rows

    monkeypatch.undo()
    monkeypatch.setenv("SPECUI_DATA_DIR", str(data_dir))
    monkeypatch.setattr(cost, "kernel_version", lambda: "rewritten")
    cost._MEMO.clear()
    cost.cost_model(v, 5)
    assert len(list((data_dir / "cost_models").glob("*.json"))) == 2


def test_the_summary_names_each_row_count_and_its_ratio_to_one_row():
    model = cost.CostModel(verify_s=[0.005, 0.0075, 0.01], draft_s={"dflash|dflash|k7|": 0.002})
    line = model.summary()
    assert "1: 5.0 (1.00x)" in line and "3: 10.0 (2.00x)" in line and "dflash 2.00" in line
    assert cost.CostModel.from_dict(model.to_dict()).verify_s == pytest.approx(model.verify_s)


def test_a_learned_drafter_gets_a_catch_up_price_kept_with_the_model(data_dir, fixture_verifier):
    """What a draft costs more for each position it has not read: measured for a drafter that
    keeps a cache (not for a lookup), saved, and read back without measuring."""
    from specui.algorithms import create_drafter

    v = fixture_verifier
    learned = create_drafter("dflash", v, seed=0, num_layers=1)
    lookup = NgramDrafter(3)
    model = cost.cost_model(v, 3, (learned, lookup))
    key = cost.drafter_key(learned)
    assert key in model.catchup_s and model.catchup_s[key] >= 0  # a time: never below 0
    assert cost.drafter_key(lookup) not in model.catchup_s
    assert "catch-up us a position dflash" in model.summary()
    cost._MEMO.clear()
    again = cost.cost_model(v, 3, (learned,))
    assert again.catchup_s[key] == pytest.approx(model.catchup_s[key], rel=1e-3)


class _Interrupted:
    """A verifier whose forwards another process holds up: from the fourth repeat of the
    measure on, every forward takes ``SPIKE_S`` longer (as a preempted one does on a busy
    machine), so five of each point's seven kept samples carry it."""

    SPIKE_S = 0.02

    def __init__(self, verifier, rows: int) -> None:
        self._v, self._calls, self._rows = verifier, 0, rows

    def __getattr__(self, name):
        return getattr(self._v, name)

    def forward(self, ids, cache, *args, **kwargs):
        self._calls += 1
        rep = (self._calls - 2) // self._rows  # call 1 fills the context; then rows per repeat
        if rep >= 3:
            time.sleep(self.SPIKE_S)
        return self._v.forward(ids, cache, *args, **kwargs)


def test_a_busy_machine_s_delays_stay_out_of_the_verify_curve():
    # The figure is the least of the repeats (a delay only ever adds time): with two undisturbed
    # repeats of each point, no delay reaches the curve.  The median of the seven would carry it.
    v = make_tiny_verifier(vocab_size=64, hidden=32, layers=2, seed=1)
    rows = 4
    curve = cost.measure_verify(_Interrupted(v, rows), rows, repeats=7)
    assert len(curve) == rows
    assert max(curve) < _Interrupted.SPIKE_S / 2, curve
    assert cost.steady([0.004, 0.03, 0.0041, 0.05]) == 0.004


def test_the_estimator_s_version_is_part_of_the_cache_key(data_dir):
    v = make_tiny_verifier(vocab_size=64, hidden=32, layers=2, seed=1)
    assert cost.model_key(v)["version"] == cost.COST_MODEL_VERSION
