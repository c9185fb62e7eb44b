"""A drafter's reduced draft vocabulary across checkpoints: which tokens a run keeps when it
warm-starts from another, and how the draft head's rows follow their tokens.

The vocabulary's maps themselves (``d2t``: draft slot -> target id offset, ``t2d``) are made by
``specui.algorithms.layers`` (``register_vocab_map``, ``set_draft_vocab``); this module is what
training asks of them, so no trainer re-derives the row layout.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from specui.algorithms.checkpoint import WEIGHTS_FILE
from specui.algorithms.layers import draft_target_ids
from specui.errors import SpecUIError

VOCAB_MAPS = ("d2t", "t2d")  # a run's own draft vocabulary, set by build(); never copied


def checkpoint_draft_vocab(path: Path, size: int) -> torch.Tensor | None:
    """The target ids of checkpoint ``path``'s draft vocabulary, if it has one of ``size``.

    A warm start copies its ``d2t`` and draft head rows; a vocabulary recounted from other
    training data would put other tokens behind those rows.
    """
    file = path / WEIGHTS_FILE
    try:
        with safe_open(str(file), "pt") as f:
            if "d2t" not in set(f.keys()):
                return None
            d2t = f.get_tensor("d2t").long()
    except (OSError, SafetensorError) as e:
        raise SpecUIError(f"cannot read the warm-start checkpoint {file}: {e}") from None
    return draft_target_ids(d2t) if d2t.numel() == size else None


def check_draft_vocab(model: nn.Module, kept: torch.Tensor | None, source: str | None) -> None:
    """Refuse a drafter whose draft vocabulary (warm-started from ``source``) is not ``kept``:
    the loss would score the head's rows against other tokens than they draft."""
    d2t = getattr(model, "d2t", None)
    if kept is not None and d2t is not None and not torch.equal(draft_target_ids(d2t).cpu(), kept):
        raise SpecUIError(f"the draft vocabulary of {source} does not match this run's")


def remap_draft_vocab_rows(
    src: dict[str, torch.Tensor], own: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Draft-vocabulary rows of state dict ``src`` moved to where the same tokens sit in ``own``.

    A warm start onto another draft vocabulary (general data after math) would
    otherwise re-initialise the whole draft head; the tokens both vocabularies
    hold keep what they learned, the others keep their fresh init.  The maps
    themselves (``d2t``, ``t2d``) stay the run's own.
    """
    if "d2t" not in src or "d2t" not in own:
        return {}
    if torch.equal(src["d2t"], own["d2t"]):
        return {k: v for k, v in src.items() if k in VOCAB_MAPS and k in own}
    old_ids, new_ids = draft_target_ids(src["d2t"].long()), draft_target_ids(own["d2t"].long())
    old_slot = {int(t): i for i, t in enumerate(old_ids.tolist())}
    pairs = [(j, old_slot[int(t)]) for j, t in enumerate(new_ids.tolist()) if int(t) in old_slot]
    if not pairs:
        return {}
    new_rows, old_rows = (torch.tensor(c) for c in zip(*pairs, strict=True))
    out = {}
    for k, v in src.items():
        mine = own.get(k)
        if k in VOCAB_MAPS or mine is None or v.dim() == 0 or mine.shape == v.shape:
            continue
        if (
            v.shape[0] == old_ids.numel()
            and mine.shape[0] == new_ids.numel()
            and v.shape[1:] == mine.shape[1:]
        ):
            w = mine.clone()
            w[new_rows] = v[old_rows].to(w.dtype)
            out[k] = w
    return out
