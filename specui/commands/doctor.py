"""``specui doctor``: why a speculator's acceptance is low, and how to fix it
(``specui.doctor``)."""

from __future__ import annotations

import argparse
import json
import sys

from specui.commands import add_precision_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor", help="diagnose a speculator: ranked findings with evidence, cause and fix"
    )
    p.add_argument("speculator", help="a shipped drafter name or a speculators-format folder")
    p.add_argument(
        "--verifier", default="embedded", help="embedded | HF folder | .gguf file | hub id"
    )
    add_precision_argument(p)
    p.add_argument(
        "--prompts",
        default=None,
        help="prompt set or JSONL file (default: the model card's set, else spec-bench:qa)",
    )
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64, help="greedy continuation per prompt")
    p.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="the K to check (default: the config's)",
    )
    p.add_argument(
        "--vllm",
        action="store_true",
        help="also serve it with vLLM and compare per-position acceptance",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: steady timings)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-save", action="store_true", help="do not store the report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from specui.doctor import DoctorOptions, diagnose, save_report, speculator_folder, to_text
    from specui.verifier.model import Verifier

    opts = DoctorOptions(
        prompts=args.prompts,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        k=args.num_speculative_tokens,
        vllm=args.vllm,
    )
    speculator_folder(args.speculator)  # a wrong name fails before the verifier loads
    torch.set_num_threads(max(1, args.threads))
    verifier = Verifier.load(args.verifier, precision=args.precision)
    report = diagnose(args.speculator, verifier, args.verifier, opts)
    saved = None if args.no_save else save_report(report)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(to_text(report))
    if saved is not None:
        print(f"report stored in {saved}", file=sys.stderr)
    return 1 if report.errors else 0
