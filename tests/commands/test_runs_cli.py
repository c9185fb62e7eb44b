"""``specui runs`` and ``specui jobs`` from the command line."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from specui.cli import main
from specui.jobs import queue
from specui.store import DecodingSettings, JobStatus, Store
from tests.support.store_helpers import make_trace, record


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "specui.db"
    with Store(path) as store:
        for algo, k in (("none", 0), ("dflash", 4)):
            run = store.create_run(
                verifier="smollm2",
                prompt_set="humaneval:0-1",
                algorithm=algo,
                owner="session-a" if k else None,
                settings=DecodingSettings(num_speculative_tokens=k),
            )
            record(
                store,
                run.id,
                [[make_trace(i, k, seed=p) for i in range(20)] for p in range(2)],
                [1.0, 1.2],
                k,
            )
    return path


def test_list_and_show(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--db", str(db), "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ID", "STATUS", "NAME"]
    assert [ln.split()[0] for ln in out[1:]] == ["2", "1"] and all(" done " in ln for ln in out[1:])
    assert main(["runs", "show", "2", "--db", str(db)]) == 0  # --db after the subcommand works too
    out = capsys.readouterr().out
    assert "run 2: dflash  [done]" in out and "τ (acceptance length)" in out and "Speedup" in out


def test_export_comparison_and_steps(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp.csv"
    assert main(["runs", "--db", str(db), "export", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open(newline="", encoding="utf-8")))
    assert [r["run_id"] for r in rows] == ["1", "2"] and rows[1]["baseline_run_id"] == "1"
    steps = tmp_path / "steps.csv"
    assert (
        main(["runs", "--db", str(db), "export", "--csv", str(steps), "--runs", "2", "--steps"])
        == 0
    )
    assert len(list(csv.DictReader(steps.open(newline="", encoding="utf-8")))) == 40


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "show", "99"],
        ["runs", "delete", "99"],
        ["runs", "export", "--csv", "x.csv", "--runs", "1", "99"],
    ],
)
def test_unknown_run_id_is_one_line_and_nonzero(
    db: Path,
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err == "specui: error: unknown run id 99\n"
    assert not (tmp_path / "x.csv").exists()


def test_delete_checks_the_owner_unless_forced(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--db", str(db), "delete", "2"]) == 2
    assert "another session" in capsys.readouterr().err
    assert main(["runs", "--db", str(db), "delete", "2", "--force"]) == 0
    assert main(["runs", "--db", str(db), "delete", "1"]) == 0
    with Store(db) as store:
        assert store.list_runs() == []


def test_not_a_store_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_text("hello\n" * 50)
    assert main(["runs", "--db", str(bogus), "list"]) == 2
    assert (
        capsys.readouterr().err.startswith("specui: error: ")
        and bogus.read_text() == "hello\n" * 50
    )


def test_jobs_list_show_cancel(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Store(db) as store:
        job = queue.enqueue(store, "count", {"n": 3})
    assert main(["jobs", "--db", str(db), "list"]) == 0
    assert "count" in capsys.readouterr().out
    assert main(["jobs", "--db", str(db), "show", str(job.id)]) == 0
    assert '"n": 3' in capsys.readouterr().out
    assert main(["jobs", "--db", str(db), "cancel", str(job.id)]) == 0
    assert "cancelled" in capsys.readouterr().out
    with Store(db) as store:
        assert store.get_job(job.id).status == JobStatus.CANCELLED
    assert main(["jobs", "--db", str(db), "cancel", "12345"]) == 2
    assert capsys.readouterr().err == "specui: error: unknown job id 12345\n"


def test_calibrate_refits_each_drafter_per_verifier_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from specui.policy.calibration import load_calibrations
    from tests.support.store_helpers import overconfident_steps

    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    db = tmp_path / "cal.db"
    fingerprint = "cd" * 16
    with Store(db) as store:
        run = store.create_run(
            verifier="tiny", prompt_set="p", algorithm="dspark", verifier_fingerprint=fingerprint
        )
        prompts = [overconfident_steps(300, 4, seed, 3.0) for seed in (5, 6)]
        record(store, run.id, prompts, [1.0, 1.0], 4)
    assert main(["runs", "calibrate", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "dspark: scale" in out and "held out (cross-fitted by prompt)" in out
    # over-confident: the logits are shrunk (a temperature well above 1)
    assert load_calibrations(fingerprint)["dspark"].temperature > 1.5
