"""A drafter's decoder layers, final norm and head as one call: the one serving path of every
learned drafter, in C (``specui.kernels.layers``) or in torch.

A draft block is 1-9 rows through one to three small layers.  Its matmuls on the bf16 kernel are
about half of a draft; the rest were ~25 torch ops a layer between them (norms, rotary, views,
KV writes, SDPA, SiLU, residual adds), each a few microseconds.  :class:`DraftLayerCall` runs the
layers of a block in one C call instead, on the weights ``LearnedDrafter.matmuls_in_bf16`` packed
(q/k/v and gate/up stacked), over :class:`DraftKV`, every layer's keys and values in one buffer.
:class:`TorchLayerCall` keeps the same contract in torch ops over the model's own modules, where
the C call cannot serve: no kernels here, a GPU, sliding-window layers, a float32 reference run.
A drafter holds one of the two (``LearnedDrafter.call``) and drafts through it alone.

The contract (``run``): rows in cache order, written at ``start``..; a query row sees every
cached key up to its own (causal), or with ``see_block`` all of this call's query rows too; the
first ``ctx_rows`` rows are keys and values only.  What each drafter sends:
- DFlash and DSpark: the new context rows (keys and values only) and the block, which sees all of
  itself (``see_block``);
- EAGLE-3: the new step-0 rows, then one row a sequential step; P-EAGLE: the new depth-0 rows and
  the mask rows, causally in cache order.  Their first layer reads the feature beside the token
  embedding (``hidden_norm``).

What a call reads of a model is ``DraftModel``'s serving surface (``specui.algorithms.base``):
``layers``, ``norm``, ``rotary``, ``config.layer``, ``lm_head``, ``head_module()``,
``context_projection()`` and ``d2t``.

:class:`MarkovChainCall` is DSpark's vanilla Markov head drawn greedily, the block's slots one after
another in one call as well.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from specui import kernels
from specui.algorithms.layers import CacheWrite, DecoderLayer, KVBuffer, RMSNorm, Rotary
from specui.kernels.layers import (
    WEIGHT_BF16,
    CallContext,
    CallHead,
    CallLayer,
    CallWeight,
    OneCallLayers,
    weight_struct,
)
from specui.verifier.decoder import signed_sin


class DraftKV:
    """Every draft layer's keys and values, ``[layers, 2, kv_heads, capacity, d]`` float32 (the
    layout the call writes); capacity doubles when a call needs more."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int) -> None:
        self.data = torch.empty(layers, 2, kv_heads, 0, head_dim)

    def reserve(self, end: int) -> torch.Tensor:
        """The buffer, with room for positions ``0..end-1`` (the ones kept are copied)."""
        have = self.data.shape[3]
        if have < end:
            grown = self.data.new_empty(*self.data.shape[:3], max(2 * end, 64), self.data.shape[4])
            grown[..., :have, :] = self.data
            self.data = grown
        return self.data


def _norm(norm: RMSNorm | None) -> tuple[torch.Tensor, float] | None:
    return None if norm is None else (norm.weight, norm.eps)


def _weight(linear: nn.Module, int8_rows: bool = True) -> CallWeight | None:
    """A linear's kernel copy: its Q8_0 blocks for int8 rows (``weight_q8``, beside a ``gguf-q8``
    verifier; not where ``int8_rows`` is False), bf16 (``BF16Linear.weight_kernel``) or a GGUF
    file's own blocks (``GGUFLinear.weight_gguf``, a gguf verifier's LM head), or None where it
    has none of them."""
    q8 = getattr(linear, "weight_q8", None) if int8_rows else None
    if q8 is not None:
        bias = getattr(linear, "bias_f32", None)
        return CallWeight(q8.type_id, q8.data, q8.k, q8.out_features, bias)
    packed = getattr(linear, "weight_kernel", None)
    if packed is not None:
        amx = kernels.amx_available()
        bias = getattr(linear, "bias_f32", None)
        return CallWeight(WEIGHT_BF16, packed.data, packed.k, packed.out_features, bias, amx)
    gguf = getattr(linear, "weight_gguf", None)
    if gguf is not None:
        g = gguf.packed
        return CallWeight(g.type_id, g.data, g.k, g.out_features, gguf.bias)
    return None


