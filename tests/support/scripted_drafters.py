"""Drafters for testing the decoding loop: deliberately bad or scripted proposals."""

from __future__ import annotations

import torch

from specui.algorithms.base import DraftContext
from specui.sampling import process_logits
from specui.trace import Proposal


class RandomDrafter:
    """Proposes K tokens from a random distribution q (a fresh one each step),
    sampled (or argmax when greedy) -- a drafter that knows nothing."""

    algorithm = "random"
    aux_layer_ids = None

    def __init__(self, vocab_size: int, k: int = 4, seed: int = 0, sharpness: float = 3.0) -> None:
        self.vocab_size = vocab_size
        self.num_speculative_tokens = k
        self.name = f"random-k{k}"
        self.gen = torch.Generator().manual_seed(seed)
        self.sharpness = sharpness

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        k = self.num_speculative_tokens
        logits = torch.randn(k, self.vocab_size, generator=self.gen) * self.sharpness
        q = process_logits(logits, ctx.sampling)
        if ctx.sampling.greedy:
            tokens = q.argmax(-1)
        else:
            tokens = torch.multinomial(q, 1, generator=ctx.generator).squeeze(-1)
        # Each slot's q is drawn before its token: its top-1 probability is a legal estimate.
        conf = q.amax(-1).tolist() if ctx.estimates else None
        return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)


class ScriptedDrafter:
    """Proposes exactly the given blocks, one per step (deterministic, q one-hot)."""

    algorithm = "scripted"
    aux_layer_ids = None
    name = "scripted"

    def __init__(self, blocks: list[list[int]]) -> None:
        self.blocks = blocks
        self.num_speculative_tokens = max(len(b) for b in blocks)
        self.calls = 0
        self.seen: list[list[int]] = []

    def reset(self) -> None:
        self.calls = 0

    def propose(self, ctx: DraftContext) -> Proposal:
        self.seen.append(ctx.token_ids.tolist())
        block = self.blocks[self.calls] if self.calls < len(self.blocks) else []
        self.calls += 1
        return Proposal(token_ids=list(block))


class PairedDrafter:
    """Drafts with ``sent`` and, from the same context, with ``other``: ``pairs`` keeps both
    proposals of every step, so two paths of one drafter are compared on the same contexts."""

    def __init__(self, sent, other) -> None:
        self.sent, self.other, self.pairs = sent, other, []

    def __getattr__(self, name):
        return getattr(self.sent, name)

    def reset(self) -> None:
        self.sent.reset()
        self.other.reset()

    def propose(self, ctx):
        a, b = self.sent.propose(ctx), self.other.propose(ctx)
        self.pairs.append((a, b))
        return a

    def token_pairs(self) -> list[tuple[int, int]]:
        """(sent, other) drafted token of every slot both proposed."""
        return [p for a, b in self.pairs for p in zip(a.token_ids, b.token_ids, strict=False)]
