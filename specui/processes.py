"""Whether a process of this host still runs.

Low in the import order (nothing of SpecUI below it): the store's owner checks and the
training checkpoints' clean-up of dead writers' temporary folders both ask it.
"""

from __future__ import annotations

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
