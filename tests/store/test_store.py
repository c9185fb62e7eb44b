"""The store: round trips, recorder end states, migrations, refusals, ownership."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlmodel import SQLModel

from specui.errors import SpecUIError
from specui.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    DecodingSettings,
    RunRecorder,
    RunStatus,
    Store,
    default_db_path,
)
from tests.support.store_helpers import make_result, make_trace, record
from tests.support.store_history import write_old_store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "specui.db")
    yield s
    s.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_run_with_10000_steps_round_trips_exactly(store: Store) -> None:
    run = store.create_run(
        verifier="smollm2",
        prompt_set="humaneval:0-9",
        algorithm="dflash",
        drafter="dflash-2l",
        settings=DecodingSettings(
            num_speculative_tokens=4, temperature=0.7, extra={"stop": ["\n\n"]}
        ),
        seed=3,
        label="first",
    )
    prompts = [[make_trace(i, seed=p) for i in range(1000)] for p in range(10)]
    t0 = time.perf_counter()
    record(store, run.id, prompts, [2.0 + p for p in range(10)], k=4)
    elapsed = time.perf_counter() - t0

    got = store.get_run(run.id)
    assert got.status == RunStatus.DONE and got.ended_at is not None and got.error is None
    assert got.settings["temperature"] == 0.7 and got.settings["stop"] == ["\n\n"] and got.seed == 3
    assert {"python", "torch"} <= set(got.versions)
    assert store.count_results([run.id]) == {run.id: (10, 10_000)}
    results = store.get_results(run.id)
    assert [r.prompt_index for r in results] == list(range(10))
    for p, r in enumerate(results):
        expected = make_result(prompts[p], 2.0 + p, 4)
        assert r.output_token_ids == expected.output_token_ids
        assert r.output_text == expected.output_text
        assert r.num_output_tokens == len(expected.output_token_ids) and r.num_steps == 1000
        assert r.wall_time_s == 2.0 + p and r.stop_reason == "max_tokens"
        assert r.draft_time_s == pytest.approx(sum(s.draft_time_s for s in prompts[p]))
    for p in (0, 9):  # StepTrace equality: every field, floats bit-exact, unicode intact
        assert store.get_traces(run.id, p) == prompts[p]
    assert elapsed < 20, f"recording 10k steps took {elapsed:.1f} s"


def test_recorder_queues_steps_without_waiting_for_sqlite(store: Store) -> None:
    run = store.create_run(verifier="v", prompt_set="ps")
    traces = [make_trace(i) for i in range(5000)]
    with RunRecorder(store, run.id, batch_steps=100) as rec:
        rec.begin_prompt(0, "p")
        t0 = time.perf_counter()
        for t in traces:
            rec.step(t)
        per_step = (time.perf_counter() - t0) / len(traces)
        rec.flush()
        assert rec.steps_committed == 5000
        rec.end_prompt(make_result(traces, 1.0, 4))
    assert per_step < 200e-6, f"step() took {per_step * 1e6:.0f} us"


def test_recorder_end_states(store: Store) -> None:
    failed = store.create_run(verifier="v", prompt_set="ps")
    with pytest.raises(RuntimeError), RunRecorder(store, failed.id) as rec:
        rec.begin_prompt(0, "p")
        rec.step(make_trace(0))
        raise RuntimeError("verifier exploded")
    got = store.get_run(failed.id)
    assert got.status == RunStatus.FAILED and "verifier exploded" in got.error
    assert store.count_results([failed.id]) == {
        failed.id: (0, 1)
    }  # the step before the failure is kept

    stopped = store.create_run(verifier="v", prompt_set="ps")
    with RunRecorder(store, stopped.id) as rec:
        rec.add_result(0, "p", make_result([make_trace(0)], 1.0, 4, stop_reason="cancelled"))
    assert store.get_run(stopped.id).status == RunStatus.STOPPED

    interrupted = store.create_run(verifier="v", prompt_set="ps")
    with pytest.raises(KeyboardInterrupt), RunRecorder(store, interrupted.id):
        raise KeyboardInterrupt
    assert store.get_run(interrupted.id).status == RunStatus.STOPPED

    with pytest.raises(SpecUIError, match="is failed"):  # a finished run is not recorded into again
        RunRecorder(store, failed.id)


def test_models_match_migrated_schema(store: Store) -> None:
    conn = sqlite3.connect(store.path)
    for table in SQLModel.metadata.sorted_tables:
        db_cols = {row[1] for row in conn.execute(f"PRAGMA table_info({table.name})")}
        assert db_cols == {c.name for c in table.columns}, table.name
    conn.close()
    assert store.schema_version() == SCHEMA_VERSION == max(MIGRATIONS)


def _schema_of(path: Path) -> dict[str, object]:
    """Everything SQLite knows about a file's tables but their DDL text: columns (order,
    type, NOT NULL, default, key), foreign keys, indexes, AUTOINCREMENT."""
    conn = sqlite3.connect(path)
    tables = [
        r[0]
        for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
    ]
    out: dict[str, object] = {
        "tables": tables,
        "version": conn.execute("PRAGMA user_version").fetchone()[0],
    }
    for t in tables:
        if t == "sqlite_sequence":
            continue
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name=?", (t,)).fetchone()[0]
        indexes = sorted(conn.execute(f"PRAGMA index_list({t})"), key=lambda r: r[1])
        out[t] = {
            "columns": conn.execute(f"PRAGMA table_info({t})").fetchall(),
            "foreign_keys": sorted(r[2:] for r in conn.execute(f"PRAGMA foreign_key_list({t})")),
            "indexes": [
                (r[1:], conn.execute(f"PRAGMA index_info({r[1]})").fetchall()) for r in indexes
            ],
            "autoincrement": "AUTOINCREMENT" in sql.upper(),
        }
    conn.close()
    return out


def test_a_new_file_has_the_schema_an_upgraded_v1_file_has(tmp_path: Path) -> None:
    """The tables are defined once (specui.store.schema): a new file is created from
    them, an old one is upgraded by MIGRATIONS, and both end up the same."""
    write_old_store(tmp_path / "old.db", 1).close()
    Store(tmp_path / "old.db").close()
    Store(tmp_path / "new.db").close()
    old, new = _schema_of(tmp_path / "old.db"), _schema_of(tmp_path / "new.db")
    assert new["version"] == SCHEMA_VERSION
    assert set(new["tables"]) >= {"runs", "results", "steps", "jobs", "job_metrics"}
    for key in old:
        assert new[key] == old[key], key
    assert new == old


def test_v1_file_is_migrated_forward_keeping_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = write_old_store(path, 1)
    conn.execute(
        "INSERT INTO runs (drafter, algorithm, verifier, backend, prompt_set, status, started_at) "
        "VALUES ('ngram', 'ngram', 'v', 'local', 'ps', 'done', 1.0)"
    )
    conn.execute(
        "INSERT INTO results (run_id, prompt_index, prompt_text, started_at, ended_at) VALUES (1,"
        " 0, 'p', 1.0, 2.0)"
    )
    conn.commit()
    conn.close()

    with Store(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        run = store.get_run(1)
        assert (run.algorithm, run.status, run.label) == ("ngram", RunStatus.DONE, None)
        store.set_run_label(1, "n-gram K=4")
        assert store.get_run(1).label == "n-gram K=4"
        assert [r.prompt_text for r in store.get_results(1)] == ["p"]
    conn = sqlite3.connect(path)
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "ix_runs_baseline" in indexes
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_unknown_run_id_is_a_clear_error(store: Store) -> None:
    for call in (
        lambda: store.get_run(99),
        lambda: store.delete_run(99),
        lambda: store.get_results(99),
        lambda: store.finish_run(99, "done"),
    ):
        with pytest.raises(SpecUIError, match="unknown run id 99"):
            call()


def test_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 20)
    before = _sha(path)
    with pytest.raises(SpecUIError, match="not an SQLite database"):
        Store(path)
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_newer_schema_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    before = _sha(path)
    with pytest.raises(SpecUIError, match="newer than this SpecUI"):
        Store(path)
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["future.db"]


_OPEN = """
import sys
from specui.store import Store
from specui.errors import SpecUIError
for path in sys.argv[1:]:
    try:
        Store(path).close()
        print("opened", path)
    except SpecUIError as e:
        print("SpecUIError:", e)
