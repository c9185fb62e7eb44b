"""The job queue as the UI, the CLI and the runner call it: each function is one
store call (``specui.store.jobs``), and ``enqueue`` first checks that a runner
knows the job's kind.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from specui.errors import SpecUIError
from specui.store import Job, JobStatus, Store


def enqueue(
    store: Store,
    kind: str,
    params: Mapping[str, Any] | None = None,
    *,
    owner: str | None = None,
    check_kind: bool = True,
) -> Job:
    """Queue a job.  ``kind`` must be registered (``workers.runner.job_kind``)
    unless ``check_kind`` is off (a runner with more kinds will take it)."""
    if check_kind:
        from workers.runner import load_kinds  # the runner imports this module

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


def claim_next(
    store: Store,
    *,
    kinds: Collection[str] | None = None,
    max_running: int | None = None,
    pid: int | None = None,
) -> Job | None:
    """Take the oldest queued job, or None (``Store.claim_next_job``)."""
    return store.claim_next_job(kinds=kinds, max_running=max_running, pid=pid)


def set_pid(store: Store, job_id: int, pid: int) -> None:
    """Hand a running job to the process that runs it (``Store.set_job_pid``)."""
    store.set_job_pid(job_id, pid)


def finish(
    store: Store, job_id: int, status: JobStatus, *, error: str | None = None, result: Any = None
) -> bool:
    """Set a running job's final status (``Store.finish_job``)."""
    return store.finish_job(job_id, status, error=error, result=result)


def write_progress(
    store: Store,
    job_id: int,
    *,
    progress: float,
    message: str | None,
    log_tail: str,
    metrics: list[tuple[int, str, float]],
) -> float | None:
    """One heartbeat of a running job; its cancel_requested_at (``Store.write_job_progress``)."""
    return store.write_job_progress(
        job_id, progress=progress, message=message, log_tail=log_tail, metrics=metrics
    )
