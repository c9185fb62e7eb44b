"""Runs queued jobs, each in a process of its own, so the dashboard never blocks.

Job kinds are plain functions registered by decorator::

    from workers.runner import JobContext, job_kind

    @job_kind("train")
    def train(params: dict, ctx: JobContext) -> dict:
        for step in range(n):
            if ctx.cancelled():
                break
            ...
            ctx.metric(step, "loss", loss)
            ctx.progress((step + 1) / n, f"step {step + 1}/{n}")
        return {"checkpoint": str(ctx.checkpoint_dir / "final")}

A module that registers kinds must be importable by the runner: list it in
``KIND_MODULES``, in ``$SPECUI_JOB_MODULES`` (comma-separated) or pass
``--import MODULE``.

Process layout: a *runner* (``Runner``: a thread in the UI, or
``python -m workers.runner``) claims jobs and starts one child process per job
(``python -m workers.runner --job ID``), at most ``max_jobs`` at once (default
``$SPECUI_MAX_JOBS`` or 1; the limit counts running jobs in the store, so it
holds across runners and restarts).  The child runs the function, beats a
heartbeat (progress, log tail and metrics go with it, once a second) and writes
the final status.  Children get their own session: a runner that exits or is
killed leaves its jobs running to completion.

Cancel: ``Store.cancel_job`` sets a flag the job reads through
``ctx.cancelled()``; after ``cancel_grace_s`` the runner sends SIGTERM to the
child's process group (the child turns it into ``JobCancelled``), and SIGKILL
after ``kill_grace_s`` more.  A child that dies without writing its status
(``kill -9``, a crash) is marked failed ("worker died") by its runner, or by the
next store open when the runner died too.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specui.errors import SpecUIError
from specui.registry import Registry
from specui.store import Job, JobStatus, Store

log = logging.getLogger(__name__)

JobFn = Callable[[dict[str, Any], "JobContext"], Any]

# Modules that register job kinds; a missing one is skipped (not built yet).
KIND_MODULES = ["workers.builtin", "specui.training.job", "specui.bench_job"]


@dataclass(frozen=True)
class KindSpec:
    kind: str
    fn: JobFn
    module: str  # what a child imports to find fn again


def _same_fn(old: KindSpec, new: KindSpec) -> bool:
    """A module imported twice registers the same function again: that is no clash."""
    return (old.module, old.fn.__qualname__) == (new.module, new.fn.__qualname__)


KINDS: Registry[KindSpec] = Registry(
    "job kind", modules=KIND_MODULES, env="SPECUI_JOB_MODULES", skip_missing=True,
    same=_same_fn, describe=lambda k: f"by {k.module}.{k.fn.__qualname__}",
)  # fmt: skip


def job_kind(kind: str) -> Callable[[JobFn], JobFn]:
    """Register ``fn(params, ctx)`` as the function that runs jobs of ``kind``."""

    def wrap(fn: JobFn) -> JobFn:
        KINDS.register(kind, KindSpec(kind, fn, fn.__module__))
        return fn

    return wrap


def load_kinds(extra_modules: Iterable[str] = ()) -> list[str]:
    """Import the modules that register kinds (KIND_MODULES, $SPECUI_JOB_MODULES,
    ``extra_modules``); returns the registered kinds."""
    KINDS.load(extra_modules)
    return sorted(KINDS.names())


def _import_modules(names: Iterable[str]) -> None:
    """Only these (a child imports just its kind's module: some import torch)."""
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            log.debug("job module %s not found; skipped", name)


def registered_kinds() -> list[str]:
    """The kinds registered so far (importing nothing)."""
    return sorted(KINDS.names(load=False))


class JobCancelled(Exception):
    """Raised in a job to end it as cancelled (also what SIGTERM becomes)."""


def _max_jobs_default() -> int:
    raw = os.environ.get("SPECUI_MAX_JOBS", "1")
    try:
        n = int(raw)
    except ValueError:
        raise SpecUIError(f"SPECUI_MAX_JOBS must be a whole number, got {raw!r}") from None
    if n < 1:
        raise SpecUIError(f"SPECUI_MAX_JOBS must be at least 1, got {n}")
    return n


# --- inside the job's process -----------------------------------------------------------


class JobContext:
    """What a job function gets besides its parameters.  Calls are cheap (they
    buffer); a heartbeat thread writes the buffer to the store every
    ``heartbeat_s`` and reads the cancel flag."""

    MAX_LINE = 2000

    def __init__(self, store: Store, job: Job, *, heartbeat_s: float = 1.0, max_log_lines: int = 200) -> None:
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
        self._tail: collections.deque[str] = collections.deque(job.log_tail.splitlines(), maxlen=max_log_lines)
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
            flag = self.store.write_job_progress(self.job_id, progress=progress, message=message, log_tail=tail, metrics=metrics)
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
        self._thread = threading.Thread(target=self._beat, name=f"job-{self.job_id}-heartbeat", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()


def _raise_cancelled(signum: int, frame: Any) -> None:
    raise JobCancelled(f"terminated by signal {signum}")


def run_job(db_path: str | os.PathLike[str], job_id: int, modules: Iterable[str] = (), *, heartbeat_s: float = 1.0) -> JobStatus:
    """Run one claimed job in this process (what a runner's child does).
    ``modules``: where its kind is registered; only those are imported (some kind
    modules import torch, which a ``count`` job should not wait for)."""
    store = Store(db_path)
    modules = list(modules)
    if modules:
        _import_modules(modules)
    else:
        load_kinds()
    job = store.get_job(job_id)
    if job.status != JobStatus.RUNNING:
        log.warning("job %s is %s, not running; nothing to do", job_id, job.status)
        return JobStatus(job.status)
    store.set_job_pid(job_id, os.getpid())
    spec = KINDS.get(job.kind, load=False)
    if spec is None:
        store.finish_job(job_id, JobStatus.FAILED, error=f"unknown job kind {job.kind!r}")
        return JobStatus.FAILED
    ctx = JobContext(store, job, heartbeat_s=heartbeat_s)
    ctx.start()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_cancelled)
    status, error, result = JobStatus.DONE, None, None
    try:
        result = spec.fn(job.params, ctx)
        if ctx.cancelled():
            status = JobStatus.CANCELLED
    except JobCancelled as e:
        status, error = JobStatus.CANCELLED, str(e)
    except BaseException as e:
        status, error = JobStatus.FAILED, f"{type(e).__name__}: {e}"
        ctx.log(traceback.format_exc())
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            ctx.close()
        finally:
            store.finish_job(job_id, status, error=error, result=result)
            store.close()
    return status


# --- the runner (supervisor) ------------------------------------------------------------


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
    calling thread (``python -m workers.runner``, tests)."""

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
            self.store.finish_job(job.id, JobStatus.FAILED, error=f"cannot create the job folder {job_dir}: {e}")
            return
        cmd = [sys.executable, "-m", "workers.runner", "--db", str(self.store.path), "--job", str(job.id), "--heartbeat", str(self.heartbeat_s)]
        spec = KINDS.get(job.kind, load=False)
        if spec is not None:
            cmd += ["--import", spec.module]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The checkout first on the path, so a child finds `workers` even uninstalled.
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
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
                elif ch.term_sent_at is not None and ch.kill_sent_at is None and now - ch.term_sent_at >= self.kill_grace_s:
                    os.killpg(ch.proc.pid, signal.SIGKILL)
                    ch.kill_sent_at = now
            except ProcessLookupError:
                pass  # already gone; _collect records it


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.runner", description="Run queued SpecUI jobs in worker processes")
    p.add_argument("--db", help="store file (default: $SPECUI_DATA_DIR/specui.db)")
    p.add_argument("--max-jobs", type=int, help="jobs run at once (default: $SPECUI_MAX_JOBS or 1)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between queue polls")
    p.add_argument("--cancel-grace", type=float, default=10.0, help="seconds between a cancel request and SIGTERM")
    p.add_argument("--until-idle", action="store_true", help="exit when nothing is queued or running")
    p.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE", help="also import MODULE (registers job kinds)")
    p.add_argument("--heartbeat", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)  # child mode: run this claimed job
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.job is not None:
            status = run_job(args.db or _default_db(), args.job, args.modules, heartbeat_s=args.heartbeat)
            return 0 if status == JobStatus.DONE else 1
        runner = Runner(args.db, max_jobs=args.max_jobs, poll_s=args.poll, cancel_grace_s=args.cancel_grace, modules=tuple(args.modules), heartbeat_s=args.heartbeat)
        # SIGTERM / Ctrl-C stop claiming; running jobs carry on in their own processes.
        signal.signal(signal.SIGTERM, lambda *_: runner.stop(wait=False))
        print(f"runner: {runner.store.path}, up to {runner.max_jobs} job(s), kinds: {', '.join(runner.kinds)}", flush=True)
        try:
            runner.run(until_idle=args.until_idle)
        except KeyboardInterrupt:
            runner.stop(wait=False)
        return 0
    except SpecUIError as e:
        print(f"runner: error: {e}", file=sys.stderr)
        return 2


def _default_db() -> str:
    from specui.store import default_db_path

    return str(default_db_path())


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: job modules register
    # their kinds in ``workers.runner``, which would otherwise be a second module.
    from workers.runner import main as _main

    sys.exit(_main())
