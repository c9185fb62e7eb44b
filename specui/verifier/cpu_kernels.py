"""SpecUI's own CPU kernels (``specui/verifier/cpu_kernels.c``): the int8 and bf16 matmuls, and
row-wise causal attention.  Both exist for speed, and neither changes what batch invariance
needs: a token's numbers inside a verify block are bit for bit the ones it gets alone.

**The int8 matmul: oneDNN's bits, at the memory's speed.**

A decode or verify step multiplies 1 to ``MAX_ROWS`` rows by every weight, so it is a stream
through the weights; oneDNN's u8s8 kernel streams them at about half the speed one core
reaches (``bench/step_profile.py --ablate``: the matmuls were three quarters of an int8 step).
On AMX (``specui_int8_matmul_amx``) 16 rows cost what one costs and every row count runs, so
each weight keeps only the kernel's copy; elsewhere ``specui_int8_matmul`` (AVX512-VNNI) reads
each weight once for up to ``MAX_ROWS`` rows and oneDNN takes longer blocks (prefills).  Both
return what ``onednn::qlinear_pointwise`` returns for the same operands, bit for bit (an exact
int32 sum, made float once, times the channel's scale), so using them changes no output.

**The bf16 matmul** (AMX: ``specui_bf16_matmul``; else AVX512-BF16: ``specui_bf16_matmul_avx512``,
which the drafters use for their few-row products, twice oneDNN's speed through cold weights)
sums each output in one fixed order at any row count: batch-invariant without padding a single
row, but its own bits, not oneDNN's.

**The gguf matmul** (``specui_gguf_matmul``, AVX512 with VNNI; the ``gguf`` precision) reads a
GGUF file's own Q8_0 / Q4_0 / Q4_1 blocks, repacked once into tiles of 16 channels (same values,
same fp16 scales, same bytes), and multiplies float32 rows by them.  Q4 blocks: each row's block
of 32 floats is split into three int8 pieces with a power-of-two step (within 2^-21 of the
block's largest input), the 4-bit values meet them in exact int32 dot products (``vpdpbusd``), and
a block's sums become float once, scaled by its fp16 scale.  Q8_0 (the output head): the values
become floats and are summed in float32.  Each output sums in one fixed order at any row count,
so the matmul is batch-invariant by construction and within float32 rounding's order of the
float32 product on the dequantized weights (:func:`gguf_error`, checked at load).  It does not
need AMX; on a CPU without AVX512-VNNI the ``gguf`` precision is refused and ``auto`` takes
``bf16``.

**Row-wise attention.**  Batch invariance needs each query row of a block to attend over exactly
its own keys in an order that does not depend on the block, and one SDPA call per row (what
``batch_invariant.rowwise_attention`` did) costs ~60 us of fixed cost each: most of what a
9-token verify adds to a step.  ``specui_attention_rows`` computes every (row, head) on its own
in a fixed order (scores in key order, exp summed 16 lanes at a time from key 0, values in key
order) for all rows in one call.  It is its own numerics (within ~1e-6 of SDPA), the same for
every block size, and :func:`self_check` proves both properties at load.

The C file is compiled at first use with the system's C compiler (``$CC``, else ``cc``/``gcc``)
into ``data_dir()/kernels`` under a name that hashes the source, the flags and the compiler, and
loaded with ctypes.  It is used only when that works, the CPU has AVX512-VNNI, and the
self-check passes (oneDNN's bits on random operands; the gguf matmul invariant and within float32
rounding for each block type; attention invariant and close to SDPA);
otherwise (or with ``SPECUI_CPU_KERNELS=0``) every int8 matmul stays oneDNN's and attention one
SDPA call per row, and :func:`status` says why.  The choice is made once per process, so a
verifier never mixes the two.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specui.paths import data_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = (
    "-O3",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512vnni",
    "-mavx512bf16",
    "-mamx-tile",
    "-mamx-bf16",
    "-mamx-int8",
    "-shared",
    "-fPIC",
)
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
AMX_FLAGS = (
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)  # the AMX matmuls; without them bf16 stays oneDNN's
GGUF_MAX_ROWS = (
    12  # rows per pass of the gguf matmul (any row count runs; the self-check spans two passes)
)
MAX_ROWS = 12  # the AVX512-VNNI int8 kernel: one pass over the weights; longer blocks go to oneDNN
TILE = 16
# The GGUF block types the gguf matmul reads (ggml's type ids), and each block's bytes per 32
# weights.
GGUF_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
GGUF_BLOCK = 32  # weights a block


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
    """A GGUF tensor's own blocks (``type``: Q4_0, Q4_1 or Q8_0) in the gguf kernel's layout:
    per tile of 16 channels, per block of 32 inputs, the 16 channels' fp16 scales (and Q4_1's
    fp16 offsets), then their quantized values, channels innermost (``cpu_kernels.c``)."""

    data: torch.Tensor
    type: str
    k: int
    out_features: int

    @property
    def type_id(self) -> int:
        return GGUF_TYPES[self.type]


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


_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_int64, "f": ctypes.c_float}


class Kernel:
    """The compiled ``cpu_kernels.c`` (its matmuls and attention), loaded from ``library``."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        self._int8_vnni = self.function("specui_int8_matmul", "pqqqppqp")
        self._int8_amx = self.function("specui_int8_matmul_amx", "pqqqpppqp")
        self._attention = self.function("specui_attention_rows", "pqqqppqqqfp")
        self._bf16 = self.function("specui_bf16_matmul", "pqqqppqp")
        self._bf16_avx512 = self.function("specui_bf16_matmul_avx512", "pqqqppqp")
        # Where AMX is missing, the bf16 matmul runs on AVX512-BF16 if the CPU has it.
        self.avx512_bf16 = "avx512_bf16" in _cpu_flags()
        self._gguf = self.function("specui_gguf_matmul", "ipqqpqp")
        missing = [f for f in AMX_FLAGS if f not in _cpu_flags()]
        if missing:
            self.amx_reason: str | None = f"the CPU lacks {', '.join(missing)}"
        elif self._lib.specui_amx_init() != 0:
            self.amx_reason = "Linux did not grant AMX's tile state (arch_prctl)"
        else:
            self.amx_reason = None

    def function(self, name: str, signature: str) -> Callable[..., int]:
        """The C function ``name``, its arguments typed by ``signature``: a letter each, ``p`` a
        pointer, ``i`` an int, ``q`` an int64, ``f`` a float; every kernel returns an int status."""
        fn = getattr(self._lib, name)
        fn.argtypes, fn.restype = [_CTYPES[c] for c in signature], ctypes.c_int
        return fn

    def set_prefetch_ahead(self, nbytes: int) -> int:
        """How far ahead (bytes, 0 = off) the matmuls of 4 or more rows prefetch their weights
        into L2; returns the previous distance.  Results do not change, only time
        (``bench/prefetch.py`` compares)."""
        return int(self.function("specui_set_prefetch_ahead", "q")(nbytes))

    def bf16_matmul(
        self, x: torch.Tensor, w: PackedBF16, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """float32 ``[rows, out]``: bf16 rows ``x`` times ``w`` in float32 sums (one fixed order per
        output), plus ``bias``."""
        fn = self._bf16 if self.amx_reason is None else self._bf16_avx512
        if self.amx_reason is not None and not self.avx512_bf16:  # the instructions would fault
            raise RuntimeError(f"bf16 kernel: {self.amx_reason} and AVX512-BF16")
        if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != w.k:
            raise ValueError(
                f"bf16 kernel: needs bf16 rows of {w.k} inputs, got {tuple(x.shape)} {x.dtype}"
            )
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            raise ValueError("bf16 kernel: a contiguous float32 bias")
        x = x.contiguous()
        out = torch.empty(x.shape[0], w.out_features)
        rows = (x.data_ptr(), x.shape[0], w.k, w.k_padded)
        bias_ptr = None if bias is None else bias.data_ptr()
        rc = fn(*rows, w.data.data_ptr(), bias_ptr, w.out_features, out.data_ptr())
        if rc != 0:
            raise MemoryError("bf16 kernel: no memory for its scratch rows")
        return out

    def gguf_matmul(
        self, x: torch.Tensor, w: PackedGGUF, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """float32 ``[rows, out]``: float32 rows ``x`` times ``w``'s weights, dequantized in
        registers (float32 sums, one fixed order per output).  ``out``: a contiguous float32 buffer
        to fill."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != w.k:
            raise ValueError(
                f"gguf kernel: needs float32 rows of {w.k} inputs, got {tuple(x.shape)} {x.dtype}"
            )
        x = x.contiguous()
        if out is None:
            out = torch.empty(x.shape[0], w.out_features)
        elif (
            out.shape != (x.shape[0], w.out_features)
            or out.dtype != torch.float32
            or not out.is_contiguous()
        ):
            raise ValueError(
                f"gguf kernel: an output buffer of {x.shape[0]} x {w.out_features} float32"
            )
        rows = (x.data_ptr(), x.shape[0], w.k)
        rc = self._gguf(w.type_id, *rows, w.data.data_ptr(), w.out_features, out.data_ptr())
        if rc == -1:
            raise MemoryError("gguf kernel: no memory for the rows' block sums")
        if rc != 0:
            raise ValueError(
                f"gguf kernel: {w.type} with {w.k} inputs (a multiple of {GGUF_BLOCK})"
            )
        return out

    def attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float
    ) -> torch.Tensor:
        """Causal attention of ``q`` [n, heads, d] (the positions after ``start``) over
        ``keys``/``values`` [kv_heads, >= start + n, d] (rows ``d`` apart, as a KV buffer holds
        them): float32 ``[n, heads * d]``."""
        n, heads, d = q.shape
        kv_heads = keys.shape[0]
        if (
            keys.shape[1] < start + n
            or keys.stride()[1:] != (d, 1)
            or values.stride() != keys.stride()
        ):
            raise ValueError(
                f"attention kernel: keys {tuple(keys.shape)} strides {keys.stride()}"
                f" for {n} rows after {start}"
            )
        if q.dtype != torch.float32 or keys.dtype != torch.float32 or values.dtype != torch.float32:
            raise ValueError("attention kernel: float32 queries, keys and values")
        q = q.contiguous()
        out = torch.empty(n, heads * d)
        cache = (keys.data_ptr(), values.data_ptr(), kv_heads, keys.stride(0))
        rc = self._attention(q.data_ptr(), n, heads, d, *cache, start, scale, out.data_ptr())
        if rc == -1:
            raise MemoryError("attention kernel: no memory for its scores")
        if rc != 0:
            raise ValueError(
                f"attention kernel: head size {d} (a multiple of 16, at most 256)"
                f" or {heads} heads over {kv_heads}"
            )
        return out

    def slot_attention(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        starts: list[int],
        scale: float,
    ) -> torch.Tensor:
        """One decode query a sequence: ``q`` [b, heads, d] row ``r`` after ``starts[r]`` cached
        positions of slot ``r`` of ``keys``/``values`` [>= b, kv_heads, capacity, d] (a batched
        cache): float32 ``[b, heads * d]``.  Row ``r`` is :meth:`attention` of ``q[r : r + 1]``
        over slot ``r``, without a tensor made per row (64 rows x 30 layers a step)."""
        b, heads, d = q.shape
        kv_heads, capacity = keys.shape[1], keys.shape[2]
        if (
            keys.dim() != 4
            or keys.shape[0] < b
            or keys.stride()[1:] != (capacity * d, d, 1)
            or values.stride() != keys.stride()
            or max(starts) >= capacity
            or len(starts) != b
        ):
            raise ValueError(
                f"slot attention kernel: keys {tuple(keys.shape)} strides {keys.stride()}"
                f" for {b} rows"
            )
        if q.dtype != torch.float32 or keys.dtype != torch.float32 or values.dtype != torch.float32:
            raise ValueError("slot attention kernel: float32 queries, keys and values")
        q = q.contiguous()
        out = torch.empty(b, heads * d)
        row, slot = heads * d * 4, keys.stride(0) * 4  # bytes
        qp, kp, vp, op = q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr()
        att = self._attention
        for r, start in enumerate(starts):
            cache = (kp + r * slot, vp + r * slot, kv_heads, capacity * d)
            rc = att(qp + r * row, 1, heads, d, *cache, start, scale, op + r * row)
            if rc == -1:
                raise MemoryError("attention kernel: no memory for its scores")
            if rc != 0:
                raise ValueError(f"attention kernel: head size {d}, {heads} heads over {kv_heads}")
        return out

    def matmul(self, q: torch.Tensor, w: PackedInt8, scale: torch.Tensor) -> torch.Tensor:
        """float32 ``[rows, out]``: uint8 rows ``q`` (zero point 128) times ``w``, times
        ``scale``."""
        if q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] != w.k:
            raise ValueError(
                f"int8 kernel: needs uint8 rows of {w.k} inputs, got {tuple(q.shape)} {q.dtype}"
            )
        q = q.contiguous()
        out = torch.empty(q.shape[0], w.out_features)
        rows = (q.data_ptr(), q.shape[0], w.k, w.k_padded, w.data.data_ptr())
        scaled = (scale.data_ptr(), w.out_features, out.data_ptr())
        if w.sums is not None:
            if self.amx_reason is not None:  # AMX instructions would fault
                raise RuntimeError(f"int8 kernel: {self.amx_reason}")
            rc = self._int8_amx(*rows, w.sums.data_ptr(), *scaled)
        else:
            rc = self._int8_vnni(*rows, *scaled)
        if rc != 0:
            raise MemoryError("int8 kernel: no memory for its scratch rows")
        return out


def int8_weight(wq: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> Int8Weight:
    """int8 ``wq`` ``[out, k]`` with its channel scales, packed for oneDNN and (where it runs)
    the kernel."""
    if amx_available():  # one copy: the AMX kernel takes every row count
        return _int8_weight(None, scale, bias, pack(wq, amx=True))
    return _int8_weight(_onednn_pack(wq), scale, bias, pack(wq, amx=False) if load() else None)


def onednn_int8_weight(
    wq: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> Int8Weight:
    """``wq`` packed for oneDNN alone: the reference the kernels are checked against."""
    return _int8_weight(_onednn_pack(wq), scale, bias, None)


def _onednn_pack(wq: torch.Tensor) -> torch.Tensor:
    return torch.ops.onednn.qlinear_prepack(wq, [1, wq.shape[1]])


def _int8_weight(
    onednn: torch.Tensor | None,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    kernel: PackedInt8 | None,
) -> Int8Weight:
    zero_points = torch.zeros(len(scale), dtype=torch.int64)
    return Int8Weight(onednn, scale.float().contiguous(), zero_points, bias, kernel)


def onednn_matmul(q: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """float32 ``[rows, out]``: oneDNN's u8s8 kernel (input scale 1, zero point 128) times the
    channel scales."""
    return torch.ops.onednn.qlinear_pointwise(
        q, 1.0, 128, w.onednn, w.scale, w.zero_points, None, 1.0, 0, torch.float32, "none", [], ""
    )


def attention_supported(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether :func:`attention` runs the kernel for this shape (else the caller's SDPA rows)."""
    return load() is not None and head_dim % 16 == 0 and head_dim <= 256 and heads % kv_heads == 0


def attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float
) -> torch.Tensor:
    """``Kernel.attention`` of the loaded kernel; call only where :func:`attention_supported`
    holds."""
    return _state["kernel"].attention(q, keys, values, start, scale)  # type: ignore[union-attr]


def slot_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, starts: list[int], scale: float
) -> torch.Tensor:
    """``Kernel.slot_attention`` of the loaded kernel (where :func:`attention_supported` holds)."""
    kernel = _state["kernel"]
    return kernel.slot_attention(q, keys, values, starts, scale)  # type: ignore[union-attr]


