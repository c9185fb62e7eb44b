"""bf16 verification whose logits do not depend on how many tokens come together.

A speculative step verifies ``[last, d_1..d_K]`` in one forward; plain decoding
feeds one token per forward.  Greedy speculation is lossless only if the
verifier gives a token the same logits either way.  On a CPU:

- float32 comes close but not bit for bit (MKL reduces a 1-row and a 9-row
  product in different orders, ~1e-5 apart; an argmax flips only at a near
  tie), and a 9-token verify costs ~2x a 1-token step: at 9 rows the matmuls
  are compute bound.
- a plain bfloat16 model (AVX512-BF16) verifies 9 tokens for ~1.2x a step, but
  rounds every activation to 8 bits, so those last-bit differences become
  whole-ulp ones: greedy decoding flipped on ~1-2% of positions
  (``bench/verify_dtype.py``).

The ``bf16`` precision here takes the bf16 matmuls and keeps everything else
float32 (residual stream, norms, rotary, softmax, logits), then removes the
row-count dependence from the two ops that mix rows of a block:

- linear layers: bf16 weights and inputs, float32-accumulating oneDNN kernels.
  oneDNN picks one kernel for every row count except a single row (its 1-row
  kernel reduces K=1536 in another order), so one row is padded to two.
- attention: each query row attends on its own to exactly the keys it may see.
  A row inside a block then runs the same ops on the same shapes as that token
  decoded alone.  Prefill chunks (more than ``ROWWISE_MAX_ROWS`` rows) use SDPA:
  plain and speculative decoding prefill the same prompt the same way.

Memory: each converted layer keeps only its packed bf16 weight (SmolLM2-135M: 0.55 GiB of
anonymous memory loaded, against 0.80 GiB while the float32 weights stayed beside it;
``bench/verifier_memory.py``).

The ``int8`` precision (opt-in, like llama.cpp's quantized files: it is another model's
logits, close to the float one's) stores each linear weight as int8 with one scale per
output channel and quantizes each input row to int8 on its own scale (``Int8Linear``).
oneDNN's u8s8 kernels then accumulate in int32, and integer sums are exact in any order,
so a row's output cannot depend on the rows beside it: invariant by construction, no
padding needed.  It reads half of bf16's bytes a step (``bench/engine_peer.py``).

The ``gguf`` precision (a GGUF verifier: the embedded one, or a ``.gguf`` file) keeps the file's
own Q8_0 / Q4_0 / Q4_1 blocks (``GGUFLinear``, ``specui.verifier.gguf_weights``) and multiplies
float32 rows by them with SpecUI's kernel, which dequantizes in registers and sums each output in
one fixed order at any row count: invariant by construction, within float32 rounding of the
float32 model (the file dequantized), at a third of int8's bytes for the Q4 layers.

Kernel choice is the machine's, so :func:`check` proves the property on this
machine (a block against the same tokens one at a time, bit for bit) before
``Verifier.load(precision="auto")`` uses the mode.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specui import kernels
from specui.errors import SpecUIError
from specui.kernels import packing
from specui.kernels.packing import Int8Weight, PackedBF16, PackedGGUF

ATTENTION_NAME = "specui_rowwise"
PREFILL_NAME = "specui_prefill"  # whole sequences on the attention kernel (extraction)
ROWWISE_MAX_ROWS = 64  # verify blocks are K+1 <= 33 rows; longer passes are prefills


class BF16Linear(nn.Linear):
    """``nn.Linear`` with bf16 weights whose output rows do not depend on the row count.

    The weight is packed once into oneDNN's blocked layout (``weight_packed``):
    ``F.linear`` on a bf16 weight repacks it on every call, which costs more than
    the product itself for the small row counts of decoding (same kernel, same
    bits, ~1.5x faster).
    """

    weight_packed: torch.Tensor | None = None
    weight_bf16: torch.Tensor | None = None  # only where oneDNN's packed linear is missing
    # specui.kernels' layout, where that kernel runs
    weight_kernel: PackedBF16 | None = None
    bias_f32: torch.Tensor | None = None
    # The most rows the kernel's copy takes; longer blocks (a drafter's prefill) go to oneDNN's.
    kernel_rows: int = sys.maxsize

    @property
    def is_packed(self) -> bool:
        """Its weight lives in a packed copy (oneDNN's or the AMX kernel's), not a plain one."""
        return self.weight_packed is not None or self.weight_kernel is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        n = rows.shape[0]
        # AMX (specui.kernels): a row's sums alike at any row count
        if self.weight_kernel is not None and n <= self.kernel_rows:
            out = kernels.bf16_matmul(rows, self.weight_kernel, self.bias_f32)
            return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])
        if n == 1:  # oneDNN's 1-row kernel sums in another order than its many-row one
            rows = rows.expand(2, -1).contiguous()
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        if self.weight_packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(
                rows, self.weight_packed, bias, "none", [], ""
            )[:n]
        else:
            out = F.linear(rows, self.weight_bf16, bias)[:n]
        return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of float32 ``x`` [n, k] as uint8 (zero point 128) and its float32 scale [n, 1].

    One scale per row, from that row alone: a token's quantized input is the same in a
    block as alone, which a scale over the whole block would break."""
    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp_(min=1e-12)
    return torch.round(x / scale).add_(128).to(torch.uint8), scale


