"""The training campaign (issue 49): its packaged-text readers, the broad corpus's requests, the
evaluation guard, and generation that resumes where a kill left it."""

from __future__ import annotations

import gzip
import json
import math
import os

import pytest
import torch

from specui.data import broad, passages
from specui.data.overlap import shared_content
from specui.data.prompts import load_prompts
from specui.data.sets import CAMPAIGN_HELD_OUT
from specui.errors import SpecUIError
from specui.training import campaign

GERMAN = """Debian-Referenz

1. Einleitung

Dieses Dokument soll einen groben Überblick über das Debian-System geben, in Form eines
Benutzerhandbuchs für die Zeit nach der Installation des Systems.

  * eine Liste, die übersprungen wird

$ ls -l /etc

2. Pakete

Ein Paket ist eine Datei, die Programme und ihre Beschreibung enthält, damit das System sie
sauber installieren und wieder entfernen kann.
"""

CHINESE = """1. 简介

一些环境变量的值会改变部分 Unix 命令的行为，这些命令在不同的语言环境下输出不同的
结果，所以需要小心设置它们，以免影响系统中其他程序的正常运行。
"""


def _gz(path, text: str) -> None:
    path.write_bytes(gzip.compress(text.encode("utf-8")))


def test_debian_text_is_read_as_sections_of_prose(tmp_path):
    _gz(tmp_path / "debian-reference.de.txt.gz", GERMAN)
    _gz(tmp_path / "debian-faq.zh-cn.txt.gz", CHINESE)
    de = passages.debian_text_paragraphs("de", min_size=8, roots=(tmp_path, tmp_path))
    # Two numbered headings start two sections; the list and the shell line are left out.
    assert len(de) == 2
    assert de[0] == [
        "Dieses Dokument soll einen groben Überblick über das Debian-System geben, in Form eines"
        " Benutzerhandbuchs für die Zeit nach der Installation des Systems."
    ]
    assert de[1][0].startswith("Ein Paket ist eine Datei")
    zh = passages.debian_text_paragraphs("zh-cn", min_size=8, roots=(tmp_path, tmp_path))
    # Chinese lines are joined without a space: its line breaks fall between characters.
    assert zh == [[CHINESE.split("\n\n")[1].replace("\n", "")]]
    with pytest.raises(SpecUIError, match="debian-reference-fr"):
        passages.debian_text_paragraphs("fr", roots=(tmp_path, tmp_path))


def test_handbook_and_fortunes_readers(tmp_path):
    page = tmp_path / "en-US" / "sect.apt.html"
    page.parent.mkdir()
    page.write_text(
        '<html><div class="para">APT is the tool that installs <code>packages</code> from the'
        " archive and keeps them up to date &amp; consistent.</div><p>Short.</p></html>"
    )
    assert passages.handbook_paragraphs(min_size=8, root=tmp_path) == [
        [
            "APT is the tool that installs packages from the archive and keeps them up to date"
            " & consistent."
        ]
    ]
    (tmp_path / "chinese").write_text(
        "要有礼貌，请接受这一事实，并保持礼貌。意见不一致并不是借口。\n"
        "\x1b[33m-- Debian\x1b[m\n%\n短\n"
    )
    for name in ("tang300", "song100"):
        (tmp_path / name).write_text("")
    entries = passages.fortune_entries("zh", min_size=4, root=tmp_path)
    assert entries == ["要有礼貌，请接受这一事实，并保持礼貌。意见不一致并不是借口。\n-- Debian"]


def test_second_turns_carry_the_first_answer_and_a_follow_up():
    rows = broad.second_turns([("What is a list?", "A list is an ordered collection.")], seed=1)
    (row,) = rows
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert row["messages"][1]["content"] == "A list is an ordered collection."
    assert row["prompt"] == row["messages"][2]["content"] in broad.FOLLOW_UPS
    prompt = campaign.row_prompt(row)
    assert prompt.messages is not None and prompt.text is None


def test_casual_requests_are_seeded_and_varied():
    a, b = broad.casual(seed=3, n=50), broad.casual(seed=3, n=50)
    assert a == b
    assert len({r["prompt"] for r in a}) > 40
    assert all("{" not in r["prompt"] for r in a)  # every slot filled


