"""The campaign's evaluations (specui.training.campaign_eval): each drafter stage's snapshots
benched on the held-out split and Spec-Bench, the checkpoint chosen by the held-out split only."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from specui.paths import shipped_drafters_dir
from specui.training import campaign_eval as ce
from specui.training import campaign_train as ct


def _campaign(tmp_path, steps=(10,)):
    """A campaign folder whose dflash stage finished with snapshots (copies of the shipped
    DFlash), a train.jsonl of mean 100 sequence tokens, and a held-out prompt file."""
    run = tmp_path / "runs" / "dflash"
    for step in steps:
        shutil.copytree(shipped_drafters_dir() / "dflash", run / "snapshots" / f"step-{step:08d}")
    cfg = {"config": {"batch_size": 4}, "world_size": 2, "status": "finished"}
    (run / "train_run.json").write_text(json.dumps(cfg))
    rows = [{"id": str(i), "prompt_tokens": 60, "response_ids": [1] * 40} for i in range(3)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"id": "h0", "prompt": "List three primary colours."}) + "\n")
    return held


@pytest.mark.slow
def test_snapshots_are_benched_once_on_both_sets_and_become_points(tmp_path, monkeypatch):
    held = _campaign(tmp_path)
    monkeypatch.setattr(ce, "EVAL_SETS", {"heldout": str(held), "spec-bench": "spec-bench"})
    monkeypatch.setattr(ce, "HELDOUT_PROMPTS", 1)
    monkeypatch.setattr(ce, "SPEC_BENCH_PROMPTS", 2)  # an interval needs two
    monkeypatch.setattr(ce, "MAX_NEW_TOKENS", 12)
    files = ce.evaluate(tmp_path, "dflash")  # real `specui bench` runs, side by side
    assert [f.name for f in files] == ["dflash-heldout.json", "dflash-spec-bench.json"]
    pts = ce.points(tmp_path, "dflash")
    assert [(p.path.name, p.step) for p in pts] == [("dflash", 0), ("step-00000010", 10)]
    # The snapshot is the shipped drafter's copy: greedy, the same tau on the same prompt.
    assert pts[0].heldout_tau == pts[1].heldout_tau and pts[1].heldout_tau >= 1.0
    assert pts[0].spec_bench_tau == pts[1].spec_bench_tau
    assert pts[1].spec_bench_ci is not None and pts[1].groups  # Spec-Bench's task group
    assert pts[1].campaign_tokens == 10 * 4 * 2 * 100
    assert ce.choose(tmp_path, "dflash").step == 10  # the shipped one is never a choice

    def never(jobs):
        assert jobs == []  # both files exist: nothing is benched again
        return []

    assert ce.evaluate(tmp_path, "dflash", runner=never) == files


def test_a_failed_bench_leaves_no_file_and_stops_the_campaign(tmp_path):
    _campaign(tmp_path)
    seen = []

    def runner(jobs):
        seen.extend(jobs)
        return [0, 3]

    with pytest.raises(SystemExit, match="dflash-spec-bench"):
        ce.evaluate(tmp_path, "dflash", runner=runner)
    cmd = seen[0]["cmd"]
    assert cmd[cmd.index("--policy") + 1] == "fixed" and cmd.count("--drafter") == 2
    assert seen[0]["env"]["SPECUI_CAMPAIGN_DIR"] == str(tmp_path)
    assert not ce.eval_file(tmp_path, "dflash", "spec-bench").exists()


def test_the_checkpoint_is_chosen_by_the_held_out_split_not_spec_bench(tmp_path):
    _campaign(tmp_path, steps=(10, 20, 30))
    names = {"step-00000010": (1.9, 2.4), "step-00000020": (2.1, 1.5), "step-00000030": (2.1, 1.6)}
    for name, column in (("heldout", 0), ("spec-bench", 1)):
        runs = [{"drafter": d, "acceptance_length": v[column]} for d, v in names.items()]
        ce.eval_file(tmp_path, "dflash", name).parent.mkdir(exist_ok=True)
        ce.eval_file(tmp_path, "dflash", name).write_text(json.dumps({"runs": runs}))
    assert ce.choose(tmp_path, "dflash").step == 30  # the best held-out; the later on a tie


def test_each_drafter_stage_is_evaluated_after_it_finishes(tmp_path):
    rows = [{"id": str(i), "prompt_tokens": 60, "response_ids": [1] * 40} for i in range(3)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    order = []

    def runner(cmd, out):
        order.append(out.name)
        out.mkdir(parents=True)
        if out.name.startswith("lr-"):
            (out / "metrics.jsonl").write_text(json.dumps({"step": 1, ct.HELD_OUT: 1.5}) + "\n")
        (out / "train_run.json").write_text(json.dumps({"status": "finished"}))
        return 0

    ct.run(
        tmp_path,
        world=2,
        runner=runner,
        evaluate=lambda f, s: order.append(f"eval:{s}"),
        ship_check=lambda f, stages: order.append(f"ship:{','.join(stages)}"),
    )
    assert order[order.index("dflash") :] == [
        "dflash",
        "eval:dflash",
        "dspark",
        "eval:dspark",
        "peagle",
        "eval:peagle",
        "eagle3",
        "eval:eagle3",
        "ship:dflash,dspark,peagle,eagle3",
    ]


def test_the_ship_check_benches_each_choice_beside_the_shipped_drafters(tmp_path):
    _campaign(tmp_path, steps=(10, 20))
    for name, taus in (("heldout", (1.9, 2.1)), ("spec-bench", (2.4, 1.5))):
        runs = [
            {"drafter": f"step-000000{s}0", "acceptance_length": t}
            for s, t in zip("12", taus, strict=True)
        ]
        ce.eval_file(tmp_path, "dflash", name).parent.mkdir(exist_ok=True)
        ce.eval_file(tmp_path, "dflash", name).write_text(json.dumps({"runs": runs}))
    assert ce.ship_check(tmp_path, ["dflash", "eagle3"]) == []  # eagle3 has no choice yet
    batches = []

    def runner(jobs):
        batches.append(jobs)
        for job in jobs:
            job["out"].write_text("{}")
        return [0] * len(jobs)

    files = ce.ship_check(tmp_path, ["dflash"], runner=runner)
    assert [len(b) for b in batches] == [2, 1]  # two side by side, one core each
    # The fixed-K sets share the machine; the adaptive one, timed, runs alone on a fresh curve.
    assert [b["cmd"][b["cmd"].index("--policy") + 1] for b in batches[0]] == ["fixed", "fixed"]
    (alone,) = batches[1]
    assert alone["cmd"][alone["cmd"].index("--policy") + 1] == "adaptive"
    assert alone["env"]["SPECUI_REMEASURE_COSTS"] == "1"
    fixed_env = batches[0][0]["env"]
    assert fixed_env.get("SPECUI_REMEASURE_COSTS") == os.environ.get("SPECUI_REMEASURE_COSTS")
    assert [f.name for f in files] == [f"{n}.json" for n in ce.SHIP_SETS]
    cmd = batches[0][0]["cmd"]
    drafters = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--drafter"]
    candidate = tmp_path / "candidates" / "campaign-dflash"
    assert drafters == ["ngram", str(shipped_drafters_dir() / "dflash"), str(candidate)]
    # The choice by held-out tau (step 20), never by Spec-Bench (where step 10 leads).
    assert (candidate / "SNAPSHOT").read_text().strip().endswith("step-00000020")
    assert cmd[cmd.index("--limit") + 1] == "48"
    assert ce.ship_check(tmp_path, ["dflash"], runner=lambda jobs: [] if not jobs else 1 / 0)


@pytest.mark.slow
def test_the_scaling_report_puts_the_campaign_beside_the_from_scratch_study(tmp_path):
    import subprocess
    import sys

    from tests.support.paths import REPO

    _campaign(tmp_path, steps=(10, 20))
    for name, taus in (("heldout", (1.9, 2.1)), ("spec-bench", (1.5, 1.6))):
        runs = [{"drafter": "dflash", "acceptance_length": 1.45}]
        runs += [
            {
                "drafter": f"step-000000{s}0",
                "acceptance_length": t,
                "acceptance_length_ci_low": t - 0.1,
                "acceptance_length_ci_high": t + 0.1,
            }
            for s, t in zip("12", taus, strict=True)
        ]
        ce.eval_file(tmp_path, "dflash", name).parent.mkdir(exist_ok=True)
        ce.eval_file(tmp_path, "dflash", name).write_text(json.dumps({"runs": runs}))
    svg = tmp_path / "scaling.svg"
    tools = REPO / "scripts" / "train_shipped_tools.py"
    cmd = [sys.executable, str(tools), "campaign-scaling", str(tmp_path), "--svg", str(svg)]
    out = subprocess.run(
        [*cmd, "--shipped-tokens", "dflash=2.5e6"], capture_output=True, text=True, check=True
    ).stdout
    # 10 steps x batch 4 x 2 processes x 100 tokens a sequence, on top of the shipped 2.5 M.
    assert "| dflash | campaign step 10 | 2,508,000 | 1.900 | 1.500 [1.40-1.60] |" in out
    assert "| dflash | shipped | 2,500,000 |" in out
    scratch = [line for line in out.splitlines() if "scratch, 2400 prompts" in line]
    assert len(scratch) == 2  # DFlash and EAGLE-3 of the from-scratch study
    # Its tokens are sequence tokens now: more than the 232,543 response tokens it reported.
    assert int(scratch[0].split("|")[3].replace(",", "")) > 232_543
    text = svg.read_text()
    assert text.count("<polyline") == 3 and "dflash campaign" in text and "1M" in text
    assert "dflash campaign: tau per doubling between points" in out  # the campaign's trend


def test_the_scaling_trend_says_where_the_curve_bends_and_what_the_bar_would_take():
    import importlib.util

    from tests.support.paths import REPO

    spec = importlib.util.spec_from_file_location(
        "train_shipped_tools", REPO / "scripts" / "train_shipped_tools.py"
    )
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    pts = [(1_000_000, 1.5), (2_000_000, 1.6), (4_000_000, 1.7), (8_000_000, 1.75)]
    line = tools._doubling_line("dflash campaign", pts, 2.0)
    # +0.1, +0.1, then +0.05 a doubling: the bend; the last two points' line reaches 2.0 after
    # 5.5 more doublings from their middle (2^(log2 4M + 0.5)): 4M x 2^6.
    assert line == (
        "dflash campaign: tau per doubling between points +0.100, +0.100, +0.050; last 2 points"
        " +0.050 per doubling; 2.0 at about 256,000,000 tokens on this trend"
    )
    flat = tools._doubling_line("x", [(1_000_000, 1.5), (2_000_000, 1.4)], 2.0)
    assert flat.endswith("2.0 not reached on this trend")
    assert tools._doubling_line("x", [(1, 1.9), (2, 2.1)], 2.0).endswith("at 2.0 already")
