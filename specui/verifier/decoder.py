"""The verifier's decoder stack as plain torch ops over a preallocated KV cache.

A bf16 batch-invariant verifier (``specui.verifier.batch_invariant``) spends most of a one-token
step outside its matmuls when it runs through transformers' modules: per layer a
``DynamicCache`` concatenation, mask and kwargs plumbing, forward hooks for the taps, and
in every ``BF16Linear`` a cast, a pad and a slice (``bench/engine_peer.py --profile``).
``FastDecoder`` runs the same arithmetic on the same weights without them:

- ``KVBuffer``: keys and values of every layer in one preallocated float32 tensor
  ``[layers, 2, kv_heads, capacity, head_dim]`` grown by doubling; a step writes its rows
  in place, a rejection crops by moving the length back.
- rotary tables for all positions computed once by the model's own rotary module.
- one bf16 (padded) copy of each normed activation feeds every matmul that reads it
  (q, k, v; gate, up), calling oneDNN's packed linear directly.
- the taps are the residual stream as it goes by, not hooks.

It is used only where it computes what the modules would: a Llama / Qwen2 / Qwen3
decoder (default rotary embedding, SiLU MLP) switched to bf16 with the row-wise
attention; ``Verifier.forward`` falls back to transformers otherwise, and
``batch_invariant.check`` proves block and one-token logits bit-identical on this
machine at load, through this path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specui import kernels
from specui.verifier import gguf_layers
from specui.verifier.batch_invariant import (
    ATTENTION_NAME,
    ROWWISE_MAX_ROWS,
    BF16Linear,
    GGUFLinear,
    Int8Linear,
    gguf_matmul,
    int8_matmul,
    quantize_rows,
)

FAMILIES = ("llama", "qwen2", "qwen3")
_linear = torch.ops.mkldnn._linear_pointwise


class KVBuffer:
    """A croppable KV cache in one preallocated tensor (batch size 1).

    ``get_seq_length`` and ``crop`` follow transformers' ``DynamicCache``, so code that
    crops a cache needs to know neither.
    """

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, max_len: int, capacity: int = 512
    ) -> None:
        self.max_len = max_len
        self.length = 0
        self.data = torch.empty(layers, 2, kv_heads, min(capacity, max_len), head_dim)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (negative: drop the last ``-length``)."""
        self.length = max(0, self.length + length if length < 0 else min(length, self.length))

    def reserve(self, length: int) -> None:
        capacity = self.data.shape[3]
        if length <= capacity:
            return
        grown = torch.empty(
            *self.data.shape[:3], min(self.max_len, max(length, 2 * capacity)), self.data.shape[4]
        )
        grown[:, :, :, : self.length] = self.data[:, :, :, : self.length]
        self.data = grown


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm on a float32 stream, op for op (same bits)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """A rotary sin table ``[..., d]`` with rotate_half's signs (the first half negated): what
    :func:`rotate` takes."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [n, heads, d] with cos / signed sin [n, 1, d]."""
    # transformers' apply_rotary_pos_emb, same bits in fewer ops: its cat(-x2, x1) * sin is
    # x.roll(d/2) * cat(-sin1, sin2), as (-a) b == a (-b) exactly.
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


