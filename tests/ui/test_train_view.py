"""The Train tab's run views without a browser (specui.ui.train_view): a job's held-out preview,
its newest speculator for the Playground (inside the app's folders only), the campaign's
stages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specui.errors import SpecUIError
from specui.paths import shipped_drafters_dir
from specui.store import JobStatus, Store
from specui.ui.train_view import campaign_view, job_view, open_in_playground, open_job_speculator


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    s = Store(tmp_path / "data" / "specui.db")
    yield s
    s.close()


def _job(store: Store, kind: str, params: dict, status=JobStatus.DONE, metrics=()) -> str:
    """A job row as the runner leaves it: claimed, its metric points written, finished (unless
    ``status`` is running); the Job dropdown's label for it."""
    job = store.enqueue_job(kind, params)
    assert store.claim_next_job(pid=1).id == job.id
    store.write_job_progress(job.id, progress=1.0, message="", log_tail="", metrics=list(metrics))
    if status != JobStatus.RUNNING:
        store.finish_job(job.id, status)
    return f"{job.id}: {kind}"


def _checkpoint(out: Path, step: int) -> Path:
    """A checkpoint folder as training saves it: a speculators-format drafter (the shipped
    DFlash) and its trainer state."""
    path = out / "checkpoints" / f"step-{step:08d}"
    shutil.copytree(shipped_drafters_dir() / "dflash", path)
    (path / "trainer_state.json").write_text(json.dumps({"step": step}))
    return path


def test_a_jobs_held_out_preview_and_its_line(store):
    points = [(s, "loss", 5.0 - s) for s in (1, 2, 3, 4)]
    points += [(s, "acc_1", 0.1 * s) for s in (1, 2, 3, 4)]
    points += [(2, "heldout_accept_len_expected", 1.4), (4, "heldout_accept_len_expected", 1.7)]
    points += [(2, "heldout_acc_1", 0.2), (4, "heldout_acc_1", 0.35)]
    choice = _job(store, "train", {"algorithm": "dflash", "eval_every": 2}, metrics=points)
    head, loss, acc, held, note, _ = job_view(store, choice)
    assert "**done**" in head
    assert (
        note
        == "held-out expected acceptance length **1.700** at step 4 (every 2 steps, 2 evaluations)"
    )
    assert [t.name for t in held.data] == ["heldout_accept_len_expected"]
    assert list(held.data[0].y) == [1.4, 1.7] and not held.layout.annotations
    assert held.layout.yaxis.range is None  # 0.3 tokens apart: plotly's own range
    assert [t.name for t in acc.data] == ["acc_1", "heldout_acc_1"]
    # The held-out twin: dashed, the position's colour, the position's one legend entry.
    assert acc.data[1].line.dash == "dash" and acc.data[1].line.color == acc.data[0].line.color
    assert acc.data[1].showlegend is False and acc.data[0].showlegend is not False
    assert [t.name for t in loss.data] == ["loss"]

    # Without an evaluation yet, the preview says when one comes.
    choice = _job(store, "train", {"algorithm": "dflash", "eval_every": 50}, metrics=points[:4])
    *_, held, note, _ = job_view(store, choice)
    assert note == "no held-out evaluation yet (every 50 steps)"
    assert not held.data
    assert held.layout.annotations[0].text == "no held-out evaluation yet<br>(every 50 steps)"


def test_open_finds_the_jobs_newest_checkpoint_inside_the_app_folders(store, tmp_path):
    out = tmp_path / "data" / "speculators" / "mine"
    _checkpoint(out, 3)
    newest = _checkpoint(out, 6)
    choice = _job(store, "train", {"algorithm": "dflash", "out": str(out)}, JobStatus.CANCELLED)
    path = str(newest.resolve())
    assert open_job_speculator(store, choice) == (path, f"job 1's checkpoint (step 6): `{path}`")
    line, opened = open_in_playground(store, choice)
    assert (
        opened == path
        and line == f"the Playground's speculator is now job 1's checkpoint (step 6): `{path}`"
    )


