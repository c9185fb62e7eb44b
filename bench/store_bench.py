"""Store throughput, by hand: ``.venv/bin/python bench/store_bench.py [--steps N] [--runs M]``.

Measures (in a fresh temporary store):
1. recording N step traces (default 100,000) through RunRecorder, as the
   benchmark does: the time the decoding side spends in ``step()`` and the time
   until everything is committed;
2. building the comparison of M runs (default 50, N steps spread over them,
   with confidence scores) and writing its CSV and one run's per-step CSV.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
import time
from pathlib import Path

from specui.metrics.comparison import compare
from specui.metrics.csv import write_steps_csv
from specui.store import DecodingSettings, RunRecorder, Store
from specui.trace import FinalTokenKind, GenerationResult, StepTrace

K = 7


def make_steps(n: int, seed: int) -> list[StepTrace]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        acc = rng.randint(0, K)
        ids = [rng.randrange(49152) for _ in range(K)]
        conf, c = [], 1.0
        for _ in range(K):
            c *= rng.uniform(0.6, 1.0)
            conf.append(c)
        out.append(
            StepTrace(
                step=i,
                context_len=200 + i,
                draft_token_ids=ids,
                draft_texts=[f"t{t}" for t in ids],
                draft_probs=[rng.random() for _ in range(K)],
                target_probs=[rng.random() for _ in range(K)],
                confidences=conf,
                num_accepted=acc,
                final_token_id=rng.randrange(49152),
                final_token_text="x",
                final_token_kind=FinalTokenKind.BONUS if acc == K else FinalTokenKind.CORRECTED,
                emitted_token_ids=ids[:acc] + [1],
                draft_time_s=0.002,
                verify_time_s=0.02,
            )
        )
    return out


def record(store: Store, run_id: int, steps: list[StepTrace], per_prompt: int) -> float:
    """Returns the seconds spent inside step() calls (the decoding side's cost)."""
    in_step = 0.0
    with RunRecorder(store, run_id) as rec:
        for p in range(0, len(steps), per_prompt):
            chunk = steps[p : p + per_prompt]
            rec.begin_prompt(p // per_prompt, f"prompt {p // per_prompt}")
            for s in chunk:
                t = time.perf_counter()
                rec.step(s)
                in_step += time.perf_counter() - t
            out = [t for s in chunk for t in s.emitted_token_ids]
            rec.end_prompt(
                GenerationResult([1, 2, 3], out, "", chunk, "max_tokens", 0.05 * len(chunk), K)
            )
    return in_step


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--per-prompt", type=int, default=500, help="steps per prompt")
    args = ap.parse_args()

    print(f"generating {args.steps:,} step traces ...", flush=True)
    steps = make_steps(args.steps, 0)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        store = Store(db)
        settings = DecodingSettings(num_speculative_tokens=K)

        run = store.create_run(
            verifier="v", prompt_set="bench", algorithm="dflash", settings=settings
        )
        t0 = time.perf_counter()
        in_step = record(store, run.id, steps, args.per_prompt)
        total = time.perf_counter() - t0
        print(
            f"1. store {args.steps:,} steps: {total:.2f} s until committed "
            f"({args.steps / total:,.0f} steps/s); decoding side spent {in_step:.3f} s in step() "
            f"({1e6 * in_step / args.steps:.1f} us/step)"
        )
        size_mb = db.stat().st_size / 1e6 + (
            db.with_name(db.name + "-wal").stat().st_size / 1e6
            if db.with_name(db.name + "-wal").exists()
            else 0
        )
        print(f"   file size {size_mb:.1f} MB ({1000 * size_mb / args.steps:.2f} KB/step)")
        store.delete_run(run.id)

        # M runs sharing the same N steps in total: one baseline-like + drafters.
        per_run = args.steps // args.runs
        ids = []
        t0 = time.perf_counter()
        for r in range(args.runs):
            algo = (
                "none"
                if r == 0
                else random.Random(r).choice(["dflash", "dspark", "peagle", "eagle3"])
            )
            run = store.create_run(
                verifier="v", prompt_set="bench", algorithm=algo, settings=settings
            )
            record(
                store, run.id, steps[r * per_run : (r + 1) * per_run], min(args.per_prompt, per_run)
            )
            ids.append(run.id)
        print(
            f"   ({args.runs} runs x {per_run:,} steps stored in {time.perf_counter() - t0:.2f} s)"
        )

        t0 = time.perf_counter()
        cmp = compare(store, ids)
        t_cmp = time.perf_counter() - t0
        t0 = time.perf_counter()
        buf = io.StringIO()
        cmp.to_csv(buf)
        t_csv = time.perf_counter() - t0
        print(
            f"2. comparison of {args.runs} runs ({args.steps:,} steps, with confidences):"
            f" {t_cmp:.3f} s; its CSV: {1000 * t_csv:.1f} ms ({len(cmp.columns)} columns)"
        )
        t0 = time.perf_counter()
        buf = io.StringIO()
        write_steps_csv(store, [ids[1]], buf)
        print(
            f"   per-step CSV of one run ({per_run:,} steps):"
            f" {1000 * (time.perf_counter() - t0):.0f} ms"
        )
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