class _Layer:
    """What one decoder layer's forward reads, pulled out of its modules once."""

    def __init__(self, layer: nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.ln2, self.eps2 = (
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.variance_epsilon,
        )
        self.q, self.k, self.v, self.o = (
            packed_weights(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        )
        self.gate, self.up, self.down = (
            packed_weights(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        # int8: q/k/v and gate/up fused (batch_invariant._fuse_int8_layers); bf16 keeps them
        # apart (fused bf16 measured no faster, and the separate ones are transformers' bits).
        # gguf: likewise fused, where the parts share a block type (batch_invariant._to_gguf).
        self.qkv = getattr(attn, "qkv_q8", None) or getattr(attn, "qkv_gguf", None)
        self.gate_up = getattr(mlp, "gate_up_q8", None) or getattr(mlp, "gate_up_gguf", None)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.q_norm = None if q_norm is None else (q_norm.weight, q_norm.variance_epsilon)
        self.k_norm = None if k_norm is None else (k_norm.weight, k_norm.variance_epsilon)
        self.scaling = attn.scaling


def packed_weights(m: nn.Module) -> object:
    """What :func:`packed_matmul` (or the int8 / gguf matmul) reads of a batch-invariant linear."""
    if isinstance(m, Int8Linear):
        return m.weight_q8
    if isinstance(m, GGUFLinear):
        return m.weight_gguf
    bias = None if m.bias is None else m.bias.detach().to(torch.bfloat16)
    return m.weight_packed, bias, m.weight_kernel, m.bias_f32


def packed_matmul(xb: torch.Tensor, w: tuple, n: int) -> torch.Tensor:
    """``BF16Linear`` on an already cast (and, for oneDNN, padded) input: float32 ``[n, out]``."""
    if w[2] is not None:  # AMX, every row count
        return kernels.bf16_matmul(xb, w[2], w[3])
    return _linear(xb, w[0], w[1], "none", [], "")[:n].float()


def bf16_rows(x: torch.Tensor) -> torch.Tensor:
    """Float rows cast for oneDNN's packed bf16 linear (:func:`packed_matmul`)."""
    # One row is padded to two: oneDNN's 1-row kernel sums in another order (BF16Linear).
    return (
        x.to(torch.bfloat16).expand(2, -1).contiguous() if x.shape[0] == 1 else x.to(torch.bfloat16)
    )


def _float_rows(x: torch.Tensor) -> torch.Tensor:
    # The gguf matmul reads float32 rows as they are.
    return x.contiguous()


def _bf16_rows_kernel(x: torch.Tensor) -> torch.Tensor:
    # specui.kernels' bf16 matmul sums a row alike at any row count: no padding.
    return x.to(torch.bfloat16)


def architecture_reason(model: nn.Module) -> str | None:
    """Why this model's layers are not the Llama-style stack these plain ops compute, or None."""
    cfg = model.config
    if cfg.model_type not in FAMILIES:
        return f"model type {cfg.model_type}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"{rope.get('rope_type')} rotary scaling"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    return None


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``FastDecoder`` cannot stand in for this model's modules, or None."""
    reason = architecture_reason(model)
    if reason is not None:
        return reason
    layers = model.model.layers
    linears = [
        m
        for layer in layers
        for m in (*layer.self_attn.children(), *layer.mlp.children())
        if isinstance(m, nn.Linear)
    ]
    head = model.get_output_embeddings()
    if all(isinstance(m, Int8Linear) for m in (*linears, head)):
        return None
    if all(isinstance(m, GGUFLinear) for m in (*linears, head)):
        return None
    if not all(isinstance(m, BF16Linear) and m.is_packed for m in linears):
        return "linear layers not packed for oneDNN or SpecUI's AMX kernel"
    if not isinstance(head, BF16Linear) or not head.is_packed:
        return "an LM head not packed for oneDNN or SpecUI's AMX kernel"
    return None


class FastDecoder:
    """``model``'s forward (bf16, int8 or gguf batch-invariant) over a :class:`KVBuffer`."""

    def __init__(self, model: nn.Module) -> None:
        cfg = model.config
        self.model = model
        # How a normed activation is made ready once for every matmul that reads it, and the matmul.
        head = model.get_output_embeddings()
        if isinstance(head, Int8Linear):
            self.rows, self.mm = quantize_rows, int8_matmul
        elif isinstance(head, GGUFLinear):
            self.rows, self.mm = _float_rows, gguf_matmul
        else:  # on AMX (specui.kernels) unpadded rows, else padded for oneDNN
            kernel = model.get_output_embeddings().weight_kernel is not None
            self.rows, self.mm = (_bf16_rows_kernel if kernel else bf16_rows), packed_matmul
        self.config = cfg
        self.embed = model.get_input_embeddings().weight
        self.head = packed_weights(model.get_output_embeddings())
        self.final_norm = (model.model.norm.weight, model.model.norm.variance_epsilon)
        self.layers = [_Layer(layer) for layer in model.model.layers]
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_len = int(getattr(cfg, "max_position_embeddings", 2048) or 2048)
        self.attention_kernel = kernels.attention_supported(
            self.heads, self.kv_heads, self.head_dim
        )
        # Rotary tables for every position, by the model's own module (its bits).
        pos = torch.arange(self.max_len).unsqueeze(0)
        cos, sin = model.model.rotary_emb(self.embed[:1].unsqueeze(0), pos)
        self.cos, self.signed_sin = (  # [L, 1, d]
            cos[0].unsqueeze(1).contiguous(),
            signed_sin(sin)[0].unsqueeze(1).contiguous(),
        )
        # gguf: every layer of a step or verify block in one C call (specui.verifier.gguf_layers).
        self.gguf_layers = (
            gguf_layers.gguf_layers(self.layers, self.heads, self.kv_heads, self.head_dim)
            if self.mm is gguf_matmul
            and self.attention_kernel
            and gguf_layers.supported(self.layers)
            else None
        )

    def active(self) -> bool:
        """Still the model it was built from (a test may switch its attention back to SDPA)."""
        return self.config._attn_implementation == ATTENTION_NAME

    cache_type = KVBuffer

    def new_cache(self) -> KVBuffer:
        return KVBuffer(len(self.layers), self.kv_heads, self.head_dim, self.max_len)

    @torch.inference_mode()
    def forward(
        self, ids: torch.Tensor, cache: KVBuffer, taps: set[int], keep: int = 0
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Logits ``[rows, V]`` (the last ``keep`` rows, all for 0) and the wanted taps
        ``{layer: [n, H]}``."""
        n, start = ids.shape[0], cache.length
        end = start + n
        cache.reserve(end)
        kv = cache.data
        h = F.embedding(ids, self.embed)  # [n, H] float32
        cos, sin = self.cos[start:end], self.signed_sin[start:end]  # [n, 1, d]
        if self.gguf_layers is not None and n <= ROWWISE_MAX_ROWS:
            # every layer in one C call, which updates F.embedding's fresh rows in place
            h = h.contiguous()
            out = {0: h.clone()} if 0 in taps else {}
            out.update(self.gguf_layers.run(h, cos, sin, kv, start, taps))
        else:
            out = {0: h} if 0 in taps else {}
            h = self._layers(h, cos, sin, kv, start, taps, out)
        cache.length = end
        last = h if keep == 0 else h[-keep:]
        logits = self.mm(self.rows(rms_norm(last, *self.final_norm)), self.head, last.shape[0])
        return logits, out

    def _layers(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: torch.Tensor,
        start: int,
        taps: set[int],
        out: dict[int, torch.Tensor],
    ) -> torch.Tensor:
        """The decoder layers as torch ops between the matmuls: the residual stream after the
        last, with the wanted taps put in ``out``."""
        n = h.shape[0]
        end = start + n
        nh, kvh, d = self.heads, self.kv_heads, self.head_dim
        rows, mm = self.rows, self.mm
        for i, layer in enumerate(self.layers):
            xb = rows(rms_norm(h, layer.ln1, layer.eps1))
            if layer.qkv is not None:
                q, k, v = mm(xb, layer.qkv, n).split((nh * d, kvh * d, kvh * d), dim=-1)
                q, k, v = q.reshape(n, nh, d), k.reshape(n, kvh, d), v.reshape(n, kvh, d)
            else:
                q = mm(xb, layer.q, n).view(n, nh, d)
                k = mm(xb, layer.k, n).view(n, kvh, d)
                v = mm(xb, layer.v, n).view(n, kvh, d)
            if layer.q_norm is not None:
                q = rms_norm(q, *layer.q_norm)
                k = rms_norm(k, *layer.k_norm)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            kv[i, 0, :, start:end] = k.transpose(0, 1)
            kv[i, 1, :, start:end] = v.transpose(0, 1)
            attn = self._attention(q, kv[i, 0, :, :end], kv[i, 1, :, :end], layer.scaling, start)
            h = h + mm(rows(attn), layer.o, n)
            xb = rows(rms_norm(h, layer.ln2, layer.eps2))
            if layer.gate_up is not None:
                gate, up = mm(xb, layer.gate_up, n).chunk(2, dim=-1)
                gated = F.silu(gate) * up
            else:
                gated = F.silu(mm(xb, layer.gate, n)) * mm(xb, layer.up, n)
            h = h + mm(rows(gated), layer.down, n)
            if i + 1 in taps:
                out[i + 1] = h
        return h

    def _attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, start: int
    ) -> torch.Tensor:
        """Causal attention, ``q`` [n, heads, d] after ``start`` cached positions -> [n, heads * d].

        Each query row on its own over exactly the keys it may see (``rowwise_attention``: one
        ``specui.kernels`` call for the block where it runs, else one SDPA call per
        row); a prefill chunk longer than a verify block in one causal SDPA call."""
        n = q.shape[0]
        if n <= ROWWISE_MAX_ROWS and self.attention_kernel:
            return kernels.attention(q, keys, values, start, scale)
        keys, values = keys.unsqueeze(0), values.unsqueeze(0)  # [1, kv_heads, L, d]
        if n > ROWWISE_MAX_ROWS:
            mask = None if start == 0 else torch.ones(n, start + n, dtype=torch.bool).tril(start)
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),
                keys,
                values,
                attn_mask=mask,
                is_causal=start == 0,
                scale=scale,
                enable_gqa=True,
            )
            return o[0].transpose(0, 1).reshape(n, -1)
        rows = [
            F.scaled_dot_product_attention(
                q[r].view(1, -1, 1, q.shape[-1]),
                keys[:, :, : start + r + 1],
                values[:, :, : start + r + 1],
                scale=scale,
                enable_gqa=True,
            )
            for r in range(n)
        ]
        o = rows[0] if n == 1 else torch.cat(rows, dim=2)  # [1, heads, n, d]
        return o[0].transpose(0, 1).reshape(n, -1)
