"""Store files as older SpecUI versions wrote them, to test the upgrades.

``SCHEMA_V1`` is the DDL schema version 1 shipped with, verbatim: a file built from
it (plus ``MIGRATIONS[2]`` for a v2 file) is what a user's old store looks like."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from specui.store import MIGRATIONS

SCHEMA_V1 = [
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


def write_old_store(path: Path, version: int) -> sqlite3.Connection:
    """An empty store file at schema ``version`` (1 or later); the open connection
    lets the caller add rows before closing it."""
    conn = sqlite3.connect(path)
    for stmt in SCHEMA_V1 + [s for v in range(2, version + 1) for s in MIGRATIONS[v]]:
        conn.execute(stmt)
    conn.execute(f"PRAGMA user_version={version}")
    return conn
