"""Training with hidden states extracted by vLLM (``TrainConfig.extractor == "vllm"``).

The tests at the top need no server: the option is validated where a user sets
it (config, command line, Train tab).  The last one trains a tiny DFlash
drafter on the embedded SmolLM2 with a real vLLM server from .venv-vllm (one
server start, about 1-2 min on two cores) and skips, like tests/vllm/test_vllm.py,
only when .venv-vllm is missing and CI is unset.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import torch

from specui.cli import main
from specui.errors import SpecUIError
from specui.training.config import TrainConfig
from specui.vllm.watchdog import group_alive
from tests.support.hidden_files import load_matching
from tests.support.vllm_skip import needs_vllm

# The two training runs' schedule: two short steps, logged each step, on one thread.
SHORT = dict(steps=2, batch_size=2, block_size=4, warmup_steps=0, log_every=1, threads=1)

# --- no server needed ---------------------------------------------------------------------


def test_config_refuses_an_unknown_extractor_with_the_choices() -> None:
    with pytest.raises(SpecUIError, match=r"unknown extractor 'triton'; use one of local, vllm"):
        TrainConfig(algorithm="dflash", extractor="triton")
    assert TrainConfig(algorithm="dflash").extractor == "local"


def test_config_refuses_vllm_options_that_cannot_apply(tmp_path: Path) -> None:
    with pytest.raises(
        SpecUIError, match="vLLM's Python .*nope does not exist; run `bash scripts/setup_vllm.sh`"
    ):
        TrainConfig(algorithm="dflash", extractor="vllm", vllm_python=str(tmp_path / "nope"))
    with pytest.raises(SpecUIError, match="apply only with extractor vllm"):
        TrainConfig(algorithm="dflash", vllm_python=sys.executable)
    with pytest.raises(
        SpecUIError, match=r"vllm-gpu-memory-utilization must be in \(0, 1\], got 1.5"
    ):
        TrainConfig(algorithm="dflash", extractor="vllm", vllm_gpu_memory_utilization=1.5)
    # The interpreter is looked up as the server launch does it (here: any existing Python).
    cfg = TrainConfig.from_dict(
        {"algorithm": "dflash", "extractor": "VLLM", "vllm_python": sys.executable}
    )
    assert cfg.extractor == "vllm" and cfg.vllm_python == sys.executable


def test_cli_passes_the_extractor_to_the_config(tmp_path: Path, capsys) -> None:
    code = main(
        ["train", "--algorithm", "dflash", "--out", str(tmp_path / "o"), "--extractor", "onnx"]
    )
    assert code == 2
    assert "unknown extractor 'onnx'; use one of local, vllm" in capsys.readouterr().err
    code = main(
        [
            "train",
            "--algorithm",
            "dflash",
            "--out",
            str(tmp_path / "o"),
            "--extractor",
            "vllm",
            "--vllm-python",
            str(tmp_path / "missing-python"),
        ]
    )
    assert code == 2
    assert "missing-python does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_train_tab_queues_the_extractor_and_refuses_a_missing_vllm(
    tmp_path: Path, monkeypatch
) -> None:
    import gradio as gr

    from specui.store import Store
    from specui.ui import train as train_tab

    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    store = Store(tmp_path / "s.db")
    with gr.Blocks():
        train_tab.build(store)
    args = (store, "dflash", "embedded", "demo", 3, 8, 64, 0, 6e-4)

    monkeypatch.setenv("SPECUI_VLLM_PYTHON", str(tmp_path / "no-vllm" / "python"))
    with pytest.raises(SpecUIError, match="no-vllm/python does not exist"):
        train_tab.start_training(*args, "a", None, "vllm")
    with pytest.raises(SpecUIError, match="unknown extractor"):
        train_tab.start_training(*args, "b", None, "tensorrt")
    assert store.list_jobs() == []

    monkeypatch.setenv("SPECUI_VLLM_PYTHON", sys.executable)
    jid = train_tab.start_training(*args, "c", None, "vllm")
    local = train_tab.start_training(*args, "d", None)
    params = {j.id: j.params for j in store.list_jobs()}
    assert params[jid]["extractor"] == "vllm"
    # as the job builds it
    assert TrainConfig.from_dict({**params[local], "resume": True}).extractor == "local"
    store.close()


def test_offline_local_extraction_fills_the_cache_once(tmp_path: Path, fixture_dir: Path) -> None:
    """The offline path the vLLM extractor shares, with the local one: extract every
    sample first, then train; a second run on the same cache extracts nothing."""
    import json
    import random

    from specui.training.hooks import TrainHooks
    from specui.training.loop import train

    rng = random.Random(0)
    prompts = tmp_path / "prompts.jsonl"
    ids = [[rng.randrange(500) for _ in range(8)] for _ in range(6)]
    prompts.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in ids))
    data = dict(verifier=str(fixture_dir / "verifier"), prompts=str(prompts), max_new_tokens=16)
    offline = dict(extraction="offline", cache_dir=str(tmp_path / "cache"))
    common = dict(algorithm="dflash", aux_layer_ids=[1, 3, 4], **data, **SHORT, **offline)

    def run(out: str) -> list[str]:
        lines: list[str] = []
        cfg = TrainConfig.from_dict({**common, "out": str(tmp_path / out)})
        assert train(cfg, TrainHooks(log=lines.append)).status == "finished"
        return lines

    first = run("a")
    files = {
        p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache" / "hidden").glob("*.safetensors")
    }
    n = len(files)
    assert n >= 2 and any(
        f"extracting hidden states of {n} of {n} samples (offline, local)" in x for x in first
    ), first
    again = run("b")
    assert any(
        f"extracting hidden states of 0 of {n} samples (offline, local)" in x for x in again
    ), again
    assert {
        p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache" / "hidden").glob("*.safetensors")
    } == files
    assert not (tmp_path / "a" / "vllm-extract.log").exists()


# --- a real vLLM server --------------------------------------------------------------------------

SERVER_LINE = re.compile(r"vLLM extraction server on http://[^:]+:(\d+) \(pid (\d+)\)")


def _processes_with(*words: str) -> list[int]:
    """Live processes whose command line holds every word (the server's, its watchdog's)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if state not in ("Z", "X") and all(w in args for w in words):
            out.append(int(p.name))
    return out


