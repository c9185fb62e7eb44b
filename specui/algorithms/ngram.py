"""The n-gram (prompt lookup) settings: one definition for the local drafter and for vLLM.

The local ``NgramDrafter`` (``simple.py``) and the vLLM server's ``--speculative-config``
(``specui.vllm.server``) both read an ``NgramConfig``, so a comparison of the two backends
compares one lookup.  SpecUI's names are ``max_ngram`` / ``min_ngram``; vLLM's
``prompt_lookup_max`` / ``prompt_lookup_min`` are accepted as aliases wherever options come
in (CLI, API, stored settings).

Torch-free: the vLLM launcher imports it without loading a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specui.errors import SpecUIError

# SpecUI's name -> vLLM's.  vLLM's speculative config spells them this way, so the same
# dict can be read back from a stored vLLM run.
VLLM_NAMES = {"max_ngram": "prompt_lookup_max", "min_ngram": "prompt_lookup_min"}
OPTION_NAMES = (*VLLM_NAMES, *VLLM_NAMES.values())
MAX_NGRAM_LIMIT = 64  # a longer suffix practically never recurs; the bound keeps the scan cheap


@dataclass(frozen=True)
class NgramConfig:
    """Match the last n committed tokens, n = ``max_ngram`` down to ``min_ngram``.

    The default (4..2) was picked by speedup on Spec-Bench (docs/results.md, "n-gram
    settings"): a one-token match drafts often but is rarely right, and its rejected drafts
    cost verify time."""

    max_ngram: int = 4
    min_ngram: int = 2

    def __post_init__(self) -> None:
        for name in VLLM_NAMES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecUIError(f"{name} must be an integer, got {value!r}")
        if not 1 <= self.min_ngram <= self.max_ngram <= MAX_NGRAM_LIMIT:
            raise SpecUIError(
                f"n-gram sizes need 1 <= min_ngram <= max_ngram <= {MAX_NGRAM_LIMIT}, "
                f"got min_ngram={self.min_ngram}, max_ngram={self.max_ngram}"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> NgramConfig:
        """The config named by ``options`` (SpecUI's or vLLM's names; None values and other
        keys ignored, the rest at their defaults).  Both spellings of one setting, with
        different values, is an error rather than a silent pick."""
        opts = {k: v for k, v in (options or {}).items() if v is not None}
        values: dict[str, Any] = {}
        for name, alias in VLLM_NAMES.items():
            if name in opts and alias in opts and opts[name] != opts[alias]:
                raise SpecUIError(
                    f"{name}={opts[name]!r} and its alias {alias}={opts[alias]!r} disagree"
                )
            if name in opts or alias in opts:
                values[name] = opts.get(name, opts.get(alias))
        return cls(**values)

    def settings(self) -> dict[str, int]:
        """What a stored run records (SpecUI's names)."""
        return {"max_ngram": self.max_ngram, "min_ngram": self.min_ngram}

    def vllm_settings(self) -> dict[str, int]:
        """The same two numbers under vLLM's names, for ``--speculative-config``."""
        return {VLLM_NAMES[k]: v for k, v in self.settings().items()}


DEFAULT_NGRAM = NgramConfig()