def test_open_says_why_there_is_nothing_to_open(store, tmp_path):
    empty = tmp_path / "data" / "speculators" / "empty"
    choice = _job(store, "train", {"algorithm": "dflash", "out": str(empty)}, JobStatus.RUNNING)
    with pytest.raises(SpecUIError, match="has saved no checkpoint yet"):
        open_job_speculator(store, choice)
    # A job a CLI queued with its folder outside the app's folders: the Playground would refuse
    # it, so the button does too.
    outside = tmp_path / "elsewhere"
    _checkpoint(outside, 2)
    choice = _job(store, "train", {"algorithm": "dflash", "out": str(outside)})
    line, path = open_in_playground(store, choice)
    assert path is None and "outside the folders this app may use" in line
    bench = _job(store, "benchmark", {})
    with pytest.raises(SpecUIError, match="only a train job saves speculators"):
        open_job_speculator(store, bench)
    assert open_in_playground(store, None) == ("❌ no job selected", None)


def test_the_campaign_view_reads_only_listed_stages(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECUI_CAMPAIGN_DIR", str(tmp_path / "campaign"))
    head, *_ = campaign_view(None)
    assert head.startswith("no training campaign on this server")
    run = tmp_path / "campaign" / "runs" / "lr-0.0003"
    run.mkdir(parents=True)
    lines = [
        {"step": 100, "loss": 4.0, "acc_1": 0.3, "heldout_accept_len_expected": 1.5},
        {"step": 120, "loss": 3.5, "acc_1": 0.4},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"steps": 300, "eval_every": 100}
    (run / "train_run.json").write_text(json.dumps({"config": config, "status": "running"}))
    assert campaign_view(None)[0] == "1 campaign stage(s) with metrics: pick one"
    head, loss, acc, held, note = campaign_view("lr-0.0003")
    assert head == "**lr-0.0003** · running · step 120/300"
    assert note.startswith("held-out expected acceptance length **1.500** at step 100")
    assert [t.name for t in held.data] == ["heldout_accept_len_expected"]
    head, *_ = campaign_view("../runs/lr-0.0003")
    assert head.startswith("❌ no campaign stage")


def test_optional_number_settings_left_empty_stay_unset(store):
    """num_prompts, draft_vocab_size, mask_token_id (None: the run decides) are textboxes: empty
    is unset, a number is that setting, anything else the message."""
    import gradio as gr

    from specui.ui.train import setting_widgets, start_training

    with gr.Blocks():
        widgets = setting_widgets()
    for name in ("num_prompts", "draft_vocab_size", "mask_token_id"):
        assert isinstance(widgets[name], gr.Textbox) and widgets[name].value == ""
    assert isinstance(widgets["eval_every"], gr.Number) and widgets["eval_every"].value == 0
    assert widgets["max_new_tokens"].value == 128
    leading = ("dflash", "embedded", "general", 2, 8, 64, 0, 6e-4)
    options = {"num_prompts": " 8 ", "draft_vocab_size": "", "mask_token_id": "0"}
    job = store.get_job(start_training(store, *leading, "opt", None, options=options))
    assert job.params["num_prompts"] == 8 and job.params["mask_token_id"] == 0
    assert "draft_vocab_size" not in job.params
    with pytest.raises(SpecUIError, match="num prompts must be a whole number, got '8.5'"):
        start_training(store, *leading, "opt2", None, options={"num_prompts": "8.5"})


def test_a_flat_held_out_start_is_not_drawn_as_a_climb():
    from specui.training.curves import group_curves
    from specui.ui.train_view import curve_figures

    groups = group_curves({"heldout_accept_len_expected": [(1, 1.0), (2, 1.0000001)]})
    low, high = curve_figures(groups, 1)[2].layout.yaxis.range
    assert low == pytest.approx(0.9) and high == pytest.approx(1.1)
