"""Every bench under bench/ runs, in its quickest mode, so a move of modules cannot break one
unseen (a bench is run by hand, for its numbers; this only checks it still runs to the end).

Two tiers.  The default suite starts every bench (``--help``: its module-level imports, its
flags), a minute in all.  The quickest-mode runs are marked ``bench``, which the default suite
leaves out (``pyproject.toml``'s addopts): they take 10-15 minutes on a quiet 2-core machine and
several of them time things on a shared one, which a CI run must not depend on.  Run them with
``make test-benches`` (``pytest -m bench tests/test_benches.py``) after moving modules.

The sizes below are the smallest each bench takes: the numbers they print mean nothing.  A
bench that needs what this machine may not have (llama.cpp's virtualenv, vLLM) is skipped with
the reason; everything else runs.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.vllm_skip import vllm_missing

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
LLAMACPP_PYTHON = REPO / ".venv-llamacpp" / "bin" / "python"

# bench file -> its quickest command line (after the file name); {tmp} is a scratch folder,
# {python} this interpreter.
QUICK: dict[str, str] = {
    # a sample scores only past the block: 24-token responses
    "confidence_probe.py": "--train-samples 4 --heldout-prompts 2 --max-new-tokens 24 "
    "--cache-dir '{tmp}' --l2 1e-2",
    "decode.py": "--repeats 1 --max-new-tokens 4 --drafter ngram",
    "drafter_memory.py": "",  # the four shipped drafters, once each: its smallest size
    "draft_cost.py": "--repeats 1 --context 8 --algorithms dflash",
    "draft_int8.py": "--prompts 1 --max-new-tokens 4 --algorithms dflash",
    "engine_peer.py": "--prompts 1 --max-new-tokens 4 --drafters none "
    "--llamacpp-modes plain --step-repeats 1 --precisions auto",
    "generation.py": "--prompts 2 --max-new-tokens 4 --batch-size 2 --engines fast",
    "generator_throughput.py": "--prompts 2 --batch-sizes 2 --max-new-tokens 4",
    "gguf_fidelity.py": "--prompts 1 --max-new-tokens 4 --precisions bf16,gguf",
    "gguf_layers.py": "--repeats 1 --context 8",
    "gguf_paths.py": "--rows 1 --repeats 1",
    "hidden_store.py": "--samples 2 --algorithms dflash",
    "hybrid_ceiling.py": "--limit 1 --max-new-tokens 4 --lookup ngram --learned dflash",
    "k_sweep.py": "--drafter dflash --ks 2 --prompts 1 --tokens 4",
    # run through engine_peer.py (it needs a GGUF and a driver)
    "llamacpp_worker.py": "",
    "load_test.py": "--sessions 1 --duration 3 --max-new-tokens 4 --warmup 0",
    # the newcomer's race once, after the first round (it waits for the lanes, not "decoding")
    "newcomer.py": "--repeats 1 --modes race",
    "ngram_settings.py": "--limit 1 --max-new-tokens 4 --settings 3:1 --db '{tmp}/b.db'",
    "pending_load.py": "--pending-s 1 --repeats 1 --max-new-tokens 4",
    "pipeline_throughput.py": "--smoke --stages train --algorithms dflash",
    "policy_steps.py": "--limit 1 --max-new-tokens 4 --drafter dflash",
    "prefetch.py": "--repeats 1 --context 8",
    # the app in this interpreter, not the Space's requirements-only virtualenv
    "soak.py": "--minutes 0.1 --sessions 1 --warmup-minutes 0 "
    "--churn 1 --max-new-tokens 4 --sample-s 2 --python '{python}'",
    "speedup_model.py": "--threads 1 --repeats 1 --context 8 --ks 3 "
    "--draft-k 3 --vocabs 4096 --algorithms dflash --layers dflash:1",
    "step_compile.py": "--repeats 1 --context 8",
    "step_profile.py": "--steps 1 --context 8 --rows 2",
    "store_bench.py": "--steps 50 --runs 2 --per-prompt 5",
    "template_gap.py": "--drafter dflash --prompts 1 --tokens 4",
    "train_memory.py": "--num-prompts 1 --max-new-tokens 8 --block-size 4 --layers 1 --anchors 4",
    # long enough for the page to show "decoding" before "done" (4 tokens finish first)
    "ui_latency.py": "--repeats 1 --max-new-tokens 48",
    "verifier_memory.py": "--drafters dflash",
    "verify_curve.py": "--precisions gguf --max-rows 2 --context 8 --repeats 1",
    "verify_dtype.py": "--prompts 1 --tokens 4 --block 2 --repeats 1",
    "verify_profile.py": "--precisions gguf --rows 1 --context 8 "
    "--attention-contexts 8 --repeats 1",
    "vllm_vs_local.py": "--speculator ngram --limit 1 --max-new-tokens 4 --db '{tmp}/v.db'",
}


def _needs(name: str) -> str | None:
    """Why ``name`` cannot run on this machine, or None."""
    if name in ("engine_peer.py", "llamacpp_worker.py") and not LLAMACPP_PYTHON.exists():
        return "llama.cpp's virtualenv is missing (.venv-llamacpp: scripts/setup_llamacpp.sh)"
    if name == "llamacpp_worker.py":
        return "a worker of engine_peer.py: it runs there"
    if name == "vllm_vs_local.py" and vllm_missing():
        return "vLLM is not installed (.venv-vllm: scripts/setup_vllm.sh)"
    return None


def test_every_bench_has_a_quick_command_line() -> None:
    """A new bench is added here on purpose (with its quickest sizes)."""
    assert sorted(QUICK) == sorted(p.name for p in BENCH.glob("*.py"))


def _run(name: str, argv: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(BENCH / name), *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("name", sorted(QUICK))
def test_the_bench_starts(name: str) -> None:
    """Its imports resolve and its flags parse: what a move of modules breaks first."""
    if name == "llamacpp_worker.py":
        pytest.skip("imports xllamacpp, which only llama.cpp's virtualenv has")
    done = _run(name, ["--help"], timeout=300)
    assert done.returncode == 0, f"{name} --help:\n{done.stderr[-4000:]}"
    assert "usage:" in done.stdout


@pytest.mark.bench
@pytest.mark.parametrize("name", sorted(QUICK))
def test_the_bench_runs_in_its_quickest_mode(name: str, tmp_path: Path) -> None:
    why = _needs(name)
    if why:
        pytest.skip(why)
    argv = shlex.split(QUICK[name].format(tmp=tmp_path, python=sys.executable))
    done = _run(name, argv, timeout=900)
    assert done.returncode == 0, f"{name} {' '.join(argv)}:\n{done.stderr[-4000:]}"
