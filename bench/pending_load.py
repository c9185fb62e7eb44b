"""Does a visitor's slow model load slow another visitor's decode?  By hand (issue 50):

    .venv/bin/python bench/pending_load.py [--pending-s 20] [--rounds 3] [--repeats 3]
        [--max-new-tokens 400]

Starts a hub on loopback (``tests.support.hub_server``) whose tiny model's download takes
``--pending-s`` seconds, and ``app.py --allow-hub`` pointed at it.  In one run, visitor B
decodes (the embedded verifier, n-gram, a long answer) in alternating phases of
``--repeats`` timed decodes: alone, then while visitors A1 and A2 each wait on such a load
(as many loads as there are decode slots: before issue 50 they held both), ``--rounds``
times, and alone once more.  Alternating phases put the machine's drift (other processes,
a clock that slows) on both kinds alike; one alone phase then one pending phase did not
(runs of that bench moved 0.83-1.26 with the same code).  Timing starts after the app's
start-up preload (its cost measure), and each alone phase follows ``--warm`` untimed decodes
(the embedded verifier is loaded again after each round).  Prints each phase's median, the
ratio pending / alone of the medians of all their decodes (passes within 1.2), each pending
phase against its two alone neighbours, and where the CPU went: per decode, the decode
thread's CPU and the time beside it (waiting: on the GIL, on the HTTP round trips), and the
busiest threads of the app and of this process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.hub_models import tiny_repo  # noqa: E402
from tests.support.hub_server import LoopbackHub  # noqa: E402
from tests.support.load_driver import App  # noqa: E402

# A long answer, so that a decode runs its --max-new-tokens (a short one ends in ~30 tokens
# and a quarter second, where the machine's noise alone moves a median by 20%).
PROMPT = "Count from one to one hundred in words, separated by commas."


TOKENS: list[int] = []  # each timed decode's output length


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of process ``pid``, by ``name/tid``: where
    a phase's CPU goes (the decode's thread, Gradio's event loop, the loads' threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_report(label: str, before: dict[str, float], after: dict[str, float], wall: float) -> None:
    """Print the threads that used the most CPU between two ``thread_cpu`` samples."""
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    total = sum(used.values())
    top = sorted(used.items(), key=lambda kv: -kv[1])[:4]
    parts = ", ".join(f"{k} {v:.1f}" for k, v in top if v >= 0.05)
    print(f"  {label}: {total:.1f} CPU s in {wall:.1f} s ({total / wall:.0%} of a core); {parts}")


# Per phase kind: CPU seconds by thread over its timed decodes, of the app and of this process
# (the visitors' clients, the loopback hub); the timed wall seconds; the decode thread's CPU s.
CPU: dict[str, list] = {}
PIDS: dict[str, int] = {}


def timed_decodes(client, n: int, max_new: int, phase: str | None = None) -> list[float]:
    out = []
    for i in range(n):
        before = {who: thread_cpu(pid) for who, pid in PIDS.items()}
        t0 = time.perf_counter()
        res = client.predict(
            PROMPT, "ngram", "embedded", 4, max_new, 0.0, i, True, api_name="/decode"
        )
        out.append(time.perf_counter() - t0)
        assert res["num_output_tokens"] >= 1
        TOKENS.append(res["num_output_tokens"])
        if phase is not None:
            acc = CPU.setdefault(phase, [{who: {} for who in PIDS}, 0.0, 0.0])
            deltas = {}
            for who, pid in PIDS.items():
                for k, v in thread_cpu(pid).items():
                    deltas[who, k] = v - before[who].get(k, 0.0)
                    acc[0][who][k] = acc[0][who].get(k, 0.0) + deltas[who, k]
            acc[1] += out[-1]
            # The decode's thread: the app's busiest over this call (Gradio's workers take
            # turns, so it is not always the same thread).
            acc[2] += max(v for (who, _), v in deltas.items() if who == "app")
    return out


def pending_decodes(b, hub, app_url: str, args, used: int) -> tuple[list[float], int]:
    """``args.repeats`` decodes of visitor B while two fresh loads wait on their downloads
    (two loads at a time, as many as there are decode slots: before issue 50 they held
    both); returns the times and how many hub repositories are now used."""
    from gradio_client import Client

    times: list[float] = []
    while len(times) < args.repeats:
        jobs = []
        for _ in range(2):  # each repo loads once, then stays loaded: fresh ones each time
            a = Client(app_url, verbose=False)
            args_a = ("red green blue", "ngram", f"slow/model-{used}", 2, 4, 0.0, 0, False)
            used += 1
            jobs.append(a.submit(*args_a, api_name="/decode"))
        started = time.monotonic()
        while not all(hub.weight_requests(f"slow/model-{used - j - 1}") for j in (0, 1)):
            time.sleep(0.1)
        # Decode only while both loads are still waiting on their downloads.
        while time.monotonic() - started < args.pending_s * 0.6 and len(times) < args.repeats:
            times += timed_decodes(b, 1, args.max_new_tokens, "pending")
            if any(j.done() for j in jobs):
                print("a load finished early: the phase's timing may mix")
        for j in jobs:
            j.result(timeout=args.pending_s * 3)
    return times, used


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pending-s", type=float, default=20.0, help="seconds each load waits")
    ap.add_argument("--repeats", type=int, default=3, help="timed decodes per phase")
    ap.add_argument("--rounds", type=int, default=3, help="alone-pending rounds, alone last too")
    ap.add_argument("--max-new-tokens", type=int, default=400)
    ap.add_argument("--warm", type=int, default=2, help="untimed decodes before an alone phase")
    args = ap.parse_args()

    from gradio_client import Client

    repos = {f"slow/model-{i}": tiny_repo(delay_s=args.pending_s) for i in range(64)}
    data = Path(tempfile.mkdtemp(prefix="specui-pending-"))
    alone: list[list[float]] = []  # per alone phase
    pending: list[list[float]] = []  # per pending phase
    with LoopbackHub(repos) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(data / "hf")}
        env.pop("HF_HUB_OFFLINE", None)
        with App(data, queue_size=16, env=env, flags=("--allow-hub",)) as app:
            PIDS.update(app=app.proc.pid, bench=os.getpid())
            # The start-up preload measures the cost model (seconds of CPU): not beside the
            # first alone phase.
            deadline = time.monotonic() + 300
            while "preloaded" not in app.log_tail() and time.monotonic() < deadline:
                time.sleep(0.5)
            b = Client(app.url, verbose=False)
            used = 0
            for r in range(args.rounds + 1):
                # Untimed: (re)loads the embedded verifier, which the loaded hub models pushed
                # out of the two kept (VERIFIERS_KEPT), and a decode more: the first after a
                # load runs on cold memory, which would make "alone" read slow.
                timed_decodes(b, args.warm, args.max_new_tokens)
                alone.append(timed_decodes(b, args.repeats, args.max_new_tokens, "alone"))
                if r < args.rounds:
                    times, used = pending_decodes(b, hub, app.url, args, used)
                    pending.append(times)
    med = statistics.median
    all_alone = [t for phase in alone for t in phase]
    all_pending = [t for phase in pending for t in phase]
    ratio = med(all_pending) / med(all_alone)
    # Each pending phase against the mean of the alone phases either side of it: a machine
    # whose speed drifts during the run moves both alike.
    paired = [med(p) / ((med(alone[i]) + med(alone[i + 1])) / 2) for i, p in enumerate(pending)]
    print(
        f"decode of {args.max_new_tokens} tokens, {args.rounds} rounds of {args.repeats}: alone"
        f" phases {', '.join(f'{med(p):.2f}' for p in alone)} s (median {med(all_alone):.2f}),"
        f" while two loads wait {args.pending_s:.0f} s each"
        f" {', '.join(f'{med(p):.2f}' for p in pending)} s (median {med(all_pending):.2f})"
    )
    print(f"output tokens per decode: {min(TOKENS)}-{max(TOKENS)}")
    print("CPU over each phase kind's timed decodes, by thread (name/tid: CPU s):")
    for phase, (by_who, wall, decode_cpu) in CPU.items():
        for who, used_cpu in by_who.items():
            cpu_report(f"{phase}, {who}", {}, used_cpu, wall)
        n = len(all_alone if phase == "alone" else all_pending)
        print(
            f"  {phase}: per decode, {wall / n:.3f} s wall, {decode_cpu / n:.3f} s CPU in the"
            f" decode's thread, {(wall - decode_cpu) / n:.3f} s beside it"
        )
    print(f"each pending phase / its two alone neighbours: {', '.join(f'{x:.2f}' for x in paired)}")
    print(f"pending / alone (medians of all) = {ratio:.2f} (must be <= 1.20)")
    ok = ratio <= 1.2
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
