"""Building blocks shared by the learned drafters (DFlash, DSpark, P-EAGLE, EAGLE-3, ...):
RMSNorm, RoPE, the SwiGLU MLP, attention, the decoder
layer, weight init and the draft-vocabulary maps.

Everything computes in float32.  The maths follows the transformers Llama /
Qwen3 decoder exactly (the speculators checkpoints are trained with those
layers), but attention visibility is always an explicit boolean mask built by
the caller, because every drafter has its own unusual pattern (anchored blocks,
depth rollouts, TTT diagonals).

Shape letters used throughout:
  N  batch (1 at inference and for packed training sequences)
  A  independent query groups that share one context (DFlash blocks; else 1)
  Q  queries per group, K keys per group, T shared context keys
  Hq / Hkv  query / key-value heads, G = Hq // Hkv, D head_dim, H hidden size
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specui.algorithms.layer_config import LayerConfig
from specui.errors import SpecUIError

# --- norms, rotary embedding, MLP --------------------------------------------------------


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)``, statistics in float32."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and not torch.is_grad_enabled():
            # Inference: the same formula in one op instead of six (a drafter step runs dozens).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rotary(nn.Module):
    """HF "default" RoPE: ``inv_freq[i] = theta^(-2i/D)``, cos/sin of ``pos * inv_freq`` twice."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # not part of checkpoints

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [...] int -> cos, sin [..., D]."""
        freqs = positions[..., None].float() * self.inv_freq.float()  # [..., D/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [..., D]
        return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, S, D]; cos/sin [..., S, D] (broadcast over heads)."""
    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    return x * cos + rotate_half(x) * sin


def stacked_linear(parts: list[nn.Linear], convert: Callable[[nn.Linear], None]) -> nn.Linear:
    """One ``nn.Linear`` whose outputs are those of ``parts`` side by side (one matmul call
    where there were several), switched by ``convert`` (e.g. to the bf16 kernels)."""
    weight = torch.cat([m.weight.detach().float() for m in parts])
    # made on the meta device and given the stacked tensors: no random init to allocate
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=parts[0].bias is not None, device="meta")
    out.weight = nn.Parameter(weight)
    if out.bias is not None:
        out.bias = nn.Parameter(torch.cat([m.bias.detach().float() for m in parts]))
    convert(out)
    return out.requires_grad_(False)


