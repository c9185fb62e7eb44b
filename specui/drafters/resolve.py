"""Turning what a user typed (``none``, ``ngram``, a shipped name, a folder) into a drafter."""

from __future__ import annotations

from pathlib import Path

from specui.drafters.base import Drafter
from specui.drafters.simple import NgramDrafter, PlainDrafter
from specui.paths import shipped_drafters_dir
from specui.trace import SpecUIError
from specui.verifier import Verifier

BUILTIN = ("none", "ngram")


def shipped_drafters() -> dict[str, Path]:
    """Speculators-format folders shipped in ``data/drafters`` by name."""
    root = shipped_drafters_dir()
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if (p / "config.json").is_file()}


def resolve_drafter(spec: str, verifier: Verifier, num_speculative_tokens: int | None = None, **options) -> Drafter:
    """``none`` | ``ngram`` | a shipped drafter's name | a speculators-format folder."""
    spec = spec.strip()
    if spec in ("", "none", "plain"):
        return PlainDrafter()
    if spec == "ngram":
        return NgramDrafter(num_speculative_tokens if num_speculative_tokens is not None else 4)
    shipped = shipped_drafters()
    path = shipped.get(spec) or Path(spec).expanduser()
    if not path.exists():
        known = ", ".join([*BUILTIN, *shipped]) or "none"
        raise SpecUIError(f"unknown drafter {spec!r}: not a known name ({known}) nor an existing folder")
    from specui.drafters import load_drafter

    return load_drafter(path, verifier, num_speculative_tokens=num_speculative_tokens, **options)
