"""``specui bench``: baseline and drafters on the same prompts, stored and compared."""

from __future__ import annotations

import json

import pytest

from specui.cli import main
from specui.store import Store


def _bench_ngram_json(capsys, db, *args: str) -> dict:
    """``specui bench --drafter ngram ARGS --precision bf16 --json`` into ``db``: its JSON."""
    assert (
        main(
            ["bench", "--drafter", "ngram", *args, "--precision", "bf16", "--db", str(db), "--json"]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)


def test_bench_json_runs_baseline_and_drafter_on_the_same_prompts(
    tmp_path, capsys, embedded_verifier
):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "Repeat twice: red green blue."})
        + "\n"
        + "not json\n"
        + json.dumps({"messages": [{"role": "user", "content": "Say hello."}]})
        + "\n"
    )
    db = tmp_path / "s.db"
    out = _bench_ngram_json(capsys, db, "--prompts", str(prompts), "--max-new-tokens", "12")
    runs = out["runs"]
    assert [r["algorithm"] for r in runs] == ["none", "ngram"]
    base, ngram = runs
    assert base["speedup"] == pytest.approx(1.0)
    assert ngram["baseline_run_id"] == base["run_id"]
    assert ngram["speedup"] == pytest.approx(
        base["ms_per_output_token"] / ngram["ms_per_output_token"], rel=1e-6
    )
    assert ngram["acceptance_length"] >= 1.0
    store = Store(db)
    results = [store.get_results(r["run_id"]) for r in runs]
    assert [len(r) for r in results] == [2, 2]  # the broken line is skipped, the good ones kept
    assert [store.get_run(r["run_id"]).settings["verifier_precision"] for r in runs] == [
        "bf16",
        "bf16",
    ]
    # Greedy: both runs produce the same text for each prompt.
    assert [r.output_text for r in results[0]] == [r.output_text for r in results[1]]
    # Interleaved, so drift on a noisy machine hits both runs alike: each prompt is decoded by
    # the baseline and then the drafter before the next prompt starts.
    order = sorted(
        (res.started_at, run, res.prompt_index) for run, rs in enumerate(results) for res in rs
    )
    assert [(run, i) for _, run, i in order] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert all(
        res.ended_at is not None and res.ended_at >= res.started_at for rs in results for res in rs
    )


def test_bench_bad_input(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert (
        main(
            ["bench", "--drafter", "ngram", "--prompts", str(empty), "--db", str(tmp_path / "a.db")]
        )
        == 2
    )
    assert "no usable" in capsys.readouterr().err
    assert main(["bench", "--prompts", "demo", "--db", str(tmp_path / "a.db")]) == 2
    assert "at least one --drafter" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["bench"], ["decode", "--prompt", "hi"]])
def test_precision_defaults_to_the_apps_own(command, monkeypatch):
    from specui.cli import build_parser

    monkeypatch.delenv("SPECUI_VERIFIER_PRECISION", raising=False)
    assert build_parser().parse_args(command).precision == "auto"
    monkeypatch.setenv("SPECUI_VERIFIER_PRECISION", "fp32")
    assert build_parser().parse_args(command).precision == "fp32"


def test_bench_reports_every_metric_per_spec_bench_task_group(tmp_path, capsys, embedded_verifier):
    from specui.data.sets import SPEC_BENCH_GROUPS

    db = tmp_path / "s.db"
    # 12 prompts: the groups alternate, so two of each of the six.
    out = _bench_ngram_json(
        capsys, db, "--prompts", "spec-bench", "--limit", "12", "--max-new-tokens", "6"
    )
    groups = out["groups"]
    assert list(groups) == list(SPEC_BENCH_GROUPS)
    overall = {r["algorithm"]: r for r in out["runs"]}
    for group, rows in groups.items():
        assert [r["num_prompts"] for r in rows] == [2, 2], group
        ngram = next(r for r in rows if r["algorithm"] == "ngram")
        # The group's speedup is over the baseline's same two prompts.
        assert ngram["baseline_run_id"] == overall["none"]["run_id"]
    # The groups partition the run: their counts add up to the whole run's.
    for key in ("num_steps", "num_drafts", "num_accepted_tokens", "num_output_tokens"):
        assert (
            sum(next(r for r in rows if r["algorithm"] == "ngram")[key] for rows in groups.values())
            == overall["ngram"][key]
        )
    wall = sum(
        next(r for r in rows if r["algorithm"] == "ngram")["wall_time_s"]
        for rows in groups.values()
    )
    assert wall == pytest.approx(overall["ngram"]["wall_time_s"])
    # A set without groups gets none.
    out = _bench_ngram_json(
        capsys, db, "--prompts", "demo", "--limit", "1", "--max-new-tokens", "2"
    )
    assert out["groups"] == {}


def test_bench_reports_the_ece_of_each_drafters_per_slot_estimates(
    tmp_path, capsys, embedded_verifier
):
    db = tmp_path / "s.db"
    out = _bench_ngram_json(
        capsys,
        db,
        "--drafter",
        "suffix",
        "--prompts",
        "demo",
        "--limit",
        "2",
        "--max-new-tokens",
        "24",
    )
    eces = {e["algorithm"]: e for e in out["slot_ece"]}
    assert set(eces) == {"ngram", "suffix"}  # every drafter run, not the baseline
    assert eces["ngram"]["ece"] is None  # the n-gram lookup has no per-slot estimate
    suffix = eces["suffix"]["ece"]
    if suffix is not None:  # the suffix lookup's match shares, when it matched at all
        assert suffix["slots"] > 0 and 0.0 <= suffix["ece_raw"] <= 1.0
