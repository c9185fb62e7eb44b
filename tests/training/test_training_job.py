"""The "train" job kind through the real queue and runner: start, watch, cancel, resume."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

from specui.algorithms.checkpoint import validate_checkpoint
from specui.jobs import Runner, queue
from specui.store import JobStatus, Store
from specui.training.state import latest_checkpoint


def _wait(what: str, cond: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_train_job_reports_progress_cancels_and_resumes(
    tmp_path: Path, fixture_dir: Path, fixture_verifier, monkeypatch
) -> None:
    monkeypatch.setenv("SPECUI_JOB_MODULES", "specui.jobs.training")
    rng = random.Random(1)
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt_ids": [rng.randrange(500) for _ in range(10)]}) for _ in range(12)]
    prompts.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "drafter"
    params = {
        "algorithm": "dflash",
        "verifier": str(fixture_dir / "verifier"),
        "prompts": str(prompts),
        "out": str(out),
        "aux_layer_ids": [1, 3, 4],
        "max_new_tokens": 32,
        "steps": 100000,
        "log_every": 2,
        "checkpoint_every": 1000,
        "lr": 3e-3,
        "warmup_steps": 1,
        "threads": 1,
    }
    store = Store(tmp_path / "specui.db")
    job = queue.enqueue(store, "train", params)
    runner = Runner(store.path, poll_s=0.05, heartbeat_s=0.1, cancel_grace_s=60)
    runner.start()
    try:
        _wait("loss metrics", lambda: len(store.job_metrics(job.id, "loss")) >= 2)
        running = store.get_job(job.id)
        assert running.status == JobStatus.RUNNING and 0 < running.progress < 1
        # The stage, its count, rate and ETA, as the Train tab shows them while the job runs.
        line = (
            r"step \d+/100000 · [\d.]+ (?:steps/s|s/step) · ETA [\d.]+ (?:s|min|h) · "
            r"loss [\d.]+"
        )
        assert re.fullmatch(line, running.message), running.message
        from specui.ui.train_view import job_view

        # the job has moved on since: a later step
        head = job_view(store, f"{job.id}: train")[0]
        assert re.search(r"\*\*running\*\* · \d+% · step \d+/100000 · .+ · ETA .+ · loss ", head)
        # ... and the log says each stage: what generation costs, its count and rate, the steps.
        tail = running.log_tail
        plan = r"self-distillation: 0 of (\d+) responses cached; generating \1 \(up to 32 new"
        n = re.search(plan, tail)
        assert n, tail  # the train split of the 12
        assert re.search(rf"^generating responses 0/{n[1]}$", tail, re.M), tail
        rate = r"[\d.]+ (?:prompts/s|s/prompt)"
        assert re.search(rf"^generating responses {n[1]}/{n[1]} · {rate}$", tail, re.M), tail
        assert re.search(r"^step 0/100000$", tail, re.M), tail
        queue.cancel(store, job.id)
        _wait("the cancel", lambda: store.get_job(job.id).status != JobStatus.RUNNING)
        cancelled = store.get_job(job.id)
        assert cancelled.status == JobStatus.CANCELLED, cancelled.error
        stopped_at = cancelled.result["step"]
        assert latest_checkpoint(out).step == stopped_at > 0  # cancelling saved where it stopped

        # The same run again, now with an end: it resumes from the cancel's checkpoint.
        again = queue.enqueue(store, "train", {**params, "steps": stopped_at + 4})
        _wait(
            "the resumed job",
            lambda: store.get_job(again.id).status not in (JobStatus.QUEUED, JobStatus.RUNNING),
        )
    finally:
        runner.stop()
    done = store.get_job(again.id)
    assert done.status == JobStatus.DONE, done.error or done.log_tail
    assert done.result["step"] == stopped_at + 4
    assert f"resuming from {out / 'checkpoints'}" in done.log_tail
    assert validate_checkpoint(out, fixture_verifier) == []
    store.close()


def test_train_job_with_bad_params_fails_with_the_message(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECUI_JOB_MODULES", "specui.jobs.training")
    store = Store(tmp_path / "specui.db")
    job = queue.enqueue(store, "train", {"algorithm": "medusa"})
    Runner(store.path, poll_s=0.05, heartbeat_s=0.1).run(until_idle=True, timeout_s=60)
    failed = store.get_job(job.id)
    assert failed.status == JobStatus.FAILED
    assert "unknown algorithm 'medusa'" in failed.error
    store.close()