def _layer(layer: DecoderLayer) -> CallLayer | None:
    attn, mlp = layer.self_attn, layer.mlp
    if attn.stacked is None or mlp.stacked is None:
        return None
    weights = [_weight(m) for m in (attn.stacked.first, attn.o_proj, mlp.stacked.first)]
    weights.append(_weight(mlp.down_proj))
    if any(w is None for w in weights):
        return None
    qkv, o, gate_up, down = weights
    assert qkv and o and gate_up and down
    hidden_norm = getattr(layer, "hidden_norm", None)  # the EAGLE family's first layer
    return CallLayer(
        ln1=(layer.input_layernorm.weight, layer.input_layernorm.eps),
        ln2=(layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps),
        q_norm=_norm(attn.q_norm),
        k_norm=_norm(attn.k_norm),
        scaling=attn.head_dim**-0.5,
        qkv=qkv,
        o=o,
        gate_up=gate_up,
        down=down,
        hidden_norm=_norm(hidden_norm),
        residual_normed=bool(getattr(layer, "norm_before_residual", False)),
    )


class DraftCallOut(NamedTuple):
    """What a draft call gives back: the query rows' last-layer output [queries, H], and where
    the call has a head and logits were asked, their final-normed rows, the logits of the rows
    from ``logits_from`` on and those rows' greedy tokens (target ids), else None."""

    hidden: torch.Tensor
    normed: torch.Tensor | None
    logits: torch.Tensor | None
    tokens: torch.Tensor | None


class CallRows(NamedTuple):
    """How a call's rows relate (``LayerCall.run``'s keywords, passed on as one value)."""

    ctx_rows: int
    see_block: bool | Sequence[bool]
    feature: torch.Tensor | None
    logits_from: int | None
    context_features: torch.Tensor | None
    kv_only_before_logits: bool
    window_base: int | None
    tail_from: int | None


class LayerCall:
    """A draft model's layers, final norm and head as one call over its own cache: the contract
    both implementations keep (``DraftLayerCall`` in C, ``TorchLayerCall`` in torch ops)."""

    has_head: bool  # the call gives normed rows, logits and greedy tokens where asked
    has_context: bool  # the call makes context rows from the verifier's taps itself

    def run(
        self,
        h: torch.Tensor,
        positions: torch.Tensor | range,
        start: int,
        *,
        ctx_rows: int = 0,
        see_block: bool | Sequence[bool] = False,
        feature: torch.Tensor | None = None,
        logits_from: int | None = None,
        context_features: torch.Tensor | None = None,
        kv_only_before_logits: bool = False,
        window_base: int | None = None,
        tail_from: int | None = None,
    ) -> DraftCallOut:
        """Rows ``h`` [n, H] at RoPE ``positions`` [n], cached at ``start``..: the first
        ``ctx_rows`` only keys and values (``context_features`` [ctx_rows, taps] where
        ``has_context``: their taps, their rows in ``h`` then only room), the rest queries that
        see every cached key up to their own, and with ``see_block`` (one flag, or one a layer)
        all of the call's query rows.  ``feature``: the EAGLE family's second input of the first
        layer; ``logits_from``: the query rows from which the head runs;
        ``kv_only_before_logits``: the query rows before it are only keys and values in the last
        layer (the C call then leaves their output rows NaN); ``window_base`` and ``tail_from``:
        sliding windows (``TorchLayerCall``)."""
        rows = CallRows(
            ctx_rows,
            see_block,
            feature,
            logits_from,
            context_features,
            kv_only_before_logits,
            window_base,
            tail_from,
        )
        return self._run(h, positions, start, rows)

    def _run(
        self, h: torch.Tensor, positions: torch.Tensor | range, start: int, rows: CallRows
    ) -> DraftCallOut:
        raise NotImplementedError


