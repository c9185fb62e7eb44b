"""Batched greedy generation on the verifier's decoder (self-distillation's responses).

``transformers``' ``generate`` on a left-padded batch spends a CPU's time on things greedy
generation does not need: a KV cache concatenated anew every step, rows that finished
decoding on (the batch is as slow as its longest answer), and bf16 weights repacked for
oneDNN on every call.  :func:`greedy_responses` instead runs the decoder stack as the plain
torch ops of ``specui.verifier.decoder`` (:func:`rms_norm`, :func:`rotate`, the packed
matmuls) over

- weights read once: q/k/v and gate/up concatenated into one matmul each, packed once for
  oneDNN in bf16 (or kept float32 for a float32 run);
- one preallocated KV cache ``[layers, 2, slots, kv_heads, capacity, head_dim]``, a slot per
  row in flight, each with its own length; a decode step writes each row at its own position
  and attends under a per-row length mask;
- continuous batching: a row that ends (EOS or ``max_new_tokens``) hands its slot to the next
  prompt, prefilled into it, so the batch stays full until the prompts run out.

:func:`reference_greedy` is the same generation through transformers: the reference a test
holds this loop to, and the path of models :func:`unsupported_reason` names.  Responses are
cut alike: after the first EOS (kept), or at ``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specui import kernels
from specui.errors import SpecUIError
from specui.verifier.batch_invariant import BF16Linear
from specui.verifier.decoder import (
    architecture_reason,
    bf16_rows,
    packed_matmul,
    packed_weights,
    rms_norm,
    rotate,
    signed_sin,
)

OnDone = Callable[[int, tuple[int, ...]], None]  # (prompt index, response)

PREFILL_ROWS = 512
_linear = torch.ops.mkldnn._linear_pointwise


def _onednn_bf16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class _Proj:
    """Linear layers that read the same input, run as one matmul where their weights allow.

    Plain ``nn.Linear`` weights are concatenated once (and packed for oneDNN in bf16, which
    measured ~15% faster than ``F.linear`` on a bf16 weight at 64 rows, which repacks it
    every call).  A batch-invariant verifier's ``BF16Linear`` no longer holds the float
    weights to concatenate, so its packed ones run one by one.
    """

    def __init__(self, linears: Sequence[nn.Linear], dtype: torch.dtype, rows_hint: int) -> None:
        self.sizes = [m.out_features for m in linears]
        self.parts: list[tuple] | None = None
        self.packed = False
        if all(isinstance(m, BF16Linear) for m in linears):
            self.parts = [packed_weights(m) for m in linears]
            return
        weight = torch.cat([m.weight.detach() for m in linears]).to(dtype).contiguous()
        biases = [m.bias for m in linears]
        self.bias = None
        if any(b is not None for b in biases):
            self.bias = torch.cat(
                [
                    torch.zeros(m.out_features) if m.bias is None else m.bias.detach().float()
                    for m in linears
                ]
            ).to(dtype)
        self.weight = weight
        if dtype == torch.bfloat16 and _onednn_bf16():
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)
            self.packed = True
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's outputs for float32 rows ``x`` [n, in], in the matmul's dtype (bf16 stays
        bf16: the SiLU gate and the residual adds read it as it is, without a float32 copy)."""
        n = x.shape[0]
        if self.parts is not None:
            xb = bf16_rows(x) if self.parts[0][2] is None else x.to(torch.bfloat16)
            return [packed_matmul(xb, w, n) for w in self.parts]
        xd = x.to(self.dtype)
        if self.packed:
            out = _linear(xd, self.weight, self.bias, "none", [], "")
        else:
            out = F.linear(xd, self.weight, self.bias)
        return [out] if len(self.sizes) == 1 else list(out.split(self.sizes, dim=-1))


