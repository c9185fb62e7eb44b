"""What every algorithm's training objective shares: the base class, the verifier's
targets, the per-slot losses, metrics and batch packing.

An objective (``specui/algorithms/<algo>/objective.py``, named by the
algorithm's ``AlgorithmSpec``) knows how to build a fresh drafter and how to
turn a batch of samples into a loss by calling the model's own
training-layout forward (``<algo>/model.py``): the model math lives there,
only sampling (anchors, sparsified depths) and the loss live in the objective.

Targets are self-distillation targets: the verifier's own next-token
distribution at each position, extracted once with the hidden states
(``specui.data.hidden``) as its top-k log-probabilities, so a training step runs
no part of the verifier.  The argmax (``Targets.top``) is what greedy
verification accepts; the top-k distribution, renormalised, is what the soft KL,
the total variation and DSpark's acceptance target read.  With a reduced draft
vocabulary the ids are mapped into it and tokens outside it dropped.

This module sits below the training package (its loop imports this one, never the
other way), so an algorithm package depends on nothing above the models layer.
``cfg`` is the trainer's ``TrainConfig``; only its fields (and options) are read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specui.algorithms.spec import ALGORITHMS
from specui.data.hidden import TOPK, SampleTensors
from specui.errors import SpecUIError

Metrics = dict[str, torch.Tensor]  # scalar tensors, averaged over samples and processes


def objective_for(cfg: Any, verifier: Any) -> Objective:
    """The training objective of ``cfg.algorithm`` (its AlgorithmSpec's), ready to build and
    train."""
    spec = ALGORITHMS.get(cfg.algorithm)
    if spec is None or spec.objective is None:
        raise SpecUIError(f"no training objective for algorithm {cfg.algorithm!r}")
    return spec.objective_class(cfg, verifier)


class Objective:
    """One algorithm's training recipe (subclasses fill in the three methods)."""

    num_positions: int  # drafted tokens per block/rollout: the per-position metrics' length
    # True: attend across the whole packed batch in one masked pass, the path before
    # per-document attention (kept for the equivalence test and the throughput bench).
    packed_attention = False

    def __init__(self, cfg: Any, verifier: Any) -> None:
        self.cfg = cfg
        self.verifier = verifier
        self._draft_vocab: torch.Tensor | None = (
            None  # kept target ids of a reduced draft vocabulary
        )
        self._to_draft: torch.Tensor | None = None  # [V] target id -> draft id (-1: not kept)

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        return self._draft_vocab

    @draft_vocab.setter
    def draft_vocab(self, kept: torch.Tensor | None) -> None:
        self._draft_vocab = kept
        self._to_draft = None if kept is None else draft_index(kept, self.verifier.vocab_size)

    def targets(self, ids: torch.Tensor, logprobs: torch.Tensor) -> Targets:
        """The stored top-k of some positions, in this run's draft vocabulary."""
        return Targets(ids, logprobs).to_draft(self._to_draft)

    def build(self) -> nn.Module:
        """A freshly initialised drafter model for ``self.verifier``."""
        raise NotImplementedError

    def usable(self, sample) -> bool:
        """False for a TokenSample with nothing to train on (it is dropped)."""
        return len(sample.response_ids) >= 2

    def loss(
        self,
        model: nn.Module,
        batch: list[SampleTensors],
        gen: torch.Generator,
        metrics: bool = True,
    ) -> tuple[torch.Tensor, Metrics]:
        """Loss of one batch, and its metrics when ``metrics`` (logging steps only: they cost
        an argmax and a softmax over every drafted slot); ``gen`` draws anchors / rows."""
        raise NotImplementedError


# --- targets -----------------------------------------------------------------------------


def draft_index(kept: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] long: the draft-vocabulary slot of each target id, -1 where it is not kept."""
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=kept.device)
    index[kept.long()] = torch.arange(kept.numel(), device=kept.device)
    return index


@dataclass
class Targets:
    """The verifier's next-token distribution at some positions, as its top-k.

    ``ids`` [..., k] long, best first (-1: a token the draft vocabulary lacks, always
    after the kept ones); ``logprobs`` [..., k] float32 verifier log-probabilities
    (-inf where ``ids`` is -1).
    """

    ids: torch.Tensor
    logprobs: torch.Tensor

    def __getitem__(self, index) -> Targets:
        return Targets(self.ids[index], self.logprobs[index])

    @property
    def top(self) -> torch.Tensor:
        """[...] the verifier's most likely (draft-vocabulary) token, -1 where none is kept."""
        return self.ids[..., 0]

    @property
    def valid(self) -> torch.Tensor:
        """[...] bool: the position has a target the drafter can produce."""
        return self.ids[..., 0] >= 0

    def probs(self, temperature: float = 1.0) -> torch.Tensor:
        """[..., k] the top-k distribution at ``temperature``, renormalised (0 where dropped)."""
        lp = self.logprobs.float()
        if temperature != 1.0:
            lp = lp / temperature
        p = torch.softmax(lp.masked_fill(self.ids < 0, float("-inf")), -1)
        return torch.nan_to_num(p, nan=0.0)  # a row with nothing kept

    def to_draft(self, index: torch.Tensor | None) -> Targets:
        """Target ids mapped through ``draft_index`` (None: full vocabulary, unchanged);
        dropped tokens move behind the kept ones so ``top`` stays the best kept one."""
        if index is None:
            return self
        ids = index.to(self.ids.device)[self.ids.clamp_min(0)]
        ids = torch.where(self.ids < 0, -1, ids)
        lp = self.logprobs.float().masked_fill(ids < 0, float("-inf"))
        order = torch.sort(lp, dim=-1, descending=True, stable=True).indices
        return Targets(ids.gather(-1, order), lp.gather(-1, order))

    @classmethod
    def from_logits(cls, logits: torch.Tensor, k: int = TOPK) -> Targets:
        """The top-k of dense verifier logits [..., V] (tests, and files without targets)."""
        lp = torch.log_softmax(logits.float(), -1)
        values, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)
        return cls(ids, values)


