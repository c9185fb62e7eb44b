"""Spec-Bench is a prompt set for evaluation only: its groups load, and no training path takes
it."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from specui.data import load_prompts
from specui.data.prompts import (
    Prompt,
    check_training_prompts,
    normalize_text,
    split_of,
    write_prompt_file,
)
from specui.data.sets import SPEC_BENCH_GROUPS
from specui.errors import SpecUIError
from tests.support.cli_errors import assert_one_error, cli
from tests.support.paths import REPO

QUESTIONS = REPO / "data" / "spec-bench" / "question.jsonl"


def test_spec_bench_ships_with_its_licence_and_480_questions():
    assert "Apache License" in (REPO / "data" / "spec-bench" / "LICENSE").read_text()
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    assert len(rows) == 480


def test_spec_bench_loads_first_turns_by_task_group():
    prompts = load_prompts("spec-bench", split="eval")
    assert len(prompts) == 480
    assert Counter(p.meta["group"] for p in prompts) == {g: 80 for g in SPEC_BENCH_GROUPS}
    firsts = {row["turns"][0] for row in map(json.loads, QUESTIONS.read_text().splitlines())}
    assert {p.text for p in prompts} == firsts
    # Groups alternate, so the acceptance bench's 48 prompts hold 8 of each group.
    assert Counter(p.meta["group"] for p in load_prompts("spec-bench", limit=48)) == {
        g: 8 for g in SPEC_BENCH_GROUPS
    }
    translation = load_prompts("spec-bench:translation", split="all")
    assert len(translation) == 80 and all(p.meta["group"] == "translation" for p in translation)
    assert all(p.text.startswith("Translate") for p in translation)


@pytest.mark.parametrize("name", ["spec-bench", "spec-bench:qa", "gsm-symbolic,spec-bench:rag"])
def test_training_refuses_spec_bench_by_name_before_making_anything(capsys, tmp_path, name):
    out = tmp_path / "run"
    args = ["train", "--algorithm", "dflash", "--prompts", name, "--out", str(out), "--steps", "1"]
    rc, _, err = cli(capsys, *args)
    assert_one_error(rc, err, "is an evaluation set")
    assert not out.exists()  # refused before the output folder (or the verifier) is touched
    with pytest.raises(SpecUIError, match="evaluation set"):
        load_prompts(name, split="train")


def _spec_bench_text(group: str) -> str:
    return load_prompts(f"spec-bench:{group}", split="all", limit=1)[0].text


def test_a_corpus_containing_a_spec_bench_prompt_is_refused(tmp_path):
    question = _spec_bench_text("qa")
    # Changed case, punctuation and spacing, and pasted inside a longer request: still the question.
    # (The suffix varies until the row falls in the file's training split, which is chosen by
    # content.)
    disguised = next(
        d
        for n in range(100)
        if split_of(
            Prompt(
                "x", "f", text=(d := f"Please help ({n}):  {question.upper()}!! Thanks.")
            ).content_hash
        )
        == "train"
    )
    assert normalize_text(question) in normalize_text(disguised)
    rows = [Prompt(f"ok-{i}", "f", text=f"Tell me a fact about the number {i}.") for i in range(30)]
    path = write_prompt_file(tmp_path / "corpus.jsonl", [*rows, Prompt("bad", "f", text=disguised)])
    with pytest.raises(SpecUIError, match=r"contain an evaluation-only prompt \(first: bad"):
        load_prompts(path, split="train")
    clean = write_prompt_file(tmp_path / "clean.jsonl", rows)
    assert load_prompts(clean, split="train")


def test_a_chat_turn_with_a_spec_bench_prompt_is_refused():
    summary = _spec_bench_text("summarization")
    chat = Prompt(
        "chat",
        "f",
        messages=(
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": summary},
        ),
    )
    with pytest.raises(SpecUIError, match="evaluation-only"):
        check_training_prompts([chat])
    check_training_prompts(
        [
            Prompt(
                "fine",
                "f",
                text="Summarize: the cat sat on the mat and then it left the room quietly.",
            )
        ]
    )


def test_the_shipped_training_corpus_holds_no_evaluation_prompt():
    # Loading the training split runs the same check every training run does.
    train = load_prompts("general", split="train")
    assert len(train) >= 1000
    held_out = {p.content_hash for p in load_prompts("general", split="eval")}
    assert held_out and not held_out & {p.content_hash for p in train}


def test_the_committed_campaign_corpus_holds_no_evaluation_or_held_out_prompt():
    """The training campaign's committed prompts (issue 49): no Spec-Bench question inside any
    turn, and no prompt of the general corpus's held-out split, as a request or a first turn."""
    from specui.data.distill import read_text
    from specui.training.campaign import PARTS, committed_dir, row_prompt

    rows = [
        json.loads(line)
        for name in PARTS
        for line in read_text(committed_dir() / f"{name}.xz").splitlines()
        if line.strip()
    ]
    assert len(rows) >= 20_000
    prompts = [row_prompt(r) for r in rows]
    check_training_prompts(prompts, "the committed campaign corpus")  # raises on a hit
    held_out = {normalize_text(p.text) for p in load_prompts("general", split="eval") if p.text}
    turns = {
        normalize_text(m["content"])
        for p in prompts
        for m in (p.messages or ({"role": "user", "content": p.text},))
        if m["role"] == "user"
    }
    assert not held_out & turns
