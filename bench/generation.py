"""Self-distillation's generators side by side, in one run (issue "Drafter training at the
CPU's limit", item 4):

    PYTHONPATH=. OMP_NUM_THREADS=1 nice .venv/bin/python bench/generation.py [--prompts 64]
        [--max-new-tokens 128] [--batch-size 64] [--engines fast,transformers] [--procs 1,2]

Each engine (``specui.data.generate.measure_generation``) in bf16 at one batch size on the
first ``--prompts`` prompts of the general corpus's training split (chat template, sorted by
length as ``self_distill`` sorts them), one thread: prompt + response tokens/s and response
tokens/s, and each engine's ratio to ``transformers``.  ``--procs`` also times the fast engine
through ``distill_in_processes`` (N worker processes, one thread each, into a scratch cache).
Other programs on the machine's cores change every number: read the ratios, measured minutes
apart, not the absolute rates.  Nothing is written outside a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specui.data import load_prompts  # noqa: E402
from specui.data.generate import measure_generation  # noqa: E402
from specui.verifier.model import Verifier  # noqa: E402


def measure_procs(prompts, procs: int, max_new_tokens: int, batch_size: int) -> dict[str, float]:
    """Seconds and tokens/s of ``distill_in_processes`` (bf16) filling an empty cache."""
    from specui.data.distill import distill_in_processes, self_distill

    with tempfile.TemporaryDirectory() as cache:
        # An empty shipped folder: data/corpus/ already holds the general prompts' responses,
        # and the workers (which inherit the environment) would find nothing to generate.
        before = os.environ.get("SPECUI_SHIPPED_DIR")
        os.environ["SPECUI_SHIPPED_DIR"] = cache
        try:
            t0 = time.perf_counter()
            distill_in_processes(
                "embedded",
                prompts,
                procs,
                max_new_tokens,
                Path(cache) / "c",
                batch_size,
                generation_dtype=torch.bfloat16,
            )
            seconds = time.perf_counter() - t0
            verifier = Verifier.load("embedded")
            samples = self_distill(verifier, prompts, max_new_tokens, cache_dir=Path(cache) / "c")
        finally:
            if before is None:
                del os.environ["SPECUI_SHIPPED_DIR"]
            else:
                os.environ["SPECUI_SHIPPED_DIR"] = before
    response = sum(len(s.response_ids) for s in samples)
    total = sum(len(s) for s in samples)
    return {
        "seconds": seconds,
        "tokens_per_s": total / seconds,
        "response_tokens_per_s": response / seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--engines", default="fast,transformers")
    ap.add_argument("--procs", default="", help="comma-separated worker counts, e.g. 1,2")
    a = ap.parse_args()
    torch.set_num_threads(1)
    verifier = Verifier.load("embedded")
    prompt_list = load_prompts("general", split="train", limit=a.prompts)
    ids = sorted((p.encode(verifier) for p in prompt_list), key=len)
    results = {}
    for engine in a.engines.split(","):
        r = measure_generation(
            verifier, ids, a.max_new_tokens, engine, a.batch_size, torch.bfloat16
        )
        results[engine] = r
        print(
            f"{engine:>12}: {r['seconds']:6.1f} s, {r['tokens_per_s']:7.0f} tok/s (prompt +"
            f" response), {r['response_tokens_per_s']:7.0f} response tok/s, {r['response_tokens']}"
            f" response tokens; per CPU second ({r['cpu_seconds']:.1f} s):"
            f" {r['tokens_per_cpu_s']:.0f} tok/s, {r['response_tokens_per_cpu_s']:.0f} response"
            " tok/s",
            flush=True,
        )
    if "transformers" in results:
        base = results["transformers"]
        for engine, r in results.items():
            print(
                f"{engine:>12}: {r['tokens_per_s'] / base['tokens_per_s']:.2f}x transformers (all"
                f" tokens), {r['response_tokens_per_s'] / base['response_tokens_per_s']:.2f}x"
                " (response tokens); per CPU second"
                f" {r['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f}x,"
                f" {r['response_tokens_per_cpu_s'] / base['response_tokens_per_cpu_s']:.2f}x"
            )
    for procs in [int(p) for p in a.procs.split(",") if p]:
        r = measure_procs(prompt_list, procs, a.max_new_tokens, a.batch_size)
        print(
            f"{procs} process(es): {r['seconds']:6.1f} s (loads included), {r['tokens_per_s']:7.0f}"
            f" tok/s, {r['response_tokens_per_s']:7.0f} response tok/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
