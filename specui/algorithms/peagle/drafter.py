"""P-EAGLE in the decoding loop: one pass over the new depth-0 rows and the K-1 mask rows."""

from __future__ import annotations

from typing import ClassVar

import torch

from specui.algorithms.base import DraftContext, top1_confidences
from specui.algorithms.eagle3.drafter import Eagle3Drafter
from specui.algorithms.peagle.model import PEagleModel
from specui.trace import Proposal


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

        new = torch.arange(have, a + 1, device=dev)  # new depth-0 rows, the anchor row last
        depth = torch.arange(1, K, device=dev)  # mask rows (a, 1..K-1)
        n, R = new.numel(), new.numel() + K - 1
        tokens = torch.cat([ids[new + 1], torch.full_like(depth, m.config.mask_token_id)])
        feats_in = torch.cat([feats[new], m.mask_hidden.reshape(1, -1).expand(K - 1, -1)])
        pos = torch.cat([new, a + depth])  # [R]

        if self.one_call is not None:  # the order below, causal: the call needs no masks
            h, _, logits, self._greedy_tokens = self.one_call.run(
                m.embed_tokens(tokens),
                pos,
                have,
                feature=m.features(feats_in),
                logits_from=n - 1,
                kv_only_before_logits=True,  # depth-0 rows before the anchor: cache only
            )
            self._cache.append(ids, [], n)  # depth-0 rows only: mask rows depend on this anchor
            return logits if logits is not None else m.lm_head(m.norm(h[n - 1 :]))
        if self.in_place and all(m.config.layer.window(li) is None for li in range(len(m.layers))):
            # In key order (cached rows, new rows, mask rows) each query sees the keys up to
            # itself: depth-0 rows j <= its anchor, then its own rollout.  No per-row test.
            causal = torch.ones(R, have + R, dtype=torch.bool, device=dev).tril(have)[None, None]
            return self._run_rows(ids, tokens, feats_in, pos, [causal] * len(m.layers), n)
        # Queries: new depth-0 rows, then mask rows.  Keys: cached depth-0 rows 0..have-1, then
        # the queries.
        key_row = torch.cat(
            [torch.arange(a + 1, device=dev), torch.full_like(depth, a)]
        )  # anchor of each key
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
        return self._run_rows(ids, tokens, feats_in, pos, visible, n)

    def _run_rows(
        self,
        ids: torch.Tensor,
        tokens: torch.Tensor,
        feats_in: torch.Tensor,
        pos: torch.Tensor,
        visible: list[torch.Tensor],
        n: int,
    ) -> torch.Tensor:
        """``draft_rows``' pass over its R rows (``n`` new depth-0 ones, then the mask rows)."""
        m = self.model
        h, kv = m.run_layers(
            m.embed_tokens(tokens)[None, None],
            m.features(feats_in)[None, None],
            pos[None, None],
            visible,
            self._cache.past(m, ids.device),
        )
        self._cache.append(ids, kv, n)  # depth-0 rows only: mask rows depend on this anchor
        h = h[0, 0, n - 1 :]  # the anchor row and its mask rows
        return m.lm_head(m.norm(h))

    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.token_ids.numel() < 2:
            return self.empty_proposal()
        self._greedy_tokens = None  # the one call's argmax of the rows, where it made one
        logits = self.draft_rows(ctx)
        tokens, q = self.pick(logits, ctx, self._greedy_tokens)
        conf = top1_confidences(logits) if ctx.estimates else None
        return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)
