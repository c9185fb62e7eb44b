"""The one store: runs, per-prompt results, per-step traces and background jobs, in
one SQLite file (SQLModel tables over SQLAlchemy).

Where it lives: ``$SPECUI_DB``, else ``<data dir>/specui.db`` with data dir =
``$SPECUI_DATA_DIR`` or ``~/.local/share/specui`` (``default_db_path``, the one
default of the app, the CLI and the job runner); every entry point takes a path instead.

The modules, in import order:

* ``schema``: the tables and their enums, the one definition of the schema;
* ``db``: the file (where it lives, opening, upgrading, transactions) and who owns a row;
* ``runs``: runs, their results and steps; ``jobs``: the job queue;
* ``recorder``: ``RunRecorder``, which writes a run while it decodes (usage there).

``Store`` is one open file with the run and the job operations.
"""

from __future__ import annotations

from specui.errors import SpecUIError
from specui.store.db import (
    ADMIN_ENV,
    MIGRATIONS,
    SCHEMA_VERSION,
    admin_mode,
    check_owner,
    collect_versions,
    default_db_path,
    pid_alive,
)
from specui.store.jobs import JobStore
from specui.store.recorder import RunRecorder
from specui.store.runs import DecodingSettings, RunStore
from specui.store.schema import (
    BASELINE_ALGORITHM,
    Backend,
    Job,
    JobMetric,
    JobStatus,
    PromptResult,
    Run,
    RunStatus,
    StepRecord,
)

# Older spelling of raising a SpecUIError, kept for the callers that still use it.
user_error = SpecUIError


class Store(RunStore, JobStore):
    """One open store file: ``Store(path)`` opens it (creating or upgrading it, and
    marking rows whose process died), then runs and jobs are read and written
    through its methods.  Thread-safe; open one per process."""


__all__ = [
    "ADMIN_ENV",
    "BASELINE_ALGORITHM",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Backend",
    "DecodingSettings",
    "Job",
    "JobMetric",
    "JobStatus",
    "PromptResult",
    "Run",
    "RunRecorder",
    "RunStatus",
    "StepRecord",
    "Store",
    "admin_mode",
    "check_owner",
    "collect_versions",
    "default_db_path",
    "pid_alive",
    "user_error",
]
