"""Decoder layers in one C call (``specui_decoder_layers`` in ``layers.c``).

Between two matmuls a decoder layer runs some 35 small torch ops (norms, rotary, KV writes, SiLU,
residual adds, views), each a few microseconds of dispatch and allocation: more than the matmuls
themselves for the few rows of a decoding step or a draft block.  :class:`OneCallLayers` describes
every layer once, as the C side reads it (pointers into tensors it keeps alive), so a block of rows
through all the layers is one call: the same arithmetic on the same weights, in the kernels' own
fixed orders, within float32 rounding of the torch ops.

Two users: the gguf verifier (``specui.verifier.gguf_layers``, the file's own blocks) and the
drafters' fast path (``specui.algorithms.layer_call``, bf16 weights in ``pack_bf16``'s layout).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specui.kernels import load

WEIGHT_BF16 = 30  # a weight's type for bf16 rows in pack_bf16's layout (GGML's number for BF16)

Norm = tuple[torch.Tensor, float]  # (weight, eps)


def _fields(kind: type, names: str) -> list[tuple[str, type]]:
    return [(name, kind) for name in names.split()]


class _Weight(ctypes.Structure):  # specui_layer_weight in kernels.h, field for field
    _fields_ = [
        *_fields(ctypes.c_int32, "type amx"),
        *_fields(ctypes.c_void_p, "data bias"),
        *_fields(ctypes.c_int64, "k n_out"),
    ]


class _Layer(ctypes.Structure):  # specui_layer
    _fields_ = [
        *_fields(ctypes.c_void_p, "ln1 ln2 q_norm k_norm hidden_norm"),
        *_fields(ctypes.c_float, "eps1 eps2 q_eps k_eps scaling hidden_eps"),
        *_fields(ctypes.c_int32, "residual_normed unused"),
        *_fields(_Weight, "qkv o gate_up down"),
    ]


@dataclass
class CallWeight:
    """One matmul's weights as the call reads them: a GGUF block type's bytes, or bf16 rows
    packed by ``packing.pack_bf16`` (``WEIGHT_BF16``, on AMX where ``amx``)."""

    type_id: int
    data: torch.Tensor
    k: int
    n_out: int
    bias: torch.Tensor | None = None
    amx: bool = False


@dataclass
class CallLayer:
    """One decoder layer: its norms, q/k/v and gate/up fused (outputs in that order).

    ``hidden_norm``: the EAGLE family's first layer, whose q/k/v read
    ``[ln1(embedding); hidden_norm(feature)]`` and whose residual stream starts from the feature
    (normed where ``residual_normed``)."""

    ln1: Norm
    ln2: Norm
    q_norm: Norm | None
    k_norm: Norm | None
    scaling: float
    qkv: CallWeight
    o: CallWeight
    gate_up: CallWeight
    down: CallWeight
    hidden_norm: Norm | None = None
    residual_normed: bool = False


def weight_struct(w: CallWeight, bias: int | None = None) -> _Weight:
    """``w`` as the C side reads it (``specui_layer_weight``); ``bias``: the address of a float32
    bias the caller keeps alive.  The caller keeps ``w.data`` alive too."""
    return _Weight(w.type_id, int(w.amx), w.data.data_ptr(), bias, w.k, w.n_out)


class _Head(ctypes.Structure):  # specui_layers_head
    _fields_ = [
        ("norm", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("logits_from", ctypes.c_int32),
        ("w", _Weight),
        *_fields(ctypes.c_void_p, "normed logits d2t tokens"),
        ("kv_only_before", ctypes.c_int64),
    ]


class _Context(ctypes.Structure):  # specui_context_in
    _fields_ = [
        ("w", _Weight),
        ("norm", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("unused", ctypes.c_int32),
        ("features", ctypes.c_void_p),
    ]


@dataclass
class CallHead:
    """A drafter's final norm and LM head, run by the same call after the layers, and the greedy
    pick: each logits row's argmax, mapped to the target vocabulary through ``d2t``."""

    norm: Norm
    weight: CallWeight
    d2t: torch.Tensor | None = None


@dataclass
class CallContext:
    """A drafter's context rows made by the call from the verifier's taps: ``norm(weight taps)``
    (DFlash's projected feature), before the first layer reads them."""

    weight: CallWeight
    norm: Norm


