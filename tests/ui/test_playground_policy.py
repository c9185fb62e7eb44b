"""The Playground's decoding-policy toggle and its cost-model chart: the chosen policy is the
one the run decodes with and stores; the chart draws the measured curve and its break-even
acceptance."""

from __future__ import annotations

import threading

import pytest

from specui.policy.choose import break_even_acceptance, cost_curve
from specui.policy.cost import CostModel
from specui.store import Store
from specui.ui.cost_chart import cost_figure, cost_view
from specui.ui.playground import run_playground

PROMPT = "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."


def test_the_curve_gives_each_k_its_break_even_acceptance():
    model = CostModel([0.004, 0.0044, 0.0052, 0.006, 0.021])
    points = cost_curve(model.verify_s)
    assert [p.rows for p in points] == [1, 2, 3, 4, 5]
    assert points[0].break_even is None  # K = 0 drafts nothing
    for p in points[1:4]:
        assert p.break_even == pytest.approx(break_even_acceptance(model.verify, p.rows - 1))
        assert 0 < p.break_even < 1
    assert points[4].break_even is None  # 5x a plain step for 4 drafts: never pays
    fig = cost_figure(points)
    verify, even = fig.data
    assert list(verify.y) == pytest.approx([s * 1e3 for s in model.verify_s])
    assert list(even.x) == [2, 3, 4]  # only the K that can pay


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.db") as s:
        yield s


def _decode(store: Store, decode_policy: str):
    *_, lanes = run_playground(
        store,
        "embedded",
        ["ngram"],
        4,
        0.0,
        1.0,
        0,
        12,
        PROMPT,
        True,
        "off",
        0.5,
        None,
        threading.Event(),
        decode_policy=decode_policy,
    )
    return store.get_run(lanes[0].run_id), lanes[0].decoding.result


def test_the_playground_decodes_and_stores_the_chosen_policy(store):
    fixed_run, fixed = _decode(store, "fixed")
    adaptive_run, adaptive = _decode(store, "adaptive")
    assert fixed_run.settings["policy"] == "fixed" and "cost_model" not in fixed_run.settings
    assert adaptive_run.settings["policy"] == "adaptive"
    assert adaptive_run.settings["cost_model"]["verify_ms"]
    assert adaptive.output_token_ids == fixed.output_token_ids  # greedy: lossless either way
    # After an adaptive Generate the chart has the measured curve to draw.
    fig, note = cost_view("embedded")
    assert fig is not None and "Measured on this machine" in note
    assert len(fig.data[0].y) == len(adaptive_run.settings["cost_model"]["verify_ms"])
