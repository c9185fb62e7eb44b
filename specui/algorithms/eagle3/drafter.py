"""EAGLE-3 in the decoding loop: K sequential single-row calls over a cache of the step-0 rows
of committed positions (P-EAGLE's drafter reuses the cache)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from specui.algorithms.base import (
    DraftContext,
    LearnedDrafter,
    PrefixCache,
    stack_probs,
    top1_confidences,
)
from specui.algorithms.eagle3.model import Eagle3Model
from specui.trace import Proposal


class EagleRowCache:
    """Which step-0 rows (0..P-1) of committed positions the drafter's call holds keys and values
    of: each step's speculative rows go after them, where the next step overwrites them."""

    def __init__(self) -> None:
        self.prefix = PrefixCache()
        self.rows = 0

    def valid_rows(self, ids: torch.Tensor, max_rows: int) -> int:
        """Rows still valid for committed ``ids`` (row i used tokens up to x[i+1]), at most
        ``max_rows``."""
        if self.prefix.valid_length(ids, self.rows + 1) == 0:
            self.rows = 0
        self.rows = min(self.rows, max_rows)  # asked again for the same anchor: redo its row
        return self.rows

    def append(self, ids: torch.Tensor, n: int) -> None:
        """``n`` more rows are in the call's cache, after the cached ones."""
        self.rows += n
        self.prefix.remember(ids)


class Eagle3Drafter(LearnedDrafter):
    """EAGLE-3 for the decoding loop: K sequential single-row passes."""

    model_class: ClassVar[type] = Eagle3Model
    model: Eagle3Model

    def reset(self) -> None:
        self._cache = EagleRowCache()

    def cached_positions(self) -> int:
        """Committed positions this drafter's cache covers: its next draft catches up on the
        rest (the adaptive policy prices that, ``specui.policy.cost``)."""
        return self._cache.rows

    @torch.inference_mode()
    def draft_steps(
        self, ctx: DraftContext, forced_tokens: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(tokens [K], q [K, V] (None when greedy), draft logits [K, Vd]).  ``forced_tokens``
        (tests) replaces the token fed to the next step."""
        m, call = self.model, self.call
        ids, feats = self.inputs(ctx)
        # the anchor row: the verifier processed position a and emitted x[a+1] = ids[-1]
        a = ids.numel() - 2
        dev = ids.device
        have = self._cache.valid_rows(ids, max_rows=a)  # the anchor row is always recomputed

        # Pass 0: the step-0 rows new since last time (the anchor row last), in cache order:
        # causal, all cached afterwards and read later as keys and values only.
        rows = torch.arange(have, a + 1, device=dev)  # [n]
        n = rows.numel()
        out = call.run(
            m.embed_tokens(ids[rows + 1]),
            rows + 1,
            have,
            feature=m.features(feats[rows]),
            logits_from=n - 1,
            kv_only_before_logits=True,
        )
        self._cache.append(ids, n)
        step_logits, g = self._output(out)
        step_tokens = out.tokens

        tokens, qs, logits_out = [], [], []
        for s in range(self.num_speculative_tokens):
            logits = step_logits.reshape(-1)
            token, q = self.pick(logits[None], ctx, step_tokens)
            if forced_tokens is not None:
                token = torch.tensor([forced_tokens[s]], device=dev)
            tokens.append(token[0])
            qs.append(None if q is None else q[0])
            logits_out.append(logits)
            if s == self.num_speculative_tokens - 1:
                break
            # Step s+1: the anchor row again, fed the drafted token and its own output, at
            # position a+2+s; one row after the cached ones and this block's earlier steps, it
            # sees them all (a window counts from the anchor row).
            row = self._cache.rows + s
            out = call.run(
                m.embed_tokens(token),
                torch.tensor([a + 2 + s], device=dev),
                row,
                feature=g,
                logits_from=0,
                window_base=a,
                tail_from=self._cache.rows,
            )
            step_logits, g = self._output(out)
            step_tokens = out.tokens
        return torch.stack(tokens), stack_probs(qs), torch.stack(logits_out)

    def _output(self, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``Eagle3Model.output`` of the call's last row: (draft logits, the next step's
        feature)."""
        if out.normed is None or out.logits is None:  # no kernel copy of the head
            return self.model.output(out.hidden[-1:])
        feature = out.normed if self.model.config.norm_output else out.hidden
        return out.logits[-1:], feature[-1:]

    def propose(self, ctx: DraftContext) -> Proposal:
        if (
            ctx.token_ids.numel() < 2
        ):  # the anchor row needs the verifier feature of the position before it
            return self.empty_proposal()
        tokens, q, logits = self.draft_steps(ctx)
        conf = top1_confidences(logits) if ctx.estimates else None
        return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)
