"""DFlash's training options (DSpark's extend them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specui.algorithms.options import TrainOptions, knob
from specui.errors import SpecUIError

# The block a DFlash drafter is trained and created with unless told (B slots: B-1 drafts, B with
# sample_from_anchor); the training option, the checkpoint config and DFlashModel.create read it.
DEFAULT_BLOCK_SIZE = 8


@dataclass(kw_only=True)
class DFlashOptions(TrainOptions):
    positive: ClassVar[tuple[str, ...]] = ("max_anchors",)

    block_size: int = knob(DEFAULT_BLOCK_SIZE, "block size B")
    max_anchors: int = knob(64, "anchors per sequence")
    gamma: float = knob(4.0, "slot weight exp(-(k-1)/gamma)", group="loss")
    dpace: bool = knob(False, "D-PACE adaptive slot weights instead", group="loss")

    def check(self) -> None:
        if self.block_size < 2:
            raise SpecUIError(
                "block-size must be >= 2 (an anchor plus at least one drafted slot), got"
                f" {self.block_size}"
            )
        if not self.gamma > 0:
            raise SpecUIError(f"gamma must be > 0, got {self.gamma}")
