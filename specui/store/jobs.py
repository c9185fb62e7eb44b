"""The job queue: rows of the ``jobs`` table and their metric series.

Any process may enqueue, list and cancel; a runner (``specui.jobs.Runner``) claims
jobs.  Claiming is one ``BEGIN IMMEDIATE`` transaction that checks the running
count and flips the oldest queued job to running, so two runners (or a UI and a
CLI runner) never take the same job or exceed the concurrency limit together.
Which kinds exist is the runner's business: ``specui.jobs.queue.enqueue`` checks the
kind, then calls ``enqueue_job``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import func
from sqlmodel import col, select

from specui.store.db import Database, check_owner, get_row, to_json
from specui.store.schema import JOB_FINAL, Job, JobMetric, JobStatus


class JobStore(Database):
    """The job operations of ``specui.store.Store``."""

    @property
    def jobs_dir(self) -> Path:
        """Where job folders (checkpoints, worker logs) go: beside the database."""
        return self.path.parent / f"{self.path.stem}-jobs"

    # -- any process --

    def enqueue_job(
        self, kind: str, params: Mapping[str, Any] | None = None, *, owner: str | None = None
    ) -> Job:
        """Queue a job of ``kind`` (not checked here: see the module notes)."""
        params_json = to_json(dict(params or {}), "job parameters")
        job = Job(kind=kind, params_json=params_json, status=JobStatus.QUEUED, owner=owner)
        return self.insert(job)

    def get_job(self, job_id: int) -> Job:
        with self.read() as s:
            return get_row(s, Job, job_id, "job")

    def list_jobs(
        self,
        *,
        status: JobStatus | str | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs, newest first."""
        q = select(Job)
        if status is not None:
            q = q.where(Job.status == status)
        if kind is not None:
            q = q.where(Job.kind == kind)
        q = q.order_by(col(Job.id).desc())
        if limit is not None:
            q = q.limit(limit)
        with self.read() as s:
            return list(s.exec(q).all())

    def job_metrics(self, job_id: int, name: str | None = None) -> list[JobMetric]:
        q = select(JobMetric).where(JobMetric.job_id == job_id)
        if name is not None:
            q = q.where(JobMetric.name == name)
        q = q.order_by(col(JobMetric.name), col(JobMetric.step), col(JobMetric.id))
        with self.read() as s:
            return list(s.exec(q).all())

    def count_running_jobs(self) -> int:
        q = select(func.count()).select_from(Job).where(Job.status == JobStatus.RUNNING)
        with self.read() as s:
            return int(s.exec(q).one())

    def cancel_job(self, job_id: int, requester: str | None = None, *, force: bool = False) -> Job:
        """Cancel a job: a queued one at once; a running one by setting its cancel flag
        (the job sees ``ctx.cancelled()``; its runner sends SIGTERM after a grace
        period).  A finished job is returned unchanged."""
        now = time.time()
        with self.write() as s:
            job = get_row(s, Job, job_id, "job")
            check_owner("job", job_id, job.owner, requester, force)
            if job.status == JobStatus.QUEUED:
                job.status, job.ended_at = JobStatus.CANCELLED, now
            elif job.status == JobStatus.RUNNING and job.cancel_requested_at is None:
                job.cancel_requested_at = now
            s.add(job)
            return job

    # -- the runner and its workers --

    def claim_next_job(
        self,
        *,
        kinds: Collection[str] | None = None,
        max_running: int | None = None,
        pid: int | None = None,
    ) -> Job | None:
        """Atomically take the oldest queued job (status -> running, owned by ``pid``),
        or None when nothing is queued or ``max_running`` jobs already run.  A queued
        job of a kind not in ``kinds`` is failed rather than left queued forever."""
        now = time.time()
        queued = "SELECT id, kind FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1"
        with self.read() as s:  # an idle runner polls often: no write lock for nothing
            if s.connection().exec_driver_sql(queued).first() is None:
                return None
        with self.write() as s:
            conn = s.connection()
            if max_running is not None:
                count = "SELECT count(*) FROM jobs WHERE status = 'running'"
                if conn.exec_driver_sql(count).scalar_one() >= max_running:
                    return None
            while (row := conn.exec_driver_sql(queued).first()) is not None:
                job_id, kind = row
                if kinds is not None and kind not in kinds:
                    known = ", ".join(sorted(kinds))
                    conn.exec_driver_sql(
                        "UPDATE jobs SET status = 'failed', ended_at = ?, error = ? WHERE id = ?",
                        (now, f"unknown job kind {kind!r} (this runner knows: {known})", job_id),
                    )
                    continue
                conn.exec_driver_sql(
                    "UPDATE jobs SET status = 'running', pid = ?, hostname = ?, started_at = ?, "
                    "heartbeat_at = ? WHERE id = ?",
                    (
                        pid if pid is not None else os.getpid(),
                        socket.gethostname(),
                        now,
                        now,
                        job_id,
                    ),
                )
                return s.get(Job, job_id)
            return None

    def set_job_pid(self, job_id: int, pid: int) -> None:
        """Hand a running job to the process that runs it (its liveness now counts)."""
        with self.write() as s:
            s.connection().exec_driver_sql(
                "UPDATE jobs SET pid = ?, hostname = ?, heartbeat_at = ? "
                "WHERE id = ? AND status = 'running'",
                (pid, socket.gethostname(), time.time(), job_id),
            )

    def finish_job(
        self, job_id: int, status: JobStatus, *, error: str | None = None, result: Any = None
    ) -> bool:
        """Set a running job's final status; False when it was no longer running
        (e.g. already failed by a reaper).  A result that is not JSON is kept as its repr."""
        if status not in JOB_FINAL:
            raise ValueError(f"finish needs a final status, got {status}")
        try:
            result_json = None if result is None else json.dumps(result, allow_nan=False)
        except (TypeError, ValueError):
            result_json = json.dumps(repr(result))
        with self.write() as s:
            cur = s.connection().exec_driver_sql(
                "UPDATE jobs SET status = ?, error = ?, result_json = ?, ended_at = ?, "
                "progress = CASE WHEN ? = 'done' THEN 1.0 ELSE progress END "
                "WHERE id = ? AND status = 'running'",
                (str(status), error, result_json, time.time(), str(status), job_id),
            )
            return bool(cur.rowcount)

    def write_job_progress(
        self,
        job_id: int,
        *,
        progress: float,
        message: str | None,
        log_tail: str,
        metrics: list[tuple[int, str, float]],
    ) -> float | None:
        """One heartbeat of a running job: progress, log tail, new metric points
        (NaN points dropped).  Returns the job's cancel_requested_at (None: keep going)."""
        points = [(job_id, st, nm, v) for st, nm, v in metrics if not math.isnan(v)]
        with self.write() as s:
            conn = s.connection()
            conn.exec_driver_sql(
                "UPDATE jobs SET progress = ?, message = ?, log_tail = ?, heartbeat_at = ? "
                "WHERE id = ?",
                (progress, message, log_tail, time.time(), job_id),
            )
            if points:
                conn.exec_driver_sql(
                    "INSERT INTO job_metrics (job_id, step, name, value) VALUES (?, ?, ?, ?)",
                    points,
                )
            return conn.exec_driver_sql(
                "SELECT cancel_requested_at FROM jobs WHERE id = ?", (job_id,)
            ).scalar_one_or_none()
