"""Plain vs n-gram decoding on the embedded verifier, measured in one run.

    .venv/bin/python bench/decode.py [--repeats 3] [--max-new-tokens 96] [-k 4]

Prints per drafter: median tokens/s over repeats (each repeat = every prompt),
tau, and the speedup (baseline time per output token / this drafter's) against
plain decoding measured in the same run on the same prompts.  Greedy; one torch
thread for stable timings on small CPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specui.algorithms.resolve import resolve_drafter
from specui.engine import generate
from specui.verifier.model import Verifier

PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts" / "demo.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--verifier", default="embedded")
    ap.add_argument(
        "--drafter", action="append", default=None, help="drafters besides 'none' (default: ngram)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    v = Verifier.load(args.verifier)
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    prompts = [
        v.encode_messages(r["messages"]) if "messages" in r else v.encode(r["prompt"], chat=True)
        for r in rows
    ]
    names = ["none", *(args.drafter or ["ngram"])]
    drafters = {n: resolve_drafter(n, v, None if n == "none" else args.k) for n in names}
    generate(v, drafters["none"], prompts[0], max_new_tokens=8)  # warm-up
    per_token: dict[str, list[float]] = {n: [] for n in names}
    taus: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[list[int]]] = {n: [] for n in names}
    for rep in range(args.repeats):
        for n in names:  # interleaved, so drift on a noisy machine hits all alike
            t0 = time.perf_counter()
            results = [
                generate(v, drafters[n], p, max_new_tokens=args.max_new_tokens) for p in prompts
            ]
            elapsed = time.perf_counter() - t0
            tokens = sum(len(r.output_token_ids) for r in results)
            per_token[n].append(elapsed / tokens)
            steps = [s for r in results for s in r.steps if s.num_drafted]
            taus[n].append(1 + sum(s.num_accepted for s in steps) / len(steps) if steps else 1.0)
            if rep == 0:
                outputs[n] = [r.output_token_ids for r in results]
    base = statistics.median(per_token["none"])
    print(
        f"verifier={v.name} prompts={len(prompts)} max_new_tokens={args.max_new_tokens} "
        f"repeats={args.repeats} threads={args.threads}"
    )
    print(f"{'drafter':<16}{'tok/s (median)':>16}{'tau':>8}{'speedup':>10}{'same output':>13}")
    for n in names:
        med = statistics.median(per_token[n])
        same = outputs[n] == outputs["none"]
        print(
            f"{drafters[n].name:<16}{1 / med:>16.2f}{statistics.median(taus[n]):>8.2f}"
            f"{base / med:>9.2f}x{str(same):>13}"
        )


if __name__ == "__main__":
    main()
