"""A tiny random verifier for tests that need thousands of generations."""

from __future__ import annotations

import torch


def make_tiny_verifier(
    vocab_size: int = 8, hidden: int = 32, layers: int = 4, seed: int = 0, eos: int | None = None
):
    """A small random Llama, fast enough for thousands of generations."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specui.verifier.model import Verifier

    torch.manual_seed(seed)
    sizes = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden)
    heads = dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    tokens = dict(eos_token_id=eos, bos_token_id=None, pad_token_id=None)
    cfg = LlamaConfig(
        **sizes, num_hidden_layers=layers, **heads, **tokens, tie_word_embeddings=False
    )
    model = LlamaForCausalLM(cfg)
    # Larger weights than the default init, so the distributions are far from uniform.
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return Verifier(model.float(), None, name=f"tiny-v{vocab_size}")
