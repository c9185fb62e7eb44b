"""The "train" job kind: the dashboard starts, watches and cancels training through
the job queue (``specui.jobs``), which runs this in a worker process of its own.

``params`` are ``TrainConfig`` fields (``algorithm`` required).  ``out``
defaults to the job's own folder; a job always resumes from its last
checkpoint, so a job restarted after a crash picks up where it stopped.
Cancelling saves a checkpoint at the current step and ends the job.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from specui.jobs import JobContext, job_kind
from specui.store import Job

# How often a running stage writes its count and ETA into the job's log (its message, which
# the Train tab shows, follows every report).
LOG_EVERY_S = 60.0

# A job's run folder when its params name none: inside the job's own folder.
DEFAULT_OUT = "drafter"


def output_folder(job: Job, jobs_dir: Path) -> Path:
    """The run folder a train job writes (``out``: its params', else the job folder's
    default; ``jobs_dir``: the store's ``jobs_dir``)."""
    out = job.params.get("out") or (job.result or {}).get("out")
    return Path(out) if out else jobs_dir / str(job.id) / DEFAULT_OUT


@job_kind("train")
def train_job(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    # Imported here: registering the kind (the UI, `specui jobs`) must not import torch.
    from specui.training.config import TrainConfig
    from specui.training.hooks import TrainHooks
    from specui.training.loop import train
    from specui.training.progress import StageClock

    p = dict(params)
    p.setdefault("out", str(ctx.checkpoint_dir / DEFAULT_OUT))
    p["resume"] = True
    cfg = TrainConfig.from_dict(p)

    clocks: dict[str, StageClock] = {}  # the rate and ETA of each stage, from its first report
    logged: dict[str, float] = {}  # when each stage last wrote its line into the log

    def report(what: str, done: int, total: int, label: str | None = None, extra: str = "") -> str:
        """The stage's line (count, rate, ETA) as the job's message, and now and then in its
        log: when the stage starts, once a minute, and when it ends."""
        line = clocks.setdefault(what, StageClock(what)).report(done, total, label) + extra
        now = time.monotonic()
        if what not in logged or done >= total or now - logged[what] >= LOG_EVERY_S:
            logged[what] = now
            ctx.log(line)
        return line

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        extra = f" · loss {metrics['loss']:.4f}" if "loss" in metrics else ""
        ctx.progress(min(1.0, step / total), report("training", step, total, "step", extra))

    def metric(step: int, name: str, value: float) -> None:
        if not math.isnan(value):  # an empty metric (e.g. no complete block) is not a data point
            ctx.metric(step, name, value)

    def stage(what: str, done: int, total: int) -> None:
        if total > 0:  # nothing to do (every response cached): the run's log already says so
            ctx.progress(0.0, report(what, done, total))

    def before_checkpoint(step: int) -> None:
        # The heartbeat writes metrics only every second or so; a worker killed after a checkpoint
        # must not leave the curve short of the step it resumes from.
        try:
            ctx.flush()
        except Exception as e:  # a locked or full disk: the points stay queued for the next beat
            ctx.log(f"metrics not written before the step-{step} checkpoint: {e}")

    result = train(
        cfg,
        TrainHooks(
            progress=progress,
            log=ctx.log,
            metric=metric,
            cancelled=ctx.cancelled,
            stage=stage,
            checkpoint=before_checkpoint,
        ),
    )
    metrics = {
        k: v for k, v in result.metrics.items() if not math.isnan(v)
    }  # the result is strict JSON
    return {
        "out": str(result.out),
        "step": result.step,
        "status": result.status,
        "metrics": metrics,
    }
