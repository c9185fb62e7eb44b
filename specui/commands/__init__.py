"""The ``specui`` subcommands; what several of them share lives here."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def arg_values(args: argparse.Namespace, *names: str) -> dict:
    """``{name: args.name}`` for the given names: parsed flags passed on by the same names."""
    return {name: getattr(args, name) for name in names}


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers (spaces ignored)."""
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``specui jobs worker`` and ``workers.runner``: --until-idle, --import."""
    flag = p.add_argument
    flag("--until-idle", action="store_true", help="exit when nothing is queued or running")
    flag(
        "--import",
        dest="modules",
        action="append",
        default=[],
        metavar="MODULE",
        help="also import MODULE (registers job kinds)",
    )


def add_precision_argument(p: argparse.ArgumentParser) -> None:
    """``--precision`` for commands that load a verifier, defaulting to the app's own."""
    from specui.verifier.model import PRECISIONS, default_precision

    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=default_precision(),
        help="verifier precision (default: SPECUI_VERIFIER_PRECISION or auto; "
        "see specui.verifier.batch_invariant)",
    )


def add_ngram_arguments(p: argparse.ArgumentParser) -> None:
    """``--max-ngram`` / ``--min-ngram`` (vLLM's names as aliases): the n-gram lookup's sizes,
    the same for the local drafter and a vLLM server (``specui.algorithms.ngram``)."""
    from specui.algorithms.ngram import DEFAULT_NGRAM

    p.add_argument(
        "--max-ngram",
        "--prompt-lookup-max",
        dest="max_ngram",
        type=int,
        default=None,
        help=f"ngram: longest suffix to look up (default {DEFAULT_NGRAM.max_ngram})",
    )
    p.add_argument(
        "--min-ngram",
        "--prompt-lookup-min",
        dest="min_ngram",
        type=int,
        default=None,
        help=f"ngram: shortest suffix to look up (default {DEFAULT_NGRAM.min_ngram})",
    )


def ngram_options(args: argparse.Namespace) -> dict[str, int]:
    """The n-gram sizes given on the command line (checked: a bad pair is a SpecUIError)."""
    from specui.algorithms.ngram import NgramConfig

    given = {k: getattr(args, k, None) for k in ("max_ngram", "min_ngram")}
    NgramConfig.from_options(given)  # before any model loads
    return {k: v for k, v in given.items() if v is not None}


def add_policy_argument(p: argparse.ArgumentParser) -> None:
    """``--policy``: how many drafts each step sends (``specui.policy``)."""
    from specui.policy import DEFAULT_POLICY, POLICIES

    p.add_argument(
        "--policy",
        choices=POLICIES,
        default=DEFAULT_POLICY,
        help="adaptive (default): each step sends the number of drafts (0..K) that maximises "
        "expected tokens per second under the cost model measured at load; fixed: every draft, "
        "the raw drafter at its K",
    )


def add_draft_arguments(p: argparse.ArgumentParser) -> None:
    """The n-gram lookup's sizes and ``--policy``: how a local decode drafts (decode, bench)."""
    add_ngram_arguments(p)
    add_policy_argument(p)


def local_time(ts: float | None) -> str:
    """A stored timestamp as local time for a listing ("-" when unset)."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Rows under a header in left-aligned columns as wide as their widest cell."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def add_id_command(
    sub: argparse._SubParsersAction,
    common: argparse.ArgumentParser,
    name: str,
    help_text: str,
    id_name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    force: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand on one stored run or job, named by its id; with ``force`` ("cancel a job")
    also --force: act on one a dashboard session owns."""
    p = sub.add_parser(name, parents=[common], help=help_text)
    p.add_argument(id_name, type=int)
    if force is not None:
        p.add_argument(
            "--force", action="store_true", help=f"also {force} that a dashboard session owns"
        )
    p.set_defaults(func=func)
    return p
