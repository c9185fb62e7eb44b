"""The supervisor: claims queued jobs and runs each in a worker process of its own
(``python -m workers.runner --job ID``), so the dashboard never blocks; see ``specui.jobs``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from specui.errors import SpecUIError
from specui.jobs.kinds import KINDS, load_kinds
from specui.store import Job, JobStatus, Store

log = logging.getLogger(__name__)

# The worker process's entry point (a module name, started as `python -m`, never imported).
WORKER_MODULE = "workers.runner"


def _max_jobs_default() -> int:
    raw = os.environ.get("SPECUI_MAX_JOBS", "1")
    try:
        n = int(raw)
    except ValueError:
        raise SpecUIError(f"SPECUI_MAX_JOBS must be a whole number, got {raw!r}") from None
    if n < 1:
        raise SpecUIError(f"SPECUI_MAX_JOBS must be at least 1, got {n}")
    return n


@dataclass
class _Child:
    job_id: int
    proc: subprocess.Popen[bytes]
    log_file: IO[bytes]
    term_sent_at: float | None = None
    kill_sent_at: float | None = None


@dataclass
class Runner:
    """Claims queued jobs and runs each in a child process.

    ``Runner(path).start()`` runs it in a daemon thread (the UI); ``run()`` in the
    calling thread (``python -m workers.runner``, ``specui jobs worker``, tests)."""

    db_path: str | os.PathLike[str] | None = None
    max_jobs: int | None = None
    poll_s: float = 1.0
    cancel_grace_s: float = 10.0
    kill_grace_s: float = 10.0
    modules: tuple[str, ...] = ()
    heartbeat_s: float = 1.0
    store: Store = field(init=False)
    children: dict[int, _Child] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_jobs is None:
            self.max_jobs = _max_jobs_default()
        if self.max_jobs < 1:
            raise SpecUIError(f"max_jobs must be at least 1, got {self.max_jobs}")
        self.store = Store(self.db_path)
        self.kinds = load_kinds(self.modules)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        """One round: collect finished children, escalate cancels, start jobs."""
        self._collect()
        self._escalate()
        self.store.reap_dead()
        while len(self.children) < (self.max_jobs or 1):
            job = self.store.claim_next_job(kinds=self.kinds, max_running=self.max_jobs)
            if job is None:
                break
            self._spawn(job)

    def idle(self) -> bool:
        return not self.children and not self.store.list_jobs(status=JobStatus.QUEUED, limit=1)

    def run(self, *, until_idle: bool = False, timeout_s: float | None = None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stop.is_set():
            self.tick()
            if until_idle and self.idle():
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"jobs still running after {timeout_s} s")
            self._stop.wait(self.poll_s)

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name="specui-job-runner", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, *, cancel_running: bool = False, wait: bool = True) -> None:
        """Stop claiming jobs.  Running children carry on (and record their end)
        unless ``cancel_running``."""
        self._stop.set()
        if cancel_running:
            for jid in list(self.children):
                self.store.cancel_job(jid, force=True)
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _spawn(self, job: Job) -> None:
        assert job.id is not None
        job_dir = self.store.jobs_dir / str(job.id)
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            log_file = open(job_dir / "worker.log", "ab")  # noqa: SIM115 -- closed in _collect
        except OSError as e:
            self.store.finish_job(
                job.id, JobStatus.FAILED, error=f"cannot create the job folder {job_dir}: {e}"
            )
            return
        cmd = [
            sys.executable,
            "-m",
            WORKER_MODULE,
            "--db",
            str(self.store.path),
            "--job",
            str(job.id),
            "--heartbeat",
            str(self.heartbeat_s),
        ]
        spec = KINDS.get(job.kind, load=False)
        if spec is not None:
            cmd += ["--import", spec.module]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The checkout first on the path, so a child finds `workers` even uninstalled.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            log_file.close()
            self.store.finish_job(job.id, JobStatus.FAILED, error=f"cannot start the worker: {e}")
            return
        self.store.set_job_pid(job.id, proc.pid)
        self.children[job.id] = _Child(job.id, proc, log_file)
        log.info("job %s (%s) started as pid %s", job.id, job.kind, proc.pid)

    def _collect(self) -> None:
        for jid, ch in list(self.children.items()):
            rc = ch.proc.poll()
            if rc is None:
                continue
            ch.log_file.close()
            del self.children[jid]
            job = self.store.get_job(jid)
            if job.status != JobStatus.RUNNING:
                continue  # it wrote its own end
            how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
            if job.cancel_requested_at is not None:
                self.store.finish_job(jid, JobStatus.CANCELLED, error=f"terminated ({how})")
            else:
                self.store.finish_job(jid, JobStatus.FAILED, error=f"worker died ({how})")

    def _escalate(self) -> None:
        now = time.time()
        for jid, ch in self.children.items():
            requested = self.store.get_job(jid).cancel_requested_at
            if requested is None:
                continue
            try:
                if ch.term_sent_at is None and now - requested >= self.cancel_grace_s:
                    os.killpg(ch.proc.pid, signal.SIGTERM)  # the group: tools the job started too
                    ch.term_sent_at = now
                elif (
                    ch.term_sent_at is not None
                    and ch.kill_sent_at is None
                    and now - ch.term_sent_at >= self.kill_grace_s
                ):
                    os.killpg(ch.proc.pid, signal.SIGKILL)
                    ch.kill_sent_at = now
            except ProcessLookupError:
                pass  # already gone; _collect records it
