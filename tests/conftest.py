"""Shared fixtures: the embedded SmolLM2 verifier and the speculators reference fixtures (and
their verifier).  Helpers that are not fixtures live in tests/support/."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.paths import FIXTURES

# Stable timings and no oversubscription on the 2-core CI machines.
torch.set_num_threads(1)


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
