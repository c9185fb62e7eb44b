"""The kernels' checks at load: a library is used only where it returns oneDNN's bits for the
int8 matmul, gives a row the same bits alone as in a block (bf16, gguf, attention), and stays
within float32 rounding of the exact product (bf16, gguf) or of SDPA (attention)."""

from __future__ import annotations

from pathlib import Path

import torch

from specui.kernels.build import build
from specui.kernels.library import Kernel
from specui.kernels.packing import (
    GGUF_TYPES,
    MAX_ROWS,
    TILE,
    dequantize_gguf,
    int8_rows_product,
    onednn_int8_weight,
    onednn_matmul,
    pack,
    pack_bf16,
    pack_gguf,
    random_gguf,
)

GGUF_MAX_ROWS = (
    12  # rows per pass of the gguf matmul (any row count runs; the self-check spans two passes)
)


def self_check(kernel: Kernel) -> str | None:
    """None if the kernel returns oneDNN's bits on random operands (tails included), else why
    not."""
    gen = torch.Generator().manual_seed(0)
    for k, n, rows in ((576, 40, 1), (130, 33, 5), (67, 100, MAX_ROWS), (64, 20, 40)):
        wq = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        scale = torch.rand(n, generator=gen) / 100 + 1e-4
        q = torch.randint(0, 256, (rows, k), generator=gen, dtype=torch.uint8)
        onednn = onednn_int8_weight(wq, scale)
        for amx in (False, True) if kernel.amx_reason is None else (False,):
            if not torch.equal(kernel.matmul(q, pack(wq, amx), scale), onednn_matmul(q, onednn)):
                return (
                    f"its {'AMX ' if amx else ''}{rows}x{k} by {k}x{n} int8 product differs"
                    " from oneDNN's"
                )
    if kernel.amx_reason is None or kernel.avx512_bf16:
        w = torch.randn(37, 131, generator=gen).bfloat16()
        x = torch.randn(TILE + 3, 131, generator=gen).bfloat16()
        bias = torch.randn(37, generator=gen)
        block = kernel.bf16_matmul(x, pack_bf16(w), bias)
        if not torch.equal(
            block,
            torch.cat(
                [kernel.bf16_matmul(x[r : r + 1], pack_bf16(w), bias) for r in range(len(x))]
            ),
        ):
            return "its bf16 product of a block differs from the same rows alone"
        exact = (x.double() @ w.double().T + bias.double()).float()
        if not torch.allclose(block, exact, atol=1e-4, rtol=1e-4):
            return (
                f"its bf16 product is {(block - exact).abs().max().item():.1e} from the exact one"
            )
    reason = _gguf_self_check(kernel, gen)
    if reason is not None:
        return reason
    heads, kv_heads, d, start, rows = 6, 2, 32, 21, 5
    keys, values = (torch.randn(kv_heads, 40, d, generator=gen) for _ in range(2))
    q = torch.randn(rows, heads, d, generator=gen)
    block = kernel.attention(q, keys, values, start, 0.2)
    alone = torch.cat(
        [kernel.attention(q[r : r + 1], keys, values, start + r, 0.2) for r in range(rows)]
    )
    if not torch.equal(block, alone):
        return "its attention of a block differs from the same rows alone"
    expect = torch.cat(
        [
            torch.nn.functional.scaled_dot_product_attention(
                q[r].view(1, heads, 1, d),
                keys[None, :, : start + r + 1],
                values[None, :, : start + r + 1],
                scale=0.2,
                enable_gqa=True,
            )[0, :, 0].reshape(1, -1)
            for r in range(rows)
        ]
    )
    if not torch.allclose(block, expect, atol=1e-5, rtol=1e-4):
        return f"its attention is {(block - expect).abs().max().item():.1e} from SDPA's"
    return None


# The gguf matmul against float32 on the dequantized weights (relative to the sum of |terms|).
GGUF_RTOL = 1e-4


def gguf_error(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """The largest ``|got - x w^T| / (|x| |w|^T)`` over the outputs, against a float64 product:
    float32 rounding of a sum is bounded relative to the sum of its terms' magnitudes, not to the
    sum itself (which cancels)."""
    exact = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    return ((got.double() - exact).abs() / scale.clamp(min=1e-30)).max().item()


def _gguf_self_check(kernel: Kernel, gen: torch.Generator) -> str | None:
    """None if the gguf matmul gives a row the same bits alone as in a block, within float32
    rounding of the product on the dequantized weights, for every block type."""
    for type_name in GGUF_TYPES:
        for k, n in ((64, 37), (576, 48)):
            raw = random_gguf(n, k, type_name, gen)
            w = pack_gguf(raw, type_name, k)
            x = torch.randn(GGUF_MAX_ROWS + 3, k, generator=gen)
            block = kernel.gguf_matmul(x, w)
            alone = torch.cat([kernel.gguf_matmul(x[r : r + 1], w) for r in range(len(x))])
            if not torch.equal(block, alone):
                return f"its {type_name} product of a block differs from the same rows alone"
            err = gguf_error(block, x, dequantize_gguf(raw, type_name, k))
            if err > GGUF_RTOL:
                return (
                    f"its {type_name} product is {err:.1e} (relative) from the float32 one on the"
                    " dequantized weights"
                )
            reason = _int8_rows_check(kernel, x, raw, type_name, k)
            if reason is not None:
                return reason
    return None


def _int8_rows_check(
    kernel: Kernel, x: torch.Tensor, raw: torch.Tensor, type_name: str, k: int
) -> str | None:
    """The ``gguf-q8`` kernel: a row's bits alone as in a block, and within float32 rounding of
    its own exact arithmetic (int8 rows times the blocks, :func:`int8_rows_product`)."""
    w = pack_gguf(raw, type_name, k, rows="int8")
    block = kernel.gguf_matmul(x, w)
    alone = torch.cat([kernel.gguf_matmul(x[r : r + 1], w) for r in range(len(x))])
    if not torch.equal(block, alone):
        return f"its {type_name} product of int8 rows differs in a block from the rows alone"
    exact = int8_rows_product(x, raw, type_name, k)
    scale = x.double().abs() @ dequantize_gguf(raw, type_name, k).double().abs().T
    err = ((block.double() - exact).abs() / scale.clamp(min=1e-30)).max().item()
    if err > GGUF_RTOL:
        return f"its {type_name} product of int8 rows is {err:.1e} (relative) from its reference"
    return None


def open_kernel(folder: Path, cc: str | None = None) -> Kernel:
    """Build (or reuse) the library under ``folder``, load it and check it against oneDNN.

    A cached library that no longer loads (a truncated file) is removed and built again once.
    Raises ``RuntimeError`` saying why the kernel cannot be used."""
    library = build(folder, cc)
    try:
        kernel = Kernel(library)
    except OSError:
        library.unlink(missing_ok=True)
        try:
            kernel = Kernel(build(folder, cc))
        except OSError as e:
            raise RuntimeError(f"the built kernel does not load: {e}") from e
    reason = self_check(kernel)
    if reason is not None:
        raise RuntimeError(reason)
    return kernel
