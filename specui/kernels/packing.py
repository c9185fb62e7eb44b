"""Weights in the kernels' layouts, and the references they are checked against.

- int8: :func:`pack` (the AMX or AVX512-VNNI kernel's copy), :class:`Int8Weight` (with oneDNN's
  packed copy, :func:`onednn_int8_weight`) and oneDNN's product, :func:`onednn_matmul`;
- bf16: :func:`pack_bf16`;
- GGUF blocks: :func:`pack_gguf` (the file's own blocks, moved, never requantized),
  :func:`cat_gguf`, :func:`dequantize_gguf` (the float32 reference), :func:`int8_rows_product`
  (the ``gguf-q8`` kernel's exact reference), :func:`quantize_q8_0` (float weights as Q8_0
  blocks: the drafters beside a ``gguf-q8`` verifier) and :func:`random_gguf`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

MAX_ROWS = 12  # the AVX512-VNNI int8 kernel: one pass over the weights; longer blocks go to oneDNN
TILE = 16
# The GGUF block types the gguf matmul reads (ggml's type ids), and each block's bytes per 32
# weights.
GGUF_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
GGUF_BLOCK = 32  # weights a block
# What the rows meet a GGUF weight as: float32 (``gguf.c``, the ``gguf`` precision) or int8 per
# block of 32 (``gguf_q8.c``, the ``gguf-q8`` precision); the kernel reads the flag off the type.
GGUF_ROWS = ("float", "int8")
GGUF_INT8_ROWS = 64


@dataclass(frozen=True)
class PackedInt8:
    """Weights in a kernel's layout, ``[channels/16, k/4, 16, 4]``: for AMX (``sums`` set) signed,
    ``k`` padded to 64, with each channel's sum of weights; for the AVX512-VNNI kernel unsigned
    (``w + 128``), ``k`` padded to 4."""

    data: torch.Tensor
    k: int
    k_padded: int
    out_features: int
    sums: torch.Tensor | None = None

    @property
    def max_rows(self) -> int:
        """The longest block this layout's kernel takes; longer ones go to oneDNN (same bits)."""
        return sys.maxsize if self.sums is not None else MAX_ROWS


@dataclass(frozen=True)
class PackedBF16:
    """bf16 weights in the kernel's layout: ``[channels/16, k/2, 16, 2]`` (AMX's B tiles)."""

    data: torch.Tensor
    k: int
    k_padded: int
    out_features: int


@dataclass(frozen=True)
class PackedGGUF:
    """A GGUF tensor's own blocks (``type``: Q4_0, Q4_1 or Q8_0) in the gguf kernels' layout:
    per tile of 16 channels, per block of 32 inputs, the 16 channels' fp16 scales (and Q4_1's
    fp16 offsets), then their quantized values (``gguf.c``; with ``rows="int8"``, Q8_0's values
    four inputs a channel at a time, + 128: ``gguf_q8.c``)."""

    data: torch.Tensor
    type: str
    k: int
    out_features: int
    rows: str = "float"

    @property
    def type_id(self) -> int:
        return GGUF_TYPES[self.type] | (GGUF_INT8_ROWS if self.rows == "int8" else 0)


@dataclass(frozen=True)
class Int8Weight:
    """One int8 linear weight as the matmuls read it: with AMX only the kernel's copy (any row
    count); else oneDNN's packed copy, and where the AVX512-VNNI kernel runs its copy too (blocks
    of up to ``MAX_ROWS`` rows).  ``scale``: float32 per output channel; ``bias``: float32 or None
    (added by the caller, after the row scales)."""

    onednn: torch.Tensor | None
    scale: torch.Tensor
    zero_points: torch.Tensor
    bias: torch.Tensor | None
    kernel: PackedInt8 | None  # the AMX or AVX512-VNNI kernel's copy, where one runs

    @property
    def out_features(self) -> int:
        return self.scale.shape[0]

    @classmethod
    def of(
        cls,
        onednn: torch.Tensor | None,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        kernel: PackedInt8 | None,
    ) -> Int8Weight:
        """The weight from its packed copies, its scales made contiguous float32 (zero points 0:
        the weights are symmetric)."""
        zero_points = torch.zeros(len(scale), dtype=torch.int64)
        return cls(onednn, scale.float().contiguous(), zero_points, bias, kernel)


def pack(wq: torch.Tensor, amx: bool) -> PackedInt8:
    """int8 weights ``[out, k]`` in a kernel's layout: AMX's where ``amx``, else AVX512-VNNI's."""
    out_features, k = wq.shape
    if amx:  # signed, whole AMX tiles, with each channel's sum for the zero point
        data, kp = _blocked(wq, 64, 4)
        return PackedInt8(data, k, kp, out_features, wq.sum(1, dtype=torch.int32).contiguous())
    data, kp = _blocked((wq.to(torch.int16) + 128).to(torch.uint8), 4, 4)  # unsigned for vpdpbusd
    return PackedInt8(data, k, kp, out_features)


