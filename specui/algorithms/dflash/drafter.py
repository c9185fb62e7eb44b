"""DFlash in the decoding loop: one call drafts a whole block, over the call's context K/V
cache, which grows only by the newly committed positions."""

from __future__ import annotations

from typing import ClassVar

import torch

from specui.algorithms.base import DraftContext, LearnedDrafter, PrefixCache, top1_confidences
from specui.algorithms.dflash.model import DFlashModel
from specui.trace import Proposal


class DFlashDrafter(LearnedDrafter):
    """DFlash for the decoding loop: one forward pass per block.

    Its call (``LearnedDrafter.call``) keeps, per draft layer, the context K/V of every
    committed position that has verifier features; each step extends it only by the positions
    new since the last one.  With K speculative tokens the block has K+1 slots (K with
    sample_from_anchor) -- the block length the checkpoint was trained with
    unless ``num_speculative_tokens`` overrides it.
    """

    model_class: ClassVar[type] = DFlashModel
    model: DFlashModel

    def reset(self) -> None:
        self._prefix = PrefixCache()
        self._cached = 0  # committed positions whose context keys and values the call holds
        self._mask_rows: torch.Tensor | None = None  # the block's mask-token rows, kept
        self._greedy_tokens: torch.Tensor | None = None  # the call's argmax of the last block

    def cached_positions(self) -> int:
        """Committed positions this drafter's cache covers: its next draft catches up on the
        rest (the adaptive policy prices that, ``specui.policy.cost``)."""
        return self._cached

    @property
    def block_size(self) -> int:
        return self.num_speculative_tokens + self.model.config.first_draft_slot

    @torch.inference_mode()
    def draft_block(
        self, ctx: DraftContext, first_slot: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block from the committed state: (final-normed hidden [B - first_slot, H], draft
        logits [B - first_slot, Vd]) of slots ``first_slot..`` (the head, the step's largest
        matmul, only where read).

        Slot 0 is the anchor (the last committed token) at position p = L-1; the context is every
        committed position before it.  One call (``self.call``): the context rows new since the
        last step (keys and values only) and the block, at positions ``have..p+B-1``.
        """
        m, call = self.model, self.call
        ids, feats = self.inputs(ctx)
        have = self._prefix.valid_length(ids, self._cached)
        p, B = ids.numel() - 1, self.block_size
        # The block's rows: the anchor's embedding, then the mask token's, kept from the last call
        # (on this CPU each torch op around the call is 10-50 us, a draft's call ~2 ms).
        if self._mask_rows is None or self._mask_rows.shape[0] != B - 1:
            mask = torch.full((B - 1,), m.config.mask_token_id, dtype=torch.long, device=ids.device)
            self._mask_rows = m.embed(mask).contiguous()
        anchor = m.embed(ids[-1:])
        fresh = feats[have:]
        if p > have and call.has_context:  # the call projects the new context rows itself
            rows = torch.empty(p - have + B, anchor.shape[-1], device=anchor.device)
            rows[p - have] = anchor[0]
            rows[p - have + 1 :] = self._mask_rows
            taps = fresh.contiguous()
        else:
            rows = torch.cat([m.context(fresh), anchor, self._mask_rows])
            taps = None
        out = call.run(
            rows,
            range(have, p + B),
            have,
            ctx_rows=p - have,
            see_block=[m.sees_block(i) for i in range(len(m.layers))],
            logits_from=first_slot,
            context_features=taps,
            window_base=p - 1,  # a block's window is counted from its anchor's context
            tail_from=p,
        )
        self._cached = feats.shape[0]
        self._prefix.remember(ids)
        self._greedy_tokens = out.tokens
        if out.normed is None or out.logits is None:  # no kernel copy of the head
            normed = m.norm(out.hidden[first_slot:])
            return normed, m.lm_head(normed)
        return out.normed, out.logits

    def propose(self, ctx: DraftContext) -> Proposal:
        self._greedy_tokens = None
        _, logits = self.draft_block(ctx, self.model.config.first_draft_slot)
        tokens, q = self.pick(logits, ctx, self._greedy_tokens)
        conf = top1_confidences(logits) if ctx.estimates else None
        return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)
