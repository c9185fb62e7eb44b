"""What tau, a_k and the draft acceptance rate mean, and what each is when there is
nothing to measure (docs/algorithms.md, "Metrics").

The decoding trace, the comparison over stored runs and vLLM's counters all report these
numbers; each calls the functions here so the three agree, the empty cases included.
Pure Python: ``specui.trace`` sits below the store and imports this module.

A *step* is one verifier pass; a *draft* is a step that proposed at least one token.

* tau (acceptance length) = 1 + accepted draft tokens / drafts: the tokens a drafting
  step commits, the verifier's bonus or corrected token included.  With steps but no
  drafts (plain decoding) every step commits the verifier's token alone, so tau is 1.
  With no steps, or where the steps are not counted (vLLM's counters count drafts only),
  there is nothing to say: None.
* a_k = drafts whose slot k (1-based) was accepted / drafts.  Without drafts no slot was
  tried: no positions at all, rather than a row of zeros.
* draft acceptance rate = accepted draft tokens / drafted tokens; None when nothing was
  drafted.
* tokens per step = output tokens / steps: what a verifier pass yields on average, the
  steps that drafted nothing included.  It equals tau when every step drafts (a learned
  drafter); a drafter that drafts at only some steps (n-gram lookup) has a tau above it, so
  tokens per step is the figure to compare across drafters.  None without steps (vLLM's
  counters do not count them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

NO_DRAFT_ACCEPTANCE_LENGTH = 1.0  # a step without drafts commits the verifier's token only


def acceptance_length(accepted_tokens: float, drafts: float, steps: float | None) -> float | None:
    """tau = 1 + accepted draft tokens / drafts; 1.0 with steps but no drafts; None with
    no steps, or ``steps`` None (not counted) and no drafts."""
    if drafts > 0:
        return 1.0 + accepted_tokens / drafts
    return NO_DRAFT_ACCEPTANCE_LENGTH if steps else None


def tokens_per_verifier_step(output_tokens: float | None, steps: float | None) -> float | None:
    """Output tokens / verifier steps; None without steps or without a token count."""
    if not steps or output_tokens is None:
        return None
    return output_tokens / steps


def draft_acceptance_rate(accepted_tokens: float, drafted_tokens: float) -> float | None:
    """Accepted draft tokens / drafted tokens; None when nothing was drafted."""
    return accepted_tokens / drafted_tokens if drafted_tokens > 0 else None


def per_position_acceptance(accepted_at: Sequence[float], drafts: float) -> list[float]:
    """a_k = ``accepted_at[k - 1]`` / drafts for k = 1..len(accepted_at); [] without drafts.

    ``accepted_at[k - 1]`` counts the drafts whose slot k was accepted (vLLM counts it per
    position; from steps it is ``accepted_at_positions``)."""
    if drafts <= 0:
        return []
    return [a / drafts for a in accepted_at]


def accepted_at_positions(histogram: Mapping[int, float], positions: int) -> list[float]:
    """Drafts whose slot k was accepted, k = 1..positions, from ``histogram`` (accepted
    draft tokens -> drafts).  Slot k is accepted iff the draft's first k tokens were, so
    these are the drafts that accepted k or more."""
    return [float(sum(c for n, c in histogram.items() if n >= k)) for k in range(1, positions + 1)]


class DraftStep(Protocol):
    """What a step needs for the acceptance metrics (``specui.trace.StepTrace`` has it)."""

    @property
    def num_drafted(self) -> int: ...

    @property
    def num_accepted(self) -> int: ...

    @property
    def emitted_token_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class AcceptanceCounts:
    """The counts the acceptance metrics are ratios of, over some steps."""

    steps: int | None  # verifier passes; None: not counted
    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # over drafts
    histogram: dict[int, int] = field(default_factory=dict)  # accepted draft tokens -> drafts
    # Tokens the steps committed (after stop truncation); None: not counted.
    output_tokens: int | None = None

    @classmethod
    def of_steps(cls, steps: Iterable[DraftStep]) -> AcceptanceCounts:
        n = drafts = drafted = accepted = emitted = 0
        hist: dict[int, int] = {}
        for s in steps:
            n += 1
            emitted += len(s.emitted_token_ids)
            if s.num_drafted > 0:
                drafts += 1
                drafted += s.num_drafted
                accepted += s.num_accepted
                hist[s.num_accepted] = hist.get(s.num_accepted, 0) + 1
        return cls(n, drafts, drafted, accepted, hist, emitted)

    @property
    def acceptance_length(self) -> float | None:
        return acceptance_length(self.accepted_tokens, self.drafts, self.steps)

    @property
    def tokens_per_verifier_step(self) -> float | None:
        return tokens_per_verifier_step(self.output_tokens, self.steps)

    @property
    def draft_acceptance_rate(self) -> float | None:
        return draft_acceptance_rate(self.accepted_tokens, self.drafted_tokens)

    def per_position_acceptance(self, positions: int) -> list[float]:
        """a_1..a_positions ([] without drafts or positions)."""
        return per_position_acceptance(
            accepted_at_positions(self.histogram, positions), self.drafts
        )

    def tokens_per_step(self) -> dict[int, int]:
        """1 + accepted draft tokens -> drafts: the histogram the Compare tab draws."""
        return {1 + n: c for n, c in sorted(self.histogram.items())}
