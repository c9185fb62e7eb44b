"""A run read back for the Train tab (specui.training.curves): its series grouped into plots, the
held-out preview's line, its newest speculator, and the campaign's stages, on a real tiny run."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from specui.algorithms.resolve import resolve_drafter
from specui.errors import SpecUIError
from specui.training import curves


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, fixture_dir) -> Path:
    """Four DFlash steps on the fixture verifier, a held-out evaluation every two, a checkpoint
    every step (two kept)."""
    from specui.training.config import TrainConfig
    from specui.training.hooks import TrainHooks
    from specui.training.loop import train

    root = tmp_path_factory.mktemp("curves")
    rng = random.Random(30)
    prompts = root / "prompts.jsonl"
    ids = [[rng.randrange(500) for _ in range(8)] for _ in range(30)]
    prompts.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in ids))
    cfg = TrainConfig.from_dict(
        dict(
            algorithm="dflash", verifier=str(fixture_dir / "verifier"), prompts=str(prompts),
            max_new_tokens=16, aux_layer_ids=[1, 3, 4], batch_size=2, block_size=4,
            warmup_steps=0, threads=1, steps=4, log_every=1, eval_every=2, eval_samples=4,
            checkpoint_every=1, keep_checkpoints=2, out=str(root / "run"),
        )
    )  # fmt: skip
    assert train(cfg, TrainHooks()).status == "finished"
    return root / "run"


def test_the_runs_series_group_into_the_tabs_plots_with_their_held_out_twins(tiny_run):
    series = curves.read_metrics(tiny_run)
    lines = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert series["loss"] == [(x["step"], x["loss"]) for x in lines]
    groups = curves.group_curves(series)
    assert set(groups.loss) == {"loss", "heldout_loss"}
    # acc_1..acc_3 (block size 4: three drafted positions) and their held-out twins, by position.
    assert list(groups.accuracy) == [*(f"acc_{k}" for k in (1, 2, 3)), "heldout_acc_1",
                                     "heldout_acc_2", "heldout_acc_3"]  # fmt: skip
    assert curves.HELDOUT_ACCEPT in groups.acceptance and "accept_len_expected" in groups.acceptance
    assert not {"lr", "grad_norm", "anchors"} & {*groups.loss, *groups.acceptance}
    held = [(x["step"], x[curves.HELDOUT_ACCEPT]) for x in lines if curves.HELDOUT_ACCEPT in x]
    assert [s for s, _ in held] == [2, 4]  # every 2 steps
    assert groups.acceptance[curves.HELDOUT_ACCEPT] == held
    assert groups.last_heldout() == held[-1]
    assert set(groups.heldout()) == {
        "heldout_loss", "heldout_acc_1", "heldout_acc_2", "heldout_acc_3", "heldout_accept_len",
        curves.HELDOUT_ACCEPT,
    }  # fmt: skip

    note = curves.heldout_note(groups, curves.eval_every_of(tiny_run))
    assert note == (
        f"held-out expected acceptance length **{held[-1][1]:.3f}** at step 4 (every 2 steps,"
        " 2 evaluations)"
    )
    assert curves.run_summary(tiny_run, groups) == "finished · step 4/4"


def test_the_held_out_line_says_why_there_is_no_point_yet():
    groups = curves.group_curves(curves.series_from_points([(1, "loss", 3.0), (1, "acc_1", 0.2)]))
    assert groups.last_heldout() is None and not groups.heldout()
    assert curves.heldout_note(groups, 50) == "no held-out evaluation yet (every 50 steps)"
    assert curves.heldout_note(groups, 0).startswith("held-out evaluation is off for this run")


def test_a_step_logged_twice_keeps_its_last_value_and_a_torn_line_is_skipped(tmp_path):
    # A job resumed from an earlier checkpoint logs the steps after it again.
    assert curves.series_from_points([(2, "loss", 5.0), (1, "loss", 6.0), (2, "loss", 4.0)]) == {
        "loss": [(1, 6.0), (2, 4.0)]
    }
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 2.5, "accept_len": null}\n{"step": 2, "lo'
    )
    assert curves.read_metrics(tmp_path) == {"loss": [(1, 2.5)]}
    assert curves.read_metrics(tmp_path / "absent") == {}


def test_the_newest_speculator_is_the_final_drafter_then_the_last_checkpoint(
    tiny_run, tmp_path, fixture_verifier
):
    saved = curves.latest_speculator(tiny_run)
    assert saved is not None and saved.final and saved.path == tiny_run and saved.step == 4
    # A run stopped mid-way (its run file still says running): its newest checkpoint.
    stopped = tmp_path / "stopped"
    shutil.copytree(tiny_run, stopped, ignore=shutil.ignore_patterns("cache"))
    record = json.loads((stopped / "train_run.json").read_text())
    (stopped / "train_run.json").write_text(json.dumps({**record, "status": "running"}))
    saved = curves.latest_speculator(stopped)
    assert saved is not None and not saved.final
    assert saved.path == stopped / "checkpoints" / "step-00000004" and saved.step == 4
    shutil.rmtree(saved.path)
    assert curves.latest_speculator(stopped).path.name == "step-00000003"  # two kept: 3 and 4
    # Each loads as a drafter: what the Playground will do with it.
    for path in (tiny_run, stopped / "checkpoints" / "step-00000003"):
        assert resolve_drafter(str(path), fixture_verifier).algorithm == "dflash"
    shutil.rmtree(stopped / "checkpoints")
    assert curves.latest_speculator(stopped) is None  # nothing saved yet
    assert curves.latest_speculator(tmp_path / "never") is None


def test_campaign_stages_list_only_runs_with_metrics_and_refuse_other_names(tiny_run, tmp_path):
    assert curves.campaign_stages(tmp_path / "absent") == {}
    runs = tmp_path / "runs"
    shutil.copytree(tiny_run, runs / "dflash", ignore=shutil.ignore_patterns("cache"))
    (runs / "extract").mkdir()  # started, nothing logged yet
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert curves.campaign_stages(tmp_path) == {"dflash": runs / "dflash"}
    assert curves.campaign_stage("dflash", tmp_path) == runs / "dflash"
    for name in ("extract", "../secret", str(tmp_path / "secret"), ""):
        with pytest.raises(SpecUIError, match="no campaign stage"):
            curves.campaign_stage(name, tmp_path)


def test_campaign_stages_default_to_the_operators_campaign_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_CAMPAIGN_DIR", str(tmp_path))
    (tmp_path / "runs" / "peagle").mkdir(parents=True)
    (tmp_path / "runs" / "peagle" / "metrics.jsonl").write_text('{"step": 20, "loss": 1.0}\n')
    assert list(curves.campaign_stages()) == ["peagle"]


def test_the_held_out_line_says_every_step_in_words():
    groups = curves.group_curves({curves.HELDOUT_ACCEPT: [(1, 1.25)]})
    assert curves.heldout_note(groups, 1) == (
        "held-out expected acceptance length **1.250** at step 1 (every step, 1 evaluation)"
    )
    assert (
        curves.heldout_note(curves.group_curves({}), 1) == "no held-out evaluation yet (every step)"
    )
