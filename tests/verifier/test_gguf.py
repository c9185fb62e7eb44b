"""The ``gguf`` verifier precision: a GGUF file's own blocks replace the model's linears, its
layers run in one C call within float32 rounding of the torch ops, and what it cannot read is
refused with a message that says what to do instead (the matmul itself:
``tests/kernels/test_gguf_blocks.py``)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from specui import kernels
from specui.errors import SpecUIError
from specui.verifier import batch_invariant
from specui.verifier.gguf_weights import llama_rows, read_blocks
from tests.support.kernel_marks import needs_kernel


def test_switched_off_the_gguf_precision_says_why(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("SPECUI_CPU_KERNELS", "0")
    assert not kernels.gguf_available()
    from transformers import LlamaConfig

    reason = batch_invariant.unsupported_reason(LlamaConfig(), "gguf")
    assert reason is not None and "SPECUI_CPU_KERNELS=0" in reason


# --- a GGUF file of a small Llama, written here -----------------------------------------------


# A two-layer model of each family, small enough to write to a GGUF file in a test.
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
TINY.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
TINY.update(max_position_embeddings=128, tie_word_embeddings=True)
FAMILY_CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}


def _tiny(family: str = "llama", perturbed: bool = True):
    """A float32 model of ``family``; ``perturbed``: its biases (Qwen2's q/k/v) and norm weights
    moved away from their init values, so a kernel that skips one is caught."""
    import transformers

    torch.manual_seed(0)
    name = FAMILY_CLASSES[family]
    cfg = getattr(transformers, f"{name}Config")(**TINY)
    model = getattr(transformers, f"{name}ForCausalLM")(cfg).float().eval()
    if perturbed:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
    return model


def _tiny_llama():
    return _tiny("llama", perturbed=False)


def _write_gguf(model, path: Path, kinds: dict[str, str]) -> None:
    """``model``'s linear weights into a GGUF file as llama.cpp's converter lays them out (q and k
    rows permuted), quantized by the gguf package; ``model`` gets the dequantized values, as
    transformers' load of that file would give it."""
    from specui.verifier.gguf_weights import LAYER_TENSORS

    writer = gguf.GGUFWriter(str(path), "llama")
    cfg = model.config
    named = {
        f"blk.{i}.{short}.weight": model.get_submodule(f"model.layers.{i}.{name}")
        for i in range(cfg.num_hidden_layers)
        for short, name in LAYER_TENSORS.items()
    }
    named["token_embd.weight"] = model.get_input_embeddings()
    for tensor_name, module in named.items():
        kind = kinds.get(tensor_name.split(".")[-2], "Q8_0")
        w = module.weight.detach().float().numpy()
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(
            tensor_name.split(".")[-2]
        )
        file_rows = w if heads is None else w[np.argsort(llama_rows(w.shape[0], heads).numpy())]
        qtype = GGMLQuantizationType[kind]
        data = gguf.quants.quantize(file_rows, qtype)
        back = gguf.quants.dequantize(data, qtype).reshape(w.shape)
        if heads is not None:
            back = back[llama_rows(w.shape[0], heads).numpy()]
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(np.ascontiguousarray(back)))
        writer.add_tensor(tensor_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@needs_kernel
def test_a_gguf_files_blocks_replace_the_models_linears_and_compute_its_float32_logits(tmp_path):
    model = _tiny_llama()
    path = tmp_path / "tiny.gguf"
    _write_gguf(
        model, path, {"attn_q": "Q4_1", "attn_k": "Q4_0", "ffn_down": "Q4_1", "ffn_up": "Q4_0"}
    )
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        want = model(ids).logits[0]
    blocks = read_blocks(path, model)
    assert {b.type for b in blocks.values()} == {"Q4_0", "Q4_1", "Q8_0"} and "lm_head" in blocks
    batch_invariant.enable(model, "gguf", gguf=path)
    assert all(isinstance(model.get_submodule(n), batch_invariant.GGUFLinear) for n in blocks)
    assert model.get_input_embeddings().weight.dtype == torch.float32  # drafters borrow it
    with torch.no_grad():
        got = model(ids).logits[0]
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    assert not torch.equal(got, want)  # its own sums, not a float32 matmul's


@needs_kernel
# qwen2: q/k/v biases; qwen3: per-head q/k norms
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_the_one_call_gguf_layers_compute_the_torch_ops_within_float32_rounding(tmp_path, family):
    from specui.verifier.decoder import FastDecoder

    model = _tiny(family)
    path = tmp_path / "tiny.gguf"
    # Q4_1 and Q4_0 blocks in one file, fused where the parts share a type
    kinds = {"attn_q": "Q4_1", "attn_k": "Q4_1", "attn_v": "Q4_1", "ffn_down": "Q4_1"}
    _write_gguf(model, path, {**kinds, "ffn_gate": "Q4_0", "ffn_up": "Q4_0"})
    batch_invariant.enable(model, "gguf", gguf=path)
    fast = FastDecoder(model)
    assert fast.gguf_layers is not None  # every layer fused: one C call a step
    ids = torch.randint(3, 96, (30,), generator=torch.Generator().manual_seed(2))
    taps = {0, 1, 2}

    def steps(one_call: bool):
        saved = fast.gguf_layers
        fast.gguf_layers = saved if one_call else None
        cache = fast.new_cache()
        outs = [fast.forward(ids[:20], cache, taps)]  # rows <= 64: through the call when on
        outs.append(fast.forward(ids[20:29], cache, taps))  # a verify block
        cache.crop(23)
        outs.append(fast.forward(ids[23:24], cache, taps))
        fast.gguf_layers = saved
        return outs, cache

    (got, got_cache), (want, want_cache) = steps(True), steps(False)
    for (g, g_taps), (w, w_taps) in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())
        assert not torch.equal(g, w)  # its own sums, not the torch ops'
        for t in taps:
            assert torch.allclose(
                g_taps[t], w_taps[t], rtol=1e-4, atol=1e-4 * w_taps[t].abs().max().item()
            )
    n = got_cache.length
    assert torch.allclose(
        got_cache.data[..., :n, :], want_cache.data[..., :n, :], rtol=1e-4, atol=1e-5
    )
    # A verify block through the call gives each row the bits it gets alone.
    cache = fast.new_cache()
    fast.forward(ids[:20], cache, taps)
    block, block_taps = fast.forward(ids[20:29], cache, taps)
    cache.crop(20)
    alone = [fast.forward(ids[t : t + 1], cache, taps) for t in range(20, 29)]
    assert torch.equal(block, torch.cat([a[0] for a in alone]))
    assert torch.equal(block_taps[2], torch.cat([a[1][2] for a in alone]))