def int8_matmul(xq: tuple[torch.Tensor, torch.Tensor], w: Int8Weight, n: int) -> torch.Tensor:
    """float32 ``[n, out]`` of quantized rows ``xq`` times an ``Int8Linear``'s ``weight_q8``.

    The matmul returns int32 sums times the weight's channel scales
    (``specui.kernels``: its own kernel for a short block, oneDNN's otherwise, the
    same bits); the row scales and the bias come after, one float32 multiply and add per element."""
    q, scale = xq
    # no padded rows: ``n`` keeps the bf16 matmul's signature
    out = kernels.matmul(q, w) * scale
    return out if w.bias is None else out + w.bias


class Int8Linear(nn.Linear):
    """``nn.Linear`` as int8 weights times int8 rows (``int8_matmul``); output rows do not
    depend on the row count.  ``weight_q8``: the packed weight
    (``specui.kernels.packing.Int8Weight``)."""

    weight_q8: Int8Weight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        out = int8_matmul(quantize_rows(rows), self.weight_q8, rows.shape[0])
        return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])


def _fused_bias(linears: list[nn.Linear]) -> torch.Tensor | None:
    """The float32 biases of ``linears`` stacked along their outputs (zeros for one without a
    bias), or None when none has one."""
    if all(m.bias is None for m in linears):
        return None
    return torch.cat(
        [
            torch.zeros(m.out_features) if m.bias is None else m.bias.detach().float()
            for m in linears
        ]
    )


def int8_weight(linears: list[nn.Linear]) -> Int8Weight:
    """``weight_q8`` of ``linears`` stacked along their outputs (one, or q/k/v fused): symmetric
    int8 with one scale per output channel.  A channel's scale is its own row's, so a fused
    product gives each part the bits its own would (the sums are exact integers)."""
    w = torch.cat([m.weight.detach().float() for m in linears])
    scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
    wq = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    bias = _fused_bias(linears)
    return kernels.int8_weight(wq, scale, bias)


@dataclass(frozen=True)
class GGUFWeight:
    """One linear weight as the gguf matmul reads it: the file's blocks, and a float32 bias or
    None."""

    packed: PackedGGUF
    bias: torch.Tensor | None

    @property
    def out_features(self) -> int:
        return self.packed.out_features


def gguf_matmul(x: torch.Tensor, w: GGUFWeight, n: int) -> torch.Tensor:
    """float32 ``[n, out]`` of float32 rows ``x`` times a GGUF weight (no padded rows: ``n``
    keeps the bf16 matmul's signature), plus its bias."""
    out = kernels.gguf_matmul(x, w.packed)
    return out if w.bias is None else out.add_(w.bias)


class GGUFLinear(nn.Linear):
    """``nn.Linear`` on a GGUF file's own blocks (``weight_gguf``); output rows do not depend on
    the row count."""

    weight_gguf: GGUFWeight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        out = gguf_matmul(rows, self.weight_gguf, rows.shape[0])
        return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])


