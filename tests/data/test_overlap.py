"""The campaign's held-out prompts share no content with its training prompts (issue 49)."""

from __future__ import annotations

import json
import re
from collections import Counter

from specui.data.overlap import shared_content
from specui.data.prompts import Prompt, load_prompts, normalize_text, prompt_texts

PASSAGE = (
    "The kernel keeps a table of every open file, and each process holds an index into it; "
    "closing a descriptor drops that index but not the table entry while another holds it."
)
TEMPLATE = "Summarize the following document in three plain sentences for a new reader please:"


def _p(i: str, text: str | None = None, messages: tuple | None = None) -> Prompt:
    return Prompt(i, "t", text=text, messages=messages)


def test_a_passage_or_a_first_turn_is_content_and_a_template_is_not():
    first = "What is the difference between a hard link and a symbolic link on Linux systems?"
    corpus = [
        _p("held-doc", f"{TEMPLATE}\n\n{PASSAGE}"),  # 0: held out
        _p(
            "held-turn",  # 1: held out, a second turn
            messages=(
                {"role": "user", "content": first},
                {"role": "assistant", "content": "A hard link is another name for a file."},
                {"role": "user", "content": "Shorter?"},
            ),
        ),
        _p("same-passage", f"Answer from this text: which entry stays?\n\n{PASSAGE}"),  # 2
        _p("first-turn", first),  # 3
        *(_p(f"template-{i}", f"{TEMPLATE}\n\nDocument number {i} is short.") for i in range(4)),
        _p("unrelated", "Write a haiku about the sea at dawn, with one word in French in it."),
    ]
    found = shared_content(corpus, range(2, len(corpus)), [0, 1], boilerplate=3)
    assert {corpus[i].id for i in found} == {"same-passage", "first-turn"}
    # With the template in fewer prompts than the bound, it counts as content.
    found = shared_content(corpus, range(2, len(corpus)), [0, 1], boilerplate=10)
    assert {corpus[i].id for i in found} >= {f"template-{i}" for i in range(4)}


def _paragraphs(p: Prompt) -> set[str]:
    """Each paragraph of 12 words or more, normalised, without a leading "[n]" marker."""
    out = set()
    for text in prompt_texts(p):
        for block in re.split(r"\n\s*\n", text):
            norm = re.sub(r"^\d+ ", "", normalize_text(block))
            if len(norm.split()) >= 12:
                out.add(norm)
    return out


def test_the_committed_campaign_corpus_splits_with_no_passage_on_both_sides(tmp_path, monkeypatch):
    """The campaign's committed prompts through the `campaign` set's own split: no paragraph of a
    held-out prompt (a passage, a first turn) is in a training prompt, unless a template's (in
    over 100 prompts).  Checked by paragraphs, not by the word runs the split uses."""
    from specui.data.distill import read_text
    from specui.training.campaign import PARTS, committed_dir, row_prompt, train_row

    rows = [
        json.loads(line)
        for name in PARTS
        for line in read_text(committed_dir() / f"{name}.xz").splitlines()
        if line.strip()
    ]
    out = []
    for r in rows:
        p = row_prompt(r)
        words = sum(len(t.split()) for t in prompt_texts(p))
        # A train.jsonl row as materialize writes it (its response is not read here); prompt
        # tokens by words (~1.3 a word) only choose which held-out prompts count as long.
        out.append(train_row(p, [1], r["kind"], int(1.3 * words)))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    monkeypatch.setenv("SPECUI_CAMPAIGN_DIR", str(tmp_path))
    train = load_prompts("campaign", split="train")
    held = load_prompts("campaign", split="eval")
    assert len(held) == 48 and len(train) > 0.9 * (len(rows) - 600)
    assert sum(p.meta["prompt_tokens"] > 480 for p in held) == 24  # the long ones are there
    count = Counter(x for p in (*train, *held) for x in _paragraphs(p))
    trained = {x for p in train for x in _paragraphs(p)}
    shared = {x for p in held for x in _paragraphs(p) if x in trained and count[x] <= 100}
    assert not shared, sorted(shared)[:3]
