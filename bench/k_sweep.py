"""Speedup over plain decoding against K, the number of drafted tokens (run by hand).

    .venv/bin/python bench/k_sweep.py [--drafter dflash --drafter dspark] [--ks 2,3,4,5,8]
        [--prompts 12] [--tokens 128] [--repeats 1] [--threads 1]

On this CPU a verify of K+1 tokens costs more than one plain step, and more the
larger K (bench/speedup_model.py, float32: tv(K)/t1 about 1.4 at K=3, 1.6-1.9 at
K=8; the default bf16 batch-invariant: about 1.2 at K=8), while the last slots of a
block are rarely accepted.  So the K that pays best can be smaller than the block
the drafter was trained with.  This runs the
held-out gsm-symbolic prompts greedily with plain decoding and each
(drafter, K), interleaved prompt by prompt so a burst of load hits all alike, and
prints tau, tokens/s and the speedup against plain decoding in the same run
(total plain time / total time, over the same output tokens: greedy outputs are
identical, which it checks).  A DFlash-family drafter drafts K slots with a
block of K+1 (K with DSpark); K larger than the trained block is refused.

Measured with ``--drafter eagle3 --drafter dspark --ks 2,3,5,8 --prompts 6 --tokens 96`` (one
repeat, one thread, nothing else running), the float32 verifier on 2026-11-29 (``--precision
fp32``), the default batch-invariant bf16 on 2026-11-30; tau / speedup over plain decoding:

    variant        float32         bf16
    plain          1.00  1.00x     1.00  1.00x    (15.15 and 16.42 tok/s)
    eagle3 K=2     2.19  1.00x     2.16  2.00x
    eagle3 K=3     2.49  1.37x     2.49  2.15x
    eagle3 K=5     2.76  1.32x     2.75  1.99x
    eagle3 K=8     2.99  1.26x     2.99  1.87x
    dspark K=2     1.85  0.85x     1.83  1.42x
    dspark K=3     2.00  1.15x     1.98  1.56x
    dspark K=5     2.12  1.06x     2.08  1.84x
    dspark K=8     2.21  1.02x     2.23  1.62x

In float32 K=3 pays best for both (K=2 was slower per step than K=3: a 3-row float32 verify
ran slower than a 4-row one).  Cheaper bf16 verification makes every K pay, keeps EAGLE-3's
best at 3 and moves DSpark's to 5.  Greedy output was identical to plain for all.
"""

from __future__ import annotations

import argparse
import time

import torch

from specui.algorithms.resolve import resolve_drafter
from specui.commands import add_precision_argument
from specui.data import load_prompts
from specui.engine import generate
from specui.verifier.model import Verifier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--drafter", action="append", default=None, help="shipped name or folder (repeatable)"
    )
    ap.add_argument(
        "--ks", default="2,3,4,5,8", help="comma-separated K values (capped at each drafter's own)"
    )
    ap.add_argument("--prompts", type=int, default=12, help="first N held-out gsm-symbolic prompts")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    add_precision_argument(ap)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    v = Verifier.load("embedded", precision=a.precision)
    print(f"verifier precision: {v.precision}", flush=True)
    prompts = [p.encode(v) for p in load_prompts("gsm-symbolic", "eval", limit=a.prompts)]
    variants = {"plain": resolve_drafter("none", v)}
    for choice in a.drafter or ["dflash", "dspark"]:
        own = resolve_drafter(choice, v)  # at its own K; smaller Ks load it again, resized
        for k in sorted({min(int(x), own.num_speculative_tokens) for x in a.ks.split(",")}):
            variants[f"{choice} K={k}"] = (
                own if k == own.num_speculative_tokens else resolve_drafter(choice, v, k)
            )
    generate(v, variants["plain"], prompts[0], max_new_tokens=8)  # warm-up
    seconds = dict.fromkeys(variants, 0.0)
    tokens = dict.fromkeys(variants, 0)
    accepted = dict.fromkeys(variants, 0)
    steps = dict.fromkeys(variants, 0)
    same = dict.fromkeys(variants, True)
    for rep in range(a.repeats):
        for i, p in enumerate(prompts):
            plain_ids: list[int] = []
            for name, drafter in variants.items():
                t0 = time.perf_counter()
                r = generate(v, drafter, p, max_new_tokens=a.tokens, seed=0)
                seconds[name] += time.perf_counter() - t0
                tokens[name] += len(r.output_token_ids)
                drafted = [s for s in r.steps if s.num_drafted]
                steps[name] += len(drafted)
                accepted[name] += sum(s.num_accepted for s in drafted)
                if name == "plain":
                    plain_ids = r.output_token_ids
                same[name] &= r.output_token_ids == plain_ids
            print(f"repeat {rep + 1}/{a.repeats} prompt {i + 1}/{len(prompts)}", flush=True)
    base = seconds["plain"] / tokens["plain"]
    print(
        f"verifier={v.name} prompts={len(prompts)} tokens={a.tokens} repeats={a.repeats} "
        f"threads={a.threads}"
    )
    print(f"{'variant':<16}{'tau':>7}{'tok/s':>9}{'speedup':>10}{'same output':>13}")
    for name in variants:
        tau = 1 + accepted[name] / steps[name] if steps[name] else 1.0
        per_token = seconds[name] / tokens[name]
        print(
            f"{name:<16}{tau:>7.2f}{1 / per_token:>9.2f}{base / per_token:>9.2f}x"
            f"{str(same[name]):>13}"
        )


if __name__ == "__main__":
    main()
