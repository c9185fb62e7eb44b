"""How one claimed job runs to its recorded end, in its own process (``run_job``, what
``python -m workers.runner --job ID`` does).

Apart from ``specui.jobs.context`` so that imports go one way: the kinds' module names the
context their functions get, and this module reads both.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import traceback
from collections.abc import Iterable
from typing import Any

from specui.jobs.context import JobCancelled, JobContext
from specui.jobs.kinds import KINDS, load_kinds
from specui.store import JobStatus, Store

log = logging.getLogger(__name__)


def _raise_cancelled(signum: int, frame: Any) -> None:
    raise JobCancelled(f"terminated by signal {signum}")


def run_job(
    db_path: str | os.PathLike[str],
    job_id: int,
    modules: Iterable[str] = (),
    *,
    heartbeat_s: float = 1.0,
) -> JobStatus:
    """Run one claimed job in this process (what a runner's child does).
    ``modules``: where its kind is registered; only those are imported (some kind
    modules import torch, which a ``count`` job should not wait for)."""
    store = Store(db_path)
    modules = list(modules)
    if modules:
        KINDS.import_only(modules)
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
