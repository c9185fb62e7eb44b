"""``specui runs export --format speculators``: speculators' acceptance.csv from stored runs.

The runs are recorded into a real store; the file is read back the way speculators'
scripts read their CSVs (``perf_utils._load_csv``: ``open(newline="")``,
``csv.DictReader``, ``float()`` of a named column) and checked against the a_k that
``specui.metrics.compare`` reports and against counts made here from the traces."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from specui.cli import main
from specui.export_speculators import acceptance_table
from specui.metrics.comparison import compare
from specui.store import DecodingSettings, Store
from specui.trace import FinalTokenKind, StepTrace
from tests.support.store_helpers import make_trace, record

# The header speculators' evaluate.py writes for K = 4: ["subset"] + acceptance_csv_columns(spec)
# (vllm-project/speculators@c05b95b3, scripts/evaluate/perf_utils.py).
SPECULATORS_HEADER_K4 = [
    "subset",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "acceptance_length",
    "acceptance_at_pos_0",
    "acceptance_at_pos_1",
    "acceptance_at_pos_2",
    "acceptance_at_pos_3",
]


def _speculators_export(path: Path, out: Path | str, *runs: object) -> list[str]:
    """``specui runs export --format speculators`` argv: ``runs`` (every run when none) to
    ``out``."""
    argv = ["runs", "--db", str(path), "export", "--format", "speculators", "--csv", str(out)]
    return [*argv, "--runs", *map(str, runs)] if runs else argv


def _step(i: int, k: int, n_acc: int) -> StepTrace:
    """A step drafting ``k`` tokens of which the first ``n_acc`` are accepted (k = 0: no draft)."""
    ids = [100 + j for j in range(k)]
    kind = FinalTokenKind.BONUS if n_acc == k else FinalTokenKind.CORRECTED
    return StepTrace(
        i,
        10 + i,
        ids,
        ["t"] * k,
        [0.5] * k,
        [0.5] * k,
        None,
        n_acc,
        7,
        "x",
        kind,
        ids[:n_acc] + [7],
        0.001,
        0.01,
    )


# Run "dflash" (K = 3): accepted-prefix lengths per step, two prompts; the last step of the
# second prompt drafts nothing (it is not a draft for either side).
DFLASH_ACCEPTED = [[0, 1, 3, 2, 3, 0, 1, 1], [3, 3, 2, 0]]


def _dflash_prompts() -> list[list[StepTrace]]:
    prompts = [[_step(i, 3, n) for i, n in enumerate(p)] for p in DFLASH_ACCEPTED]
    prompts[1].append(_step(len(prompts[1]), 0, 0))
    return prompts


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, dict[str, int], dict[str, list[list[StepTrace]]]]:
    path = tmp_path / "specui.db"
    prompts = {
        "base": [[_step(i, 0, 0) for i in range(10)], [_step(i, 0, 0) for i in range(12)]],
        "dflash": _dflash_prompts(),
        "eagle3": [
            [make_trace(i, 4, seed=30 + p, confidences=False) for i in range(15)] for p in range(3)
        ],
    }
    ids: dict[str, int] = {}
    with Store(path) as store:
        for name, algo, k, prompt_set in (
            ("base", "none", 0, "humaneval:0-1"),
            ("dflash", "dflash", 3, "humaneval:0-1"),
            ("eagle3", "eagle3", 4, "gsm-symbolic:0-2"),
        ):
            run = store.create_run(
                verifier="smollm2",
                prompt_set=prompt_set,
                algorithm=algo,
                settings=DecodingSettings(num_speculative_tokens=k),
            )
            record(store, run.id, prompts[name], [1.0] * len(prompts[name]), k)
            ids[name] = run.id
    return path, ids, prompts


def _read_like_speculators(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _cumulative(prompts: list[list[StepTrace]], k: int) -> list[float]:
    """Share of drafts whose first i+1 tokens were all accepted, i = 0..k-1 (vLLM's per-position
    rate)."""
    drafts = [s for p in prompts for s in p if s.draft_token_ids]
    return [sum(1 for s in drafts if s.num_accepted >= i + 1) / len(drafts) for i in range(k)]


def test_rows_carry_speculators_columns_and_specui_a_k(
    db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, ids, prompts = db
    out = tmp_path / "acceptance.csv"
    argv = _speculators_export(path, out, ids["base"], ids["dflash"], ids["eagle3"])
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert (
        f"skipped run(s) {ids['base']}: no drafts" in captured.err
    )  # evaluate.py writes no row for it

    header, rows = _read_like_speculators(out)
    assert header == SPECULATORS_HEADER_K4
    assert [r["subset"] for r in rows] == ["humaneval:0-1", "gsm-symbolic:0-2"]

    with Store(path) as store:
        cmp = compare(store, [ids["dflash"], ids["eagle3"]])
    for row, reported, name, k in zip(rows, cmp.rows, ("dflash", "eagle3"), (3, 4), strict=True):
        drafts = [s for p in prompts[name] for s in p if s.draft_token_ids]
        assert int(row["num_drafts"]) == reported["num_drafts"] == len(drafts)
        assert int(row["num_draft_tokens"]) == sum(len(s.draft_token_ids) for s in drafts)
        accepted = sum(s.num_accepted for s in drafts)
        assert int(row["num_accepted_tokens"]) == accepted
        assert float(row["acceptance_length"]) == pytest.approx(1 + accepted / len(drafts))
        assert float(row["acceptance_length"]) == pytest.approx(reported["acceptance_length"])
        expected = _cumulative(prompts[name], k)
        for i in range(k):
            # Their 0-based position i is SpecUI's a_{i+1}: the same cumulative fraction.
            assert float(row[f"acceptance_at_pos_{i}"]) == pytest.approx(
                reported[f"acceptance_pos_{i + 1}"]
            )
            assert float(row[f"acceptance_at_pos_{i}"]) == pytest.approx(expected[i])
    # the K = 3 run never drafted a 4th token: blank, not 0
    assert rows[0]["acceptance_at_pos_3"] == ""


def test_the_rates_are_cumulative_fractions_with_known_values(db, tmp_path: Path) -> None:
    path, ids, _ = db
    out = tmp_path / "acceptance.csv"
    assert main(_speculators_export(path, out, ids["dflash"])) == 0
    _, (row,) = _read_like_speculators(out)
    # 12 drafts, accepted-prefix lengths 0,1,3,2,3,0,1,1,3,3,2,0: >=1 in 9, >=2 in 6, >=3 in 4.
    assert (
        row["num_drafts"] == "12"
        and row["num_draft_tokens"] == "36"
        and row["num_accepted_tokens"] == "19"
    )
    rates = [float(row[f"acceptance_at_pos_{i}"]) for i in range(3)]
    assert rates == pytest.approx([9 / 12, 6 / 12, 4 / 12])
    # Not the conditional rate (6/9 at position 1) and not a percentage.
    assert rates[1] != pytest.approx(6 / 9) and all(0 <= r <= 1 for r in rates)
    assert float(row["acceptance_length"]) == pytest.approx(1 + 19 / 12)


def test_stdout_export_is_the_same_file(
    db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, ids, _ = db
    out = tmp_path / "acceptance.csv"
    assert main(_speculators_export(path, out, ids["eagle3"])) == 0
    capsys.readouterr()
    assert main(_speculators_export(path, "-", ids["eagle3"])) == 0
    text = capsys.readouterr().out
    assert text == out.read_bytes().decode("utf-8")  # CRLF rows, as csv.DictWriter writes them
    with Store(path) as store:
        assert acceptance_table(store, [ids["eagle3"]]).run_ids == [ids["eagle3"]]


def test_two_runs_on_one_prompt_set_are_refused_and_the_file_is_kept(
    db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, ids, prompts = db
    with Store(path) as store:
        run = store.create_run(
            verifier="smollm2",
            prompt_set="humaneval:0-1",
            algorithm="dspark",
            settings=DecodingSettings(num_speculative_tokens=3),
        )
        record(store, run.id, prompts["dflash"], [1.0, 1.0], 3)
    out = tmp_path / "acceptance.csv"
    out.write_text("keep me\n")
    assert main(_speculators_export(path, out, ids["dflash"], run.id)) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("specui: error: runs ")
        and "'humaneval:0-1'" in err
        and "one row per subset" in err
    )
    assert out.read_text() == "keep me\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--steps"], "--steps is for --format csv"),
        (["--excel"], "a BOM breaks the 'subset' header"),
        ([], "no run with drafts"),
    ],
)
def test_bad_requests_are_one_line_errors_and_write_nothing(
    db, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    path, ids, _ = db
    out = tmp_path / "acceptance.csv"
    runs = [str(ids["dflash"])] if extra else [str(ids["base"])]
    assert main([*_speculators_export(path, out, *runs), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specui: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_the_csv_format_is_unchanged_by_default(db, tmp_path: Path) -> None:
    path, ids, _ = db
    out = tmp_path / "cmp.csv"
    assert (
        main(["runs", "--db", str(path), "export", "--csv", str(out), "--runs", str(ids["dflash"])])
        == 0
    )
    header, rows = _read_like_speculators(out)
    assert (
        header[0] == "run_id"
        and "acceptance_pos_1" in header
        and "acceptance_at_pos_0" not in header
    )
    assert len(rows) == 1


def test_without_runs_every_stored_run_is_taken_oldest_first(db, tmp_path: Path) -> None:
    path, ids, _ = db
    every, listed = tmp_path / "every.csv", tmp_path / "listed.csv"
    assert main(_speculators_export(path, every)) == 0
    assert main(_speculators_export(path, listed, ids["base"], ids["dflash"], ids["eagle3"])) == 0
    assert every.read_bytes() == listed.read_bytes()
