"""The job queue as the UI and the CLI call it: each function is one store call
(``specui.store.jobs``), and ``enqueue`` first checks that a runner knows the
job's kind.  The runner calls the store itself to claim, hand over and finish jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specui.errors import SpecUIError
from specui.jobs.kinds import load_kinds
from specui.store import Job, JobStatus, Store


def enqueue(
    store: Store,
    kind: str,
    params: Mapping[str, Any] | None = None,
    *,
    owner: str | None = None,
    check_kind: bool = True,
) -> Job:
    """Queue a job.  ``kind`` must be registered (``specui.jobs.job_kind``)
    unless ``check_kind`` is off (a runner with more kinds will take it)."""
    if check_kind:
        known = load_kinds()
        if kind not in known:
            names = ", ".join(known) or "none"
            raise SpecUIError(f"unknown job kind {kind!r}; known kinds: {names}")
    return store.enqueue_job(kind, params, owner=owner)


def list_jobs(
    store: Store,
    *,
    status: JobStatus | str | None = None,
    kind: str | None = None,
    limit: int | None = None,
) -> list[Job]:
    """Jobs, newest first."""
    return store.list_jobs(status=status, kind=kind, limit=limit)


def cancel(store: Store, job_id: int, requester: str | None = None, *, force: bool = False) -> Job:
    """Cancel a job (``Store.cancel_job``)."""
    return store.cancel_job(job_id, requester, force=force)
