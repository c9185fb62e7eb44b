"""Whether a process of this host still runs, and handing this one's free heap back.

Low in the import order (nothing of SpecUI below it): the store's owner checks and the
training checkpoints' clean-up of dead writers' temporary folders ask ``pid_alive``; the app's
minute tick and the drafter pool (``specui.workbench``) ask ``trim_malloc``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process of this host still runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


@functools.cache
def libc() -> ctypes.CDLL | None:
    """glibc, where it has ``mallopt`` and ``malloc_trim`` (None: macOS, musl); looked up once:
    ``find_library`` runs ``ldconfig`` in a child process, a fork of the whole app (its
    resident size counted twice while it runs) each time it is asked."""
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return (
        lib if lib is not None and hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None
    )


def trim_malloc() -> None:
    """Return the C heap's free memory to the system (glibc keeps what a thread freed in its
    arena, so a model load's temporaries stay resident until then); nothing without glibc."""
    lib = libc()
    if lib is not None:
        lib.malloc_trim(0)
