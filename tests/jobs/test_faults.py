"""Real faults, nothing simulated: ``kill -9`` of job workers (training, benchmark)
and of the runner that started them, and a full disk (a size-limited tmpfs) under
training checkpoints, saved drafters and the SQLite store.

After every fault: the job / run carries a true final status with a reason (never
"running" after its process died), ``PRAGMA integrity_check`` is "ok", what was
stored before is all still there, and the last good checkpoint loads and resumes.

A vLLM server killed mid-benchmark is covered by
``tests/vllm/test_vllm.py::test_killing_the_server_mid_benchmark_fails_the_run_clearly``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from specui.algorithms import create_drafter
from specui.algorithms.checkpoint import load_drafter, load_model, save_drafter, validate_checkpoint
from specui.errors import SpecUIError
from specui.jobs import Runner, queue, run_job
from specui.store import JobStatus, RunStatus, Store, pid_alive
from specui.training.config import TrainConfig
from specui.training.hooks import TrainHooks
from specui.training.loop import train
from specui.training.state import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from specui.training.step import make_optimizer
from tests.support.paths import REPO
from tests.support.store_helpers import make_trace, record

AUX = [1, 3, 4]  # the fixture verifier has 6 layers; the fixtures' own aux layers
MASK = 511  # the prompts below never use it


# --- helpers ---------------------------------------------------------------------------------


def _wait(what: str, cond: Callable[[], bool], timeout: float = 180.0, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def _integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def _seeded_store(folder: Path) -> tuple[Path, Store, dict[str, Any]]:
    """A store at ``folder/specui.db`` with the history a fault must not touch (its snapshot)."""
    db = folder / "specui.db"
    store = Store(db)
    return db, store, _seed_history(store)


def _enqueue_training(store: Store, train_data, fixture_dir: Path, out: Path) -> tuple[Any, Path]:
    """A training job of the fixture drafter into ``out``, queued: (the job, ``out``)."""
    return queue.enqueue(store, "train", _train_params(train_data, fixture_dir, out)), out


def _seed_history(store: Store) -> dict[str, Any]:
    """What a store holds before the fault: two recorded runs, a finished job with
    metrics, a cancelled one.  Returns the snapshot to compare with afterwards."""
    for seed in (1, 2):
        run = store.create_run(
            verifier="v", prompt_set=f"before-{seed}", algorithm="dflash", drafter="d"
        )
        steps = [
            [make_trace(i, seed=seed) for i in range(40)],
            [make_trace(i, seed=seed + 10) for i in range(7)],
        ]
        record(store, run.id, steps, [1.0, 0.5], 4)
    done = queue.enqueue(store, "count", {"n": 3, "interval_s": 0})
    assert store.claim_next_job(kinds=["count"], pid=os.getpid()).id == done.id
    assert (
        run_job(store.path, done.id, ["specui.jobs.builtin"], heartbeat_s=0.05) == JobStatus.DONE
    )  # here, for real
    queue.cancel(store, queue.enqueue(store, "count", {"n": 3}).id)
    return _snapshot(store)


def _snapshot(
    store: Store, run_ids: list[int] | None = None, job_ids: list[int] | None = None
) -> dict[str, Any]:
    runs = store.list_runs() if run_ids is None else store.list_runs(ids=run_ids)
    jobs = store.list_jobs() if job_ids is None else [store.get_job(j) for j in job_ids]
    return {
        "runs": {r.id: r.model_dump() for r in runs},
        "steps": {r.id: [s.model_dump() for s in store.get_steps(r.id)] for r in runs},
        "results": {r.id: [x.model_dump() for x in store.get_results(r.id)] for r in runs},
        "jobs": {j.id: j.model_dump() for j in jobs},
        "metrics": {j.id: [m.model_dump() for m in store.job_metrics(j.id)] for j in jobs},
    }


def _unchanged(store: Store, before: dict[str, Any]) -> None:
    now = _snapshot(store, list(before["runs"]), list(before["jobs"]))
    assert now == before, "rows stored before the fault changed"


@pytest.fixture(scope="module")
def train_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Token-id prompts and a response / hidden-state cache the module's trainings share."""
    root = tmp_path_factory.mktemp("faults-train")
    rng = random.Random(3)
    with open(root / "prompts.jsonl", "w") as f:
        for i in range(12):
            f.write(
                json.dumps({"id": f"p{i}", "prompt_ids": [rng.randrange(500) for _ in range(10)]})
                + "\n"
            )
    return {"prompts": root / "prompts.jsonl", "cache": root / "cache"}


