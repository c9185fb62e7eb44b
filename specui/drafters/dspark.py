"""DSpark: DFlash plus a Markov head and a confidence head (DeepSeek, DeepSpec).

Everything of DFlash is inherited; DSpark changes three things:

* ``sample_from_anchor=True``: every slot, the anchor's too, predicts the next
  position, so a block of B slots drafts B tokens (slot k -> position p+k+1).
* Markov head: slot k's logits get a low-rank bias ``W2 @ W1[prev_k]`` (rank r),
  prev_k being the token before the one slot k predicts -- the anchor for slot
  0, then the token drafted for slot k-1.  Drafting therefore goes left to
  right (cheap: only the bias is sequential, the backbone ran once).
* Confidence head: ``proj([h_k; W1[prev_k]])`` -> one logit per slot;
  sigmoid is the predicted chance slot k is accepted given its prefix was, so
  ``cumprod`` estimates how far the block will survive.  An optional
  ``ConfidencePolicy`` cuts the block before verification.  Cutting never
  affects losslessness: the engine verifies whatever is proposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from specui.drafters.base import DraftContext, register
from specui.drafters.checkpoint import DraftConfig, read_field
from specui.drafters.dflash import BlockOutput, DFlashConfig, DFlashDrafter, DFlashModel
from specui.drafters.layers import pick_tokens, to_target_vocab
from specui.trace import Proposal, SpecUIError

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


@dataclass(kw_only=True)
class DSparkConfig(DFlashConfig):
    model_type: ClassVar[str] = "dspark"
    architecture: ClassVar[str] = "DSparkDraftModel"
    config_class_name: ClassVar[str] = "DSparkSpeculatorConfig"

    sample_from_anchor: bool = True
    markov_rank: int = 256  # 0 = no Markov head
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True  # confidence reads [h_k; W1[prev_k]] (else h_k)

    create_options: ClassVar[tuple[str, ...]] = (
        "sample_from_anchor", "markov_rank", "markov_head_type", "enable_confidence_head",
        "confidence_head_with_markov",
    )  # fmt: skip

    @classmethod
    def own_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return super().own_from_dict(d) | {
            "markov_rank": read_field(d, "markov_rank", "int", 256),
            "markov_head_type": read_field(d, "markov_head_type", "str", "vanilla"),
            "enable_confidence_head": read_field(d, "enable_confidence_head", "bool", True),
            "confidence_head_with_markov": read_field(d, "confidence_head_with_markov", "bool", True),
        }

    def own_to_dict(self) -> dict[str, Any]:
        return super().own_to_dict() | {
            "markov_rank": self.markov_rank,
            "markov_head_type": self.markov_head_type,
            "enable_confidence_head": self.enable_confidence_head,
            "confidence_head_with_markov": self.confidence_head_with_markov,
        }

    def problems(self, verifier: Any) -> list[str]:
        out = super().problems(verifier)
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            out.append(f"markov_head_type {self.markov_head_type!r} is not one of {', '.join(MARKOV_HEAD_TYPES)}")
        if self.markov_rank < 0:
            out.append(f"markov_rank must be >= 0, got {self.markov_rank}")
        if self.enable_confidence_head and self.confidence_head_with_markov and self.markov_rank == 0:
            out.append("confidence_head_with_markov needs markov_rank > 0")
        return out


class MarkovHead(nn.Module):
    """Low-rank previous-token logit bias; W1 indexes the verifier vocabulary, W2 maps to the draft's.

    ``vanilla``: ``W2 W1[prev]``.  ``gated``: ``W2 (sigmoid(gate([h; e])) * e)``.
    ``rnn``: a gated recurrent state over the block's slots feeds W2.
    """

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int, hidden_size: int, head_type: str) -> None:
        super().__init__()
        self.head_type, self.rank = head_type, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)  # [gate; candidate; output]

    def step(
        self, e: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Bias for one slot (or all slots at once unless rnn).

        e [.., r] = W1[prev], h [.., H] the slot's hidden; state [.., r] (rnn only).
        Returns (bias [.., Vd], next state).
        """
        if self.head_type == "vanilla":
            return self.markov_w2(e), None
        if self.head_type == "gated":
            return self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat([h, e], -1))) * e), None
        state = e.new_zeros(e.shape) if state is None else state
        gate, cand, out = self.joint_proj(torch.cat([state, e, h], -1)).chunk(3, -1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1 - gate) * torch.tanh(cand)
        return self.markov_w2(torch.tanh(out)), state

    def block_bias(self, e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """e [A, B, r], h [A, B, H] -> bias [A, B, Vd] (teacher-forced: every prev given)."""
        if self.head_type != "rnn":
            return self.step(e, h, None)[0]
        state, out = None, []
        for k in range(e.shape[1]):
            bias, state = self.step(e[:, k], h[:, k], state)
            out.append(bias)
        return torch.stack(out, dim=1)


class ConfidenceHead(nn.Module):
    """One acceptance logit per slot (linear, with bias)."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).squeeze(-1)


@dataclass
class SparkBlockOutput(BlockOutput):
    markov_logits: torch.Tensor  # [A, B, Vd] logits + Markov bias: the DSpark draft distribution
    confidence_logits: torch.Tensor | None  # [A, B] pre-sigmoid acceptance logits
    prev_token_ids: torch.Tensor  # [A, B] the previous tokens the heads were given


class DSparkModel(DFlashModel):
    config_class: ClassVar[type[DraftConfig]] = DSparkConfig
    config: DSparkConfig

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        H, r = config.layer.hidden_size, config.markov_rank
        self.markov_head = (
            MarkovHead(config.layer.vocab_size, config.draft_vocab_size, r, H, config.markov_head_type) if r > 0 else None
        )
        self.confidence_head = (
            ConfidenceHead(H + (r if config.confidence_head_with_markov else 0)) if config.enable_confidence_head else None
        )

    @classmethod
    def create(cls, verifier: Any, **sizes: Any) -> DSparkModel:
        """DFlashModel.create; options add markov_rank (0 = none), markov_head_type, the confidence head."""
        if sizes.get("markov_rank", 256) == 0:  # no Markov head: the confidence head reads h_k alone
            sizes.setdefault("confidence_head_with_markov", False)
        return super().create(verifier, **sizes)  # type: ignore[return-value]

    def init_extra(self) -> None:
        if self.markov_head is not None:
            nn.init.normal_(self.markov_head.markov_w1.weight, std=1.0)  # an embedding table (nn.Embedding's scale)
            nn.init.zeros_(self.markov_head.markov_w2.weight)  # bias 0: training starts from plain DFlash

    def heads(
        self, hidden: torch.Tensor, prev_ids: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(Markov bias [.., Vd] or None, confidence logit [..] or None, rnn state) for hidden [.., H]."""
        bias = conf = e = None
        if self.markov_head is not None:
            e = self.markov_head.markov_w1(prev_ids)
            bias, state = self.markov_head.step(e, hidden, state)
        if self.confidence_head is not None:
            x = torch.cat([hidden, e], -1) if self.config.confidence_head_with_markov else hidden
            conf = self.confidence_head(x)
        return bias, conf, state

    def forward_blocks(  # type: ignore[override]
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        anchors: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        prev_token_ids: torch.Tensor | None = None,
    ) -> SparkBlockOutput:
        """DFlashModel.forward_blocks plus both heads, teacher-forced.

        ``prev_token_ids`` [A, B] (default: from ``input_ids``): with
        sample_from_anchor, slot k's previous token is x[p+k]; without, x[p+k-1]
        (slot 0 and 1 both get the anchor).  Positions past the sequence are
        clamped to its last token (those slots have no target anyway).
        """
        out = super().forward_blocks(features, input_ids, anchors, position_ids, document_ids)
        if prev_token_ids is None:
            ids = input_ids.reshape(-1)
            k = torch.arange(self.config.block_size, device=ids.device)
            if not self.config.sample_from_anchor:
                k = (k - 1).clamp(min=0)
            prev_token_ids = ids[(anchors.reshape(-1, 1).to(ids.device) + k).clamp(max=ids.numel() - 1)]
        logits, conf, e = out.logits, None, None
        if self.markov_head is not None:
            e = self.markov_head.markov_w1(prev_token_ids)  # [A, B, r]
            logits = logits + self.markov_head.block_bias(e, out.hidden)
        if self.confidence_head is not None:
            x = torch.cat([out.hidden, e], -1) if self.config.confidence_head_with_markov else out.hidden
            conf = self.confidence_head(x)  # [A, B]
        return SparkBlockOutput(
            hidden=out.hidden, logits=out.logits, layer_outputs=out.layer_outputs,
            markov_logits=logits, confidence_logits=conf, prev_token_ids=prev_token_ids,
        )  # fmt: skip


# --- inference ---------------------------------------------------------------------------------


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
        if self.mode not in ("off", "threshold", "cost"):
            raise SpecUIError(f"confidence policy mode must be off, threshold or cost, got {self.mode!r}")
        if min(self.draft_cost, self.verify_cost, self.verify_token_cost) < 0 or self.min_tokens < 0:
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


@register("dspark")
class DSparkDrafter(DFlashDrafter):
    """DSpark for the decoding loop: one backbone pass, then the heads left to right."""

    model_class: ClassVar[type] = DSparkModel
    model: DSparkModel

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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draft the block slot by slot: (tokens [K], q [K, V], logits [K, Vd], confidence logits [K]).

        ``forced_tokens`` replaces the drafted tokens (teacher forcing, for tests).
        Confidence logits are NaN without a confidence head.
        """
        m = self.model
        hidden, base = self.draft_block(ctx)  # [B, H], [B, Vd]
        anchor = ctx.token_ids.reshape(-1)[-1].to(hidden.device)
        first = 0 if m.config.sample_from_anchor else 1  # DFlash-style slot 0 predicts the anchor: skipped
        prev, state = anchor, None
        tokens, qs, logits_out, confs = [], [], [], []
        for k in range(hidden.shape[0]):
            bias, conf, state = m.heads(hidden[k], prev, state)
            if k < first:  # runs only to advance an rnn state the way training does
                continue
            logits = base[k] + bias if bias is not None else base[k]
            target = to_target_vocab(logits[None], m.d2t, m.config.layer.vocab_size)
            token, q = pick_tokens(target, ctx.sampling, ctx.generator)
            if forced_tokens is not None:
                token = torch.tensor([forced_tokens[len(tokens)]], device=hidden.device)
            tokens.append(token[0])
            qs.append(q[0])
            logits_out.append(logits)
            confs.append(conf if conf is not None else torch.tensor(float("nan"), device=hidden.device))
            prev = token[0]
        return torch.stack(tokens), torch.stack(qs), torch.stack(logits_out), torch.stack(confs)

    def propose(self, ctx: DraftContext) -> Proposal:
        tokens, q, _, conf_logits = self.draft_chain(ctx)
        if self.model.confidence_head is None:
            return Proposal(token_ids=tokens.tolist(), probs=q)
        conf = torch.sigmoid(conf_logits).tolist()
        n = self.confidence_policy.keep(conf)
        return Proposal(
            token_ids=tokens[:n].tolist(), probs=q[:n], confidences=conf[:n],
            truncated_confidences=conf[n:] or None,
        )  # fmt: skip
