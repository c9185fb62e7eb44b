"""Comparing two hidden-state files (safetensors) written by different extractors."""

from __future__ import annotations

from pathlib import Path

import torch


def load_matching(a: Path, b: Path) -> tuple[dict, dict]:
    """The tensors of files ``a`` and ``b``, once seen to hold the same names, shapes and
    dtypes, the same metadata, and the same tokens and loss mask."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    ta, tb = load_file(a), load_file(b)
    assert {k: (t.shape, t.dtype) for k, t in ta.items()} == {
        k: (t.shape, t.dtype) for k, t in tb.items()
    }
    with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
        assert fa.metadata() == fb.metadata()
    assert torch.equal(ta["token_ids"], tb["token_ids"]) and torch.equal(
        ta["loss_mask"], tb["loss_mask"]
    )
    return ta, tb
