"""Turning what a user typed (``none``, ``ngram``, ``suffix``, a shipped name, a folder,
``LEARNED+LOOKUP``) into a drafter."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from specui.algorithms.base import Drafter
from specui.algorithms.checkpoint import load_drafter
from specui.algorithms.ngram import OPTION_NAMES, NgramConfig
from specui.algorithms.serving import drop_load_copies, load_weights
from specui.algorithms.simple import BUILTIN, LOOKUPS, NgramDrafter, PlainDrafter
from specui.algorithms.spec import ALGORITHMS
from specui.algorithms.suffix import OPTION_NAMES as SUFFIX_OPTIONS
from specui.algorithms.suffix import SuffixConfig, SuffixDrafter
from specui.errors import SpecUIError
from specui.paths import is_hub_id, shipped_drafters_dir
from specui.verifier import admission, hub
from specui.verifier.model import Verifier

__all__ = ["BUILTIN", "resolve_drafter", "shipped_drafters"]


def shipped_drafters() -> dict[str, Path]:
    """Speculators-format folders shipped in ``data/drafters`` by name."""
    root = shipped_drafters_dir()
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if (p / "config.json").is_file()}


def resolve_drafter(
    choice: str, verifier: Verifier, num_speculative_tokens: int | None = None, **options
) -> Drafter:
    """The drafter a choice names: ``none`` | ``ngram`` | ``suffix`` | a shipped drafter's name |
    a speculators-format folder (a speculator) | ``LEARNED+LOOKUP``, a learned drafter and a
    lookup in one proposer (``dflash+suffix``; ``specui.algorithms.hybrid``)."""
    choice = choice.strip()
    if choice in ("", "none", "plain"):
        return PlainDrafter()
    learned, plus, lookup = choice.rpartition("+")
    if plus and lookup in LOOKUPS and learned.strip():
        from specui.algorithms.hybrid import HybridDrafter

        first = resolve_drafter(learned, verifier, num_speculative_tokens, **options)
        if first.algorithm in (*BUILTIN, *LOOKUPS) or "+" in first.algorithm:
            raise SpecUIError(f"{choice!r}: a hybrid pairs a learned drafter with {lookup}")
        second = resolve_drafter(lookup, verifier, num_speculative_tokens, **options)
        return HybridDrafter(first, second, name=choice)
    if choice == "ngram":
        # Its lookup options (max_ngram / min_ngram or vLLM's names); others' are dropped.
        k = num_speculative_tokens if num_speculative_tokens is not None else 4
        return NgramDrafter(k, NgramConfig.from_options({o: options.get(o) for o in OPTION_NAMES}))
    if choice == "suffix":
        return SuffixDrafter(num_speculative_tokens, SuffixConfig.from_options(options))
    options = {
        k: v for k, v in options.items() if k not in OPTION_NAMES and k not in SUFFIX_OPTIONS
    }
    shipped = shipped_drafters()
    path = shipped.get(choice) or Path(choice).expanduser()
    if not path.exists() and is_hub_id(choice):
        path = hub.fetch(choice, "speculator")  # the CLI's; the app's visitors: choices.py
    if not path.exists():
        known = ", ".join([*BUILTIN, *shipped]) or "none"
        raise SpecUIError(
            f"unknown drafter {choice!r}: not a known name ({known}) nor an existing folder"
        )
    # An option only other algorithms' drafters take (DSpark's confidence_policy) is dropped.
    algo = ALGORITHMS.get(_model_type(path) or "")
    others = {o for a in ALGORITHMS.values() for o in a.drafter_options} - set(
        algo.drafter_options if algo else ()
    )
    options = {k: v for k, v in options.items() if not (k in others and v is not None)}
    # Admitted for the whole load: the conversions' copies are its peak (``serving``).
    with _admitted(choice, path, verifier):
        drafter = load_drafter(
            path, verifier, num_speculative_tokens=num_speculative_tokens, **options
        )
        # Beside an int8 or GGUF verifier too the drafter stays bf16: small, not worth the error.
        precision = getattr(verifier, "precision", "fp32")
        if precision in ("bf16", "int8", "gguf", "gguf-q8"):
            # Beside gguf-q8 the one call's matmuls take int8 rows too: the verifier's kernel.
            drafter.matmuls_in_bf16(int8_rows=precision == "gguf-q8")
            # Serving alone from here: the float32 copies of the load go (``serving``).
            drop_load_copies(drafter, verifier)
    return drafter


def _admitted(choice: str, path: Path, verifier: Verifier):
    """The drafter load's admission by its size (``serving.load_weights``: the safetensors
    headers and the config); a folder whose headers or config cannot be read is let through:
    load_drafter refuses it with the full message."""
    try:
        weights = load_weights(path, verifier) if path.is_dir() else None
    except (SpecUIError, KeyError, TypeError, ValueError):
        weights = None
    if weights is None:
        return contextlib.nullcontext()
    return admission.admitted(f"speculator {path.name}", weights)


def _model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text()).get("speculators_model_type")
    except (OSError, ValueError, AttributeError):
        return None  # load_drafter reports the broken config with a clear message
