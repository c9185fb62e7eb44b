"""DSpark's checkpoint config: DFlash's, plus the Markov and confidence heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from specui.algorithms.dflash.config import DFlashConfig

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


@dataclass(kw_only=True)
class DSparkConfig(DFlashConfig):
    model_type: ClassVar[str] = "dspark"
    architecture: ClassVar[str] = "DSparkDraftModel"
    config_class_name: ClassVar[str] = "DSparkSpeculatorConfig"

    sample_from_anchor: bool = True
    markov_rank: int = 256  # 0 = no Markov head
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True  # confidence reads [h_k; W1[prev_k]] (else h_k)

    create_options: ClassVar[tuple[str, ...]] = (
        "sample_from_anchor",
        "markov_rank",
        "markov_head_type",
        "enable_confidence_head",
        "confidence_head_with_markov",
    )

    def problems(self, verifier: Any) -> list[str]:
        out = super().problems(verifier)
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            out.append(
                f"markov_head_type {self.markov_head_type!r} is not one of"
                f" {', '.join(MARKOV_HEAD_TYPES)}"
            )
        if self.markov_rank < 0:
            out.append(f"markov_rank must be >= 0, got {self.markov_rank}")
        if (
            self.enable_confidence_head
            and self.confidence_head_with_markov
            and self.markov_rank == 0
        ):
            out.append("confidence_head_with_markov needs markov_rank > 0")
        return out
