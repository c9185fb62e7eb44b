"""Folders the app owns, and confinement of user-typed paths to them."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from specui.errors import SpecUIError

REPO_ROOT = Path(__file__).resolve().parent.parent
# The operator's override: more folders (os.pathsep-separated) visitors may name.
EXTRA_ROOTS_ENV = "SPECUI_EXTRA_ROOTS"


def shipped_data_dir() -> Path:
    """``data/`` of the checkout: shipped prompts and drafters (read-only for the app)."""
    return Path(os.environ.get("SPECUI_SHIPPED_DIR", REPO_ROOT / "data"))


def shipped_drafters_dir() -> Path:
    return shipped_data_dir() / "drafters"


def data_dir() -> Path:
    """Where the app writes: database, trained drafters, caches (``SPECUI_DATA_DIR``)."""
    return Path(os.environ.get("SPECUI_DATA_DIR", Path.home() / ".local" / "share" / "specui"))


def campaign_dir() -> Path:
    """The drafters' training campaign's state folder, outside the repository
    (``SPECUI_CAMPAIGN_DIR``; specui.training.campaign)."""
    return Path(os.environ.get("SPECUI_CAMPAIGN_DIR", Path.home() / "specui-campaign"))


def app_roots() -> list[Path]:
    """The folders visitors may name: the data dir, the shipped ``data/``, and the operator's
    extras."""
    extra = os.environ.get(EXTRA_ROOTS_ENV, "")
    return [data_dir(), shipped_data_dir(), *(Path(p) for p in extra.split(os.pathsep) if p)]


def confine(user_path: str | os.PathLike, roots: list[Path] | None = None) -> Path:
    """Resolve a path a user typed and refuse it unless it lies inside one of
    ``roots`` (default: the app's data folders, plus ``SPECUI_EXTRA_ROOTS``,
    a ``os.pathsep``-separated list the operator may set).  Symlinks are
    resolved first, so a link pointing outside is refused too."""
    if roots is None:
        roots = app_roots()
    raw = Path(user_path).expanduser()
    if raw.is_absolute():
        cand = raw
    else:
        # A relative path names the first root where it exists (a link counts, even one
        # pointing out: it is then refused, not replaced by a harmless namesake elsewhere).
        cands = [root / raw for root in roots]
        cand = next((c for c in cands if c.exists() or c.is_symlink()), cands[0] if cands else raw)
    resolved = cand.resolve()
    if any(resolved.is_relative_to(root.resolve()) for root in roots):
        return resolved
    # The roots are not named: a visitor need not learn the server's folders.
    raise SpecUIError(
        f"path {str(user_path)!r} lies outside the folders this app may use "
        f"(its data folder; the operator may add folders with {EXTRA_ROOTS_ENV})"
    )


# A hub id ("org/name"): what Verifier.load sends to the hub when no such local path exists.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` has the shape of a hub id (``org/name``, no ``..``); callers look for
    a local path of that name first."""
    return bool(_HUB_ID.fullmatch(spec)) and ".." not in spec.split("/")


def confine_choice(value: str, names: Iterable[str] = (), *, hub_ids: bool = False) -> str:
    """What a dashboard visitor picked or typed where a name or a path is accepted
    (verifier, speculator, prompt set): a known name (``names``) and, with
    ``hub_ids``, a hub id that is no local path pass unchanged; anything else is a
    path, confined to the app's folders (see ``confine``) and returned resolved.

    The CLI does not call this: the operator may use any path."""
    v = (value or "").strip()
    if v in set(names):
        return v
    if not v:
        raise SpecUIError("give a name or a path")
    if hub_ids and is_hub_id(v):
        local = [Path(v), *(root / v for root in app_roots())]
        if not any(p.exists() or p.is_symlink() for p in local):
            return v
    path = confine(v)
    if not path.exists():
        # Name what the visitor typed, not the server's folders it resolved to.
        known = ", ".join(sorted(n for n in set(names) if n)) or "none"
        raise SpecUIError(
            f"{v!r} is neither a known name ({known}) nor an existing folder or file in the app's"
            " folders"
        )
    return str(path)
