"""EAGLE-3's training options: the training-time-test steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specui.algorithms.options import TrainOptions, knob


@dataclass(kw_only=True)
class Eagle3Options(TrainOptions):
    positive: ClassVar[tuple[str, ...]] = ("ttt_steps",)

    ttt_steps: int = knob(3, "training-time-test steps")
