"""Batch-invariant verification (``specui.verifier.batch_invariant``), bf16, int8, gguf and
gguf-q8: a token gets bit-identical logits whether the verifier sees it alone or inside a block, so
greedy speculation is lossless by construction, and ``auto`` uses bf16 only where
it holds."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specui.algorithms import algorithm_names
from specui.algorithms.resolve import resolve_drafter
from specui.algorithms.simple import PlainDrafter
from specui.data import load_prompts
from specui.engine import generate
from specui.errors import SpecUIError
from specui.verifier import batch_invariant
from specui.verifier.model import Verifier
from tests.support.verifiers import make_tiny_verifier


@pytest.fixture(scope="module", params=["bf16", "int8", "gguf", "gguf-q8"])
def bf16_verifier(request) -> Verifier:
    """The embedded verifier in each batch-invariant precision (the name is the first's)."""
    return Verifier.load("embedded", precision=request.param)


@pytest.fixture(scope="module")
def heldout(bf16_verifier) -> list[list[int]]:
    return [p.encode(bf16_verifier) for p in load_prompts("gsm-symbolic", split="eval", limit=2)]


def test_bf16_keeps_the_residual_stream_and_what_drafters_borrow_in_float32(bf16_verifier):
    v = bf16_verifier
    assert v.precision in ("bf16", "int8", "gguf", "gguf-q8")
    assert v.embed_tokens.weight.dtype == torch.float32 and v.lm_head.weight.dtype == torch.float32
    layer_linears = [m for m in v.model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    weight_dtype = {
        "bf16": torch.bfloat16,
        "int8": torch.int8,
        "gguf": torch.uint8,
        "gguf-q8": torch.uint8,
    }[v.precision]
    assert layer_linears and all(m.weight.dtype == weight_dtype for m in layer_linears)
    # Each layer keeps one copy of its weight (packed for oneDNN or SpecUI's AMX kernel), not the
    # float32 one too.
    if v.precision == "bf16":
        one_copy = [(m.weight_packed is None) != (m.weight_kernel is None) for m in layer_linears]
        assert all(one_copy) and all(
            m.weight.is_meta and m.weight_bf16 is None for m in layer_linears
        )
    else:
        kind = batch_invariant.Int8Linear if v.precision == "int8" else batch_invariant.GGUFLinear
        assert all(m.weight.is_meta and isinstance(m, kind) for m in layer_linears)
        if v.precision.startswith("gguf"):  # the rows each gguf precision multiplies the blocks by
            rows = batch_invariant.GGUF_ROWS[v.precision]
            assert all(m.weight_gguf.packed.rows == rows for m in layer_linears)
    assert not v.lm_head.weight.is_meta  # drafters read the borrowed head
    out = v.forward(torch.tensor([1, 2, 3]), v.new_cache(), aux_layer_ids=[1, v.num_layers])
    assert out.logits.dtype == torch.float32 and out.aux_hidden.dtype == torch.float32
    # Not a rounded-to-bf16 stream: the residual carries float32 detail.
    assert not torch.equal(out.aux_hidden, out.aux_hidden.bfloat16().float())


@pytest.mark.parametrize("block", [2, 5, 9, 17])
def test_a_block_gives_each_token_the_logits_and_taps_it_gets_alone(bf16_verifier, heldout, block):
    v, ids = bf16_verifier, torch.tensor(heldout[0])
    start = len(ids) - block
    layers = list(range(v.num_layers + 1))
    cache = v.new_cache()
    v.forward(ids[:start], cache, logits=False)
    together = v.forward(ids[start:], cache, aux_layer_ids=layers)
    v.crop(cache, start)  # as the engine does after a rejection
    alone = [v.forward(ids[t : t + 1], cache, aux_layer_ids=layers) for t in range(start, len(ids))]
    assert torch.equal(together.logits, torch.cat([a.logits for a in alone]))
    assert torch.equal(together.aux_hidden, torch.cat([a.aux_hidden for a in alone]))


def test_a_float32_verifier_keeps_float32_drafters(embedded_verifier):
    d = resolve_drafter("eagle3", embedded_verifier)
    assert embedded_verifier.precision == "fp32"
    assert not any(isinstance(m, batch_invariant.BF16Linear) for m in d.model.modules())


def test_check_runs_on_a_vocabulary_under_100_tokens():
    v = make_tiny_verifier(vocab_size=8)  # float32 eager attention: a block may round differently
    assert isinstance(batch_invariant.check(v, block=3, context=4), bool)


def test_check_catches_a_verifier_whose_blocks_differ():
    v = Verifier.load("embedded", precision="bf16")
    assert batch_invariant.check(v)
    v.model.set_attn_implementation("sdpa")  # bf16 linears, but attention over the block at once
    assert not batch_invariant.check(v)


@pytest.mark.parametrize("drafter", [*algorithm_names(), "ngram"])
def test_greedy_speculation_in_bf16_is_identical_to_plain_bf16_decoding(
    bf16_verifier, heldout, drafter
):
    d = resolve_drafter(drafter, bf16_verifier)
    if drafter != "ngram":  # beside a bf16 (int8) verifier the drafter's matmuls are bf16
        linears = [m for m in d.model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(isinstance(m, batch_invariant.BF16Linear) for m in linears)
        # and the draft vocabulary's head rows it holds outside its modules (DFlash, DSpark)
        outside = d.model.own_matmuls_outside()
        assert all(isinstance(m, batch_invariant.BF16Linear) for m in outside)
        if getattr(d.model, "d2t", None) is not None and hasattr(d.model, "borrowed"):
            assert outside and d.model.borrowed.lm_head is not bf16_verifier.lm_head
    for ids in heldout:
        plain = generate(bf16_verifier, PlainDrafter(), ids, max_new_tokens=64)
        spec = generate(bf16_verifier, d, ids, max_new_tokens=64)
        assert spec.output_token_ids == plain.output_token_ids
        assert spec.acceptance_length > 1.0  # the drafts were used, not all rejected


def test_auto_verifies_in_float32_where_rowwise_attention_would_be_wrong(tmp_path, fixture_dir):
    folder = tmp_path / "windowed"
    shutil.copytree(fixture_dir / "verifier", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps(
            {**config, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}
        )
    )
    assert Verifier.load(str(folder), precision="auto").precision == "fp32"
    with pytest.raises(SpecUIError, match="sliding-window"):
        Verifier.load(str(folder), precision="bf16")
    with pytest.raises(SpecUIError, match="precision must be one of"):
        Verifier.load(str(folder), precision="fp16")


def test_int8_rows_are_quantized_each_on_its_own_scale():
    x = torch.tensor([[1.0, -2.0, 0.5], [100.0, 3.0, -50.0]])
    q, scale = batch_invariant.quantize_rows(x)
    alone = batch_invariant.quantize_rows(x[:1])
    assert torch.equal(q[:1], alone[0]) and torch.equal(
        scale[:1], alone[1]
    )  # row 0 ignores row 1's range
    assert (
        q.dtype == torch.uint8 and ((q.float() - 128) * scale - x).abs().le(scale / 2 + 1e-6).all()
    )  # rounding error only


def test_int8_is_never_autos_choice_and_stays_close_to_bf16():
    # auto never requantizes: the embedded GGUF in its own blocks (times int8 rows) where
    # SpecUI's kernel runs, else bf16
    from specui import kernels

    assert Verifier.load("embedded", precision="auto").precision == (
        "gguf-q8" if kernels.gguf_available() else "bf16"
    )
    bf16, int8 = (
        Verifier.load("embedded", precision="bf16"),
        Verifier.load("embedded", precision="int8"),
    )
    ids = torch.tensor(load_prompts("gsm-symbolic", split="eval", limit=1)[0].encode(bf16))
    a = bf16.forward(ids, bf16.new_cache()).logits.log_softmax(-1)
    b = int8.forward(ids, int8.new_cache()).logits.log_softmax(-1)
    # Another model's logits, but close: the argmax agrees on most positions.
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8
    assert not torch.equal(a, b)


def test_auto_uses_bf16_for_the_fixture_verifier_and_blocks_match(fixture_dir):
    v = Verifier.load(str(fixture_dir / "verifier"), precision="auto")
    assert (
        v.precision == "bf16"
    )  # this machine's kernels pass check(); a float32 fallback would say fp32
    assert batch_invariant.check(v, block=5, context=7)