@dataclass
class Stacked:
    """Inference copies of a layer's weights stacked into one matmul each (``fuse``), held
    outside the module tree so they stay out of checkpoints, ``parameters()`` and training."""

    first: nn.Linear  # q/k/v, or gate/up
    second: nn.Linear | None = None  # k/v (DFlash's context), or none


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LayerConfig) -> None:
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)
        self.stacked: Stacked | None = None

    def fuse(self, convert: Callable[[nn.Linear], None]) -> None:
        """Gate and up as one matmul at inference (see ``Stacked``)."""
        self.stacked = Stacked(stacked_linear([self.gate_proj, self.up_proj], convert))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stacked is not None and not torch.is_grad_enabled():
            gate, up = self.stacked.first(x).chunk(2, -1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# --- attention ---------------------------------------------------------------------------

KV = tuple[torch.Tensor, torch.Tensor]  # (k, v)


class KVBuffer:
    """One layer's cached keys and values, each ``[1, 1, Hkv, capacity, D]``, written in place.

    Inference only.  A drafter keeps its committed positions at the front and writes each step's
    draft rows after them, where the next step overwrites them: no step concatenates the cache
    (``extend_kv`` copies all of it, twice per layer and step).  Capacity doubles when full.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> KV:
        """Put ``k``/``v`` [.., Hkv, S, D] at positions ``start..start+S-1``; returns the keys and
        values of positions ``0..start+S-1`` (views)."""
        heads, n, d = k.shape[-3:]
        end = start + n
        if self.k is None or self.k.shape[-2] < end:
            grown = [k.new_empty(1, 1, heads, max(2 * end, 64), d) for _ in range(2)]
            if self.k is not None and self.v is not None:
                grown[0][..., :start, :] = self.k[..., :start, :]
                grown[1][..., :start, :] = self.v[..., :start, :]
            self.k, self.v = grown
        assert self.v is not None
        self.k[..., start:end, :] = k.reshape(1, 1, heads, n, d)
        self.v[..., start:end, :] = v.reshape(1, 1, heads, n, d)
        return self.k[..., :end, :], self.v[..., :end, :]


@dataclass
class CacheWrite:
    """``past`` for Attention.forward at inference: write this call's keys/values into
    ``buffer`` at ``start`` and attend over positions ``0..start+S-1`` of it."""

    buffer: KVBuffer
    start: int


def extend_kv(past: list[KV] | None, new: list[KV]) -> list[KV]:
    """Per-layer caches with ``new`` appended along the key axis (``past`` None = empty)."""
    if past is None:
        return list(new)
    return [
        (torch.cat([pk, k], -2), torch.cat([pv, v], -2))
        for (pk, pv), (k, v) in zip(past, new, strict=True)
    ]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    ctx: KV | None = None,
    ctx_visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of queries over their own keys plus an optional shared context.

    q        [N, A, Hq, Q, D]   (already rotated)
    k, v     [N, A, Hkv, K, D]  keys of each query group (its own tokens and/or a cache)
    visible  [N|1, A|1, Q, K] bool: True where a query may look at a key
    ctx      (k, v) each [N, Hkv, T, D]: keys every group of a batch row shares
             (DFlash's injected verifier context).  Kept un-expanded over A so
             512 anchors over a 2k-token context cost no copies of it.
    ctx_visible [N|1, A|1, Q, T] bool
    Returns  [N, A, Hq, Q, D].

    GQA without repeat_kv: query head h uses kv head h // G, so queries are
    viewed as [.., Hkv, G*Q, D] against [.., Hkv, K, D].  Scores and softmax are
    float32; masked keys get the most negative float (not -inf) so a row with no
    visible key gives a uniform average instead of NaN (such rows are padding).
    """
    N, A, Hq, Q, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = D**-0.5
    neg = torch.finfo(torch.float32).min
    qg = q.reshape(N, A, Hkv, G * Q, D)
    scores = (qg @ k.transpose(-1, -2)).view(N, A, Hkv, G, Q, -1) * scale  # [N,A,Hkv,G,Q,K]
    scores = scores.float().masked_fill(~visible[:, :, None, None], neg)
    if ctx is not None:
        assert ctx_visible is not None
        ck, cv = ctx
        T = ck.shape[2]
        qc = qg.view(N, A, Hkv, G, Q, D).permute(0, 2, 1, 3, 4, 5).reshape(N, Hkv, A * G * Q, D)
        s_ctx = (qc @ ck.transpose(-1, -2)).view(N, Hkv, A, G, Q, T).permute(
            0, 2, 1, 3, 4, 5
        ) * scale
        s_ctx = s_ctx.float().masked_fill(~ctx_visible[:, :, None, None], neg)
        scores = torch.cat([s_ctx, scores], dim=-1)  # [N,A,Hkv,G,Q,T+K]
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    if ctx is None:
        out = p.reshape(N, A, Hkv, G * Q, -1) @ v  # [N,A,Hkv,G*Q,D]
    else:
        p_ctx, p_own = p[..., :T], p[..., T:]
        out = p_own.reshape(N, A, Hkv, G * Q, -1) @ v
        pc = p_ctx.permute(0, 2, 1, 3, 4, 5).reshape(N, Hkv, A * G * Q, T)
        out_ctx = (pc @ cv).view(N, Hkv, A, G * Q, D).permute(0, 2, 1, 3, 4)
        out = out + out_ctx
    return out.reshape(N, A, Hq, Q, D)


class Attention(nn.Module):
    """GQA self-attention (Llama; Qwen3 adds per-head q_norm/k_norm before RoPE).

    ``in_features`` is H for ordinary layers and 2H for the EAGLE-3 first layer
    (``eagle3/model.py``),
    whose input is ``[embedding; projected verifier feature]``.
    """

    def __init__(self, cfg: LayerConfig, in_features: int, qk_norm: bool) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        b = cfg.attention_bias
        self.q_proj = nn.Linear(in_features, self.n_heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(in_features, self.n_kv * self.head_dim, bias=b)
        self.v_proj = nn.Linear(in_features, self.n_kv * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=b)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.stacked: Stacked | None = None
        self.widths = [self.n_heads * self.head_dim] + [self.n_kv * self.head_dim] * 2

    def fuse(self, convert: Callable[[nn.Linear], None]) -> None:
        """q/k/v as one matmul, and k/v as one (the context's), at inference (``Stacked``)."""
        qkv = [self.q_proj, self.k_proj, self.v_proj]
        self.stacked = Stacked(stacked_linear(qkv, convert), stacked_linear(qkv[1:], convert))

    def _stacked(self, x: torch.Tensor, which: int) -> list[torch.Tensor] | None:
        """The stacked projections of ``x`` (0: q, k, v; 1: k, v), or None to run them apart."""
        if self.stacked is None or torch.is_grad_enabled():
            return None
        if which == 0:
            return list(self.stacked.first(x).split(self.widths, -1))
        assert self.stacked.second is not None
        return list(self.stacked.second(x).split(self.widths[1:], -1))

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """[..., S, n*D] -> [..., n, S, D]"""
        return x.unflatten(-1, (n, self.head_dim)).transpose(-2, -3)

    def query(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        proj: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [..., S, in] -> rotated q [..., Hq, S, D] (``proj``: q_proj(x), when made already)."""
        q = self._heads(self.q_proj(x) if proj is None else proj, self.n_heads)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return apply_rope(q, cos, sin)

    def key_value(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, proj: list | None = None
    ) -> KV:
        """x [..., S, in] -> rotated k, v [..., Hkv, S, D] (what a KV cache stores); ``proj``:
        [k_proj(x), v_proj(x)] when made already (else the stacked ones where fused)."""
        k, v = proj or self._stacked(x, 1) or (self.k_proj(x), self.v_proj(x))
        k = self._heads(k, self.n_kv)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), self._heads(v, self.n_kv)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        visible: torch.Tensor | None,
        past: KV | CacheWrite | None = None,
        ctx: KV | None = None,
        ctx_visible: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KV]:
        """x [N, A, S, in] -> ([N, A, S, H], this call's own (k, v) [N, A, Hkv, S, D]).

        Keys are ``past`` (a cache, [N, A, Hkv, P, D]) followed by the S new
        tokens; ``visible`` is [.., S, P+S].  ``ctx`` is the shared context of `attend`.
        A ``CacheWrite`` past (inference, N = A = 1) holds the cache and the new keys in one
        buffer and attends in one SDPA call; there ``visible`` None means every key.
        """
        proj = self._stacked(x, 0)
        q = self.query(x, cos, sin, None if proj is None else proj[0])
        k, v = self.key_value(x, cos, sin, None if proj is None else proj[1:])
        if isinstance(past, CacheWrite):
            keys, values = past.buffer.write(past.start, k, v)
            mask = None if visible is None else visible.unsqueeze(-3)[0]  # over the query heads
            # 4-D operands: SDPA takes three times as long on 5-D ones (N = A = 1 here)
            out = F.scaled_dot_product_attention(q[0], keys[0], values[0], mask, enable_gqa=True)
            out = out[None]
            return self.o_proj(out.transpose(-2, -3).flatten(-2)), (k, v)
        assert visible is not None
        keys, values = (
            (k, v) if past is None else (torch.cat([past[0], k], -2), torch.cat([past[1], v], -2))
        )
        out = attend(q, keys, values, visible, ctx, ctx_visible)  # [N, A, Hq, S, D]
        out = self.o_proj(out.transpose(-2, -3).flatten(-2))
        return out, (k, v)


# --- decoder layers ----------------------------------------------------------------------


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer: ``h += attn(norm(h)); h += mlp(norm(h))``."""

    def __init__(self, cfg: LayerConfig, qk_norm: bool, in_features: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, in_features or cfg.hidden_size, qk_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def attn_input(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what q/k/v are projected from, the residual stream)."""
        return self.input_layernorm(h), h

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        visible: torch.Tensor | None,
        past: KV | CacheWrite | None = None,
        ctx: KV | None = None,
        ctx_visible: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KV]:
        """h [N, A, S, in] -> (h [N, A, S, H], new (k, v)); see Attention.forward."""
        a, residual = self.attn_input(h)
        out, kv = self.self_attn(a, cos, sin, visible, past, ctx, ctx_visible)
        h = residual + out
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, kv


# --- weights -------------------------------------------------------------------------------


def init_weights(module: nn.Module, std: float) -> None:
    """Fresh drafter weights: Linear/Embedding N(0, std), biases 0, norm gains 1."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)


def project_features(
    x: torch.Tensor, fc: nn.Linear, input_norm: RMSNorm | None, fc_norm: nn.ModuleList | None
) -> torch.Tensor:
    """[..., n_aux*H] -> [..., H]."""
    if input_norm is not None:
        x = input_norm(x)
    if fc_norm is not None:
        x = torch.cat(
            [norm(c) for norm, c in zip(fc_norm, x.chunk(len(fc_norm), dim=-1), strict=True)], -1
        )
    return fc(x)


# --- the draft vocabulary (speculators' d2t / t2d) -----------------------------------------


def register_vocab_map(module: nn.Module, vocab_size: int, draft_vocab_size: int) -> None:
    """Reduced draft vocabulary (``draft_vocab_size < vocab_size``), speculators convention.

    Registers ``d2t`` [Vd] int64 offsets (target id = draft id + d2t[draft id])
    and ``t2d`` [V] bool (which target ids are kept) as buffers saved in
    model.safetensors; with a full vocabulary both are None and not saved.
    """
    reduced = draft_vocab_size != vocab_size
    module.register_buffer(
        "d2t", torch.zeros(draft_vocab_size, dtype=torch.long) if reduced else None
    )
    module.register_buffer("t2d", torch.zeros(vocab_size, dtype=torch.bool) if reduced else None)


@torch.no_grad()
def set_draft_vocab(module: nn.Module, kept_ids: torch.Tensor | list[int]) -> None:
    """Fill ``d2t``/``t2d`` from the target ids the draft vocabulary keeps."""
    kept = torch.as_tensor(kept_ids, dtype=torch.long).unique()  # sorted, unique
    if kept.numel() != module.d2t.numel():
        raise SpecUIError(
            f"draft vocabulary needs {module.d2t.numel()} distinct token ids, got {kept.numel()}"
        )
    if kept.min() < 0 or kept.max() >= module.t2d.numel():
        raise SpecUIError(f"draft vocabulary ids must lie in [0, {module.t2d.numel()})")
    module.d2t.copy_(kept - torch.arange(kept.numel()))
    module.t2d.zero_()
    module.t2d[kept] = True


def draft_target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """[Vd] target-vocabulary id of each draft-vocabulary slot."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def to_target_vocab(
    logits: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int
) -> torch.Tensor:
    """Draft logits [.., Vd] -> target-vocabulary logits [.., V] (-inf where the draft has no
    token)."""
    if d2t is None:
        return logits
    out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    return out.index_copy(-1, draft_target_ids(d2t), logits)


def draft_vocab_rows(weight: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Rows of a [V, H] verifier matrix for the draft vocabulary (all rows when full)."""
    if d2t is None:
        return weight
    return weight[torch.arange(d2t.numel(), device=d2t.device) + d2t.to(weight.device)]
