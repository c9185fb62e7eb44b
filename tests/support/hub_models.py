"""Repositories for the loopback hub (``tests.support.hub_server``): a tiny real model and
a "huge" one that exists only as metadata."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.support.hub_server import Repo, safetensors_header_only
from tests.support.paths import FIXTURES

TEXT = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and the"
    " verifier checks them. Repeat: red green blue, red green blue, one two three."
)


def tiny_tokenizer_files() -> dict[str, bytes]:
    """A byte-level BPE tokenizer of 300 tokens (under the fixture verifier's 512), trained
    here on a few sentences, as transformers saves it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    with tempfile.TemporaryDirectory() as d:
        fast.save_pretrained(d)
        return {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}


def tiny_repo(delay_s: float = 0.0) -> Repo:
    """The speculators fixture verifier (a 6-layer Qwen3 of 0.3 M parameters) with a
    tokenizer: loads and decodes in well under a second."""
    files = {
        name: (FIXTURES / "verifier" / name).read_bytes()
        for name in ("config.json", "generation_config.json", "model.safetensors")
    }
    return Repo({**files, **tiny_tokenizer_files()}, delay_s=delay_s)


HUGE_GB = 140


def huge_repo() -> Repo:
    """A 70 B-parameter model in bf16 (140 GB) as the hub describes it: a config, and a
    safetensors file whose header lists the tensors (the bytes after it are never served)."""
    hidden, layers, vocab = 8192, 80, 128256
    per_layer = 70e9 / layers  # the parameters, spread over the layers' tensors
    tensors = {"model.embed_tokens.weight": ("BF16", [vocab, hidden])}
    rows = int((per_layer - 0) // hidden)
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.weight"] = ("BF16", [rows, hidden])
    head, size = safetensors_header_only(tensors)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
    }
    return Repo(
        {"config.json": json.dumps(config).encode(), "model.safetensors": head},
        listed_sizes={"model.safetensors": size},
    )
