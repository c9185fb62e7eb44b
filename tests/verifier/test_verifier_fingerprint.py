"""Runs know their verifier's weights: the fingerprint, its column in the store, the speedup
baseline that must share it, and Compare telling two weight sets of one name apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specui.algorithms.simple import NgramDrafter, PlainDrafter
from specui.data.prompts import Prompt
from specui.errors import SpecUIError
from specui.metrics.comparison import compare
from specui.service import DecodeRequest, record_run, record_runs
from specui.store import SCHEMA_VERSION, RunStatus, Store
from specui.verifier.fingerprint import folder_fingerprint, model_fingerprint, weights_fingerprint
from specui.verifier.model import Verifier
from tests.support.store_helpers import make_trace, record
from tests.support.store_history import write_old_store
from tests.support.verifiers import make_tiny_verifier

NAME = (
    "SmolLM2-135M-Instruct"  # both weight sets carry the one name, as the embedded and the hub's do
)
PROMPTS = [
    Prompt(id=f"p{i}", source="fp-test", token_ids=tuple((i + j) % 8 for j in range(6)))
    for i in range(3)
]


def _tiny(seed: int) -> Verifier:
    v = make_tiny_verifier(seed=seed)
    v.name = NAME
    return v


def test_fingerprint_is_stable_for_the_same_weights_and_differs_for_others(tmp_path: Path) -> None:
    a, a_again, b = _tiny(0), _tiny(0), _tiny(1)
    assert a.fingerprint == a_again.fingerprint == model_fingerprint(a.model)
    assert len(a.fingerprint) == 16 and int(a.fingerprint, 16) >= 0
    assert b.fingerprint != a.fingerprint
    # One value deep inside (not the embedding, not the LM head) is another weight set.
    nudged = _tiny(0)
    with torch.no_grad():
        nudged.model.model.layers[2].mlp.down_proj.weight[0, 0] += 1e-3
    assert model_fingerprint(nudged.model) != a.fingerprint

    # The same weights read from safetensors without loading (what a vLLM run stores),
    # in one file or in shards, and loaded back as a Verifier in any precision.
    one, shards = tmp_path / "one", tmp_path / "shards"
    a.model.save_pretrained(one)
    a.model.save_pretrained(shards, max_shard_size="20KB")
    assert (shards / "model.safetensors.index.json").is_file()
    assert (
        folder_fingerprint(one)
        == folder_fingerprint(shards)
        == weights_fingerprint(str(one))
        == a.fingerprint
    )
    assert Verifier.load(str(one)).fingerprint == a.fingerprint
    # bf16 verification frees the float32 weights: the fingerprint is taken before that.
    # (vocabulary 256: batch_invariant.check draws token ids from 100 up)
    wide = make_tiny_verifier(vocab_size=256, seed=2)
    wide.model.save_pretrained(tmp_path / "wide")
    switched = Verifier.load(str(tmp_path / "wide"), precision="auto")
    assert switched.fingerprint == wide.fingerprint


def test_unknown_and_unreadable_weights(tmp_path: Path) -> None:
    assert weights_fingerprint(None) is None
    assert weights_fingerprint("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a hub id: unknown
    empty = tmp_path / "no-weights"
    empty.mkdir()
    assert folder_fingerprint(empty) is None
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    with pytest.raises(SpecUIError, match="cannot read the weights"):
        folder_fingerprint(broken)


def test_embedded_fingerprint_from_the_folder_matches_the_loaded_model(embedded_verifier) -> None:
    assert weights_fingerprint("embedded") == embedded_verifier.fingerprint


def test_speedup_baseline_and_comparison_keep_two_weight_sets_apart(tmp_path: Path) -> None:
    from specui.ui.compare import comparison_frame, run_choices, verifier_choices

    va, vb = _tiny(0), _tiny(1)
    assert va.name == vb.name and va.fingerprint != vb.fingerprint
    store = Store(tmp_path / "specui.db")
    plain = DecodeRequest(drafter="none", max_new_tokens=16)
    ngram = DecodeRequest(drafter="ngram", num_speculative_tokens=3, max_new_tokens=16)
    # A plain baseline and a drafter run on weights A; only a drafter run on weights B.
    a_plain, a_ngram = (
        r.run_id
        for r in record_runs(
            store,
            va,
            [(PlainDrafter(), plain), (NgramDrafter(3), ngram)],
            PROMPTS,
            prompt_set="fp-test",
        )
    )
    b_ngram = record_run(
        store, vb, NgramDrafter(3), PROMPTS, prompt_set="fp-test", request=ngram
    ).run_id
    stored = {rid: store.get_run(rid) for rid in (a_plain, a_ngram, b_ngram)}
    assert [stored[r].verifier_fingerprint for r in (a_plain, a_ngram, b_ngram)] == [
        va.fingerprint
    ] * 2 + [vb.fingerprint]

    cmp = compare(store, [a_plain, a_ngram, b_ngram])
    assert cmp.values("verifier") == [NAME] * 3
    assert cmp.values("verifier_fingerprint") == [va.fingerprint, va.fingerprint, vb.fingerprint]
    assert cmp.values("baseline_run_id") == [a_plain, a_plain, None]
    assert cmp.values("speedup")[1] is not None
    assert cmp.values("speedup")[2] is None  # weights A's plain run says nothing about weights B

    # Unknown matches only unknown: a plain run of unknown weights (a pre-fingerprint run),
    # the newest of all, is the baseline of an unknown drafter run and of nobody else.
    unknown_plain = store.create_run(verifier=NAME, prompt_set="fp-test")
    record(
        store,
        unknown_plain.id,
        [[make_trace(i, 0) for i in range(16)] for _ in PROMPTS],
        [0.5] * 3,
        0,
    )
    unknown_ngram = store.create_run(
        verifier=NAME, prompt_set="fp-test", algorithm="ngram", verifier_fingerprint=""
    )
    record(
        store,
        unknown_ngram.id,
        [[make_trace(i, 3) for i in range(6)] for _ in PROMPTS],
        [0.4] * 3,
        3,
    )
    assert store.get_run(unknown_ngram.id).verifier_fingerprint is None  # "" is stored as unknown
    # And a later plain run on weights B becomes B's baseline, never A's.
    b_plain = record_run(
        store, vb, PlainDrafter(), PROMPTS, prompt_set="fp-test", request=plain
    ).run_id
    cmp = compare(store, [a_ngram, b_ngram, unknown_ngram.id])
    assert cmp.values("baseline_run_id") == [a_plain, b_plain, unknown_plain.id]
    assert all(s is not None for s in cmp.values("speedup"))

    # Compare: one name, three weight sets -> three verifier choices, each filtering its runs.
    choices = verifier_choices(store)
    assert choices == {
        f"{NAME} ({va.fingerprint[:8]})": (NAME, va.fingerprint),
        f"{NAME} ({vb.fingerprint[:8]})": (NAME, vb.fingerprint),
        f"{NAME} (unknown weights)": (NAME, None),
    }
    ids = {
        label: [int(c.split(":")[0]) for c in run_choices(store, verifier=label)]
        for label in choices
    }
    assert sorted(ids[f"{NAME} ({va.fingerprint[:8]})"]) == [a_plain, a_ngram]
    assert sorted(ids[f"{NAME} ({vb.fingerprint[:8]})"]) == [b_ngram, b_plain]
    assert sorted(ids[f"{NAME} (unknown weights)"]) == [unknown_plain.id, unknown_ngram.id]
    assert len(run_choices(store, verifier=NAME)) == 6  # the bare name: every weight set
    shown = comparison_frame(cmp).data  # the values stay whole; the display is shortened
    assert list(shown["Verifier weights"][:2]) == [va.fingerprint, vb.fingerprint]
    html = comparison_frame(cmp).to_html()
    assert va.fingerprint[:8] in html and va.fingerprint not in html
    store.close()


def test_a_v2_store_is_migrated_and_its_runs_have_unknown_weights(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    conn = write_old_store(path, 2)
    conn.execute(
        "INSERT INTO runs (drafter, algorithm, verifier, backend, prompt_set, status, started_at) "
        f"VALUES ('none', 'none', '{NAME}', 'local', 'ps', 'done', 1.0)"
    )
    conn.commit()
    conn.close()
    with Store(path) as store:
        assert store.schema_version() == SCHEMA_VERSION == 3
        old = store.get_run(1)
        assert old.verifier_fingerprint is None and old.status == RunStatus.DONE
        new = store.create_run(
            verifier=NAME, prompt_set="ps", verifier_fingerprint="0123456789abcdef"
        )
        assert store.get_run(new.id).verifier_fingerprint == "0123456789abcdef"
        assert store.list_verifiers() == [(NAME, None), (NAME, "0123456789abcdef")]
        before = len(store.list_runs())
        with pytest.raises(SpecUIError, match="hex digits"):
            store.create_run(verifier=NAME, prompt_set="ps", verifier_fingerprint="SmolLM2; DROP")
        assert len(store.list_runs()) == before  # a refused run stores nothing