@needs_vllm
@pytest.mark.vllm
def test_training_with_vllm_hidden_states_fills_a_cache_local_runs_reuse(
    tmp_path: Path, embedded_verifier
) -> None:

    from specui.data.hidden import LocalExtractor
    from specui.training.data import prepare_samples
    from specui.training.distributed import Dist
    from specui.training.hooks import TrainHooks
    from specui.training.loop import train
    from specui.training.targets import VLLM_LOG

    out = tmp_path / "run"
    gen = dict(
        verifier="embedded", prompts="demo", num_prompts=4, max_new_tokens=16, gen_batch_size=4
    )
    model = dict(layers=1, max_anchors=8, draft_vocab_size=256, mask_token_id=16)
    common = dict(algorithm="dflash", **gen, **model, **SHORT, cache_dir=str(out / "cache"))
    lines: list[str] = []
    alive_at_first_step: list[bool] = []

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        if not alive_at_first_step:
            launched = [m for m in map(SERVER_LINE.search, lines) if m]
            alive_at_first_step.append(bool(launched) and group_alive(int(launched[-1].group(2))))

    t0 = time.monotonic()
    r = train(
        TrainConfig.from_dict({**common, "out": str(out), "extractor": "vllm"}),
        TrainHooks(log=lines.append, progress=progress),
    )
    print(
        f"\nvLLM training run: {time.monotonic() - t0:.0f} s wall; "
        + next((x for x in lines if SERVER_LINE.search(x)), "no server")
    )
    assert r.status == "finished" and r.step == 2 and (out / "model.safetensors").is_file()

    # One server, stopped before the first training step (the default mixed mode ran
    # offline), and nothing of it left: not its process group, not its watchdog.
    launched = [m for m in map(SERVER_LINE.search, lines) if m]
    assert len(launched) == 1, lines
    port, pgid = launched[0].group(1), int(launched[0].group(2))
    assert alive_at_first_step == [False]
    assert not group_alive(pgid)
    assert _processes_with("--port", port, "vllm.entrypoints.openai.api_server") == []
    log = (out / VLLM_LOG).read_text()
    assert "extract_hidden_states" in log and f"--port {port}" in log

    # The files vLLM wrote are the local extractor's for the same samples: same names,
    # tensor names, shapes, dtypes, metadata, tokens and masks; values up to bf16 rounding
    # (the tolerance argued in tests/vllm/test_vllm.py).
    cfg = TrainConfig.from_dict({**common, "out": str(out)})
    # the cached responses
    samples = prepare_samples(cfg, embedded_verifier, out / "cache", Dist(), TrainHooks())
    hidden = out / "cache" / "hidden"
    written = sorted(p.name for p in hidden.glob("*.safetensors"))
    # float32, as vLLM's CPU build computes (the local default on AVX512 is bf16 autocast).
    local_ex = LocalExtractor(embedded_verifier, r.model.config.aux_layer_ids, dtype=torch.float32)
    used = [s for s in samples if (hidden / local_ex.file_name(s)).is_file()]
    assert len(used) >= 2 and sorted(local_ex.file_name(s) for s in used) == written
    for a, b in zip(
        local_ex.extract(used, tmp_path / "local"),
        [hidden / local_ex.file_name(s) for s in used],
        strict=True,
    ):
        ta, tb = load_matching(a, b)
        x, y = ta["hidden_states"].float(), tb["hidden_states"].float()
        assert (x == y).float().mean() > 0.99

    # A later local run on the same cache extracts nothing: every file is reused as is.
    before = {p.name: p.stat().st_mtime_ns for p in hidden.glob("*.safetensors")}
    again: list[str] = []
    r2 = train(
        TrainConfig.from_dict(
            {**common, "out": str(tmp_path / "local-run"), "extraction": "offline"}
        ),
        TrainHooks(log=again.append),
    )
    assert r2.status == "finished"
    assert {p.name: p.stat().st_mtime_ns for p in hidden.glob("*.safetensors")} == before
    assert any(
        f"extracting hidden states of 0 of {len(used)} samples (offline, local)" in line
        for line in again
    ), again
    assert not any(SERVER_LINE.search(line) for line in again)
