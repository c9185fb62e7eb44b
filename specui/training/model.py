"""The model stage: the run's objective and drafter, its draft vocabulary, a warm start.

The draft vocabulary's rules (which tokens a warm start keeps, how head rows follow their
tokens) are the algorithms' (``specui.algorithms.draft_vocab``); this stage picks and logs.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specui.algorithms.checkpoint import load_model
from specui.algorithms.draft_vocab import (
    VOCAB_MAPS,
    check_draft_vocab,
    checkpoint_draft_vocab,
    remap_draft_vocab_rows,
)
from specui.algorithms.objective import Objective, most_frequent_tokens, objective_for
from specui.data.distill import TokenSample
from specui.errors import SpecUIError
from specui.training.config import TrainConfig
from specui.training.hooks import TrainHooks


def draft_vocab(
    cfg: TrainConfig, verifier, samples: list[TokenSample], hooks: TrainHooks
) -> torch.Tensor | None:
    """The target ids the drafter keeps (None: the verifier's whole vocabulary): a warm start's
    own where it has one of this size, else the samples' most frequent response tokens."""
    if cfg.draft_vocab_size is None or cfg.draft_vocab_size >= verifier.vocab_size:
        return None
    if cfg.init_from:
        kept = checkpoint_draft_vocab(Path(cfg.init_from), cfg.draft_vocab_size)
        if kept is not None:
            hooks.say(
                f"draft vocabulary of {cfg.draft_vocab_size} tokens kept from {cfg.init_from}"
            )
            return kept
    return most_frequent_tokens(samples, verifier.vocab_size, cfg.draft_vocab_size)


def build(
    cfg: TrainConfig, verifier, samples: list[TokenSample], device, hooks: TrainHooks
) -> tuple[Objective, nn.Module, list[TokenSample]]:
    """The objective, the drafter (warm-started where asked, in training mode on ``device``)
    and the samples it can train on."""
    kept = draft_vocab(cfg, verifier, samples, hooks)
    objective = objective_for(cfg, verifier)
    objective.draft_vocab = kept
    usable = [s for s in samples if objective.usable(s)]
    if not usable:
        raise SpecUIError(
            f"none of the {len(samples)} samples has a response long enough to train"
            f" {cfg.algorithm} on; raise --max-new-tokens (or --max-seq-len), or lower --block-size"
        )
    if len(usable) < len(samples):
        hooks.say(f"{len(samples) - len(usable)} samples with too short a response skipped")
    model = objective.build().to(device)
    if cfg.init_from:
        warm_start(model, Path(cfg.init_from), verifier, hooks)
    if cfg.num_speculative_tokens is not None:
        # What the written speculator (checkpoints, snapshots, the final one) proposes; training
        # reads its own positions (TTT steps, depths, the block), never this.
        model.config.num_speculative_tokens = cfg.num_speculative_tokens
    check_draft_vocab(model, kept, cfg.init_from)
    model.train()
    return objective, model, usable


def warm_start(model: nn.Module, path: Path, verifier, hooks: TrainHooks) -> None:
    """Copy every tensor of checkpoint ``path`` whose name and shape fit (DSpark from DFlash)."""
    src = load_model(path, verifier).state_dict()
    own = model.state_dict()
    taken = {
        k: v for k, v in src.items() if k in own and own[k].shape == v.shape and k not in VOCAB_MAPS
    }
    taken.update(remap_draft_vocab_rows(src, own))
    if not taken:
        raise SpecUIError(f"nothing in {path} fits this drafter (different verifier or shape)")
    model.load_state_dict(taken, strict=False)
    fresh = sorted(set(own) - set(taken) - set(VOCAB_MAPS))
    hooks.say(
        f"warm start from {path}: {len(taken)} tensors copied"
        + (f", new: {', '.join(fresh)}" if fresh else "")
    )
