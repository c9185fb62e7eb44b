"""The app's preload: the verifier loads and its cost model is measured in the background at
start-up, so the first Generate's first drafted step does not wait for either."""

from __future__ import annotations

import pytest

import specui.policy.cost as cost
from specui.policy.adaptive import MAX_MEASURED_ROWS
from specui.workbench import Workbench


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    return tmp_path


def test_after_preload_the_cost_model_is_cached(data_dir, fixture_dir, monkeypatch):
    bench = Workbench()
    choice = str(fixture_dir / "verifier")
    bench.preload(choice, "fp32", drafters=["ngram", "not-a-drafter"]).join(timeout=300)
    assert bench.verifier_ready(choice, "fp32")
    assert not bench.costs_pending(choice, "fp32")
    verifier = bench.verifier(choice, "fp32")
    files = list((data_dir / "cost_models").glob("*.json"))
    assert len(files) == 1  # on disk, for the next process too

    def no_measuring(*a, **k):
        raise AssertionError("a run after preload measured again")

    # What a run's adaptive policy asks for next is there already: the longest block it
    # measures and the preloaded drafter's draft (the bad drafter is only skipped).
    monkeypatch.setattr(cost, "measure_verify", no_measuring)
    monkeypatch.setattr(cost, "measure_draft", no_measuring)
    with bench.drafter("ngram", verifier, confidence_policy=None) as ngram:
        model = cost.cost_model(verifier, MAX_MEASURED_ROWS, (ngram,))
    assert len(model.verify_s) == MAX_MEASURED_ROWS
    assert model.draft(ngram) is not None