def matmul(q: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """float32 ``[rows, out]`` of uint8 rows ``q`` times ``w``: a kernel where it takes the
    rows, else oneDNN (same bits)."""
    if w.kernel is not None and (q.shape[0] <= w.kernel.max_rows or w.onednn is None):
        return _state["kernel"].matmul(q, w.kernel, w.scale)  # type: ignore[union-attr]
    return onednn_matmul(q, w)


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


def pack_gguf(raw: torch.Tensor, type_name: str, k: int) -> PackedGGUF:
    """A GGUF tensor's blocks ``[out, k/32 * block bytes]`` in the gguf kernel's layout: the same
    quantized values and scales, moved, never requantized (channels padded to 16 with zero
    blocks)."""
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
    if type_name == "Q8_0":  # a value at a time, the 16 channels side by side
        parts.append(qs.transpose(2, 3).reshape(padded // TILE, nb, -1))
    else:  # 4 bytes (8 nibbles) at a time, the 16 channels side by side: one 32-bit lane a channel
        groups = qs.reshape(padded // TILE, nb, TILE, 4, 4).transpose(2, 3)
        parts.append(groups.reshape(padded // TILE, nb, -1))
    return PackedGGUF(torch.cat(parts, dim=-1).contiguous().view(-1), type_name, k, out_features)


def cat_gguf(parts: list[PackedGGUF]) -> PackedGGUF | None:
    """Packed weights stacked along their outputs (q/k/v, gate/up: one call instead of several),
    or None where they differ in type or inputs, or a part's channels are not whole tiles."""
    first = parts[0]
    if any(p.type != first.type or p.k != first.k or p.out_features % TILE for p in parts):
        return None
    data = torch.cat([p.data for p in parts])
    return PackedGGUF(data, first.type, first.k, sum(p.out_features for p in parts))


def gguf_available() -> bool:
    """Whether the gguf matmul runs in this process (the kernel loaded and passed its
    self-check)."""
    return load() is not None


def gguf_matmul(x: torch.Tensor, w: PackedGGUF, out: torch.Tensor | None = None) -> torch.Tensor:
    """``Kernel.gguf_matmul`` of the loaded kernel; call only where :func:`gguf_available` holds."""
    return _state["kernel"].gguf_matmul(x, w, out)  # type: ignore[union-attr]


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


def amx_available() -> bool:
    """Whether the AMX matmuls run in this process (bf16 and int8, every row count)."""
    kernel = load()
    return kernel is not None and kernel.amx_reason is None


def bf16_kernel_available() -> bool:
    """Whether the bf16 matmul runs in this process (on AMX, or else on AVX512-BF16)."""
    kernel = load()
    return kernel is not None and (kernel.amx_reason is None or kernel.avx512_bf16)


def bf16_matmul(x: torch.Tensor, w: PackedBF16, bias: torch.Tensor | None) -> torch.Tensor:
    """``Kernel.bf16_matmul`` of the loaded kernel (weights packed by :func:`pack_bf16` while
    it was loaded)."""
    return _state["kernel"].bf16_matmul(x, w, bias)  # type: ignore[union-attr]


def pack(wq: torch.Tensor, amx: bool | None = None) -> PackedInt8:
    """int8 weights ``[out, k]`` in a kernel's layout: AMX's where it runs (or ``amx``), else
    AVX512-VNNI's."""
    if amx is None:
        amx = amx_available()
    out_features, k = wq.shape
    if amx:  # signed, whole AMX tiles, with each channel's sum for the zero point
        data, kp = _blocked(wq, 64, 4)
        return PackedInt8(data, k, kp, out_features, wq.sum(1, dtype=torch.int32).contiguous())
    data, kp = _blocked((wq.to(torch.int16) + 128).to(torch.uint8), 4, 4)  # unsigned for vpdpbusd
    return PackedInt8(data, k, kp, out_features)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split())


def cpu_reason() -> str | None:
    """Why this CPU cannot run the kernels, or None (Linux ``/proc/cpuinfo`` flags)."""
    flags = _cpu_flags()
    if not flags:
        return "no /proc/cpuinfo flags to read the CPU's features from"
    missing = [f for f in CPU_FLAGS if f not in flags]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def build(folder: Path, cc: str | None = None) -> Path:
    """The kernel's shared library under ``folder``, compiled unless already there.

    Raises ``RuntimeError`` with the compiler's words when it cannot be built."""
    cc = cc or compiler()
    if cc is None or shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc or 'set CC, or install cc/gcc'})")
    try:
        version = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"C compiler {cc} does not run: {e}") from e
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode()
    ).hexdigest()[:16]
    library = folder / f"cpu_kernels-{key}.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cpu_kernels-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cc} could not build {SOURCE.name}: {done.stderr.strip()[-500:]}")
        os.replace(tmp, library)  # atomic: a concurrent build or a kill leaves no half file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return library


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