def _gguf_weight(parts: list[nn.Linear], packed: PackedGGUF) -> GGUFWeight:
    bias = _fused_bias(parts)
    return GGUFWeight(packed, bias)


def _to_gguf(model: nn.Module, blocks: dict[str, PackedGGUF]) -> list[nn.Linear]:
    """Switch the modules ``blocks`` names to :class:`GGUFLinear`; per decoder layer also q/k/v
    and gate/up as one matmul each (``qkv_gguf`` / ``gate_up_gguf``, read by
    ``specui.verifier.decoder``): every call costs a few microseconds before any arithmetic."""
    names_of = {id(m): n for n, m in model.named_modules()}
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        for owner, names, attr in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj"), "qkv_gguf"),
            (layer.mlp, ("gate_proj", "up_proj"), "gate_up_gguf"),
        ):
            parts = [getattr(owner, n) for n in names]
            fused = packing.cat_gguf([blocks[names_of[id(m)]] for m in parts])
            if fused is not None:
                setattr(owner, attr, _gguf_weight(parts, fused))
    linears = []
    for name, packed in blocks.items():
        m = model.get_submodule(name)
        m.weight_gguf = _gguf_weight([m], packed)
        m.__class__ = GGUFLinear
        linears.append(m)
    return linears


def to_int8_linear(m: nn.Linear) -> None:
    """Switch one ``nn.Linear`` to :class:`Int8Linear` in place."""
    m.weight_q8 = int8_weight([m])
    m.__class__ = Int8Linear


def _fuse_int8_layers(model: nn.Module) -> None:
    """Per decoder layer, q/k/v and gate/up as one int8 matmul each (``specui.verifier.decoder``
    reads ``qkv_q8`` / ``gate_up_q8``): a oneDNN call costs ~30 us before any arithmetic, and a
    step makes 211 of them (``bench/step_profile.py``)."""
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
        if all(isinstance(m, nn.Linear) for m in parts):
            attn.qkv_q8 = int8_weight(parts)
        parts = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj")]
        if all(isinstance(m, nn.Linear) for m in parts):
            mlp.gate_up_q8 = int8_weight(parts)


def to_bf16_linear(m: nn.Linear, kernel_rows: int = 0) -> None:
    """Switch one ``nn.Linear`` to :class:`BF16Linear` in place (its float32 ``weight`` is kept).

    ``kernel_rows``: without AMX, blocks of up to that many rows go to the AVX512-BF16 kernel
    where it runs (a second, kernel-layout copy of the weight); 0 keeps them all on oneDNN."""
    weight = m.weight.detach().to(torch.bfloat16)
    if kernels.amx_available():  # AMX: the kernel's copy only, for every row count
        m.weight_kernel = packing.pack_bf16(weight)
        m.bias_f32 = None if m.bias is None else m.bias.detach().float().contiguous()
        m.__class__ = BF16Linear
        return
    try:
        m.weight_packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2)
    except (AttributeError, RuntimeError):  # a torch without oneDNN's packed linear: plain F.linear
        m.weight_packed = None
        m.register_buffer("weight_bf16", weight, persistent=False)
    if kernel_rows > 0 and m.weight_packed is not None and kernels.bf16_kernel_available():
        m.weight_kernel = packing.pack_bf16(weight)
        m.bias_f32 = None if m.bias is None else m.bias.detach().float().contiguous()
        m.kernel_rows = kernel_rows
    m.__class__ = BF16Linear


def _free_float_weight(m: BF16Linear | Int8Linear | GGUFLinear) -> None:
    """Drop a converted layer's float32 weight: only the copy the forward reads stays.

    Where the weight is packed, ``weight`` becomes a bf16 (int8) tensor on the meta device
    (its shape, no memory), so the model costs 2 (1) bytes a weight, not float32's 4 plus a copy.
    """
    if isinstance(m, Int8Linear | GGUFLinear) or m.is_packed:
        dtype = {Int8Linear: torch.int8, GGUFLinear: torch.uint8}.get(type(m), torch.bfloat16)
        placeholder = torch.empty(m.weight.shape, dtype=dtype, device="meta")
        m.weight = nn.Parameter(placeholder, requires_grad=False)
    else:
        m.weight = nn.Parameter(m.weight_bf16, requires_grad=False)