class _LayerWeights:
    def __init__(self, layer: nn.Module, dtype: torch.dtype, rows_hint: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1 = layer.input_layernorm.weight.detach().float()
        self.eps1 = layer.input_layernorm.variance_epsilon
        self.ln2 = layer.post_attention_layernorm.weight.detach().float()
        self.eps2 = layer.post_attention_layernorm.variance_epsilon
        self.qkv = _Proj([attn.q_proj, attn.k_proj, attn.v_proj], dtype, rows_hint)
        self.o = _Proj([attn.o_proj], dtype, rows_hint)
        self.gate_up = _Proj([mlp.gate_proj, mlp.up_proj], dtype, rows_hint)
        self.down = _Proj([mlp.down_proj], dtype, rows_hint)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.q_norm = (
            None if q_norm is None else (q_norm.weight.detach().float(), q_norm.variance_epsilon)
        )
        self.k_norm = (
            None if k_norm is None else (k_norm.weight.detach().float(), k_norm.variance_epsilon)
        )
        self.scaling = attn.scaling


def unsupported_reason(verifier) -> str | None:
    """Why :class:`BatchedDecoder` cannot run this verifier (:func:`reference_greedy` can), or
    None."""
    model = verifier.model
    reason = architecture_reason(model)
    if reason is not None:
        return reason
    cfg = model.config
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        return "sliding-window attention"
    if getattr(cfg, "attn_logit_softcapping", None):
        return "attention logit soft-capping"
    if next(model.parameters()).device.type != "cpu":
        return "a model not on the CPU"
    linears = [
        m
        for layer in model.model.layers
        for m in (*layer.self_attn.children(), *layer.mlp.children())
        if isinstance(m, nn.Linear)
    ]
    head = model.get_output_embeddings()
    for m in (*linears, head):
        if isinstance(m, BF16Linear):
            if not m.is_packed:
                return "bf16 linear layers without a packed weight"
        elif type(m) is not nn.Linear or m.weight.device.type == "meta":
            return f"{type(m).__name__} layers"
    return None


class BatchedDecoder:
    """The decode loop's weights and KV cache for one verifier, at one compute dtype.

    ``dtype``: what the matmuls run in (float32, or bf16 weights and activations with float32
    accumulation); the residual stream, norms, rotary and softmax stay float32 either way.
    ``kv_dtype``: what the cache stores; float32 (the default) is what
    ``specui.kernels``' row attention reads in place, bf16 halves the cache's memory
    but attends through SDPA.
    """

    def __init__(
        self,
        verifier,
        dtype: torch.dtype = torch.float32,
        slots: int = 64,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        reason = unsupported_reason(verifier)
        if reason is not None:
            raise SpecUIError(f"the batched generator does not support {verifier.name}: {reason}")
        if dtype not in (torch.float32, torch.bfloat16):
            raise SpecUIError(f"generation dtype must be float32 or bfloat16, got {dtype}")
        model, cfg = verifier.model, verifier.config
        self.dtype, self.slots = dtype, slots
        self.kv_dtype = kv_dtype or torch.float32
        self.embed = model.get_input_embeddings().weight.detach()
        self.layers = [_LayerWeights(layer, dtype, slots) for layer in model.model.layers]
        self.head = _Proj([model.get_output_embeddings()], dtype, slots)
        norm = model.model.norm
        self.final_norm = (norm.weight.detach().float(), norm.variance_epsilon)
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_len = verifier.max_context
        pos = torch.arange(self.max_len).unsqueeze(0)
        probe = torch.zeros(1, 1, self.head_dim, dtype=torch.float32)
        cos, sin = model.model.rotary_emb(probe, pos)  # the model's own tables (its bits)
        # [L, 1, d]; sin with rotate_half's signs, as rotate takes it
        self.cos, self.sin = cos[0].float().unsqueeze(1), signed_sin(sin[0].float()).unsqueeze(1)
        self.kv: torch.Tensor | None = None
        # specui.kernels' row attention reads a float32 cache in place.
        self.attention_kernel = self.kv_dtype == torch.float32 and kernels.attention_supported(
            self.heads, self.kv_heads, self.head_dim
        )
        self.prefills = 0  # prompts prefilled so far (tests count slot refills by it)

    def reserve(self, capacity: int) -> None:
        """A cache of ``capacity`` positions a slot (grown, keeping what it holds)."""
        capacity = min(capacity, self.max_len)
        if self.kv is not None and self.kv.shape[4] >= capacity:
            return
        grown = torch.zeros(
            len(self.layers),
            2,
            self.slots,
            self.kv_heads,
            capacity,
            self.head_dim,
            dtype=self.kv_dtype,
        )
        if self.kv is not None:
            grown[:, :, :, :, : self.kv.shape[4]] = self.kv
        self.kv = grown

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed).float()

    def _qkv(self, layer: _LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        n, d = h.shape[0], self.head_dim
        q, k, v = layer.qkv(rms_norm(h, layer.ln1, layer.eps1))
        q = q.view(n, self.heads, d).float()
        k, v = k.view(n, self.kv_heads, d).float(), v.view(n, self.kv_heads, d).float()
        if layer.q_norm is not None:
            q, k = rms_norm(q, *layer.q_norm), rms_norm(k, *layer.k_norm)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def _mlp(self, layer: _LayerWeights, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + layer.o(attn)[0]
        gate, up = layer.gate_up(rms_norm(h, layer.ln2, layer.eps2))
        return h + layer.down(F.silu(gate) * up)[0]

    def _next_tokens(self, last: torch.Tensor) -> torch.Tensor:
        return self.head(rms_norm(last, *self.final_norm))[0].argmax(-1)

    @torch.inference_mode()
    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> list[int]:
        """Prompts into their slots; each one's first response token.

        Prompts go together up to ``PREFILL_ROWS`` rows a pass: their rows share every matmul,
        while much longer passes run slower (activations fall out of the cache: 64 prompts
        in one pass measured half the tokens/s of 16)."""
        firsts: list[int] = []
        group: list[int] = []
        for j, p in enumerate(prompts):
            if group and sum(len(prompts[g]) for g in group) + len(p) > PREFILL_ROWS:
                firsts += self._prefill([slots[g] for g in group], [prompts[g] for g in group])
                group = []
            group.append(j)
        if group:
            firsts += self._prefill([slots[g] for g in group], [prompts[g] for g in group])
        return firsts

    def _prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> list[int]:
        lengths = [len(p) for p in prompts]
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
        pos = torch.cat([torch.arange(n) for n in lengths])
        cos, sin = self.cos[pos], self.sin[pos]
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        h = self._embed(ids)
        kv = self.kv
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, cos, sin)
            outs = []
            for slot, s, n in zip(slots, starts, lengths, strict=True):
                kq, vq = k[s : s + n].transpose(0, 1), v[s : s + n].transpose(0, 1)
                kv[i, 0, slot, :, :n] = kq
                kv[i, 1, slot, :, :n] = vq
                if self.attention_kernel:
                    # The kernel's causal rows over the slot's cache, in place: 1.7x SDPA's
                    # speed at 1,200 positions, 2.6x at 2,000 (SDPA's flash path on this CPU
                    # reaches ~25 G multiply-adds a second there); long prompts' prefill was
                    # half of their generation time.
                    q_rows = q[s : s + n]
                    outs.append(
                        kernels.attention(q_rows, kv[i, 0, slot], kv[i, 1, slot], 0, layer.scaling)
                    )
                    continue
                o = F.scaled_dot_product_attention(
                    q[s : s + n].transpose(0, 1).unsqueeze(0),
                    kq.unsqueeze(0),
                    vq.unsqueeze(0),
                    is_causal=True,
                    scale=layer.scaling,
                    enable_gqa=True,
                )
                outs.append(o[0].transpose(0, 1).reshape(n, -1))
            h = self._mlp(layer, h, torch.cat(outs) if len(outs) > 1 else outs[0])
        self.prefills += len(prompts)
        last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths, strict=True)])
        return self._next_tokens(h[last]).tolist()

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """One token for each of slots ``0..B-1``: ``tokens`` [B] go in at positions ``lengths``
        [B] (each slot's cached length); returns the next tokens [B]."""
        b = tokens.shape[0]
        rows = torch.arange(b)
        end = int(lengths.max()) + 1
        # A slot sees its own positions only: the rest of its row of the cache is another
        # prompt's leftovers (or zeros).
        mask = (torch.arange(end) <= lengths[:, None]).view(b, 1, 1, end)
        starts = lengths.tolist() if self.attention_kernel else None
        cos, sin = self.cos[lengths], self.sin[lengths]
        groups, d = self.heads // self.kv_heads, self.head_dim
        h = self._embed(tokens)
        kv = self.kv
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, h, cos, sin)
            kv[i, 0, rows, :, lengths] = k.to(self.kv_dtype)
            kv[i, 1, rows, :, lengths] = v.to(self.kv_dtype)
            if starts is not None:
                # Each row over exactly its own keys: 3x faster than one padded SDPA call at
                # 64 rows of mixed lengths (SmolLM2, ~180 positions each).
                o = kernels.slot_attention(q, kv[i, 0], kv[i, 1], starts, layer.scaling)
            else:
                # One query a row: the heads sharing a kv head are that head's query rows, so no
                # key or value is repeated per head (SDPA's GQA path copies them on the CPU).
                o = F.scaled_dot_product_attention(
                    q.view(b, self.kv_heads, groups, d).to(self.kv_dtype),
                    kv[i, 0, :b, :, :end],
                    kv[i, 1, :b, :, :end],
                    attn_mask=mask,
                    scale=layer.scaling,
                ).float()
            h = self._mlp(layer, h, o.reshape(b, -1))
        return self._next_tokens(h)

    def move(self, src: int, dst: int, length: int) -> None:
        """Slot ``src``'s first ``length`` cached positions into slot ``dst``."""
        self.kv[:, :, dst, :, :length] = self.kv[:, :, src, :, :length]


