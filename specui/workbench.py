"""Loaded models shared by the dashboard's visitors.

Verifiers are loaded once per choice and precision and shared (forward passes are
thread-safe: the tap capture is per thread).  Drafters keep per-generation state, so each
run borrows an instance from a small pool and returns it afterwards.  The pools
are bounded: visitors choose K and a drafter's options freely, and each choice
would otherwise keep a drafter loaded for good.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specui.algorithms.base import Drafter
from specui.algorithms.resolve import BUILTIN, resolve_drafter, shipped_drafters
from specui.algorithms.spec import algorithm_specs
from specui.paths import data_dir
from specui.verifier.model import Verifier, default_precision

log = logging.getLogger(__name__)


def trained_drafters_dir() -> Path:
    """Where trained and imported speculators live (inside the app's data folder)."""
    return data_dir() / "speculators"


def default_drafter(choices: list[str]) -> str:
    """The speculator a Playground opens with: the first shipped drafter of the algorithms by
    their playground_rank, else ngram (it needs no training), else none."""
    ranked = sorted(
        (s for s in algorithm_specs() if s.playground_rank is not None),
        key=lambda s: s.playground_rank,
    )
    return next((c for c in [*(s.name for s in ranked), "ngram"] if c in choices), "none")


def drafter_choices() -> list[str]:
    """Names a user can pick: built-ins, shipped drafters, then trained/imported folders."""
    names = [*BUILTIN, *shipped_drafters()]
    root = trained_drafters_dir()
    if root.is_dir():
        names += [str(p) for p in sorted(root.iterdir()) if (p / "config.json").is_file()]
    return names


VERIFIERS_KEPT = 2  # loaded verifiers (least recently used dropped)
IDLE_PER_KEY = 2
IDLE_KEYS = 8  # drafter configurations kept loaded (least recently used dropped)


class Workbench:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verifiers: OrderedDict[tuple[str, str], Verifier] = (
            OrderedDict()
        )  # least recently used first
        self._verifier_locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        # (drafter choice, verifier, K, options) -> idle drafters, least recently returned first
        self._idle: OrderedDict[tuple, list[Drafter]] = OrderedDict()

    def verifier(self, choice: str, precision: str | None = None) -> Verifier:
        """The shared verifier for ``choice`` (``precision``: see ``Verifier.load``; default
        ``SPECUI_VERIFIER_PRECISION`` or ``auto``)."""
        key = (choice, precision or default_precision())
        with self._lock:
            if key in self._verifiers:
                self._verifiers.move_to_end(key)
                return self._verifiers[key]
            load_lock = self._verifier_locks[key]
        with load_lock:  # one load per choice, other choices load in parallel
            with self._lock:
                found = self._verifiers.get(key)
            if found is not None:
                return found
            loaded = Verifier.load(choice, precision=key[1])
            with self._lock:
                self._verifiers[key] = loaded
                while (
                    len(self._verifiers) > VERIFIERS_KEPT
                ):  # a run using one keeps its own reference
                    old, _ = self._verifiers.popitem(last=False)
                    self._verifier_locks.pop(old, None)
            return loaded

    def verifier_ready(self, choice: str, precision: str | None = None) -> bool:
        """Whether ``verifier(choice, precision)`` would return at once (already loaded)."""
        with self._lock:
            return (choice, precision or default_precision()) in self._verifiers

    def preload(self, choice: str, precision: str | None = None) -> threading.Thread:
        """Start loading a verifier in a background thread and return that thread.

        The app calls this at start-up, so the embedded verifier's one-time fetch and
        conversion run before the first visitor asks; a Generate that comes sooner waits
        on the same load (``verifier``'s per-choice lock) instead of starting a second one.
        A failed preload is only logged: the next ``verifier`` call tries again and shows
        the visitor the error."""

        def load() -> None:
            try:
                self.verifier(choice, precision)
            except Exception as e:  # noqa: BLE001 - any load error, reported on first use
                log.warning("preloading verifier %r failed: %s", choice, e)

        thread = threading.Thread(target=load, daemon=True, name=f"specui-preload-{choice}")
        thread.start()
        return thread

    @contextmanager
    def drafter(
        self, choice: str, verifier: Verifier, k: int | None = None, **options
    ) -> Iterator[Drafter]:
        """A drafter for ``choice`` (see ``resolve_drafter``), from the idle pool when one is
        there; it goes back to the pool (while the pool has room) when the block ends."""
        key = (choice, verifier.name, k, tuple(sorted(options.items())))
        with self._lock:
            pool = self._idle.get(key)
            drafter = pool.pop() if pool else None
        if drafter is None:
            drafter = resolve_drafter(choice, verifier, k, **options)
        try:
            yield drafter
        finally:
            with self._lock:
                pool = self._idle.setdefault(key, [])
                if len(pool) < IDLE_PER_KEY:  # as many as run at once (two decodes)
                    pool.append(drafter)
                self._idle.move_to_end(key)
                while len(self._idle) > IDLE_KEYS:
                    self._idle.popitem(last=False)


WORKBENCH = Workbench()
