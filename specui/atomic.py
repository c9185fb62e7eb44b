"""Writes that cannot leave a half state: a file is the old one or the new one, a
folder is whole or clearly gone.

- ``write_text`` / ``write_json``: into a temporary file in the same folder, fsync,
  ``os.replace`` over the target, fsync the folder (so the rename survives a power
  cut too).  A reader, or the next run after a ``kill -9``, sees the old file or
  the new one, never a torn one.
- ``remove_tree``: rename the folder aside to a hidden name first (``.deleting-...``),
  then delete it.  ``shutil.rmtree`` alone removes files in directory order, so a
  kill mid-way could leave a folder under its old name that still looks complete
  (a checkpoint whose ``trainer_state.json`` survived its weights).  Aside folders
  are garbage by name: no loader takes one, and ``sweep_aside`` deletes them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

ASIDE_PREFIX = ".deleting-"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` by ``text`` atomically.  An OSError names the file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are for whoever may read the folder
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write {path}: {e.strerror or e}") from e
    fsync_dir(path.parent)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """``obj`` as indented JSON (one trailing newline), written atomically."""
    write_text(path, json.dumps(obj, indent=2) + "\n")


def remove_tree(path: Path) -> None:
    """Delete folder ``path`` so that no kill leaves a part of it under its name."""
    aside = path.parent / f"{ASIDE_PREFIX}{path.name}-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
    shutil.rmtree(aside, ignore_errors=True)


def is_aside(path: Path) -> bool:
    return path.name.startswith(ASIDE_PREFIX)


def sweep_aside(folder: Path) -> None:
    """Finish the deletions a killed process left half done in ``folder``."""
    for p in folder.iterdir():
        if is_aside(p) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
