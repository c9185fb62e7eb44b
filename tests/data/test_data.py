"""Prompt sets, self-distillation and hidden-state extraction (fixture verifier only: fast)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from specui.data import load_prompts, prompt_sets, read_prompt_file
from specui.data.distill import TokenSample, self_distill, synthetic_prompts
from specui.data.hidden import (
    HiddenStateStore,
    LocalExtractor,
    bytes_per_token,
    read_sample,
    write_sample,
)
from specui.data.prompts import Prompt, split_of, write_prompt_file
from specui.errors import SpecUIError
from specui.verifier.batched import reference_greedy
from tests.support.kernel_marks import needs_kernel

# --- prompt sets -----------------------------------------------------------------------------


def test_builtin_sets_are_registered():
    assert {"humaneval", "gsm-symbolic", "rg-math", "demo"} <= set(prompt_sets())


@pytest.mark.parametrize(
    ("name", "limit"),
    [("humaneval", None), ("gsm-symbolic", 300), ("rg-math", 300), ("demo", None)],
)
def test_train_and_eval_splits_never_share_content(name, limit):
    train = load_prompts(name, split="train", limit=limit)
    held_out = load_prompts(name, split="eval", limit=limit)
    assert train and held_out
    assert not {p.content_hash for p in train} & {p.content_hash for p in held_out}
    # Deterministic: the same call gives the same prompts in the same order.
    assert [p.content_hash for p in load_prompts(name, split="eval", limit=limit)] == [
        p.content_hash for p in held_out
    ]


def test_humaneval_split_covers_every_problem():
    train, held_out = load_prompts("humaneval", "train"), load_prompts("humaneval", "eval")
    assert len(train) + len(held_out) == 164
    assert all(p.text and "def " in p.text for p in held_out)


def test_gsm_symbolic_eval_templates_are_unseen_in_train():
    train = load_prompts("gsm-symbolic", "train", limit=200)
    held_out = load_prompts("gsm-symbolic", "eval", limit=50)
    assert len(held_out) == 50
    assert not {p.meta["template"] for p in train} & {p.meta["template"] for p in held_out}


@pytest.mark.parametrize("name", ["gsm-symbolic", "rg-math", "gsm-symbolic,rg-math"])
def test_limit_takes_a_prefix(name):
    assert load_prompts(name, "train", limit=5) == load_prompts(name, "train", limit=40)[:5]


def test_rg_math_mixes_its_tasks_and_leaves_gsm_symbolic_out():
    from specui.data.sets import RG_MATH_TASKS

    prompts = load_prompts("rg-math", "train", limit=200)
    assert len(prompts) == 200 and all(p.text for p in prompts)
    assert {p.meta["task"] for p in prompts} == set(
        RG_MATH_TASKS
    )  # every task within a short prefix
    assert "gsm_symbolic" not in RG_MATH_TASKS


def test_a_mix_alternates_its_sets_within_one_split():
    mixed = load_prompts("gsm-symbolic,rg-math", "train", limit=100)
    assert [p.source for p in mixed[:4]] == ["gsm-symbolic", "rg-math", "gsm-symbolic", "rg-math"]
    assert [p for p in mixed if p.source == "gsm-symbolic"] == load_prompts(
        "gsm-symbolic", "train", limit=50
    )
    held_out = {p.content_hash for p in load_prompts("gsm-symbolic,rg-math", "eval", limit=100)}
    assert not held_out & {p.content_hash for p in mixed}


def test_bench_scores_a_sets_held_out_split_and_a_file_whole(tmp_path):
    from specui.data import bench_split

    path = write_prompt_file(tmp_path / "p.jsonl", [Prompt("q", "t", text="a question")])
    assert bench_split("gsm-symbolic") == bench_split("gsm-symbolic,rg-math") == "eval"
    assert bench_split(str(path)) == "all"
    with pytest.raises(SpecUIError, match="mixes prompt sets and files"):
        bench_split(f"gsm-symbolic,{path}")
    with pytest.raises(SpecUIError, match="empty prompt set name"):
        load_prompts("gsm-symbolic,", "train", limit=3)


def test_user_jsonl_split_is_disjoint_and_covers_the_file(tmp_path):
    path = write_prompt_file(
        tmp_path / "p.jsonl", [Prompt(f"q{i}", "t", text=f"question number {i}") for i in range(60)]
    )
    train, held_out = load_prompts(path, "train"), load_prompts(path, "eval")
    assert len(train) + len(held_out) == 60 and held_out
    assert not {p.content_hash for p in train} & {p.content_hash for p in held_out}
    assert len(load_prompts(path, "all")) == 60


def test_split_key_decides_split_stably():
    assert split_of("some key") == split_of("some key")
    share = sum(split_of(f"k{i}") == "eval" for i in range(2000)) / 2000
    assert 0.15 < share < 0.25  # the default eval fraction is 0.2


def test_jsonl_rows_of_every_kind_are_read(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [
        {"id": "a", "prompt": "hello"},
        {"messages": [{"role": "user", "content": "hi"}]},
        {"prompt_ids": [1, 2, 3], "response_ids": [4, 5]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    a, b, c = read_prompt_file(path)
    assert a.id == "a" and a.text == "hello"
    assert b.id == "line-2" and b.messages == ({"role": "user", "content": "hi"},)
    assert c.token_ids == (1, 2, 3) and c.response_ids == (4, 5)


def test_broken_jsonl_line_is_reported_with_its_number_and_good_lines_kept(tmp_path, caplog):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one"}\n{"prompt": "two"\n{"prompt": 3}\n\n{"prompt": "five"}\n')
    problems = []
    with caplog.at_level(logging.WARNING):
        prompts = read_prompt_file(path, problems)
    assert [p.text for p in prompts] == ["one", "five"]
    assert [p.line for p in problems] == [2, 3]
    assert "line 2" in caplog.text and "line 3" in caplog.text


@pytest.mark.parametrize(
    "content",
    ["", "\n\n", "not json\n[1, 2]\n", '{"text": "wrong field"}\n', '{"prompt_ids": [-1]}\n'],
)
def test_file_without_usable_rows_is_a_clear_error(tmp_path, content):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(SpecUIError, match="no usable rows"):
        load_prompts(path)


def test_unknown_set_name_lists_the_known_ones():
    with pytest.raises(SpecUIError, match="humaneval"):
        load_prompts("no-such-set")


def test_unknown_split_is_an_error():
    with pytest.raises(SpecUIError, match="split"):
        load_prompts("demo", split="validation")


# --- self-distillation ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def id_prompts(fixture_verifier):
    # Never the fixture's mask token (the last id).
    return synthetic_prompts(
        5, fixture_verifier.vocab_size, seed=3, exclude=[fixture_verifier.vocab_size - 1]
    )


def test_batched_greedy_generation_equals_one_by_one(fixture_verifier, id_prompts):
    batched = reference_greedy(fixture_verifier, [p.token_ids for p in id_prompts], 12)
    single = [reference_greedy(fixture_verifier, [p.token_ids], 12)[0] for p in id_prompts]
    assert batched == single
    assert all(len(r) == 12 for r in batched)  # the fixture has no EOS: full length


def test_greedy_response_is_the_verifier_argmax(fixture_verifier, id_prompts):
    p = id_prompts[0]
    (resp,) = reference_greedy(fixture_verifier, [p.token_ids], 6)
    ids = torch.tensor([*p.token_ids, *resp])
    logits = fixture_verifier.forward(ids).logits
    assert logits[len(p.token_ids) - 1 : -1].argmax(-1).tolist() == list(resp)


def test_generation_stops_after_eos(fixture_verifier, id_prompts):
    (free,) = reference_greedy(fixture_verifier, [id_prompts[0].token_ids], 10)
    eos = free[3]
    fixture_verifier.model.generation_config.eos_token_id = eos
    try:
        (cut,) = reference_greedy(fixture_verifier, [id_prompts[0].token_ids], 10)
    finally:
        fixture_verifier.model.generation_config.eos_token_id = None
    assert cut == free[: free.index(eos) + 1]


def test_responses_are_cached_on_disk(fixture_verifier, id_prompts, tmp_path, monkeypatch):
    first = self_distill(
        fixture_verifier, id_prompts, max_new_tokens=8, batch_size=2, cache_dir=tmp_path
    )
    assert [s.prompt_ids for s in first] == [p.token_ids for p in id_prompts]
    assert all(
        len(s.response_ids) == 8 and s.loss_mask == [0] * len(s.prompt_ids) + [1] * 8 for s in first
    )

    def no_generation(*a, **k):
        raise AssertionError("generated although cached")

    monkeypatch.setattr("specui.data.generate.reference_greedy", no_generation)
    monkeypatch.setattr("specui.data.generate.generate_responses", no_generation)
    assert (
        self_distill(
            fixture_verifier, id_prompts, max_new_tokens=8, batch_size=2, cache_dir=tmp_path
        )
        == first
    )


def test_torn_cache_line_is_regenerated(fixture_verifier, id_prompts, tmp_path):
    first = self_distill(fixture_verifier, id_prompts[:2], max_new_tokens=4, cache_dir=tmp_path)
    (cache,) = tmp_path.glob("responses-*.jsonl")
    lines = cache.read_text().splitlines()
    cache.write_text(lines[0] + "\n" + lines[1][:10])  # a crash mid-append
    assert (
        self_distill(fixture_verifier, id_prompts[:2], max_new_tokens=4, cache_dir=tmp_path)
        == first
    )


def _distill(verifier, prompts, n, cache_dir):
    """self_distill, and how many prompts it had to generate (its first progress report)."""
    totals: list[int] = []
    out = self_distill(
        verifier,
        prompts,
        n,
        batch_size=4,
        cache_dir=cache_dir,
        progress=lambda done, total: totals.append(total),
    )
    return [s.response_ids for s in out], totals[0]


@pytest.fixture
def eos_verifier(tmp_path, monkeypatch):
    """A tiny verifier whose greedy responses to ``eos_prompts`` end at EOS (token 3) at
    several lengths, some before 6 tokens, some after; no shipped responses in the way."""
    from tests.support.verifiers import make_tiny_verifier

    monkeypatch.setenv("SPECUI_SHIPPED_DIR", str(tmp_path / "shipped"))
    return make_tiny_verifier(vocab_size=8, eos=3)


EOS = 3


def eos_prompts():
    return synthetic_prompts(12, 8, exclude=[EOS])


def test_a_cache_of_a_longer_cap_serves_a_shorter_request_by_cutting(eos_verifier, tmp_path):
    prompts = eos_prompts()
    long_, generated = _distill(eos_verifier, prompts, 6, tmp_path / "run")
    assert generated == len(prompts)
    short, generated = _distill(eos_verifier, prompts, 2, tmp_path / "run")
    assert generated == 0  # every one cut from the 6-token responses
    fresh, _ = _distill(eos_verifier, prompts, 2, tmp_path / "fresh")
    assert short == fresh and short == [r[:2] for r in long_]
    assert any(len(r) == 1 and r[-1] == EOS for r in short)  # an EOS within the cap stays its end
    assert not list((tmp_path / "run").glob("*-n2.jsonl"))  # nothing new was written


def test_a_response_that_ended_serves_any_longer_request(eos_verifier, tmp_path):
    prompts = eos_prompts()
    short, _ = _distill(eos_verifier, prompts, 6, tmp_path / "run")
    ended = [r for r in short if r[-1] == EOS]
    assert 0 < len(ended) < len(prompts)  # the test needs both kinds
    long_, generated = _distill(eos_verifier, prompts, 12, tmp_path / "run")
    assert generated == len(prompts) - len(ended)  # only the ones cut by the 6-token cap
    fresh, _ = _distill(eos_verifier, prompts, 12, tmp_path / "fresh")
    assert long_ == fresh
    assert [r for r in long_ if r[-1] == EOS and len(r) <= 6] == ended
    # The 12-token cache now answers 6 as well, and the 6-token one still wins at 6.
    assert _distill(eos_verifier, prompts, 6, tmp_path / "run") == (short, 0)


def test_serve_response_keeps_the_first_eos_and_refuses_what_the_cap_cut():
    from specui.data.distill import serve_response

    assert serve_response((5, 6, 7, 8), 4, 2, {3}) == (5, 6)  # cut to the shorter cap
    assert serve_response((5, 3, 7, 3), 4, 3, {3}) == (5, 3)  # a file not cut at its first EOS
    assert serve_response((5, 6, 3), 4, 9, {3}) == (5, 6, 3)  # ended before its cap
    assert serve_response((5, 6, 7, 3), 4, 9, {3}) == (5, 6, 7, 3)  # ended at its cap with EOS
    assert serve_response((5, 6), 4, 9, {3}) == (5, 6)  # stopped short of its cap without EOS
    assert serve_response((5, 6, 7, 8), 4, 9, {3}) is None  # the cap cut it: 9 needs more
    assert serve_response((5, 6, 7, 8), 4, 4, {3}) == (5, 6, 7, 8)


def test_cache_files_rank_exact_cap_then_the_run_over_the_shipped(tmp_path):
    from specui.data.distill import cached_responses

    def write(folder, cap, rows, gz=False):
        folder.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps({"key": k, "response_ids": v}) + "\n" for k, v in rows.items())
        name = f"responses-abc123-n{cap}.jsonl"
        if gz:
            import gzip

            (folder / f"{name}.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (folder / name).write_text(text)

    shipped, run = tmp_path / "shipped", tmp_path / "run"
    write(shipped, 8, {"a": [1] * 8, "b": [2] * 8, "c": [9] * 8}, gz=True)
    write(run, 8, {"b": [4] * 8})
    write(run, 4, {"a": [5, 5, 5, 5], "d": [6, 6, 6, 6], "e": [7, 3]})
    write(run, 2, {"z": [8, 8]})  # a shorter cap without an EOS answers nothing at 4
    write(tmp_path / "other", 4, {"x": [1, 2, 3, 4]})  # another folder is not looked in
    other_verifier = json.dumps({"key": "f", "response_ids": [1]}) + "\n"
    (run / "responses-fff000-n4.jsonl").write_text(other_verifier)
    got = cached_responses("abc123", 4, {3}, [shipped, run])
    assert got == {"a": (5,) * 4, "b": (4,) * 4, "c": (9,) * 4, "d": (6,) * 4, "e": (7, 3)}
    assert cached_responses("abc123", 6, {3}, [shipped, run]) == {
        "a": (1,) * 6,
        "b": (4,) * 6,
        "c": (9,) * 6,
        "e": (7, 3),
    }


def test_prompts_with_their_own_response_skip_generation(fixture_verifier):
    p = Prompt("x", "t", token_ids=(1, 2, 3), response_ids=(4, 5))
    (s,) = self_distill(fixture_verifier, [p], max_new_tokens=8)
    assert s.response_ids == (4, 5)


def test_token_ids_outside_the_vocabulary_are_refused(fixture_verifier):
    with pytest.raises(SpecUIError, match="outside the verifier's vocabulary"):
        self_distill(fixture_verifier, [Prompt("x", "t", token_ids=(1, 100000))], max_new_tokens=2)


def test_text_prompt_on_a_verifier_without_tokenizer_is_a_clear_error():
    from tests.support.verifiers import make_tiny_verifier

    with pytest.raises(SpecUIError, match="tokenizer"):
        self_distill(make_tiny_verifier(), [Prompt("x", "t", text="hello")], max_new_tokens=2)


# --- hidden states -------------------------------------------------------------------------


AUX = [1, 3, 4]


@pytest.fixture(scope="module")
def samples(fixture_verifier, id_prompts):
    return self_distill(fixture_verifier, id_prompts[:3], max_new_tokens=6)


def test_extracted_file_has_the_speculators_layout(fixture_verifier, samples, tmp_path):
    ex = LocalExtractor(fixture_verifier, AUX, dtype=torch.float32)
    (path,) = ex.extract(samples[:1], tmp_path)
    t = load_file(str(path))
    T, N, H = len(samples[0]), fixture_verifier.num_layers, fixture_verifier.hidden_size
    assert (
        t["hidden_states"].shape == (T, len(AUX) + 1, H)
        and t["hidden_states"].dtype == torch.bfloat16
    )
    assert t["token_ids"].tolist() == samples[0].input_ids
    assert t["loss_mask"].tolist() == samples[0].loss_mask
    taps = fixture_verifier.taps(torch.tensor(samples[0].input_ids), [*AUX, N])
    assert torch.allclose(t["hidden_states"].float(), taps, atol=0.05, rtol=0.02)  # bf16 storage
    # The targets are the verifier's own next-token distribution after each position.
    ref = fixture_verifier.forward(torch.tensor(samples[0].input_ids)).logits
    assert t["target_ids"].shape == (T, 16) and t["target_logprobs"].dtype == torch.float32
    P = (
        len(samples[0].prompt_ids) - 1
    )  # targets from the last prompt token on: none scores earlier ones
    assert (t["target_ids"][:P] == -1).all()
    assert torch.equal(t["target_ids"][P:, 0], ref[P:].argmax(-1))
    torch.testing.assert_close(
        t["target_logprobs"][P:], ref[P:].log_softmax(-1).topk(16).values, atol=1e-4, rtol=0
    )
    s = read_sample(path, len(AUX))
    assert s.hidden_states.shape == (T, len(AUX) * H)
    assert torch.equal(s.target_ids, t["target_ids"])


def test_batched_extraction_equals_one_sample_at_a_time(fixture_verifier, samples, tmp_path):
    """Right-padded batches: padding never reaches a real position."""
    one = LocalExtractor(fixture_verifier, AUX, dtype=torch.float32, batch_tokens=1)
    many = LocalExtractor(fixture_verifier, AUX, dtype=torch.float32, batch_tokens=4096)
    for a, b in zip(
        one.extract(samples, tmp_path / "one"),
        many.extract(samples, tmp_path / "many"),
        strict=True,
    ):
        ta, tb = load_file(str(a)), load_file(str(b))
        torch.testing.assert_close(
            ta["hidden_states"].float(), tb["hidden_states"].float(), atol=2e-2, rtol=0
        )
        assert torch.equal(ta["target_ids"][:, 0], tb["target_ids"][:, 0])


@needs_kernel
@pytest.mark.parametrize("autocast", [False, True])
def test_extraction_attention_runs_on_the_kernel_near_sdpa(
    fixture_verifier, samples, monkeypatch, autocast
):
    """``taps_batch`` (an extraction's forward) runs its causal attention on the kernel, right
    padding and all, stays near SDPA's taps, and leaves the model on SDPA after."""
    from specui import kernels

    calls = []
    attention = kernels.attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return attention(*args, **kwargs)

    monkeypatch.setattr(kernels, "attention", counted)
    lengths = [len(s) for s in samples]
    ids = torch.zeros(len(samples), max(lengths), dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : len(s)] = torch.tensor(s.input_ids)
    model = fixture_verifier.model
    dtype = torch.bfloat16 if autocast else torch.float32
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        got = fixture_verifier.taps_batch(ids, AUX)
        assert model.config._attn_implementation == "sdpa"
        sdpa = fixture_verifier._run(ids, None, None, AUX, keep=1)  # the model as loaded
    want = torch.stack([sdpa[i] for i in AUX], dim=2)
    assert len(calls) == model.config.num_hidden_layers * len(samples)  # every layer, every row
    for row, n in enumerate(lengths):  # real positions only: padding's rows are never read
        scale = want[row, :n].abs().max()
        assert (got[row, :n] - want[row, :n]).abs().max() <= (2e-2 if autocast else 1e-5) * scale


def test_a_file_without_targets_gets_them_once(fixture_verifier, samples, tmp_path):
    """A vLLM-written file (taps only) is completed from its tap[N] on first read, then reused."""
    ex = LocalExtractor(fixture_verifier, AUX, dtype=torch.float32)
    (path,) = ex.extract(samples[:1], tmp_path)
    t = load_file(str(path))
    write_sample(path, t["hidden_states"], t["token_ids"], t["loss_mask"], {"verifier": "x"})
    assert "target_ids" not in load_file(str(path))
    with pytest.raises(SpecUIError, match="no targets"):
        read_sample(path, len(AUX))
    calls = []

    def head(h):
        calls.append(h.shape[0])
        return ex.targets(h)

    s = read_sample(path, len(AUX), head)
    # From the bf16-stored tap[N]: the same best token, log-probs within its rounding.
    P = len(samples[0].prompt_ids) - 1
    assert torch.equal(s.target_ids[P:, 0], t["target_ids"][P:, 0]) and calls == [len(samples[0])]
    torch.testing.assert_close(
        s.target_logprobs[P:, 0], t["target_logprobs"][P:, 0], atol=0.05, rtol=0
    )
    again = read_sample(path, len(AUX), head)
    assert torch.equal(again.target_ids, s.target_ids) and len(calls) == 1  # stored, not recomputed


def test_int8_store_is_the_bf16_store_in_under_half_the_bytes(fixture_verifier, samples, tmp_path):
    """The campaign's compact store: aux taps int8 per row, no tap[N], targets kept."""
    bf16 = LocalExtractor(fixture_verifier, AUX, dtype=torch.float32)
    int8 = LocalExtractor(fixture_verifier, AUX, dtype=torch.float32, store="int8")
    a = [read_sample(p, len(AUX)) for p in bf16.extract(samples, tmp_path / "bf16")]
    paths = int8.extract(samples, tmp_path / "int8")
    b = [read_sample(p, len(AUX)) for p in paths]
    H = fixture_verifier.hidden_size
    for sa, sb, s in zip(a, b, samples, strict=True):
        assert torch.equal(sa.input_ids, sb.input_ids) and torch.equal(sa.loss_mask, sb.loss_mask)
        assert torch.equal(sa.target_ids, sb.target_ids)
        finite = sa.target_logprobs.isfinite()
        assert torch.equal(finite, sb.target_logprobs.isfinite())
        torch.testing.assert_close(  # float16 log-probs
            sb.target_logprobs[finite], sa.target_logprobs[finite], atol=1e-2, rtol=1e-3
        )
        # Per row, the int8 error is at most half a step of that row's scale (plus bf16's).
        exact = fixture_verifier.taps(torch.tensor(s.input_ids), AUX)  # [T, n_aux, H]
        step = exact.abs().amax(-1, keepdim=True) / 127
        err = (sb.hidden_states.view_as(exact) - exact).abs()
        assert (err <= 0.5 * step + 1e-6).all()
    t = load_file(str(paths[0]))
    assert t["hidden_states"].dtype == torch.int8 and t["hidden_states"].shape[1] == len(AUX)
    per = bytes_per_token(len(AUX) + 1, H, store="int8")
    assert per < bytes_per_token(len(AUX) + 1, H) / 2
    assert paths[0].stat().st_size <= per * len(samples[0]) + 2048  # + the safetensors header


def test_int8_store_needs_the_targets(fixture_verifier, samples, tmp_path):
    taps = torch.randn(5, len(AUX) + 1, 8)
    ids = torch.arange(5)
    with pytest.raises(SpecUIError, match="needs the targets"):
        write_sample(tmp_path / "x.safetensors", taps, ids, ids, store="int8")
    with pytest.raises(SpecUIError, match="hidden-state store"):
        write_sample(tmp_path / "x.safetensors", taps, ids, ids, store="int4")


def test_extraction_refuses_a_disk_too_small(fixture_verifier, samples, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    store = HiddenStateStore(
        LocalExtractor(fixture_verifier, AUX), samples, "offline", tmp_path / "hidden"
    )
    need = store.bytes_needed(range(len(samples)), fixture_verifier.hidden_size)
    assert need == sum(len(s) for s in samples) * (4 * 64 * 2 + 16 * 12 + 16)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(need, 0, need // 2))
    with pytest.raises(SpecUIError, match="GiB are free"):
        store.check_disk(range(len(samples)), fixture_verifier.hidden_size)
    assert not (tmp_path / "hidden").exists()


def test_online_mode_leaves_nothing_on_disk(fixture_verifier, samples, tmp_path):
    store = HiddenStateStore(
        LocalExtractor(fixture_verifier, AUX), samples, "online", tmp_path / "hidden"
    )
    got = store.get([0, 2])
    assert [g.input_ids.tolist() for g in got] == [samples[0].input_ids, samples[2].input_ids]
    assert not (tmp_path / "hidden").exists() or not any((tmp_path / "hidden").iterdir())


def test_offline_mode_extracts_first_and_then_only_reads(fixture_verifier, samples, tmp_path):
    ex = LocalExtractor(fixture_verifier, AUX)
    store = HiddenStateStore(ex, samples, "offline", tmp_path)
    with pytest.raises(SpecUIError, match="missing"):
        store.get([0])
    store.prepare()
    assert store.missing() == []

    def no_extraction(*a, **k):
        raise AssertionError("extracted although offline files exist")

    ex.extract = no_extraction
    assert store.get([1])[0].input_ids.tolist() == samples[1].input_ids


def test_mixed_mode_extracts_missing_files_once_and_keeps_them(fixture_verifier, samples, tmp_path):
    ex = LocalExtractor(fixture_verifier, AUX)
    store = HiddenStateStore(ex, samples, "mixed", tmp_path)
    store.get([1])
    assert store.missing() == [0, 2]
    calls = []
    real = ex.extract
    ex.extract = lambda s, d: calls.append(len(s)) or real(s, d)
    store.get([0, 1])
    assert calls == [1]  # only sample 0 was missing


def test_cache_file_names_depend_on_verifier_layers_and_tokens(fixture_verifier, samples):
    a, b = LocalExtractor(fixture_verifier, AUX), LocalExtractor(fixture_verifier, [1, 2])
    assert a.file_name(samples[0]) != b.file_name(samples[0])
    assert a.file_name(samples[0]) != a.file_name(samples[1])
    other = TokenSample("other-id", samples[0].prompt_ids, samples[0].response_ids)
    assert a.file_name(samples[0]) == a.file_name(other)  # content-addressed


def test_unknown_extraction_mode_is_an_error(fixture_verifier, samples, tmp_path):
    with pytest.raises(SpecUIError, match="extraction mode"):
        HiddenStateStore(LocalExtractor(fixture_verifier, AUX), samples, "sometimes", tmp_path)