def onednn_int8_weight(
    wq: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> Int8Weight:
    """``wq`` packed for oneDNN alone: the reference the kernels are checked against."""
    return Int8Weight.of(onednn_pack(wq), scale, bias, None)


def onednn_pack(wq: torch.Tensor) -> torch.Tensor:
    """int8 ``wq`` ``[out, k]`` packed for oneDNN's u8s8 kernel."""
    return torch.ops.onednn.qlinear_prepack(wq, [1, wq.shape[1]])


def onednn_matmul(q: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """float32 ``[rows, out]``: oneDNN's u8s8 kernel (input scale 1, zero point 128) times the
    channel scales."""
    return torch.ops.onednn.qlinear_pointwise(
        q, 1.0, 128, w.onednn, w.scale, w.zero_points, None, 1.0, 0, torch.float32, "none", [], ""
    )


def _blocked(w: torch.Tensor, k_multiple: int, group: int) -> tuple[torch.Tensor, int]:
    """``w`` ``[out, k]`` zero-padded to ``[out/16, k_padded/group, 16, group]`` (16 channels by
    ``group`` inputs per 64 bytes, the kernels' layout), and ``k_padded``."""
    out_features, k = w.shape
    kp, op = -(-k // k_multiple) * k_multiple, -(-out_features // TILE) * TILE
    padded = torch.zeros(op, kp, dtype=w.dtype)
    padded[:out_features, :k] = w
    return padded.view(op // TILE, TILE, kp // group, group).permute(0, 2, 1, 3).contiguous(), kp


def pack_bf16(w: torch.Tensor) -> PackedBF16:
    """Weights ``[out, k]`` (any float dtype) as bf16 in the kernel's layout (``k`` padded to
    32, ``out`` to 16)."""
    data, kp = _blocked(w.to(torch.bfloat16), 32, 2)  # whole AMX tiles
    return PackedBF16(data, w.shape[1], kp, w.shape[0])


def _gguf_blocks(raw: torch.Tensor, type_name: str, k: int) -> torch.Tensor:
    """A GGUF tensor's bytes ``[out, k/32 * block bytes]`` (uint8) as ``[out, k/32, block
    bytes]``."""
    if type_name not in GGUF_TYPES:
        raise ValueError(
            f"not a block type the gguf kernel reads: {type_name}"
            f" (it reads {', '.join(GGUF_TYPES)})"
        )
    if (
        k % GGUF_BLOCK
        or raw.dtype != torch.uint8
        or raw.dim() != 2
        or raw.shape[1] != k // GGUF_BLOCK * GGUF_BLOCK_BYTES[type_name]
    ):
        raise ValueError(f"{type_name} bytes {tuple(raw.shape)} {raw.dtype} for {k} inputs")
    return raw.reshape(raw.shape[0], k // GGUF_BLOCK, GGUF_BLOCK_BYTES[type_name])


def dequantize_gguf(raw: torch.Tensor, type_name: str, k: int) -> torch.Tensor:
    """float32 ``[out, k]`` of a GGUF tensor's blocks (the reference the gguf kernel is checked
    against): Q8_0 ``q * d``, Q4_0 ``(q - 8) * d``, Q4_1 ``q * d + m``; in a Q4 block byte ``i``
    holds input ``i`` in its low nibble and ``i + 16`` in its high one."""
    blocks = _gguf_blocks(raw, type_name, k)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [out, blocks, 1]
    if type_name == "Q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(raw.shape[0], k)
    qs = blocks[..., 4:] if type_name == "Q4_1" else blocks[..., 2:]
    q = torch.cat([qs & 0xF, qs >> 4], dim=-1).float()  # [out, blocks, 32], inputs in order
    if type_name == "Q4_0":
        return ((q - 8) * d).reshape(raw.shape[0], k)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float()
    return (q * d + m).reshape(raw.shape[0], k)


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """Float weights ``[out, k]`` (k a multiple of 32) as GGUF Q8_0 blocks ``[out, k/32 * 34]``
    (uint8): per block of 32 an fp16 scale ``d = max|w| / 127`` and ``round(w / d)`` in int8, as
    llama.cpp quantizes a Q8_0 tensor.  A drafter's bf16 weights beside a ``gguf-q8`` verifier:
    half the bytes a draft streams, on the same int8-row kernel."""
    out_features, k = w.shape
    if k % GGUF_BLOCK:
        raise ValueError(f"Q8_0 needs inputs in blocks of {GGUF_BLOCK}, got {k}")
    blocks = w.detach().float().reshape(out_features, k // GGUF_BLOCK, GGUF_BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp(-127, 127).to(torch.int8).view(torch.uint8)
    scale = d.half().view(torch.uint8).reshape(out_features, k // GGUF_BLOCK, 2)
    return torch.cat([scale, q], dim=-1).reshape(out_features, -1).contiguous()


def int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 rows ``[n, k]`` as the ``gguf-q8`` kernel makes them int8: per block of 32 a scale
    ``dx = max|x| / 127`` and ``q = round(x * (127 / max|x|))`` (ties to even), all in float32.
    Returns ``q`` (as float32 integers) ``[n, k]`` and ``dx`` ``[n, k/32]``."""
    blocks = x.float().reshape(x.shape[0], -1, GGUF_BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv)
    return q.reshape(x.shape), (amax / 127.0).squeeze(-1)


def int8_rows_product(x: torch.Tensor, raw: torch.Tensor, type_name: str, k: int) -> torch.Tensor:
    """float64 ``[n, out]``: what the ``gguf-q8`` kernel computes, exactly (its reference): the
    rows made int8 (:func:`int8_rows`) times the blocks' weights as they are (Q4_1's offsets
    included: they meet the int8 row's block sums, as in llama.cpp's Q8_1 rows)."""
    q, dx = int8_rows(x)
    xq = (q.double().view(x.shape[0], -1, GGUF_BLOCK) * dx.double().unsqueeze(-1)).view(x.shape)
    return xq @ dequantize_gguf(raw, type_name, k).double().T


def pack_gguf(raw: torch.Tensor, type_name: str, k: int, rows: str = "float") -> PackedGGUF:
    """A GGUF tensor's blocks ``[out, k/32 * block bytes]`` in the layout of the gguf kernel that
    meets ``rows`` (``float`` or ``int8``): the same quantized values and scales, moved, never
    requantized (channels padded to 16 with zero blocks)."""
    if rows not in GGUF_ROWS:
        raise ValueError(f"rows must be one of {GGUF_ROWS}, got {rows!r}")
    blocks = _gguf_blocks(raw, type_name, k)
    out_features, nb, size = blocks.shape
    padded = -(-out_features // TILE) * TILE
    if padded != out_features:
        blocks = torch.cat(
            [blocks, torch.zeros(padded - out_features, nb, size, dtype=torch.uint8)]
        )
    tiles = blocks.view(padded // TILE, TILE, nb, size).permute(
        0, 2, 1, 3
    )  # [tiles, nb, 16 channels, size]
    head = 4 if type_name == "Q4_1" else 2  # fp16 d (and m) before the quantized values
    parts = [tiles[..., j : j + 2].reshape(padded // TILE, nb, 2 * TILE) for j in range(0, head, 2)]
    qs = tiles[..., head:]  # [tiles, nb, 16 channels, values]
    if type_name == "Q8_0" and rows == "int8":
        # vpdpbusd's unsigned side, one 32-bit lane a channel: 4 inputs of a channel side by side,
        # the 16 channels after each other, 8 groups a block; each value + 128 (0..255).
        unsigned = (qs.contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        groups = unsigned.reshape(padded // TILE, nb, TILE, 8, 4).transpose(2, 3)
        parts.append(groups.reshape(padded // TILE, nb, -1))
    elif type_name == "Q8_0":  # a value at a time, the 16 channels side by side
        parts.append(qs.transpose(2, 3).reshape(padded // TILE, nb, -1))
    else:  # 4 bytes (8 nibbles) at a time, the 16 channels side by side: one 32-bit lane a channel
        groups = qs.reshape(padded // TILE, nb, TILE, 4, 4).transpose(2, 3)
        parts.append(groups.reshape(padded // TILE, nb, -1))
    data = torch.cat(parts, dim=-1).contiguous().view(-1)
    return PackedGGUF(data, type_name, k, out_features, rows)


def cat_gguf(parts: list[PackedGGUF]) -> PackedGGUF | None:
    """Packed weights stacked along their outputs (q/k/v, gate/up: one call instead of several),
    or None where they differ in type or inputs, or a part's channels are not whole tiles."""
    first = parts[0]
    if any(
        p.type != first.type or p.k != first.k or p.rows != first.rows or p.out_features % TILE
        for p in parts
    ):
        return None
    data = torch.cat([p.data for p in parts])
    return PackedGGUF(data, first.type, first.k, sum(p.out_features for p in parts), first.rows)


def random_gguf(n: int, k: int, type_name: str, gen: torch.Generator) -> torch.Tensor:
    """Random blocks of a GGUF type, ``[n, k/32 * block bytes]`` uint8, with finite fp16 scales
    of a real model's size: operands for the self-check and the tests."""
    nb = k // GGUF_BLOCK
    d = (torch.rand(n, nb, 1, generator=gen) * 0.02 + 1e-4).half().view(torch.uint8).view(n, nb, 2)
    if type_name == "Q8_0":
        q = torch.randint(-128, 128, (n, nb, 32), generator=gen, dtype=torch.int8).view(torch.uint8)
        return torch.cat([d, q], -1).reshape(n, -1)
    q = torch.randint(0, 256, (n, nb, 16), generator=gen, dtype=torch.uint8)
    if type_name == "Q4_0":
        return torch.cat([d, q], -1).reshape(n, -1)
    m = (-torch.rand(n, nb, 1, generator=gen) * 0.15).half().view(torch.uint8).view(n, nb, 2)
    return torch.cat([d, m, q], -1).reshape(n, -1)
