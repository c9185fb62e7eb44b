"""Replaying stored runs (specui.replay, ``specui runs replay``, the step renderer):
a local run recorded by the engine and vLLM-style runs stored through the same
functions the vLLM benchmark uses, in a real SQLite store."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from pathlib import Path

import pytest

from specui.cli import main
from specui.data import Prompt
from specui.errors import SpecUIError
from specui.replay import load_replay, play, replay_runs, step_source
from specui.service import DecodeRequest, record_run
from specui.store import Store
from specui.ui.render import output_html, stats_markdown, step_html
from specui.verifier.embedded import cache_dir
from specui.vllm.request_steps import UNKNOWN_TOKEN, TokenTexts
from specui.workbench import WORKBENCH
from tests.support.replay_helpers import histogram_request, per_step_request, store_vllm_style_run

PROMPT = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."
K = 3
ACCEPTED = [2, 0, 3, 1, 3]  # per verify step, as vLLM reports them in order


@pytest.fixture(scope="module")
def texts() -> TokenTexts:
    # The embedded verifier's tokenizer folder: what a launched vLLM server's run uses for token
    # texts.
    folder = cache_dir() / "models" / "smollm2-135m-instruct"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(
            "the embedded verifier is not converted yet (Verifier.load('embedded') does it)"
        )
    return TokenTexts(str(folder))


@pytest.fixture(scope="module")
def output_ids(embedded_verifier) -> list[int]:
    ids = embedded_verifier.encode(
        "The quick brown fox jumps over the lazy dog and runs far away.", chat=False
    )
    return ids[: 1 + sum(a + 1 for a in ACCEPTED)]


def _norm(steps) -> list[dict]:
    """Steps as dicts with NaN (vLLM's unknown probabilities) as None: NaN != NaN."""

    def fix(v):
        return (
            [fix(x) for x in v]
            if isinstance(v, list)
            else (None if isinstance(v, float) and math.isnan(v) else v)
        )

    return [{k: fix(v) for k, v in s.to_dict().items()} for s in steps]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store(tmp_path / "specui.db") as s:
        yield s


def test_local_run_replays_the_recorded_steps_in_order(store, embedded_verifier):
    with WORKBENCH.drafter("ngram", embedded_verifier, 4) as d:
        recorded = record_run(
            store,
            embedded_verifier,
            d,
            [Prompt(id="p", source="test", text=PROMPT)],
            prompt_set="test",
            # A fixed K: the test is the replay of drafted steps, not the policy's choice of them.
            request=DecodeRequest(
                drafter="ngram", num_speculative_tokens=4, max_new_tokens=24, policy="fixed"
            ),
        )
    live = recorded.results[0]
    rp = load_replay(store, recorded.run_id)
    assert (
        rp.prompt_index == 0
        and rp.source.key == "local"
        and rp.source.drafts_known
        and rp.source.real_order
    )
    # Every stored field, in order (probabilities round-trip exactly); who proposed a step and the
    # drafts the policy did not send are shown live only (StepTrace: not stored).
    unstored = {"proposer": None, "unsent_token_ids": [], "unsent_texts": []}
    stored = [dataclasses.replace(s, **unstored) for s in live.steps]
    assert rp.steps == stored
    assert any(
        s.num_accepted > 0 for s in rp.steps
    )  # n-gram lookup on a repetition prompt accepts some
    res = rp.result()
    assert res.output_token_ids == live.output_token_ids
    assert res.acceptance_length == pytest.approx(live.acceptance_length)
    assert res.per_position_acceptance == pytest.approx(live.per_position_acceptance)
    assert list(play(rp.steps, 0)) == stored
    # The replayed view renders exactly what live decoding rendered.
    assert step_html(rp.steps[0]) == step_html(live.steps[0]) and output_html(
        rp.steps
    ) == output_html(live.steps)


def test_vllm_per_step_run_replays_counts_in_order_without_inventing_drafts(
    store, texts, output_ids
):
    run_id, stored = store_vllm_style_run(
        store,
        [("a prompt", per_step_request(0, [1, 2, 3], output_ids, ACCEPTED, K))],
        k=K,
        texts=texts,
    )
    rp = load_replay(store, run_id, 0)
    assert rp.source.key == "per_step" and rp.source.real_order and not rp.source.drafts_known
    assert "rejected draft tokens" in rp.source.note
    assert [s.num_accepted for s in rp.steps] == [
        0,
        *ACCEPTED,
    ]  # the prefill step first, then vLLM's order
    assert [s.num_drafted for s in rp.steps] == [0] + [K] * len(ACCEPTED)
    assert _norm(rp.steps) == _norm(stored[0])
    assert [t for s in rp.steps for t in s.emitted_token_ids] == output_ids
    step = rp.steps[
        1
    ]  # 2 of 3 accepted: the accepted drafts are the emitted tokens, the rejected one unknown
    assert step.draft_token_ids == [output_ids[1], output_ids[2], UNKNOWN_TOKEN]
    assert math.isnan(step.draft_probs[0])
    html = step_html(step)
    assert re.findall(r'class="tok ([\w ]+)"', html) == [
        "accepted",
        "accepted",
        "rejected unknown",
        "corrected",
    ]
    assert "3 drafted, 2 accepted" in html and "nan" not in html
    accepted_texts = re.findall(r'class="tok accepted"[^>]*>([^<]*)<', html)
    assert accepted_texts == [
        texts(output_ids[1]).replace(" ", "␣"),
        texts(output_ids[2]).replace(" ", "␣"),
    ]
    res = rp.result()
    assert res.acceptance_length == pytest.approx(1 + sum(ACCEPTED) / len(ACCEPTED))
    assert res.per_position_acceptance == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    stats = stats_markdown(res, running=False)
    assert f"**{res.acceptance_length:.2f}**" in stats and "per-step times not recorded" in stats


def test_vllm_histogram_run_is_labelled_as_not_the_real_order(store, texts, output_ids):
    hist = [1, 1, 0, 3]  # one step accepted 0, one accepted 1, three accepted all 3
    out = output_ids[: 1 + sum(j + 1 for j, c in enumerate(hist) for _ in range(c))]
    run_id, _ = store_vllm_style_run(
        store, [("p", histogram_request(0, [1], out, hist))], k=K, texts=texts
    )
    rp = load_replay(store, run_id)
    assert rp.source.key == "histogram" and not rp.source.real_order
    assert "NOT the real per-step order" in rp.source.note
    assert sorted(s.num_accepted for s in rp.steps if s.num_drafted) == [0, 1, 3, 3, 3]
    assert rp.result().acceptance_length == pytest.approx(1 + 10 / 5)


def test_mixed_run_and_step_source_of_each_backend(store, texts, output_ids):
    run_id, _ = store_vllm_style_run(
        store,
        [
            ("a", per_step_request(0, [1], output_ids, ACCEPTED, K)),
            ("b", histogram_request(1, [1], output_ids[:6], [1, 0, 0, 1])),
        ],
        k=K,
        texts=texts,
    )
    assert step_source(store.get_run(run_id)).key == "mixed"
    assert load_replay(store, run_id, 1).source.key == "mixed"
    assert [s.num_accepted for s in load_replay(store, run_id, 0).steps] == [0, *ACCEPTED]


def test_unknown_runs_and_requests_are_clear_errors(store, texts, output_ids):
    with pytest.raises(SpecUIError, match="unknown run id 99"):
        load_replay(store, 99)
    run_id, _ = store_vllm_style_run(
        store, [("a", per_step_request(0, [1], output_ids, ACCEPTED, K))], k=K, texts=texts
    )
    with pytest.raises(SpecUIError, match=r"has no request 5 \(its requests: 0\)"):
        load_replay(store, run_id, 5)
    empty = store.create_run(verifier="v", prompt_set="p")
    with pytest.raises(SpecUIError, match="stored no requests"):
        load_replay(store, empty.id)
    assert [r.id for r in replay_runs(store)] == [run_id]  # runs without steps are not offered


def test_play_stops_when_asked(store, texts, output_ids):
    run_id, _ = store_vllm_style_run(
        store, [("a", per_step_request(0, [1], output_ids, ACCEPTED, K))], k=K, texts=texts
    )
    steps = load_replay(store, run_id).steps
    stop = threading.Event()
    got = []
    for s in play(steps, 0, stop):
        got.append(s)
        if len(got) == 2:
            stop.set()
    assert got == steps[:2]
    with pytest.raises(SpecUIError, match="steps per second"):
        list(play(steps, -1))


def test_cli_replay_prints_the_stored_steps(store, texts, output_ids, capsys):
    run_id, stored = store_vllm_style_run(
        store, [("a", per_step_request(0, [1], output_ids, ACCEPTED, K))], k=K, texts=texts
    )
    assert (
        main(["runs", "replay", str(run_id), "--request", "0", "--db", str(store.path), "--json"])
        == 0
    )
    lines = [
        json.loads(ln) for ln in capsys.readouterr().out.splitlines()
    ]  # strict JSON: NaN printed as null
    *steps, summary = lines
    assert [s["num_accepted"] for s in steps] == [s.num_accepted for s in stored[0]]
    assert steps[1]["draft_token_ids"][-1] == UNKNOWN_TOKEN and steps[1]["draft_probs"][0] is None
    assert summary["step_source"] == "per_step" and summary["acceptance_length"] == pytest.approx(
        1 + 9 / 5
    )
    assert main(["runs", "replay", str(run_id), "--db", str(store.path)]) == 0
    text = capsys.readouterr().out
    assert "vLLM per-step counts" in text and "drafted 3  accepted 2" in text and "?" in text
    assert main(["runs", "replay", "42", "--db", str(store.path)]) == 2
    assert "unknown run id 42" in capsys.readouterr().err
