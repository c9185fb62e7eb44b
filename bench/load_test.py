"""A bounded load test of the running dashboard on loopback, run by hand.

    .venv/bin/python bench/load_test.py [--sessions 20] [--duration 120] [--max-new-tokens 24]
    [--queue-size 16] [--drafters 20 [--warmup 60] [--bound-mib 3072]]

Starts ``app.py`` on a free loopback port with a fresh data dir, then
``--sessions`` concurrent ``gradio_client`` sessions (one ``Client`` each, in
threads) call ``/decode`` with the embedded default verifier and the n-gram
drafter, varied prompts, for ``--duration`` seconds.  A refused call ("queue
full") waits ``--backoff`` seconds before the session tries again.

``--drafters N``: session s decodes with drafter s mod N instead, each a different one: the
four shipped drafters, then copies of them in the app's data folder (trained speculators, to
the app: a new drafter each).  Issue 50's memory check:

    .venv/bin/python bench/load_test.py --sessions 20 --drafters 20 --duration 300

must end with 0 errors (a load refused for memory counts as "refused", with its message),
peak RSS within ``--bound-mib`` (docs/space.md states it), and RSS growth after warm-up
under 5%: the median RSS of the load's last ``--window`` seconds over the median of the
``--window`` seconds that follow the first ``--warmup`` seconds (the drafters' first loads),
from samples taken every 0.5 s while the sessions call (not after: their drafters then go
idle).

Prints calls, ok, queue-full, other errors (must be 0), p50/p95 latency of ok
calls, throughput, the peak resident memory of the app's process tree (sampled
every 0.5 s), and the store check: every ok call's run stored, finished
("done"), with the returned output and its session as owner; no run left
"running".  Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.load_driver import App, check_store, percentile, run_load  # noqa: E402

# The app's peak RSS the docs state (docs/space.md, "Memory over a long run"): the app with the
# embedded verifier (1.5 GiB), the idle drafters' pool cap (SPECUI_DRAFTER_POOL_MB, 1 GiB), and
# the drafters of the DECODE_EVENTS events in flight, 256 MiB each (the largest shipped one
# holds 222 MiB served, held_bytes, beside its decode state).  Measured peaks: 3,369 and
# 3,548 MiB (docs/space.md).
BOUND_MIB = 1536 + 1024 + 6 * 256


def make_drafters(data: Path, n: int) -> tuple[str, ...]:
    """``n`` different drafter choices: the shipped names, then copies of the shipped folders
    under the app's data folder (as trained or imported speculators are)."""
    import shutil

    from specui.algorithms.resolve import shipped_drafters

    shipped = shipped_drafters()
    names = list(shipped)[:n]
    for i in range(n - len(names)):
        name = list(shipped)[i % len(shipped)]
        dest = data / "speculators" / f"{name}-copy-{i:02d}"
        shutil.copytree(shipped[name], dest)
        names.append(str(dest))
    return tuple(names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--queue-size", type=int, default=16, help="the app's --queue-size")
    ap.add_argument("--backoff", type=float, default=0.5, help="seconds a refused session waits")
    ap.add_argument(
        "--keep", action="store_true", help="keep the data dir (DB and app.log) and print its path"
    )
    ap.add_argument("--drafters", type=int, default=0, help="sessions use N different drafters")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before growth counts")
    ap.add_argument(
        "--window", type=float, default=60.0, help="seconds of RSS samples each median takes"
    )
    ap.add_argument(
        "--bound-mib", type=float, default=BOUND_MIB, help="the peak RSS the docs state"
    )
    args = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="specui-load-"))
    drafters = make_drafters(data, args.drafters) if args.drafters else ("ngram",)
    load0 = os.getloadavg()
    t0 = time.monotonic()
    with App(data, queue_size=args.queue_size) as app:
        print(
            f"app on {app.url} (pid {app.proc.pid}, queue size {args.queue_size}) up in "
            f"{time.monotonic() - t0:.1f} s; data {data}",
            flush=True,
        )
        # One call first, so the verifier load (a few seconds) is not counted as latency under load.
        from gradio_client import Client

        warm = Client(app.url, verbose=False)
        t1 = time.monotonic()
        known = {
            warm.predict("Hello.", "ngram", "embedded", 4, 8, 0.0, 0, True, api_name="/decode")[
                "run_id"
            ]
        }
        warm.close()
        print(f"warm-up decode {time.monotonic() - t1:.1f} s", flush=True)

        res = run_load(
            app.url,
            app.proc.pid,
            args.sessions,
            duration_s=args.duration,
            max_new_tokens=args.max_new_tokens,
            backoff_s=args.backoff,
            progress=lambda s: print(f"\r{s}", end="", file=sys.stderr, flush=True),
            drafters=drafters,
            k=0 if args.drafters else 4,  # learned drafters at their own K
        )
        print(file=sys.stderr)
        load1 = os.getloadavg()
        # Still serving after the load?
        after = Client(app.url, verbose=False)
        out = after.predict(
            "Still there?", "ngram", "embedded", 4, 8, 0.0, 0, True, api_name="/decode"
        )
        after.close()
        alive = "run_id" in out
        known.add(out["run_id"])
    check = check_store(app.db, res, known)

    ok = res.ok
    lat = sorted(c.latency_s for c in ok)
    tokens = sum(c.num_output_tokens for c in ok)
    full = res.count("queue_full")
    print(
        f"\nsessions {args.sessions}, duration {args.duration:.0f} s (wall {res.wall_s:.1f} s), "
        f"max_new_tokens {args.max_new_tokens}, queue size {args.queue_size}"
    )
    print(f"calls        {len(res.calls)}")
    print(f"ok           {len(ok)}")
    print(
        f"queue full   {full}"
        + (
            f"   (message: {next(c.message for c in res.calls if c.outcome == 'queue_full')!r})"
            if full
            else ""
        )
    )
    refused = [c for c in res.calls if c.outcome == "refused"]
    print(f"refused      {len(refused)} (loads not admitted, with a message)")
    for msg, n in Counter(c.message for c in refused).most_common(3):
        print(f"  {n} x {msg[:300]}")
    print(f"errors       {len(res.errors)}")
    for msg, n in Counter(c.message for c in res.errors).most_common(5):
        print(f"  {n} x {msg[:300]}")
    print(
        f"latency ok   p50 {percentile(lat, 50):.2f} s   p95 {percentile(lat, 95):.2f} s   max "
        f"{(lat[-1] if lat else float('nan')):.2f} s"
    )
    print(
        f"throughput   {len(ok) / res.wall_s:.2f} decodes/s, {tokens / res.wall_s:.1f} tokens/s "
        f"({tokens} tokens)"
    )
    print(
        f"RSS (app tree) first {res.rss_first_bytes / 2**20:.0f} MiB, peak"
        f" {res.rss_peak_bytes / 2**20:.0f} MiB, last {res.rss_last_bytes / 2**20:.0f} MiB"
    )
    print(
        f"runs stored  {check.stored_done} done of {len(ok)} ok calls; missing {check.missing}, not"
        f" done {check.not_done}, wrong output {check.wrong_output}, wrong owner"
        f" {check.wrong_owner}, left running {check.left_running}, extra {check.extra}"
    )
    print(f"app answers after the load: {alive}")
    bounded = True
    if args.drafters:
        w, end = args.warmup, args.duration
        first = res.rss_median(w, w + args.window)
        last = res.rss_median(end - args.window, end)
        growth = res.rss_growth(w, args.window, end)
        bounded = res.rss_peak_bytes <= args.bound_mib * 2**20 and growth < 0.05
        print(
            f"drafters     {len(drafters)} different; peak {res.rss_peak_bytes / 2**20:.0f} MiB"
            f" (bound {args.bound_mib:.0f} MiB)"
        )
        print(
            f"growth       {growth * 100:+.1f}% (< 5%): median RSS {last / 2**20:.0f} MiB over"
            f" {end - args.window:.0f}-{end:.0f} s against {first / 2**20:.0f} MiB over"
            f" {w:.0f}-{w + args.window:.0f} s (the first {w:.0f} s: warm-up)"
        )
        # The warm-up must cover every drafter's first load: each session's first answer.
        firsts = [min(c.end_s for c in ok if c.session == s) for s in {c.session for c in ok}]
        last_first = max(firsts, default=float("nan"))
        print(
            f"warm-up      every session's first call (its drafter's first load) answered by"
            f" {last_first:.0f} s" + ("" if last_first <= w else f": after the {w:.0f} s warm-up")
        )
        print(
            "RSS by minute (median MiB): "
            + ", ".join(f"{res.rss_median(m, m + 60) / 2**20:.0f}" for m in range(0, int(end), 60))
        )
    print(
        f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
        f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} CPUs)"
    )
    passed = not res.errors and ok and check.clean and alive and bounded
    print("PASS" if passed else "FAIL")
    if args.keep:
        print(f"kept {data}")
    else:
        import shutil

        shutil.rmtree(data, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
