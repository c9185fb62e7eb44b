"""The adaptive policy falls back toward plain decoding when drafting does not pay: on what the
drafting steps actually gained (not only on the rates of the slots it chose to send), and with
probes whose price includes the drafter's catch-up on the positions it has not read."""

from __future__ import annotations

import pytest
import torch

import specui.policy.adaptive as adaptive
from specui.algorithms.base import DraftContext
from specui.algorithms.simple import PlainDrafter
from specui.engine import Decoding, generate
from specui.policy import AdaptivePolicy
from specui.policy.adaptive import Rates
from specui.policy.cost import CostModel, drafter_key
from specui.trace import Proposal
from tests.support.verifiers import make_tiny_verifier

PROMPT = [3, 14, 15, 9, 2, 6]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_verifier(vocab_size=64, hidden=32, layers=3, seed=1)


@pytest.fixture(scope="module")
def plain(tiny):
    return generate(tiny, PlainDrafter(), PROMPT, max_new_tokens=200, stop_on_eos=False)


class SelectivelyRight:
    """One draft a step, right on every third step and sure of it there (0.95), wrong and
    unsure (0.4) on the others: the policy sends only the sure ones, so the rates of the slots it
    sent say 1.0, while each step it drafts pays the draft."""

    algorithm = "selective"
    name = "selective"
    aux_layer_ids = None
    num_speculative_tokens = 1

    def __init__(self, output: list[int]) -> None:
        self.output = output
        self.calls = 0

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        self.calls += 1
        done = ctx.token_ids.numel() - len(PROMPT)
        right = self.output[done]
        if done % 3 == 0:
            return Proposal(token_ids=[right], confidences=[0.95] if ctx.estimates else None)
        return Proposal(token_ids=[(right + 1) % 64], confidences=[0.4] if ctx.estimates else None)


def _selective_run(tiny, plain) -> tuple[list, SelectivelyRight]:
    drafter = SelectivelyRight(plain.output_token_ids)
    key = drafter_key(drafter)
    # A second row costs half a step and a draft 0.3 of one: a slot sent at 0.95 pays its row,
    # one at 0.4 does not, and drafting loses to plain steps (4 tokens for 4.4 s every three
    # steps, against 3 for 3).  An earlier run's rates (shared, as the Playground's are) saw
    # only the sure slots, all accepted: by them alone, drafting gains.
    cost = CostModel(verify_s=[1.0, 1.5, 2.0], draft_s={key: 0.3})
    shared = {key: Rates(reached=[20], accepted=[20])}
    policy = AdaptivePolicy(cost=cost, calibrations={}, shared_rates=shared)
    run = Decoding(tiny, drafter, PROMPT, max_new_tokens=200, stop_on_eos=False, policy=policy)
    steps = list(run)
    assert run.result.output_token_ids == plain.output_token_ids
    return steps, drafter


def test_a_drafter_whose_drafting_steps_lose_runs_mostly_plain_steps(tiny, plain):
    steps, drafter = _selective_run(tiny, plain)
    # Every step emits what it accepted plus one: the step count matches the tokens.
    assert sum(len(s.emitted_token_ids) for s in steps) == 200
    assert sum(1 + s.num_accepted for s in steps) == 200
    assert drafter.calls <= 0.15 * len(steps), (drafter.calls, len(steps))


def test_without_the_payoff_the_rates_alone_would_draft_every_step(tiny, plain, monkeypatch):
    """The test above can fail: with the realized payoff never consulted, the sent slots' rates
    (all accepted) keep the drafter drafting on nearly every step."""
    monkeypatch.setattr(adaptive, "PAYOFF_EVIDENCE", 10**9)
    steps, drafter = _selective_run(tiny, plain)
    assert drafter.calls >= 0.8 * len(steps), (drafter.calls, len(steps))


class NeverRightWithCache:
    """A drafter that is never right and keeps a cache over the committed positions (as a
    learned one does): a draft reads every position since its last one."""

    algorithm = "behind"
    name = "behind"
    aux_layer_ids = None
    num_speculative_tokens = 2

    def __init__(self) -> None:
        self.read: list[int] = []  # positions each draft caught up on
        self.cached = 0

    def reset(self) -> None:
        self.cached = 0

    def cached_positions(self) -> int:
        return self.cached

    def propose(self, ctx: DraftContext) -> Proposal:
        n = ctx.token_ids.numel() - 1
        self.read.append(n - self.cached)
        self.cached = n
        wrong = (int(ctx.token_ids[-1]) + 1) % 64
        return Proposal(token_ids=[wrong, wrong])


def _probes(tiny, plain, catchup_s: float) -> tuple[list[int], list]:
    drafter = NeverRightWithCache()
    key = drafter_key(drafter)
    cost = CostModel([1.0, 1.2, 1.4], draft_s={key: 0.1}, catchup_s={key: catchup_s})
    policy = AdaptivePolicy(cost=cost, calibrations={})
    run = Decoding(tiny, drafter, PROMPT, max_new_tokens=200, stop_on_eos=False, policy=policy)
    steps = list(run)
    assert run.result.output_token_ids == plain.output_token_ids
    return drafter.read, steps


def test_probes_spend_at_most_their_budget_with_the_catch_up_priced_in(tiny, plain):
    catchup = 0.02
    read, steps = _probes(tiny, plain, catchup)
    assert len(steps) == 200  # nothing accepted: one token a step
    # Model seconds: 200 plain-step verifies, plus each draft, its catch-up and its extra rows.
    spent = sum(0.1 + catchup * r + 0.2 for r in read)
    total = 200 * 1.0 + spent
    # The first drafts learn the drafter (the rates' prior says 1/2); after them, what the
    # probes spend stays within the budget, give or take one probe.
    learning = 4
    probes = read[learning:]
    probe_spend = sum(0.1 + catchup * r + 0.2 for r in probes)
    one = max((0.1 + catchup * r + 0.2 for r in probes), default=0.0)
    assert probe_spend <= adaptive.PROBE_BUDGET * total + one, (read, probe_spend, total)
    # The catch-up is what limits them: priced at nothing, the same drafter is probed more.
    cheap, _ = _probes(tiny, plain, 0.0)
    assert len(cheap) > len(read), (cheap, read)


def test_a_learned_drafter_reports_the_positions_its_cache_covers(fixture_verifier):
    """``cached_positions`` is what the probe's price reads: after a draft, every committed
    position but the anchor's; after a reset, none."""
    from specui.algorithms import create_drafter
    from specui.trace import SamplingParams

    v = fixture_verifier
    ids = (torch.arange(20) * 5 % (v.vocab_size - 1)).long()
    for algorithm in ("dflash", "eagle3"):
        d = create_drafter(algorithm, v, seed=0, num_layers=1)
        assert d.cached_positions() == 0
        feats = v.forward(ids[:-1], v.new_cache(), d.aux_layer_ids).aux_hidden
        d.propose(DraftContext(ids, feats, SamplingParams(), None))
        assert ids.numel() - 2 <= d.cached_positions() <= ids.numel() - 1, algorithm
        d.reset()
        assert d.cached_positions() == 0
