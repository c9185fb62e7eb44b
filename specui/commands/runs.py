"""``specui runs``: list, show, replay, export (CSV, or speculators' acceptance.csv) and delete
stored benchmark runs."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from specui.commands import add_id_command, local_time, text_table
from specui.metrics.comparison import compare
from specui.metrics.csv import write_steps_csv
from specui.store import RunStatus, Store


def add_db_option(parser: argparse.ArgumentParser, *, on_subcommand: bool = False) -> None:
    # On the group (`specui runs --db X list`) and again on each subcommand
    # (`specui runs list --db X`); SUPPRESS keeps a subcommand from resetting it.
    parser.add_argument(
        "--db",
        default=argparse.SUPPRESS if on_subcommand else None,
        metavar="PATH",
        help=(
            "store file (default: $SPECUI_DATA_DIR/specui.db, else ~/.local/share/specui/specui.db)"
        ),
    )


# "csv": SpecUI's own columns (specui.metrics); "speculators": specui.export_speculators.
EXPORT_FORMATS = ("csv", "speculators")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list, show, replay, export and delete stored runs")
    add_db_option(p)
    common = argparse.ArgumentParser(add_help=False)
    add_db_option(common, on_subcommand=True)
    rs = p.add_subparsers(
        dest="runs_command",
        required=True,
        metavar="{list,show,replay,export,delete,calibrate}",
    )

    ls = rs.add_parser("list", parents=[common], help="stored runs, newest first")
    ls.add_argument("--status", choices=[s.value for s in RunStatus])
    ls.add_argument("--algorithm")
    ls.add_argument("--prompt-set")
    ls.add_argument("--verifier")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(func=cmd_list)

    show_help = "one run: settings, versions and metrics"
    add_id_command(rs, common, "show", show_help, "run_id", cmd_show)

    rp = rs.add_parser(
        "replay",
        parents=[common],
        help="one request's stored steps, step by step (as the Playground replays them)",
    )
    rp.add_argument("run_id", type=int)
    rp.add_argument(
        "--request",
        type=int,
        default=None,
        metavar="N",
        help="prompt index within the run (default: the first with steps)",
    )
    rp.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="STEPS_PER_S",
        help="pace of the output (default 0: all at once)",
    )
    rp.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per step (unknown values as null), then a summary object",
    )
    rp.set_defaults(func=cmd_replay)

    ex = rs.add_parser(
        "export",
        parents=[common],
        help="write a comparison (or per-step) CSV, or speculators' acceptance.csv",
    )
    ex.add_argument("--csv", required=True, metavar="FILE", help="output file ('-' for stdout)")
    ex.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default="csv",
        help=(
            "csv: SpecUI's comparison (or --steps) columns; speculators: the acceptance.csv of"
            " speculators' scripts/evaluate/evaluate.py (subset = prompt set, one row per run with"
            " drafts, acceptance_at_pos_i = a_(i+1); one drafter's runs, one per prompt set)"
        ),
    )
    flag = ex.add_argument
    runs_help = "runs to include (default: all, oldest first)"
    flag("--runs", type=int, nargs="+", metavar="ID", help=runs_help)
    flag("--steps", action="store_true", help="one row per decoding step instead of one per run")
    excel_help = "start the file with a UTF-8 BOM (Excel needs it for non-ASCII text)"
    flag("--excel", action="store_true", help=excel_help)
    ex.set_defaults(func=cmd_export)

    delete_help = "delete a run with its results and steps"
    add_id_command(rs, common, "delete", delete_help, "run_id", cmd_delete, force="delete a run")

    ca = rs.add_parser(
        "calibrate",
        parents=[common],
        help="refit each drafter's per-slot estimate temperature (what the adaptive policy"
        " reads) on the stored runs, per verifier weights",
    )
    ca.set_defaults(func=cmd_calibrate)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def cmd_list(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        runs = store.list_runs(
            status=args.status,
            algorithm=args.algorithm,
            prompt_set=args.prompt_set,
            verifier=args.verifier,
            limit=args.limit,
        )
        if not runs:
            print(f"no runs in {store.path}")
            return 0
        counts = store.count_results([r.id for r in runs if r.id is not None])
        rows = [
            [
                str(r.id),
                str(r.status),
                r.display_name,
                r.algorithm,
                str(r.backend),
                r.prompt_set,
                str(counts[r.id][0]),
                str(counts[r.id][1]),
                local_time(r.started_at),
            ]
            for r in runs
            if r.id is not None
        ]
    print(
        text_table(
            [
                "ID",
                "STATUS",
                "NAME",
                "ALGORITHM",
                "BACKEND",
                "PROMPT SET",
                "PROMPTS",
                "STEPS",
                "STARTED",
            ],
            rows,
        )
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        run = store.get_run(args.run_id)
        cmp = compare(store, [args.run_id])
    print(f"run {run.id}: {run.display_name}  [{run.status}]")
    for key, value in (
        ("algorithm", run.algorithm),
        ("drafter", run.drafter),
        ("verifier", run.verifier),
        ("backend", run.backend),
        ("prompt set", run.prompt_set),
        ("seed", run.seed),
        ("started", local_time(run.started_at)),
        ("ended", local_time(run.ended_at)),
        ("error", run.error),
    ):
        if value is not None:
            print(f"  {key:<11} {value}")
    print("  settings    " + ", ".join(f"{k}={v}" for k, v in sorted(run.settings.items())))
    print("  versions    " + ", ".join(f"{k} {v}" for k, v in sorted(run.versions.items())))
    print("metrics:")
    row = cmp.rows[0]
    skip = {
        "run_id",
        "label",
        "algorithm",
        "drafter",
        "verifier",
        "backend",
        "prompt_set",
        "status",
    }
    for c in cmp.columns:
        if c.key not in skip and row.get(c.key) is not None:
            print(f"  {c.label:<24} {_fmt(row[c.key])} {c.unit}".rstrip())
    return 0


def _json_safe(value: Any) -> Any:
    """NaN (a probability vLLM does not report) as null: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def _step_line(step: Any) -> str:
    def tok(t: int, text: str) -> str:
        return "?" if t < 0 else repr(text)

    drafts = " ".join(
        tok(t, x) for t, x in zip(step.draft_token_ids, step.draft_texts, strict=True)
    )
    line = (
        f"#{step.step:<4} drafted {step.num_drafted:<2} accepted {step.num_accepted:<2}"
        f" +{len(step.emitted_token_ids)}"
    )
    if step.num_drafted:
        line += f"  draft [{drafts}]"
    if len(step.emitted_token_ids) > step.num_accepted:
        line += f"  {step.final_token_kind} {tok(step.final_token_id, step.final_token_text)}"
    return line