@dataclass
class _Row:
    index: int  # which prompt
    length: int  # positions in the cache
    response: list[int]


def _finished(row: _Row, eos: set[int], max_new_tokens: int, max_len: int) -> bool:
    return row.response[-1] in eos or len(row.response) >= max_new_tokens or row.length >= max_len


@torch.inference_mode()
def greedy_responses(
    verifier,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    on_done: OnDone,
    slots: int = 64,
    dtype: torch.dtype | None = None,
    decoder: BatchedDecoder | None = None,
) -> None:
    """Greedy responses to token-id ``prompts`` (none empty), continuously batched over
    ``slots`` cache slots: ``on_done(index, response)`` as each prompt finishes (in finishing
    order), its response cut after its first EOS (kept) or at ``max_new_tokens``.

    ``dtype``: the matmuls' dtype (default :func:`default_dtype`); ``decoder``: a
    :class:`BatchedDecoder` to reuse (its weights are packed once).
    """
    total = len(prompts)
    if decoder is None:
        compute = dtype or default_dtype(verifier)
        decoder = BatchedDecoder(verifier, compute, slots=min(slots, max(total, 1)))
    slots = min(slots, decoder.slots)
    too_long = [i for i, p in enumerate(prompts) if len(p) >= decoder.max_len]
    if too_long:
        raise SpecUIError(
            f"prompt(s) {too_long[:5]} leave no room for a response in the verifier's "
            f"{decoder.max_len} positions (cut them with max_prompt_tokens)"
        )
    if total:
        decoder.reserve(max(len(p) for p in prompts) + max_new_tokens)
    eos = set(verifier.eos_token_ids)
    max_len = decoder.max_len
    pending = iter(range(total))
    rows: list[_Row] = []  # rows[s] lives in cache slot s

    def admit(free: list[int]) -> list[int]:
        """Prefill the next prompts into the ``free`` slots; the slots left unfilled."""
        batch = [i for _, i in zip(free, pending, strict=False)]
        if not batch:
            return free
        used = free[: len(batch)]
        firsts = decoder.prefill(used, [prompts[i] for i in batch])
        for slot, i, t in zip(used, batch, firsts, strict=True):
            row = _Row(i, len(prompts[i]), [t])
            if slot == len(rows):
                rows.append(row)
            else:
                rows[slot] = row
        return free[len(batch) :]

    def settle() -> None:
        """Finished rows out, their slots refilled; rows beyond the prompts closed up."""
        while True:
            free = [s for s, r in enumerate(rows) if _finished(r, eos, max_new_tokens, max_len)]
            if not free:
                return
            for s in free:
                on_done(rows[s].index, tuple(rows[s].response))
            left = admit(free)
            # No prompts to refill them with: the last rows move down, so the live slots are
            # always 0..B-1 and a step never computes a row that is over.
            for s in sorted(left, reverse=True):
                last = len(rows) - 1
                if s != last:
                    decoder.move(last, s, rows[last].length)
                    rows[s] = rows[last]
                rows.pop()

    admit(list(range(slots)))
    settle()
    while rows:
        tokens = torch.tensor([r.response[-1] for r in rows])
        lengths = torch.tensor([r.length for r in rows])
        nxt = decoder.step(tokens, lengths).tolist()
        for r, t in zip(rows, nxt, strict=True):
            r.length += 1
            r.response.append(t)
        settle()


def default_dtype(verifier) -> torch.dtype:
    """The matmuls' dtype a verifier generates in unless told: bf16 for a bf16 or batch-invariant
    bf16 verifier, else float32."""
    if getattr(verifier, "precision", "fp32") == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if verifier.dtype == torch.bfloat16 else torch.float32


@torch.inference_mode()
def reference_greedy(
    verifier, prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> list[tuple[int, ...]]:
    """Greedy continuations of a batch of token-id prompts, cut after the first EOS, by
    transformers' ``generate`` on a left-padded batch: the reference :class:`BatchedDecoder` is
    held to, and the path of models it does not cover."""
    eos = sorted(verifier.eos_token_ids)
    tok = verifier.tokenizer
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    pad = pad if pad is not None else (eos[0] if eos else 0)
    width = max(len(p) for p in prompts)
    # Left padding: every prompt ends at the same column, so generated tokens line up.
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    device = next(verifier.model.parameters()).device
    out = verifier.model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad,
        eos_token_id=eos or None,
        # These would otherwise come from generation_config and make "greedy" not greedy.
        temperature=None,
        top_p=None,
        top_k=None,
    )
    responses = []
    for row in out[:, width:].cpu().tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        responses.append(tuple(row[:cut]))
    return responses
