"""The ``specui`` subcommands; what several of them share lives here."""

from __future__ import annotations

import argparse


def add_precision_argument(p: argparse.ArgumentParser) -> None:
    """``--precision`` for commands that load a verifier, defaulting to the app's own."""
    from specui.verifier import PRECISIONS, default_precision

    p.add_argument("--precision", choices=PRECISIONS, default=default_precision(),
                   help="verifier precision (default: SPECUI_VERIFIER_PRECISION or auto; see specui.batch_invariant)")
