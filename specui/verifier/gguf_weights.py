"""A GGUF verifier's own quantized blocks, matched to the linear layers of the model loaded from it.

``Verifier.load(spec, precision="gguf")`` first loads the model as every precision does (the file
dequantized to float32 through transformers: the architecture, the norms, the float32 embedding
drafters borrow), then :func:`read_blocks` reads the file again with ``gguf.GGUFReader`` and gives
each decoder linear layer and the LM head the tensor's raw blocks, packed for
``specui.kernels.gguf_matmul``: the file's quantized values and scales, not a
re-quantization.

Two things make a file tensor and a model weight differ in layout, not in values:

- llama.cpp's converter permutes the rows of a Llama model's q and k weights (its rotary
  convention); transformers permutes them back.  Rows are whole runs of blocks, so moving the
  rows moves blocks and changes no value.
- a tied LM head has no tensor of its own: it is ``token_embd``.

Which layout a tensor has is not guessed: for each tensor the permutation (none, or Llama's) whose
dequantized first rows equal the loaded float32 weight bit for bit is the one used, and a tensor
that matches neither stops the load (a file and model that do not belong together).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specui.errors import SpecUIError
from specui.kernels.packing import (
    GGUF_BLOCK_BYTES,
    GGUF_TYPES,
    PackedGGUF,
    dequantize_gguf,
    pack_gguf,
)

# llama.cpp's tensor names -> the transformers module names (Llama / Qwen2 / Qwen3 families).
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
OTHER_PRECISIONS = "fp32, bf16 or int8 (which dequantize the file first)"
CHECK_ROWS = (
    16  # rows of each tensor compared with the loaded weight (cheap; a wrong match shows at once)
)


def llama_rows(out_features: int, heads: int) -> torch.Tensor:
    """The file row that holds each model row of a q (k) weight llama.cpp's converter permuted:
    per head, the file interleaves the two rotary halves' rows, the model keeps them apart."""
    half = out_features // heads // 2
    return torch.arange(out_features).view(heads, half, 2).transpose(1, 2).reshape(-1)


def _raw(tensor) -> tuple[torch.Tensor, int]:
    """A reader tensor's bytes ``[rows, bytes a row]`` (uint8, a copy) and its inputs per row."""
    k = int(tensor.shape[0])  # GGUF lists the innermost dimension first
    data = torch.from_numpy(tensor.data.copy()).view(torch.uint8)
    return data.reshape(int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1, -1), k


def read_blocks(path: Path, model: nn.Module, rows: str = "float") -> dict[str, PackedGGUF]:
    """``{module name: packed blocks}`` for every decoder linear layer and the LM head of ``model``
    (loaded from ``path``).  Raises ``SpecUIError`` naming the tensor and its type where the file
    holds a type the gguf kernel does not read, and where a tensor is not the loaded weight."""
    try:
        import gguf
    except ImportError:  # installed with transformers' GGUF support
        raise SpecUIError(
            "the gguf precision reads GGUF files with the gguf package: pip install gguf"
        ) from None
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise SpecUIError(f"cannot read GGUF file {path}: {e}") from None
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    wanted: dict[
        str, tuple[str, nn.Module, int | None]
    ] = {}  # module name -> (tensor name, module, heads)
    for i in range(cfg.num_hidden_layers):
        for short, module_name in LAYER_TENSORS.items():
            heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(
                short
            )
            name = f"model.layers.{i}.{module_name}"
            wanted[name] = (f"blk.{i}.{short}.weight", model.get_submodule(name), heads)
    head_tensor = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    wanted["lm_head"] = (head_tensor, model.get_output_embeddings(), None)
    missing = [t for t, _, _ in wanted.values() if t not in tensors]
    if missing:
        raise SpecUIError(
            f"{path.name} has no tensor {missing[0]} (the gguf precision reads a Llama-layout GGUF)"
        )
    odd = sorted(
        {
            (tensors[t].tensor_type.name, t)
            for t, _, _ in wanted.values()
            if tensors[t].tensor_type.name not in GGUF_TYPES
        }
    )
    if odd:
        kinds = sorted({kind for kind, _ in odd})
        raise SpecUIError(
            f"{path.name} holds {', '.join(kinds)} tensors (e.g. {odd[0][1]}); the gguf precision"
            f" reads {', '.join(GGUF_TYPES)} blocks only. Load this file with --precision"
            f" {OTHER_PRECISIONS}"
        )
    packed = {}
    for module_name, (tensor_name, module, heads) in wanted.items():
        t = tensors[tensor_name]
        kind = t.tensor_type.name
        raw, k = _raw(t)
        if (
            raw.shape != (module.out_features, k // 32 * GGUF_BLOCK_BYTES[kind])
            or k != module.in_features
        ):
            raise SpecUIError(
                f"{path.name}: {tensor_name} is {k} x {raw.shape[0]}, "
                f"the model's {module_name} {module.in_features} x {module.out_features}"
            )
        raw = _matching_rows(
            raw, kind, k, module.weight.detach(), heads, f"{path.name}: {tensor_name}"
        )
        packed[module_name] = pack_gguf(raw, kind, k, rows)
    return packed


def _matching_rows(
    raw: torch.Tensor, kind: str, k: int, weight: torch.Tensor, heads: int | None, where: str
) -> torch.Tensor:
    """``raw``'s rows in the model's order: as stored, or (q, k weights) un-permuted as
    llama.cpp's converter permuted them, whichever dequantizes to ``weight`` exactly."""
    orders = [None]
    if heads and raw.shape[0] % (2 * heads) == 0:
        orders.append(llama_rows(raw.shape[0], heads))
    for rows in orders:
        first = raw[:CHECK_ROWS] if rows is None else raw[rows[:CHECK_ROWS]]
        if torch.equal(dequantize_gguf(first, kind, k), weight[:CHECK_ROWS].float()):
            return raw if rows is None else raw[rows]
    raise SpecUIError(f"{where} does not hold the weights the model loaded from it")
