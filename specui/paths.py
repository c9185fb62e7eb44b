"""Folders the app owns, and confinement of user-typed paths to them."""

from __future__ import annotations

import os
from pathlib import Path

from specui.trace import SpecUIError

REPO_ROOT = Path(__file__).resolve().parent.parent


def shipped_data_dir() -> Path:
    """``data/`` of the checkout: shipped prompts and drafters (read-only for the app)."""
    return Path(os.environ.get("SPECUI_SHIPPED_DIR", REPO_ROOT / "data"))


def shipped_drafters_dir() -> Path:
    return shipped_data_dir() / "drafters"


def data_dir() -> Path:
    """Where the app writes: database, trained drafters, caches (``SPECUI_DATA_DIR``)."""
    return Path(os.environ.get("SPECUI_DATA_DIR", Path.home() / ".local" / "share" / "specui"))


def confine(user_path: str | os.PathLike, roots: list[Path] | None = None) -> Path:
    """Resolve a path a user typed and refuse it unless it lies inside one of
    ``roots`` (default: the app's data folders, plus ``SPECUI_EXTRA_ROOTS``,
    a ``os.pathsep``-separated list the operator may set).  Symlinks are
    resolved first, so a link pointing outside is refused too."""
    if roots is None:
        roots = [data_dir(), shipped_data_dir()]
        extra = os.environ.get("SPECUI_EXTRA_ROOTS", "")
        roots += [Path(p) for p in extra.split(os.pathsep) if p]
    raw = Path(user_path).expanduser()
    candidates = [raw] if raw.is_absolute() else [root / raw for root in roots]
    for cand in candidates:
        resolved = cand.resolve()
        for root in roots:
            if resolved.is_relative_to(root.resolve()):
                return resolved
    raise SpecUIError(f"path {str(user_path)!r} lies outside the folders this app may use")
