"""A training run read back for the Train tab: its metric series grouped into the tab's plots
(loss, per-position accuracy, the held-out acceptance preview), the newest speculator it saved
(a checkpoint, or its final drafter), and the campaign's stages (``campaign_train``), read-only.

The held-out series are the ``heldout_*`` metrics a run logs every ``eval_every`` steps
(``specui.training.heldout``): the expected acceptance length from per-position accuracy on
prompts no step trains on, which is what says whether a checkpoint is worth opening.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from specui.errors import SpecUIError
from specui.paths import campaign_dir
from specui.training.checkpoint import RUN_FILE
from specui.training.evaluation import METRICS_FILE
from specui.training.heldout import PREFIX
from specui.training.state import latest_checkpoint

Points = list[tuple[int, float]]

# The held-out preview's headline: the expected acceptance length on held-out prompts.
HELDOUT_ACCEPT = PREFIX + "accept_len_expected"
_ACCURACY = re.compile(r"acc_\d+")


@dataclass
class CurveGroups:
    """A run's series by the plot that shows them; a held-out series keeps its ``heldout_``
    name beside the training one it mirrors."""

    loss: dict[str, Points] = field(default_factory=dict)
    accuracy: dict[str, Points] = field(default_factory=dict)
    acceptance: dict[str, Points] = field(default_factory=dict)

    def heldout(self) -> dict[str, Points]:
        """Every held-out series, whichever plot shows it."""
        every = {**self.loss, **self.accuracy, **self.acceptance}
        return {k: v for k, v in every.items() if k.startswith(PREFIX)}

    def last_heldout(self) -> tuple[int, float] | None:
        """(step, value) of the last held-out expected acceptance length (None: none yet)."""
        points = self.acceptance.get(HELDOUT_ACCEPT)
        return points[-1] if points else None


def group_curves(series: dict[str, Points]) -> CurveGroups:
    """The series the tab plots, by plot: losses; per-position accuracies (``acc_k``);
    acceptance lengths (``accept_len``, ``accept_len_expected``), each with its held-out twin.
    The bookkeeping series (lr, grad norm, anchors, timings) are left out."""
    groups = CurveGroups()
    for name in sorted(series):
        base = name.removeprefix(PREFIX)
        if "loss" in base:
            groups.loss[name] = series[name]
        elif _ACCURACY.fullmatch(base):
            groups.accuracy[name] = series[name]
        elif base.startswith("accept_len"):
            groups.acceptance[name] = series[name]
    # acc_10 after acc_9: by position, not by string.
    groups.accuracy = dict(sorted(groups.accuracy.items(), key=lambda kv: _position(kv[0])))
    return groups


def _position(name: str) -> tuple[bool, int]:
    return name.startswith(PREFIX), int(name.rsplit("_", 1)[1])


def series_from_points(points: Iterable[tuple[int, str, float]]) -> dict[str, Points]:
    """(step, name, value) points as series by name, each by step (a step logged twice, by a
    job resumed from an earlier checkpoint, keeps its last value)."""
    by_name: dict[str, dict[int, float]] = {}
    for step, name, value in points:
        by_name.setdefault(name, {})[int(step)] = float(value)
    return {name: sorted(steps.items()) for name, steps in by_name.items()}


def read_metrics(run: Path) -> dict[str, Points]:
    """The series of a run folder's metrics.jsonl (a torn last line, as a killed run leaves,
    and null values, empty metrics, are skipped)."""
    path = run / METRICS_FILE
    if not path.is_file():
        return {}
    points = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (ValueError, KeyError, TypeError):
            continue
        points += [
            (step, k, v)
            for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
        ]
    return series_from_points(points)


def _every(steps: int) -> str:
    return "every step" if steps == 1 else f"every {steps} steps"


def heldout_note(groups: CurveGroups, eval_every: int) -> str:
    """The line under the plots: the last held-out expected acceptance length, or why there is
    none."""
    last = groups.last_heldout()
    if last is None:
        if eval_every <= 0:
            return (
                "held-out evaluation is off for this run (eval every 0 steps; set it under"
                " More training settings)"
            )
        return f"no held-out evaluation yet ({_every(eval_every)})"
    step, value = last
    count = len(groups.acceptance[HELDOUT_ACCEPT])
    every = f"{_every(eval_every)}, " if eval_every > 0 else ""
    return (
        f"held-out expected acceptance length **{value:.3f}** at step {step} ({every}"
        f"{count} evaluation{'s' if count != 1 else ''})"
    )


@dataclass(frozen=True)
class SavedSpeculator:
    """A speculators-format folder a run saved: its final drafter (``final``: the run's folder
    itself) or one of its checkpoints."""

    path: Path
    step: int
    final: bool


def run_record(run: Path) -> dict:
    """The run file (train_run.json: its config, status, last step); {} when unreadable."""
    try:
        record = json.loads((run / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def latest_speculator(run: Path) -> SavedSpeculator | None:
    """The newest speculator a run saved: its final drafter once it finished (the last
    checkpoint's weights, saved at the drafter's own precision), else its newest checkpoint;
    None before the first checkpoint."""
    ckpt = latest_checkpoint(run)
    record = run_record(run)
    if record.get("status") == "finished" and (run / "config.json").is_file():
        step = int(record.get("step") or 0)
        if ckpt is None or step >= ckpt.step:
            return SavedSpeculator(run, step, True)
    return SavedSpeculator(ckpt.path, ckpt.step, False) if ckpt else None


def campaign_stages(root: Path | None = None) -> dict[str, Path]:
    """The campaign's stages that have logged metrics, by name: ``ROOT/runs/<stage>``
    (``root``: default ``campaign_dir()``, the operator's setting)."""
    runs = (root if root is not None else campaign_dir()) / "runs"
    if not runs.is_dir():
        return {}
    return {p.name: p for p in sorted(runs.iterdir()) if (p / METRICS_FILE).is_file()}


def campaign_stage(name: str, root: Path | None = None) -> Path:
    """The run folder of the stage ``name``, one of ``campaign_stages`` only: a visitor picks
    among the listed names, never a path."""
    stages = campaign_stages(root)
    if name not in stages:
        known = ", ".join(stages) or "none yet"
        raise SpecUIError(f"no campaign stage {name!r} (stages with metrics: {known})")
    return stages[name]


def run_summary(run: Path, groups: CurveGroups) -> str:
    """'running · step 120/400' from the run file and its last logged step."""
    record = run_record(run)
    steps = (record.get("config") or {}).get("steps")
    logged = max((pts[-1][0] for pts in groups.loss.values() if pts), default=0)
    step = record.get("step") or logged
    status = record.get("status", "unknown")
    return f"{status} · step {step}" + (f"/{steps}" if steps else "")


def eval_every_of(run: Path) -> int:
    """The run's held-out evaluation interval, from its run file (0: off or unknown)."""
    return int((run_record(run).get("config") or {}).get("eval_every") or 0)
