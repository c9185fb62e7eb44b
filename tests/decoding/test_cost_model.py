"""The measured cost model: measured once per verifier, precision, machine and kernel sources,
kept in the data folder, read back without measuring, measured again when the kernels change."""

from __future__ import annotations

import json

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
