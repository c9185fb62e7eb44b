"""P-EAGLE: parallel EAGLE -- EAGLE-3 layers drafting all K tokens in one pass.

From an anchor row a (the verifier processed position a and emitted x[a+1];
shifted layout as in ``specui.algorithms.eagle3``), depth 0 is the ordinary EAGLE row (token
x[a+1], verifier feature of position a) and depths d = 1..K-1 are filled with
``mask_token_id`` and a learned ``mask_hidden`` feature.  Row (a, d) sits at
RoPE position a+d, predicts x[a+d+2], and sees every depth-0 row j <= a plus
the rows (a, d' <= d) of its own rollout -- causal across depths, one pass.

The embedding is the drafter's own (trainable, saved); the LM head is a frozen
copy of the verifier's.

Training layout: ``PEagleModel.forward_rows`` over explicitly listed
(anchor, depth) rows of one packed sequence -- the rows the trainer keeps
after "draft block sparsification" (``objective.cod_rows``).  Inference:
``PEagleDrafter.propose`` (drafter.py) -- the depth-0 rows of committed positions are cached
per layer and grow incrementally; each step runs the new depth-0 rows plus the
K-1 mask rows of the newest anchor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from specui.algorithms.draft_config import DraftConfig
from specui.algorithms.eagle3.model import Eagle3Model
from specui.algorithms.peagle.config import PEagleConfig


@dataclass
class RowsOutput:
    hidden: torch.Tensor  # [R, H] last-layer output of each row (before the final norm)
    logits: torch.Tensor  # [R, Vd]; row (a, d) predicts x[a+d+2] (target: verifier logits at a+d+1)


class PEagleModel(Eagle3Model):
    config_class: ClassVar[type[DraftConfig]] = PEagleConfig
    config: PEagleConfig
    verifier_fallback: ClassVar[tuple[str, ...]] = ("embed_tokens.weight", "lm_head.weight")

    default_layers: ClassVar[int] = 2
    default_k: ClassVar[int] = 8
    default_model_type: ClassVar[str] = "qwen3"  # the speculators trainer's peagle default
    default_options: ClassVar[dict[str, bool]] = {"norm_before_residual": True}

    def __init__(self, config: PEagleConfig) -> None:
        super().__init__(config)
        width = len(config.aux_layer_ids) * config.layer.hidden_size
        self.mask_hidden = nn.Parameter(
            torch.zeros(1, 1, width)
        )  # stands in for the missing verifier feature

    @classmethod
    def create_defaults(cls, verifier: Any) -> dict[str, Any]:
        return {"mask_token_id": verifier.default_mask_token_id()}

    def init_extra(self) -> None:
        nn.init.normal_(self.mask_hidden, std=1.0)  # on the scale of verifier taps

    # --- training layout -------------------------------------------------------------------

    def forward_rows(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        row_anchor: torch.Tensor,
        row_depth: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> RowsOutput:
        """Run R rows (anchor, depth) of one (packed) sequence in one pass, differentiably.

        features   [T', n_aux*H] (or [1, T', .]) shifted: row j = taps of original position j.
        input_ids  [T'] shifted: input_ids[j] = x[j+1].
        row_anchor [R], row_depth [R]: anchor a (shifted index) and depth d of
                   each row; a+d < T'.  Every row's rollout must contain its
                   depths 0..d-1 too (depth-0 rows are usually all of 0..T'-1).
        document_ids [T'] (default 0; -1 = padding); a row belongs to its anchor's document.

        Row (a, d): token x[a+1] and the taps of position a at depth 0, else
        mask_token_id and mask_hidden; RoPE position a+d.  Sees depth-0 rows
        j <= a of its document (j > a+d-window on sliding layers) and rows
        (a, d' <= d).
        """
        T = input_ids.numel()
        ids, taps = input_ids.reshape(T), features.reshape(T, -1)
        dev = taps.device
        a, d = row_anchor.reshape(-1).to(dev), row_depth.reshape(-1).to(dev)
        doc = (
            document_ids.reshape(T)
            if document_ids is not None
            else torch.zeros(T, dtype=torch.long, device=dev)
        )
        q = a + d  # [R] position of each row (shifted index)
        first = d == 0
        tokens = torch.where(first, ids[q], self.config.mask_token_id)
        feats = torch.where(first[:, None], taps[q], self.mask_hidden.reshape(1, -1))

        doc_a = doc[a]
        same_doc = (doc_a[:, None] == doc_a[None]) & (doc_a[:, None] >= 0)  # [R, R] query x key
        own_rollout = (a[:, None] == a[None]) & (d[None] <= d[:, None])
        context = first[None] & (a[None] <= a[:, None])
        visible = []
        for li in range(len(self.layers)):
            w = self.config.layer.window(li)
            ctx_li = context & (a[None] > (q - w)[:, None]) if w is not None else context
            visible.append((same_doc & (ctx_li | own_rollout))[None, None])
        h, _ = self.run_layers(
            self.embed_tokens(tokens)[None, None],
            self.features(feats)[None, None],
            q[None, None],
            visible,
        )
        h = h[0, 0]
        return RowsOutput(hidden=h, logits=self.lm_head(self.norm(h)))
