"""DFlash's checkpoint config: the block, the mask token, in-block attention."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from specui.algorithms.dflash import options
from specui.algorithms.draft_config import DraftConfig


@dataclass(kw_only=True)
class DFlashConfig(DraftConfig):
    model_type: ClassVar[str] = "dflash"
    architecture: ClassVar[str] = "DFlashDraftModel"
    config_class_name: ClassVar[str] = "DFlashSpeculatorConfig"

    block_size: int = options.DEFAULT_BLOCK_SIZE
    mask_token_id: int | None = None
    # False: slot k predicts p+k, slot 0 unused (B-1 drafts).
    # True: slot k predicts p+k+1 (B drafts).
    sample_from_anchor: bool = False
    # In-block causality of *sliding_attention* layers: causal unless this is True.
    # full_attention layers are always bidirectional inside the block (speculators trainer).
    sliding_window_non_causal: bool = False

    create_options: ClassVar[tuple[str, ...]] = ("sample_from_anchor",)

    @property
    def first_draft_slot(self) -> int:
        """The block's first slot that drafts: 1 where slot 0 would predict the anchor itself."""
        return 0 if self.sample_from_anchor else 1

    def problems(self, verifier: Any) -> list[str]:
        out = super().problems(verifier) + self.check_mask_token(self.mask_token_id)
        if self.block_size < (1 if self.sample_from_anchor else 2):
            out.append(f"block_size {self.block_size} is too small")
        return out
