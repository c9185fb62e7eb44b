"""The gguf verifier's decoder layers in one C call (``specui.kernels.layers``).

A one-token gguf step streams ~60 MB of the file's blocks, about 13 ms at one core's bandwidth,
but took ~27 ms through ``specui.verifier.decoder``'s torch ops (``bench/engine_peer.py
--profile``).  :func:`gguf_layers` describes the decoder's layers to the one call.

It is used only for blocks the row-wise attention serves (up to ``ROWWISE_MAX_ROWS`` rows; longer
prefills keep the torch ops and SDPA), and only where every layer has fused q/k/v and gate/up
blocks (``batch_invariant._to_gguf`` fuses them where the parts share a block type).
"""

from __future__ import annotations

from collections.abc import Sequence

from specui import kernels
from specui.kernels.layers import CallLayer, CallWeight, OneCallLayers
from specui.verifier.batch_invariant import GGUFWeight


def supported(layers: Sequence) -> bool:
    """Whether every layer has the fused gguf blocks the call reads and the kernels load."""
    return kernels.gguf_available() and all(
        isinstance(layer.qkv, GGUFWeight) and isinstance(layer.gate_up, GGUFWeight)
        for layer in layers
    )


def _weight(w: GGUFWeight) -> CallWeight:
    p = w.packed
    return CallWeight(p.type_id, p.data, p.k, p.out_features, w.bias)


def gguf_layers(layers: Sequence, heads: int, kv_heads: int, head_dim: int) -> OneCallLayers:
    """``specui.verifier.decoder._Layer`` objects whose ``qkv`` and ``gate_up`` are fused
    :class:`GGUFWeight` s (see :func:`supported`), as one call."""
    described = [
        CallLayer(
            ln1=(layer.ln1, layer.eps1),
            ln2=(layer.ln2, layer.eps2),
            q_norm=layer.q_norm,
            k_norm=layer.k_norm,
            scaling=layer.scaling,
            qkv=_weight(layer.qkv),
            o=_weight(layer.o),
            gate_up=_weight(layer.gate_up),
            down=_weight(layer.down),
        )
        for layer in layers
    ]
    return OneCallLayers(described, heads, kv_heads, head_dim)
