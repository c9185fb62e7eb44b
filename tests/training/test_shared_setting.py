"""A new shared training setting is one field of TrainConfig: the train CLI's flag, the Train tab's
widget and the saved config come from it (specui.training.config's promise).

The test adds a field to a copy of the package's config.py, the only file it changes, and runs
the real CLI parser, the real Train tab and a real job store on that copy in a fresh process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

FIELD = (
    '    label_smoothing: float = setting(0.0, "label smoothing of the targets", group="loss")\n'
)
ANCHOR = "    # This algorithm's own knobs"

CHECK = r"""
import json, sys
import gradio as gr
from specui.cli import build_parser
from specui.commands.train import build_config
from specui.store import Store
from specui.training.config import TrainConfig
from specui.ui import train as train_tab

out = sys.argv[1]
parser = build_parser()
argv = ["train", "--algorithm", "dflash", "--out", out, "--label-smoothing", "0.25"]
cfg = build_config(parser.parse_args(argv))
assert cfg.label_smoothing == 0.25, cfg
assert build_config(parser.parse_args(argv[:5])).label_smoothing == 0.0  # the field's default
sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
help_text = " ".join(sub.choices["train"].format_help().split())
assert "--label-smoothing LABEL_SMOOTHING label smoothing of the targets" in help_text, help_text

saved = json.loads(json.dumps(cfg.to_dict()))  # a job's params, train_run.json
assert saved["label_smoothing"] == 0.25 and TrainConfig.from_dict(saved) == cfg

store = Store(out + ".db")
with gr.Blocks() as demo:
    train_tab.build(store)
widget = next(b for b in demo.blocks.values() if b.elem_id == "train-setting-label_smoothing")
assert widget.value == 0.0 and widget.label == "Label smoothing of the targets", widget.label
inputs = ("dflash", "embedded", "gsm-symbolic", 1, 8, 64, 0, 6e-4, "smooth", None)
job = train_tab.start_training(store, *inputs, options={"label_smoothing": 0.25})
assert TrainConfig.from_dict(store.get_job(job).params).label_smoothing == 0.25
print("ok")
"""


def _tree_with_field(root: Path) -> Path:
    """A repository whose specui/ is a copy with FIELD added to TrainConfig; the rest linked."""
    tree = root / "repo"
    tree.mkdir()
    for entry in REPO.iterdir():
        if entry.name == "specui":
            shutil.copytree(entry, tree / "specui", ignore=shutil.ignore_patterns("__pycache__"))
        elif not entry.name.startswith("."):
            (tree / entry.name).symlink_to(entry)
    config = tree / "specui" / "training" / "config.py"
    text = config.read_text()
    assert text.count(ANCHOR) == 1
    config.write_text(text.replace(ANCHOR, FIELD + "\n" + ANCHOR))
    return tree


def test_a_new_shared_setting_reaches_the_cli_the_train_tab_and_the_saved_config(tmp_path):
    tree = _tree_with_field(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tree), "SPECUI_DATA_DIR": str(tmp_path / "data")}
    run = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "out")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


def test_without_the_field_the_flag_is_unknown():
    """The check above can fail: on the package as it is, there is no such flag."""
    from specui.cli import build_parser
    from specui.training.config import TrainConfig

    assert "label_smoothing" not in {f.name for f in TrainConfig.settings()}
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["train", "--algorithm", "dflash", "--out", "x", "--label-smoothing", "1"]
        )


# A train_run.json "config" (and a job's params) as SpecUI wrote it before TrainConfig was typed:
# every algorithm's knobs flat, the loss in ``extra``.
OLDER_SAVED = {
    "algorithm": "dspark", "verifier": "embedded", "prompts": "general", "out": "runs/dspark",
    "steps": 8, "batch_size": 4, "lr": 0.003, "min_lr_ratio": 0.1, "warmup_steps": 2,
    "schedule": "cosine", "weight_decay": 0.01, "grad_clip": 1.0, "seed": 0, "threads": 1,
    "device": "auto", "precision": "fp32", "num_prompts": None, "max_new_tokens": 40,
    "gen_batch_size": 64, "max_seq_len": 1024, "extraction": "mixed",
    "extract_batch_tokens": 4096, "cache_dir": None, "extractor": "local", "vllm_python": None,
    "vllm_gpu_memory_utilization": None, "layers": None, "aux_layer_ids": [1, 3, 4],
    "draft_vocab_size": None, "mask_token_id": None, "init_from": None, "log_every": 1,
    "checkpoint_every": 100, "keep_checkpoints": 2, "resume": False, "extra": {"loss": "kl"},
    "block_size": 8, "max_anchors": 64, "gamma": 4.0, "dpace": False, "markov_rank": 64,
    "tv_weight": 0.0, "confidence_weight": 1.0, "confidence_temperature": 1.0, "num_depths": 6,
    "cod_ratio": 0.7, "cod_min_ratio": 0.2, "freeze_embeddings": False, "ttt_steps": 3,
}  # fmt: skip


def test_an_older_saved_config_still_loads():
    from specui.algorithms.dspark.options import DSparkOptions
    from specui.training.config import TrainConfig

    cfg = TrainConfig.from_dict(OLDER_SAVED)
    assert cfg.loss == "kl" and cfg.steps == 8 and cfg.aux_layer_ids == [1, 3, 4]
    assert cfg.matmul_precision == "fp32"  # its older name, `precision`
    assert cfg.options == DSparkOptions(markov_rank=64)  # its own knobs; P-EAGLE's depths dropped
    again = TrainConfig.from_dict(cfg.to_dict())
    assert again == cfg and "extra" not in cfg.to_dict() and "num_depths" not in cfg.to_dict()
