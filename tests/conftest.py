"""Shared fixtures: the embedded SmolLM2 verifier and the speculators reference fixtures (and
their verifier).  Helpers that are not fixtures live in tests/support/."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from tests.support.paths import FIXTURES

# Stable timings and no oversubscription on the 2-core CI machines.
torch.set_num_threads(1)

# The suite never reads or writes the user's data folder: what a developer's own runs left
# there (cost models, calibrations, runs) would change what the adaptive policy does in a
# test.  One folder for the session (tests that need their own set SPECUI_DATA_DIR themselves);
# subprocesses inherit it.
os.environ["SPECUI_DATA_DIR"] = tempfile.mkdtemp(prefix="specui-tests-")
atexit.register(shutil.rmtree, os.environ["SPECUI_DATA_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def embedded_verifier():
    from specui.verifier.model import Verifier

    return Verifier.load("embedded")


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    if not (FIXTURES / "verifier" / "config.json").is_file():
        pytest.fail(f"speculators fixtures not found at {FIXTURES} (set SPECUI_FIXTURES)")
    return FIXTURES


@pytest.fixture(scope="session")
def fixture_verifier(fixture_dir):
    from specui.verifier.model import Verifier

    return Verifier.load(str(fixture_dir / "verifier"))
