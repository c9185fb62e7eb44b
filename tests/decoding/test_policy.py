"""The decoding policy: lossless (greedy output equals plain decoding for every policy, drafter
and hybrid; the sampled distribution is the verifier's with the adaptive policy on), the
choice follows the cost model, a drafter that is never right falls back to plain steps, and a
hybrid's learned drafter stays in step on the steps it did not draft."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from specui.algorithms.base import DraftContext
from specui.algorithms.hybrid import HybridDrafter
from specui.algorithms.simple import NgramDrafter, PlainDrafter
from specui.algorithms.suffix import SuffixDrafter
from specui.engine import Decoding, generate
from specui.policy import AdaptivePolicy, FixedPolicy
from specui.policy.adaptive import Decision
from specui.policy.calibration import SlotCalibration
from specui.policy.choose import sequential_keep
from specui.policy.cost import CostModel
from specui.trace import Proposal, SamplingParams
from tests.support.distribution import sampled_pvalue
from tests.support.scripted_drafters import RandomDrafter, ScriptedDrafter
from tests.support.verifiers import make_tiny_verifier

FLAT = CostModel(verify_s=[1.0] * 17)  # a verify of any block costs a step: drafts are free
STEEP = CostModel(verify_s=[float(r) for r in range(1, 18)])  # each row costs a step
CURVES = {"flat": FLAT, "steep": STEEP, "today": CostModel([1.0, 1.3, 1.7, 2.0, 2.5, 2.9, 3.3])}


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_verifier(vocab_size=64, hidden=32, layers=3, seed=1)


@pytest.fixture(scope="module")
def small_vocab():
    return make_tiny_verifier(vocab_size=8, hidden=16, layers=2, seed=3)


# --- the choice itself -------------------------------------------------------------------


def test_each_slot_is_sent_on_what_is_known_before_its_own_token():
    """Whether slot i is sent depends on estimates 1..i alone: changing those after it never
    changes it (the rule lossless sampling needs)."""
    rng = random.Random(0)
    for _ in range(400):
        k = rng.randint(1, 8)
        est = [rng.random() for _ in range(k)]
        priors = [rng.random() for _ in range(k)]
        curve = CURVES[rng.choice(sorted(CURVES))]
        rate = rng.uniform(0.3, 1.5) / curve.verify(1)
        n = sequential_keep(est, priors, curve.verify, rate)
        for i in range(k):
            changed = est[: i + 1] + [rng.random() for _ in range(k - i - 1)]
            m = sequential_keep(changed, priors, curve.verify, rate)
            assert (n > i) == (m > i), (est, changed, i)


def test_the_number_sent_follows_the_cost_model():
    sure, unsure = [0.95] * 6, [0.3] * 6
    assert sequential_keep(sure, sure, FLAT.verify, 1.0) == 6  # free rows: send everything
    assert sequential_keep(unsure, unsure, STEEP.verify, 1.0) == 0  # a row costs a step: none
    # today's curve: a likely first slot pays, a doubtful tail does not
    mixed = [0.9, 0.8, 0.2, 0.2, 0.2, 0.2]
    assert sequential_keep(mixed, mixed, CURVES["today"].verify, 1.0) == 2


# --- lossless ------------------------------------------------------------------------------


def _policies():
    yield "fixed", FixedPolicy
    for name, curve in CURVES.items():
        yield f"adaptive-{name}", lambda curve=curve: AdaptivePolicy(cost=curve)


@pytest.mark.parametrize("name,policy", list(_policies()), ids=[n for n, _ in _policies()])
def test_greedy_output_equals_plain_for_every_policy_and_drafter(tiny, name, policy):
    gen = torch.Generator().manual_seed(7)
    for trial in range(6):
        prompt = torch.randint(
            0, 64, (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen
        )
        prompt = prompt.tolist() + prompt.tolist()[:4]  # something for the lookups to find
        plain = generate(tiny, PlainDrafter(), prompt, max_new_tokens=30, stop_on_eos=False)
        drafters = [
            RandomDrafter(64, k=5, seed=trial, sharpness=0.5),
            NgramDrafter(3),
            SuffixDrafter(6),
            HybridDrafter(RandomDrafter(64, k=4, seed=trial), SuffixDrafter(8)),
            HybridDrafter(RandomDrafter(64, k=4, seed=trial), NgramDrafter(4)),
        ]
        for drafter in drafters:
            out = generate(
                tiny, drafter, prompt, max_new_tokens=30, stop_on_eos=False, policy=policy()
            )
            assert out.output_token_ids == plain.output_token_ids, (name, trial, drafter.name)


# A curve where the estimates decide: some blocks are cut, some sent whole, some not drafted.
SAMPLING_CURVE = CostModel(verify_s=[1.0, 1.35, 1.6, 1.8])
# A calibration that moves the estimates by slot position (what a stored fit does): the policy
# reads it, and the choice must stay on what is known before each slot's token.
POSITION_FIT = SlotCalibration("random", 1.6, (0.8, -0.4, -1.5), 0, 0, 0.0, 0.0)


def _sampling_cases():
    def learned():
        return RandomDrafter(8, k=3, seed=11, sharpness=2.0)

    adaptive = lambda: AdaptivePolicy(cost=SAMPLING_CURVE, calibrations={})  # noqa: E731
    calibrated = lambda: AdaptivePolicy(  # noqa: E731
        cost=SAMPLING_CURVE, calibrations={"random": POSITION_FIT}
    )
    yield pytest.param("adaptive", learned(), adaptive, id="adaptive")
    yield pytest.param(
        "adaptive-hybrid-suffix",
        HybridDrafter(learned(), SuffixDrafter(3)),
        calibrated,
        id="adaptive-hybrid-suffix",
    )
    yield pytest.param("adaptive-calibrated", learned(), calibrated, id="adaptive-calibrated")
    yield pytest.param(
        "adaptive-hybrid-ngram",
        HybridDrafter(learned(), NgramDrafter(3)),
        calibrated,
        id="adaptive-hybrid-ngram",
    )
    yield pytest.param(
        "fixed-hybrid-suffix",
        HybridDrafter(learned(), SuffixDrafter(3)),
        FixedPolicy,
        id="fixed-hybrid-suffix",
    )


@pytest.mark.parametrize("name,drafter,policy", list(_sampling_cases()))
def test_sampled_distribution_with_each_policy_and_hybrid_matches_verifier(
    small_vocab, name, drafter, policy
):
    """T=1: the adaptive policy (raw and calibrated estimates) and the hybrids leave the output
    distribution the verifier's.  The prompt repeats itself, so the lookups match (a hybrid's
    steps choose between its two proposers)."""
    p = sampled_pvalue(
        small_vocab,
        [1, 2, 3, 1, 2],
        SamplingParams(temperature=1.0),
        n=3000,
        drafter=drafter,
        policy=policy,
    )
    assert p > 1e-3, f"{name}: chi-square p={p:.2e}: the policy changed the sampled distribution"


class PeekingPolicy(FixedPolicy):
    """Sends the first draft only when its own token is even: a choice made after seeing it."""

    def propose(self, ctx: DraftContext, drafter, max_k: int) -> Decision:
        found = drafter.propose(ctx)
        keep = 1 if found.token_ids and found.token_ids[0] % 2 == 0 else 0
        sent = Proposal(found.token_ids[:keep], found.probs[:keep] if keep else None)
        return Decision(sent, drafter.algorithm if keep else None)


def test_the_distribution_test_detects_a_policy_that_peeks_at_the_draft(small_vocab):
    """The test above has power: choosing what to send from the drafted token biases the
    output, and the same test rejects it."""
    drafter = RandomDrafter(small_vocab.vocab_size, k=1, seed=11, sharpness=3.0)
    sampling = SamplingParams(temperature=1.0)
    p = sampled_pvalue(
        small_vocab, [1, 2, 3], sampling, n=3000, drafter=drafter, policy=PeekingPolicy
    )
    assert p < 1e-6


# --- falling back, and the hybrid's choice ----------------------------------------------


def test_a_drafter_that_is_never_right_falls_back_to_plain_steps(tiny):
    prompt = [3, 14, 15, 9, 2, 6]
    g = generate(tiny, PlainDrafter(), prompt, max_new_tokens=120, stop_on_eos=False)
    wrong = ScriptedDrafter([[(t + 1) % 64] * 4 for t in g.output_token_ids])
    run = Decoding(
        tiny,
        wrong,
        prompt,
        max_new_tokens=120,
        stop_on_eos=False,
        policy=AdaptivePolicy(cost=CURVES["today"]),
    )
    steps = list(run)
    assert run.result.output_token_ids == g.output_token_ids
    drafted = [s.step for s in steps if s.num_drafted]
    assert len(drafted) <= 12, drafted  # a few to learn it, then probes at doubling intervals
    gaps = [b - a for a, b in itertools.pairwise(drafted[-4:])]
    assert gaps == sorted(gaps) and gaps[-1] >= 16, drafted
    # The fixed policy sends it every step.
    fixed = generate(tiny, wrong, prompt, max_new_tokens=120, stop_on_eos=False)
    assert all(s.num_drafted for s in fixed.steps[:-1])


def test_a_drafter_that_is_always_right_sends_full_blocks_on_a_cheap_curve(tiny):
    prompt = [3, 14, 15, 9, 2, 6]
    g = generate(
        tiny, PlainDrafter(), prompt, max_new_tokens=60, stop_on_eos=False
    ).output_token_ids

    class Oracle(ScriptedDrafter):
        def propose(self, ctx):
            done = ctx.token_ids.numel() - len(prompt)
            return Proposal(token_ids=g[done : done + 4])

    out = generate(
        tiny,
        Oracle([[0] * 4]),
        prompt,
        max_new_tokens=60,
        stop_on_eos=False,
        policy=AdaptivePolicy(cost=FLAT),
    )
    assert out.output_token_ids == g
    assert out.acceptance_length > 4.5  # 1 + 4 accepted on nearly every step


def test_hybrid_sends_the_lookup_where_it_matches_and_the_learned_draft_elsewhere(tiny):
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    learned = RandomDrafter(64, k=4, seed=0, sharpness=0.1)
    hybrid = HybridDrafter(learned, SuffixDrafter(8))
    policy = AdaptivePolicy(cost=FLAT)
    out = generate(tiny, hybrid, prompt, max_new_tokens=40, stop_on_eos=False, policy=policy)
    plain = generate(tiny, PlainDrafter(), prompt, max_new_tokens=40, stop_on_eos=False)
    assert out.output_token_ids == plain.output_token_ids
    proposers = {s.proposer for s in out.steps}
    assert "suffix" in proposers and "random" in proposers, proposers


def test_a_hybrid_learned_drafter_stays_in_step_when_it_did_not_draft(fixture_verifier):
    """A learned drafter skipped on some steps drafts, when next asked, what a fresh one given
    the same committed tokens and taps drafts."""
    from specui.algorithms import create_drafter

    v = fixture_verifier
    prompt = (torch.arange(12) * 5 % (v.vocab_size - 1)).tolist() * 2
    for algorithm in ("dflash", "eagle3"):
        learned = create_drafter(algorithm, v, seed=0, num_layers=1)
        hybrid = HybridDrafter(learned, SuffixDrafter(8))
        run = Decoding(
            v,
            hybrid,
            prompt,
            max_new_tokens=30,
            stop_on_eos=False,
            policy=AdaptivePolicy(cost=FLAT),
        )
        steps = list(run)
        plain = generate(v, PlainDrafter(), prompt, max_new_tokens=30, stop_on_eos=False)
        assert run.result.output_token_ids == plain.output_token_ids
        assert any(s.proposer == "suffix" for s in steps), algorithm  # it was skipped
        committed = run.committed
        feats = v.forward(committed[:-1], v.new_cache(), learned.aux_layer_ids).aux_hidden
        ctx = DraftContext(committed, feats, SamplingParams(), None)
        kept = learned.propose(ctx).token_ids
        fresh = create_drafter(algorithm, v, seed=0, num_layers=1)
        assert kept == fresh.propose(ctx).token_ids, algorithm
