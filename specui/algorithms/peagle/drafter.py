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
        """Draft logits [K, Vd] of the newest anchor's rollout, depths 0..K-1: one call over the
        new depth-0 rows (the anchor row last) and the K-1 mask rows, in that order.  In cache
        order each row sees the keys up to itself: depth-0 rows j <= its anchor, then its own
        rollout, which no window hides (``tail_from``)."""
        m = self.model
        ids, feats = self.inputs(ctx)
        a = ids.numel() - 2  # anchor row: token ids[-1], feature of the position before it
        K, dev = self.num_speculative_tokens, ids.device
        have = self._cache.valid_rows(ids, max_rows=a)  # the anchor row is always recomputed

        new = torch.arange(have, a + 1, device=dev)  # new depth-0 rows, the anchor row last
        depth = torch.arange(1, K, device=dev)  # mask rows (a, 1..K-1)
        n = new.numel()
        tokens = torch.cat([ids[new + 1], torch.full_like(depth, m.config.mask_token_id)])
        feats_in = torch.cat([feats[new], m.mask_hidden.reshape(1, -1).expand(K - 1, -1)])
        out = self.call.run(
            m.embed_tokens(tokens),
            torch.cat([new, a + depth]),
            have,
            feature=m.features(feats_in),
            logits_from=n - 1,
            kv_only_before_logits=True,  # depth-0 rows before the anchor: cache only
            tail_from=a,
        )
        self._cache.append(ids, n)  # depth-0 rows only: mask rows depend on this anchor
        self._greedy_tokens = out.tokens
        if out.logits is None:  # no kernel copy of the head
            return m.lm_head(m.norm(out.hidden[n - 1 :]))
        return out.logits

    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.token_ids.numel() < 2:
            return self.empty_proposal()
        self._greedy_tokens = None  # the one call's argmax of the rows, where it made one
        logits = self.draft_rows(ctx)
        tokens, q = self.pick(logits, ctx, self._greedy_tokens)
        conf = top1_confidences(logits) if ctx.estimates else None
        return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)
