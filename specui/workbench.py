"""Loaded models shared by the dashboard's visitors.

Verifiers are loaded once per choice and precision and shared (forward passes are
thread-safe: the tap capture is per thread).  Drafters keep per-generation state, so each
run borrows an instance from a small pool and returns it afterwards.  The pools
are bounded: visitors choose K and a drafter's options freely, and each choice
would otherwise keep a drafter loaded for good.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from specui.algorithms.base import Drafter
from specui.algorithms.resolve import BUILTIN, resolve_drafter, shipped_drafters
from specui.paths import data_dir
from specui.policy.adaptive import MAX_MEASURED_ROWS, split
from specui.policy.cost import CostModel, cost_model
from specui.processes import trim_malloc
from specui.verifier.model import Verifier, default_precision

log = logging.getLogger(__name__)


def trained_drafters_dir() -> Path:
    """Where trained and imported speculators live (inside the app's data folder)."""
    return data_dir() / "speculators"


# The speculator the Playground opens with (and the soak bench decodes with): the fastest mode
# measured on Spec-Bench, docs/results.md "Issues 48 and 52" (n-gram lookup, 1.11x plain with
# the adaptive policy, ahead of every hybrid and every shipped learned drafter), so a
# newcomer's first Generate shows speculation winning.  Change it here when a bench says
# another mode is faster.
PLAYGROUND_SPECULATOR = "ngram"


def default_drafter(choices: list[str]) -> str:
    """The speculator a Playground opens with: ``PLAYGROUND_SPECULATOR`` where it is offered,
    else none."""
    return PLAYGROUND_SPECULATOR if PLAYGROUND_SPECULATOR in choices else "none"


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
# Bytes the idle drafters may hold together (SPECUI_DRAFTER_POOL_MB): twenty visitors picking
# twenty drafters keep the least recently used ones only up to this, whatever their sizes.
POOL_ENV = "SPECUI_DRAFTER_POOL_MB"


def pool_cap_bytes() -> int:
    return int(float(os.environ.get(POOL_ENV, "1024")) * 2**20)


def held_bytes(drafter: Drafter, verifier: Verifier) -> int:
    """The memory a drafter holds of its own: every tensor storage reachable from it (its
    parameters and buffers, and what its modules and kernels keep beside them: bf16 copies,
    packed weights), less those it shares with the verifier (a bound embedding or head)."""
    shared = {t.untyped_storage().data_ptr() for t in verifier.model.parameters()}
    storages: dict[int, int] = {}
    seen: set[int] = set()
    todo: list = [drafter]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_meta:  # a shape without memory (a weight a serving drafter dropped)
                continue
            try:
                storage = obj.untyped_storage()
            except NotImplementedError:  # an opaque (mkldnn-packed) tensor: its own size
                storages[id(obj)] = obj.numel() * obj.element_size()
                continue
            if storage.data_ptr() not in shared:
                storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, list | tuple | set):
            todo.extend(obj)
        elif isinstance(obj, torch.nn.Module | Drafter) or _is_kernel_state(obj):
            todo.extend(vars(obj).values())
    return sum(storages.values())


def _is_kernel_state(obj: object) -> bool:
    # SpecUI's own objects a drafter holds (its one-call layers, packed linears): walk them;
    # never the verifier (its weights are not the drafter's) nor foreign objects.
    module = type(obj).__module__
    return (
        module.startswith("specui.") and not isinstance(obj, Verifier) and hasattr(obj, "__dict__")
    )


