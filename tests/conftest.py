"""Shared fixtures: the embedded SmolLM2 verifier, a tiny random verifier, the
speculators reference fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
# The speculators 0.9.0 reference set is committed with the tests (regenerate or check it with
# scripts/make_fixtures.py); SPECUI_FIXTURES points the suite at another set of the same layout.
FIXTURES = Path(os.environ.get("SPECUI_FIXTURES") or REPO / "tests" / "fixtures" / "speculators-0.9.0")

# Stable timings and no oversubscription on the 2-core CI machines.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def embedded_verifier():
    from specui.verifier.model import Verifier

    return Verifier.load("embedded")


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    if not (FIXTURES / "verifier" / "config.json").is_file():
        pytest.fail(f"speculators fixtures not found at {FIXTURES} (set SPECUI_FIXTURES)")
    return FIXTURES


@pytest.fixture(scope="session")
def fixture_verifier(fixture_dir):
    from specui.verifier.model import Verifier

    return Verifier.load(str(fixture_dir / "verifier"))


def dflash_family() -> list[str]:
    """The registered algorithms that draft a block per pass (DFlash's model and its kin's)."""
    from specui.algorithms import algorithm, algorithm_names
    from specui.algorithms.dflash.model import DFlashModel

    return [n for n in algorithm_names() if issubclass(algorithm(n).model_class, DFlashModel)]


def eagle_family() -> list[str]:
    """The registered algorithms built on EAGLE-3's model (the shifted layout)."""
    from specui.algorithms import algorithm, algorithm_names
    from specui.algorithms.eagle3.model import Eagle3Model

    return [n for n in algorithm_names() if issubclass(algorithm(n).model_class, Eagle3Model)]


def make_tiny_verifier(vocab_size: int = 8, hidden: int = 32, layers: int = 4, seed: int = 0, eos: int | None = None):
    """A small random Llama, fast enough for thousands of generations."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specui.verifier.model import Verifier

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=eos, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    # Larger weights than the default init, so the distributions are far from uniform.
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return Verifier(model.float(), None, name=f"tiny-v{vocab_size}")


def vllm_missing() -> bool:
    """Whether no vLLM install is found (``.venv-vllm`` or ``$SPECUI_VLLM_PYTHON``)."""
    from specui.errors import SpecUIError
    from specui.vllm.install import vllm_python

    try:
        vllm_python()
    except SpecUIError:
        return True
    return False


# The real-vLLM tests: skipped where vLLM is not installed, never in CI (which installs it).
needs_vllm = pytest.mark.skipif(
    vllm_missing() and not os.environ.get("CI"),
    reason="vLLM is not installed (.venv-vllm is missing: run `bash scripts/setup_vllm.sh`) and CI is unset",
)
