"""``SPECUI_DB`` names the store for the CLI as it does for the app: one default
(``specui.store.default_db_path``) for every command that opens the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specui.cli import main
from specui.store import Store, default_db_path
from tests.support.paths import REPO


@pytest.fixture
def chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store named by SPECUI_DB, away from SPECUI_DATA_DIR (whose default must stay unused)."""
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "elsewhere" / "chosen.db"
    monkeypatch.setenv("SPECUI_DB", str(path))
    with Store(path) as store:
        run = store.create_run(
            verifier="v", prompt_set="only-in-the-chosen-store", label="chosen-run"
        )
        store.finish_run(run.id, "done")
    return path


def test_default_db_path_prefers_specui_db(
    chosen: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_db_path() == chosen
    with Store() as store:
        assert store.path == chosen
    monkeypatch.setenv("SPECUI_DB", "")  # empty = not set
    assert default_db_path() == tmp_path / "data" / "specui.db"
    monkeypatch.delenv("SPECUI_DB")
    assert default_db_path() == tmp_path / "data" / "specui.db"


def test_cli_commands_open_the_store_specui_db_names(
    chosen: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert "chosen-run" in out and "only-in-the-chosen-store" in out
    assert main(["runs", "show", "1"]) == 0
    assert "chosen-run" in capsys.readouterr().out
    assert main(["jobs", "list"]) == 0
    assert "no jobs" in capsys.readouterr().out
    assert not (tmp_path / "data" / "specui.db").exists()  # the data-dir default was never opened
    # --db still wins over the variable.
    other = tmp_path / "other.db"
    assert main(["runs", "--db", str(other), "list"]) == 0
    assert f"no runs in {other}" in capsys.readouterr().out


def test_specui_db_in_a_real_cli_process(chosen: Path, tmp_path: Path) -> None:
    env = {**os.environ, "SPECUI_DB": str(chosen), "SPECUI_DATA_DIR": str(tmp_path / "data")}
    out = subprocess.run(
        [sys.executable, "-m", "specui", "runs", "list"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "chosen-run" in out.stdout
    assert not (tmp_path / "data").exists()


def test_the_app_takes_the_same_default(chosen: Path) -> None:
    import app as app_module

    args = app_module.parse_args([])
    assert args.db is None  # app.py decides nothing itself: Store(None) asks default_db_path
    with Store(args.db) as store:
        assert store.path == chosen and [r.label for r in store.list_runs()] == ["chosen-run"]
