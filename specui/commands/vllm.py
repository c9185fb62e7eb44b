"""``specui vllm``: serve a speculator with a real vLLM, benchmark it, extract hidden states.

    specui vllm serve --verifier embedded --speculator runs/dflash -k 4
    specui vllm bench --speculator runs/dflash --prompts humaneval --limit 8 --concurrency 4
    specui vllm bench --speculator none --prompts demo --base-url http://127.0.0.1:8000
    specui vllm extract --verifier embedded --prompts gsm-symbolic --limit 32 --out cache/hidden

vLLM runs from its own virtualenv (``bash scripts/setup_vllm.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from specui.commands import add_ngram_arguments, arg_values, int_list, ngram_options
from specui.errors import SpecUIError


def _server_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM server (launched by SpecUI)")
    g.add_argument(
        "--verifier",
        default=None,
        help=(
            "embedded (default) | a Hugging Face folder | a hub id; with --base-url it only names"
            " the runs"
        ),
    )
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    g.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (the server has no authentication)",
    )
    g.add_argument("--port", type=int, default=None, help="default: a free port")
    g.add_argument(
        "--python",
        default=None,
        help="vLLM's Python (default $SPECUI_VLLM_PYTHON or .venv-vllm/bin/python)",
    )
    g.add_argument("--tensor-parallel-size", type=int, default=1)
    g.add_argument("--gpu-memory-utilization", type=float, default=None)
    g.add_argument(
        "--kv-cache-bytes", type=int, default=None, help="KV cache size (CPU default 1 GiB)"
    )
    g.add_argument("--dtype", default=None, help="default: float32 on CPU, vLLM's choice on GPU")
    g.add_argument(
        "--no-enforce-eager",
        dest="enforce_eager",
        action="store_false",
        default=None,
        help="let vLLM compile (default on CPU: eager, which starts in seconds instead of minutes)",
    )
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="CPU builds: cores for vLLM's threads (default: all but one)",
    )
    g.add_argument("--vllm-args", default="", help="more vLLM arguments, one shell-quoted string")
    g.add_argument(
        "--startup-timeout", type=float, default=600.0, help="seconds to wait for /health"
    )
    g.add_argument(
        "--spec-decode-metrics",
        default="detailed",
        choices=["detailed", "summary", "none"],
        help=(
            "per-request acceptance in each response (detailed: every verify step, stored as steps)"
        ),
    )


def _config(args: argparse.Namespace, speculator: str | None = None):
    from specui.algorithms.ngram import NgramConfig
    from specui.vllm.launch_plan import ServerConfig, parse_extra_args

    return ServerConfig(
        # extract has no n-gram flags: it gets the default
        ngram=NgramConfig.from_options(ngram_options(args)),
        verifier=args.verifier or "embedded",
        speculator=speculator,
        num_speculative_tokens=getattr(args, "num_speculative_tokens", None),
        extra_args=parse_extra_args(args.vllm_args),
        **arg_values(
            args,
            "host",
            "port",
            "python",
            "tensor_parallel_size",
            "gpu_memory_utilization",
            "kv_cache_bytes",
            "dtype",
            "enforce_eager",
            "max_model_len",
            "cpu_threads",
        ),
        startup_timeout_s=args.startup_timeout,
        allow_remote_bind=args.allow_remote,
        spec_decode_metrics=args.spec_decode_metrics,
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "vllm", help="serve, benchmark and extract hidden states with a real vLLM server"
    )
    vs = p.add_subparsers(dest="vllm_command", required=True, metavar="{serve,bench,extract}")

    serve = vs.add_parser("serve", help="serve the verifier (with a speculator) until Ctrl-C")
    serve.add_argument(
        "--speculator", default=None, help="a speculators-format folder, or ngram (default: none)"
    )
    serve.add_argument(
        "-k", "--num-speculative-tokens", type=int, default=None, help="default: the checkpoint's"
    )
    add_ngram_arguments(serve)
    _server_options(serve)
    serve.set_defaults(func=cmd_serve)

    bench = vs.add_parser(
        "bench", help="benchmark speculators against the plain verifier; runs are stored"
    )
    bench.add_argument(
        "--speculator", action="append", default=[], help="a folder | ngram | none (repeatable)"
    )
    bench.add_argument("-k", "--num-speculative-tokens", type=int, default=None)
    add_ngram_arguments(bench)
    bench.add_argument(
        "--prompts", default="demo", help="a prompt set or a JSONL file (held-out split)"
    )
    bench.add_argument("--limit", type=int, default=None, help="first N prompts")
    bench.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--temperature", type=float, default=0.0)
    bench.add_argument("--top-p", type=float, default=1.0)
    bench.add_argument("--top-k", type=int, default=0)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--api", default="completions", choices=["completions", "chat"])
    bench.add_argument(
        "--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens"
    )
    bench.add_argument(
        "--no-baseline", dest="baseline", action="store_false", help="skip the plain-verifier run"
    )
    bench.add_argument(
        "--base-url", default=None, help="measure a server that is already running instead"
    )
    bench.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the attached server's API key (never stored)",
    )
    bench.add_argument("--db", default=None, metavar="PATH", help="store file")
    bench.add_argument("--json", action="store_true", help="print a JSON object with the runs")
    _server_options(bench)
    bench.set_defaults(func=cmd_bench)

    ex = vs.add_parser("extract", help="verifier hidden states for training, extracted by vLLM")
    ex.add_argument("--prompts", default="gsm-symbolic")
    ex.add_argument("--split", default="train", help="train | eval | all")
    ex.add_argument("--limit", type=int, default=None)
    ex.add_argument(
        "--max-new-tokens", type=int, default=256, help="length of the self-distilled responses"
    )
    ex.add_argument(
        "--aux-layers", type=int_list, default=None, help="verifier layer ids (default 2,n/2,n-3)"
    )
    ex.add_argument("--out", required=True, help="folder for the hidden-state files")
    ex.add_argument(
        "--cache-dir", default=None, help="self-distilled responses cache (default OUT/..)"
    )
    ex.add_argument("--concurrency", type=int, default=4)
    _server_options(ex)
    ex.set_defaults(func=cmd_extract)


def cmd_serve(args: argparse.Namespace) -> int:
    from specui.vllm.server import VLLMServer

    server = VLLMServer.launch(_config(args, args.speculator), wait=False)
    try:
        print(f"vllm: {server.command_line}", flush=True)
        print(f"vllm: log {server.log_path}", flush=True)
        server.wait_ready(args.startup_timeout)
        print(
            f"vllm: serving {server.model} at {server.base_url}/v1 (ready after"
            f" {server.ready_after_s:.0f} s; Ctrl-C stops)",
            flush=True,
        )
        while True:
            server.check_alive()
            time.sleep(1.0)
    finally:
        server.stop()
        print("vllm: server stopped", file=sys.stderr, flush=True)


def cmd_bench(args: argparse.Namespace) -> int:
    from specui.store import Store
    from specui.vllm.bench import bench
    from specui.vllm.client import BenchSettings

    if args.limit is not None and args.limit < 1:
        raise SpecUIError(f"--limit must be >= 1, got {args.limit}")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise SpecUIError(f"environment variable {args.api_key_env} is not set")
    settings = BenchSettings(
        **arg_values(
            args,
            "max_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "concurrency",
            "api",
            "ignore_eos",
        )
    )

    def say(m: str) -> None:
        if not args.json:
            print(f"vllm bench: {m}", file=sys.stderr, flush=True)

    store = Store(args.db)
    runs, comparison = bench(
        store,
        speculators=args.speculator,
        settings=settings,
        api_key=api_key,
        **arg_values(
            args, "prompts", "limit", "verifier", "num_speculative_tokens", "baseline", "base_url"
        ),
        server_config=_config(args),
        log=say,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "run_ids": [r.run_id for r in runs],
                    "runs": comparison.rows,
                    "vllm": {
                        r.run_id: {
                            "aggregate_tokens_per_s": r.aggregate_tokens_per_s,
                            "ttft_ms": r.ttft_ms,
                            "itl_ms": r.itl_ms,
                            "counters": r.counters,
                            "step_source": r.step_source,
                        }
                        for r in runs
                    },
                },
                default=str,
            )
        )
        return 0
    extra = {r.run_id: r for r in runs}
    keys = [
        "run_id",
        "drafter",
        "algorithm",
        "acceptance_length",
        "tokens_per_step",
        "draft_acceptance_rate",
        "tokens_per_s",
        "speedup",
    ]
    pos = [c.key for c in comparison.columns if c.key.startswith("acceptance_pos_")][:8]
    header = [*keys, "aggregate_tok_s", "ttft_ms", "itl_ms", "counter_tau", *pos]
    print("\t".join(header))
    for row in comparison.rows:
        r = extra[row["run_id"]]
        vals = {
            **row,
            "aggregate_tok_s": r.aggregate_tokens_per_s,
            "ttft_ms": r.ttft_ms["mean"],
            "itl_ms": r.itl_ms["mean"],
            "counter_tau": (r.counters or {}).get("acceptance_length"),
        }
        print(
            "\t".join(
                f"{vals.get(k):.3f}"
                if isinstance(vals.get(k), float)
                else ("-" if vals.get(k) is None else str(vals.get(k)))
                for k in header
            )
        )
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from specui.data import load_prompts
    from specui.data.distill import self_distill
    from specui.verifier.model import Verifier
    from specui.vllm.extract import VLLMExtractor

    torch.set_num_threads(1)
    prompts = load_prompts(args.prompts, split=args.split, limit=args.limit)
    if not prompts:
        raise SpecUIError(f"prompt set {args.prompts!r} has no {args.split} prompts")
    out = Path(args.out)
    cache = Path(args.cache_dir) if args.cache_dir else out.parent
    verifier_choice = args.verifier or "embedded"
    verifier = Verifier.load(verifier_choice)
    print(
        f"vllm extract: self-distilling {len(prompts)} responses (cached in {cache})",
        file=sys.stderr,
        flush=True,
    )
    samples = self_distill(verifier, prompts, args.max_new_tokens, cache_dir=cache)
    t0 = time.monotonic()
    with VLLMExtractor.from_verifier(
        verifier_choice,
        verifier,
        args.aux_layers,
        server_config=_config(args),
        concurrency=args.concurrency,
    ) as ex:
        paths = ex.extract(samples, out)
    tokens = sum(len(s) for s in samples)
    print(
        f"vllm extract: {len(paths)} files, {tokens} tokens in {time.monotonic() - t0:.0f} s (with"
        f" server start-up) -> {out}"
    )
    return 0
