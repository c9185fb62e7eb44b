"""The n-gram lookup under several (max_ngram, min_ngram) settings against one plain
baseline: same prompts, same verifier, one process, one store.

    .venv/bin/python bench/ngram_settings.py --prompts spec-bench --limit 12 \\
        --max-new-tokens 64 --settings 3:1,4:2,3:2 [--precision int8] [--db bench.db]

All runs decode prompt by prompt in turn (``specui.service.record_runs``), so a slow
spell on a shared machine hits every setting alike and the speedups stay comparable.
Prints, per setting: tau, tokens per step, drafts / steps, draft acceptance rate,
throughput and speedup over the plain run.  The default in ``specui.algorithms.ngram``
is the setting this picks (docs/results.md, "n-gram settings").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from specui.algorithms.ngram import NgramConfig
from specui.algorithms.simple import NgramDrafter, PlainDrafter
from specui.benchmark import bench_prompts
from specui.commands import add_precision_argument
from specui.errors import SpecUIError
from specui.metrics.comparison import compare
from specui.service import DecodeRequest, record_runs
from specui.store import Store
from specui.workbench import WORKBENCH


def parse_settings(text: str) -> list[NgramConfig]:
    """``"3:1,4:2"`` -> the configs (max:min each)."""
    out = []
    for part in text.split(","):
        hi, sep, lo = part.strip().partition(":")
        if not sep or not hi.isdigit() or not lo.isdigit():
            raise SpecUIError(f"a setting is MAX:MIN (e.g. 4:2), got {part!r}")
        out.append(NgramConfig(max_ngram=int(hi), min_ngram=int(lo)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="spec-bench")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--settings", default="3:1,4:2,3:2", help="MAX:MIN,... (n-gram sizes)")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--db", default=None, help="store (default: a temporary one)")
    add_precision_argument(ap)
    a = ap.parse_args()
    configs = parse_settings(a.settings)
    torch.set_num_threads(a.threads)
    db = Path(a.db) if a.db else Path(tempfile.mkdtemp(prefix="specui-ngram-")) / "bench.db"
    store = Store(db)
    prompts = bench_prompts(a.prompts, a.limit)
    v = WORKBENCH.verifier("embedded", a.precision)
    # K drafts every step: the settings' own acceptance, not the policy's choice of when to draft.
    request = DecodeRequest(
        drafter="ngram",
        num_speculative_tokens=a.num_speculative_tokens,
        max_new_tokens=a.max_new_tokens,
        policy="fixed",
    )
    runs = [(PlainDrafter(), DecodeRequest(drafter="none", max_new_tokens=a.max_new_tokens))]
    runs += [(NgramDrafter(a.num_speculative_tokens, c), request) for c in configs]

    def say(done: int, total: int) -> None:
        print(f"  prompt {done}/{total}", file=sys.stderr, flush=True)

    recorded = record_runs(store, v, runs, prompts, prompt_set=a.prompts, progress=say)
    rows = compare(store, [r.run_id for r in recorded]).rows
    print(
        f"{a.prompts}, {len(prompts)} prompts, {a.max_new_tokens} new tokens, "
        f"K={a.num_speculative_tokens}, verifier {rows[0].get('verifier_precision')}"
    )
    heads = ("setting", "tau", "tok/step", "drafts/steps", "acc rate", "tok/s", "speedup")
    widths = (10, 7, 9, 13, 9, 8, 9)
    cols = list(zip(heads, widths, strict=True))
    print(f"{heads[0]:<{widths[0]}}" + "".join(f"{h:>{w}}" for h, w in cols[1:]))
    names = ["plain", *(f"{c.max_ngram}..{c.min_ngram}" for c in configs)]
    for name, row in zip(names, rows, strict=True):
        steps = row["num_steps"] or 0
        cells = (
            f"{row['acceptance_length'] or 0:.3f}",
            f"{row['tokens_per_step'] or 0:.3f}",
            f"{(row['num_drafts'] or 0) / steps if steps else 0.0:.2f}",
            f"{row['draft_acceptance_rate'] or 0:.3f}",
            f"{row['tokens_per_s'] or 0:.1f}",
            f"{row['speedup'] or 1.0:.3f}x",
        )
        print(
            f"{name:<{widths[0]}}"
            + "".join(f"{c:>{w}}" for c, w in zip(cells, widths[1:], strict=True))
        )
    print(f"store: {db}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
