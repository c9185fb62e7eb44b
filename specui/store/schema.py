"""The store's tables: the one definition of the schema.

The SQLModel classes below are the latest schema version.  A new file is created
from them (``create_statements``); an older file reaches the same schema through
the upgrades in ``specui.store.db.MIGRATIONS``.  ``tests/store/test_store.py`` checks that
the two paths give the same tables, columns, defaults, keys and indexes.

Columns are declared in on-disk order: a column added by a migration goes last,
where ``ALTER TABLE ... ADD COLUMN`` puts it in an upgraded file.
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.sqlite.base import SQLiteTypeCompiler
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import Field, SQLModel

from specui.trace import FinalTokenKind, StepTrace

BASELINE_ALGORITHM = "none"  # the algorithm name of a run without a drafter


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

    impl = Text
    cache_ok = True

    def __init__(self, enum_cls: type[StrEnum]) -> None:
        super().__init__()
        self.enum_cls = enum_cls

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else str(self.enum_cls(value))

    def process_result_value(self, value: Any, dialect: Any) -> StrEnum | None:
        return None if value is None else self.enum_cls(value)


def _key(**kw: Any) -> Any:
    """An ``id INTEGER PRIMARY KEY`` column (a rowid alias, declared without NOT NULL
    as the first schema wrote it)."""
    return Field(default=None, primary_key=True, nullable=True, **kw)


def _default(value: Any, sql: str) -> Any:
    """A column with a Python default and the same default in the DDL, so rows written
    with plain SQL (the recorder, the queue) get it too."""
    return Field(default=value, sa_column_kwargs={"server_default": text(sql)})


_AUTOINCREMENT = {"sqlite_autoincrement": True}  # ids never reused after a delete

# Written by schema v1 for a drafter registry that nothing reads any more.  It stays,
# empty, so a new file has the tables an upgraded one has: dropping it would mean
# rebuilding ``runs``, whose ``speculator_id`` references it.
LEGACY_SPECULATORS = Table(
    "speculators",
    SQLModel.metadata,
    Column("id", Integer, primary_key=True, nullable=True),
    Column("name", Text, nullable=False, unique=True),
    Column("algorithm", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("verifier", Text, nullable=False),
    Column("config_hash", Text, nullable=False),
    Column("model_card", Text, nullable=False, server_default=text("''")),
    Column("owner", Text),
    Column("created_at", Float, nullable=False),
    **_AUTOINCREMENT,
)


class Run(SQLModel, table=True):
    """One benchmark run: one drafter (or none) over one prompt set."""

    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_status", "status"),
        Index("ix_runs_speculator", "speculator_id"),
        # v2: what the speedup column needs to find a run's baseline
        Index("ix_runs_baseline", "prompt_set", "verifier", "backend", "algorithm", "status"),
        _AUTOINCREMENT,
    )
    id: int | None = _key()
    # always NULL now: see LEGACY_SPECULATORS
    speculator_id: int | None = Field(
        default=None, foreign_key="speculators.id", ondelete="SET NULL"
    )
    drafter: str
    algorithm: str  # "none" for the baseline
    verifier: str
    backend: Backend = Field(sa_type=_StrEnumType(Backend))
    prompt_set: str
    settings_json: str = _default("{}", "'{}'")
    seed: int | None = None
    versions_json: str = _default("{}", "'{}'")
    status: RunStatus = Field(sa_type=_StrEnumType(RunStatus))
    error: str | None = None
    owner: str | None = None  # browser session id; None = operator / CLI
    pid: int | None = None
    hostname: str | None = None
    heartbeat_at: float | None = None
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    label: str | None = None  # v2: shown in the UI and CSV instead of the drafter name
    # v3: specui.verifier's weights fingerprint, so two weight sets under one name are
    # two verifiers; None = unknown (older runs, a vLLM server whose model is not a
    # local folder)
    verifier_fingerprint: str | None = None

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
        if self.label:
            return self.label
        if self.drafter == self.algorithm:
            return self.drafter
        return f"{self.drafter} ({self.algorithm})"


class PromptResult(SQLModel, table=True):
    """One prompt's generation within a run.  Created when the prompt starts
    (so its steps can reference it); output fields are filled when it ends."""

    __tablename__ = "results"
    __table_args__ = (UniqueConstraint("run_id", "prompt_index"), _AUTOINCREMENT)
    id: int | None = _key()
    run_id: int = Field(foreign_key="runs.id", ondelete="CASCADE")
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
        if self.output_token_ids_json is None:
            return None
        return json.loads(self.output_token_ids_json)


class StepRecord(SQLModel, table=True):
    """A stored ``StepTrace``.  List fields are JSON text; ``num_drafted`` is kept
    as a column so acceptance metrics aggregate in SQL without parsing JSON."""

    __tablename__ = "steps"
    __table_args__ = (UniqueConstraint("result_id", "step"),)
    id: int | None = _key()  # no AUTOINCREMENT: steps are the bulk of the file
    result_id: int = Field(foreign_key="results.id", ondelete="CASCADE")
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
    """A background job (training, benchmark, ...) run by ``specui.jobs`` in worker processes."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status", "status", "id"), _AUTOINCREMENT)
    id: int | None = _key()
    kind: str
    params_json: str = _default("{}", "'{}'")
    status: JobStatus = Field(sa_type=_StrEnumType(JobStatus))
    progress: float = _default(0.0, "0")  # 0..1
    message: str | None = None  # the latest progress message
    log_tail: str = _default("", "''")  # the last lines logged (bounded)
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
    __table_args__ = (Index("ix_job_metrics_series", "job_id", "name", "step"),)
    id: int | None = _key()
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    step: int
    name: str
    value: float


TABLES: tuple[Table, ...] = (
    LEGACY_SPECULATORS,
    Run.__table__,  # type: ignore[attr-defined]
    PromptResult.__table__,  # type: ignore[attr-defined]
    StepRecord.__table__,  # type: ignore[attr-defined]
    Job.__table__,  # type: ignore[attr-defined]
    JobMetric.__table__,  # type: ignore[attr-defined]
)


class _TypeNames(SQLiteTypeCompiler):
    """SQLite's own type names (TEXT, REAL), as the first schema was written, rather
    than SQLAlchemy's VARCHAR and FLOAT: the same affinity, and the same
    ``PRAGMA table_info`` in a new file as in an upgraded one."""

    def visit_VARCHAR(self, type_: Any, **kw: Any) -> str:
        return "TEXT"

    def visit_FLOAT(self, type_: Any, **kw: Any) -> str:
        return "REAL"


class _DDLDialect(SQLiteDialect_pysqlite):
    type_compiler_cls = _TypeNames


def create_statements() -> list[str]:
    """The DDL that creates the latest schema in an empty file, derived from the tables."""
    dialect = _DDLDialect()
    out: list[str] = []
    for table in TABLES:
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        indexes = sorted(table.indexes, key=lambda ix: str(ix.name))
        out.extend(str(CreateIndex(ix).compile(dialect=dialect)) for ix in indexes)
    return out
