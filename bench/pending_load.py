"""Does a visitor's slow model load slow another visitor's decode?  By hand (issue 50):

    .venv/bin/python bench/pending_load.py [--pending-s 20] [--repeats 5] [--max-new-tokens 32]

Starts a hub on loopback (``tests.support.hub_server``) whose tiny model's download takes
``--pending-s`` seconds, and ``app.py --allow-hub`` pointed at it.  In one run, visitor B
decodes ``--repeats`` times alone (the embedded verifier, n-gram), then ``--repeats`` times
while visitors A1 and A2 each wait on such a load (as many loads as there are decode slots:
before issue 50 they held both), then alone again.  Prints the median decode time of each
phase and the ratio pending / alone; passes when it is within 1.2 (alone: the better of the
two alone phases' medians, so a machine that slows down during the run does not pass it).
"""

from __future__ import annotations

import argparse
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


def timed_decodes(client, n: int, max_new: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        res = client.predict(
            PROMPT, "ngram", "embedded", 4, max_new, 0.0, i, True, api_name="/decode"
        )
        out.append(time.perf_counter() - t0)
        assert res["num_output_tokens"] >= 1
        TOKENS.append(res["num_output_tokens"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pending-s", type=float, default=20.0, help="seconds each load waits")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()

    import os

    from gradio_client import Client

    repos = {f"slow/model-{i}": tiny_repo(delay_s=args.pending_s) for i in range(64)}
    data = Path(tempfile.mkdtemp(prefix="specui-pending-"))
    with LoopbackHub(repos) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(data / "hf")}
        env.pop("HF_HUB_OFFLINE", None)
        with App(data, queue_size=16, env=env, flags=("--allow-hub",)) as app:
            b = Client(app.url, verbose=False)
            timed_decodes(b, 1, args.max_new_tokens)  # warm: the verifier is loaded
            alone = timed_decodes(b, args.repeats, args.max_new_tokens)
            pending: list[float] = []
            used = 0
            while len(pending) < args.repeats:
                # Two fresh loads (each repo loads once, then stays loaded).
                jobs = []
                for _ in range(2):
                    a = Client(app.url, verbose=False)
                    repo = f"slow/model-{used}"
                    used += 1
                    args_a = ("red green blue", "ngram", repo, 2, 4, 0.0, 0, False)
                    jobs.append(a.submit(*args_a, api_name="/decode"))
                started = time.monotonic()
                while not all(hub.weight_requests(f"slow/model-{used - j - 1}") for j in (0, 1)):
                    time.sleep(0.1)
                # Decode only while both loads are still waiting on their downloads.
                while time.monotonic() - started < args.pending_s * 0.6 and len(pending) < (
                    args.repeats
                ):
                    pending += timed_decodes(b, 1, args.max_new_tokens)
                    if any(j.done() for j in jobs):
                        print("a load finished early: the phase's timing may mix")
                for j in jobs:
                    j.result(timeout=args.pending_s * 3)
                timed_decodes(b, 1, args.max_new_tokens)  # embedded loaded again, untimed
            # The loaded hub models pushed the embedded verifier out of the two kept
            # (VERIFIERS_KEPT): load it again before timing.
            timed_decodes(b, 1, args.max_new_tokens)
            after = timed_decodes(b, args.repeats, args.max_new_tokens)
    base = min(statistics.median(alone), statistics.median(after))
    ratio = statistics.median(pending) / base
    print(
        f"decode of {args.max_new_tokens} tokens, median of {args.repeats}: alone"
        f" {statistics.median(alone):.2f} s, while two loads wait {args.pending_s:.0f} s each"
        f" {statistics.median(pending):.2f} s, alone again {statistics.median(after):.2f} s"
    )
    print(f"output tokens per decode: {min(TOKENS)}-{max(TOKENS)}")
    print(f"pending / alone = {ratio:.2f} (must be <= 1.20)")
    ok = ratio <= 1.2
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
