"""``specui decode``: output, JSON steps, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specui.algorithms import algorithm_names
from specui.cli import main
from tests.support.paths import REPO

COLORS = ("--prompt", "List three colors.", "--chat", "--drafter", "ngram", "-k", "3")


def _decode_json(capsys, *args: str) -> tuple[list[dict], dict]:
    """``specui decode ARGS --json``: its step lines and its summary line."""
    assert main(["decode", *args, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return lines[:-1], lines[-1]


def test_decode_json_prints_steps_then_summary(capsys, embedded_verifier):
    steps, summary = _decode_json(capsys, *COLORS, "--max-new-tokens", "16")
    assert summary["summary"] is True
    for key in (
        "output_text",
        "output_token_ids",
        "acceptance_length",
        "per_position_acceptance",
        "tokens_per_s",
        "num_steps",
    ):
        assert key in summary
    assert "tokens_per_second" not in summary  # one name for throughput: the CSV's and the store's
    assert summary["num_steps"] == len(steps)
    assert sum(len(s["emitted_token_ids"]) for s in steps) == len(summary["output_token_ids"]) == 16
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert (
        embedded_verifier.tokenizer.decode(summary["output_token_ids"], skip_special_tokens=True)
        == summary["output_text"]
    )
    assert summary["acceptance_length"] == pytest.approx(
        1
        + sum(s["num_accepted"] for s in steps if s["draft_token_ids"])
        / max(1, sum(1 for s in steps if s["draft_token_ids"]))
    )


def test_decode_with_db_stores_the_run_through_the_run_service(capsys, embedded_verifier, tmp_path):
    """--db records the decode like the Playground's (the one decode-and-record function): the
    stored steps give back the printed output."""
    from specui.store import Store

    db = tmp_path / "runs.db"
    _, summary = _decode_json(capsys, *COLORS, "--max-new-tokens", "12", "--db", str(db))
    store = Store(db)
    run = store.get_run(summary["run_id"])
    assert (run.prompt_set, run.algorithm, run.status) == ("cli", "ngram", "done")
    (result,) = store.get_results(run.id)
    assert result.output_token_ids == summary["output_token_ids"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "   "], "prompt is empty"),
        (["--prompt", "hi", "--drafter", "no-such-drafter"], "unknown drafter"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["--prompt", "hi", "--verifier", "/nonexistent/verifier"], "does not exist"),
        (["--prompt", "hi", "--top-p", "2"], "top_p"),
        (["--prompt", "hi", "-k", "10000", "--drafter", "ngram"], "speculative tokens"),
        (["--prompt", "word " * 9000], "context window"),
    ],
)
def test_decode_bad_input_gives_one_line_error(capsys, args, message):
    rc = main(["decode", *args])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_decode_error_exit_code_and_no_traceback_in_a_real_process():
    proc = subprocess.run(
        [sys.executable, "-m", "specui", "decode", "--prompt", ""],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "specui: error: the prompt is empty"


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_decode_with_each_fixture_checkpoint(capsys, fixture_dir, algorithm, tmp_path, monkeypatch):
    # A data folder of its own: cost models and calibrations another test fitted for this
    # verifier could (rightly) keep the adaptive policy from drafting with a random drafter.
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    folders = [
        "--verifier",
        str(fixture_dir / "verifier"),
        "--drafter",
        str(fixture_dir / algorithm),
    ]
    steps, summary = _decode_json(
        capsys, *folders, "--prompt-ids", "5 17 300 42 7 99 12", "--max-new-tokens", "12"
    )
    assert len(summary["output_token_ids"]) == 12
    # The adaptive policy (the default) may send no draft at all: whether a random drafter
    # pays depends on this machine's measured costs.  What it sends carries its estimates: the
    # confidence head's (DSpark) or the drafter's top-1 probabilities.
    assert all(
        s["confidences"] and all(0 <= c <= 1 for c in s["confidences"])
        for s in steps
        if s["draft_token_ids"]
    )
    fixed, _ = _decode_json(
        capsys,
        *folders,
        "--prompt-ids",
        "5 17 300 42 7",
        "--max-new-tokens",
        "6",
        "--policy",
        "fixed",
    )
    # The fixed policy drafts every step, and keeps the estimates of every slot it sends: the
    # unselected sample the calibration is measured on.
    assert any(s["draft_token_ids"] for s in fixed)
    assert all(
        s["confidences"] is not None and len(s["confidences"]) == len(s["draft_token_ids"])
        for s in fixed
        if s["draft_token_ids"]
    )
