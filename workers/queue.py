"""The job queue: rows of the store's ``jobs`` table (``specui.store.Job``).

Any process may enqueue, list and cancel; a runner (``workers.runner``) claims
jobs.  Claiming is one ``BEGIN IMMEDIATE`` transaction that checks the running
count and flips the oldest queued job to running, so two runners (or a UI and a
CLI runner) never take the same job or exceed the concurrency limit together.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Collection, Mapping
from typing import Any

from specui.store import Job, JobStatus, Store, check_owner, user_error


def enqueue(store: Store, kind: str, params: Mapping[str, Any] | None = None, *, owner: str | None = None, check_kind: bool = True) -> Job:
    """Queue a job.  ``kind`` must be registered (``workers.runner.job_kind``)
    unless ``check_kind`` is off (a runner with more kinds will take it)."""
    if check_kind:
        from workers.runner import load_kinds  # the runner imports this module

        known = load_kinds()
        if kind not in known:
            raise user_error(f"unknown job kind {kind!r}; known kinds: {', '.join(known) or 'none'}")
    try:
        params_json = json.dumps(dict(params or {}), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise user_error(f"job parameters must be JSON-serialisable: {e}") from None
    with store.write() as s:
        job = Job(kind=kind, params_json=params_json, status=JobStatus.QUEUED, owner=owner, created_at=time.time())
        s.add(job)
        s.flush()
        return job


def list_jobs(store: Store, *, status: JobStatus | str | None = None, kind: str | None = None, limit: int | None = None) -> list[Job]:
    """Jobs, newest first."""
    return store.list_jobs(status=status, kind=kind, limit=limit)


def cancel(store: Store, job_id: int, requester: str | None = None, *, force: bool = False) -> Job:
    """Cancel a job: a queued one at once; a running one by setting its cancel flag
    (the job sees ``ctx.cancelled()``; its runner sends SIGTERM after a grace
    period).  A finished job is returned unchanged."""
    now = time.time()
    with store.write() as s:
        job = s.get(Job, job_id)
        if job is None:
            raise user_error(f"unknown job id {job_id}")
        check_owner("job", job_id, job.owner, requester, force)
        if job.status == JobStatus.QUEUED:
            job.status, job.ended_at = JobStatus.CANCELLED, now
        elif job.status == JobStatus.RUNNING and job.cancel_requested_at is None:
            job.cancel_requested_at = now
        s.add(job)
        return job


def claim_next(store: Store, *, kinds: Collection[str] | None = None, max_running: int | None = None, pid: int | None = None) -> Job | None:
    """Atomically take the oldest queued job (status -> running, owned by ``pid``),
    or None when nothing is queued or ``max_running`` jobs already run.  A queued
    job of a kind not in ``kinds`` is failed rather than left queued forever."""
    now = time.time()
    with store.read() as s:  # an idle runner polls often: do not take the write lock for nothing
        if s.connection().exec_driver_sql("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1").first() is None:
            return None
    with store.write() as s:
        conn = s.connection()
        if max_running is not None:
            running = conn.exec_driver_sql("SELECT count(*) FROM jobs WHERE status = 'running'").scalar_one()
            if running >= max_running:
                return None
        while True:
            row = conn.exec_driver_sql("SELECT id, kind FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1").first()
            if row is None:
                return None
            job_id, kind = row
            if kinds is not None and kind not in kinds:
                conn.exec_driver_sql(
                    "UPDATE jobs SET status = 'failed', ended_at = ?, error = ? WHERE id = ?",
                    (now, f"unknown job kind {kind!r} (this runner knows: {', '.join(sorted(kinds))})", job_id),
                )
                continue
            conn.exec_driver_sql(
                "UPDATE jobs SET status = 'running', pid = ?, hostname = ?, started_at = ?, heartbeat_at = ? WHERE id = ?",
                (pid if pid is not None else os.getpid(), socket.gethostname(), now, now, job_id),
            )
            return s.get(Job, job_id)


def set_pid(store: Store, job_id: int, pid: int) -> None:
    """Hand a running job to the process that runs it (its liveness now counts)."""
    with store.write() as s:
        s.connection().exec_driver_sql(
            "UPDATE jobs SET pid = ?, hostname = ?, heartbeat_at = ? WHERE id = ? AND status = 'running'",
            (pid, socket.gethostname(), time.time(), job_id),
        )


def finish(store: Store, job_id: int, status: JobStatus, *, error: str | None = None, result: Any = None) -> bool:
    """Set a running job's final status; False when it was no longer running
    (e.g. already failed by a reaper)."""
    if status not in (JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED):
        raise ValueError(f"finish needs a final status, got {status}")
    try:
        result_json = None if result is None else json.dumps(result, allow_nan=False)
    except (TypeError, ValueError):
        result_json = json.dumps(repr(result))
    with store.write() as s:
        n = s.connection().exec_driver_sql(
            "UPDATE jobs SET status = ?, error = ?, result_json = ?, ended_at = ?, "
            "progress = CASE WHEN ? = 'done' THEN 1.0 ELSE progress END WHERE id = ? AND status = 'running'",
            (str(status), error, result_json, time.time(), str(status), job_id),
        ).rowcount
    return bool(n)


def write_progress(
    store: Store,
    job_id: int,
    *,
    progress: float,
    message: str | None,
    log_tail: str,
    metrics: list[tuple[int, str, float]],
) -> float | None:
    """One heartbeat of a running job: progress, log tail, new metric points.
    Returns the job's cancel_requested_at (None: keep going)."""
    rows = [{"job_id": job_id, "step": st, "name": nm, "value": v} for st, nm, v in metrics if not math.isnan(v)]
    with store.write() as s:
        conn = s.connection()
        conn.exec_driver_sql(
            "UPDATE jobs SET progress = ?, message = ?, log_tail = ?, heartbeat_at = ? WHERE id = ?",
            (progress, message, log_tail, time.time(), job_id),
        )
        if rows:
            conn.exec_driver_sql(
                "INSERT INTO job_metrics (job_id, step, name, value) VALUES (?, ?, ?, ?)",
                [(r["job_id"], r["step"], r["name"], r["value"]) for r in rows],
            )
        return conn.exec_driver_sql("SELECT cancel_requested_at FROM jobs WHERE id = ?", (job_id,)).scalar_one_or_none()
