"""Runs, their per-prompt results and their steps: creating, finding, labelling and
deleting them.  ``RunRecorder`` (``specui.store.recorder``) writes the results and
steps of a run while it decodes."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from sqlmodel import col, select

from specui.errors import SpecUIError
from specui.store.db import (
    Database,
    check_owner,
    collect_versions,
    get_row,
    owner_is_dead,
    to_json,
)
from specui.store.schema import (
    BASELINE_ALGORITHM,
    RUN_FINAL,
    Backend,
    PromptResult,
    Run,
    RunStatus,
    StepRecord,
)
from specui.trace import StepTrace


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


def _check_fingerprint(value: str | None) -> str | None:
    """A weights fingerprint as stored: lower-case hex, or None for unknown ("" too)."""
    if value is None or value == "":
        return None
    hex_digits = isinstance(value, str) and all(c in "0123456789abcdef" for c in value)
    if not hex_digits or len(value) > 64:
        raise SpecUIError(
            f"a verifier fingerprint is up to 64 lower-case hex digits, got {value!r}"
        )
    return value


def _settings_dict(settings: Any) -> dict[str, Any]:
    if isinstance(settings, DecodingSettings):
        return settings.to_dict()
    if is_dataclass(settings) and not isinstance(settings, type):
        return asdict(settings)
    return dict(settings or {})


class RunStore(Database):
    """The run operations of ``specui.store.Store``."""

    def create_run(
        self,
        *,
        verifier: str,
        prompt_set: str,
        verifier_fingerprint: str | None = None,
        algorithm: str = BASELINE_ALGORITHM,
        drafter: str | None = None,
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
            known = ", ".join(b.value for b in Backend)
            raise SpecUIError(f"unknown backend {backend!r}; expected one of {known}") from None
        now = time.time()
        run = Run(
            label=label,
            drafter=drafter or algorithm,
            algorithm=algorithm,
            verifier=verifier,
            verifier_fingerprint=verifier_fingerprint,
            backend=backend,
            prompt_set=prompt_set,
            settings_json=to_json(_settings_dict(settings), "run settings"),
            seed=seed,
            versions_json=to_json(
                dict(versions) if versions is not None else collect_versions(), "versions"
            ),
            status=RunStatus.RUNNING,
            owner=owner,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            heartbeat_at=now,
            started_at=now,
        )
        return self.insert(run)

    def get_run(self, run_id: int) -> Run:
        with self.read() as s:
            return get_row(s, Run, run_id, "run")

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
        filters = {
            Run.status: status,
            Run.algorithm: algorithm,
            Run.backend: backend,
            Run.verifier: verifier,
            Run.prompt_set: prompt_set,
            Run.owner: owner,
        }
        for column, value in filters.items():
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
        sql = "SELECT DISTINCT verifier, nullif(verifier_fingerprint, '') FROM runs"
        with self.read() as s:
            rows = s.connection().exec_driver_sql(sql).all()
        return sorted({(name, fp) for name, fp in rows}, key=lambda nf: (nf[0], nf[1] or ""))

    def finish_run(self, run_id: int, status: RunStatus | str, error: str | None = None) -> Run:
        """Set a run's final status (done / stopped / failed / incomplete)."""
        status = RunStatus(status)
        if status not in RUN_FINAL:
            raise ValueError(f"finish_run needs a final status, got {status}")
        with self.write() as s:
            run = get_row(s, Run, run_id, "run")
            run.status, run.ended_at, run.error = status, time.time(), error
            s.add(run)
            return run

    def set_run_label(
        self, run_id: int, label: str | None, requester: str | None = None, *, force: bool = False
    ) -> None:
        with self.write() as s:
            run = get_row(s, Run, run_id, "run")
            check_owner("run", run_id, run.owner, requester, force)
            run.label = label
            s.add(run)

    def delete_run(self, run_id: int, requester: str | None = None, *, force: bool = False) -> None:
        """Delete a run with its results and steps.  Refused for another session's
        run unless ``force``, and for a run still being recorded."""
        with self.write() as s:
            run = get_row(s, Run, run_id, "run")
            check_owner("run", run_id, run.owner, requester, force)
            alive = not owner_is_dead(run.pid, run.hostname, run.heartbeat_at, self.stale_after_s)
            if run.status == RunStatus.RUNNING and alive:
                raise SpecUIError(f"run {run_id} is still running; stop it first")
            s.delete(run)  # results and steps go by ON DELETE CASCADE

    def get_results(self, run_id: int) -> list[PromptResult]:
        self.get_run(run_id)
        q = (
            select(PromptResult)
            .where(PromptResult.run_id == run_id)
            .order_by(col(PromptResult.prompt_index))
        )
        with self.read() as s:
            return list(s.exec(q).all())

    def get_steps(self, run_id: int, prompt_index: int | None = None) -> list[StepRecord]:
        """A run's stored steps, ordered by prompt then step."""
        self.get_run(run_id)
        q = (
            select(StepRecord)
            .join(PromptResult, col(StepRecord.result_id) == PromptResult.id)
            .where(PromptResult.run_id == run_id)
        )
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
        sql = (
            "SELECT r.run_id, count(DISTINCT CASE WHEN r.ended_at IS NOT NULL THEN r.id END), "
            "count(s.id) FROM results r LEFT JOIN steps s ON s.result_id = r.id "
            f"WHERE r.run_id IN ({marks}) GROUP BY r.run_id"
        )
        with self.read() as s:
            rows = s.connection().exec_driver_sql(sql, tuple(run_ids)).all()
        out = {rid: (0, 0) for rid in run_ids}
        out.update({r[0]: (r[1], r[2]) for r in rows})
        return out
