"""Built-in job kinds: trivial ones for tests and for checking a runner works."""

from __future__ import annotations

import time
from typing import Any

from specui.jobs.context import JobContext
from specui.jobs.kinds import job_kind


@job_kind("count")
def count(params: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    """Count to ``n`` (one step per ``interval_s``), reporting progress, a log line
    and the metrics ``count`` and ``square`` per step; polls cancel between steps.
    ``fail_at``: raise at that step (tests the failure path)."""
    n = int(params.get("n", 10))
    interval = float(params.get("interval_s", 0.1))
    fail_at = params.get("fail_at")
    for i in range(n):
        if ctx.cancelled():
            ctx.log(f"cancelled at {i}")
            return {"counted": i}
        if fail_at is not None and i == int(fail_at):
            raise RuntimeError(f"asked to fail at step {i}")
        ctx.metric(i, "count", i)
        ctx.metric(i, "square", i * i)
        ctx.log(f"count {i}")
        ctx.progress((i + 1) / n, f"{i + 1}/{n}")
        time.sleep(interval)
    return {"counted": n}


@job_kind("sleep")
def sleep(params: dict[str, Any], ctx: JobContext) -> dict[str, float]:
    """Sleep ``seconds`` without polling cancel: only SIGTERM ends it early (tests
    the runner's escalation)."""
    seconds = float(params.get("seconds", 1.0))
    ctx.log(f"sleeping {seconds} s")
    ctx.progress(0.0, "sleeping")
    time.sleep(seconds)
    ctx.progress(1.0, "woke up")
    return {"slept": seconds}