def test_a_type_the_kernel_cannot_read_is_named_with_the_precisions_that_load_it(tmp_path):
    model = _tiny_llama()
    path = tmp_path / "f16.gguf"
    _write_gguf(model, path, {"ffn_gate": "F16", "attn_v": "BF16"})
    with pytest.raises(
        SpecUIError, match=r"BF16, F16 tensors .*Q4_0, Q4_1, Q8_0.*--precision fp32, bf16 or int8"
    ):
        read_blocks(path, model)
    assert type(model.model.layers[0].mlp.gate_proj) is torch.nn.Linear  # nothing changed


def test_a_file_that_is_not_the_models_is_refused(tmp_path):
    model = _tiny_llama()
    path = tmp_path / "tiny.gguf"
    _write_gguf(model, path, {})
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.mul_(2)
    with pytest.raises(SpecUIError, match=r"blk\.1\.attn_output\.weight does not hold the weights"):
        read_blocks(path, model)


def test_the_gguf_precision_needs_a_gguf_verifier(fixture_dir):
    from specui.verifier.model import Verifier

    with pytest.raises(SpecUIError, match="gguf precision keeps a GGUF file's own blocks"):
        Verifier.load(str(fixture_dir / "verifier"), precision="gguf")


# --- the embedded verifier ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_verifier():
    from specui.verifier.model import Verifier

    return Verifier.load("embedded", precision="gguf")


@needs_kernel
@pytest.mark.slow
def test_the_embedded_verifier_runs_its_own_blocks_through_the_fast_decoder(gguf_verifier):
    v = gguf_verifier
    assert v.precision == "gguf" and v._fast is not None
    layer = v.model.model.layers[0]
    assert (
        layer.self_attn.q_proj.weight_gguf.packed.type == "Q4_1"
        and v.lm_head.weight_gguf.packed.type == "Q8_0"
    )
    assert layer.self_attn.qkv_gguf.out_features == 576 + 2 * 192  # fused, one call
    assert (
        layer.mlp.down_proj.weight.is_meta and not v.lm_head.weight.is_meta
    )  # drafters borrow the head
    assert batch_invariant.check(v, block=9) and batch_invariant.check(v, block=17)


@needs_kernel
@pytest.mark.slow
def test_gguf_is_within_float32_rounding_of_the_fp32_verifier(gguf_verifier, embedded_verifier):
    from specui.data import load_prompts

    ids = torch.tensor(
        load_prompts("gsm-symbolic", split="eval", limit=1)[0].encode(embedded_verifier)
    )
    a = gguf_verifier.forward(ids, gguf_verifier.new_cache(), aux_layer_ids=[30]).logits
    b = embedded_verifier.forward(ids, embedded_verifier.new_cache(), aux_layer_ids=[30]).logits
    assert (a - b).abs().max() <= 1e-4 * b.abs().max()
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.slow
def test_auto_falls_back_to_bf16_and_gguf_says_why_where_the_kernels_are_off(monkeypatch):
    from specui.verifier.model import Verifier

    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("SPECUI_CPU_KERNELS", "0")
    with pytest.raises(SpecUIError, match=r"cannot verify .* in gguf: .*SPECUI_CPU_KERNELS=0"):
        Verifier.load("embedded", precision="gguf")
    assert Verifier.load("embedded", precision="auto").precision == "bf16"


# Greedy speculation in gguf against plain gguf decoding, every drafter, and a block against its
# tokens alone: tests/verifier/test_batch_invariant.py (its verifier fixture runs each precision).
