"""P-EAGLE's checkpoint config: EAGLE-3's, plus the mask token of the deeper rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from specui.algorithms.eagle3.config import Eagle3Config


@dataclass(kw_only=True)
class PEagleConfig(Eagle3Config):
    model_type: ClassVar[str] = "peagle"
    architecture: ClassVar[str] = "PEagleDraftModel"
    config_class_name: ClassVar[str] = "PEagleSpeculatorConfig"
    create_options: ClassVar[tuple[str, ...]] = (*Eagle3Config.create_options, "mask_token_id")

    mask_token_id: int | None = None
    embed_requires_grad: bool = True

    def problems(self, verifier: Any) -> list[str]:
        return super().problems(verifier) + self.check_mask_token(self.mask_token_id)
