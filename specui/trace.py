"""Records that cross module boundaries: sampling settings, a drafter's proposal,
one decoding step's trace and a finished generation's summary.

The decoding loop (``specui.engine``) produces them; the store, the CLI and the
dashboard consume them.  Metric definitions: docs/algorithms.md, "Metrics".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from specui.acceptance import AcceptanceCounts
from specui.errors import SpecUIError

if TYPE_CHECKING:  # torch costs seconds to import; the store and CLI need none of it
    import torch

__all__ = ["SpecUIError"]

# Limits on decoding settings a user types (CLI, API, dashboard).  The engine refuses
# the same K range; a seed must fit a torch generator (and SQLite) even after the
# per-prompt offsets benchmarks add to it.
MAX_SPECULATIVE_TOKENS = 256
MAX_SEED = 2**32 - 1


def as_int(value: Any, name: str) -> int:
    """``value`` as an int, or one SpecUIError naming ``name`` (API callers send any JSON)."""
    if isinstance(value, bool):
        raise SpecUIError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)  # number widgets send 3.0
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise SpecUIError(f"{name} must be an integer, got {value!r}")


def as_float(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise SpecUIError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SpecUIError(f"{name} must be a number, got {value!r}") from None


def check_decode_settings(
    *,
    max_new_tokens: Any = 1,
    seed: Any = 0,
    num_speculative_tokens: Any = None,
    max_context: int | None = None,
) -> None:
    """One SpecUIError for the first bad setting; ``num_speculative_tokens`` None = the drafter's
    own K.

    ``max_context`` (the verifier's window) caps max_new_tokens: no generation can be longer.
    """
    n = as_int(max_new_tokens, "max_new_tokens")
    if n < 1:
        raise SpecUIError(f"max_new_tokens must be >= 1, got {n}")
    if max_context is not None and n > max_context:
        raise SpecUIError(
            f"max_new_tokens {n} is more than the verifier's context window ({max_context} tokens)"
        )
    s = as_int(seed, "seed")
    if not 0 <= s <= MAX_SEED:
        raise SpecUIError(f"seed must be in 0..{MAX_SEED}, got {s}")
    if num_speculative_tokens is not None:
        k = as_int(num_speculative_tokens, "number of speculative tokens (K)")
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise SpecUIError(
                f"number of speculative tokens (K) must be in 1..{MAX_SPECULATIVE_TOKENS}, got {k}"
            )


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen.  The same processing is applied to the verifier's
    distribution p and the drafter's distribution q (losslessness needs that)."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        # Through object.__setattr__: the dataclass is frozen.  API callers may send strings.
        object.__setattr__(self, "temperature", as_float(self.temperature, "temperature"))
        object.__setattr__(self, "top_p", as_float(self.top_p, "top_p"))
        object.__setattr__(self, "top_k", as_int(self.top_k, "top_k"))
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise SpecUIError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecUIError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SpecUIError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Proposal:
    """A drafter's block for one step.

    ``probs`` is the drafter's own (processed) distribution q for each drafted
    slot, ``[k, V]``; ``None`` means a deterministic proposal (q is one-hot on
    the drafted token, e.g. n-gram lookup).  ``confidences`` are per-slot
    acceptance estimates from a confidence head, in [0, 1].
    """

    token_ids: list[int]
    probs: torch.Tensor | None = None
    confidences: list[float] | None = None
    # Confidence scores of slots dropped by a confidence policy (for the trace).
    truncated_confidences: list[float] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)


class FinalTokenKind(StrEnum):
    """The verifier's own token at the end of a step."""

    BONUS = "bonus"  # every draft token was accepted; one more from the verifier
    CORRECTED = "corrected"  # replaces the first rejected draft token


@dataclass
class StepTrace:
    """One draft -> verify -> accept step, as the dashboard animates it."""

    step: int
    context_len: int  # committed tokens (prompt + generated) before this step
    draft_token_ids: list[int]
    draft_texts: list[str]
    draft_probs: list[float]  # q(token) for each drafted token (1.0 if deterministic)
    target_probs: list[float]  # p(token) under the verifier for each drafted token
    confidences: list[float] | None
    num_accepted: int
    final_token_id: int
    final_token_text: str
    final_token_kind: FinalTokenKind
    emitted_token_ids: list[int]  # accepted drafts + final token (after stop truncation)
    draft_time_s: float
    verify_time_s: float
    # Who drafted the sent block (an algorithm name: "dflash", "suffix"; None on a plain step)
    # and the drafted tail the policy did not send (the Playground greys it).  Not stored.
    proposer: str | None = None
    unsent_token_ids: list[int] = field(default_factory=list)
    unsent_texts: list[str] = field(default_factory=list)

    @property
    def num_drafted(self) -> int:
        return len(self.draft_token_ids)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["final_token_kind"] = str(self.final_token_kind)
        return d


@dataclass
class GenerationResult:
    """Summary of one prompt's generation."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_text: str
    steps: list[StepTrace] = field(default_factory=list)
    stop_reason: str = "max_tokens"  # eos | stop_string | max_tokens | cancelled
    wall_time_s: float = 0.0
    num_speculative_tokens: int = 0

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def acceptance_counts(self) -> AcceptanceCounts:
        return AcceptanceCounts.of_steps(self.steps)

    @property
    def acceptance_length(self) -> float:
        """tau (``specui.acceptance``); 1.0 before the first step, as the live
        stats show a number from the start."""
        tau = self.acceptance_counts.acceptance_length
        return 1.0 if tau is None else tau

    @property
    def per_position_acceptance(self) -> list[float]:
        """a_k, k = 1..K (``specui.acceptance``); [] without drafts."""
        return self.acceptance_counts.per_position_acceptance(self.num_speculative_tokens)

    @property
    def tokens_per_step(self) -> float:
        """Output tokens / steps (``specui.acceptance``); 1.0 before the first step,
        as tau is, so the live stats show a number from the start."""
        per_step = self.acceptance_counts.tokens_per_verifier_step
        return 1.0 if per_step is None else per_step

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted / drafted tokens (``specui.acceptance``); 0.0 when nothing
        was drafted, as the live stats print a number (the comparison leaves it blank)."""
        rate = self.acceptance_counts.draft_acceptance_rate
        return 0.0 if rate is None else rate

    @property
    def tokens_per_s(self) -> float:
        return len(self.output_token_ids) / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "output_text": self.output_text,
            "output_token_ids": self.output_token_ids,
            "acceptance_length": self.acceptance_length,
            "tokens_per_step": self.tokens_per_step,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "tokens_per_s": self.tokens_per_s,  # the name the CSV, Compare and the store use
            "num_steps": self.num_steps,
            "num_output_tokens": len(self.output_token_ids),
            "wall_time_s": self.wall_time_s,
            "draft_time_s": sum(s.draft_time_s for s in self.steps),
            "verify_time_s": sum(s.verify_time_s for s in self.steps),
            "stop_reason": self.stop_reason,
        }