def cmd_replay(args: argparse.Namespace) -> int:
    from specui.replay import load_replay, play

    with Store(args.db) as store:
        rp = load_replay(store, args.run_id, args.request)
    run, src = rp.run, rp.source
    if not args.json:
        print(
            f"run {run.id}: {run.display_name} · {run.backend} · {run.prompt_set} · request"
            f" {rp.prompt_index}"
        )
        print(f"steps from: {src.label}. {src.note}")
        print("'?' = a draft token the backend did not report")
    for step in play(rp.steps, args.rate):
        if args.json:
            print(json.dumps(_json_safe(step.to_dict()), ensure_ascii=False), flush=True)
        else:
            print(_step_line(step), flush=True)
    res = rp.result()
    summary = {
        "summary": True,
        "run_id": run.id,
        "request": rp.prompt_index,
        "backend": str(run.backend),
        "step_source": src.key,
        "real_order": src.real_order,
        "drafts_known": src.drafts_known,
        "note": src.note,
        "num_steps": res.num_steps,
        "num_output_tokens": len(res.output_token_ids),
        "acceptance_length": res.acceptance_length,
        "per_position_acceptance": res.per_position_acceptance,
        "stop_reason": rp.stop_reason,
    }
    if args.json:
        print(json.dumps(_json_safe(summary), ensure_ascii=False))
    else:
        a = ", ".join(f"{x:.2f}" for x in res.per_position_acceptance) or "-"
        print(
            f"{res.num_steps} steps, {len(res.output_token_ids)} tokens, tau"
            f" {res.acceptance_length:.2f}, a_k: {a}"
        )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "speculators":
        return _export_speculators(args)
    with Store(args.db) as store:
        if args.steps:
            if not args.runs:
                from specui.store import user_error

                raise user_error("--steps needs --runs ID [ID ...]")
            ids = args.runs
        else:
            ids = args.runs or [r.id for r in reversed(store.list_runs())]
        dest = sys.stdout if args.csv == "-" else args.csv
        if args.steps:
            write_steps_csv(store, ids, dest, bom=args.excel)
            what = f"steps of run(s) {', '.join(map(str, ids))}"
        else:
            compare(store, ids).to_csv(dest, bom=args.excel)
            what = f"{len(ids)} run(s)"
    if args.csv != "-":
        print(f"wrote {what} to {args.csv}")
    return 0


def _export_speculators(args: argparse.Namespace) -> int:
    from specui.export_speculators import write_acceptance_csv
    from specui.store import user_error

    # Refused, not ignored: --steps is another table, and a BOM would rename their
    # first column to '\ufeffsubset' for the csv readers the file is for.
    if args.steps:
        raise user_error("--format speculators writes one row per run; --steps is for --format csv")
    if args.excel:
        raise user_error(
            "--format speculators has no --excel: a BOM breaks the 'subset' header for speculators'"
            " readers"
        )
    with Store(args.db) as store:
        ids = args.runs or [r.id for r in reversed(store.list_runs())]
        dest = sys.stdout if args.csv == "-" else args.csv
        table = write_acceptance_csv(store, ids, dest)
    if table.skipped:
        print(
            f"skipped run(s) {', '.join(map(str, table.skipped))}: no drafts (speculators writes no"
            " row for them)",
            file=sys.stderr,
        )
    if args.csv != "-":
        print(
            f"wrote {len(table.rows)} subset row(s) (run(s) {', '.join(map(str, table.run_ids))})"
            f" to {args.csv}"
        )
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        store.delete_run(args.run_id, requester=None, force=args.force)
    print(f"deleted run {args.run_id}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from specui.metrics.slot_calibration import describe_calibration, refit_calibrations

    fitted_any = False
    with Store(args.db) as store:
        for name, fingerprint in store.list_verifiers():
            if not fingerprint:
                continue
            for proposer, c in sorted(refit_calibrations(store, fingerprint).items()):
                fitted_any = True
                print(f"{name} ({fingerprint[:12]}) {describe_calibration(proposer, c)}")
    if not fitted_any:
        print("no drafter has enough stored per-slot estimates to fit (runs of one drafter)")
    return 0
