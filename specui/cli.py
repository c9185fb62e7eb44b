"""The ``specui`` command line.  Each subcommand lives in ``specui/commands/``;
a module there exposes ``register(subparsers)`` which adds its parser and sets
``func`` to a callable taking the parsed args and returning an exit code."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from specui.trace import SpecUIError

# One module per command group; adding a command is adding a module here.
COMMAND_MODULES = ["decode", "runs", "bench", "train", "jobs", "vllm"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specui", description="Speculative decoding workbench")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"specui.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"specui.commands.{name}":
                continue  # command group not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except SpecUIError as e:
        print(f"specui: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specui: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
