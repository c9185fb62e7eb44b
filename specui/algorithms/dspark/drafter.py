"""DSpark in the decoding loop: DFlash's one backbone pass, then the heads slot by slot,
and the confidence policy that may cut the block before verification."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from specui.algorithms.base import DraftContext, stack_probs, top1_confidences
from specui.algorithms.dflash.drafter import DFlashDrafter
from specui.algorithms.dspark.model import DSparkModel
from specui.algorithms.dspark.policy import MODES
from specui.errors import SpecUIError
from specui.trace import Proposal


@dataclass(frozen=True)
class ConfidencePolicy:
    """How many drafted slots to send to the verifier, from the confidence head.

    ``off``: all of them.  ``threshold``: the longest prefix whose estimated
    survival ``cumprod(conf)`` stays >= ``threshold``.  ``cost``: the length n
    maximising expected tokens per step over cost,
    ``(1 + sum_{k<n} cumprod(conf)_k) / (draft_cost + verify_cost + verify_token_cost * n)``
    -- the 1 is the verifier's own token every step emits; the costs are in
    any common unit (e.g. ms).  At least ``min_tokens`` slots are kept.
    """

    mode: Literal["off", "threshold", "cost"] = "off"
    threshold: float = 0.5
    draft_cost: float = 0.1
    verify_cost: float = 1.0
    verify_token_cost: float = 0.05
    min_tokens: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecUIError(
                f"confidence policy mode must be off, threshold or cost, got {self.mode!r}"
            )
        if (
            min(self.draft_cost, self.verify_cost, self.verify_token_cost) < 0
            or self.min_tokens < 0
        ):
            raise SpecUIError("confidence policy costs and min_tokens must be >= 0")

    def keep(self, confidences: list[float]) -> int:
        """Number of leading slots to propose."""
        n_max = len(confidences)
        if self.mode == "off" or n_max == 0:
            return n_max
        survive = torch.tensor(confidences, dtype=torch.float64).cumprod(0)
        lo = min(self.min_tokens, n_max)
        if self.mode == "threshold":
            return max(lo, int((survive >= self.threshold).long().cumprod(0).sum()))
        n = torch.arange(n_max + 1, dtype=torch.float64)
        expected = 1 + torch.cat([survive.new_zeros(1), survive.cumsum(0)])  # [n_max+1]
        cost = self.draft_cost + self.verify_cost + self.verify_token_cost * n
        score = (expected / cost)[lo:]
        return lo + int(score.argmax())  # first maximum: the shorter block on ties


class DSparkDrafter(DFlashDrafter):
    """DSpark for the decoding loop: one backbone pass, then the heads left to right."""

    model_class: ClassVar[type] = DSparkModel
    model: DSparkModel
    markov_call: Any = None  # layer_call.MarkovChainCall, once the matmuls are on the bf16 kernel

    def __init__(
        self,
        model: DSparkModel,
        num_speculative_tokens: int | None = None,
        name: str | None = None,
        confidence_policy: ConfidencePolicy | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(model, num_speculative_tokens, name)
        if isinstance(confidence_policy, dict):
            try:
                confidence_policy = ConfidencePolicy(**confidence_policy)
            except TypeError as e:
                raise SpecUIError(f"bad confidence policy {confidence_policy}: {e}") from None
        self.confidence_policy = confidence_policy or ConfidencePolicy()

    @torch.inference_mode()
    def draft_chain(
        self, ctx: DraftContext, forced_tokens: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """Draft the block slot by slot: (tokens [K], q [K, V] (None when greedy), logits [K, Vd],
        confidence logits [K]).

        DFlash's one call gives every slot's hidden state and base logits; the heads then go left
        to right, each slot's Markov bias after the token drawn before it: greedily in one C call
        where ``matmuls_in_bf16`` built one (``layer_call.MarkovChainCall``), else in torch
        (``_chain``: every head type, sampled or greedy).  The confidence head reads no earlier
        slot's output, so it scores every slot at the end.  ``forced_tokens`` replaces the drafted
        tokens (teacher forcing, for tests).  Confidence logits are NaN without a confidence head.
        """
        m = self.model
        first = m.config.first_draft_slot  # DFlash-style: a slot 0 that predicts the anchor
        chain = self.markov_call if ctx.sampling.greedy else None
        # the torch chain runs slot 0's heads too (an rnn head's state advances the way training's
        # does), so it takes every slot
        hidden, base = self.draft_block(ctx, first if chain is not None else 0)
        anchor = ctx.token_ids.reshape(-1)[-1].to(hidden.device)
        conf_logits = None
        if chain is not None:
            in_call = chain.confidence is not None  # matmuls_in_bf16 decides
            tokens, logits, conf_logits = chain.run(
                base, int(anchor), forced_tokens, hidden if in_call else None
            )
            q = None
        else:
            tokens, q, logits = self._chain(hidden, base, anchor, ctx, forced_tokens)
            hidden = hidden[first:]
        if conf_logits is None and m.confidence_head is not None:
            fed = torch.tensor(forced_tokens or tokens.tolist(), device=hidden.device)
            prevs = torch.cat([anchor.reshape(1), fed])[: len(tokens)]
            conf_logits = m.confidence(hidden, prevs)
        if conf_logits is None:
            conf_logits = torch.full((len(tokens),), float("nan"))
        return tokens, q, logits, conf_logits

    def _chain(
        self,
        hidden: torch.Tensor,
        base: torch.Tensor,
        anchor: torch.Tensor,
        ctx: DraftContext,
        forced_tokens: list[int] | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The heads over every slot of the block (hidden [B, H], base logits [B, Vd]) in torch:
        (tokens [K], q [K, V] or None, logits [K, Vd]) of the slots from ``first_draft_slot``."""
        m = self.model
        first = m.config.first_draft_slot
        prev, state = anchor, None
        tokens, qs, logits_out = [], [], []
        for k in range(hidden.shape[0]):
            bias, _, state = m.heads(hidden[k], prev, state, confidence=False)
            if k < first:  # runs only to advance an rnn state the way training does
                continue
            logits = base[k] + bias if bias is not None else base[k]
            token, q = self.pick(logits[None], ctx)
            if forced_tokens is not None:
                token = torch.tensor([forced_tokens[len(tokens)]], device=hidden.device)
            tokens.append(token[0])
            qs.append(None if q is None else q[0])
            logits_out.append(logits)
            prev = token[0]
        return torch.stack(tokens), stack_probs(qs), torch.stack(logits_out)

    def matmuls_in_bf16(self, int8_rows: bool = False) -> None:
        super().matmuls_in_bf16(int8_rows)
        from specui.algorithms.layer_call import MarkovChainCall

        m = self.model
        reads_markov = m.confidence_head is not None and m.config.confidence_head_with_markov
        confidence = m.confidence_head.proj if reads_markov else None  # type: ignore[union-attr]
        self.markov_call = MarkovChainCall.build(m.markov_head, m.d2t, confidence)

    def propose(self, ctx: DraftContext) -> Proposal:
        tokens, q, logits, conf_logits = self.draft_chain(ctx)
        if self.model.confidence_head is None:
            conf = top1_confidences(logits) if ctx.estimates else None
            return Proposal(token_ids=tokens.tolist(), probs=q, confidences=conf)
        conf = torch.sigmoid(conf_logits).tolist()
        n = self.confidence_policy.keep(conf)
        return Proposal(
            token_ids=tokens[:n].tolist(),
            probs=None if q is None else q[:n],
            confidences=conf[:n],
            truncated_confidences=conf[n:] or None,
        )
