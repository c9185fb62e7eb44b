"""``specui bench``: the baseline and each drafter on the same prompts, stored and compared."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import torch

from specui.commands import add_draft_arguments, add_precision_argument, arg_values, ngram_options
from specui.errors import SpecUIError
from specui.trace import SamplingParams, check_decode_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="run the baseline and drafters on a prompt set and compare them"
    )
    p.add_argument(
        "--drafter",
        action="append",
        default=[],
        help="none | ngram | suffix | shipped name | folder | LEARNED+LOOKUP, e.g. dflash+suffix"
        " (repeatable)",
    )
    p.add_argument("--shipped", action="store_true", help="every drafter shipped in data/drafters")
    p.add_argument(
        "--prompts",
        default="demo",
        help="a prompt set name or a FILE.jsonl (prompt or messages per line)",
    )
    p.add_argument("--verifier", default="embedded")
    add_precision_argument(p)
    p.add_argument("--limit", type=int, default=None, help="first N prompts of the held-out split")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=None)
    add_draft_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 gives stable timings)"
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="PATH",
        help="store file (default: $SPECUI_DB, else $SPECUI_DATA_DIR/specui.db)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object with a `runs` list")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specui.algorithms.resolve import shipped_drafters
    from specui.benchmark import bench
    from specui.store import Store

    drafters = list(args.drafter)
    if args.shipped:
        shipped = list(shipped_drafters())
        if not shipped:
            raise SpecUIError("no drafters are shipped in data/drafters")
        drafters += shipped
    if not drafters:
        raise SpecUIError("name at least one --drafter (or --shipped)")
    if args.limit is not None and args.limit < 1:
        raise SpecUIError(f"--limit must be >= 1, got {args.limit}")
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    # Before the store opens: a bad setting must not even create the database file.
    check_decode_settings(**arg_values(args, "max_new_tokens", "seed", "num_speculative_tokens"))
    ngram = ngram_options(args)
    if args.threads < 1:
        raise SpecUIError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    store = Store(args.db)
    log = (
        (lambda m, _: None)
        if args.json
        else (lambda m, _: print(f"bench: {m}", file=sys.stderr, flush=True))
    )
    result = bench(
        store,
        verifier=args.verifier,
        drafters=drafters,
        prompts=args.prompts,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        num_speculative_tokens=args.num_speculative_tokens,
        seed=args.seed,
        progress=log,
        precision=args.precision,
        drafter_options=ngram,
        policy=args.policy,
    )
    run_ids, comparison = result.run_ids, result.comparison
    # Every metric per task group too (Spec-Bench's six), as the field reports it.
    groups = result.groups(store)
    if args.json:
        print(
            json.dumps(
                {
                    "run_ids": run_ids,
                    "runs": comparison.rows,
                    "groups": {g: c.rows for g, c in groups.items()},
                    "policy": args.policy,
                    "cost_model": result.cost_model.to_dict() if result.cost_model else None,
                    "slot_ece": [asdict(e) for e in result.slot_ece],
                    "calibration": {k: asdict(c) for k, c in result.calibrations.items()},
                    "columns": {
                        c.key: {"label": c.label, "definition": c.definition, "unit": c.unit}
                        for c in comparison.columns
                    },
                },
                default=str,
            )
        )
        return 0
    _print_table(comparison, None if not groups else "all")
    for group, comp in groups.items():
        print()
        _print_table(comp, group)
    if result.cost_model is not None:
        print()
        _print_costs(result.cost_model, comparison)
    if result.slot_ece:
        print()
        print_slot_ece(result.slot_ece, result.calibrations)
    return 0


def print_slot_ece(eces, calibrations) -> None:
    """ECE of each drafter's per-slot estimates (DSpark's confidence head, the suffix lookup's
    match shares, learned drafters' top-1 probabilities), and the fits refitted now."""
    from specui.metrics.slot_calibration import describe_calibration

    print(
        "per-slot estimates: drafter, slots (sent, up to each step's first rejection), ECE raw,"
        " ECE as the policy read them (its fit may have seen these prompts)"
    )
    for e in eces:
        if e.ece is None:
            print(f"  {e.drafter}\t-\tno per-slot estimates (the policy reads running rates)")
            continue
        print(f"  {e.drafter}\t{e.ece.slots}\t{e.ece.ece_raw:.3f}\t{e.ece.ece_calibrated:.3f}")
    for name, c in sorted(calibrations.items()):
        print(f"  refitted {describe_calibration(name, c)}")


def _print_costs(cost, comparison) -> None:
    """The cost model the policy chose by, and the break-even picture for this machine."""
    from specui.policy.choose import break_even_acceptance, run_speedup

    print(f"cost model ({', '.join(f'{k}={v}' for k, v in cost.key.items() if k != 'machine')})")
    print(f"  {cost.summary()}")
    ks = [k for k in (1, 2, 3, 4, 6, 8) if k + 1 <= max(len(cost.verify_s), 2) + 8]
    cells = []
    for k in ks:
        a = break_even_acceptance(cost.verify, k)
        cells.append(f"K={k}: {'never' if a is None else f'{a:.2f}'}")
    print("  break-even per-slot acceptance (no draft cost): " + ", ".join(cells))
    print("  each run on this curve: drafter, tau, tokens/step, expected speedup, measured")
    for row in comparison.rows:
        if row.get("algorithm") == "none":
            continue
        expected = run_speedup(row, cost.verify)
        measured = row.get("speedup")
        print(
            "  "
            + "\t".join(
                [
                    str(row.get("drafter")),
                    f"{row.get('acceptance_length') or 1.0:.2f}",
                    f"{row.get('tokens_per_step') or 1.0:.2f}",
                    "-" if expected is None else f"{expected:.2f}x",
                    "-" if measured is None else f"{measured:.2f}x",
                ]
            )
        )


def _print_table(comparison, group: str | None) -> None:
    keys = [
        "run_id",
        "drafter",
        "algorithm",
        "acceptance_length",
        "acceptance_length_95ci",
        "tokens_per_step",
        "draft_acceptance_rate",
        "tokens_per_s",
        "speedup",
        "speedup_95ci",
    ]
    pos = [c.key for c in comparison.columns if c.key.startswith("acceptance_pos_")][:8]
    header = (["group", "num_prompts"] if group else []) + keys + pos
    print("\t".join(header))
    for row in comparison.rows:
        cells = [group, str(row.get("num_prompts"))] if group else []
        for k in header[len(cells) :]:
            if k.endswith("_95ci"):  # the interval's two bounds in one cell
                lo, hi = (
                    row.get(k.removesuffix("_95ci") + "_ci_low"),
                    row.get(k.removesuffix("_95ci") + "_ci_high"),
                )
                cells.append("-" if lo is None or hi is None else f"{lo:.2f}-{hi:.2f}")
                continue
            val = row.get(k)
            cells.append(
                f"{val:.3f}" if isinstance(val, float) else ("-" if val is None else str(val))
            )
        print("\t".join(cells))
