"""The campaign's ship step (specui.training.campaign_ship): a candidate paired-better than the
drafter it would replace is written in bf16 with its card, the old card kept; a drafter ships
once.  Real benches (the campaign's ship check, at a tiny size) decide it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specui.algorithms import create_drafter
from specui.algorithms.checkpoint import load_model, save_drafter
from specui.training import campaign_eval as ce
from specui.training import campaign_ship as cs
from tests.support.paths import REPO
from tests.support.ship_check import tiny_ship_check

CANDIDATE_STEP = 10


def _campaign_state(state, snapshot_from) -> None:
    """A campaign folder as the ship check leaves it before its benches: the DFlash stage's
    run record, one snapshot (the candidate) and its held-out evaluation."""
    run = state / "runs" / "dflash"
    shutil.copytree(snapshot_from, run / "snapshots" / f"step-{CANDIDATE_STEP:08d}")
    cfg = {
        "steps": 20,
        "batch_size": 4,
        "lr": 6e-4,
        "schedule": "cosine",
        "warmup_steps": 2,
        "layers": 3,
        "draft_vocab_size": 8192,
        "block_size": 8,
        "max_anchors": 64,
        "mask_token_id": 16,
        "log_every": 5,
        "init_from": str(REPO / "data" / "drafters" / "dflash"),
    }
    (run / "train_run.json").write_text(
        json.dumps({"config": cfg, "world_size": 2, "status": "finished", "step": 20})
    )
    metrics = [{"step": s, "step_time_s": 1.5} for s in (5, 10, 10, 15, 20)]  # 10: a resume
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    rows = [
        {"id": "a", "prompt_tokens": 30, "response_ids": [5, 6, 7, 8]},
        {"id": "b", "prompt_tokens": 50, "response_ids": [9, 10]},
    ]
    (state / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (state / "evals").mkdir()
    (state / "evals" / "dflash-heldout.json").write_text(
        json.dumps({"runs": [{"drafter": f"step-{CANDIDATE_STEP:08d}", "acceptance_length": 1.9}]})
    )


@pytest.mark.slow
def test_a_paired_better_candidate_ships_once_with_its_card(
    tmp_path, monkeypatch, embedded_verifier
):
    # The drafter "shipped" here is a random DFlash (its drafts are all but never accepted); the
    # candidate is the real shipped DFlash, so it is better on every prompt and ships.
    data = tmp_path / "data"
    data.mkdir()
    for name in ("spec-bench", "prompts", "corpus"):
        (data / name).symlink_to(REPO / "data" / name)
    weak = data / "drafters" / "dflash"
    random_dflash = create_drafter("dflash", embedded_verifier, seed=0, num_layers=1, block_size=8)
    save_drafter(random_dflash, weak, dtype="bfloat16")
    (weak / "README.md").write_text("# the card of the drafter it replaces\n")
    monkeypatch.setenv("SPECUI_SHIPPED_DIR", str(data))
    state = tmp_path / "state"
    candidate_from = REPO / "data" / "drafters" / "dflash"
    _campaign_state(state, candidate_from)
    tiny_ship_check(monkeypatch, spec_bench=6, max_new_tokens=24)
    assert len(ce.ship_check(state, ["dflash"])) == 3  # real benches

    dest_root, archive = tmp_path / "drafters", tmp_path / "cards"
    shutil.copytree(weak, dest_root / "dflash")
    (dry,) = cs.plan(state, dest_root)
    assert dry.ships and dry.reasons == []
    (s,) = cs.ship(state, dest_root, embedded_verifier, archive=archive)
    assert s.ships and s.card is not None
    dest = dest_root / "dflash"
    assert (archive / "dflash.md").read_text() == "# the card of the drafter it replaces\n"
    assert not (dest_root / "dflash.shipping").exists()
    assert not (dest_root / "dflash.replaced").exists()

    # The weights are the candidate's, in bf16, and load as a drafter.
    assert json.loads((dest / "config.json").read_text())["dtype"] == "bfloat16"
    shipped, source = (
        load_file(dest / "model.safetensors"),
        load_file(candidate_from / "model.safetensors"),
    )
    assert shipped.keys() == source.keys()
    floats = [k for k in source if source[k].is_floating_point()]  # d2t / t2d are index maps
    assert floats and all(shipped[k].dtype == torch.bfloat16 for k in floats)
    assert all(torch.equal(shipped[k], source[k].to(shipped[k].dtype)) for k in shipped)
    assert load_model(dest, embedded_verifier).config.block_size == 8

    card = (dest / "README.md").read_text()
    assert cs.CAMPAIGN_MARK in card
    assert f"step {CANDIDATE_STEP} of 20" in card
    assert "batch 4 x 2 processes" in card
    assert "2 prompts with the verifier's greedy responses (6 response tokens" in card
    # 5 and 10 (logged twice) up to the chosen step, each standing for 5 steps of 1.5 s
    assert "about 0.0 h of training steps" in card
    assert "held-out tau (the campaign's held-out split, 12 prompts): 1.900" in card
    assert "paired by prompt, +" in card
    assert "Spec-Bench, 6 questions" in card and "gsm-symbolic, 2 prompts" in card

    # Weights ship once: the next run leaves the campaign's drafter alone.
    (again,) = cs.plan(state, dest_root)
    assert not again.ships
    assert any("already holds a campaign drafter" in r for r in again.reasons)
    before = (dest / "model.safetensors").read_bytes()
    cs.ship(state, dest_root, embedded_verifier, archive=archive)
    assert (dest / "model.safetensors").read_bytes() == before
