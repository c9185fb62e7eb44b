"""What every algorithm's training objective shares: the base class, the target
head, the per-slot losses, metrics and batch packing.

An objective (``specui/algorithms/<algo>/objective.py``, named by the
algorithm's ``AlgorithmSpec``) knows how to build a fresh drafter and how to
turn a batch of samples into a loss by calling the model's own
training-layout forward (``<algo>/model.py``): the model math lives there,
only sampling (anchors, sparsified depths) and the loss live in the objective.

Targets are self-distillation targets: the verifier's own next-token logits,
``lm_head(final_norm(tap[N]))``, recomputed from the stored pre-norm last layer
(so the sample files stay small) -- restricted to the draft vocabulary when it
is reduced.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specui.algorithms.spec import ALGORITHMS
from specui.data.hidden import SampleTensors
from specui.trace import SpecUIError
from specui.training.config import TrainConfig

Metrics = dict[str, torch.Tensor]  # scalar tensors, averaged over samples and processes

def objective_for(cfg: TrainConfig, verifier, target_head: TargetHead) -> Objective:
    """The training objective of ``cfg.algorithm`` (its AlgorithmSpec's), ready to build and train."""
    spec = ALGORITHMS.get(cfg.algorithm)
    if spec is None or spec.objective is None:
        raise SpecUIError(f"no training objective for algorithm {cfg.algorithm!r}")
    return spec.objective_class(cfg, verifier, target_head)


class Objective:
    """One algorithm's training recipe (subclasses fill in the three methods)."""

    num_positions: int  # drafted tokens per block/rollout: the per-position metrics' length

    def __init__(self, cfg: TrainConfig, verifier, target_head: TargetHead) -> None:
        self.cfg = cfg
        self.verifier = verifier
        self.targets = target_head
        self.draft_vocab: torch.Tensor | None = None  # kept target ids of a reduced draft vocabulary

    def build(self) -> nn.Module:
        """A freshly initialised drafter model for ``self.verifier``."""
        raise NotImplementedError

    def usable(self, sample) -> bool:
        """False for a TokenSample with nothing to train on (it is dropped)."""
        return len(sample.response_ids) >= 2

    def loss(self, model: nn.Module, batch: list[SampleTensors], gen: torch.Generator) -> tuple[torch.Tensor, Metrics]:
        """Loss and metrics of one batch; ``gen`` draws anchors / sparsified rows."""
        raise NotImplementedError


# --- targets -----------------------------------------------------------------------------


class TargetHead:
    """The verifier's final norm + LM head, frozen: pre-norm hidden -> target logits.

    With a reduced draft vocabulary only the kept rows of the LM head are used,
    which is most of the saving (the full head is ~70% of a step on CPU).
    """

    def __init__(self, verifier, kept_ids: torch.Tensor | None, device: torch.device) -> None:
        self.norm = verifier.final_norm

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            t = t.detach()
            return (t[kept_ids.to(t.device)] if kept_ids is not None else t).to(device, torch.float32)

        self.weight = rows(verifier.lm_head.weight)
        self.bias = rows(getattr(verifier.lm_head, "bias", None))

    @torch.no_grad()
    def __call__(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] pre-norm last-layer states -> [..., Vd] float32 logits."""
        h = self.norm(last_hidden.to(self.weight.dtype)).float()
        return F.linear(h, self.weight, self.bias)


# --- per-slot losses (logits, targets [M, V] -> [M]) ---------------------------------------


def hard_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the verifier's argmax (what greedy verification accepts)."""
    return F.cross_entropy(logits.float(), targets.argmax(-1), reduction="none")


def soft_kl(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """KL(p_target || q_draft) per row: matches the whole distribution (sampling)."""
    logq = F.log_softmax(logits.float(), -1)
    logp = F.log_softmax(targets.float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def tv_distance(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Total variation; ``1 - TV`` is the acceptance probability of speculative sampling."""
    q = torch.softmax(logits.float(), -1)
    p = torch.softmax(targets.float(), -1)
    return 1.0 - torch.minimum(p, q).sum(-1)


LOSSES = {"ce": hard_ce, "kl": soft_kl}


def slot_loss_fn(cfg: TrainConfig, default: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    name = cfg.extra.get("loss", default)
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
def slot_stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of [..., V]: (greedy hit: draft argmax == verifier argmax, acceptance prob 1 - TV)."""
    return logits.argmax(-1) == targets.argmax(-1), 1.0 - tv_distance(logits, targets)


@torch.no_grad()
def block_metrics(correct: torch.Tensor, accept: torch.Tensor, mask: torch.Tensor, num_positions: int) -> Metrics:
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
        out["accept_len_expected"] = 1.0 + torch.cumprod(accept[complete].float(), -1).sum(-1).mean()
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
    last_hidden: torch.Tensor  # [T, H]
    loss_mask: torch.Tensor  # [T]
    position_ids: torch.Tensor  # [T]
    document_ids: torch.Tensor  # [T]
    starts: list[int]  # first index of each document
    lengths: list[int]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def pack(batch: list[SampleTensors]) -> Packed:
    dev = batch[0].input_ids.device
    lengths = [len(s) for s in batch]
    starts = [sum(lengths[:i]) for i in range(len(batch))]
    return Packed(
        input_ids=torch.cat([s.input_ids for s in batch]),
        hidden_states=torch.cat([s.hidden_states for s in batch]),
        last_hidden=torch.cat([s.last_hidden for s in batch]),
        loss_mask=torch.cat([s.loss_mask for s in batch]),
        position_ids=torch.cat([torch.arange(n, device=dev) for n in lengths]),
        document_ids=torch.cat([torch.full((n,), i, device=dev, dtype=torch.long) for i, n in enumerate(lengths)]),
        starts=starts,
        lengths=lengths,
    )