_lock = threading.Lock()
_state: dict[str, object] = {}


def load() -> Kernel | None:
    """The kernel, built and checked once per process; None where it cannot be used."""
    with _lock:
        if "kernel" in _state:
            return _state["kernel"]  # type: ignore[return-value]
        kernel, reason = None, None
        if os.environ.get("SPECUI_CPU_KERNELS", "1") == "0":
            reason = "SPECUI_CPU_KERNELS=0"
        else:
            reason = cpu_reason()
        if reason is None:
            try:
                kernel = open_kernel(data_dir() / "kernels")
            except (RuntimeError, OSError) as e:
                reason = str(e)
        if reason is not None:
            log.info(
                "SpecUI's CPU kernels are off (int8 matmuls oneDNN's, attention SDPA's): %s", reason
            )
        _state.update(kernel=kernel, reason=reason)
        return kernel


def status() -> str:
    """One line: which matmuls and attention this process uses, and why."""
    kernel = load()
    if kernel is not None:
        if kernel.amx_reason is None:
            return "specui kernels: AMX int8 and bf16 matmuls, gguf matmul, row-wise attention"
        bf16 = "drafters' on AVX512-BF16, others oneDNN's" if kernel.avx512_bf16 else "oneDNN's"
        return (
            f"specui kernels: AVX512-VNNI int8 matmul for up to {MAX_ROWS} rows"
            " (oneDNN u8s8 beyond), "
            f"gguf matmul, row-wise attention; bf16 matmuls {bf16} ({kernel.amx_reason})"
        )
    return f"oneDNN u8s8 and SDPA rows ({_state.get('reason')})"
