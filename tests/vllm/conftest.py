"""What the real-server test modules share: one scratch folder and one store per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from specui.store import Store


@pytest.fixture(scope="module")
def work(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])


@pytest.fixture(scope="module")
def store(work: Path) -> Iterator[Store]:
    s = Store(work / "specui.db")
    yield s
    s.close()
