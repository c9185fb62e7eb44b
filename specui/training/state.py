"""Training checkpoints: a speculators-format drafter plus what resuming needs.

``OUT/checkpoints/step-00000050/`` holds ``config.json`` + ``model.safetensors``
(``save_drafter``: loadable as a drafter on its own), ``optimizer.pt`` (AdamW
moments and the RNG state: tensors and plain containers only, read back with
``torch.load(weights_only=True)`` so nothing is ever unpickled) and
``trainer_state.json`` (the step).

A checkpoint is written into a hidden temporary folder and renamed into place:
a crash or a full disk mid-save leaves only the earlier checkpoints, which
stay loadable.  An old checkpoint is removed by renaming it aside first
(``specui.atomic.remove_tree``), so a kill mid-delete never leaves a part of one
under a ``step-*`` name; the next save sweeps the dead saves' and deletions'
leftovers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from specui.algorithms.checkpoint import WEIGHTS_FILE, save_drafter
from specui.atomic import fsync_dir, remove_tree, sweep_aside, write_json
from specui.errors import SpecUIError
from specui.processes import pid_alive

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


@dataclass
class Checkpoint:
    path: Path
    step: int


def checkpoint_dir(out: Path) -> Path:
    return out / CHECKPOINTS


def list_checkpoints(out: Path) -> list[Checkpoint]:
    """Complete checkpoints in OUT, oldest first (temporary and aside folders are ignored)."""
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / STATE_FILE).is_file():
            found.append(Checkpoint(p, int(m.group(1))))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(out: Path) -> Checkpoint | None:
    ckpts = list_checkpoints(out)
    return ckpts[-1] if ckpts else None


def save_checkpoint(
    out: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write the checkpoint of ``step`` atomically; keep the newest ``keep``."""
    root = checkpoint_dir(out)
    final = root / f"step-{step:08d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_dead_temps(root)
        sweep_aside(root)
        # The pid in the name tells a later save whose temporary folder this is.
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:08d}-{os.getpid()}-", dir=root))
        tmp.chmod(
            0o755
        )  # mkdtemp's 0700 would hide the checkpoint from other users (a serving process)
    except OSError as e:
        raise SpecUIError(f"cannot create a checkpoint in {root}: {e.strerror or e}") from None
    try:
        save_drafter(model, tmp, dtype="float32")  # fp32: resuming must not round the weights
        payload = {"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}
        if torch.cuda.is_available():
            payload["cuda_rng"] = torch.cuda.get_rng_state_all()
        # Into a file we opened: torch.save to a path reports a full disk as an
        # "enforce fail ... unexpected pos" RuntimeError; a file object's write raises
        # the OSError (ENOSPC, "No space left on device") the message below names.
        with open(tmp / OPTIMIZER_FILE, "wb") as f:
            torch.save(payload, f)
        write_json(tmp / STATE_FILE, {**state, "step": step})
        fsync_dir(tmp)
        if final.exists():  # a re-run of the same step (resumed from an older one)
            remove_tree(final)
        os.rename(tmp, final)
        fsync_dir(root)
    except (
        OSError,
        RuntimeError,
        SafetensorError,
    ) as e:  # torch.save / safetensors report failed writes their own way
        shutil.rmtree(tmp, ignore_errors=True)
        last = latest_checkpoint(out)
        kept = f"; the last good checkpoint is {last.path}" if last else ""
        reason = getattr(e, "strerror", None) or e
        raise SpecUIError(
            f"could not save the checkpoint of step {step} in {root}: {reason}{kept}"
        ) from None
    for old in list_checkpoints(out)[:-keep]:
        with contextlib.suppress(OSError):  # the new one is saved; an old one left is swept later
            remove_tree(old.path)
    return final


_TMP_DIR = re.compile(r"^\.tmp-step-\d{8}-(\d+)-")


def _remove_dead_temps(root: Path) -> None:
    """Delete the temporary folders of saves whose process died mid-write (kill -9,
    OOM): each is a half-written checkpoint as large as a whole one, and nothing
    else would ever remove it.  A live process's folder (another rank, or a save
    in flight) is left alone."""
    for p in root.iterdir():
        m = _TMP_DIR.match(p.name)
        if m and p.is_dir() and not pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)


def load_checkpoint(
    ckpt: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Restore model weights, optimizer moments and RNG; return the trainer state."""
    try:
        tensors = load_file(str(ckpt.path / WEIGHTS_FILE))
        payload = torch.load(ckpt.path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        state = json.loads((ckpt.path / STATE_FILE).read_text())
    except (OSError, SafetensorError, json.JSONDecodeError, RuntimeError) as e:
        raise SpecUIError(f"checkpoint {ckpt.path} is unreadable: {e}") from None
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    if missing:
        raise SpecUIError(
            f"checkpoint {ckpt.path} does not fit this drafter: it lacks {', '.join(missing[:5])}"
        )
    try:
        model.load_state_dict({k: tensors[k].to(own[k].dtype) for k in own}, strict=True)
        optimizer.load_state_dict(payload["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise SpecUIError(
            f"checkpoint {ckpt.path} does not fit this run (different drafter settings?): {e}"
        ) from None
    torch.set_rng_state(payload["rng"])
    if "cuda_rng" in payload and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["cuda_rng"])
    return state
