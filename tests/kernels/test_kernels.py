"""``specui.kernels``: the int8 verifier's own matmul returns oneDNN's bits, attention and the
bf16 matmul give a row the same bits in any block, the library is built (again where a cached one
is broken), and the kernels fall back clearly."""

from __future__ import annotations

import pytest
import torch

from specui import kernels
from specui.kernels import build, checks, packing
from specui.kernels.packing import Int8Weight
from tests.support.kernel_marks import needs_kernel, runnable


def _weight(
    n: int, k: int, gen: torch.Generator, bias: bool = False
) -> tuple[torch.Tensor, Int8Weight, Int8Weight]:
    """int8 weights, as the verifier packs them, and packed for oneDNN alone (the reference)."""
    wq = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(n, generator=gen) / 50 + 1e-5
    b = torch.randn(n, generator=gen) if bias else None
    return wq, kernels.int8_weight(wq, scale, b), packing.onednn_int8_weight(wq, scale, b)


@needs_kernel
def test_the_kernel_is_built_and_used_where_the_cpu_and_a_compiler_allow():
    assert kernels.load() is not None, kernels.status()
    assert kernels.status().startswith("specui kernels")


@needs_kernel
@pytest.mark.parametrize(
    "k, n", [(576, 960), (1536, 576), (576, 49), (130, 33), (67, 16), (5, 7), (3000, 40)]
)
def test_the_kernel_returns_onednns_bits_for_every_row_count(k, n):
    gen = torch.Generator().manual_seed(k * 1000 + n)
    wq, w, ref = _weight(n, k, gen)
    kernel = kernels.load()
    layouts = [packing.pack(wq, amx=False)]  # AVX512-VNNI's, and AMX's where it runs
    if kernels.amx_available():
        layouts.append(packing.pack(wq, amx=True))
    for rows in (
        1,
        2,
        3,
        8,
        9,
        12,
        13,
        16,
        17,
        25,
        33,
        40,
    ):  # past a pass's rows the kernels pass again
        q = torch.randint(0, 256, (rows, k), generator=gen, dtype=torch.uint8)
        want = packing.onednn_matmul(q, ref)
        for packed in layouts:
            assert torch.equal(kernel.matmul(q, packed, w.scale), want), (
                rows,
                k,
                n,
                packed.sums is not None,
            )
        assert torch.equal(kernels.matmul(q, w), want), (
            rows,
            k,
            n,
        )  # the dispatch, both sides of max_rows


@needs_kernel
def test_extreme_activations_and_weights_sum_exactly():
    # All-255 rows (x = +127) against all-127 weights: the largest sums the kernel's int32 holds.
    k, n = 1536, 48
    wq = torch.full((n, k), 127, dtype=torch.int8)
    wq[::2] = -127
    ref = packing.onednn_int8_weight(wq, torch.ones(n))
    layouts = [packing.pack(wq, amx=False)] + (
        [packing.pack(wq, amx=True)] if kernels.amx_available() else []
    )
    for value in (0, 1, 255):
        q = torch.full((3, k), value, dtype=torch.uint8)
        for packed in layouts:
            got = kernels.load().matmul(q, packed, ref.scale)
            assert torch.equal(got, packing.onednn_matmul(q, ref))
            expect = float((value - 128) * 127 * k)
            assert got[0, 1].item() == expect and got[0, 0].item() == -expect


@needs_kernel
@pytest.mark.slow
def test_the_verifiers_own_int8_weights_give_onednns_bits():
    # The embedded verifier's real weights and real activations, not random ones.
    from specui.verifier.batch_invariant import int8_weight, quantize_rows
    from specui.verifier.model import Verifier

    v = Verifier.load("embedded", precision="fp32")
    layer = v.model.model.layers[3]
    text = (
        "A train leaves at 3 pm at 60 km/h; a second one follows an hour later. When does it"
        " catch up?"
    )
    ids = torch.tensor(v.tokenizer(text)["input_ids"])
    hidden = v.model.model.embed_tokens(ids).detach()
    for linears, x in (
        ([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], hidden),
        ([layer.mlp.down_proj], torch.randn(len(ids), layer.mlp.down_proj.in_features)),
    ):
        w = int8_weight(linears)
        assert w.kernel is not None
        wq = (
            torch.round(torch.cat([m.weight.detach() for m in linears]) / w.scale[:, None])
            .clamp(-127, 127)
            .to(torch.int8)
        )
        onednn = packing.onednn_int8_weight(wq, w.scale)
        for rows in (1, 9, len(ids)):
            q, _ = quantize_rows(x[:rows].float())
            assert torch.equal(kernels.matmul(q, w), packing.onednn_matmul(q, onednn)), rows


