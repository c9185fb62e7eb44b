"""The checkpoint stage: the run's folder (``--out``), its run file, the checkpoints along the
way and the drafter saved at the end."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn

from specui.algorithms.checkpoint import save_drafter
from specui.atomic import write_json
from specui.errors import SpecUIError
from specui.training.config import TrainConfig
from specui.training.evaluation import METRICS_FILE, strict, trim_metrics
from specui.training.hooks import TrainHooks
from specui.training.state import list_checkpoints, save_checkpoint

RUN_FILE = "train_run.json"


def check_creatable(out: Path) -> None:
    """Refuse an --out that cannot be created, without creating it: the folder appears
    with the first file written into it, so a run that fails before that leaves none."""
    p = out
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise SpecUIError(f"cannot create the output folder {out}: {p} is not a folder")
    if p == out:
        return
    if not os.access(p, os.W_OK | os.X_OK):
        raise SpecUIError(f"cannot create the output folder {out}: {p} is not writable")


def remove_empty_folders(out: Path) -> None:
    """Remove ``out`` and the empty folders under it; anything written is kept
    (self-distilled responses and hidden states are hours of work a retry reuses)."""
    if not out.is_dir():
        return
    for folder, _, _ in sorted(os.walk(out), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only empty ones: rmdir refuses the rest


def open_run(out: Path, cfg: TrainConfig, world: int, resumed_from: int | None) -> None:
    """The run's folder and its run file (status running); a resumed run's metrics cut back to
    its checkpoint."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecUIError(f"cannot create the output folder {out}: {e.strerror or e}") from None
    write_json(out / RUN_FILE, {"config": cfg.to_dict(), "world_size": world, "status": "running"})
    if resumed_from is not None:
        trim_metrics(out / METRICS_FILE, resumed_from)


def checkpoint(
    out: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    hooks: TrainHooks,
) -> Path:
    """Step ``step``'s checkpoint (the caller's hook first: its metrics are stored before)."""
    if hooks.checkpoint:
        hooks.checkpoint(step)
    return save_checkpoint(
        out, step, model, optimizer, {"algorithm": cfg.algorithm}, cfg.keep_checkpoints
    )


SNAPSHOTS = "snapshots"


def snapshot(out: Path, step: int, model: nn.Module) -> Path:
    """Step ``step``'s drafter as a speculator folder, OUT/snapshots/step-N, kept for good (the
    rolling checkpoints are pruned): one point of a scaling study, benched like any speculator.
    bf16, as drafters ship; no optimizer state, since nothing resumes from it."""
    path = out / SNAPSHOTS / f"step-{step:08d}"
    try:
        save_drafter(model, path, dtype="bfloat16")
    except (OSError, SafetensorError) as e:
        reason = getattr(e, "strerror", None) or e
        raise SpecUIError(
            f"could not save the snapshot of step {step} in {path}: {reason}"
        ) from None
    return path


def close_run(
    out: Path,
    step: int,
    status: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    hooks: TrainHooks,
    metrics: dict[str, float],
) -> None:
    """The last step's checkpoint, the drafter of a finished run, the run file's outcome."""
    have = list_checkpoints(out)
    if step > 0 and (not have or have[-1].step != step):
        checkpoint(out, step, model, optimizer, cfg, hooks)
    if status == "finished" and step >= cfg.steps:
        try:
            save_drafter(model, out)
        except (OSError, SafetensorError) as e:
            reason = getattr(e, "strerror", None) or e
            raise SpecUIError(
                f"could not save the final drafter in {out}: {reason} (the last checkpoint is kept)"
            ) from None
        hooks.say(f"saved drafter to {out}")
    run = json.loads((out / RUN_FILE).read_text())
    run.update(status=status, step=step, metrics=strict(metrics))
    write_json(out / RUN_FILE, run)
