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
from tests.support.kernels import needs_kernel

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
