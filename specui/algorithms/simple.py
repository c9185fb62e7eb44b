"""Drafters that need no training: plain decoding (the baseline) and n-gram prompt lookup
(suffix decoding is ``suffix.py``).

They have no checkpoint, config, objective or vLLM export of their own, so no
AlgorithmSpec: ``BUILTIN`` is their list, next to the registry's learned ones.
"""

from __future__ import annotations

from specui.algorithms.base import DraftContext
from specui.algorithms.ngram import DEFAULT_NGRAM, NgramConfig
from specui.trace import Proposal

BUILTIN = ("none", "ngram", "suffix")  # the algorithm names runs store for them
LOOKUPS = ("ngram", "suffix")  # the model-free drafters a hybrid pairs with a learned one


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
    """Prompt lookup: find an earlier occurrence of the last n committed tokens and propose
    the K tokens that followed it.

    The rule is vLLM's (``vllm/v1/spec_decode/ngram_proposer.py``), so both backends draft
    the same tokens: the longest n in ``config.max_ngram .. config.min_ngram`` that occurs
    earlier, at its *earliest* occurrence; fewer than K tokens where the context ends first.

    The proposal is deterministic (q is one-hot), which speculative sampling
    handles exactly: accept with probability p(d), else sample p without d.
    """

    algorithm = "ngram"
    aux_layer_ids = None

    def __init__(
        self, num_speculative_tokens: int = 4, config: NgramConfig = DEFAULT_NGRAM
    ) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.config = config
        self.name = f"ngram-k{num_speculative_tokens}"

    @property
    def stored_settings(self) -> dict[str, int]:
        """The lookup's settings, which the run service stores with the run."""
        return self.config.settings()

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        tokens = ctx.token_ids
        length = tokens.shape[0]
        k = self.num_speculative_tokens
        for n in range(min(self.config.max_ngram, length - 1), self.config.min_ngram - 1, -1):
            pattern = tokens[length - n :]
            # Windows of size n over tokens[:-1], so a match never is the suffix itself
            # and at least one token follows it.
            windows = tokens[:-1].unfold(0, n, 1)  # [length-n, n]
            hits = (windows == pattern).all(-1).nonzero().flatten()
            if hits.numel():
                start = int(hits[0]) + n  # the earliest match, as vLLM picks
                return Proposal(token_ids=tokens[start : start + k].tolist())
        return Proposal(token_ids=[])
