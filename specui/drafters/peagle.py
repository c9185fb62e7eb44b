"""P-EAGLE: parallel EAGLE -- EAGLE-3 layers drafting all K tokens in one pass.

From an anchor row a (the verifier processed position a and emitted x[a+1];
shifted layout as in eagle3.py), depth 0 is the ordinary EAGLE row (token
x[a+1], verifier feature of position a) and depths d = 1..K-1 are filled with
``mask_token_id`` and a learned ``mask_hidden`` feature.  Row (a, d) sits at
RoPE position a+d, predicts x[a+d+2], and sees every depth-0 row j <= a plus
the rows (a, d' <= d) of its own rollout -- causal across depths, one pass.

The embedding is the drafter's own (trainable, saved); the LM head is a frozen
copy of the verifier's.

Training layout: ``PEagleModel.forward_rows`` over explicitly listed
(anchor, depth) rows of one packed sequence -- the rows the trainer keeps
after "draft block sparsification" (see ``cod_rows``).  Inference:
``PEagleDrafter.propose`` -- the depth-0 rows of committed positions are cached
per layer and grow incrementally; each step runs the new depth-0 rows plus the
K-1 mask rows of the newest anchor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from specui.drafters.base import DraftContext, register
from specui.drafters.checkpoint import DraftConfig, read_field
from specui.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Model
from specui.drafters.layers import pick_tokens, to_target_vocab
from specui.trace import Proposal


@dataclass(kw_only=True)
class PEagleConfig(Eagle3Config):
    model_type: ClassVar[str] = "peagle"
    architecture: ClassVar[str] = "PEagleDraftModel"
    config_class_name: ClassVar[str] = "PEagleSpeculatorConfig"
    create_options: ClassVar[tuple[str, ...]] = (*Eagle3Config.create_options, "mask_token_id")

    mask_token_id: int | None = None
    embed_requires_grad: bool = True

    @classmethod
    def own_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return super().own_from_dict(d) | {"mask_token_id": read_field(d, "mask_token_id", "int?", None)}

    def own_to_dict(self) -> dict[str, Any]:
        return super().own_to_dict() | {"mask_token_id": self.mask_token_id}

    def problems(self, verifier: Any) -> list[str]:
        return super().problems(verifier) + self.check_mask_token(self.mask_token_id)


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
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, width))  # stands in for the missing verifier feature

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
        doc = document_ids.reshape(T) if document_ids is not None else torch.zeros(T, dtype=torch.long, device=dev)
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
        h, _ = self.run_layers(self.embed_tokens(tokens)[None, None], self.features(feats)[None, None], q[None, None], visible)
        h = h[0, 0]
        return RowsOutput(hidden=h, logits=self.lm_head(self.norm(h)))


def cod_rows(
    loss_mask: torch.Tensor,
    num_depths: int,
    ratio: float = 0.7,
    ratio_min: float = 0.2,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft block sparsification: which (anchor, depth) rows to train, as (row_anchor, row_depth).

    ``loss_mask`` [T'] (shifted layout) marks the rows whose targets count.
    Depth 0 keeps every row.  Depth d keeps about ``max(ratio^d, ratio_min)``
    of the trainable rows, drawn from the chains that survived depth d-1 and
    whose position a+d is trainable -- so every kept row has its whole rollout
    (the speculators sampler, written out).
    """
    mask = loss_mask.reshape(-1).bool().cpu()
    T = mask.numel()
    valid = torch.nonzero(mask).reshape(-1)
    anchors, depths = [torch.arange(T)], [torch.zeros(T, dtype=torch.long)]
    pos = valid[valid >= 1]  # depth-1 positions a+1 of chains with an anchor a >= 0
    for depth in range(1, num_depths):
        want = int(max(valid.numel() - depth, 0) * max(ratio**depth, ratio_min))
        if want <= 0 or pos.numel() == 0:
            break
        if pos.numel() > want:
            pos = pos[torch.randperm(pos.numel(), generator=generator)[:want]].sort().values
        anchors.append(pos - depth)
        depths.append(torch.full_like(pos, depth))
        nxt = pos + 1  # the same chain one depth further
        pos = nxt[(nxt < T) & torch.isin(nxt, valid)]
    return torch.cat(anchors), torch.cat(depths)


# --- inference ---------------------------------------------------------------------------------


@register("peagle")
class PEagleDrafter(Eagle3Drafter):
    """P-EAGLE for the decoding loop: one pass over the new depth-0 rows and K-1 mask rows."""

    model_class: ClassVar[type] = PEagleModel
    model: PEagleModel

    @torch.inference_mode()
    def draft_rows(self, ctx: DraftContext) -> torch.Tensor:
        """Draft logits [K, Vd] of the newest anchor's rollout, depths 0..K-1."""
        m = self.model
        ids, feats = self.inputs(ctx)
        a = ids.numel() - 2  # anchor row: token ids[-1], feature of the position before it
        K, dev = self.num_speculative_tokens, ids.device
        have = self._cache.valid_rows(ids, max_rows=a)  # the anchor row is always recomputed
        past = self._cache.kv or self._cache.empty(m, dev)

        new = torch.arange(have, a + 1, device=dev)  # new depth-0 rows, the anchor row last
        depth = torch.arange(1, K, device=dev)  # mask rows (a, 1..K-1)
        n, R = new.numel(), new.numel() + K - 1
        tokens = torch.cat([ids[new + 1], torch.full_like(depth, m.config.mask_token_id)])
        feats_in = torch.cat([feats[new], m.mask_hidden.reshape(1, -1).expand(K - 1, -1)])
        pos = torch.cat([new, a + depth])  # [R]

        # Queries: new depth-0 rows, then mask rows.  Keys: cached depth-0 rows 0..have-1, then the queries.
        key_row = torch.cat([torch.arange(a + 1, device=dev), torch.full_like(depth, a)])  # anchor of each key
        key_depth = torch.cat([torch.zeros(a + 1, dtype=torch.long, device=dev), depth])
        q_row = torch.cat([new, torch.full_like(depth, a)])
        q_depth = torch.cat([torch.zeros(n, dtype=torch.long, device=dev), depth])
        own = (key_row[None] == q_row[:, None]) & (key_depth[None] <= q_depth[:, None])
        context = (key_depth[None] == 0) & (key_row[None] <= q_row[:, None])
        visible = []
        for li in range(len(m.layers)):
            w = m.config.layer.window(li)
            ctx_li = context & (key_row[None] > (pos - w)[:, None]) if w is not None else context
            visible.append((ctx_li | own)[None, None])
        assert visible[0].shape == (1, 1, R, have + R)
        h, kv = m.run_layers(m.embed_tokens(tokens)[None, None], m.features(feats_in)[None, None], pos[None, None], visible, past)
        self._cache.append(ids, kv, n)  # depth-0 rows only: mask rows depend on this anchor
        h = h[0, 0, n - 1 :]  # the anchor row and its mask rows
        return m.lm_head(m.norm(h))

    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.token_ids.numel() < 2:
            return self.empty_proposal()
        logits = to_target_vocab(self.draft_rows(ctx), self.model.d2t, self.model.config.layer.vocab_size)
        tokens, q = pick_tokens(logits, ctx.sampling, ctx.generator)
        return Proposal(token_ids=tokens.tolist(), probs=q)

