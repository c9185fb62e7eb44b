"""The model-card stage of ``scripts/train_shipped.sh``: the gate that keeps a drafter below
the acceptance bar out of ``data/drafters``, and the training history the card reports.

Runs the real script on the shipped DSpark files, with training runs and bench results
written here (a card needs their numbers, not a re-run of hours of training)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

TOOLS = REPO / "scripts" / "train_shipped_tools.py"
SHIPPED = REPO / "data" / "drafters" / "dspark"


def _run_folder(
    path: Path,
    algorithm: str,
    steps: int,
    num_prompts: int,
    step_time_s: float,
    init_from: Path | None,
) -> None:
    path.mkdir(parents=True)
    cfg = {
        "algorithm": algorithm,
        "prompts": "gsm-symbolic",
        "num_prompts": num_prompts,
        "max_new_tokens": 256,
        "layers": 3,
        "draft_vocab_size": 4096,
        "block_size": 8,
        "max_anchors": 64,
        "mask_token_id": 16,
        "markov_rank": 256,
        "num_depths": 8,
        "ttt_steps": 4,
        "batch_size": 4,
        "lr": 3e-4,
        "schedule": "cosine",
        "warmup_steps": 30,
        "log_every": 10,
        "threads": 1,
        "init_from": str(init_from) if init_from else None,
        "confidence_temperature": 0.0,
        "confidence_weight": 4.0,
    }
    (path / "train_run.json").write_text(
        json.dumps({"config": cfg, "status": "finished", "step": steps})
    )
    rows = [{"step": s, "step_time_s": step_time_s} for s in range(10, steps + 1, 10)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _results(root: Path, tau: float, speedup: float, auroc: float) -> None:
    drafted = {
        "drafter": "dspark",
        "algorithm": "dspark",
        "acceptance_length": tau,
        "speedup": speedup,
        "tokens_per_s": 20.0,
        "num_speculative_tokens": 8,
        "acceptance_pos_1": 0.6,
        "acceptance_pos_2": 0.4,
        "acceptance_length_ci_low": tau - 0.15,
        "acceptance_length_ci_high": tau + 0.2,
        "speedup_ci_low": speedup - 0.1,
        "speedup_ci_high": speedup + 0.1,
        "verifier_precision": "bf16",
    }
    plain = {"drafter": "none", "algorithm": "none", "acceptance_length": 1.0, "tokens_per_s": 15.0}
    for t in (0, 1):
        (root / f"bench-T{t}.json").write_text(json.dumps({"runs": [plain, drafted]}))
    metrics = {"n": 100, "ece": 0.1, "auroc": auroc, "brier": 0.2}
    prefix = {
        "raw": {"n": 400, "ece": 0.05, "auroc": 0.9, "brier": 0.08},
        "calibrated": {"n": 400, "ece": 0.03, "auroc": 0.88, "brier": 0.07},
        "slot_index_auroc": 0.85,
    }
    (root / "calibration-dspark.json").write_text(
        json.dumps(
            {
                "temperature": 2.0,
                "fit_slots": 90,
                "before": metrics,
                "after": metrics,
                "slot_index_auroc": 0.6,
                "prefix": prefix,
            }
        )
    )
    (root / "distill.done").write_text("3000 samples, 450000 response tokens")


@pytest.fixture
def shipped_copy(tmp_path) -> Path:
    dest = tmp_path / "drafters" / "dspark"  # the card finds its bench row by the folder's name
    dest.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (dest / f).symlink_to(SHIPPED / f)  # read only: the card writes README.md beside them
    return dest


def _card(tmp_path: Path, dest: Path) -> subprocess.CompletedProcess:
    round1, round2 = tmp_path / "runs" / "dflash", tmp_path / "runs" / "round2" / "dspark"
    _run_folder(round1, "dflash", steps=2400, num_prompts=1000, step_time_s=4.0, init_from=None)
    _run_folder(round2, "dspark", steps=1500, num_prompts=3000, step_time_s=4.5, init_from=round1)
    return subprocess.run(
        [sys.executable, str(TOOLS), "card", "dspark", str(round2), str(dest), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_card_of_a_drafter_that_meets_the_bar_reports_its_whole_training(tmp_path, shipped_copy):
    _results(tmp_path, tau=2.4, speedup=1.6, auroc=0.8)
    done = _card(tmp_path, shipped_copy)
    assert done.returncode == 0, done.stderr + done.stdout
    card = (shipped_copy / "README.md").read_text()
    assert "Misses the acceptance bar" not in card
    assert (
        "- T=0: tau 2.400 [2.25-2.60], 20.00 tok/s, speedup 1.60x [1.50x-1.70x], K 8" in card
    )  # bootstrap intervals
    assert "Verifier precision: bf16, batch-invariant" in card  # what the bench row recorded
    assert "- optimisation: 1500 steps, batch 4" in card
    assert "- warm-started from: a dflash run on the first 1000 prompts, 2400 steps" in card
    # 240 logged steps x 10 x 4.0 s + 150 x 10 x 4.5 s = 16350 s
    assert "about 4.5 h of training steps in all" in card
    assert "| calibrated | 0.1000 | 0.8000 | 0.2000 |" in card
    # The AUROC's context: the slot index alone, and the prefix-survival view serving uses.
    assert (
        "The slot index alone (each slot scored by its slot's acceptance rate) gives AUROC 0.6000"
        in card
    )
    assert (
        "over all 400 drafted slots" in card and "| calibrated | 0.0300 | 0.8800 | 0.0700 |" in card
    )
    assert "| slot index alone | - | 0.8500 | - |" in card
    assert (
        "confidence head trained on the acceptance chance at temperature 0 (0: greedy" in card
        and "BCE weight 4" in card
    )
    assert "Why the head stays below the bar" not in card


@pytest.mark.parametrize(
    ("tau", "speedup", "auroc", "missed"),
    [
        (1.9, 1.6, 0.8, "held-out tau 1.90 < 2.0"),
        (2.4, 1.2, 0.8, "best speedup in the bench run 1.20x < 1.5x"),
        (2.4, 1.6, 0.7, "confidence AUROC 0.700 < 0.75"),
    ],
)
def test_card_refuses_a_drafter_below_the_bar(tmp_path, shipped_copy, tau, speedup, auroc, missed):
    _results(tmp_path, tau=tau, speedup=speedup, auroc=auroc)
    done = _card(tmp_path, shipped_copy)
    assert done.returncode == 1  # the recipe stops before a commit
    assert missed in done.stdout
    card = (shipped_copy / "README.md").read_text()
    assert f"**Misses the acceptance bar: {missed}.**" in card
    assert ("Why the head stays below the bar" in card) == (
        "AUROC" in missed
    )  # points to what was tried