"""
_DROP_DAC = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
    "--",
]


def test_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    """Root ignores folder permissions: as root, the opening runs in a child
    without the capability that lets root do that."""
    as_root = os.geteuid() == 0
    if as_root and shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv (util-linux) is missing")
    folder = tmp_path / "ro"
    folder.mkdir()
    Store(folder / "existing.db").close()  # a store that exists, then the folder turns read-only
    os.chmod(folder, 0o555)
    targets = [folder / "new.db", folder / "existing.db"]
    try:
        if as_root:  # one child for both: each start imports torch (via SpecUIError)
            p = subprocess.run(
                [*_DROP_DAC, sys.executable, "-c", _OPEN, *map(str, targets)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            messages = p.stdout.splitlines()
            assert p.returncode == 0 and len(messages) == 2, p.stdout + p.stderr
        else:
            messages = []
            for target in targets:
                with pytest.raises(SpecUIError) as exc:
                    Store(target)
                messages.append("SpecUIError: " + str(exc.value))
        for target, message in zip(targets, messages, strict=True):
            assert message.startswith("SpecUIError: cannot write the store " + str(target)), message
            assert f"the folder {folder} to be writable" in message, message
        assert sorted(p.name for p in folder.iterdir()) == ["existing.db"]
    finally:
        os.chmod(folder, 0o755)


def test_data_dir_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "specui.db"
    with Store() as s:
        assert s.path == (tmp_path / "data" / "specui.db")
        assert s.path.exists()


def test_only_the_owner_or_the_operator_deletes_a_run(store: Store) -> None:
    run = store.create_run(verifier="v", prompt_set="ps", owner="session-a")
    with pytest.raises(SpecUIError, match="still running"):
        store.delete_run(run.id, requester="session-a")
    store.finish_run(run.id, RunStatus.DONE)
    with pytest.raises(SpecUIError, match="another session"):
        store.delete_run(run.id, requester="session-b")
    with pytest.raises(SpecUIError, match="another session"):
        store.set_run_label(run.id, "mine now", requester="session-b")
    store.delete_run(run.id, requester="session-a")
    with pytest.raises(SpecUIError, match="unknown run id"):
        store.get_run(run.id)

    other = store.create_run(verifier="v", prompt_set="ps", owner="session-a")
    store.finish_run(other.id, RunStatus.DONE)
    store.delete_run(other.id, requester=None, force=True)  # the operator
    assert store.list_runs() == []


def test_deleting_a_run_removes_its_results_and_steps(store: Store) -> None:
    run = store.create_run(verifier="v", prompt_set="ps")
    record(store, run.id, [[make_trace(i) for i in range(50)]], [1.0], k=4)
    store.delete_run(run.id)
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT count(*) FROM steps").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM results").fetchone()[0] == 0
    conn.close()


def test_bad_run_arguments_are_user_errors(store: Store) -> None:
    with pytest.raises(SpecUIError, match="unknown backend"):
        store.create_run(verifier="v", prompt_set="ps", backend="tgi")
    with pytest.raises(SpecUIError, match="JSON"):
        store.create_run(verifier="v", prompt_set="ps", settings={"k": object()})
    assert store.list_runs() == []