class Workbench:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verifiers: OrderedDict[tuple[str, str], Verifier] = (
            OrderedDict()
        )  # least recently used first
        self._verifier_locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        # (drafter choice, verifier, K, options) -> idle drafters, least recently returned first
        self._idle: OrderedDict[tuple, list[Drafter]] = OrderedDict()
        self._sizes: dict[int, int] = {}  # id(idle drafter) -> held_bytes
        self._measuring: set[tuple[str, str]] = set()  # (choice, precision) a preload measures

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

    def preload(
        self,
        choice: str,
        precision: str | None = None,
        drafters: Sequence[str] | None = None,
    ) -> threading.Thread:
        """Start loading a verifier, then measuring its cost model, in a background thread and
        return that thread.

        The app calls this at start-up, so the embedded verifier's one-time fetch and
        conversion run before the first visitor asks; a Generate that comes sooner waits
        on the same load (``verifier``'s per-choice lock) instead of starting a second one.
        The adaptive policy's cost model (the verify curve up to the longest block it measures,
        and the draft cost of ``drafters``, default the Playground's own speculator) is measured
        here too, so the first Generate's first drafted step does not wait seconds for it in a
        decode slot (a Generate that comes during the measure waits on the model's lock).
        A failed preload is only logged: the next ``verifier`` call tries again and shows
        the visitor the error."""

        def load() -> None:
            start = time.perf_counter()
            try:
                verifier = self.verifier(choice, precision)
            except Exception as e:  # noqa: BLE001 - any load error, reported on first use
                log.warning("preloading verifier %r failed: %s", choice, e)
                return
            # The chat template compiles on its first use (tens of ms): here, not in the first
            # visitor's Generate.
            if getattr(verifier.tokenizer, "chat_template", None):
                try:
                    verifier.encode("warm-up", chat=True)
                except Exception as e:  # noqa: BLE001 - the first Generate reports a bad template
                    log.warning("encoding a chat turn with %r failed: %s", choice, e)
            key = (choice, precision or default_precision())
            with self._lock:
                self._measuring.add(key)
            try:
                self.measure_costs(verifier, drafters)
            except Exception as e:  # noqa: BLE001 - the first run measures again, or says why
                log.warning("measuring the cost model of %r failed: %s", choice, e)
            finally:
                with self._lock:
                    self._measuring.discard(key)
            # bench/ui_latency.py waits for this line: a first visitor comes after start-up.
            log.info("preloaded %s in %.1f s", choice, time.perf_counter() - start)

        thread = threading.Thread(target=load, daemon=True, name=f"specui-preload-{choice}")
        thread.start()
        return thread

    def costs_pending(self, choice: str, precision: str | None = None) -> bool:
        """Whether a preload is measuring ``choice``'s cost model now (the Playground says so
        while a Generate waits on it)."""
        with self._lock:
            return (choice, precision or default_precision()) in self._measuring

    def measure_costs(self, verifier: Verifier, drafters: Sequence[str] | None = None) -> CostModel:
        """The verifier's cost model with every row the adaptive policy measures and a draft
        figure for each of ``drafters`` (default: the Playground's speculator), measured now
        unless cached.  A drafter that does not load here is skipped (its run reports why)."""
        names = [default_drafter(drafter_choices())] if drafters is None else list(drafters)
        model = cost_model(verifier, MAX_MEASURED_ROWS)
        for name in names:
            if name in ("none", "plain"):
                continue
            try:
                # Borrowed with the options the Playground's first Generate passes (its
                # confidence policy off), so that Generate finds this drafter loaded.
                with self.drafter(name, verifier, confidence_policy=None) as d:
                    parts = tuple(p for _, p in filter(None, split(d)))
                    model = cost_model(verifier, MAX_MEASURED_ROWS, parts)
            except Exception as e:  # noqa: BLE001 - the Playground shows a drafter's error
                log.warning("no draft cost for %r at preload: %s", name, e)
        return model

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
            size = self._sizes.pop(id(drafter), 0) if drafter is not None else 0
        if drafter is None:
            drafter = resolve_drafter(choice, verifier, k, **options)
            size = held_bytes(drafter, verifier)
            # The load's temporaries (the float32 model, the conversions' copies) were freed
            # into malloc's arenas: hand them back now, not at the app's next minute tick, or
            # loads in a row each leave a few hundred MiB resident (docs/space.md).
            if size >= 2**20:  # a learned drafter's load (not a lookup's, made in microseconds)
                trim_malloc()
        dropped: list[Drafter] = []
        try:
            yield drafter
        finally:
            with self._lock:
                pool = self._idle.setdefault(key, [])
                if len(pool) < IDLE_PER_KEY:  # as many as run at once (two decodes)
                    pool.append(drafter)
                    self._sizes[id(drafter)] = size
                self._idle.move_to_end(key)
                dropped = self._trim()
            if dropped:
                del dropped[:]  # the last references: their memory is free, then returned
                trim_malloc()

    def _trim(self) -> list[Drafter]:
        """Drop the least recently used idle drafters past IDLE_KEYS configurations or the
        pool's byte cap (the one just returned stays, whatever its size); returns them."""
        out: list[Drafter] = []
        while len(self._idle) > IDLE_KEYS or (
            len(self._idle) > 1 and sum(self._sizes.values()) > pool_cap_bytes()
        ):
            _, dropped = self._idle.popitem(last=False)
            for d in dropped:
                self._sizes.pop(id(d), None)
            out += dropped
        return out

    def idle_bytes(self) -> int:
        """What the idle drafters hold together (at most the pool cap, or one drafter)."""
        with self._lock:
            return sum(self._sizes.values())


WORKBENCH = Workbench()
