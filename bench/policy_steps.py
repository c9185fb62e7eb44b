"""Where a drafter's decoding time goes, step by step, against plain decoding.  By hand:

    .venv/bin/python bench/policy_steps.py [--limit 12] [--drafter dflash --drafter eagle3]
                                           [--policy adaptive|fixed] [--precision gguf-q8]

Decodes the first ``--limit`` Spec-Bench questions (128 tokens, greedy, one thread) with plain
decoding and each drafter in turn, prompt by prompt as ``specui bench`` does, and sums each
run's draft time (the policy's choice included), verify time and the rest of the loop, by the
number of drafts a step sent.  A learned drafter that loses to plain decoding under the policy
shows here whether it loses in its drafts (a probe's draft includes its catch-up), in the verify
of the rows it sends, or in steps that cost more than a plain one although they send nothing.
Quote it on a quiet machine, with plain decoding in the same run (it always is).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specui.benchmark import bench_prompts  # noqa: E402
from specui.engine import Decoding  # noqa: E402
from specui.policy import make_policy  # noqa: E402
from specui.trace import SamplingParams  # noqa: E402
from specui.workbench import WORKBENCH  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--drafter", action="append", help="repeatable (default: the four shipped)")
    ap.add_argument("--policy", default="adaptive")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = ["none", *(args.drafter or ["dflash", "dspark", "eagle3", "peagle"])]
    v = WORKBENCH.verifier("embedded", args.precision)
    prompts = [p.encode(v) for p in bench_prompts("spec-bench", args.limit)]
    totals = {n: Counter() for n in names}
    with ExitStack() as stack:
        drafters = {n: stack.enter_context(WORKBENCH.drafter(n, v, None)) for n in names}
        policies = {n: make_policy(args.policy) for n in names}
        for i, ids in enumerate(prompts):
            for n, d in drafters.items():
                run = Decoding(
                    v,
                    d,
                    ids,
                    max_new_tokens=args.max_new_tokens,
                    sampling=SamplingParams(),
                    seed=i,
                    policy=policies[n],
                )
                t = totals[n]
                for s in run:
                    sent = len(s.draft_token_ids)
                    t["steps"] += 1
                    t["tokens"] += len(s.emitted_token_ids)
                    t["draft"] += s.draft_time_s
                    t["verify"] += s.verify_time_s
                    t[f"steps {sent}"] += 1
                    t[f"draft {sent}"] += s.draft_time_s
                    t[f"verify {sent}"] += s.verify_time_s
                t["decode"] += run.result.wall_time_s - run.prefill_time_s
    base = totals["none"]["tokens"] / totals["none"]["decode"]
    for n, t in totals.items():
        rate = t["tokens"] / t["decode"]
        other = t["decode"] - t["draft"] - t["verify"]
        print(
            f"{n}: {rate:.1f} tok/s ({rate / base:.3f}x plain), {t['steps']} steps,"
            f" {t['tokens'] / t['steps']:.3f} tokens a step; draft {t['draft']:.2f} s,"
            f" verify {t['verify']:.2f} s, rest {other:.2f} s of {t['decode']:.2f} s"
        )
        for k in range(0, 33):
            c = t[f"steps {k}"]
            if c:
                print(
                    f"  {k} sent: {c} steps, verify {1e3 * t[f'verify {k}'] / c:.2f} ms,"
                    f" draft {1e3 * t[f'draft {k}'] / c:.2f} ms a step"
                )
    model = getattr(policies[names[-1]], "cost", None)
    if model is not None:
        print("cost model:", model.summary())


if __name__ == "__main__":
    main()
