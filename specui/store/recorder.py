"""Recording a run while it decodes, without slowing the decoding loop down.

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
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from typing import Any

from specui.errors import SpecUIError
from specui.store.runs import RunStore
from specui.store.schema import RunStatus, StepRecord
from specui.trace import GenerationResult, StepTrace

log = logging.getLogger(__name__)

# Built once: json.dumps with non-default arguments builds a new encoder per call,
# which was a third of the per-step cost.
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_dumps_text = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

# The steps table's columns but its id, in table order: what _step_row returns.
_STEP_TABLE = StepRecord.__table__  # type: ignore[attr-defined]
_STEP_COLUMNS = tuple(c.name for c in _STEP_TABLE.columns if c.name != "id")
_STEP_INSERT = (
    f"INSERT INTO steps ({', '.join(_STEP_COLUMNS)}) VALUES ({', '.join('?' * len(_STEP_COLUMNS))})"
)


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

    def __init__(
        self,
        store: RunStore,
        run_id: int,
        *,
        batch_steps: int = 256,
        flush_interval_s: float = 0.5,
        heartbeat_s: float = 2.0,
    ) -> None:
        run = store.get_run(run_id)
        if run.status != RunStatus.RUNNING:
            raise SpecUIError(f"run {run_id} is {run.status}; start a new run to record more")
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
        self._thread = threading.Thread(
            target=self._writer, name=f"specui-run-{self.run_id}", daemon=True
        )
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

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
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
                self.store.finish_run(
                    self.run_id, RunStatus.FAILED, f"storing the run failed: {self._error}"
                )
            if exc is None:
                self._raise_if_failed()

    def _put(self, item: tuple[Any, ...]) -> None:
        self._raise_if_failed()
        if self._thread is None:
            raise RuntimeError(
                "use RunRecorder as a context manager (with RunRecorder(...) as rec:)"
            )
        self._q.put(item)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise SpecUIError(f"recording run {self.run_id} failed: {self._error}") from self._error

    # -- writer thread --

    def _writer(self) -> None:
        pending: list[tuple[Any, ...]] = []
        result_ids: dict[int, int] = {}
        n_steps = 0
        last_flush = last_beat = time.monotonic()
        try:
            while True:
                # Wake for the next flush when rows wait, else for the next heartbeat.
                elapsed_flush, elapsed_beat = (
                    time.monotonic() - last_flush,
                    time.monotonic() - last_beat,
                )
                timeout = max(
                    0.0,
                    (self.flush_interval_s - elapsed_flush)
                    if pending
                    else (self.heartbeat_s - elapsed_beat),
                )
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
                if (
                    closing
                    or waiter is not None
                    or (pending and due)
                    or now - last_beat >= self.heartbeat_s
                ):
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

    def _commit(
        self,
        pending: list[tuple[Any, ...]],
        result_ids: dict[int, int],
        final: tuple[RunStatus, str | None] | None,
    ) -> None:
        now = time.time()
        step_rows: list[tuple[Any, ...]] = []
        with self.store.write() as s:
            conn = s.connection()
            for item in pending:
                kind, idx = item[0], item[1]
                if kind == "begin":
                    cur = conn.exec_driver_sql(
                        "INSERT INTO results (run_id, prompt_index, prompt_text, started_at) VALUES"
                        " (?, ?, ?, ?)",
                        (self.run_id, idx, item[2], item[3]),
                    )
                    result_ids[idx] = cur.lastrowid
                elif kind == "step":
                    step_rows.append(_step_row(result_ids[idx], item[2]))
                elif kind == "end":
                    r: GenerationResult = item[2]
                    conn.exec_driver_sql(
                        "UPDATE results SET output_text=?, output_token_ids_json=?,"
                        " num_prompt_tokens=?, num_output_tokens=?, num_speculative_tokens=?,"
                        " num_steps=?, wall_time_s=?, draft_time_s=?, verify_time_s=?,"
                        " stop_reason=?, ended_at=? WHERE id=?",
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
                conn.exec_driver_sql(
                    "UPDATE runs SET heartbeat_at=? WHERE id=?", (now, self.run_id)
                )
            else:
                conn.exec_driver_sql(
                    "UPDATE runs SET status=?, error=?, ended_at=?, heartbeat_at=? WHERE id=?",
                    (str(final[0]), final[1], now, now, self.run_id),
                )