# --- per-slot losses (logits [..., V], targets [...] -> [...]) -----------------------------


def _gather(values: torch.Tensor, t: Targets) -> torch.Tensor:
    return values.gather(-1, t.ids.clamp_min(0))


def hard_ce(logits: torch.Tensor, t: Targets) -> torch.Tensor:
    """Cross-entropy against the verifier's argmax (what greedy verification accepts)."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    ce = F.cross_entropy(flat, t.top.reshape(-1).clamp_min(0), reduction="none")
    return ce.view(t.top.shape) * t.valid


def soft_kl(logits: torch.Tensor, t: Targets) -> torch.Tensor:
    """KL(p_target || q_draft) per row over the target's top-k: matches the distribution."""
    logq = _gather(F.log_softmax(logits.float(), -1), t)
    p = t.probs()
    logp = torch.log(p.clamp_min(1e-30))
    return (p * (logp - logq)).sum(-1)


def tv_distance(logits: torch.Tensor, t: Targets, temperature: float = 1.0) -> torch.Tensor:
    """Total variation at ``temperature``; ``1 - TV`` is speculative sampling's acceptance
    probability.  The target has mass only on its top-k, so the overlap is a sum over them."""
    q = _gather(torch.softmax(logits.float() / temperature, -1), t)
    return 1.0 - torch.minimum(t.probs(temperature), q).sum(-1)


LOSSES: dict[str, Callable[[torch.Tensor, Targets], torch.Tensor]] = {"ce": hard_ce, "kl": soft_kl}


def slot_loss_fn(cfg: Any, default: str) -> Callable[[torch.Tensor, Targets], torch.Tensor]:
    name = cfg.loss or default
    if name not in LOSSES:
        raise SpecUIError(f"unknown loss {name!r}; use one of {', '.join(LOSSES)}")
    return LOSSES[name]


# --- weighting ----------------------------------------------------------------------------


