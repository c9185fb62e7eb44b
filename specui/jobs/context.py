"""Inside a job's process: what a job function gets (``JobContext``).  How one claimed job
runs to its recorded end is ``specui.jobs.execute.run_job``."""

from __future__ import annotations

import collections
import logging
import math
import threading
from pathlib import Path
from typing import Any

from specui.store import Job, Store

log = logging.getLogger(__name__)


class JobCancelled(Exception):
    """Raised in a job to end it as cancelled (also what SIGTERM becomes)."""


class JobContext:
    """What a job function gets besides its parameters.  Calls are cheap (they
    buffer); a heartbeat thread writes the buffer to the store every
    ``heartbeat_s`` and reads the cancel flag."""

    MAX_LINE = 2000

    def __init__(
        self, store: Store, job: Job, *, heartbeat_s: float = 1.0, max_log_lines: int = 200
    ) -> None:
        assert job.id is not None
        self.store = store
        self.job_id: int = job.id
        self.params: dict[str, Any] = job.params
        self.checkpoint_dir: Path = store.jobs_dir / str(job.id)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._progress = job.progress
        self._message = job.message
        self._tail: collections.deque[str] = collections.deque(
            job.log_tail.splitlines(), maxlen=max_log_lines
        )
        self._metrics: list[tuple[int, str, float]] = []
        self._cancel_requested = job.cancel_requested_at is not None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def progress(self, fraction: float, message: str | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:  # also refuses NaN
            raise ValueError(f"progress must be in [0, 1], got {fraction}")
        with self._lock:
            self._progress = float(fraction)
            if message is not None:
                self._message = message[: self.MAX_LINE]

    def log(self, line: str) -> None:
        """Keep a line in the job's log tail (and the worker log file)."""
        lines = str(line).splitlines() or [""]
        with self._lock:
            self._tail.extend(ln[: self.MAX_LINE] for ln in lines)
        print(*lines, sep="\n", flush=True)  # stdout is the job's worker.log

    def metric(self, step: int, name: str, value: float) -> None:
        v = float(value)
        if math.isnan(v):  # SQLite stores NaN as NULL; say so instead of failing the batch
            self.log(f"metric {name} at step {step} is NaN (not stored)")
            return
        with self._lock:
            self._metrics.append((int(step), name, v))

    def cancelled(self) -> bool:
        """True once someone asked to cancel this job (poll it between steps)."""
        return self._cancel_requested

    def raise_if_cancelled(self) -> None:
        if self._cancel_requested:
            raise JobCancelled("cancelled")

    def flush(self) -> None:
        with self._lock:
            progress, message, tail = self._progress, self._message, "\n".join(self._tail)
            metrics, self._metrics = self._metrics, []
        try:
            flag = self.store.write_job_progress(
                self.job_id, progress=progress, message=message, log_tail=tail, metrics=metrics
            )
        except Exception:
            with self._lock:  # keep the points for the next beat
                self._metrics[:0] = metrics
            raise
        if flag is not None:
            self._cancel_requested = True

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.flush()
            except Exception:  # a locked or full disk must not kill the job; retry next beat
                log.exception("job %s: heartbeat failed", self.job_id)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._beat, name=f"job-{self.job_id}-heartbeat", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()