def test_evaluation_prompts_never_enter_the_campaign(tmp_path, embedded_verifier):
    question = load_prompts("spec-bench", split="eval", limit=1)[0]
    text = question.text or question.messages[0]["content"]

    def single(verifier, seed):  # a passage that is a Spec-Bench question
        return [
            [{"id": "x/0", "prompt": f"Summarize: {text}", "kind": "summarize", "source": "x"}]
        ], []

    with pytest.raises(SpecUIError, match="evaluation"):
        campaign.build_prompts(embedded_verifier, tmp_path / "a", sources=single)

    def follow_up(verifier, seed):  # a second turn whose first request is one
        return [[]], broad.second_turns([(text, "An answer.")], seed)

    with pytest.raises(SpecUIError, match="evaluation"):
        campaign.build_prompts(embedded_verifier, tmp_path / "b", sources=follow_up)
    assert not (tmp_path / "a" / "prompts.jsonl").exists()


def test_a_later_part_keeps_the_earlier_parts_and_skips_what_they_hold(
    tmp_path, monkeypatch, embedded_verifier
):
    def first(verifier, seed):
        return [[_row("a/0", "Summarize: one two three."), _row("a/1", "Translate: uno.")]], []

    def second(verifier, seed):  # one new request, one an earlier part already holds
        return [[_row("b/0", "Explain: four five."), _row("b/1", "translate:  UNO.")]], []

    monkeypatch.setattr(campaign, "PARTS", {"prompts.jsonl": first, "prompts-2.jsonl": second})
    monkeypatch.setattr(campaign, "committed_dir", lambda: tmp_path / "none")  # nothing committed
    campaign.build_all_prompts(embedded_verifier, tmp_path)
    ids = [r["id"] for r in campaign.campaign_rows(tmp_path)]
    assert sorted(ids[:2]) == ["a/0", "a/1"] and ids[2:] == ["b/0"]  # a part is shuffled
    before = (tmp_path / "prompts.jsonl").read_bytes()
    campaign.build_all_prompts(embedded_verifier, tmp_path)  # built once: nothing changes
    assert (tmp_path / "prompts.jsonl").read_bytes() == before


def _row(id_: str, prompt: str) -> dict:
    return {"id": id_, "prompt": prompt, "kind": "chat", "source": id_.split("/")[0]}


def _rows(n: int, long_every: int = 0) -> list[dict]:
    return [
        {
            "id": f"t/{i}",
            "prompt": f"p{i}",
            "kind": "chat",
            "source": "t",
            "prompt_tokens": 900 if long_every and i % long_every == 0 else 40,
        }
        for i in range(n)
    ]


def test_generation_order_is_fixed_and_chunks_keep_one_length_class(monkeypatch):
    monkeypatch.setattr(campaign, "CHUNK", 7)
    rows = _rows(60, long_every=4)
    chunks = campaign.generation_order(rows)
    assert chunks == campaign.generation_order(rows)
    flat = [r["id"] for c in chunks for r in c]
    assert sorted(flat) == sorted(r["id"] for r in rows)  # every row once
    for c in chunks:
        assert len({campaign._length_class(r) for r in c}) == 1
    # Long chunks come early too, so a partial run has long prompts.
    assert campaign._length_class(chunks[1][0]) == "long"


def test_one_campaign_at_a_time(tmp_path):
    with (
        campaign.campaign_lock(tmp_path),
        pytest.raises(SpecUIError, match="already running"),
        campaign.campaign_lock(tmp_path),
    ):
        pass
    with campaign.campaign_lock(tmp_path):  # released when the first one ends
        pass
    # The shards of one run each hold a lock of their own, with their pid in it.
    assert not campaign.shard_running(tmp_path, 1)
    with campaign.campaign_lock(tmp_path, (0, 2)), campaign.campaign_lock(tmp_path, (1, 2)):
        assert campaign.lock_file(tmp_path, 1).read_text().strip() == str(os.getpid())
        # What shard 0 reads when its own prompts are done: the other one is still at work.
        assert campaign.shard_running(tmp_path, 1)
        with (
            pytest.raises(SpecUIError, match="already running"),
            campaign.campaign_lock(tmp_path, (1, 2)),
        ):
            pass
    assert not campaign.shard_running(tmp_path, 1)  # released with its run


def _write_rows(folder, prefix: str, prompts: list[str]) -> None:
    """A campaign part of short chat prompts."""
    rows = [
        {"id": f"{prefix}/{i}", "prompt": p, "kind": "chat", "source": "t", "prompt_tokens": 20}
        for i, p in enumerate(prompts)
    ]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.slow
