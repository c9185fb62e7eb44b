"""The ctypes bindings of the compiled kernels (:class:`Kernel`): each C function typed once,
its operands checked before a pointer is handed over, its status codes made Python errors."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from specui.kernels.build import AMX_FLAGS, cpu_flags
from specui.kernels.packing import GGUF_BLOCK, PackedBF16, PackedGGUF, PackedInt8

_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_int64, "f": ctypes.c_float}


class Kernel:
    """The compiled kernels (every C file of this package: matmuls, attention, the one-call
    layers), loaded from ``library``."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        self._int8_vnni = self.function("specui_int8_matmul", "pqqqppqp")
        self._int8_amx = self.function("specui_int8_matmul_amx", "pqqqpppqp")
        self._attention = self.function("specui_attention_rows", "pqqqppqqqfp")
        self._bf16 = self.function("specui_bf16_matmul", "pqqqppqp")
        self._bf16_avx512 = self.function("specui_bf16_matmul_avx512", "pqqqppqp")
        # Where AMX is missing, the bf16 matmul runs on AVX512-BF16 if the CPU has it.
        self.avx512_bf16 = "avx512_bf16" in cpu_flags()
        self._gguf = self.function("specui_gguf_matmul", "ipqqpqp")
        missing = [f for f in AMX_FLAGS if f not in cpu_flags()]
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
