"""The job system: queue, runner, worker processes, cancel, dead workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from specui.errors import SpecUIError
from specui.jobs import Runner, queue
from specui.store import JobStatus, Store, pid_alive

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "specui.db"


def _wait(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _runner(db: Path, **kw) -> Runner:
    kw.setdefault("poll_s", 0.05)
    kw.setdefault("heartbeat_s", 0.1)
    return Runner(db, **kw)


def test_jobs_run_in_their_own_processes_with_progress_metrics_and_errors(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECUI_MAX_JOBS", "2")
    store = Store(db)
    ok = queue.enqueue(store, "count", {"n": 5, "interval_s": 0.02}, owner="session-a")
    bad = queue.enqueue(store, "count", {"n": 5, "fail_at": 2, "interval_s": 0.01})
    alien = queue.enqueue(store, "no-such-kind", {}, check_kind=False)
    third = queue.enqueue(store, "sleep", {"seconds": 0.3})
    assert [j.status for j in queue.list_jobs(store)] == [JobStatus.QUEUED] * 4

    runner = _runner(db)
    assert runner.max_jobs == 2
    runner.run(until_idle=True, timeout_s=40)

    # Never more than two at once, and two did overlap.
    ran = [store.get_job(j.id) for j in (ok, bad, third)]
    events = sorted(
        [(j.started_at, 1) for j in ran] + [(j.ended_at, -1) for j in ran],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2 and store.get_job(third.id).status == JobStatus.DONE

    job = store.get_job(ok.id)
    assert job.status == JobStatus.DONE and job.error is None
    assert job.progress == 1.0 and job.message == "5/5"
    assert job.result == {"counted": 5}
    assert job.pid not in (None, os.getpid())  # ran in a process of its own
    assert job.log_tail.splitlines() == [f"count {i}" for i in range(5)]
    assert [(m.step, m.value) for m in store.job_metrics(ok.id, "square")] == [
        (i, float(i * i)) for i in range(5)
    ]
    assert len(store.job_metrics(ok.id)) == 10
    assert (store.jobs_dir / str(ok.id) / "worker.log").read_text().count("count ") == 5

    failed = store.get_job(bad.id)
    assert (
        failed.status == JobStatus.FAILED
        and failed.error == "RuntimeError: asked to fail at step 2"
    )
    assert failed.progress == pytest.approx(0.4) and "Traceback" in failed.log_tail
    unknown = store.get_job(alien.id)
    assert unknown.status == JobStatus.FAILED and "unknown job kind 'no-such-kind'" in unknown.error
    store.close()


def test_enqueue_refuses_unknown_kinds_and_bad_params(db: Path) -> None:
    with Store(db) as store:
        with pytest.raises(SpecUIError, match="unknown job kind 'trian'"):
            queue.enqueue(store, "trian", {})
        with pytest.raises(SpecUIError, match="JSON"):
            queue.enqueue(store, "count", {"n": float("nan")})
        with pytest.raises(SpecUIError, match="unknown job id 77"):
            queue.cancel(store, 77)


def test_cancelled_queued_job_never_starts(db: Path) -> None:
    store = Store(db)
    job = queue.enqueue(store, "count", {"n": 3}, owner="session-a")
    with pytest.raises(SpecUIError, match="another session"):
        queue.cancel(store, job.id, requester="session-b")
    assert queue.cancel(store, job.id, requester="session-a").status == JobStatus.CANCELLED
    _runner(db).run(until_idle=True, timeout_s=10)
    got = store.get_job(job.id)
    assert got.status == JobStatus.CANCELLED and got.started_at is None and got.pid is None
    store.close()


def test_running_job_that_polls_sees_the_cancel_flag(db: Path) -> None:
    store = Store(db)
    job = queue.enqueue(store, "count", {"n": 10_000, "interval_s": 0.01})
    runner = _runner(db, cancel_grace_s=60)  # no SIGTERM: the job stops by itself
    runner.start()
    try:
        _wait("progress", lambda: store.get_job(job.id).progress > 0)
        queue.cancel(store, job.id)
        _wait("cancelled", lambda: store.get_job(job.id).status == JobStatus.CANCELLED)
    finally:
        runner.stop()
    got = store.get_job(job.id)
    assert got.error is None and got.result["counted"] < 10_000 and "cancelled at" in got.log_tail
    store.close()


def test_running_job_that_ignores_cancel_gets_sigterm_after_the_grace(db: Path) -> None:
    store = Store(db)
    job = queue.enqueue(store, "sleep", {"seconds": 60})
    runner = _runner(db, cancel_grace_s=0.3)
    runner.start()
    try:
        _wait("the sleeper to start", lambda: "sleeping" in store.get_job(job.id).log_tail)
        t0 = time.monotonic()
        queue.cancel(store, job.id)
        _wait("cancelled", lambda: store.get_job(job.id).status == JobStatus.CANCELLED, timeout=20)
        assert time.monotonic() - t0 < 15
    finally:
        runner.stop()
    assert "terminated by signal 15" in store.get_job(job.id).error
    store.close()


def test_max_jobs_setting_is_checked(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECUI_MAX_JOBS", "zero")
    with pytest.raises(SpecUIError, match="SPECUI_MAX_JOBS"):
        Runner(db)
    monkeypatch.setenv("SPECUI_MAX_JOBS", "0")
    with pytest.raises(SpecUIError, match="at least 1"):
        Runner(db)


def test_worker_killed_with_sigkill_is_failed_by_its_runner(db: Path) -> None:
    store = Store(db)
    job = queue.enqueue(store, "sleep", {"seconds": 60})
    runner = _runner(db)
    runner.start()
    try:
        _wait("the worker", lambda: "sleeping" in store.get_job(job.id).log_tail)
        os.kill(store.get_job(job.id).pid, signal.SIGKILL)
        _wait("failed", lambda: store.get_job(job.id).status == JobStatus.FAILED)
    finally:
        runner.stop()
    # "(signal 9)" from the runner's poll, or "(pid N)" when its reaper got there first.
    assert store.get_job(job.id).error.startswith("worker died (")
    store.close()


def test_runner_and_worker_killed_with_sigkill_leave_the_job_failed_after_restart(db: Path) -> None:
    store = Store(db)
    job = queue.enqueue(store, "sleep", {"seconds": 60})
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.runner",
            "--db",
            str(db),
            "--poll",
            "0.05",
            "--heartbeat",
            "0.1",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait("the worker", lambda: "sleeping" in store.get_job(job.id).log_tail)
        worker_pid = store.get_job(job.id).pid
        assert worker_pid not in (runner.pid, os.getpid())
    finally:
        runner.send_signal(signal.SIGKILL)  # the runner first: nobody is left to notice
        runner.wait()
    os.kill(worker_pid, signal.SIGKILL)
    _wait("the worker to die", lambda: not pid_alive(worker_pid))
    assert store.get_job(job.id).status == JobStatus.RUNNING  # what the dead left behind
    store.close()

    with Store(db) as restarted:  # the next start of the dashboard or runner
        got = restarted.get_job(job.id)
        assert got.status == JobStatus.FAILED and got.error == f"worker died (pid {worker_pid})"
        assert got.ended_at is not None