def test_no_compiler_is_a_clear_error_and_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="no C compiler"):
        build.build(tmp_path / "k", cc="/nonexistent/cc")
    with pytest.raises(RuntimeError, match="could not build"):
        build.build(tmp_path / "k", cc="false")  # runs, builds nothing
    assert not any((tmp_path / "k").glob("*")) if (tmp_path / "k").exists() else True


@needs_kernel
def test_a_truncated_cached_library_is_built_again(tmp_path):
    library = build.build(tmp_path)
    library.write_bytes(library.read_bytes()[:100])
    kernel = checks.open_kernel(tmp_path)
    gen = torch.Generator().manual_seed(1)
    _, w, ref = _weight(40, 64, gen)
    q = torch.randint(0, 256, (2, 64), generator=gen, dtype=torch.uint8)
    assert torch.equal(kernel.matmul(q, w.kernel, w.scale), packing.onednn_matmul(q, ref))


def test_switched_off_it_says_so_and_packs_nothing(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("SPECUI_CPU_KERNELS", "0")
    assert kernels.load() is None
    assert kernels.status() == "oneDNN u8s8 and SDPA rows (SPECUI_CPU_KERNELS=0)"
    gen = torch.Generator().manual_seed(2)
    wq, w, _ = _weight(20, 70, gen, bias=True)
    assert w.kernel is None and w.onednn is not None
    q = torch.randint(0, 256, (4, 70), generator=gen, dtype=torch.uint8)
    assert torch.equal(kernels.matmul(q, w), packing.onednn_matmul(q, w))


@needs_kernel
def test_a_first_load_under_autocast_keeps_the_kernels(monkeypatch):
    """The self-checks compare with float32 torch; an extraction's bf16 autocast around the
    process's first load once failed them and turned the kernels off for the whole process."""
    monkeypatch.setattr(kernels, "_state", {})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.load() is not None, kernels.status()


def test_rows_of_the_wrong_shape_are_refused():
    if not runnable():
        pytest.skip("no kernel here")
    gen = torch.Generator().manual_seed(3)
    _, w, _ = _weight(16, 64, gen)
    with pytest.raises(ValueError, match="64 inputs"):
        kernels.load().matmul(torch.zeros(2, 63, dtype=torch.uint8), w.kernel, w.scale)
    with pytest.raises(ValueError, match="uint8"):
        kernels.load().matmul(torch.zeros(2, 64), w.kernel, w.scale)


@needs_kernel
@pytest.mark.parametrize("heads, kv_heads, d", [(9, 3, 64), (4, 4, 16), (8, 2, 128)])
def test_attention_gives_a_row_the_same_bits_in_any_block_and_stays_near_sdpa(heads, kv_heads, d):
    gen = torch.Generator().manual_seed(heads * d)
    kernel = kernels.load()
    buffer = torch.randn(2, kv_heads, 400, d, generator=gen) * 3  # a KV buffer with room to spare
    keys, values = buffer[0], buffer[1]
    for start in (0, 1, 15, 16, 17, 255, 300):
        q = torch.randn(9, heads, d, generator=gen) * 2
        block = kernel.attention(q, keys, values, start, d**-0.5)
        for r in range(9):  # alone, and as row 0 or 2 of other blocks
            assert torch.equal(
                kernel.attention(q[r : r + 1], keys, values, start + r, d**-0.5), block[r : r + 1]
            )
        assert torch.equal(kernel.attention(q[2:5], keys, values, start + 2, d**-0.5), block[2:5])
        # a block longer than the kernel's parts of 16 rows: row 30 gets the bits it gets alone
        many = torch.randn(40, heads, d, generator=gen)
        if start + 40 <= keys.shape[1]:
            long_block = kernel.attention(many, keys, values, start, d**-0.5)
            alone = kernel.attention(many[30:31], keys, values, start + 30, d**-0.5)
            assert torch.equal(long_block[30:31], alone)
            assert torch.equal(
                kernel.attention(many[16:20], keys, values, start + 16, d**-0.5), long_block[16:20]
            )
        sdpa = torch.cat(
            [
                torch.nn.functional.scaled_dot_product_attention(
                    q[r].view(1, heads, 1, d),
                    keys[None, :, : start + r + 1],
                    values[None, :, : start + r + 1],
                    scale=d**-0.5,
                    enable_gqa=True,
                )[0, :, 0].reshape(1, -1)
                for r in range(9)
            ]
        )
        torch.testing.assert_close(block, sdpa, atol=2e-5, rtol=1e-4)


@needs_kernel
def test_attention_refuses_what_it_cannot_read():
    kernel = kernels.load()
    keys = torch.randn(2, 10, 16)
    with pytest.raises(ValueError, match="keys"):
        kernel.attention(torch.randn(3, 4, 16), keys, keys, 8, 0.25)  # 8 + 3 > 10 keys
    with pytest.raises(ValueError, match="head size"):
        kernel.attention(
            torch.randn(1, 4, 12), torch.randn(2, 10, 12), torch.randn(2, 10, 12), 0, 0.25
        )
    assert not kernels.attention_supported(4, 2, 12) and not kernels.attention_supported(6, 4, 64)


needs_amx = pytest.mark.skipif(
    not (runnable() and {"amx_tile", "amx_bf16"} <= build.cpu_flags()), reason="no AMX here"
)


@needs_amx
@pytest.mark.parametrize("k, n", [(576, 960), (1536, 576), (131, 37), (33, 16), (7, 5)])
def test_the_bf16_matmul_sums_a_row_alike_at_any_row_count(k, n):
    assert kernels.amx_available(), kernels.status()
    gen = torch.Generator().manual_seed(k + n)
    w, bias = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen)
    packed = packing.pack_bf16(w)
    x = torch.randn(33, k, generator=gen).bfloat16()  # three passes of 16 rows
    block = kernels.bf16_matmul(x, packed, bias)
    for rows in (1, 2, 9, 16, 17):
        assert torch.equal(kernels.bf16_matmul(x[:rows], packed, bias), block[:rows])
    assert torch.equal(kernels.bf16_matmul(x[20:21], packed, None) + bias, block[20:21])
    exact = (x.double() @ w.double().T + bias.double()).float()
    torch.testing.assert_close(
        block, exact, atol=1e-4, rtol=1e-4
    )  # float32 sums of exact bf16 products


