"""tau, a_k and the acceptance rate are defined once (specui.acceptance): the trace,
the comparison and vLLM's counters give the same numbers and the same empty cases."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specui.acceptance import (
    AcceptanceCounts,
    acceptance_length,
    accepted_at_positions,
    draft_acceptance_rate,
    per_position_acceptance,
)
from specui.metrics.comparison import compare
from specui.store import DecodingSettings, Store
from specui.trace import FinalTokenKind, GenerationResult, StepTrace
from specui.vllm.counters import SpecCounters
from tests.support.store_helpers import record


def _step(i: int, drafted: int, accepted: int) -> StepTrace:
    emitted = list(range(accepted + 1))
    kind = FinalTokenKind.BONUS if accepted == drafted else FinalTokenKind.CORRECTED
    return StepTrace(
        i,
        10 + i,
        [1] * drafted,
        ["a"] * drafted,
        [0.5] * drafted,
        [0.5] * drafted,
        None,
        accepted,
        7,
        "x",
        kind,
        emitted,
        0.01,
        0.02,
    )


def _stored(tmp_path, algorithm: str, steps: list[StepTrace], k: int) -> dict:
    """The comparison row of a one-prompt run of these steps."""
    store = Store(tmp_path / "m.db")
    run = store.create_run(
        verifier="v",
        prompt_set="p",
        algorithm=algorithm,
        settings=DecodingSettings(num_speculative_tokens=k),
    )
    record(store, run.id, [steps], [1.0], k)
    row = compare(store, [run.id]).rows[0]
    store.close()
    return row


def test_the_empty_cases_are_said_once() -> None:
    assert acceptance_length(6, 3, steps=5) == pytest.approx(3.0)
    assert acceptance_length(0, 0, steps=5) == 1.0  # plain decoding: the verifier's token per step
    assert acceptance_length(0, 0, steps=0) is None  # nothing decoded
    assert acceptance_length(0, 0, steps=None) is None  # steps not counted (vLLM's counters)
    assert draft_acceptance_rate(3, 12) == pytest.approx(0.25)
    assert draft_acceptance_rate(0, 0) is None
    assert per_position_acceptance([4, 2], 0) == []  # no draft tried a slot
    assert accepted_at_positions({0: 1, 2: 3, 3: 1}, 4) == [4, 4, 1, 0]


def test_trace_comparison_and_vllm_counters_agree(tmp_path) -> None:
    steps = [_step(0, 0, 0), _step(1, 3, 2), _step(2, 3, 0), _step(3, 3, 3), _step(4, 2, 1)]
    result = GenerationResult([1, 2], [], "", steps=steps, num_speculative_tokens=3)
    row = _stored(tmp_path, "dflash", steps, 3)
    # The same drafts as vLLM counts them: per slot, 0-based.
    counters = SpecCounters(
        drafts=4, draft_tokens=11, accepted=6, per_position={0: 3, 1: 2, 2: 1}, present=True
    )
    tau = 1 + 6 / 4
    assert (
        result.acceptance_length
        == row["acceptance_length"]
        == counters.acceptance_length
        == pytest.approx(tau)
    )
    a = [3 / 4, 2 / 4, 1 / 4]
    assert result.per_position_acceptance == pytest.approx(a) == counters.per_position_acceptance
    assert [row[f"acceptance_pos_{k}"] for k in (1, 2, 3)] == pytest.approx(a)
    assert result.draft_acceptance_rate == row["draft_acceptance_rate"] == pytest.approx(6 / 11)
    assert AcceptanceCounts.of_steps(steps).tokens_per_step() == {1: 1, 2: 1, 3: 1, 4: 1}


def test_plain_decoding_has_tau_one_everywhere_and_only_the_live_rate_prints_zero(tmp_path) -> None:
    steps = [_step(i, 0, 0) for i in range(4)]
    result = GenerationResult([1], [], "", steps=steps, num_speculative_tokens=0)
    row = _stored(tmp_path, "none", steps, 0)
    assert result.acceptance_length == row["acceptance_length"] == 1.0
    assert result.per_position_acceptance == []
    assert row["draft_acceptance_rate"] is None  # the table leaves it blank
    assert result.draft_acceptance_rate == 0.0  # the live stats print a number


def test_the_definitions_import_neither_the_store_nor_numpy() -> None:
    """specui.trace imports them and sits below the store: importing the package's
    definitions must not load the store-reading modules."""
    code = (
        "import sys, specui.trace; print(sorted(m for m in ('specui.store', 'numpy',"
        " 'specui.metrics.comparison') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_an_ngram_run_drafting_at_half_its_steps_has_tau_above_tokens_per_step(tmp_path) -> None:
    """tau counts the steps that drafted; tokens per step counts every verifier pass.  An
    n-gram lookup that finds a match at every other step: each drafting step commits 3 tokens
    (2 of 3 drafts accepted + the verifier's), each other step 1.  tau = 3, tokens per step = 2."""
    steps = [_step(i, 3, 2) if i % 2 == 0 else _step(i, 0, 0) for i in range(8)]
    result = GenerationResult([1, 2], [], "", steps=steps, num_speculative_tokens=3)
    row = _stored(tmp_path, "ngram", steps, 3)
    assert result.acceptance_length == row["acceptance_length"] == pytest.approx(3.0)
    assert result.tokens_per_step == row["tokens_per_step"] == pytest.approx(2.0)
    assert result.summary()["tokens_per_step"] == pytest.approx(2.0)
    # A learned drafter drafts at every step: there the two are one number.
    every = [_step(i, 3, 2) for i in range(8)]
    (tmp_path / "learned").mkdir()
    learned = _stored(tmp_path / "learned", "dflash", every, 3)
    assert learned["acceptance_length"] == learned["tokens_per_step"] == pytest.approx(3.0)


def test_tokens_per_step_counts_what_the_steps_emitted_and_is_none_without_steps() -> None:
    # A stop condition cut the last step to 1 of its 3 tokens: 4 + 1 over 2 steps.
    cut = _step(1, 3, 2)
    cut.emitted_token_ids = cut.emitted_token_ids[:1]
    assert AcceptanceCounts.of_steps([_step(0, 3, 3), cut]).tokens_per_verifier_step == 2.5
    assert AcceptanceCounts.of_steps([]).tokens_per_verifier_step is None
    uncounted = AcceptanceCounts(steps=None, drafts=4, accepted_tokens=6)  # vLLM's counters
    assert uncounted.tokens_per_verifier_step is None
