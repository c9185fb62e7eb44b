"""The one small interface every drafter implements, and the registry.

The decoding loop (``specui.engine``) owns the verifier and the committed
sequence.  Before each step it hands the drafter a ``DraftContext``:

* ``token_ids`` -- every committed token, prompt included.  The last one is the
  token the verifier emitted last (the bonus/corrected token) and has no
  verifier hidden state yet: it is the anchor of the next block.
* ``features`` -- the verifier's aux-layer hidden states for every committed
  position except the last, ``[L-1, n_aux * H]`` (``cat`` of the taps in the
  order of ``aux_layer_ids``), or ``None`` when the drafter asks for none.

Both only ever grow by appending between steps of one generation (rejected
tokens never reach them), so a drafter may keep incremental caches keyed by
their length.  ``reset()`` is called before each new generation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specui.trace import Proposal, SamplingParams


@dataclass
class DraftContext:
    token_ids: torch.Tensor  # [L] int64, committed tokens
    features: torch.Tensor | None  # [L-1, n_aux*H] verifier aux taps, or None
    sampling: SamplingParams
    generator: torch.Generator | None  # drafter-side randomness (sampling q)


@runtime_checkable
class Drafter(Protocol):
    """What the decoding loop needs from a drafter."""

    name: str  # shown in the UI and stored with runs
    algorithm: str  # "none", "ngram", "dflash", "dspark", "peagle", "eagle3", ...
    # Verifier hidden-state layer ids this drafter conditions on (transformers
    # convention: 0 = embeddings, L = after L decoder layers), or None.
    aux_layer_ids: list[int] | None
    num_speculative_tokens: int  # K: the most tokens one proposal may hold

    def reset(self) -> None: ...

    def propose(self, ctx: DraftContext) -> Proposal: ...


# --- registry --------------------------------------------------------------------

DrafterLoader = Callable[..., Drafter]
_REGISTRY: dict[str, type] = {}


def register(model_type: str) -> Callable[[type], type]:
    """Class decorator: register a drafter class under its speculators_model_type."""

    def wrap(cls: type) -> type:
        if model_type in _REGISTRY:
            raise ValueError(f"drafter type {model_type!r} registered twice")
        _REGISTRY[model_type] = cls
        return cls

    return wrap


def registered_types() -> list[str]:
    return sorted(_REGISTRY)


def lookup(model_type: str) -> type:
    from specui.trace import SpecUIError

    try:
        return _REGISTRY[model_type]
    except KeyError:
        raise SpecUIError(
            f"unknown speculators_model_type {model_type!r}; known: {', '.join(registered_types())}"
        ) from None
