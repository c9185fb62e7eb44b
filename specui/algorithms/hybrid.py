"""A lookup (n-gram or suffix) and a learned drafter in one proposer, named
``LEARNED+LOOKUP`` (``dflash+suffix``).

Which of the two drafts a step is the decoding policy's choice (``specui.policy``): the draft
with the higher expected accepted length per unit of time, where the lookup's is read from its
match statistics before the learned drafter runs, so a step the lookup wins costs no learned
draft.  Without a policy (``--policy fixed``) the lookup goes first, as llama.cpp runs a draft
model beside its lookup: its draft when it has one, else the learned drafter's.

The learned drafter's own context (its KV cache, the verifier taps it has read) stays in step
whether or not it drafted: each learned drafter keeps it keyed by the committed tokens it has
seen (``PrefixCache``) and catches up on every token committed since its last draft, so the
next draft it makes is the one it would make had it drafted every step
(``tests/decoding/test_policy.py`` checks this).
"""

from __future__ import annotations

from typing import Any

from specui.algorithms.base import DraftContext, Drafter
from specui.trace import Proposal


class HybridDrafter:
    """``learned`` and ``lookup`` behind one Drafter: ``proposers`` names both for the policy."""

    def __init__(self, learned: Drafter, lookup: Drafter, name: str | None = None) -> None:
        self.learned, self.lookup = learned, lookup
        self.algorithm = f"{learned.algorithm}+{lookup.algorithm}"
        self.name = name or self.algorithm
        self.aux_layer_ids = learned.aux_layer_ids
        self.num_speculative_tokens = max(
            learned.num_speculative_tokens, lookup.num_speculative_tokens
        )

    @property
    def proposers(self) -> tuple[tuple[str, Drafter], tuple[str, Drafter]]:
        """(name, drafter) of the lookup, then the learned drafter."""
        return (self.lookup.algorithm, self.lookup), (self.learned.algorithm, self.learned)

    @property
    def stored_settings(self) -> dict[str, Any]:
        own = getattr(self.lookup, "stored_settings", None) or {}
        return {**own, "learned_k": self.learned.num_speculative_tokens}

    def reset(self) -> None:
        self.learned.reset()
        self.lookup.reset()

    def propose(self, ctx: DraftContext) -> Proposal:
        """Lookup first (the fixed policy's rule; the adaptive policy chooses for itself)."""
        found = self.lookup.propose(ctx)
        return found if len(found) else self.learned.propose(ctx)
