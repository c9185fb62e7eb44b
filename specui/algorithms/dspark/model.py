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
from typing import Any, ClassVar

import torch
from torch import nn

from specui.algorithms.dflash.model import BlockOutput, DFlashModel
from specui.algorithms.draft_config import DraftConfig
from specui.algorithms.dspark.config import DSparkConfig


class MarkovHead(nn.Module):
    """Low-rank previous-token logit bias; W1 indexes the verifier vocabulary, W2 maps to the
    draft's.

    ``vanilla``: ``W2 W1[prev]``.  ``gated``: ``W2 (sigmoid(gate([h; e])) * e)``.
    ``rnn``: a gated recurrent state over the block's slots feeds W2.
    """

    def __init__(
        self, vocab_size: int, draft_vocab_size: int, rank: int, hidden_size: int, head_type: str
    ) -> None:
        super().__init__()
        self.head_type, self.rank = head_type, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(
                2 * rank + hidden_size, 3 * rank
            )  # [gate; candidate; output]

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
            MarkovHead(
                config.layer.vocab_size, config.draft_vocab_size, r, H, config.markov_head_type
            )
            if r > 0
            else None
        )
        self.confidence_head = (
            ConfidenceHead(H + (r if config.confidence_head_with_markov else 0))
            if config.enable_confidence_head
            else None
        )

    @classmethod
    def create(cls, verifier: Any, **sizes: Any) -> DSparkModel:
        """DFlashModel.create; options add markov_rank (0 = none), markov_head_type, the
        confidence head."""
        if (
            sizes.get("markov_rank", 256) == 0
        ):  # no Markov head: the confidence head reads h_k alone
            sizes.setdefault("confidence_head_with_markov", False)
        return super().create(verifier, **sizes)  # type: ignore[return-value]

    def init_extra(self) -> None:
        if self.markov_head is not None:
            nn.init.normal_(
                self.markov_head.markov_w1.weight, std=1.0
            )  # an embedding table (nn.Embedding's scale)
            nn.init.zeros_(
                self.markov_head.markov_w2.weight
            )  # bias 0: training starts from plain DFlash

    def heads(
        self,
        hidden: torch.Tensor,
        prev_ids: torch.Tensor,
        state: torch.Tensor | None = None,
        confidence: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(Markov bias [.., Vd] or None, confidence logit [..] or None, rnn state) for hidden
        [.., H] (``confidence`` False: no confidence logit, for ``confidence`` on many slots)."""
        bias = e = None
        if self.markov_head is not None:
            e = self.markov_head.markov_w1(prev_ids)
            bias, state = self.markov_head.step(e, hidden, state)
        return bias, self.confidence(hidden, prev_ids, e) if confidence else None, state

    def confidence(
        self, hidden: torch.Tensor, prev_ids: torch.Tensor, e: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Confidence logits [..] of slots with hidden [.., H] after ``prev_ids`` [..] (``e``:
        their W1 rows, when looked up already), or None without a confidence head."""
        if self.confidence_head is None:
            return None
        if not self.config.confidence_head_with_markov:
            return self.confidence_head(hidden)
        assert self.markov_head is not None
        e = self.markov_head.markov_w1(prev_ids) if e is None else e
        return self.confidence_head(torch.cat([hidden, e], -1))

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
            prev_token_ids = ids[
                (anchors.reshape(-1, 1).to(ids.device) + k).clamp(max=ids.numel() - 1)
            ]
        logits, conf, e = out.logits, None, None
        if self.markov_head is not None:
            e = self.markov_head.markov_w1(prev_token_ids)  # [A, B, r]
            logits = logits + self.markov_head.block_bias(e, out.hidden)
        if self.confidence_head is not None:
            x = (
                torch.cat([out.hidden, e], -1)
                if self.config.confidence_head_with_markov
                else out.hidden
            )
            conf = self.confidence_head(x)  # [A, B]
        heads = {"markov_logits": logits, "confidence_logits": conf}
        return SparkBlockOutput(
            out.hidden, out.logits, out.layer_outputs, **heads, prev_token_ids=prev_token_ids
        )
