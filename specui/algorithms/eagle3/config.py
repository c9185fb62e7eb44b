"""EAGLE-3's checkpoint config: where the norms go, whether the embedding trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from specui.algorithms.draft_config import DraftConfig


@dataclass(kw_only=True)
class Eagle3Config(DraftConfig):
    model_type: ClassVar[str] = "eagle3"
    architecture: ClassVar[str] = "Eagle3DraftModel"
    config_class_name: ClassVar[str] = "Eagle3SpeculatorConfig"
    aux_key: ClassVar[str] = "eagle_aux_hidden_state_layer_ids"
    create_options: ClassVar[tuple[str, ...]] = (
        "norm_before_fc",
        "fc_norm",
        "norm_before_residual",
        "norm_output",
        "embed_requires_grad",
    )

    norm_before_fc: bool = False  # one RMSNorm (input_norm) over the concatenated taps before fc
    fc_norm: bool = False  # one RMSNorm per tap instead
    norm_before_residual: bool = False  # residual stream starts from hidden_norm(fc(.)), not fc(.)
    norm_output: bool = False  # feed the *normed* output to the next step
    embed_requires_grad: bool = False

    def problems(self, verifier: Any) -> list[str]:
        out = super().problems(verifier)
        if self.norm_before_fc and self.fc_norm:
            out.append("norm_before_fc and fc_norm cannot both be set")
        return out
