"""Memory of the dashboard under a long run, as a Space runs it.  By hand:

    .venv/bin/python bench/soak.py [--minutes 30] [--sessions 10] [--warmup-minutes 5]
                                   [--churn 20] [--tracemalloc] [--python PY]
                                   [--drafter NAME] [-k 0]

Starts ``app.py`` with the interpreter of the requirements-only virtualenv that
``tests/ui/test_space.py`` builds (``.venv-space/<key>``, as a Space installs it;
``--python`` names another), ``SPACE_ID`` set, on loopback, with a fresh data dir.
Then ``--sessions`` ``gradio_client`` sessions call ``/decode`` (the embedded verifier, with
the speculator the app's Playground opens with, ``specui.workbench.default_drafter``, so the
soak measures what a visitor runs; ``--drafter`` names another: ``ngram``, a shipped name such
as ``dflash`` or a speculator folder, decoded by the app's run service like any visitor's, at
K ``-k``, 0 (the default) for its own) one call after another for ``--minutes``; every
``--churn`` calls
a session leaves and a new visitor (a new Client, a new Gradio session) takes its
place, as strangers come and go on a public demo (0: the same sessions throughout).

Prints the app's resident memory (its process tree) every ``--sample-s`` seconds, then
RSS at the start (after the first decode: the verifier is loaded), after the warm-up,
at the end, and the growth after warm-up (MiB and %).  With ``--tracemalloc`` the app
starts tracing Python's allocations at the end of the warm-up and writes a snapshot at
the end, so what it holds then is the growth: the script prints the source lines
holding most of it, and the object types whose counts grew (slower: for finding
causes, not for the numbers).  Exits 1 if any call failed other than "queue full".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.load_driver import App, Call, decode_call, tree_rss_bytes  # noqa: E402

MIB = 1024 * 1024

# Runs app.py; the first SIGUSR1 starts tracemalloc (after the warm-up: imports and the
# model load stay untraced, and fast), each later one writes a snapshot of what was
# allocated since and is still held, with object counts and the Gradio sessions held, to
# $SPECUI_SOAK_DUMPS/tm-N.*.
TRACE_WRAP = r"""
import collections, gc, json, os, runpy, signal, sys, tracemalloc
out = os.environ["SPECUI_SOAK_DUMPS"]
def dump(signum, frame):
    n = len([f for f in os.listdir(out) if f.endswith(".json")])
    gc.collect()
    if n:
        own = tracemalloc.Filter(False, tracemalloc.__file__)
        snap = tracemalloc.take_snapshot().filter_traces([own])
        snap.dump(os.path.join(out, f"tm-{n}.snap"))
    objs = gc.get_objects()
    holders = [o for o in objs if type(o).__name__ == "StateHolder"]
    info = {"types": collections.Counter(type(o).__name__ for o in objs).most_common(300),
            "gradio_sessions": sum(len(h.session_data) for h in holders)}
    with open(os.path.join(out, f"tm-{n}.json"), "w") as f:
        json.dump(info, f)
    if not n:
        tracemalloc.start(4)
signal.signal(signal.SIGUSR1, dump)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def space_python() -> str:
    """The interpreter of tests/ui/test_space.py's virtualenv (same key as there)."""
    h = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        h.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    py = REPO / ".venv-space" / h.hexdigest()[:16] / "bin" / "python"
    if not py.is_file():
        raise SystemExit(
            f"{py} is missing: build it with `pytest tests/ui/test_space.py` or pass --python"
        )
    return str(py)


def space_env(
    data: Path, session_idle_s: float | None, folder: Path | None = None
) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPECUI_", "VIRTUAL_ENV", "PYTHONPATH", "GRADIO_"))
    }
    # The model cache is kept (the converted verifier: the Space's is kept on its disk too).
    return {
        **keep,
        "SPACE_ID": "specui-soak/specui",
        "HF_HUB_OFFLINE": "1",
        "SPECUI_HOST": "127.0.0.1",
        "GRADIO_TEMP_DIR": str(data / "gradio"),
        "SPECUI_SOAK_DUMPS": str(data),
        **({"SPECUI_CACHE": os.environ["SPECUI_CACHE"]} if "SPECUI_CACHE" in os.environ else {}),
        **({"SPECUI_SESSION_IDLE_S": str(session_idle_s)} if session_idle_s is not None else {}),
        # A speculator folder outside the app's folders: the operator lets visitors name it.
        **({"SPECUI_EXTRA_ROOTS": str(folder)} if folder is not None else {}),
    }


