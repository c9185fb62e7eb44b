"""Drafters: the Drafter protocol and registry (base), the four learned drafters, checkpoints.

Importing this package registers every algorithm under its speculators_model_type.
To add one: a module with a config (``checkpoint.DraftConfig`` subclass), a
model (``checkpoint.DraftModel`` subclass with ``create``) and a Drafter class
decorated ``@register("<type>")`` whose ``model_class`` is that model; import
it below.
"""

from __future__ import annotations

from typing import Any

from specui.drafters import dflash, dspark, eagle3, peagle  # noqa: F401 - registers the algorithms
from specui.drafters.base import DraftContext, Drafter, lookup, register, registered_types
from specui.drafters.checkpoint import load_drafter, load_model, save_drafter, validate_checkpoint
from specui.drafters.dspark import ConfidencePolicy


def create_drafter(algorithm: str, verifier: Any, **kw: Any) -> Drafter:
    """A freshly initialised drafter of ``algorithm`` for ``verifier`` (its ``.model`` trains).

    ``kw`` are the sizes/options of that model's ``create`` (e.g. num_layers,
    block_size, num_speculative_tokens, aux_layer_ids, mask_token_id, markov_rank, seed).
    """
    return lookup(algorithm).create(verifier, **kw)


__all__ = [
    "ConfidencePolicy",
    "DraftContext",
    "Drafter",
    "create_drafter",
    "load_drafter",
    "load_model",
    "lookup",
    "register",
    "registered_types",
    "save_drafter",
    "validate_checkpoint",
]