def bf16_matmuls(module: nn.Module, kernel_rows: int = 0) -> list[BF16Linear]:
    """Switch every ``nn.Linear`` of ``module`` to :class:`BF16Linear`; returns them.

    Also what a drafter runs in beside a bf16 verifier: drafting need not be
    lossless (the verifier decides), and its small matmuls are memory bound
    (``kernel_rows``: see :func:`to_bf16_linear`).
    """
    linears = [m for m in module.modules() if type(m) is nn.Linear]
    for m in linears:
        to_bf16_linear(m, kernel_rows)
    return linears


def rowwise_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Causal attention of one sequence, one query row at a time (transformers' attention
    signature).

    ``query`` [1, heads, q, d] holds the last ``q`` positions of ``key``/``value``
    [1, kv_heads, L, d]; row ``i`` sees keys ``0 .. L-q+i``.
    """
    q = query.shape[2]
    if query.shape[0] != 1 or q > ROWWISE_MAX_ROWS:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    length = key.shape[2]
    heads, d = query.shape[1], query.shape[3]
    # all rows in one call, each on its own
    if kernels.attention_supported(heads, key.shape[1], d):
        keys, values = key[0].contiguous(), value[0].contiguous()
        scale = scaling if scaling is not None else d**-0.5
        out = kernels.attention(query[0].transpose(0, 1), keys, values, length - q, scale)
        return out.view(1, q, heads, d), None
    # one SDPA call per row: shapes (so kernels and sums) depend on the row's position only
    rows = [
        F.scaled_dot_product_attention(
            query[:, :, i : i + 1],
            key[:, :, : length - q + i + 1],
            value[:, :, : length - q + i + 1],
            scale=scaling,
            enable_gqa=True,
        )
        for i in range(q)
    ]
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None


def prefill_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Causal attention of whole right-padded sequences (no cache, no mask: ``taps_batch``) on
    the attention kernel, one batch row at a time (transformers' attention signature).

    SDPA's flash path on this CPU runs a 1,500-token prefill's attention at ~25 G multiply-adds a
    second, half of an extraction's time; the kernel's causal rows take 40-60% of that.  A row's
    padding follows its real tokens, so causality alone keeps it out of them.  Anything else
    (a mask, a cache, a shape the kernel does not take, another device) goes to SDPA.
    """
    n, heads, q, d = query.shape
    if (
        attention_mask is not None
        or key.shape[2] != q
        or query.device.type != "cpu"
        or not kernels.attention_supported(heads, key.shape[1], d)
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    scale = scaling if scaling is not None else d**-0.5
    out = torch.empty(n, q, heads, d, dtype=query.dtype)
    for b in range(n):
        keys, values = key[b].float().contiguous(), value[b].float().contiguous()
        rows = kernels.attention(query[b].transpose(0, 1).float(), keys, values, 0, scale)
        out[b] = rows.view(q, heads, d)
    return out, None


@contextlib.contextmanager
def prefill_on_kernel(model) -> Iterator[None]:
    """Whole-sequence forwards of an SDPA model (``Verifier.taps_batch``) with their attention
    on :func:`prefill_attention`; SDPA again after.  Other attention (the batch-invariant
    rowwise one) is left alone."""
    if model.config._attn_implementation != "sdpa" or kernels.load() is None:
        yield
        return
    _register_attention()
    model.set_attn_implementation(PREFILL_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")


@functools.cache  # once a process: taps_batch enters prefill_on_kernel for every batch
def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, rowwise_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # the SDPA fallback's mask
    AttentionInterface.register(PREFILL_NAME, prefill_attention)
    AttentionMaskInterface.register(PREFILL_NAME, sdpa_mask)  # None where causality suffices


# The two ways a GGUF file's own blocks verify: times float32 rows (``gguf``: the float model
# within float32 rounding) or times rows made int8 per block of 32 (``gguf-q8``: llama.cpp's
# arithmetic, at the integer dot product's rate; docs/decoding.md has its fidelity).
GGUF_ROWS = {"gguf": "float", "gguf-q8": "int8"}


def unsupported_reason(config, weights: str = "bf16") -> str | None:
    """Why this mode (``weights``: bf16, int8, gguf or gguf-q8) would be wrong (or slow) for
    this architecture on this machine, or None."""
    if weights in GGUF_ROWS and not kernels.gguf_available():
        return f"SpecUI's gguf matmul, which does not run here ({kernels.status()})"
    if weights == "bf16" and (
        not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    ):
        return "this CPU has no fast bf16 matmuls (oneDNN needs AVX-512 or AMX)"
    if weights == "int8" and not _has_int8_kernels():
        return "this torch has no oneDNN int8 linear (onednn::qlinear_pointwise)"
    if getattr(config, "sliding_window", None) or "sliding_attention" in (
        getattr(config, "layer_types", None) or []
    ):
        return "sliding-window attention"
    if getattr(config, "attn_logit_softcapping", None):
        return "attention logit soft-capping"
    return None


def _has_int8_kernels() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")
    except (AttributeError, RuntimeError):
        return False


def enable(model: nn.Module, weights: str = "bf16", gguf: Path | None = None) -> None:
    """Switch a float32 causal LM to batch-invariant verification, in place: every linear
    layer computes in ``weights`` (bf16, or int8 times int8 rows, or ``gguf``: the blocks of the
    GGUF file ``gguf`` the model was loaded from, times float32 rows, or ``gguf-q8``: the same
    blocks times rows made int8 per block of 32).  A GGUF file whose blocks
    the kernel cannot read raises ``SpecUIError`` before the model is changed.

    The input embeddings stay float32 (and so does a head tied to them: drafters
    borrow both).
    """
    reason = unsupported_reason(model.config, weights)
    if reason is not None:
        raise SpecUIError(f"{weights} verification does not support {reason}; use precision fp32")
    borrowed = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    if weights in GGUF_ROWS:
        from specui.verifier.gguf_weights import read_blocks

        if gguf is None:
            raise SpecUIError(f"{weights} verification needs the GGUF file the model came from")
        linears = _to_gguf(model, read_blocks(gguf, model, rows=GGUF_ROWS[weights]))
    elif weights == "int8":
        _fuse_int8_layers(model)  # from the float32 weights, before they go
        linears = [m for m in model.modules() if type(m) is nn.Linear]
        for m in linears:
            to_int8_linear(m)
    else:
        linears = bf16_matmuls(model)
    for m in linears:
        # drafters read the borrowed float32 ones; nobody reads the rest
        if id(m.weight) not in borrowed:
            _free_float_weight(m)
    _register_attention()
    model.set_attn_implementation(ATTENTION_NAME)


@torch.inference_mode()
def check(verifier, block: int = 9, context: int = 24) -> bool:
    """True when a ``block``-token verify gives bit-identical logits and taps to
    the same tokens fed one at a time, after the same cached context."""
    # Above the low ids (special tokens in the verifiers SpecUI loads) where the vocabulary
    # has more; a tiny one (under 100 tokens) draws from all of it.
    low = 100 if verifier.vocab_size > 100 else 0
    ids = torch.randint(
        low, verifier.vocab_size, (context + block,), generator=torch.Generator().manual_seed(0)
    )
    layers = list(range(verifier.num_layers + 1))
    cache = verifier.new_cache()
    verifier.forward(ids[:context], cache, logits=False)
    together = verifier.forward(ids[context:], cache, aux_layer_ids=layers)
    cache = verifier.new_cache()
    verifier.forward(ids[:context], cache, logits=False)
    alone = [
        verifier.forward(ids[t : t + 1], cache, aux_layer_ids=layers)
        for t in range(context, context + block)
    ]
    return torch.equal(together.logits, torch.cat([o.logits for o in alone])) and torch.equal(
        together.aux_hidden, torch.cat([o.aux_hidden for o in alone])
    )
