"""SpecUI's own CPU kernels (``specui/kernels/*.c``): the int8 and bf16 matmuls, and
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
float32 product on the dequantized weights (:func:`checks.gguf_error`, checked at load).  It does
not need AMX; on a CPU without AVX512-VNNI the ``gguf`` and ``gguf-q8`` precisions are refused
and ``auto`` takes ``bf16``.

**Row-wise attention.**  Batch invariance needs each query row of a block to attend over exactly
its own keys in an order that does not depend on the block, and one SDPA call per row (what
``batch_invariant.rowwise_attention`` did) costs ~60 us of fixed cost each: most of what a
9-token verify adds to a step.  ``specui_attention_rows`` computes every (row, head) on its own
in a fixed order (scores in key order, exp summed 16 lanes at a time from key 0, values in key
order) for all rows in one call.  It is its own numerics (within ~1e-6 of SDPA), the same for
every block size, and :func:`checks.self_check` proves both properties at load.

The C files (one per family: ``int8.c``, ``bf16.c``, ``gguf.c``, ``attention.c``, ``layers.c``,
``markov.c``; shared inline helpers in ``kernels.h``) are compiled at first use with the system's
C compiler (``$CC``, else ``cc``/``gcc``) into one library in ``data_dir()/kernels`` under a name
that hashes the sources, the flags and the compiler, and loaded with ctypes.  It is used only
when that works, the CPU has AVX512-VNNI, and the self-check passes (oneDNN's bits on random
operands; the gguf matmul invariant and within float32 rounding for each block type; attention
invariant and close to SDPA); otherwise (or with ``SPECUI_CPU_KERNELS=0``) every int8 matmul
stays oneDNN's and attention one SDPA call per row, and :func:`status` says why.  The choice is
made once per process, so a verifier never mixes the two.

The modules: ``build`` (compiler, flags, CPU checks, the build), ``library`` (the ctypes bindings,
:class:`~specui.kernels.library.Kernel`), ``packing`` (weights in the kernels' layouts, and
oneDNN's int8 reference), ``checks`` (the self-check at load), ``layers`` (decoder layers in one
C call).  This module holds the process's kernel: :func:`load`, :func:`status`, whether each
kernel runs here, and the calls on the loaded kernel.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from specui.kernels.build import cpu_reason
from specui.kernels.checks import open_kernel
from specui.kernels.library import Kernel
from specui.kernels.packing import (
    MAX_ROWS,
    Int8Weight,
    PackedBF16,
    PackedGGUF,
    onednn_matmul,
    onednn_pack,
    pack,
)
from specui.paths import data_dir

log = logging.getLogger(__name__)

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
                # The self-checks compare with float32 torch: a first load under autocast (an
                # extraction's bf16 forward) would fail them and turn the kernels off for good.
                with torch.autocast("cpu", enabled=False):
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


def gguf_available() -> bool:
    """Whether the gguf matmul runs in this process (the kernel loaded and passed its
    self-check)."""
    return load() is not None


def gguf_matmul(x: torch.Tensor, w: PackedGGUF, out: torch.Tensor | None = None) -> torch.Tensor:
    """``Kernel.gguf_matmul`` of the loaded kernel; call only where :func:`gguf_available` holds."""
    return _state["kernel"].gguf_matmul(x, w, out)  # type: ignore[union-attr]


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


def int8_weight(wq: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> Int8Weight:
    """int8 ``wq`` ``[out, k]`` with its channel scales, packed for oneDNN and (where it runs)
    the kernel."""
    if amx_available():  # one copy: the AMX kernel takes every row count
        return Int8Weight.of(None, scale, bias, pack(wq, amx=True))
    return Int8Weight.of(onednn_pack(wq), scale, bias, pack(wq, amx=False) if load() else None)