def test_generation_resumes_where_a_kill_left_it(tmp_path, embedded_verifier):
    _write_rows(tmp_path, "t", [f"Name a colour that starts with {c}." for c in "BRG"])
    campaign.generate(embedded_verifier, tmp_path, torch.float32, max_new_tokens=4)
    cache = campaign.cache_file(embedded_verifier, tmp_path).with_name(
        campaign.cache_file(embedded_verifier, tmp_path).name.replace("-n256", "-n4")
    )
    lines = cache.read_text().splitlines()
    assert len(lines) == 3
    assert campaign.status(embedded_verifier, tmp_path, max_new_tokens=4).done == 3
    # A kill mid-append: the last response torn.  The run after it answers that prompt again
    # and leaves the other two as they were.
    cache.write_text("\n".join(lines[:2]) + "\n" + lines[2][:15])
    campaign.generate(embedded_verifier, tmp_path, torch.float32, max_new_tokens=4)
    again = cache.read_text().splitlines()
    assert again[:2] == lines[:2] and len(again) == 4  # the torn line stays, skipped
    assert json.loads(again[3]) == json.loads(lines[2])  # greedy: the same response
    assert campaign.status(embedded_verifier, tmp_path, max_new_tokens=4).done == 3


def test_a_bare_machine_starts_again_from_the_committed_corpus(
    tmp_path, monkeypatch, embedded_verifier
):
    """commit_corpus writes the parts and the responses (xz); a campaign folder that is gone comes
    back from them: the parts as they were built (nothing rebuilt), every prompt answered."""
    from specui.data.distill import cache_name, prompt_key

    def never(verifier, seed):
        raise AssertionError("a committed part is restored, not built again")

    state, corpus = tmp_path / "state", tmp_path / "data" / "corpus"
    state.mkdir()
    _write_rows(state, "c", ["Name a colour.", "Say hi.", "Count to three."])
    cache = state / "cache" / cache_name(embedded_verifier, campaign.MAX_NEW_TOKENS)
    cache.parent.mkdir()
    eos = min(embedded_verifier.eos_token_ids)
    for i, r in enumerate(campaign.campaign_rows(state)):
        key = prompt_key(campaign.row_prompt(r).encode(embedded_verifier))
        with cache.open("a") as f:
            f.write(json.dumps({"key": key, "response_ids": [300 + i, eos]}) + "\n")
    monkeypatch.setattr(campaign, "PARTS", {"prompts.jsonl": never})
    monkeypatch.setattr(campaign, "shipped_data_dir", lambda: tmp_path / "data")
    monkeypatch.setattr("specui.data.distill.shipped_data_dir", lambda: tmp_path / "data")
    written = campaign.commit_corpus(embedded_verifier, state)
    assert sorted(p.name for p in written) == sorted(["prompts.jsonl.xz", cache.name + ".xz"])
    first = [p.read_bytes() for p in written]
    assert campaign.commit_corpus(embedded_verifier, state) == written
    assert [p.read_bytes() for p in written] == first  # the same content, the same bytes

    bare = tmp_path / "bare"
    campaign.build_all_prompts(embedded_verifier, bare)
    assert (bare / "prompts.jsonl").read_bytes() == (state / "prompts.jsonl").read_bytes()
    assert campaign.status(embedded_verifier, bare) == campaign.Progress(3, 3, 6)
    m = campaign.materialize(embedded_verifier, bare)
    assert m.missing == 0 and m.rows == m.general + 3

    # A prompt without a response: nothing is committed.
    _write_rows(state, "c", ["Name a colour.", "Not answered."])
    with pytest.raises(SpecUIError, match="1 campaign prompts have no response"):
        campaign.commit_corpus(embedded_verifier, state)
    # A corrupt committed file: a clear error, not a traceback.
    written[-1].write_bytes(b"not xz")
    with pytest.raises(SpecUIError, match="cannot be read"):
        campaign.status(embedded_verifier, bare)
    assert corpus.is_dir()


@pytest.mark.slow
def test_shards_split_the_prompts_and_together_answer_all(tmp_path, embedded_verifier):
    _write_rows(tmp_path, "s", [f"Say the number {i}." for i in range(12)])
    campaign.generate(embedded_verifier, tmp_path, torch.float32, max_new_tokens=3, shard=(0, 2))
    first = campaign.status(embedded_verifier, tmp_path, max_new_tokens=3).done
    assert 0 < first < 12  # one shard answers its share only (these keys fall to both)
    campaign.generate(embedded_verifier, tmp_path, torch.float32, max_new_tokens=3, shard=(1, 2))
    assert campaign.status(embedded_verifier, tmp_path, max_new_tokens=3).done == 12