def _train_params(train_data: dict[str, Path], fixture_dir: Path, out: Path) -> dict[str, Any]:
    # A 1-layer DFlash on the 64-wide fixture verifier: ~50 k parameters, a checkpoint
    # every 2 steps, so a kill always finds checkpoints behind it and saves in flight.
    return {
        "algorithm": "dflash",
        "verifier": str(fixture_dir / "verifier"),
        "prompts": str(train_data["prompts"]),
        "out": str(out),
        "cache_dir": str(train_data["cache"]),
        "aux_layer_ids": AUX,
        "layers": 1,
        "mask_token_id": MASK,
        "max_new_tokens": 32,
        "steps": 1_000_000,
        "log_every": 2,
        "checkpoint_every": 2,
        "keep_checkpoints": 2,
        "lr": 3e-3,
        "warmup_steps": 1,
        "threads": 1,
    }


def _temps(out: Path) -> list[Path]:
    root = out / "checkpoints"
    return [p for p in root.iterdir() if p.name.startswith(".tmp")] if root.is_dir() else []


def _kill_mid_save(pid: int, out: Path, timeout: float = 120.0) -> Path:
    """SIGKILL ``pid`` while it writes a checkpoint: stop it (SIGSTOP) the moment a
    temporary checkpoint folder shows, and kill it only if the folder is still
    there (the save not finished), else let it go on and try the next save.
    Returns the half-written folder the kill left behind."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "never caught the worker mid-save"
        assert pid_alive(pid), "the worker died by itself"
        if _temps(out):
            os.kill(pid, signal.SIGSTOP)
            left = _temps(out)
            if left:
                os.kill(pid, signal.SIGKILL)
                return left[0]
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.002)


def _runner(db: Path, **kw: Any) -> Runner:
    kw.setdefault("poll_s", 0.05)
    kw.setdefault("heartbeat_s", 0.1)
    return Runner(db, **kw)


def _kill_leftover(store: Store, job_id: int) -> None:
    """A failed test must not leave an endless training worker behind (workers
    outlive their runner by design)."""
    job = store.get_job(job_id)  # only a job still running: a finished one's pid may be reused
    if (
        job.status == JobStatus.RUNNING
        and job.pid not in (None, os.getpid())
        and pid_alive(job.pid)
    ):
        os.kill(job.pid, signal.SIGKILL)


def _resume(store: Store, old_job_id: int, steps: int, timeout: float = 180.0) -> Any:
    """Resume a failed training job the way the Train tab's Resume button does (the old
    parameters again), with an end in sight, and run it to completion."""
    old = store.get_job(old_job_id)
    assert old.status in (JobStatus.FAILED, JobStatus.CANCELLED)
    job = queue.enqueue(store, old.kind, {**old.params, "resume": True, "steps": steps})
    _runner(store.path).run(until_idle=True, timeout_s=timeout)
    return store.get_job(job.id)


# --- 1. kill -9 of a training worker ---------------------------------------------------------


def test_sigkill_of_a_training_worker_mid_checkpoint(
    tmp_path: Path, train_data, fixture_dir, fixture_verifier
) -> None:
    db, store, before = _seeded_store(tmp_path)
    job, out = _enqueue_training(store, train_data, fixture_dir, tmp_path / "drafter")
    runner = _runner(db)
    runner.start()
    try:
        _wait(
            "two checkpoints",
            lambda: latest_checkpoint(out) is not None and latest_checkpoint(out).step >= 4,
        )
        worker = store.get_job(job.id).pid
        assert worker not in (None, os.getpid())
        half = _kill_mid_save(worker, out)
        _wait(
            "the job's end", lambda: store.get_job(job.id).status != JobStatus.RUNNING, timeout=30
        )
    finally:
        runner.stop()
        _kill_leftover(store, job.id)

    got = store.get_job(job.id)
    assert got.status == JobStatus.FAILED and got.ended_at is not None
    assert got.error.startswith("worker died ("), got.error  # "(signal 9)": its runner saw it go
    assert _integrity(db) == "ok"
    _unchanged(store, before)
    # The dead job's curves are kept, at least up to its last complete checkpoint (metrics are
    # committed before each checkpoint is written), so a resumed run continues a whole curve.
    ckpt = latest_checkpoint(out)
    losses = store.job_metrics(job.id, "loss")
    assert len(losses) >= 2 and ckpt is not None and max(m.step for m in losses) >= ckpt.step

    # The kill left a half-written checkpoint; only complete ones count, and the last loads.
    assert half.is_dir() and half.name.startswith(".tmp-step-")
    assert ckpt is not None and ckpt.path.name == f"step-{ckpt.step:08d}"
    assert validate_checkpoint(ckpt.path, fixture_verifier) == []
    load_drafter(ckpt.path, fixture_verifier)

    # Resume here rather than in another worker (a worker start costs ~30 s of imports on
    # two cores; test_runner_killed_... resumes through the queue).
    lines: list[str] = []
    cfg = TrainConfig.from_dict({**got.params, "resume": True, "steps": ckpt.step + 3})
    result = train(cfg, TrainHooks(log=lines.append))
    assert result.resumed_from == ckpt.step and result.step == ckpt.step + 3
    assert f"resuming from {ckpt.path} (step {ckpt.step})" in lines
    assert [c.step for c in list_checkpoints(out)][-1] == ckpt.step + 3
    assert not half.exists() and _temps(out) == []  # a save swept the dead one's leftovers
    assert validate_checkpoint(out, fixture_verifier) == []
    assert _integrity(db) == "ok"
    _unchanged(store, before)
    store.close()


# --- 2. kill -9 of a benchmark worker --------------------------------------------------------


def test_sigkill_of_a_benchmark_worker_leaves_an_incomplete_run(
    tmp_path: Path, fixture_dir
) -> None:
    db, store, before = _seeded_store(tmp_path)
    prompts = tmp_path / "bench.jsonl"
    rng = random.Random(5)
    prompts.write_text(
        "".join(
            json.dumps({"prompt_ids": [rng.randrange(500) for _ in range(8)]}) + "\n"
            for _ in range(40)
        )
    )
    params = {
        "verifier": str(fixture_dir / "verifier"),
        "drafters": ["ngram"],
        "prompts": str(prompts),
        "max_new_tokens": 200,
        "threads": 1,
    }
    job = queue.enqueue(store, "bench", params)
    runner = _runner(db)
    runner.start()
    try:

        def new_runs() -> list:
            return sorted(
                (r for r in store.list_runs() if r.id not in before["runs"]), key=lambda r: r.id
            )

        def recording() -> bool:
            new = new_runs()
            return len(new) == 2 and store.count_results([new[0].id])[new[0].id][1] >= 50

        _wait("the benchmark to store steps", recording)
        # The baseline and the drafter decode the prompts in turn: both runs are open.
        runs = new_runs()
        assert [r.algorithm for r in runs] == ["none", "ngram"]
        assert all(r.status == RunStatus.RUNNING for r in runs)
        committed = store.count_results([r.id for r in runs])
        os.kill(store.get_job(job.id).pid, signal.SIGKILL)
        _wait(
            "the job's end", lambda: store.get_job(job.id).status != JobStatus.RUNNING, timeout=30
        )
        # The runner's reaper (every tick) notices the runs' owner is gone.
        _wait(
            "the runs' end",
            lambda: all(store.get_run(r.id).status != RunStatus.RUNNING for r in runs),
            timeout=30,
        )
    finally:
        runner.stop()
        _kill_leftover(store, job.id)

    got = store.get_job(job.id)
    assert got.status == JobStatus.FAILED and got.error.startswith("worker died ("), got.error
    for run in runs:
        killed = store.get_run(run.id)
        assert (
            killed.status == RunStatus.INCOMPLETE
            and killed.error == "its process died before the run finished"
        )
        assert killed.ended_at is not None and killed.pid == got.pid
        finished, steps = store.count_results([run.id])[run.id]
        assert (
            steps >= committed[run.id][1] and finished >= committed[run.id][0]
        )  # every committed batch is kept
        rows = store.get_steps(run.id, 0)
        assert [r.step for r in rows] == list(range(len(rows)))  # whole batches only: no gaps
    assert [r.id for r in store.list_runs()] == [
        runs[1].id,
        runs[0].id,
        *sorted(before["runs"], reverse=True),
    ]
    assert _integrity(db) == "ok"
    _unchanged(store, before)
    with Store(db) as reopened:  # the next dashboard start agrees
        assert all(reopened.get_run(r.id).status == RunStatus.INCOMPLETE for r in runs)
    store.close()


# --- 4. the runner (the app) killed while its jobs run ---------------------------------------


def test_runner_killed_mid_job_a_new_runner_takes_over_without_running_anything_twice(
    tmp_path: Path, train_data, fixture_dir, fixture_verifier
) -> None:
    db, store, before = _seeded_store(tmp_path)
    train, out = _enqueue_training(store, train_data, fixture_dir, tmp_path / "drafter")
    waiting = queue.enqueue(store, "count", {"n": 3, "interval_s": 0.01})
    # The runner in a process (and session) of its own, as `python -m workers.runner` or the app.
    runner = [sys.executable, "-m", "workers.runner", "--db", str(db), "--max-jobs", "1"]
    old = subprocess.Popen(
        [*runner, "--poll", "0.05", "--heartbeat", "0.1"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    worker = None
    new = _runner(db, max_jobs=1)
    try:
        _wait("a checkpoint", lambda: latest_checkpoint(out) is not None)
        worker = store.get_job(train.id).pid
        assert worker not in (None, old.pid, os.getpid())
        os.killpg(old.pid, signal.SIGKILL)  # the whole runner group, as a crashed app
        old.wait()

        # The worker has its own session: it trains on, and its job is truly still running.
        assert pid_alive(worker)
        assert store.get_job(train.id).status == JobStatus.RUNNING
        new.start()
        at = latest_checkpoint(out).step
        _wait("training to go on under the new runner", lambda: latest_checkpoint(out).step > at)
        assert store.get_job(train.id).status == JobStatus.RUNNING
        assert (
            store.get_job(waiting.id).status == JobStatus.QUEUED
        )  # one job at a time, across runners
        assert store.count_running_jobs() == 1

        # Now the orphan dies too; the new runner (not its parent) reaps it.
        os.kill(worker, signal.SIGKILL)
        _wait(
            "the orphan's end",
            lambda: store.get_job(train.id).status != JobStatus.RUNNING,
            timeout=30,
        )
        _wait(
            "the queued job",
            lambda: store.get_job(waiting.id).status not in (JobStatus.QUEUED, JobStatus.RUNNING),
            timeout=60,
        )
    finally:
        new.stop()
        if old.poll() is None:
            os.killpg(old.pid, signal.SIGKILL)
        _kill_leftover(store, train.id)
        _kill_leftover(store, waiting.id)

    dead = store.get_job(train.id)
    assert dead.status == JobStatus.FAILED and dead.error == f"worker died (pid {worker})"
    ran = store.get_job(waiting.id)
    assert ran.status == JobStatus.DONE and ran.result == {"counted": 3}
    assert ran.started_at >= dead.ended_at  # never alongside the orphan
    assert _integrity(db) == "ok"
    _unchanged(store, before)

    ckpt = latest_checkpoint(out)
    assert validate_checkpoint(ckpt.path, fixture_verifier) == []
    resumed = _resume(store, train.id, ckpt.step + 2)
    assert resumed.status == JobStatus.DONE, resumed.error or resumed.log_tail
    assert f"resuming from {ckpt.path} (step {ckpt.step})" in resumed.log_tail
    assert resumed.result["step"] == ckpt.step + 2
    assert [j.status for j in store.list_jobs(status=JobStatus.RUNNING)] == []
    _unchanged(store, before)
    store.close()


# --- 5. a full disk --------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB file system (tmpfs): writes past it fail with ENOSPC, as on a full
    disk.  RLIMIT_FSIZE would fail writes with EFBIG (another error, and per file),
    so the tests skip instead when mounting is not allowed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here (a container without CAP_SYS_ADMIN?): {r.stderr.strip()}"
        )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` until at most ``leave`` bytes are free; returns the filler file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        chunk = 1 << 16
        while chunk:
            st = os.statvfs(disk)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            try:
                os.write(fd, b"\0" * min(chunk, free - leave))
            except OSError as e:
                if e.errno != 28:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return filler


def _free(disk: Path) -> int:
    st = os.statvfs(disk)
    return st.f_bavail * st.f_frsize


def _tiny_drafter(verifier, seed: int):
    return create_drafter(
        "dflash", verifier, num_layers=1, aux_layer_ids=AUX, mask_token_id=MASK, seed=seed
    ).model


def _trained(model: torch.nn.Module) -> torch.optim.Optimizer:
    """An optimizer with moments (one real step), so optimizer.pt has its full size."""
    opt = make_optimizer(
        [p for p in model.parameters() if p.requires_grad], TrainConfig(algorithm="dflash")
    )
    sum((p.float() ** 2).sum() for p in model.parameters() if p.requires_grad).backward()
    opt.step()
    opt.zero_grad()
    return opt


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fails_in", ["model.safetensors", "optimizer.pt"])
def test_full_disk_while_writing_a_checkpoint_keeps_the_last_one(
    small_disk: Path, fixture_verifier, fails_in: str
) -> None:
    model = _tiny_drafter(fixture_verifier, seed=0)
    opt = _trained(model)
    out = small_disk / "out"
    good = save_checkpoint(out, 2, model, opt, {"algorithm": "dflash"}, keep=2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moments = opt.state_dict()
    sizes = {p.name: p.stat().st_size for p in good.iterdir()}

    with torch.no_grad():  # the next checkpoint differs, so "the old one intact" means something
        for p in model.parameters():
            p.add_(1.0)
    # Room for part of the weights, or for the weights and config but part of the optimizer.
    room = sizes["model.safetensors"] // 2
    if fails_in == "optimizer.pt":
        room = sizes["model.safetensors"] + sizes["config.json"] + sizes["optimizer.pt"] // 2
    filler = _fill(small_disk, leave=room)
    with pytest.raises(SpecUIError) as err:
        save_checkpoint(out, 4, model, opt, {"algorithm": "dflash"}, keep=2)
    msg = str(err.value)
    assert "could not save the checkpoint of step 4" in msg and str(out / "checkpoints") in msg
    assert "No space left on device" in msg, msg
    assert f"the last good checkpoint is {good}" in msg
    if fails_in == "optimizer.pt":
        assert "enforce fail" not in msg  # torch's own text for it says nothing of the disk

    assert [c.step for c in list_checkpoints(out)] == [2]
    assert _temps(out) == []  # nothing half-written left, under any name
    assert sorted(p.name for p in good.iterdir()) == sorted(sizes)
    assert {p.name: p.stat().st_size for p in good.iterdir()} == sizes
    fresh = _tiny_drafter(fixture_verifier, seed=1)
    fresh_opt = _trained(fresh)
    assert load_checkpoint(latest_checkpoint(out), fresh, fresh_opt)["step"] == 2
    assert _same(fresh.state_dict(), weights)
    assert _same(fresh_opt.state_dict()["state"][0], moments["state"][0])

    filler.unlink()  # space again: the same save now goes through
    assert (
        save_checkpoint(out, 4, model, opt, {"algorithm": "dflash"}, keep=2).name == "step-00000004"
    )
    assert [c.step for c in list_checkpoints(out)] == [2, 4]


@pytest.mark.parametrize("fails_in", ["model.safetensors", "config.json"])
def test_full_disk_while_saving_a_drafter_keeps_the_previous_files(
    small_disk: Path, fixture_verifier, fails_in: str
) -> None:
    model = _tiny_drafter(fixture_verifier, seed=0)
    folder = small_disk / "drafter"
    save_drafter(model, folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(files) == ["config.json", "model.safetensors"]
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    other = _tiny_drafter(fixture_verifier, seed=7)
    # tmpfs counts whole pages: leave part of the weights' pages, or exactly the weights'.
    page = os.statvfs(small_disk).f_frsize
    pages = -(-len(files["model.safetensors"]) // page)
    filler = _fill(
        small_disk, leave=(pages // 2 if fails_in == "model.safetensors" else pages) * page
    )
    with pytest.raises(OSError) as err:
        save_drafter(other, folder)
    msg = str(err.value)
    assert f"cannot write {folder / fails_in}" in msg and "No space left on device" in msg, msg

    assert {
        p.name: p.read_bytes() for p in folder.iterdir()
    } == files  # no temp file, nothing replaced
    assert validate_checkpoint(folder, fixture_verifier) == []
    assert _same(load_model(folder, fixture_verifier).state_dict(), weights)

    filler.unlink()
    save_drafter(other, folder)
    assert _same(load_model(folder, fixture_verifier).state_dict(), other.state_dict())


def test_full_disk_under_the_store_fails_the_write_clearly_and_loses_nothing(
    small_disk: Path,
) -> None:
    db, store, before = _seeded_store(small_disk)
    # Fold the WAL into the database and truncate it: a WAL keeps its size after a
    # checkpoint, and SQLite would reuse that room instead of needing the disk.
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    conn.close()

    filler = _fill(small_disk)
    assert _free(small_disk) == 0
    with pytest.raises(SpecUIError) as err:
        store.create_run(verifier="v", prompt_set="on-a-full-disk")
    msg = str(err.value)
    assert f"cannot write the store {db}" in msg and "no space left" in msg, msg
    assert store.list_runs(prompt_set="on-a-full-disk") == []
    assert _integrity(db) == "ok"
    _unchanged(store, before)
    with Store(db) as reopened:  # the dashboard still starts, and shows everything
        _unchanged(reopened, before)

    # Room for the run's row but not its steps: recording fails part-way.
    filler.unlink()
    filler = _fill(small_disk, leave=64 * 1024)
    run = store.create_run(verifier="v", prompt_set="filling-up", algorithm="dflash", drafter="d")
    with pytest.raises(SpecUIError) as err:
        record(store, run.id, [[make_trace(i, seed=3) for i in range(5000)]], [1.0], 4)
    msg = str(err.value)
    assert (
        f"recording run {run.id} failed: cannot write the store {db}" in msg
        and "no space left" in msg
    ), msg
    failed = store.get_run(run.id)
    assert (
        failed.status == RunStatus.FAILED and "no space left" in failed.error
    )  # not left "running"
    assert _integrity(db) == "ok"
    _unchanged(store, before)

    filler.unlink()  # space again: recording works and nothing was lost
    ok = store.create_run(verifier="v", prompt_set="after", algorithm="dflash", drafter="d")
    record(store, ok.id, [[make_trace(i, seed=4) for i in range(300)]], [1.0], 4)
    assert store.get_run(ok.id).status == RunStatus.DONE and store.count_results([ok.id])[
        ok.id
    ] == (1, 300)
    _unchanged(store, before)
    store.close()
    assert _integrity(db) == "ok"


# --- 6. kill -9 at every point of a write ----------------------------------------------------


def _kill_points(what: str, root: Path, *args: str) -> int:
    """Run ``tests.support.kill_points`` (one trial folder per kill point); the number of
    trials killed."""
    r = subprocess.run(
        [sys.executable, "-m", "tests.support.kill_points", what, str(root), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.split()
    assert r.stdout.rstrip().endswith("done"), r.stdout[-500:]
    return len([w for w in lines if w == "killed"])


CHECKPOINT_FILES = ["config.json", "model.safetensors", "optimizer.pt", "trainer_state.json"]


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_sigkill_at_every_point_of_a_checkpoint_save_leaves_only_whole_checkpoints(
    tmp_path: Path, fixture_dir, fixture_verifier
) -> None:
    # Each trial saves step 6 next to steps 2 and 4 (keep 2: step 2 is removed), then saves
    # step 6 again (a re-run replaces it); its process is killed before its n-th file call.
    killed = _kill_points("checkpoint", tmp_path, str(fixture_dir / "verifier"))
    assert killed >= 40  # every mkdir, open, chmod, rename and remove of both saves
    model = _tiny_drafter(fixture_verifier, seed=1)
    opt = _trained(model)
    for n in range(1, killed + 2):  # and the trial that finished
        trial = tmp_path / f"t{n:03d}"
        ckpts = list_checkpoints(trial)
        steps = [c.step for c in ckpts]
        # A kill loses at most the save in flight ([4]: the re-run of step 6 had removed the
        # old step 6 and was about to rename the new one in).
        assert steps in ([2, 4], [2, 4, 6], [4, 6], [4]), (n, steps)
        for c in ckpts:  # whatever has a checkpoint's name is a whole checkpoint (the bug: a
            # half-deleted step-00000002 that kept its trainer_state.json)
            assert sorted(p.name for p in c.path.iterdir()) == CHECKPOINT_FILES, (n, c.path)
            assert (
                json.loads((c.path / "config.json").read_text())["speculators_model_type"]
                == "dflash"
            )
            assert load_checkpoint(c, model, opt)["step"] == c.step  # weights, optimizer, state
        # A restart resumes from the newest; its next save sweeps what the kill left.
        assert latest_checkpoint(trial).step == steps[-1]
        save_checkpoint(trial, 8, model, opt, {"algorithm": "dflash"}, keep=2)
        assert _hidden(trial / "checkpoints") == [], (n, _hidden(trial / "checkpoints"))
        assert [c.step for c in list_checkpoints(trial)] == [steps[-1], 8]


def test_sigkill_at_every_point_of_a_state_file_write_leaves_the_old_file_or_the_new(
    tmp_path: Path,
) -> None:
    from tests.support.kill_points import METRICS, NEW_RUN, OLD_RUN

    killed = _kill_points("state", tmp_path)
    assert killed >= 6  # train_run.json's and metrics.jsonl's temporary file, chmod, rename, fsync
    trimmed = "".join(
        line
        for line in METRICS.splitlines(keepends=True)
        if line[:11] in ('{"step": 2,', '{"step": 4,')
    )
    seen_run, seen_metrics = set(), set()
    for n in range(1, killed + 2):
        trial = tmp_path / f"t{n:03d}"
        run = json.loads((trial / "train_run.json").read_text())  # never torn
        assert run in (OLD_RUN, NEW_RUN), (n, run)
        metrics = (trial / "metrics.jsonl").read_text()
        assert metrics in (METRICS, trimmed), (n, metrics)
        seen_run.add(run["status"])
        seen_metrics.add(metrics == trimmed)
    assert seen_run == {"running", "finished"} and seen_metrics == {
        False,
        True,
    }  # the kills fell on both sides


def test_sigkill_during_a_training_start_leaves_no_output_folder(
    tmp_path: Path, train_data, fixture_dir
) -> None:
    # The worst moment: the verifier is loaded and the prompts read (the old code had made
    # --out by then), and the self-distillation is writing its cache (kept outside --out).
    out = tmp_path / "drafter"
    p = _train_params(train_data, fixture_dir, out)
    cmd = [
        sys.executable,
        "-m",
        "specui",
        "train",
        "--algorithm",
        "dflash",
        "--verifier",
        p["verifier"],
        "--prompts",
        p["prompts"],
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--aux-layers",
        "1,3,4",
        "--layers",
        "1",
        "--mask-token-id",
        str(MASK),
        "--max-new-tokens",
        "32",
        "--steps",
        "10",
        "--threads",
        "1",
        "--no-progress",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("self-distillation:"):
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    assert not out.exists()
    assert not list(tmp_path.glob(".*"))  # nor a hidden temporary beside it
