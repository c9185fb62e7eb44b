"""Job kinds: the functions background jobs run, registered by name.

A module that registers kinds must be importable by the worker process: list it in
``KIND_MODULES``, in ``$SPECUI_JOB_MODULES`` (comma-separated) or pass ``--import MODULE``
to ``python -m workers.runner``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specui.registry import Registry

if TYPE_CHECKING:
    from specui.jobs.context import JobContext

log = logging.getLogger(__name__)

JobFn = Callable[[dict[str, Any], "JobContext"], Any]

# Modules that register job kinds; a missing one is skipped (not built yet).
KIND_MODULES = ["specui.jobs.builtin", "specui.jobs.training", "specui.jobs.benchmark"]


@dataclass(frozen=True)
class JobKind:
    kind: str
    fn: JobFn
    module: str  # what a child imports to find fn again


def _same_fn(old: JobKind, new: JobKind) -> bool:
    """A module imported twice registers the same function again: that is no clash."""
    return (old.module, old.fn.__qualname__) == (new.module, new.fn.__qualname__)


KINDS: Registry[JobKind] = Registry(
    "job kind",
    modules=KIND_MODULES,
    env="SPECUI_JOB_MODULES",
    skip_missing=True,
    same=_same_fn,
    describe=lambda k: f"by {k.module}.{k.fn.__qualname__}",
)


def job_kind(kind: str) -> Callable[[JobFn], JobFn]:
    """Register ``fn(params, ctx)`` as the function that runs jobs of ``kind``."""

    def wrap(fn: JobFn) -> JobFn:
        KINDS.register(kind, JobKind(kind, fn, fn.__module__))
        return fn

    return wrap


def load_kinds(extra_modules: Iterable[str] = ()) -> list[str]:
    """Import the modules that register kinds (KIND_MODULES, $SPECUI_JOB_MODULES,
    ``extra_modules``); returns the registered kinds."""
    KINDS.load(extra_modules)
    return sorted(KINDS.names())


def registered_kinds() -> list[str]:
    """The kinds registered so far (importing nothing)."""
    return sorted(KINDS.names(load=False))