@pytest.mark.slow
def test_materialized_rows_bring_the_responses_training_would_look_up(
    tmp_path, embedded_verifier, monkeypatch
):
    """train.jsonl read as a prompt file gives prompts whose cache keys are the campaign's: the
    response each row brings is the one generation cached for it."""
    from specui.data.distill import cache_name, prompt_key

    rows = [
        {
            "id": "t/0",
            "prompt": "Name a colour.",
            "kind": "chat",
            "source": "t",
            "prompt_tokens": 9,
        },
        {
            "id": "t/1",
            "messages": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "Hi!"},
                {"role": "user", "content": "Again, louder."},
            ],
            "kind": "second_turn",
            "source": "t",
            "prompt_tokens": 30,
        },
        {
            "id": "t/2",
            "prompt": "Not answered yet.",
            "kind": "chat",
            "source": "t",
            "prompt_tokens": 9,
        },
    ]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "cache" / cache_name(embedded_verifier, campaign.MAX_NEW_TOKENS)
    cache.parent.mkdir()
    answers = {}
    for i, r in enumerate(rows[:2]):
        key = prompt_key(campaign.row_prompt(r).encode(embedded_verifier))
        answers[r["id"]] = [100 + i, 200 + i, min(embedded_verifier.eos_token_ids)]
        cache.open("a").write(json.dumps({"key": key, "response_ids": answers[r["id"]]}) + "\n")

    with pytest.raises(SpecUIError, match="1 campaign prompts have no response"):
        campaign.materialize(embedded_verifier, tmp_path)
    m = campaign.materialize(embedded_verifier, tmp_path, partial=True)
    assert m.missing == 1 and m.rows == m.general + 2 and m.general > 9000
    loaded = {p.id: p for p in load_prompts(m.path, split="all")}
    assert "t/2" not in loaded
    for r in rows[:2]:
        p = loaded[r["id"]]
        assert list(p.response_ids) == answers[r["id"]]
        assert p.encode(embedded_verifier) == campaign.row_prompt(r).encode(embedded_verifier)
    # Shuffled: the campaign's rows are not all at the end.
    order = m.path.read_text().splitlines()
    assert not all('"t/' in line for line in order[-2:])
    # The `campaign` prompt set reads it: a small held-out split that shares no content with
    # training (specui.data.overlap), long and short prompts alternating.
    monkeypatch.setenv("SPECUI_CAMPAIGN_DIR", str(tmp_path))
    train = load_prompts("campaign", split="train")
    held = load_prompts("campaign", split="eval")
    every = load_prompts("campaign", split="all")
    index = {p.id: i for i, p in enumerate(every)}
    assert len(held) == CAMPAIGN_HELD_OUT and not {p.id for p in train} & {p.id for p in held}
    assert not shared_content(every, [index[p.id] for p in train], [index[p.id] for p in held])
    assert len(train) > 0.9 * m.rows  # what shares content with the held-out prompts: a few
    assert all(p.response_ids for p in train)
    # (the general corpus has no prompt over 480 tokens: here "long" starts lower)
    monkeypatch.setattr("specui.data.sets.CAMPAIGN_LONG_TOKENS", 60)
    held = load_prompts("campaign", split="eval", limit=12)
    assert [p.meta["prompt_tokens"] > 60 for p in held] == [True, False] * 6


