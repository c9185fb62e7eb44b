"""The drafters shipped in data/drafters (issue 6): a fresh clone has one of each
algorithm for the embedded verifier, small and in bf16, with a model card, picked
up by name, lossless, and drafting well on a held-out prompt of the set they were
trained on (the README's table has the full measurement)."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from specui.algorithms import algorithm_names
from specui.algorithms.resolve import resolve_drafter, shipped_drafters
from specui.engine import generate

ALGORITHMS = algorithm_names()  # one shipped drafter per registered algorithm
MAX_BYTES = 64 * 2**20  # every clone carries these files forever


def test_one_drafter_of_each_algorithm_is_shipped():
    assert set(ALGORITHMS) <= set(shipped_drafters()), sorted(shipped_drafters())


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_shipped_folder_is_small_bf16_with_a_model_card(algo):
    folder = shipped_drafters()[algo]
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == algo
    assert config["dtype"] == "bfloat16"
    assert (
        config["speculators_config"]["verifier"]["name_or_path"]
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    weights = folder / "model.safetensors"
    assert weights.stat().st_size < MAX_BYTES
    with safe_open(str(weights), "pt") as f:
        names = list(f.keys())  # noqa: SIM118 (safe_open is not iterable)
        assert all(str(f.get_slice(n).get_dtype()) in ("BF16", "I64", "BOOL") for n in names), names
    # The verifier's embedding is borrowed, not duplicated (vLLM and SpecUI share the verifier's).
    assert "embed_tokens.weight" not in names
    card = (folder / "README.md").read_text()
    for needed in (
        "## Training",
        "## Held-out evaluation",
        "T=0: tau",
        "per-position acceptance",
        "why these sizes",
    ):
        assert needed in card, f"{algo} model card lacks {needed!r}"
    if algo == "dspark":
        assert "ECE" in card and "AUROC" in card and "Brier" in card and "T = " in card


@pytest.fixture(scope="module")
def heldout_prompt_ids(embedded_verifier):
    from specui.data import load_prompts

    # held-out: the drafters never trained on the eval split
    return load_prompts("gsm-symbolic", split="eval", limit=1)[0].encode(embedded_verifier)


@pytest.fixture(scope="module")
def plain_output(embedded_verifier, heldout_prompt_ids):
    from specui.algorithms.simple import PlainDrafter

    return generate(
        embedded_verifier, PlainDrafter(), heldout_prompt_ids, max_new_tokens=48
    ).output_token_ids


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_shipped_drafter_by_name_is_lossless_and_drafts_well(
    algo, embedded_verifier, heldout_prompt_ids, plain_output
):
    drafter = resolve_drafter(algo, embedded_verifier)
    result = generate(embedded_verifier, drafter, heldout_prompt_ids, max_new_tokens=48)
    assert result.output_token_ids == plain_output  # greedy: identical to plain decoding
    # The first held-out prompt, 48 tokens (greedy, so deterministic; gsm-symbolic's training split
    # is part of the general corpus): measured tau 1.38 (DFlash), 1.52 (DSpark), 1.52 (P-EAGLE),
    # 1.92 (EAGLE-3).  A randomly initialised or mismatched drafter stays at 1.0-1.05.
    assert result.acceptance_length >= 1.25, f"{algo}: tau {result.acceptance_length:.2f}"


def test_new_checkpoints_of_the_embedded_verifier_record_its_hub_id(embedded_verifier):
    """Not the cache folder it was converted into (a path on one machine only)."""
    from specui.algorithms.base import verifier_identity

    assert (
        verifier_identity(embedded_verifier)["verifier_name_or_path"]
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    # and its architecture, which a config converted from the GGUF file (transformers 5.x) lacks
    assert verifier_identity(embedded_verifier)["verifier_architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize("algo", sorted(shipped_drafters()))
def test_shipped_configs_name_the_verifiers_architecture(algo):
    """What `specui doctor` and vLLM read a speculator's verifier by."""
    cfg = json.loads((shipped_drafters()[algo] / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