class DraftLayerCall(LayerCall):
    """A draft model's layers, final norm and LM head as one call, with their cache and rotary
    tables.  Without a kernel copy of the head (``DraftModel.head_module``) the call has none;
    with one of the context projection (``DraftModel.context_projection``) the call makes the
    context rows from the verifier's taps itself."""

    def __init__(self, layers: OneCallLayers, rotary: Rotary, kv: DraftKV) -> None:
        self.layers, self.rotary, self.kv = layers, rotary, kv
        self.has_head = layers.head is not None
        self.has_context = layers.context is not None
        self._cos = self._sin = torch.empty(0, rotary.inv_freq.shape[0] * 2)

    @classmethod
    def build(cls, model: nn.Module, head: nn.Module | None) -> DraftLayerCall | None:
        """The call for ``model`` (its ``layers``, ``norm``, ``rotary`` and ``config.layer``) once
        its matmuls are on the bf16 kernel, or None where the call cannot serve it: no kernel here,
        a sliding window, or widths the kernels do not take."""
        cfg = model.config.layer
        shapes_fit = (
            cfg.hidden_size % 32 == 0
            and cfg.intermediate_size % 32 == 0
            and kernels.attention_supported(
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            )
        )
        windows = any(cfg.window(i) is not None for i in range(cfg.num_hidden_layers))
        if not shapes_fit or windows or not kernels.bf16_kernel_available():
            return None
        described = [_layer(layer) for layer in model.layers]
        if any(layer is None for layer in described):
            return None
        head_weight = None if head is None else _weight(head)
        d2t = getattr(model, "d2t", None)
        final = None if head_weight is None else CallHead(_norm(model.norm), head_weight, d2t)
        context = None
        projection = model.context_projection()
        if projection is not None and (fc := _weight(projection[0])) is not None:
            context = CallContext(fc, _norm(projection[1]))
        heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        layers = OneCallLayers(described, *heads, final, context)  # type: ignore[arg-type]
        kv = DraftKV(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
        return cls(layers, model.rotary, kv)

    def _rotary(self, positions: torch.Tensor | range) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [n, D] of ``positions``, from tables grown as positions need (the
        Rotary module's own values, computed once instead of six ops a call); a ``range`` is a
        slice of the tables, no gather."""
        if isinstance(positions, range):
            end, index = positions[-1] + 1, slice(positions.start, positions.stop, positions.step)
        else:
            end, index = int(positions.max()) + 1, positions
        if end > self._cos.shape[0]:
            cos, sin = self.rotary(torch.arange(max(2 * end, 256)))
            self._cos, self._sin = cos.contiguous(), signed_sin(sin).contiguous()
        return self._cos[index], self._sin[index]

    def _run(
        self, h: torch.Tensor, positions: torch.Tensor | range, start: int, rows: CallRows
    ) -> DraftCallOut:
        """``OneCallLayers.run``; sliding windows are never served here (``build``), so
        ``window_base`` and ``tail_from`` go unread."""
        ctx_rows, see_block, feature = rows.ctx_rows, rows.see_block, rows.feature
        logits_from, kv_only_before_logits = rows.logits_from, rows.kv_only_before_logits
        context_features = rows.context_features
        if not isinstance(see_block, bool):
            if not all(see_block):
                raise ValueError("the C layer call: a block causal in some layers is not served")
            see_block = True
        if h.dim() != 2 or h.dtype != torch.float32 or not h.is_contiguous():
            h = h.reshape(-1, h.shape[-1]).float().contiguous()
        cos, sin = self._rotary(
            positions if isinstance(positions, range) else positions.reshape(-1)
        )
        kv = self.kv.reserve(start + h.shape[0])
        if feature is not None:
            feature = feature.reshape(-1, feature.shape[-1]).float().contiguous()
        out = self.layers.run(
            h,
            cos,
            sin,
            kv,
            start,
            ctx_rows=ctx_rows,
            see_block=see_block,
            feature=feature,
            logits_from=logits_from if self.has_head else None,
            context_features=context_features,
            kv_only_before_logits=kv_only_before_logits and self.has_head,
        )
        if kv_only_before_logits and self.has_head and logits_from:
            h[ctx_rows : ctx_rows + logits_from] = float("nan")  # not computed: never read as out
        return DraftCallOut(h[ctx_rows:], out.get("normed"), out.get("logits"), out.get("tokens"))


class TorchLayerCall(LayerCall):
    """``DraftLayerCall``'s contract in torch ops over the model's own modules (their bf16 kernel
    linears where ``matmuls_in_bf16`` converted them), with a ``KVBuffer`` a layer: where the C
    call cannot serve, and the reference the C call is held to.

    Sliding-window layers are served here.  A windowed layer hides the keys at cache index
    ``<= base - window`` from a query, ``base`` being the query's own index, or ``window_base``
    for the query rows from ``tail_from`` on (DFlash's block measures its window from the
    anchor's context, EAGLE-3's steps from the anchor row); the keys from ``tail_from`` on (a
    block's or a rollout's own rows) are never hidden by a window.
    """

    has_head = True

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.projection = model.context_projection()
        self.has_context = self.projection is not None
        self.kv = [KVBuffer() for _ in model.layers]

    def _run(
        self, h: torch.Tensor, positions: torch.Tensor | range, start: int, rows: CallRows
    ) -> DraftCallOut:
        """The rows before ``logits_from`` are computed in full (``kv_only_before_logits`` is
        the C call's saving; their rows are never read)."""
        ctx_rows, see_block, feature = rows.ctx_rows, rows.see_block, rows.feature
        logits_from, context_features = rows.logits_from, rows.context_features
        window_base, tail_from = rows.window_base, rows.tail_from
        m = self.model
        dev = m.norm.weight.device
        if isinstance(positions, range):
            positions = torch.arange(positions.start, positions.stop, positions.step)
        cos, sin = m.rotary(positions.reshape(-1).to(dev)[None, None])  # [1, 1, n, D]
        h = h.reshape(-1, h.shape[-1]).float()
        q0 = start + ctx_rows
        if ctx_rows:
            if context_features is not None and self.projection is not None:
                linear, norm = self.projection  # the rows are room: made from the taps here
                ctx = norm(linear(context_features.float()))
            else:
                ctx = h[:ctx_rows]
            for layer, buffer in zip(m.layers, self.kv, strict=True):
                # keys and values straight from the context rows, no input norm (the reference)
                k, v = layer.self_attn.key_value(
                    ctx[None, None], cos[..., :ctx_rows, :], sin[..., :ctx_rows, :]
                )
                buffer.write(start, k, v)
        x = h[ctx_rows:][None, None]
        if feature is not None:  # the EAGLE family's first layer splits [embedding; feature]
            x = torch.cat([x, feature.reshape(x.shape[2], -1).float()[None, None]], -1)
        cos, sin = cos[..., ctx_rows:, :], sin[..., ctx_rows:, :]
        for i, (layer, buffer) in enumerate(zip(m.layers, self.kv, strict=True)):
            block = see_block if isinstance(see_block, bool) else see_block[i]
            visible = self._visible(i, q0, x.shape[2], block, window_base, tail_from, dev)
            x, _ = layer(x, cos, sin, visible, past=CacheWrite(buffer, q0))
        hidden = x[0, 0]
        if logits_from is None:
            return DraftCallOut(hidden, None, None, None)
        normed = m.norm(hidden[logits_from:])
        logits = m.lm_head(normed)
        best = logits.argmax(-1)
        d2t = getattr(m, "d2t", None)
        return DraftCallOut(hidden, normed, logits, best if d2t is None else best + d2t[best])

    def _visible(
        self,
        layer_idx: int,
        q0: int,
        n: int,
        see_block: bool,
        window_base: int | None,
        tail_from: int | None,
        device: torch.device,
    ) -> torch.Tensor | None:
        """[1, 1, n, q0 + n]: which cached keys the query rows at ``q0..`` see; None for all."""
        window = self.model.config.layer.window(layer_idx)
        if window is None and see_block:
            return None
        query = torch.arange(q0, q0 + n, device=device)[:, None]
        key = torch.arange(q0 + n, device=device)[None]
        visible = torch.ones(n, q0 + n, dtype=torch.bool, device=device)
        if not see_block:
            visible &= key <= query
        if window is not None:
            base = query
            if tail_from is not None and window_base is not None:
                base = torch.where(query >= tail_from, torch.full_like(query, window_base), query)
            near = key > base - window
            if tail_from is not None:
                near |= key >= tail_from
            visible &= near
        return visible[None, None]


class MarkovChainCall:
    """DSpark's vanilla Markov head, greedy, as one call (``specui_markov_greedy``): slot by slot,
    the base logits plus ``W2 W1[prev]``, their argmax, and that token as the next slot's prev.

    In torch each slot is ~10 small ops around a 1-row matmul of W2 (the draft vocabulary's rows),
    a block's worth of slots one after another: about a third of a DSpark draft.  With a
    confidence head that reads [hidden; W1[prev]] (``confidence_head_with_markov``) the call gives
    each slot's acceptance logit too, from the W1 row it reads anyway."""

    MEMO_ROWS = 1024  # biases remembered, by token id modulo this (32 MiB at 8192 draft tokens)

    def __init__(
        self,
        w1: torch.Tensor,
        w2: CallWeight,
        d2t: torch.Tensor | None,
        confidence: CallWeight | None = None,
    ) -> None:
        kernel = kernels.load()
        if kernel is None:
            raise RuntimeError("Markov chain call: the CPU kernels are not loaded here")
        self.w1 = w1.detach().to(torch.bfloat16).contiguous()  # the rows BF16Linear would round to
        self.w2, self.vocab_size = w2, self.w1.shape[0]
        self._w2 = weight_struct(w2, None if w2.bias is None else w2.bias.data_ptr())
        self.d2t = None if d2t is None else d2t.to(torch.int64).contiguous()
        # Biases remembered by token (the C side's memo): untouched pages cost no memory.
        self.memo = torch.empty(self.MEMO_ROWS, w2.n_out)
        self.memo_token = torch.full((self.MEMO_ROWS,), -1, dtype=torch.int64)
        self.confidence = confidence
        self._conf = (
            None
            if confidence is None
            else weight_struct(
                confidence, None if confidence.bias is None else confidence.bias.data_ptr()
            )
        )
        # base, slots, w1, vocab, w2, d2t, anchor, forced, memo, memo_token, memo_rows, logits,
        # tokens, hidden, hidden_size, conf, conf_out
        self._fn = kernel.function("specui_markov_greedy", "pqpqppqpppqpppqpp")

    @classmethod
    def build(
        cls,
        head: nn.Module | None,
        d2t: torch.Tensor | None,
        confidence: nn.Module | None = None,
    ) -> MarkovChainCall | None:
        """The call for a ``MarkovHead`` whose W2 is on the bf16 kernel, or None: another head
        type (its bias reads the slot's hidden state), no head, or no kernel copy.
        ``confidence``: the linear of a confidence head that reads [hidden; W1[prev]], served
        where it is on the bf16 kernel too."""
        if head is None or getattr(head, "head_type", None) != "vanilla":
            return None
        # The chain reads W1's rows and multiplies by W2 in bf16 (markov.c): their bf16 copies.
        w2 = _weight(head.markov_w2, int8_rows=False)
        if w2 is None or w2.type_id != WEIGHT_BF16:
            return None
        conf = None if confidence is None else _weight(confidence, int8_rows=False)
        if conf is not None and (conf.type_id != WEIGHT_BF16 or conf.n_out != 1):
            conf = None
        return cls(head.markov_w1.weight, w2, d2t, conf)

    def run(
        self,
        base: torch.Tensor,
        anchor: int,
        forced: list[int] | None = None,
        hidden: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Base logits [slots, Vd] (float32) after the anchor token -> (target tokens [slots],
        logits [slots, Vd], confidence logits [slots] or None).  ``forced``: the tokens fed as each
        next slot's prev instead of the drawn ones (teacher forcing, for tests); ``hidden``
        [slots, H]: the slots' rows the confidence head reads (None: no confidence)."""
        base = base.float().contiguous()
        slots = base.shape[0]
        logits = torch.empty(slots, self.w2.n_out)
        tokens = torch.empty(slots, dtype=torch.int64)
        conf = None
        if hidden is not None and self._conf is not None:
            hidden = hidden.float().contiguous()
            if hidden.shape != (slots, self._conf.k - self.w1.shape[1]):
                raise ValueError(
                    f"Markov chain call: hidden rows of shape {list(hidden.shape)} for"
                    f" {slots} slots and a confidence head of {self._conf.k} inputs"
                )
            conf = torch.empty(slots)
        fed = None if forced is None else torch.tensor(forced[:slots], dtype=torch.int64)
        if fed is not None and fed.numel() < slots:
            raise ValueError(f"Markov chain call: {slots} forced tokens needed, got {fed.numel()}")
        rc = self._fn(
            base.data_ptr(),
            slots,
            self.w1.data_ptr(),
            self.vocab_size,
            ctypes.addressof(self._w2),
            None if self.d2t is None else self.d2t.data_ptr(),
            anchor,
            None if fed is None else fed.data_ptr(),
            self.memo.data_ptr(),
            self.memo_token.data_ptr(),
            self.MEMO_ROWS,
            logits.data_ptr(),
            tokens.data_ptr(),
            None if conf is None else hidden.data_ptr(),  # type: ignore[union-attr]
            0 if conf is None else hidden.shape[1],  # type: ignore[union-attr]
            None if conf is None else ctypes.addressof(self._conf),
            None if conf is None else conf.data_ptr(),
        )
        if rc == -2:
            raise ValueError(
                f"Markov chain call: a previous token outside 0..{self.vocab_size - 1}"
            )
        if rc == -3:
            raise ValueError("Markov chain call: a confidence head of another width")
        if rc != 0:
            raise MemoryError("Markov chain call: no memory for its scratch row")
        return tokens, logits, conf
