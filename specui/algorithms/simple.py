"""Drafters that need no training: plain decoding (the baseline) and n-gram prompt lookup.

They have no checkpoint, config, objective or vLLM export of their own, so no
AlgorithmSpec: ``BUILTIN`` is their list, next to the registry's learned ones.
"""

from __future__ import annotations

from specui.algorithms.base import DraftContext
from specui.trace import Proposal

BUILTIN = ("none", "ngram")  # the algorithm names runs store for them


class PlainDrafter:
    """K = 0: every step is one verifier forward and one token (the baseline)."""

    name = "none"
    algorithm = "none"
    aux_layer_ids = None
    num_speculative_tokens = 0

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        return Proposal(token_ids=[])


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens
    (n = max_ngram .. min_ngram) and propose the K tokens that followed it.

    The proposal is deterministic (q is one-hot), which speculative sampling
    handles exactly: accept with probability p(d), else sample p without d.
    """

    algorithm = "ngram"
    aux_layer_ids = None

    def __init__(self, num_speculative_tokens: int = 4, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = f"ngram-k{num_speculative_tokens}"

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        tokens = ctx.token_ids
        length = tokens.shape[0]
        k = self.num_speculative_tokens
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            pattern = tokens[length - n :]
            # Windows of size n over tokens[:-1], so a match never is the suffix itself.
            windows = tokens[:-1].unfold(0, n, 1)  # [length-n, n]
            hits = (windows == pattern).all(-1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + n  # the most recent match
                follow = tokens[start : start + k]
                if follow.numel():
                    return Proposal(token_ids=follow.tolist())
        return Proposal(token_ids=[])

