"""P-EAGLE's training options: the parallel depths, their sparsification, the embedding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specui.algorithms.options import TrainOptions, knob
from specui.errors import SpecUIError


@dataclass(kw_only=True)
class PEagleOptions(TrainOptions):
    positive: ClassVar[tuple[str, ...]] = ("num_depths",)

    num_depths: int = knob(4, "tokens per parallel pass K", flag="--depths")
    # Draft-block sparsification: the depth-d rows keep max(r^d, r_min) of their positions.
    cod_ratio: float = knob(0.7, "sparsification r", group="loss")
    cod_min_ratio: float = knob(0.2, "sparsification r_min", group="loss")
    # Keep the embedding the verifier's (frozen).  Saves ~V*H trainable parameters and
    # optimizer state, and the shipped checkpoint may then omit it (vLLM and SpecUI borrow
    # the verifier's); by default P-EAGLE trains its own.
    freeze_embeddings: bool = knob(False, "keep the verifier's embedding (frozen, not stored)")

    def check(self) -> None:
        if not (0 < self.cod_min_ratio <= 1 and 0 < self.cod_ratio <= 1):
            raise SpecUIError("cod-ratio and cod-min-ratio must be in (0, 1]")
