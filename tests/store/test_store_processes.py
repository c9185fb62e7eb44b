"""The store across processes: a writer in another process with readers (and a
writer) here, and a writer killed with SIGKILL mid-run."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from specui.metrics.comparison import compare
from specui.store import RunStatus, Store
from tests.support.store_helpers import make_trace

REPO = Path(__file__).resolve().parents[2]


def _start_writer(db: Path, *args: object) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.store_writer", str(db), *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("RUN "), line + proc.stderr.read()
    return proc, int(line.split()[1])


def test_writer_process_and_readers_here_never_see_database_locked(tmp_path: Path) -> None:
    db = tmp_path / "specui.db"
    store = Store(db)
    # 4 prompts x 1000 steps in batches of 25 (160 commits), pausing 2 ms every 50 steps
    # and, through the gate file, until this reader has read again: on a busy machine the
    # writer could otherwise finish between two reads and the test would prove nothing.
    gate = tmp_path / "reads"
    proc, run_id = _start_writer(db, 4, 1000, 25, 50, 0.002, gate)
    seen: set[int] = set()
    reads = writes = 0
    while proc.poll() is None:
        # Readers: the listing, a comparison and the results, as the UI refreshes.
        assert store.get_run(run_id).status in (RunStatus.RUNNING, RunStatus.DONE)
        seen.add(store.count_results([run_id])[run_id][1])
        compare(store, [run_id])
        store.get_results(run_id)
        reads += 1
        # And a writer here too (another run starting and ending).
        other = store.create_run(verifier="v", prompt_set="other")
        store.finish_run(other.id, RunStatus.DONE)
        writes += 1
        tmp = gate.with_suffix(".tmp")
        tmp.write_text(str(reads))
        os.replace(tmp, gate)  # the writer never sees a half-written count
        time.sleep(0.01)
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "locked" not in err
    assert store.get_run(run_id).status == RunStatus.DONE
    assert store.count_results([run_id])[run_id] == (4, 4000)
    partial = {n for n in seen if 0 < n < 4000}
    assert len(partial) >= 3, f"the reads did not overlap the writing (saw {sorted(seen)})"
    assert reads >= 5 and writes >= 5
    store.close()


def test_writer_killed_with_sigkill_leaves_an_incomplete_run_with_every_committed_step(
    tmp_path: Path,
) -> None:
    db = tmp_path / "specui.db"
    # Endless for this test's purposes: 3 prompts x 1e6 steps, batches of 64.
    proc, run_id = _start_writer(db, 3, 1_000_000, 64, 64, 0.001)
    store = Store(db)
    deadline = time.monotonic() + 30
    while store.count_results([run_id])[run_id][1] < 2000:
        assert proc.poll() is None and time.monotonic() < deadline, "the writer did not get going"
        time.sleep(0.05)
    assert store.get_run(run_id).status == RunStatus.RUNNING
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store.close()

    # A fresh open (the next dashboard start) notices the dead owner.
    with Store(db) as store:
        run = store.get_run(run_id)
        assert run.status == RunStatus.INCOMPLETE and "died" in run.error
        rows = store.get_steps(run_id, 0)
        assert len(rows) >= 2000
        assert [r.step for r in rows] == list(range(len(rows)))  # no gaps: whole batches only
        for r in rows[:: max(1, len(rows) // 200)] + rows[-3:]:
            assert r.to_trace() == make_trace(r.step, seed=0)
        (result,) = store.get_results(run_id)
        assert result.ended_at is None  # the prompt never finished
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()
