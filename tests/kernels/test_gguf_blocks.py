"""SpecUI's matmul on a GGUF file's own Q8_0 / Q4_0 / Q4_1 blocks (``specui/kernels/gguf.c``) is
within float32 rounding of the float32 product on the dequantized weights, gives a row the same
bits at any row count, and reads the blocks it is given without requantizing them."""

from __future__ import annotations

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType

from specui import kernels
from specui.kernels import checks, packing
from tests.support.kernel_marks import needs_kernel

TYPES = list(packing.GGUF_TYPES)


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_reads_blocks_as_the_gguf_package_does(type_name):
    # The gguf package's own decoder is the independent reference for the block layout.
    raw = packing.random_gguf(7, 96, type_name, torch.Generator().manual_seed(1))
    theirs = gguf.quants.dequantize(raw.numpy(), GGMLQuantizationType[type_name])
    assert torch.equal(packing.dequantize_gguf(raw, type_name, 96), torch.from_numpy(theirs))


@needs_kernel
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("k, n", [(32, 16), (576, 37), (1536, 48), (96, 5)])
def test_the_kernel_is_float32_rounding_of_the_dequantized_product_at_every_row_count(
    type_name, k, n
):
    gen = torch.Generator().manual_seed(k + n)
    raw = packing.random_gguf(n, k, type_name, gen)
    w, exact_w = (
        packing.pack_gguf(raw, type_name, k),
        packing.dequantize_gguf(raw, type_name, k),
    )
    kernel = kernels.load()
    x = torch.randn(40, k, generator=gen) * torch.rand(1, k, generator=gen) * 4  # uneven channels
    whole = kernel.gguf_matmul(x, w)
    assert checks.gguf_error(whole, x, exact_w) <= checks.GGUF_RTOL
    ref = x @ exact_w.T
    assert torch.allclose(whole, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    for rows in (1, 2, 5, 9, 12, 13, 17, 25, 40):  # past a pass's 12 rows the kernel passes again
        assert torch.equal(kernel.gguf_matmul(x[:rows], w), whole[:rows]), rows
    assert torch.equal(kernel.gguf_matmul(x[20:21], w), whole[20:21])  # a row alone, from mid-block


@needs_kernel
@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_the_integer_q4_path_keeps_hard_rows_within_its_bound(type_name):
    """Q4 blocks meet each row as three int8 pieces of its float32 block (specui_gguf_matmul):
    an outlier beside small inputs, a zero block, tiny and huge magnitudes, and ties all stay
    within 2^-21 of a block's largest input, alone or in a block; inf and NaN carry through."""
    k, n = 128, 32
    gen = torch.Generator().manual_seed(7)
    raw = packing.random_gguf(n, k, type_name, gen)
    w, exact_w = (
        packing.pack_gguf(raw, type_name, k),
        packing.dequantize_gguf(raw, type_name, k),
    )
    x = torch.randn(8, k, generator=gen)
    x[0, 5] = 300.0  # one outlier: the other 31 inputs of its block get the coarse step
    x[1, :32] = 0.0  # a zero block
    x[2] *= 1e-30  # tiny (the step is 2^-106: x / s overflows if taken in one multiply)
    x[3] *= 1e30  # huge
    x[4] = torch.arange(k) * 0.5 - 32  # ties: halves of a unit round to even
    x[5, 40] = 127 / 64  # the block's max exactly 127 steps
    got = kernels.gguf_matmul(x[:6], w)
    for r in range(6):
        blocks = x[r].abs().reshape(-1, 32).amax(-1).repeat_interleave(32)
        bound = (blocks.double() * 2.0**-21) @ exact_w.double().abs().T  # per output
        err = (got[r].double() - x[r].double() @ exact_w.double().T).abs()
        assert (err <= bound + 1e-6 * (x[r].double().abs() @ exact_w.double().abs().T)).all(), r
        assert torch.equal(kernels.gguf_matmul(x[r : r + 1], w), got[r : r + 1]), r
    x[6, 3], x[7, 70] = float("inf"), float("nan")
    special = kernels.gguf_matmul(x[6:8], w)
    assert not torch.isfinite(special).any()
    assert torch.equal(kernels.gguf_matmul(x[:6], w), got)  # the rows beside them unchanged


@needs_kernel
def test_a_wrong_scale_or_value_shows_in_the_product():
    # The packed copy holds the file's own values: changing one byte of the file changes the output.
    gen = torch.Generator().manual_seed(3)
    raw = packing.random_gguf(16, 64, "Q4_1", gen)
    x = torch.randn(1, 64, generator=gen)
    base = kernels.gguf_matmul(x, packing.pack_gguf(raw, "Q4_1", 64))
    for byte in (0, 2, 4, 19, 20 + 7):  # d, m, first and last nibble byte of block 0, block 1
        changed = raw.clone()
        changed[5, byte] ^= 0x11
        out = kernels.gguf_matmul(x, packing.pack_gguf(changed, "Q4_1", 64))
        assert not torch.equal(out[0, 5], base[0, 5]) and torch.equal(out[0, :5], base[0, :5]), byte


def test_packing_keeps_the_files_bytes_and_fuses_whole_tiles():
    gen = torch.Generator().manual_seed(4)
    for type_name in TYPES:
        raw = packing.random_gguf(48, 64, type_name, gen)
        packed = packing.pack_gguf(raw, type_name, 64)
        assert packed.data.numel() == raw.numel()  # same bytes a weight: moved, not requantized
        assert sorted(packed.data.tolist()) == sorted(raw.view(-1).tolist())
    a, b = (
        packing.pack_gguf(packing.random_gguf(n, 64, "Q8_0", gen), "Q8_0", 64) for n in (32, 16)
    )
    assert packing.cat_gguf([a, b]).out_features == 48
    odd = packing.pack_gguf(packing.random_gguf(20, 64, "Q8_0", gen), "Q8_0", 64)
    assert packing.cat_gguf([a, odd]) is None  # 20 channels end in a padded tile
    with pytest.raises(ValueError, match="Q4_K"):
        packing.pack_gguf(raw, "Q4_K", 64)


@needs_kernel
def test_the_kernel_refuses_rows_it_cannot_read():
    w = packing.pack_gguf(packing.random_gguf(16, 64, "Q4_0", torch.Generator()), "Q4_0", 64)
    with pytest.raises(ValueError, match="float32 rows of 64"):
        kernels.gguf_matmul(torch.zeros(2, 64, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="float32 rows of 64"):
        kernels.gguf_matmul(torch.zeros(2, 32), w)


# --- int8 rows (gguf_q8.c, the gguf-q8 precision) ----------------------------------------------


@needs_kernel
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("k, n", [(32, 16), (576, 37), (1536, 48), (96, 5)])
def test_int8_rows_are_the_exact_integer_product_at_every_row_count(type_name, k, n):
    gen = torch.Generator().manual_seed(7 * k + n)
    raw = packing.random_gguf(n, k, type_name, gen)
    w = packing.pack_gguf(raw, type_name, k, rows="int8")
    assert w.type_id == packing.GGUF_TYPES[type_name] | packing.GGUF_INT8_ROWS
    kernel = kernels.load()
    x = torch.randn(40, k, generator=gen) * torch.rand(1, k, generator=gen) * 4
    whole = kernel.gguf_matmul(x, w)
    # Its own arithmetic exactly (int8 rows, exact int32 block sums), to float32 rounding ...
    exact = packing.int8_rows_product(x, raw, type_name, k)
    scale = x.double().abs() @ packing.dequantize_gguf(raw, type_name, k).double().abs().T
    assert ((whole.double() - exact).abs() / scale).max() <= checks.GGUF_RTOL
    # ... which is llama.cpp's int8-row model of the float product: each input within half a
    # step (dx / 2) of its block's int8 value, so the product within sum |w| dx / 2 of float's.
    _, dx = packing.int8_rows(x)
    half_step = (dx / 2).repeat_interleave(32, dim=1).double()
    bound = half_step @ packing.dequantize_gguf(raw, type_name, k).double().abs().T
    float_product = x.double() @ packing.dequantize_gguf(raw, type_name, k).double().T
    assert ((whole.double() - float_product).abs() <= bound + 1e-4 * scale).all()
    for rows in (1, 2, 5, 9, 12, 13, 17, 25, 40):  # a row's bits at any row count
        assert torch.equal(kernel.gguf_matmul(x[:rows], w), whole[:rows]), rows
    assert torch.equal(kernel.gguf_matmul(x[20:21], w), whole[20:21])


def test_int8_rows_round_each_block_on_its_own_scale():
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 2] = 2.54, 1.27, 0.01  # block 0: scale 0.02
    x[0, 32] = -1000.0  # block 1: a large scale must not touch block 0
    q, dx = packing.int8_rows(x)
    assert torch.allclose(dx, torch.tensor([[0.02, 1000 / 127]]))
    assert q[0, :3].tolist() == [127.0, 64.0, 0.0]  # 63.5 -> 64 (ties to even)
    assert q[0, 32].item() == -127.0 and q[0, 33:].abs().sum() == 0


@needs_kernel
def test_int8_rows_carry_a_nan_or_inf_into_their_outputs():
    gen = torch.Generator().manual_seed(3)
    for type_name in TYPES:
        raw = packing.random_gguf(16, 64, type_name, gen)
        w = packing.pack_gguf(raw, type_name, 64, rows="int8")
        x = torch.randn(3, 64, generator=gen)
        x[1, 5] = float("nan")
        x[2, 40] = float("inf")
        out = kernels.load().gguf_matmul(x, w)
        assert torch.isfinite(out[0]).all()
        assert out[1].isnan().all() and not torch.isfinite(out[2]).any(), type_name


def test_int8_rows_pack_q8_0_values_plus_128_four_inputs_a_lane():
    raw = packing.random_gguf(16, 32, "Q8_0", torch.Generator().manual_seed(5))
    w = packing.pack_gguf(raw, "Q8_0", 32, rows="int8")
    values = raw[:, 2:].contiguous().view(torch.int8)  # [16 channels, 32 inputs]
    packed = w.data[32:].view(8, 16, 4)  # [group, channel, input in group]
    for g in range(8):
        for c in (0, 7, 15):
            expect = (values[c, 4 * g : 4 * g + 4].to(torch.int16) + 128).to(torch.uint8)
            assert torch.equal(packed[g, c], expect)
    assert torch.equal(w.data[:32], raw[:, :2].reshape(-1))  # the 16 fp16 scales first
    with pytest.raises(ValueError, match="rows must be"):
        packing.pack_gguf(raw, "Q8_0", 32, rows="int4")
    fused = packing.cat_gguf([w, packing.pack_gguf(raw, "Q8_0", 32)])
    assert fused is None  # float-row and int8-row layouts never fuse


def test_q8_0_quantization_gives_the_gguf_packages_bytes():
    # The gguf package's own quantizer is the independent reference (llama.cpp's Q8_0).
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(9, 96, generator=gen) * torch.rand(9, 1, generator=gen) * 3
    w[2, :32] = 0  # an all-zero block: scale 0, values 0
    ours = packing.quantize_q8_0(w)
    theirs = gguf.quants.quantize(w.numpy(), GGMLQuantizationType.Q8_0)
    assert torch.equal(ours, torch.from_numpy(theirs).view(torch.uint8).reshape(9, -1))
    back = packing.dequantize_gguf(ours, "Q8_0", 96)
    step = w.abs().reshape(9, 3, 32).amax(-1).repeat_interleave(32, dim=1) / 127
    # Half a step, plus the fp16 scale's rounding (2^-11 relative) times up to 127 steps.
    assert ((back - w).abs() <= step * (0.5 + 127 * 2**-11) + 1e-6).all()
    with pytest.raises(ValueError, match="blocks of 32"):
        packing.quantize_q8_0(torch.zeros(2, 40))
