"""DFlash in the decoding loop: one forward pass drafts a whole block, over a
per-layer context K/V cache that grows only by the newly committed positions."""

from __future__ import annotations

from typing import ClassVar

import torch

from specui.algorithms.base import DraftContext, LearnedDrafter, PrefixCache, top1_confidences
from specui.algorithms.dflash.model import DFlashModel
from specui.algorithms.layers import KV, CacheWrite, KVBuffer, extend_kv
from specui.trace import Proposal


class DFlashDrafter(LearnedDrafter):
    """DFlash for the decoding loop: one forward pass per block.

    Keeps, per draft layer, the context K/V of every committed position that
    has verifier features, and extends it only by the positions new since the
    last step.  With K speculative tokens the block has K+1 slots (K with
    sample_from_anchor) -- the block length the checkpoint was trained with
    unless ``num_speculative_tokens`` overrides it.
    """

    model_class: ClassVar[type] = DFlashModel
    model: DFlashModel

    def reset(self) -> None:
        self._prefix = PrefixCache()
        self._ctx: list[KV] = []  # per layer (k, v) [1, Hkv, P, D] for positions 0..P-1
        # in place: per layer, positions 0..P-1 then the block's own keys (rewritten each step)
        self._buffers: list[KVBuffer] = []
        self._cached = 0
        self._mask_rows: torch.Tensor | None = None  # the block's mask-token rows (one-call path)
        self._greedy_tokens: torch.Tensor | None = None  # the call's argmax of the last block

    def cached_positions(self) -> int:
        """Committed positions this drafter's cache covers: its next draft catches up on the
        rest (the adaptive policy prices that, ``specui.policy.cost``)."""
        return self._cached

    @property
    def block_size(self) -> int:
        return self.num_speculative_tokens + self.model.config.first_draft_slot

    @torch.inference_mode()
    def update_context(self, ids: torch.Tensor, feats: torch.Tensor) -> None:
        """Extend the per-layer context K/V to every position with features (0..L-2)."""
        m = self.model
        have = self._prefix.valid_length(ids, self._cached)
        if have == 0:
            self._ctx = []
        new = feats[have:]  # [n, F]
        if new.shape[0] or not (self._ctx or self._buffers):
            C = m.context(new)[None]  # [1, n, H]
            pos = torch.arange(have, have + new.shape[0], device=feats.device)[None]
            fresh = [m.context_kv(layer, C, pos) for layer in m.layers]
            if self.in_place:
                self._buffers = self._buffers or [KVBuffer() for _ in m.layers]
                for buffer, (k, v) in zip(self._buffers, fresh, strict=True):
                    buffer.write(have, k, v)
            else:
                self._ctx = extend_kv(self._ctx or None, fresh)
        self._cached = feats.shape[0]
        self._prefix.remember(ids)

    @torch.inference_mode()
    def draft_block(
        self, ctx: DraftContext, first_slot: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block from the committed state: (hidden [B, H], draft logits [B - first_slot, Vd]
        of slots ``first_slot..``: the head, the step's largest matmul, only where read).

        Slot 0 is the anchor (the last committed token) at position L-1; the
        context is every committed position before it.
        """
        m = self.model
        ids, feats = self.inputs(ctx)
        if self.one_call is not None:
            return self._block_in_one_call(ids, feats, first_slot)
        p, B, dev = ids.numel() - 1, self.block_size, ids.device
        block = torch.full((1, 1, B), m.config.mask_token_id, dtype=torch.long, device=dev)
        block[..., 0] = ids[-1]
        self.update_context(ids, feats)
        block_pos = p + torch.arange(B, device=dev)[None, None]  # [1, 1, B]
        j = torch.arange(p, device=dev)
        ctx_vis: list[torch.Tensor | None] = []
        for i in range(len(m.layers)):
            window = m.config.layer.window(i)
            if self.in_place and window is None:  # a full layer's block is bidirectional too
                ctx_vis.append(None)  # every key: SDPA needs no mask
                continue
            vis = j >= p - window if window is not None else torch.ones_like(j, dtype=torch.bool)
            ctx_vis.append(vis[None, None, None, :].expand(1, 1, B, p))
        if self.in_place:
            past = [CacheWrite(buffer, p) for buffer in self._buffers]
            ctx_vis = [  # the context's columns, then the block's own
                v if v is None else torch.cat([v, m.block_mask(i, B)[None, None]], -1)
                for i, v in enumerate(ctx_vis)
            ]
            hidden, _ = m.run_block(m.embed(block), block_pos, past, ctx_vis)
        else:
            hidden, _ = m.run_block(m.embed(block), block_pos, self._ctx, ctx_vis)
        hidden = hidden[0, 0]
        return hidden, m.lm_head(hidden[first_slot:])

    def _block_in_one_call(
        self, ids: torch.Tensor, feats: torch.Tensor, first_slot: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``draft_block`` through the one-call layers: the context rows new since the last step
        (keys and values only) and the block, which sees all of itself, in one call at positions
        ``have..p+B-1``, with the final norm and the head."""
        m, call = self.model, self.one_call
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
            rows = torch.empty(p - have + B, anchor.shape[-1])
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
            see_block=True,
            logits_from=first_slot,
            context_features=taps,
        )
        self._cached = feats.shape[0]
        self._prefix.remember(ids)
        self._greedy_tokens = out.tokens
        if out.normed is None or out.logits is None:  # no kernel copy of the head
            normed = m.norm(out.hidden)
            return normed, m.lm_head(normed[first_slot:])
        return out.normed, out.logits

    def propose(self, ctx: DraftContext) -> Proposal:
        self._greedy_tokens = None
        _, logits = self.draft_block(ctx, self.model.config.first_draft_slot)
        tokens, q = self.pick(logits, ctx, self._greedy_tokens)
        conf = top1_confidences(logits) if ctx.estimates else None
        return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)
