"""How a caller watches and steers a training run (``TrainHooks``), and what it gets back
(``TrainResult``): shared by the loop and its stages."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

log = logging.getLogger("specui.training.loop")


@dataclass
class TrainHooks:
    """How a caller (CLI, job worker, test) watches and steers a run.  All optional."""

    progress: Callable[[int, int, dict[str, float]], None] | None = (
        None  # (step, total, last metrics)
    )
    log: Callable[[str], None] | None = None
    metric: Callable[[int, str, float], None] | None = None
    cancelled: Callable[[], bool] | None = None
    stage: Callable[[str, int, int], None] | None = None  # data preparation: (what, done, total)
    # Called with the step just before a checkpoint of it is written: a caller that buffers the
    # metrics (the job worker) commits them here, so a checkpoint on disk implies its curve is
    # stored.
    checkpoint: Callable[[int], None] | None = None

    def say(self, line: str) -> None:
        log.info(line)
        if self.log:
            self.log(line)


@dataclass
class TrainResult:
    out: Path
    step: int  # steps completed
    status: str  # "finished" | "cancelled"
    metrics: dict[str, float] = field(default_factory=dict)  # the last logged
    resumed_from: int | None = None
    model: nn.Module | None = field(
        default=None, repr=False
    )  # the trained drafter (this process's copy)