@needs_amx
def test_onednn_computes_the_same_after_the_kernel_used_the_tiles():
    # oneDNN keeps its AMX tile configuration per thread: the kernel must put it back.
    w = torch.randn(576, 576).bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 2)
    x = torch.randn(300, 576).bfloat16()  # a prefill-sized product: oneDNN's AMX kernel
    before = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    kernels.bf16_matmul(x[:3], packing.pack_bf16(w), None)
    assert torch.equal(torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), before)


@pytest.mark.skipif(
    not (runnable() and kernels.bf16_kernel_available()), reason="no bf16 kernel here"
)
@pytest.mark.parametrize("type_name", ["bf16", *packing.GGUF_TYPES])
def test_the_weight_prefetch_changes_no_bit(type_name):
    """Prefetching weights ahead (passes of 4+ rows) only moves time: the same bits with it off,
    on, and far ahead, at row counts below and above the passes that prefetch."""
    kernel = kernels.load()
    gen = torch.Generator().manual_seed(7)
    k, n = 576, 1000  # weights several times the distance ahead, and a partial last tile
    x = torch.randn(13, k, generator=gen)
    if type_name == "bf16":
        packed = packing.pack_bf16(torch.randn(n, k, generator=gen).bfloat16())
        bias = torch.randn(n, generator=gen)

        def product(rows: int) -> torch.Tensor:
            return kernel.bf16_matmul(x[:rows].bfloat16(), packed, bias)
    else:
        w = packing.pack_gguf(packing.random_gguf(n, k, type_name, gen), type_name, k)

        def product(rows: int) -> torch.Tensor:
            return kernel.gguf_matmul(x[:rows], w)

    default = kernel.set_prefetch_ahead(0)
    try:
        off = {rows: product(rows) for rows in (1, 3, 4, 9, 13)}
        for ahead in (default, 1 << 20):
            assert kernel.set_prefetch_ahead(ahead) in (0, default)
            for rows, want in off.items():
                assert torch.equal(product(rows), want), (ahead, rows)
    finally:
        kernel.set_prefetch_ahead(default)
    assert default > 0  # on by default
