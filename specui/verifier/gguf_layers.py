"""The gguf verifier's decoder layers in one C call (``specui_gguf_layers`` in ``cpu_kernels.c``).

A one-token gguf step streams ~60 MB of the file's blocks, about 13 ms at one core's bandwidth,
but took ~27 ms through ``specui.verifier.decoder``'s torch ops: per layer some 35 ops between the
matmuls (norms, rotary, KV writes, SiLU, residual adds, views), each a few microseconds of
dispatch and allocation (``bench/engine_peer.py --profile``).  :class:`GGUFLayers` describes every
layer once, as the C side reads it (pointers into tensors it keeps alive), so a step or a verify
block is one call: the same arithmetic on the same weights, in the kernels' own fixed orders.

It is used only for blocks the row-wise attention serves (up to ``ROWWISE_MAX_ROWS`` rows; longer
prefills keep the torch ops and SDPA), and only where every layer has fused q/k/v and gate/up
blocks (``batch_invariant._to_gguf`` fuses them where the parts share a block type).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from specui.verifier import cpu_kernels
from specui.verifier.batch_invariant import GGUFWeight


def _fields(kind: type, names: str) -> list[tuple[str, type]]:
    return [(name, kind) for name in names.split()]


class _Weight(ctypes.Structure):  # specui_gguf_weight in cpu_kernels.c, field for field
    _fields_ = [
        *_fields(ctypes.c_int32, "type unused"),
        *_fields(ctypes.c_void_p, "data bias"),
        *_fields(ctypes.c_int64, "k n_out"),
    ]


class _Layer(ctypes.Structure):  # specui_gguf_layer
    _fields_ = [
        *_fields(ctypes.c_void_p, "ln1 ln2 q_norm k_norm"),
        *_fields(ctypes.c_float, "eps1 eps2 q_eps k_eps scaling unused"),
        *_fields(_Weight, "qkv o gate_up down"),
    ]


class GGUFLayers:
    """Every decoder layer of a gguf verifier as ``specui_gguf_layers`` reads it.

    ``layers``: ``specui.verifier.decoder._Layer`` objects whose ``qkv`` and ``gate_up`` are fused
    :class:`GGUFWeight` s (see :func:`supported`)."""

    def __init__(self, layers: Sequence, heads: int, kv_heads: int, head_dim: int) -> None:
        self._keep: list[torch.Tensor] = []  # what the C structures point into
        self.table = (_Layer * len(layers))(*(self._layer(layer) for layer in layers))
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.hidden = layers[0].qkv.packed.k
        # layers (the table's address), n_layers, heads, kv_heads, d, h, rows, hidden, cos, ssin,
        # kv, capacity, start, tap_slot, taps
        kernel = cpu_kernels.load()
        if kernel is None:
            raise RuntimeError("gguf layers: the CPU kernels are not loaded here")
        self._fn = kernel.function("specui_gguf_layers", "pqqqqpqqpppqqpp")

    @staticmethod
    def supported(layers: Sequence) -> bool:
        """Whether every layer has the fused gguf blocks this call reads and the kernels load."""
        return cpu_kernels.gguf_available() and all(
            isinstance(layer.qkv, GGUFWeight) and isinstance(layer.gate_up, GGUFWeight)
            for layer in layers
        )

    def _ptr(self, t: torch.Tensor | None) -> int | None:
        if t is None:
            return None
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _weight(self, w: GGUFWeight) -> _Weight:
        p = w.packed
        self._keep.append(p.data)
        return _Weight(p.type_id, 0, p.data.data_ptr(), self._ptr(w.bias), p.k, p.out_features)

    def _layer(self, layer) -> _Layer:
        q_norm, k_norm = layer.q_norm or (None, 0.0), layer.k_norm or (None, 0.0)
        norms = [self._ptr(t) for t in (layer.ln1, layer.ln2, q_norm[0], k_norm[0])]
        epsilons = (layer.eps1, layer.eps2, q_norm[1], k_norm[1], layer.scaling, 0.0)
        weights = [self._weight(w) for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return _Layer(*norms, *epsilons, *weights)

    def run(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        kv: torch.Tensor,
        start: int,
        taps: Sequence[int],
    ) -> dict[int, torch.Tensor]:
        """Every layer over the rows ``h`` [n, hidden] (float32, updated in place) at positions
        ``start``.. (``cos``/``signed_sin`` [n, 1, d] for them), writing their keys and values into
        ``kv`` [layers, 2, kv_heads, capacity, d]; the residual stream after each layer in
        ``taps`` (1-based), ``{layer: [n, hidden]}``."""
        n = h.shape[0]
        wanted = sorted(t for t in set(taps) if t >= 1)
        slots = torch.full((len(self.table) + 1,), -1, dtype=torch.int64)
        for s, t in enumerate(wanted):
            slots[t] = s
        out = torch.empty(max(1, len(wanted)), n, self.hidden)
        if not (h.is_contiguous() and kv.is_contiguous() and cos.is_contiguous()):
            raise ValueError("gguf layers: contiguous rows, rotary tables and cache")
        shape = (len(self.table), self.heads, self.kv_heads, self.head_dim)
        rows = (h.data_ptr(), n, self.hidden, cos.data_ptr(), signed_sin.data_ptr())
        cache = (kv.data_ptr(), kv.shape[3], start, slots.data_ptr(), out.data_ptr())
        rc = self._fn(ctypes.addressof(self.table), *shape, *rows, *cache)
        if rc == -1:
            raise MemoryError("gguf layers: no memory for the step's scratch rows")
        if rc != 0:
            raise ValueError(f"gguf layers: shapes the kernels do not take ({n} rows at {start})")
        return {t: out[s] for s, t in enumerate(wanted)}
