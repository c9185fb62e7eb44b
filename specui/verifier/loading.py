"""What each model load in progress is doing, so a visitor waiting on it can be told.

A load names its stage (``stage``: downloading from the hub, converting a GGUF file, reading
weights) while it runs; ``current`` gives the stage of a spec's load and how long it has run,
for the Playground's wait note (``specui.ui.playground.verifier_wait_note``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# transformers' from_pretrained is not thread-safe: it sets process-wide state while it builds
# a model (torch's default dtype, whether weights are initialised), and two loads at once in
# the dashboard's threads built a verifier whose tied head was missing.  Model construction
# holds this lock; the slow parts of a load (a download, admission) do not.
CONSTRUCTION = threading.Lock()

_lock = threading.Lock()
_stages: dict[str, list[tuple[str, float]]] = {}  # spec -> its loads' (stage, started)


@contextmanager
def stage(spec: str, text: str) -> Iterator[None]:
    """Mark ``spec``'s load as doing ``text`` (e.g. "downloading 0.3 GB from the hub") until
    the block ends."""
    entry = (text, time.monotonic())
    with _lock:
        _stages.setdefault(spec, []).append(entry)
    try:
        yield
    finally:
        with _lock:
            entries = _stages.get(spec, [])
            if entry in entries:
                entries.remove(entry)
            if not entries:
                _stages.pop(spec, None)


def current(spec: str) -> tuple[str, float] | None:
    """(the latest stage of a load of ``spec``, seconds it has run), or None if none runs."""
    with _lock:
        entries = _stages.get(spec)
        if not entries:
            return None
        text, started = entries[-1]
    return text, time.monotonic() - started
