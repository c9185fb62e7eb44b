"""Load on a running dashboard: many ``gradio_client`` sessions calling ``/decode`` at once.

Shared by ``bench/load_test.py`` (by hand, long) and ``tests/ui/test_load.py`` (CI,
short).  Each session is its own ``Client`` (its own session hash, as separate
visitors would be), in its own thread.  Every call is classified as ok,
queue-full (the app's bounded queue refusing it) or error; the app's process
tree's resident memory is sampled meanwhile; afterwards the SQLite store is
read back to check that every ok call's run is there, finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.app_server import free_port
from tests.support.paths import REPO

PROMPTS = (
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Write a haiku about the sea.",
    "List the first ten even numbers, separated by commas.",
    "Explain in one sentence what a lighthouse is for.",
    "Count from one to twenty in words.",
    "Write a Python function that returns the square of a number.",
    "What is the capital of France? Answer in one word, then repeat it.",
    "Give three synonyms for 'happy'.",
)


# Messages of loads the app refuses (specui.verifier.admission): outcomes, not errors.
REFUSALS = ("not enough memory to load", "per model (the operator sets it")


@dataclass
class Call:
    session: int
    outcome: str  # "ok" | "queue_full" | "refused" (a load the app did not admit) | "error"
    latency_s: float
    run_id: int | None = None
    num_output_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    message: str = ""
    end_s: float = 0.0  # when it returned, seconds into the load


@dataclass
class LoadResult:
    calls: list[Call]
    wall_s: float
    session_hashes: dict[int, str]
    rss_peak_bytes: int
    rss_first_bytes: int
    rss_last_bytes: int
    rss_samples: list[tuple[float, int]] = field(default_factory=list)  # (s since start, RSS)

    def rss_median(self, start_s: float, end_s: float) -> float:
        """The median RSS of the samples taken from ``start_s`` up to ``end_s`` seconds into
        the load (nan: none).  A window's median, not one sample: a decode's transient
        buffers come and go within a second, and one sample may catch them or not."""
        window = [rss for t, rss in self.rss_samples if start_s <= t < end_s]
        return statistics.median(window) if window else float("nan")

    def rss_growth(self, warmup_s: float, window_s: float, duration_s: float) -> float:
        """Growth after warm-up: the median RSS of the load's last ``window_s`` seconds over
        that of the ``window_s`` seconds right after ``warmup_s``, minus 1.  Only samples
        taken while the sessions call count (up to ``duration_s``): after it the sessions
        end and their drafters go idle, which is not growth."""
        first = self.rss_median(warmup_s, warmup_s + window_s)
        last = self.rss_median(duration_s - window_s, duration_s)
        return last / first - 1

    def count(self, outcome: str) -> int:
        return sum(1 for c in self.calls if c.outcome == outcome)

    @property
    def ok(self) -> list[Call]:
        return [c for c in self.calls if c.outcome == "ok"]

    @property
    def errors(self) -> list[Call]:
        return [c for c in self.calls if c.outcome == "error"]


@dataclass
class StoreCheck:
    stored_done: int  # ok calls whose run is stored, status done, with the same output
    missing: list[int]  # ok calls' run ids with no row
    not_done: dict[int, str]  # run id -> status, for ok calls' runs not "done"
    wrong_output: list[int]  # stored output differs from what the call returned
    wrong_owner: list[int]  # run owned by another session than the one that called
    left_running: list[int]  # any run still "running"
    extra: list[int]  # runs no ok call returned (a call that errored but still stored a run)

    @property
    def clean(self) -> bool:
        return not (
            self.missing
            or self.not_done
            or self.wrong_output
            or self.wrong_owner
            or self.left_running
            or self.extra
        )


# ---------------------------------------------------------------- the app process


class App:
    """``python app.py`` on a free loopback port with its own data dir and queue size.

    ``python``/``env``: another interpreter (a Space's requirements-only virtualenv) and
    the whole environment; ``wrap``: Python code run as ``python -c WRAP app.py ARGS``
    that runs app.py itself (``bench/soak.py`` starts tracemalloc first); ``flags``: more
    app.py flags (``--allow-hub``)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        queue_size: int,
        timeout_s: float = 180.0,
        python: str | None = None,
        env: dict[str, str] | None = None,
        wrap: str | None = None,
        flags: tuple[str, ...] = (),
    ) -> None:
        self.data_dir, self.queue_size, self.timeout_s = data_dir, queue_size, timeout_s
        self.flags = flags
        self.python, self.base_env, self.wrap = python or sys.executable, env, wrap
        self.db = data_dir / "specui.db"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> App:
        import httpx

        env = {
            **(os.environ if self.base_env is None else self.base_env),
            "PYTHONUNBUFFERED": "1",
            "GRADIO_ANALYTICS_ENABLED": "False",
        }
        self._log = open(self.data_dir / "app.log", "wb")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(
            [
                self.python,
                *(["-c", self.wrap] if self.wrap else []),
                "app.py",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                "--db",
                str(self.db),
                "--queue-size",
                str(self.queue_size),
                *self.flags,
            ],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError(f"app exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.url, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(
                    f"app did not start in {self.timeout_s:.0f} s: {self.log_tail()}"
                )
            time.sleep(0.5)

    def log_tail(self, n: int = 3000) -> str:
        p = self.data_dir / "app.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# ---------------------------------------------------------------- memory


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (0 once it has exited)."""
    try:
        import psutil
    except ImportError:
        return _proc_tree_rss(pid)
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):  # exited between listing and reading
            total += p.memory_info().rss
    return total


def _proc_tree_rss(pid: int) -> int:
    # Without psutil: parent links from /proc/*/stat, VmRSS from /proc/*/status.
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        children.setdefault(ppid, []).append(int(d))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class RssSampler(threading.Thread):
    """Samples :func:`tree_rss_bytes` every ``interval_s`` until stopped; keeps first, last,
    peak."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.first = self.last = self.peak = 0
        self.samples: list[tuple[float, int]] = []  # (monotonic time, RSS)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            rss = tree_rss_bytes(self.pid)
            if rss:
                self.first = self.first or rss
                self.last, self.peak = rss, max(self.peak, rss)
                self.samples.append((time.monotonic(), rss))
            if self._stop_event.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# ---------------------------------------------------------------- the load


def decode_call(
    client, session: int, i: int, max_new_tokens: int, drafter: str = "ngram", k: int = 4
) -> Call:
    """One ``/decode`` call with the embedded default and ``drafter`` (K ``k``, 0: its own),
    classified."""
    from gradio_client.exceptions import AppError
    from gradio_client.utils import QueueError

    prompt = PROMPTS[(session + i) % len(PROMPTS)]
    t0 = time.perf_counter()
    try:
        out = client.predict(
            prompt,
            drafter,
            "embedded",
            k,
            max_new_tokens,
            0.0,
            session * 1000 + i,
            True,
            api_name="/decode",
        )
    except QueueError as e:
        return Call(session, "queue_full", time.perf_counter() - t0, message=str(e))
    except AppError as e:
        # Memory admission refusing a load is the app working: a refusal, with its message.
        refused = any(m in str(e) for m in REFUSALS)
        outcome = "refused" if refused else "error"
        return Call(session, outcome, time.perf_counter() - t0, message=f"AppError: {e}")
    except Exception as e:  # anything else is an error the load test must report, not hide
        return Call(session, "error", time.perf_counter() - t0, message=f"{type(e).__name__}: {e}")
    return Call(
        session,
        "ok",
        time.perf_counter() - t0,
        run_id=int(out["run_id"]),
        num_output_tokens=int(out["num_output_tokens"]),
        output_token_ids=list(out["output_token_ids"]),
    )


def run_load(
    url: str,
    app_pid: int,
    sessions: int,
    *,
    duration_s: float | None = None,
    calls_per_session: int | None = None,
    max_new_tokens: int = 24,
    backoff_s: float = 0.5,
    progress: Callable[[str], None] | None = None,
    drafters: tuple[str, ...] = ("ngram",),
    k: int = 4,
) -> LoadResult:
    """``sessions`` concurrent clients, each calling ``/decode`` until ``duration_s`` has
    passed or it has made ``calls_per_session`` calls (queue-full refusals count as calls).
    Session ``s`` decodes with ``drafters[s % len(drafters)]`` at K ``k`` (0: its own).

    All sessions connect first and then start together, so the first wave of calls
    arrives at once (which is what makes a small queue refuse some)."""
    if (duration_s is None) == (calls_per_session is None):
        raise ValueError("give exactly one of duration_s and calls_per_session")
    from gradio_client import Client

    calls: list[Call] = []
    hashes: dict[int, str] = {}
    lock = threading.Lock()
    t_start: list[float] = []
    barrier = threading.Barrier(sessions, action=lambda: t_start.append(time.monotonic()))

    def session_main(s: int) -> None:
        try:
            client = Client(url, verbose=False)
            hashes[s] = client.session_hash
        except Exception as e:
            with lock:
                calls.append(Call(s, "error", 0.0, message=f"connect: {type(e).__name__}: {e}"))
            client = None
        try:
            barrier.wait(timeout=600)
        except threading.BrokenBarrierError:
            return
        if client is None:
            return
        deadline = t_start[0] + duration_s if duration_s is not None else None
        i = 0
        while (deadline is None and i < calls_per_session) or (
            deadline is not None and time.monotonic() < deadline
        ):
            c = decode_call(client, s, i, max_new_tokens, drafters[s % len(drafters)], k)
            c.end_s = time.monotonic() - t_start[0]
            with lock:
                calls.append(c)
            i += 1
            if c.outcome == "queue_full":
                time.sleep(backoff_s)  # a refused visitor waits a moment before trying again
        client.close()

    sampler = RssSampler(app_pid)
    sampler.start()
    threads = [
        threading.Thread(target=session_main, args=(s,), daemon=True) for s in range(sessions)
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(2.0)
        if progress is not None and t_start:
            with lock:
                n, ok, full = (
                    len(calls),
                    sum(c.outcome == "ok" for c in calls),
                    sum(c.outcome == "queue_full" for c in calls),
                )
            progress(
                f"t={time.monotonic() - t_start[0]:5.0f}s calls={n} ok={ok} queue_full={full}"
                f" errors={n - ok - full} rss={sampler.last / 2**20:.0f} MiB (peak"
                f" {sampler.peak / 2**20:.0f})"
            )
    for t in threads:
        t.join()
    wall = time.monotonic() - t_start[0] if t_start else 0.0
    sampler.stop()
    t0 = t_start[0] if t_start else 0.0
    samples = [(t - t0, rss) for t, rss in sampler.samples]
    return LoadResult(calls, wall, hashes, sampler.peak, sampler.first, sampler.last, samples)


# ---------------------------------------------------------------- the store afterwards


def check_store(db: Path, result: LoadResult, known: set[int] = frozenset()) -> StoreCheck:
    """Read the store the app wrote (plain sqlite3, read-only) against what the calls returned.

    ``known``: run ids of calls made outside the load (a warm-up), not counted as extra."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        runs = {
            rid: (status, owner)
            for rid, status, owner in con.execute("SELECT id, status, owner FROM runs")
        }
        outputs = {
            rid: json.loads(ids or "null")
            for rid, ids in con.execute(
                "SELECT run_id, output_token_ids_json FROM results WHERE prompt_index = 0"
            )
        }
    finally:
        con.close()
    ok = result.ok
    ok_ids = {c.run_id for c in ok}
    check = StoreCheck(
        0,
        [],
        {},
        [],
        [],
        [rid for rid, (st, _) in runs.items() if st == "running"],
        sorted(set(runs) - ok_ids - set(known)),
    )
    for c in ok:
        if c.run_id not in runs:
            check.missing.append(c.run_id)
            continue
        status, owner = runs[c.run_id]
        if status != "done":
            check.not_done[c.run_id] = status
        elif outputs.get(c.run_id) != c.output_token_ids:
            check.wrong_output.append(c.run_id)
        elif owner != result.session_hashes.get(c.session):
            check.wrong_owner.append(c.run_id)
        else:
            check.stored_done += 1
    return check


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; nan for no data."""
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    return (
        statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]
        if 1 <= q <= 99
        else (min(xs) if q <= 0 else max(xs))
    )
