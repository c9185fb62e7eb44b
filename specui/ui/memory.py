"""Bounded memory for a long-running app whose visitors come and go.

Gradio keeps a ``SessionState`` per browser session (a copy of every component's
config, about 300 KiB for this dashboard, plus ``gr.State`` values) until 10 000
sessions have come (its ``state_session_capacity``): a closed tab's state is only
marked closed, never dropped.  On a public demo every visit is a new session, so
that is memory growing with the number of visitors.  ``expire_idle_sessions``
drops the state of sessions idle for longer than ``SPECUI_SESSION_IDLE_S``
(default an hour, as long as Gradio keeps a closed session's ``gr.State``),
checked every minute; a visitor who comes back after that gets the page's
defaults, as after Gradio's own eviction.  ``SESSION_CAPACITY`` caps the sessions
held at all (``launch(state_session_capacity=)``).

The rest of the growth under load is not Python's (``bench/soak.py --tracemalloc``
finds well under 1 MiB of Python allocations held after the warm-up): it is glibc
malloc's, which gives each thread that allocates an arena of its own (up to 8 per
core) and keeps freed memory in them.  Gradio runs handlers on a pool of worker
threads, so decodes touch ever more arenas.  ``limit_malloc_arenas`` caps them
(``SPECUI_MALLOC_ARENA_MAX``, default 2; 0 leaves glibc's default), and the same
minute's tick returns free heap memory to the system (``malloc_trim``).
"""

from __future__ import annotations

import datetime
import logging
import os
import threading

import gradio as gr

from specui.processes import libc, trim_malloc

log = logging.getLogger(__name__)

IDLE_ENV = "SPECUI_SESSION_IDLE_S"
ARENAS_ENV = "SPECUI_MALLOC_ARENA_MAX"
SESSION_CAPACITY = 1000  # Gradio's default is 10 000
_M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas (call before the app starts its threads); False where
    there is no glibc (macOS, musl) or the cap is off."""
    n = int(os.environ.get(ARENAS_ENV, "2"))
    lib = libc()
    return bool(n > 0 and lib is not None and lib.mallopt(_M_ARENA_MAX, n) == 1)


def idle_limit_s() -> float:
    return float(os.environ.get(IDLE_ENV, "3600"))


def drop_idle(app: gr.Blocks, idle_s: float, now: datetime.datetime | None = None) -> int:
    """Drop the state of ``app``'s sessions unused for ``idle_s`` seconds; how many."""
    holder = getattr(app, "state_holder", None)
    if holder is None:  # not launched yet
        return 0
    now = now or datetime.datetime.now()
    cutoff = now - datetime.timedelta(seconds=idle_s)
    with holder.lock:
        stale = [sid for sid, t in holder.time_last_used.items() if t < cutoff]
        for sid in stale:
            holder.session_data.pop(sid, None)
            holder.time_last_used.pop(sid, None)
    return len(stale)


def expire_idle_sessions(app: gr.Blocks, every_s: float = 60.0) -> threading.Thread:
    """Start the daemon thread that runs ``drop_idle`` (and ``trim_malloc``) every ``every_s``
    seconds."""

    def loop() -> None:
        stop = threading.Event()
        while not stop.wait(every_s):
            try:
                n = drop_idle(app, idle_limit_s())
            except Exception as e:  # noqa: BLE001 - Gradio internals moved: keep serving
                log.warning("expiring idle Gradio sessions failed (%s); stopped", e)
                return
            if n:
                log.info("dropped the state of %d idle sessions", n)
            trim_malloc()

    thread = threading.Thread(target=loop, daemon=True, name="specui-session-expiry")
    thread.start()
    return thread