class OneCallLayers:
    """Every layer of ``layers`` as ``specui_decoder_layers`` reads it."""

    def __init__(
        self,
        layers: Sequence[CallLayer],
        heads: int,
        kv_heads: int,
        head_dim: int,
        head: CallHead | None = None,
        context: CallContext | None = None,
    ) -> None:
        self._keep: list[torch.Tensor] = []  # what the C structures point into
        self.table = (_Layer * len(layers))(*(self._layer(layer) for layer in layers))
        self.head = None
        if head is not None:
            d2t = None if head.d2t is None else head.d2t.to(torch.int64).contiguous()
            self._keep.extend([] if d2t is None else [d2t])
            norm, weight = self._ptr(head.norm[0]), self._weight(head.weight)
            d2t_ptr = None if d2t is None else d2t.data_ptr()
            self.head = _Head(norm, head.norm[1], 0, weight, None, None, d2t_ptr, None, 0)
        self.context = None
        if context is not None:
            norm = self._ptr(context.norm[0])
            self.context = _Context(self._weight(context.weight), norm, context.norm[1], 0, None)
        self.context_width = 0 if context is None else context.weight.k
        self.vocab = 0 if head is None else head.weight.n_out
        self._no_taps = torch.full((len(layers) + 1,), -1, dtype=torch.int64)
        self._no_taps_out = torch.empty(1)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.hidden = layers[0].o.n_out
        kernel = load()
        if kernel is None:
            raise RuntimeError("one-call layers: the CPU kernels are not loaded here")
        # layers (the table's address), n_layers, heads, kv_heads, d, h, rows, hidden, cos, ssin,
        # kv, capacity, start, tap_slot, taps, ctx_rows, see_block, feature, head, context
        self._fn = kernel.function("specui_decoder_layers", "pqqqqpqqpppqqppqqppp")

    def _ptr(self, t: torch.Tensor | None) -> int | None:
        if t is None:
            return None
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _weight(self, w: CallWeight) -> _Weight:
        self._keep.append(w.data)
        return weight_struct(w, self._ptr(w.bias))

    def _layer(self, layer: CallLayer) -> _Layer:
        none: Norm = (None, 0.0)  # type: ignore[assignment]
        norms = (layer.ln1, layer.ln2, layer.q_norm or none, layer.k_norm or none)
        hidden_norm = layer.hidden_norm or none
        pointers = [self._ptr(t) for t, _ in (*norms, hidden_norm)]
        epsilons = (*(eps for _, eps in norms), layer.scaling, hidden_norm[1])
        weights = [self._weight(w) for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return _Layer(*pointers, *epsilons, int(layer.residual_normed), 0, *weights)

    def run(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        kv: torch.Tensor,
        start: int,
        taps: Sequence[int] = (),
        *,
        ctx_rows: int = 0,
        see_block: bool = False,
        feature: torch.Tensor | None = None,
        logits_from: int | None = None,
        context_features: torch.Tensor | None = None,
        kv_only_before_logits: bool = False,
    ) -> dict[int | str, torch.Tensor]:
        """Every layer over the rows ``h`` [n, hidden] (float32; the query rows updated in place)
        at cache positions ``start``.. (``cos``/``signed_sin`` [n, (1,) d] their rotary), writing
        their keys and values into ``kv`` [layers, 2, kv_heads, capacity, d].

        ``ctx_rows``: the first rows are context, not queries (their keys and values only, from
        the rows as they are).  Query row i sees positions up to its own, or every row of the call
        with ``see_block``.  ``feature`` [queries, hidden]: the first layer's feature where it has
        a ``hidden_norm``.  ``context_features`` [ctx_rows, taps] (where the call has a context
        projection): the context rows are made from them, not read from ``h``.  Returns the
        query rows' stream after each layer in ``taps`` (1-based), ``{layer: [queries,
        hidden]}``; with ``logits_from`` (where the call has a head) also ``"normed"``
        [queries, hidden], ``"logits"`` of the query rows from that one on and ``"tokens"``,
        their argmax in the target vocabulary.  ``kv_only_before_logits``: the query rows before
        ``logits_from`` are only keys and values in the last layer (rows read later only as
        cache): their stream after it and their ``"normed"`` rows are not computed (NaN)."""
        n = h.shape[0]
        wanted = sorted(t for t in set(taps) if t >= 1)
        if wanted:
            slots = torch.full((len(self.table) + 1,), -1, dtype=torch.int64)
            for s, t in enumerate(wanted):
                slots[t] = s
            out = torch.empty(len(wanted), n - ctx_rows, self.hidden)
        else:  # no taps (a draft): the call writes none, so no buffers a call
            slots, out = self._no_taps, self._no_taps_out
        tensors = (h, kv, cos, signed_sin, *(() if feature is None else (feature,)))
        if not all(t.is_contiguous() and t.dtype == torch.float32 for t in tensors):
            raise ValueError("one-call layers: contiguous float32 rows, rotary tables and cache")
        shape = (len(self.table), self.heads, self.kv_heads, self.head_dim)
        rows = (h.data_ptr(), n, self.hidden, cos.data_ptr(), signed_sin.data_ptr())
        cache = (kv.data_ptr(), kv.shape[3], start, slots.data_ptr(), out.data_ptr())
        drafting = (ctx_rows, int(see_block), None if feature is None else feature.data_ptr())
        head, results = None, {}
        if logits_from is not None:
            if self.head is None:
                raise ValueError("one-call layers: logits asked of a call without a head")
            queries = n - ctx_rows
            results["normed"] = (
                torch.full((queries, self.hidden), float("nan"))
                if kv_only_before_logits and logits_from
                else torch.empty(queries, self.hidden)
            )
            results["logits"] = torch.empty(max(0, queries - logits_from), self.vocab)
            results["tokens"] = torch.empty(max(0, queries - logits_from), dtype=torch.int64)
            self.head.logits_from = logits_from
            self.head.normed = results["normed"].data_ptr()
            self.head.logits = results["logits"].data_ptr()
            self.head.tokens = results["tokens"].data_ptr()
            self.head.kv_only_before = int(kv_only_before_logits)
            head = ctypes.addressof(self.head)
        context = None
        if context_features is not None:
            if self.context is None:
                raise ValueError("one-call layers: context features for a call without a context")
            f = context_features
            shape_needed = (ctx_rows, self.context_width)
            if f.dtype != torch.float32 or not f.is_contiguous() or tuple(f.shape) != shape_needed:
                raise ValueError(
                    f"one-call layers: context features of shape {list(f.shape)}; the call"
                    f" needs contiguous float32 {list(shape_needed)}"
                )
            self.context.features = f.data_ptr()
            context = ctypes.addressof(self.context)
        rc = self._fn(ctypes.addressof(self.table), *shape, *rows, *cache, *drafting, head, context)
        if rc == -1:
            raise MemoryError("one-call layers: no memory for the call's scratch rows")
        if rc != 0:
            raise ValueError(
                f"one-call layers: shapes the kernels do not take ({n} rows at {start})"
            )
        return {t: out[s] for s, t in enumerate(wanted)} | results