def test_every_training_stage_is_a_train_command_the_cli_accepts(tmp_path):
    """The campaign's stages as `specui train` parses them: the settings the plan gives, the
    budget in steps, the learning rate the check chose, the int8 store and held-out evaluation."""
    from specui.cli import build_parser
    from specui.commands.train import build_config
    from specui.training import campaign_train as ct

    rows = [{"id": str(i), "prompt_tokens": 700, "response_ids": [1] * 100} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert campaign.mean_sequence_tokens(tmp_path / "train.jsonl") == 800
    # Before the check has run: extraction and the three check runs only.
    early = ct.plan(tmp_path, world=2, lr=None)
    assert [s.name for s in early] == ["extract", "lr-0.0003", "lr-0.0006", "lr-0.0012"]
    stages = ct.plan(tmp_path, world=2, lr=6e-4)
    parser = build_parser()
    configs = {}
    for stage in stages:
        cmd = ct.command(stage, tmp_path / "runs" / stage.name, tmp_path / "cache", world=2)
        assert cmd[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
        args = parser.parse_args(cmd[cmd.index("specui") + 1 :])
        configs[stage.name] = build_config(args)
    dflash = configs["dflash"]
    assert dflash.hidden_store == "int8" and dflash.prompts == "campaign"
    assert dflash.extraction == "offline" and dflash.eval_every > 0 and dflash.resume
    # 30 M sequence tokens at 4 sequences a process, 2 processes, 800 tokens a sequence.
    assert dflash.steps == math.ceil(30_000_000 / (4 * 2 * 800))
    assert dflash.lr == 6e-4 and configs["dspark"].lr == 3e-4
    assert configs["dspark"].init_from.endswith("runs/dflash")
    assert configs["peagle"].options.num_depths == 8 and configs["peagle"].options.freeze_embeddings
    assert configs["eagle3"].options.ttt_steps == 4
    # The scaling study's points: log-spaced in tokens, within each budget, the last at its end.
    assert dflash.snapshot_steps[0] == math.ceil(500_000 / (4 * 2 * 800))
    assert dflash.snapshot_steps[-1] == dflash.steps and len(dflash.snapshot_steps) == 7
    assert configs["dspark"].snapshot_steps[-2] == math.ceil(4_000_000 / (4 * 2 * 800))
    for name in ("dflash", "dspark", "peagle", "eagle3"):
        got = configs[name].snapshot_steps
        assert got == sorted(set(got)) and got[-1] == configs[name].steps


def test_the_check_picks_the_rate_with_the_best_held_out_acceptance(tmp_path):
    from specui.training import campaign_train as ct

    runs = tmp_path / "runs"
    for rate, score in zip(ct.LR_CHECK, (1.5, 1.7, 1.6), strict=True):
        run = runs / f"lr-{rate:g}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(
            json.dumps({"step": 100, ct.HELD_OUT: 9.0})
            + "\n"  # an earlier, better evaluation
            + json.dumps({"step": 300, ct.HELD_OUT: score})
            + "\n"
        )
        assert ct.choose_lr(runs) is None  # not finished yet
        (run / "train_run.json").write_text(json.dumps({"status": "finished"}))
    assert ct.choose_lr(runs) == ct.LR_CHECK[1]  # by the last evaluation of each


def test_a_higher_rate_that_only_ties_is_not_chosen(tmp_path):
    """The first campaign's check: 6e-4 and 1.2e-3 tie (1.888 / 1.890) and 6e-4 is chosen; a
    clear lead still wins."""
    from specui.training import campaign_train as ct

    def check(scores: tuple[float, float, float]) -> float | None:
        runs = tmp_path / "-".join(map(str, scores)) / "runs"
        for rate, score in zip(ct.LR_CHECK, scores, strict=True):
            run = runs / f"lr-{rate:g}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text(json.dumps({"step": 300, ct.HELD_OUT: score}))
            (run / "train_run.json").write_text(json.dumps({"status": "finished"}))
        return ct.choose_lr(runs)

    assert check((1.835, 1.888, 1.890)) == ct.LR_CHECK[1]
    assert check((1.889, 1.888, 1.890)) == ct.LR_CHECK[0]
    assert check((1.835, 1.860, 1.890)) == ct.LR_CHECK[2]


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped)."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_pause_stops_every_process_of_a_running_shard_and_no_stale_pid(tmp_path):
    """`campaign.sh pause`: the shard holding its lock, and a child in a session of its own (as
    torchrun starts its workers), stop; a lock that is not held names a pid never signalled."""
    import subprocess
    import sys
    import time

    from tests.support.paths import REPO

    shard = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, subprocess, sys, time\n"
            f"f = open({str(tmp_path / 'lock')!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX)\n"
            "f.truncate(0); f.write(str(os.getpid())); f.flush()\n"
            "w = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            f"open({str(tmp_path / 'worker')!r}, 'w').write(str(w.pid))\n"
            "time.sleep(60)\n",
        ]
    )
    bystander = subprocess.Popen(["sleep", "60"])
    (tmp_path / "lock-1").write_text(str(bystander.pid))  # a finished shard's stale pid
    try:
        for _ in range(100):
            if (tmp_path / "worker").is_file() and (tmp_path / "worker").read_text():
                break
            time.sleep(0.05)
        worker = int((tmp_path / "worker").read_text())
        env = {**os.environ, "SPECUI_CAMPAIGN_DIR": str(tmp_path)}
        script = [str(REPO / "scripts" / "campaign.sh")]
        out = subprocess.run(["bash", *script, "pause"], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and "paused (2 processes)" in out.stdout, out
        assert _state(shard.pid) == "T" and _state(worker) == "T"
        assert _state(bystander.pid) != "T"
        subprocess.run(["bash", *script, "resume"], env=env, check=True, capture_output=True)
        assert _state(shard.pid) != "T" and _state(worker) != "T"
    finally:
        for p in (shard, bystander):
            p.kill()
        if "worker" in locals():
            os.kill(worker, 9)
