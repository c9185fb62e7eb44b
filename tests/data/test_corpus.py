"""The general training corpus: Magpie self-instruct, filtering, and the mix that ships."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from specui.data.corpus import build
from specui.data.magpie import filter_user_turns, read_samples, sample_user_turns, user_prefix_ids
from specui.errors import SpecUIError
from tests.support.paths import REPO


def _rows(*texts: str, complete: bool = True) -> list[dict]:
    return [{"batch": 0, "kind": "chat", "text": t, "complete": complete} for t in texts]


def test_filter_keeps_distinct_well_formed_requests_only():
    rows = _rows(
        "Can you suggest three ways to save money on groceries each week?",
        "can you suggest three ways to save money on groceries, each week??",  # same words
        "Can you suggest three ways to save money on a trip to Japan?",  # same first eight words
        "What is the difference between a list and a tuple in Python?",
        "Sure, here is a poem about the sea and the sky at night.",  # an answer, not a request
        "hi there",  # too short
        "the the the the the the the the the the the the the the the",  # a loop
        "What is 2+2? <|im_end|> assistant: 4",  # a leaked turn
    ) + _rows("Write a story about a dragon who is afraid of", complete=False)  # cut off
    kept = [r["text"] for r in filter_user_turns(rows)]
    assert kept == [
        "Can you suggest three ways to save money on groceries each week?",
        "What is the difference between a list and a tuple in Python?",
    ]


def test_user_prefix_is_the_chat_template_up_to_the_user_text(embedded_verifier):
    prefix = embedded_verifier.tokenizer.decode(user_prefix_ids(embedded_verifier))
    assert prefix.endswith("<|im_start|>user\n")
    assert "system" in prefix  # the template's default system prompt stays
    steered = embedded_verifier.tokenizer.decode(
        user_prefix_ids(embedded_verifier, "You are a math tutor.")
    )
    assert "You are a math tutor." in steered and steered.endswith("<|im_start|>user\n")


@pytest.mark.slow
def test_magpie_sampling_resumes_to_the_same_samples(tmp_path, embedded_verifier):
    kinds = {"chat": None, "code": "You are a programming assistant."}
    path = tmp_path / "raw.jsonl"
    first = sample_user_turns(
        embedded_verifier, 4, path, batch_size=2, max_new_tokens=6, kinds=kinds
    )
    assert [r["batch"] for r in first] == [0, 0, 1, 1]
    assert [r["kind"] for r in first] == ["chat", "chat", "code", "code"]
    # A run killed during batch 1 (its lines lost, the last one torn) resumes with batch 1 again.
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])
    again = sample_user_turns(
        embedded_verifier, 4, path, batch_size=2, max_new_tokens=6, kinds=kinds
    )
    assert [r["text"] for r in again] == [r["text"] for r in first]
    assert len(read_samples(path)) == 4
    with pytest.raises(SpecUIError, match="resume it with that batch size"):
        sample_user_turns(embedded_verifier, 8, path, batch_size=4, max_new_tokens=6, kinds=kinds)
    assert len(read_samples(path)) == 4  # nothing dropped


def test_build_drops_duplicates_and_refuses_evaluation_prompts():
    from specui.data import load_prompts

    a = [
        {"id": "a/0", "prompt": "Explain recursion to a child.", "kind": "chat", "source": "a"},
        {"id": "a/1", "prompt": "Explain  RECURSION to a child!", "kind": "chat", "source": "a"},
    ]
    b = [{"id": "b/0", "prompt": "Write a haiku about rain.", "kind": "writing", "source": "b"}]
    rows = build([a, b], seed=1)
    assert sorted(r["id"] for r in rows) in (["a/0", "b/0"], ["a/1", "b/0"])
    question = load_prompts("spec-bench:math_reasoning", limit=1)[0].text
    bad = [{"id": "c/0", "prompt": f"Homework: {question}", "kind": "math", "source": "c"}]
    with pytest.raises(SpecUIError, match="evaluation-only"):
        build([a, bad])


def test_the_shipped_corpus_is_broad():
    rows = [
        json.loads(line)
        for line in (REPO / "data" / "corpus" / "general.jsonl").read_text().splitlines()
    ]
    assert len({r["prompt"] for r in rows}) == len(rows)
    kinds = Counter(r["kind"] for r in rows)
    # At least five kinds of task, none of them most of the corpus.
    assert len([k for k, n in kinds.items() if n >= 100]) >= 5, kinds
    assert max(kinds.values()) < 0.5 * len(rows), kinds


def test_shipped_responses_are_read_first_and_nothing_is_generated_again(tmp_path, monkeypatch):
    from specui.data.distill import export_cache, prompt_key, self_distill, synthetic_prompts
    from tests.support.verifiers import make_tiny_verifier

    verifier = make_tiny_verifier(vocab_size=16, eos=None)
    prompts = synthetic_prompts(3, 16)
    first = self_distill(verifier, prompts, 4, batch_size=2, cache_dir=tmp_path / "run1")
    assert all(len(s.response_ids) == 4 for s in first)
    shipped = tmp_path / "shipped"
    [gz] = export_cache(tmp_path / "run1", shipped / "corpus")
    assert (
        export_cache(tmp_path / "run1", tmp_path / "again")
        and (tmp_path / "again" / gz.name).read_bytes() == gz.read_bytes()
    )
    monkeypatch.setenv("SPECUI_SHIPPED_DIR", str(shipped))
    totals: list[int] = []
    second = self_distill(
        verifier,
        prompts,
        4,
        batch_size=2,
        cache_dir=tmp_path / "run2",
        progress=lambda done, total: totals.append(total),
    )
    assert totals == [0]  # every response came from the shipped file
    assert [s.response_ids for s in second] == [s.response_ids for s in first]
    # Only the kept prompts are exported.
    [part] = export_cache(
        tmp_path / "run1", tmp_path / "part", keep={prompt_key(first[0].prompt_ids)}
    )
    assert len(gzip.decompress(part.read_bytes()).decode().splitlines()) == 1


def test_response_cache_key_follows_the_weights_not_the_folder(tmp_path, fixture_dir):
    import shutil

    import torch

    from specui.data.distill import verifier_fingerprint
    from specui.verifier.model import Verifier

    shutil.copytree(fixture_dir / "verifier", tmp_path / "elsewhere")
    here, there = (
        Verifier.load(str(fixture_dir / "verifier")),
        Verifier.load(str(tmp_path / "elsewhere")),
    )
    assert verifier_fingerprint(here) == verifier_fingerprint(
        there
    )  # shipped caches work on any machine
    changed = Verifier.load(str(tmp_path / "elsewhere"))
    with torch.no_grad():
        changed.lm_head.weight[0, 0] += 1.0
    changed.__dict__.pop(
        "fingerprint", None
    )  # computed once per load; this load's weights changed after
    assert verifier_fingerprint(changed) != verifier_fingerprint(here)


def test_the_shipped_responses_answer_the_embedded_verifier(embedded_verifier):
    """The committed responses are found under this machine's transformers: their file name is the
    verifier's cache key, so a key that moved with a library upgrade would send a fresh clone's
    first training run into hours of generating them again."""
    from specui.data import load_prompts
    from specui.data.distill import cached_responses, prompt_key, verifier_fingerprint
    from specui.paths import shipped_data_dir

    v = embedded_verifier
    shipped = [shipped_data_dir() / "corpus"]
    cache = cached_responses(verifier_fingerprint(v), 128, v.eos_token_ids, shipped)
    prompts = load_prompts("general", split="train", limit=200)
    answered = [p.id for p in prompts if prompt_key(p.encode(v)) in cache]
    missing = len(prompts) - len(answered)
    assert not missing, f"{missing} of {len(prompts)} prompts have no shipped response"


def test_the_cache_key_reads_the_architecture_not_the_config_json():
    """transformers 5 writes rope_theta inside rope_parameters and adds or drops fields; the key
    reads what the model computes, so both spellings give one key, and a real change another."""
    from types import SimpleNamespace

    from specui.data.distill import architecture

    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    rest = dict(num_key_value_heads=2, vocab_size=100, hidden_act="silu", tie_word_embeddings=True)
    common = dict(model_type="llama", **shape, **rest, rms_norm_eps=1e-5)
    rope = {"rope_theta": 10000.0, "rope_type": "default"}
    older = SimpleNamespace(
        **common, rope_theta=10000, rope_scaling=None, transformers_version="4.56"
    )
    v5 = dict(transformers_version="5.24", id2label={0: "LABEL_0"})
    newer = SimpleNamespace(**common, head_dim=16, rope_parameters=rope, **v5)
    assert architecture(older) == architecture(newer)
    other_rope = SimpleNamespace(**common, rope_parameters={**rope, "rope_theta": 50000.0})
    assert architecture(other_rope) != architecture(newer)
    deeper = SimpleNamespace(**{**common, "num_hidden_layers": 3}, rope_theta=10000)
    assert architecture(deeper) != architecture(older)
