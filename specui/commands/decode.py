"""``specui decode``: one prompt through the engine, printed or as JSON steps."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from specui.commands import add_draft_arguments, add_precision_argument, arg_values, ngram_options
from specui.errors import SpecUIError
from specui.trace import SamplingParams, check_decode_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode", help="generate a completion with speculative decoding")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument(
        "--prompt-ids", help="the prompt as token ids ('1 2 3'; for verifiers without a tokenizer)"
    )
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the verifier's chat template"
    )
    p.add_argument(
        "--verifier", default="embedded", help="embedded | HF folder | .gguf file | hub id"
    )
    add_precision_argument(p)
    p.add_argument(
        "--drafter",
        default="none",
        help="none | ngram | a shipped drafter name | a speculators folder",
    )
    p.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="K (default: the drafter's own)",
    )
    add_draft_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per step, then a summary object"
    )
    p.add_argument(
        "--db", default=None, help="also store the run in this SQLite file (see `specui runs`)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specui.data.prompts import check_prompt_text, encode_text

    # Every setting is checked before the verifier loads (seconds) and before any output.
    if args.prompt is not None:
        check_prompt_text(args.prompt)
    prompt_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    check_decode_settings(**arg_values(args, "max_new_tokens", "seed", "num_speculative_tokens"))
    ngram = ngram_options(args)
    if args.threads is not None and args.threads < 1:
        raise SpecUIError(f"--threads must be >= 1, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    from specui.service import DecodeRequest, decode_and_record
    from specui.store import Store
    from specui.workbench import WORKBENCH

    request = DecodeRequest(
        drafter=args.drafter,
        num_speculative_tokens=args.num_speculative_tokens,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        stop_strings=tuple(args.stop),
        drafter_options=ngram or None,
        policy=args.policy,
    )
    verifier = WORKBENCH.verifier(args.verifier, args.precision)
    check_decode_settings(max_new_tokens=args.max_new_tokens, max_context=verifier.max_context)
    store = Store(args.db) if args.db else None
    with WORKBENCH.drafter(args.drafter, verifier, args.num_speculative_tokens, **ngram) as drafter:
        if prompt_ids is None:
            prompt_ids = encode_text(verifier, args.prompt, chat=args.chat)
        text = args.prompt if args.prompt is not None else args.prompt_ids
        recording = decode_and_record(
            store, verifier, [(drafter, request)], [(prompt_ids, text)], prompt_set="cli"
        )
        for event in recording:
            if args.json and event.step is not None:
                print(json.dumps(event.step.to_dict(), ensure_ascii=False), flush=True)
    lane = recording.lanes[0]
    result = lane.results[-1]
    if args.json:
        run = {} if lane.run_id is None else {"run_id": lane.run_id}
        print(
            json.dumps(
                {"summary": True, "drafter": drafter.name, **run, **result.summary()},
                ensure_ascii=False,
            )
        )
    else:
        print(result.output_text)
        s = result.summary()
        print(
            f"[{drafter.name}] {s['num_output_tokens']} tokens in {s['wall_time_s']:.2f}s "
            f"({s['tokens_per_s']:.1f} tok/s), tau {s['acceptance_length']:.2f}, "
            f"{s['tokens_per_step']:.2f} tokens/step, {s['num_steps']} steps",
            file=sys.stderr,
        )
    return 0


# Token-id prompts get the same cap as text ones (about as many tokens as characters allowed).
MAX_PROMPT_IDS = 200_000


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
        if len(ids) > MAX_PROMPT_IDS:
            raise SpecUIError(f"--prompt-ids has {len(ids):,} ids; the limit is {MAX_PROMPT_IDS:,}")
    except ValueError:
        raise SpecUIError(
            f"--prompt-ids takes integers separated by spaces or commas, got {text!r}"
        ) from None
    if not ids:
        raise SpecUIError("the prompt is empty")
    return ids
