"""Background jobs: queued in the store, each run in a worker process of its own, so the
dashboard never blocks.

Job kinds are plain functions registered by decorator::

    from specui.jobs import JobContext, job_kind

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

from specui.jobs.context import JobCancelled, JobContext
from specui.jobs.execute import run_job
from specui.jobs.kinds import KIND_MODULES, KINDS, job_kind, load_kinds, registered_kinds
from specui.jobs.runner import Runner

__all__ = [
    "KINDS",
    "KIND_MODULES",
    "JobCancelled",
    "JobContext",
    "Runner",
    "job_kind",
    "load_kinds",
    "registered_kinds",
    "run_job",
]