def app_default_drafter() -> str:
    """The speculator the app's Playground opens with on a fresh data dir (the soak's app has
    one: no trained folders), as ``specui.workbench`` picks it."""
    from specui.algorithms.resolve import BUILTIN, shipped_drafters
    from specui.workbench import default_drafter

    return default_drafter([*BUILTIN, *shipped_drafters()])


class Load:
    """``sessions`` visitors calling /decode until stopped; a new Client every ``churn`` calls."""

    def __init__(
        self,
        url: str,
        sessions: int,
        churn: int,
        max_new_tokens: int,
        drafter: str,
        k: int = 0,
    ) -> None:
        self.url, self.sessions, self.churn, self.max_new_tokens = (
            url,
            sessions,
            churn,
            max_new_tokens,
        )
        self.drafter, self.k = drafter, k
        self.calls: list[Call] = []
        self.visitors = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._session, args=(s,), daemon=True) for s in range(sessions)
        ]

    def _session(self, s: int) -> None:
        from gradio_client import Client

        i, client = 0, None
        while not self.stop.is_set():
            if client is None or (self.churn and i % self.churn == 0):
                if client is not None:
                    client.close()
                client = Client(self.url, verbose=False)
                with self._lock:
                    self.visitors += 1
            c = decode_call(client, s, i, self.max_new_tokens, self.drafter, self.k)
            with self._lock:
                self.calls.append(c)
            i += 1
            if c.outcome == "queue_full":
                time.sleep(0.5)
        if client is not None:
            client.close()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)


