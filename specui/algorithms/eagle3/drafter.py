"""EAGLE-3 in the decoding loop: K sequential single-row passes over a cache of the
step-0 rows of committed positions (P-EAGLE's drafter reuses the cache)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from specui.algorithms.base import (
    DraftContext,
    LearnedDrafter,
    PrefixCache,
    stack_probs,
    top1_confidences,
)
from specui.algorithms.eagle3.model import Eagle3Model
from specui.algorithms.layers import KV, CacheWrite, KVBuffer, extend_kv
from specui.trace import Proposal


class EagleRowCache:
    """Per-layer K/V of the step-0 rows (0..P-1) of committed positions, grown incrementally.

    ``in_place``: held in one ``KVBuffer`` a layer, with each step's speculative rows written
    after the committed ones; else concatenated (the eager path, ``kv``).
    """

    def __init__(self, in_place: bool = False) -> None:
        self.prefix = PrefixCache()
        self.kv: list[KV] | None = None  # per layer (k, v) [1, 1, Hkv, P, D]
        self.buffers: list[KVBuffer] | None = [] if in_place else None
        self.rows = 0

    def valid_rows(self, ids: torch.Tensor, max_rows: int) -> int:
        """Rows still valid for committed ``ids`` (row i used tokens up to x[i+1]), at most
        ``max_rows``."""
        if self.prefix.valid_length(ids, self.rows + 1) == 0:
            self.kv, self.rows = None, 0
        if self.rows > max_rows:  # asked again for the same anchor: redo its row
            if self.kv is not None:
                self.kv = [(k[..., :max_rows, :], v[..., :max_rows, :]) for k, v in self.kv]
            self.rows = max_rows
        return self.rows

    def append(self, ids: torch.Tensor, kv: list[KV], n: int) -> None:
        """Keep the first ``n`` new rows of ``kv`` (per layer [1, 1, Hkv, S, D]); in place they
        are already in the buffers, after the cached rows."""
        if self.buffers is None:
            self.kv = extend_kv(self.kv, [(k[..., :n, :], v[..., :n, :]) for k, v in kv])
        self.rows += n
        self.prefix.remember(ids)

    def past(
        self, model: nn.Module, device: torch.device, spec: list[KV] | None = None, extra: int = 0
    ) -> list[KV] | list[CacheWrite]:
        """Each layer's ``past`` for rows after the cached ones and ``extra`` speculative rows
        (in ``spec`` on the eager path)."""
        if self.buffers is not None:
            layers = model.config.layer.num_hidden_layers
            self.buffers += [KVBuffer() for _ in range(layers - len(self.buffers))]
            return [CacheWrite(b, self.rows + extra) for b in self.buffers]
        past = self.kv or self.empty(model, device)
        return extend_kv(past, spec) if spec is not None else past

    def empty(self, model: nn.Module, device: torch.device) -> list[KV]:
        cfg = model.config.layer
        z = torch.zeros(1, 1, cfg.num_key_value_heads, 0, cfg.head_dim, device=device)
        return [(z, z)] * cfg.num_hidden_layers


class Eagle3Drafter(LearnedDrafter):
    """EAGLE-3 for the decoding loop: K sequential single-row passes."""

    model_class: ClassVar[type] = Eagle3Model
    model: Eagle3Model

    def reset(self) -> None:
        self._cache = EagleRowCache(self.in_place)

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
        m = self.model
        ids, feats = self.inputs(ctx)
        # the anchor row: the verifier processed position a and emitted x[a+1] = ids[-1]
        a = ids.numel() - 2
        dev = ids.device
        have = self._cache.valid_rows(ids, max_rows=a)  # the anchor row is always recomputed

        # Pass 0: the step-0 rows new since last time (the anchor row last), all cached afterwards.
        rows = torch.arange(have, a + 1, device=dev)  # [n]
        keys = torch.arange(a + 1, device=dev)  # [have + n]
        inputs = (m.embed_tokens(ids[rows + 1]), m.features(feats[rows]), rows + 1)
        if self.one_call is not None:  # the rows in cache order are causal: no masks
            n = rows.numel()
            out = self.one_call.run(
                inputs[0],
                inputs[2],
                have,
                feature=inputs[1],
                logits_from=n - 1,
                kv_only_before_logits=True,  # the committed rows are read later as cache only
            )
            step_logits, g = self._output(out.hidden, out.normed, out.logits)
            step_tokens = out.tokens
            self._cache.append(ids, [], n)
        else:
            masks = [self._visible(li, rows, keys) for li in range(len(m.layers))]
            masks = [None if v is None else v[None, None] for v in masks]
            h, kv = m.run_layers(*(t[None, None] for t in inputs), masks, self._cache.past(m, dev))
            self._cache.append(ids, kv, rows.numel())
            step_logits, g = m.output(h[..., -1:, :])
            step_tokens = None

        tokens, qs, logits_out = [], [], []
        spec: list[KV] | None = None  # this block's speculative rows, per layer; dropped at the end
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
            # position a+2+s.
            pos = torch.tensor([[[a + 2 + s]]], device=dev)
            if self.one_call is not None:  # one row, after the cached ones: it sees them all
                row = self._cache.rows + s
                out = self.one_call.run(m.embed_tokens(token), pos, row, feature=g, logits_from=0)
                step_logits, g = self._output(out.hidden, out.normed, out.logits)
                step_tokens = out.tokens
                continue
            # keys: every step-0 row (cached), this block's earlier speculative rows, this row
            past_s = self._cache.past(m, dev, spec, extra=s)
            anchor = torch.tensor([a], device=dev)
            vis = [self._visible(li, anchor, keys, extra=s + 1) for li in range(len(m.layers))]
            vis = [None if v is None else v[None, None] for v in vis]
            h, kv = m.run_layers(m.embed_tokens(token)[None, None], g, pos, vis, past_s)
            if self._cache.buffers is None:  # in place, the buffers hold them already
                spec = extend_kv(spec, kv)
            step_logits, g = m.output(h)
            step_tokens = None
        return torch.stack(tokens), stack_probs(qs), torch.stack(logits_out)

    def _output(
        self, h: torch.Tensor, normed: torch.Tensor | None, logits: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``Eagle3Model.output`` of the one call's last row (its head's, where it has one)."""
        if normed is None or logits is None:
            return self.model.output(h[-1:])
        return logits[-1:], normed[-1:] if self.model.config.norm_output else h[-1:]

    def _visible(
        self, layer_idx: int, rows: torch.Tensor, keys: torch.Tensor, extra: int = 0
    ) -> torch.Tensor | None:
        """[len(rows), len(keys) + extra]: step-0 keys j <= row (within the window) plus ``extra``
        speculative keys of the same row, all visible.  None (in place) where every key is:
        the last row of a full-attention layer."""
        w = self.model.config.layer.window(layer_idx)
        if self.in_place and w is None and rows.numel() == 1 and int(rows[0]) == len(keys) - 1:
            return None
        vis = keys[None] <= rows[:, None]
        if w is not None:
            vis = vis & (keys[None] > rows[:, None] - w)
        return torch.cat([vis, vis.new_ones(rows.numel(), extra)], dim=-1)

    def propose(self, ctx: DraftContext) -> Proposal:
        if (
            ctx.token_ids.numel() < 2
        ):  # the anchor row needs the verifier feature of the position before it
            return self.empty_proposal()
        tokens, q, logits = self.draft_steps(ctx)
        conf = top1_confidences(logits) if ctx.estimates else None
        return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)
