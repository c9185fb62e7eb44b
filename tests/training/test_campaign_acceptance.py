"""Issue 49's acceptance read from the campaign's ship check (specui.training.campaign_acceptance):
real `specui bench` runs of a candidate beside the drafter it would replace, and each bar."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from specui.paths import shipped_drafters_dir
from specui.training import campaign_acceptance as ca
from specui.training import campaign_eval as ce
from tests.support.paths import REPO
from tests.support.ship_check import tiny_ship_check


@pytest.mark.slow
def test_a_candidate_equal_to_the_shipped_drafter_is_not_paired_better(tmp_path, monkeypatch):
    # The chosen snapshot is the shipped DFlash's copy: every count equal, so it must not ship.
    snap = tmp_path / "runs" / "dflash" / "snapshots" / "step-00000010"
    shutil.copytree(shipped_drafters_dir() / "dflash", snap)
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "dflash-heldout.json").write_text(
        '{"runs": [{"drafter": "step-00000010", "acceptance_length": 1.5}]}'
    )
    tiny_ship_check(monkeypatch)
    assert len(ce.ship_check(tmp_path, ["dflash"])) == 3  # real benches
    (v,) = ca.verdicts(tmp_path)
    assert v.stage == "dflash" and v.tau == v.shipped_tau and v.tau >= 1.0
    assert v.paired is not None and v.paired[0] == 0 and not v.ships
    assert v.math_tau == v.shipped_math_tau and v.speedup is not None and v.speedup > 0
    problems = v.problems(eagle3_speedup=None)
    assert "not paired-better than the shipped drafter on Spec-Bench 48" in problems
    assert not any("math" in p for p in problems)  # no drop: the same drafter
    tools = REPO / "scripts" / "train_shipped_tools.py"
    done = subprocess.run(
        [sys.executable, str(tools), "campaign-acceptance", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr  # a bar is missed
    row = next(line for line in done.stdout.splitlines() if line.startswith("| dflash |"))
    assert f"| {v.tau:.2f} ({v.shipped_tau:.2f}) |" in row and "ships" not in row
    assert "dflash: not paired-better" in done.stdout
    # ... so the ship step keeps the shipped drafter, and says why.
    dest = tmp_path / "drafters"
    done = subprocess.run(
        [
            sys.executable,
            str(tools),
            "campaign-ship",
            str(tmp_path),
            "--dest",
            str(dest),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "dflash: keeps the shipped" in done.stdout and "not paired-better" in done.stdout
    assert not dest.exists()


def _verdict(**kw) -> ca.Verdict:
    base = dict(
        stage="dflash",
        tau=2.1,
        a1=0.5,
        shipped_tau=1.5,
        paired=(0.6, 0.4, 0.8),
        groups={"summarization": 1.9, "rag": 1.85},
        math_tau=2.3,
        shipped_math_tau=2.35,
        speedup=1.2,
    )
    return ca.Verdict(**(base | kw))


def test_each_bar_is_checked():
    assert _verdict().problems(eagle3_speedup=1.1) == []
    assert ca.best_problems([_verdict()]) == []
    assert ca.best_problems([_verdict(tau=1.9), _verdict(tau=1.95, a1=0.3)]) == [
        "best tau 1.95 (dflash) < 2.0",
        "its a_1 0.30 < 0.45",
    ]
    assert _verdict(paired=(0.1, -0.05, 0.25)).problems(None) == [
        "not paired-better than the shipped drafter on Spec-Bench 48"
    ]
    assert _verdict(groups={"summarization": 1.7}).problems(None) == [
        "summarization tau 1.70 < 1.8",
        "rag tau missing < 1.8",
    ]
    assert _verdict(math_tau=2.2).problems(None) == ["math tau 2.20, down 0.15 from 2.35 (bar 0.1)"]
    # A parallel drafter must be at least EAGLE-3's speed; EAGLE-3 itself is not held to it.
    assert _verdict(speedup=1.0).problems(1.1) == ["speedup 1.00x < EAGLE-3's 1.10x"]
    assert _verdict(stage="eagle3", speedup=1.0).problems(1.1) == []
    assert _verdict(stage="dspark", auroc=0.7).problems(None) == ["confidence AUROC 0.700 < 0.75"]
    assert _verdict(stage="dspark", auroc=0.8).problems(None) == []
