"""DSpark's training options: DFlash's, plus the Markov head's rank and the heads' losses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specui.algorithms.dflash.options import DFlashOptions
from specui.algorithms.options import knob
from specui.errors import SpecUIError


@dataclass(kw_only=True)
class DSparkOptions(DFlashOptions):
    positive: ClassVar[tuple[str, ...]] = (*DFlashOptions.positive, "markov_rank")

    markov_rank: int = knob(256, "Markov head rank")
    tv_weight: float = knob(0.0, "loss (1-w)*CE + w*TV on the draft distribution", group="loss")
    confidence_weight: float = knob(1.0, "confidence-head BCE weight", group="loss")
    # The sampling temperature whose acceptance the head learns: 1 - TV of the draft and
    # target distributions at that temperature; 0 is greedy, where that is "the argmaxes agree".
    confidence_temperature: float = knob(
        1.0,
        "the head learns the acceptance chance at this sampling temperature (0: greedy)",
        group="loss",
    )

    def check(self) -> None:
        super().check()
        if not 0 <= self.tv_weight <= 1:
            raise SpecUIError(f"tv-weight must be in [0, 1], got {self.tv_weight}")
        if not self.confidence_temperature >= 0:
            raise SpecUIError(
                f"confidence-temperature must be >= 0, got {self.confidence_temperature}"
            )