def _dump(app: App, data: Path, n: int) -> None:
    os.kill(app.proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 300
    while not (data / f"tm-{n}.json").is_file():
        if time.monotonic() > deadline:
            raise SystemExit("the app wrote no tracemalloc snapshot")
        time.sleep(1)


def _report_tracemalloc(data: Path) -> None:
    import tracemalloc

    snap = tracemalloc.Snapshot.load(str(data / "tm-1.snap"))
    ia, ib = (json.loads((data / f"tm-{n}.json").read_text()) for n in (0, 1))
    held = sum(s.size for s in snap.statistics("filename"))
    print(
        f"\ntracemalloc: allocated after the warm-up and still held at the end: "
        f"{held / MIB:.1f} MiB (Python's allocations only: not torch's tensors, "
        f"not the allocator's free lists); "
        f"Gradio sessions held {ia['gradio_sessions']} -> {ib['gradio_sessions']}"
    )
    print("largest by line:")
    for st in snap.statistics("lineno")[:15]:
        frame = st.traceback[0]
        print(f"  {st.size / 1024:9.1f} KiB {st.count:7d} blocks  {frame.filename}:{frame.lineno}")
    ta, tb = dict(ia["types"]), dict(ib["types"])
    grown = sorted(((tb.get(k, 0) - ta.get(k, 0), k) for k in tb), reverse=True)[:10]
    print("object counts grown: " + ", ".join(f"{k} {d:+d}" for d, k in grown if d > 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="minutes of load")
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument(
        "--warmup-minutes", type=float, default=5.0, help="growth is measured from here"
    )
    ap.add_argument(
        "--churn", type=int, default=20, help="calls per visitor before a new one comes (0: never)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument(
        "--drafter",
        default=None,
        help="what /decode drafts with (default: the app's Playground speculator): ngram, a"
        " shipped name (dflash, dspark, ...) or a folder",
    )
    ap.add_argument(
        "-k", "--num-speculative-tokens", type=int, default=0, help="K (0: the drafter's own)"
    )
    ap.add_argument("--sample-s", type=float, default=15.0, help="seconds between RSS prints")
    ap.add_argument(
        "--tracemalloc", action="store_true", help="snapshots after warm-up and at the end (slow)"
    )
    ap.add_argument(
        "--session-idle-s",
        type=float,
        help="the app's SPECUI_SESSION_IDLE_S (default: its own, an hour; a short run wants ~60)",
    )
    ap.add_argument(
        "--python", help="the app's interpreter (default: tests/ui/test_space.py's virtualenv)"
    )
    args = ap.parse_args()
    from specui.algorithms.resolve import shipped_drafters  # the app's own list of names

    if args.drafter is None:
        args.drafter = app_default_drafter()
    # A shipped name (dflash) is a name even where a folder of that name lies in the cwd.
    shipped = args.drafter in shipped_drafters()
    folder = Path(args.drafter).expanduser()
    folder = folder.resolve() if folder.is_dir() and not shipped else None
    drafter = str(folder) if folder is not None else args.drafter
    warmup_s = (
        min(args.warmup_minutes, args.minutes / 2) * 60
    )  # a short run still has a second half

    data = Path(tempfile.mkdtemp(prefix="specui-soak-"))
    python = args.python or space_python()
    t0 = time.monotonic()
    with App(
        data,
        queue_size=16,
        timeout_s=900,
        python=python,
        env=space_env(data, args.session_idle_s, folder),
        wrap=TRACE_WRAP if args.tracemalloc else None,
    ) as app:
        from gradio_client import Client

        # Loads the verifier (and the drafter) before anything is measured.
        first = Client(app.url, verbose=False)
        k = args.num_speculative_tokens
        first.predict("Hello.", drafter, "embedded", k, 8, 0.0, 0, True, api_name="/decode")
        first.close()
        start_rss = tree_rss_bytes(app.proc.pid)
        print(
            f"app {app.url} (pid {app.proc.pid}, {python}) up and warm in "
            f"{time.monotonic() - t0:.0f} s; "
            f"RSS {start_rss / MIB:.0f} MiB; {args.sessions} sessions for {args.minutes:g} min, "
            f"churn {args.churn}, drafter {args.drafter} (K {k or 'its own'})",
            flush=True,
        )
        load = Load(app.url, args.sessions, args.churn, args.max_new_tokens, drafter, k)
        t_load = time.monotonic()
        load.start()
        samples: list[tuple[float, int]] = []
        warm_rss, dumped = None, False
        try:
            while (t := time.monotonic() - t_load) < args.minutes * 60:
                rss = tree_rss_bytes(app.proc.pid)
                samples.append((t, rss))
                if warm_rss is None and t >= warmup_s:
                    warm_rss = rss
                    if args.tracemalloc:
                        _dump(app, data, 0)
                        dumped = True
                ok = sum(c.outcome == "ok" for c in load.calls)
                print(
                    f"t={t / 60:5.1f} min  rss={rss / MIB:7.1f} MiB  calls ok {ok}  "
                    f"visitors {load.visitors}",
                    flush=True,
                )
                time.sleep(min(args.sample_s, max(0.0, args.minutes * 60 - t)))
            end_rss = tree_rss_bytes(app.proc.pid)
            if dumped:
                _dump(app, data, 1)
        finally:
            load.finish()

    calls = load.calls
    errors = [c for c in calls if c.outcome == "error"]
    ok = [c for c in calls if c.outcome == "ok"]
    warm_rss = warm_rss or end_rss
    growth = end_rss - warm_rss
    print(
        f"\ncalls {len(calls)}: ok {len(ok)}, "
        f"queue full {sum(c.outcome == 'queue_full' for c in calls)}, "
        f"errors {len(errors)}; visitors {load.visitors}"
    )
    print(
        f"RSS start {start_rss / MIB:.1f} MiB · after {warmup_s / 60:g} min warm-up "
        f"{warm_rss / MIB:.1f} MiB · end ({args.minutes:g} min) {end_rss / MIB:.1f} MiB · "
        f"peak {max(r for _, r in samples) / MIB:.1f} MiB"
    )
    print(f"growth after warm-up: {growth / MIB:+.1f} MiB ({100 * growth / warm_rss:+.1f}%)")
    if args.tracemalloc:
        _report_tracemalloc(data)
    for c in errors[:5]:
        print(f"error (session {c.session}): {c.message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