def weighted_mean(values: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(v * w * mask) / sum(mask): weights shape the loss without rescaling it."""
    m = mask.float()
    return (values * weights * m).sum() / m.sum().clamp_min(1.0)


# --- metrics ------------------------------------------------------------------------------


@torch.no_grad()
def slot_stats(logits: torch.Tensor, t: Targets) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: (greedy hit: draft argmax == verifier argmax, acceptance prob 1 - TV)."""
    return (logits.argmax(-1) == t.top) & t.valid, 1.0 - tv_distance(logits, t)


@torch.no_grad()
def block_metrics(
    correct: torch.Tensor, accept: torch.Tensor, mask: torch.Tensor, num_positions: int
) -> Metrics:
    """Per-position accuracy and acceptance length of blocks/rollouts of drafted slots.

    ``correct``/``accept``/``mask`` [A, S] (see ``slot_stats``): slot k is
    position k+1 of a proposal.  Reported:

    * ``acc_k``: greedy accuracy at position k (draft argmax == verifier argmax),
      over the slots that have a target;
    * ``accept_len``: greedy acceptance length tau = 1 + leading correct slots,
      averaged over complete blocks (the 1 is the verifier's bonus token);
    * ``accept_len_expected``: 1 + sum_k prod_{j<=k} (1 - TV_j): the expected
      tau under speculative sampling at temperature 1 (DSpark's definition).
    """
    m = mask.bool()
    correct = correct & m
    out: Metrics = {}
    S = correct.shape[1]
    for k in range(num_positions):
        n = int(m[:, k].sum()) if k < S else 0
        out[f"acc_{k + 1}"] = correct[:, k].sum().float() / n if n else torch.tensor(math.nan)
    complete = m.all(-1)
    if complete.any():
        out["accept_len"] = 1.0 + torch.cumprod(correct[complete].float(), -1).sum(-1).mean()
        out["accept_len_expected"] = (
            1.0 + torch.cumprod(accept[complete].float(), -1).sum(-1).mean()
        )
    else:
        out["accept_len"] = out["accept_len_expected"] = torch.tensor(math.nan)
    return out


def most_frequent_tokens(samples, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` most frequent response tokens (ties and the rest by id), sorted.

    Response tokens are what the drafter must predict; padding the list with the
    lowest unused ids keeps its size exact when the data has fewer distinct tokens.
    """
    if not 0 < size <= vocab_size:
        raise SpecUIError(f"draft vocab size must be in 1..{vocab_size}, got {size}")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        ids = torch.tensor(s.response_ids, dtype=torch.long)
        counts += torch.bincount(ids, minlength=vocab_size)
    # Stable sort by descending count keeps the lowest ids first among equals.
    order = torch.sort(-counts, stable=True).indices
    return torch.sort(order[:size]).values


# --- batches ------------------------------------------------------------------------------


@dataclass
class Packed:
    """A batch packed into one sequence (speculators' layout): documents side by side,
    positions restarting at 0 in each, ``document_ids`` keeping attention inside one."""

    input_ids: torch.Tensor  # [T]
    hidden_states: torch.Tensor  # [T, n_aux*H]
    target_ids: torch.Tensor  # [T, k] the verifier's top-k after each position (full vocabulary)
    target_logprobs: torch.Tensor  # [T, k]
    loss_mask: torch.Tensor  # [T]
    position_ids: torch.Tensor  # [T]
    document_ids: torch.Tensor  # [T]
    starts: list[int]  # first index of each document
    lengths: list[int]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def documents(self) -> list[slice]:
        return [slice(s, s + n) for s, n in zip(self.starts, self.lengths, strict=True)]


def pack(batch: list[SampleTensors]) -> Packed:
    dev = batch[0].input_ids.device
    lengths = [len(s) for s in batch]
    starts = [sum(lengths[:i]) for i in range(len(batch))]
    return Packed(
        input_ids=torch.cat([s.input_ids for s in batch]),
        hidden_states=torch.cat([s.hidden_states for s in batch]),
        target_ids=torch.cat([s.target_ids for s in batch]),
        target_logprobs=torch.cat([s.target_logprobs for s in batch]),
        loss_mask=torch.cat([s.loss_mask for s in batch]),
        position_ids=torch.cat([torch.arange(n, device=dev) for n in lengths]),
        document_ids=torch.cat(
            [torch.full((n,), i, device=dev, dtype=torch.long) for i, n in enumerate(lengths)]
        ),
        starts=starts,
        lengths=lengths,
    )


def cat_outputs(outputs: list[Any], dim: int = 0) -> Any:
    """One model output from per-document ones (dataclasses of tensors, lists of tensors
    or None), concatenated along ``dim``: what the packed forward would have returned."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs, dim)
    if first is None:
        return None
    if isinstance(first, list):
        return [cat_outputs([o[i] for o in outputs], dim) for i in range(len(first))]
    fields = {
        f: cat_outputs([getattr(o, f) for o in outputs], dim) for f in first.__dataclass_fields__
    }
    return type(first)(**fields)
