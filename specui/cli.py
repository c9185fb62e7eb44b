"""The ``specui`` command line.  Each subcommand lives in ``specui/commands/``;
a module there exposes ``register(subparsers)`` which adds its parser and sets
``func`` to a callable taking the parsed args and returning an exit code."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing

from specui.commands import bench, decode, doctor, jobs, runs, train, vllm
from specui.errors import SpecUIError

# One module per command group; adding a command is adding a module here.
COMMAND_MODULES = [decode, runs, bench, train, jobs, vllm, doctor]


class _Parser(argparse.ArgumentParser):
    """argparse with SpecUI's error convention: one line, ``specui: error: ...``, exit 2.

    argparse's own prints the usage block first; subparsers inherit this class."""

    def error(self, message: str) -> typing.NoReturn:
        sys.stderr.write(f"specui: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specui", description="Speculative decoding workbench")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except SpecUIError as e:
        print(f"specui: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specui: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `specui ... --json | head`: the reader left; say nothing more (stdout is gone).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
