"""The decoding loop is lossless: greedy output equals plain decoding, sampled
output has the verifier's distribution, and the KV cache rolls back exactly."""

from __future__ import annotations

import itertools

import pytest
import torch

import specui.engine as engine
from specui.algorithms import algorithm_names
from specui.algorithms.simple import NgramDrafter, PlainDrafter
from specui.engine import Decoding, generate
from specui.errors import SpecUIError
from specui.sampling import process_logits
from specui.trace import FinalTokenKind, SamplingParams
from tests.support.distribution import sampled_pvalue
from tests.support.scripted_drafters import RandomDrafter, ScriptedDrafter
from tests.support.verifiers import make_tiny_verifier

PROMPTS = {
    "code": "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "math": (
        "Tom has 3 boxes with 12 apples each. He gives away 7 apples. How many apples are left?"
        " Explain step by step."
    ),
}


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_verifier(vocab_size=64, hidden=32, layers=3, seed=1)


# --- greedy: identical to plain decoding ----------------------------------------------


@pytest.mark.parametrize("domain", sorted(PROMPTS))
def test_greedy_output_equals_plain_decoding_on_embedded_verifier(embedded_verifier, domain):
    v = embedded_verifier
    ids = v.encode(PROMPTS[domain], chat=True)
    plain = generate(v, PlainDrafter(), ids, max_new_tokens=40)
    assert len(plain.output_token_ids) == 40
    for drafter in (NgramDrafter(4), RandomDrafter(v.vocab_size, k=4, seed=3)):
        spec = generate(v, drafter, ids, max_new_tokens=40)
        assert spec.output_token_ids == plain.output_token_ids, drafter.name
        assert spec.output_text == plain.output_text


def test_greedy_output_equals_plain_decoding_for_many_prompts_and_k(tiny):
    gen = torch.Generator().manual_seed(7)
    for trial in range(12):
        prompt = torch.randint(
            0, 64, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen
        ).tolist()
        plain = generate(tiny, PlainDrafter(), prompt, max_new_tokens=24, stop_on_eos=False)
        for k in (1, 3, 7):
            for drafter in (RandomDrafter(64, k=k, seed=trial, sharpness=0.5), NgramDrafter(k)):
                out = generate(tiny, drafter, prompt, max_new_tokens=24, stop_on_eos=False)
                assert out.output_token_ids == plain.output_token_ids, (trial, drafter.name)


def test_ngram_accepts_repeated_text_so_tau_exceeds_one(tiny):
    # The tiny model falls into loops under greedy decoding; prompt lookup finds them.
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8]
    out = generate(tiny, NgramDrafter(4), prompt, max_new_tokens=48, stop_on_eos=False)
    plain = generate(tiny, PlainDrafter(), prompt, max_new_tokens=48, stop_on_eos=False)
    assert out.output_token_ids == plain.output_token_ids
    assert out.acceptance_length > 1.5
    assert out.num_steps < plain.num_steps


# --- sampling: the output distribution is the verifier's ------------------------------


def _sampled_pvalue(v, prompt, sampling, n: int, k: int) -> float:
    drafter = RandomDrafter(v.vocab_size, k=k, seed=11, sharpness=2.0)
    return sampled_pvalue(v, prompt, sampling, n, drafter)


@pytest.fixture(scope="module")
def small_vocab():
    return make_tiny_verifier(vocab_size=8, hidden=16, layers=2, seed=3)


def test_sampled_two_token_distribution_matches_verifier(small_vocab):
    p = _sampled_pvalue(small_vocab, [1, 2, 3], SamplingParams(temperature=1.0), n=3000, k=3)
    assert p > 1e-3, f"chi-square p={p:.2e}: speculative sampling changed the distribution"


def test_sampled_distribution_with_top_k_top_p_matches_verifier(small_vocab):
    sampling = SamplingParams(temperature=0.8, top_k=6, top_p=0.9)
    p = _sampled_pvalue(small_vocab, [4, 0], sampling, n=2000, k=2)
    assert p > 1e-3, f"chi-square p={p:.2e}"


def test_distribution_test_detects_a_broken_acceptance_rule(small_vocab, monkeypatch):
    """The statistical test has power: accepting every draft token (ignoring p/q)
    gives the drafter's distribution, and the test rejects it."""

    def always_accept(draft_ids, p, q, generator):
        k = len(draft_ids)
        return k, int(torch.multinomial(p[k], 1, generator=generator)), FinalTokenKind.BONUS

    monkeypatch.setattr(engine, "accept_drafts", always_accept)
    p = _sampled_pvalue(small_vocab, [1, 2, 3], SamplingParams(temperature=1.0), n=1000, k=3)
    assert p < 1e-6


def test_sampling_with_a_seed_is_reproducible(tiny):
    s = SamplingParams(temperature=1.0)
    a = generate(tiny, NgramDrafter(3), [1, 2, 3, 1, 2], max_new_tokens=20, sampling=s, seed=5)
    b = generate(tiny, NgramDrafter(3), [1, 2, 3, 1, 2], max_new_tokens=20, sampling=s, seed=5)
    assert a.output_token_ids == b.output_token_ids


# --- KV cache rollback ----------------------------------------------------------------


def test_rejection_mid_block_rolls_cache_back_to_accepted_prefix(tiny):
    prompt = [3, 14, 15, 9, 2, 6]
    g = generate(tiny, PlainDrafter(), prompt, max_new_tokens=8, stop_on_eos=False).output_token_ids
    wrong = (g[2] + 1) % 64
    drafter = ScriptedDrafter([[g[0], g[1], wrong, 0], [g[3], g[4]]])
    run = Decoding(tiny, drafter, prompt, max_new_tokens=8, stop_on_eos=False)
    steps = iter(run)
    first = next(steps)
    assert first.num_accepted == 2
    assert first.final_token_id == g[2] and first.final_token_kind == FinalTokenKind.CORRECTED
    committed = prompt + g[:3]
    assert run.committed.tolist() == committed
    # Cache holds every committed position but the last: nothing of `wrong` or the token after it.
    assert run.cache.get_seq_length() == len(committed) - 1
    # The cached keys/values are exactly those of the accepted prefix: the next
    # token's logits equal a from-scratch forward over the committed sequence.
    cached = tiny.forward(torch.tensor(committed[-1:]), run.cache).logits[-1]
    tiny.crop(run.cache, len(committed) - 1)
    fresh = tiny.forward(torch.tensor(committed)).logits[-1]
    torch.testing.assert_close(cached, fresh, atol=1e-5, rtol=1e-5)
    second = next(steps)
    assert drafter.seen[1] == committed  # the drafter saw exactly the accepted prefix
    assert second.num_accepted == 2 and second.final_token_kind == FinalTokenKind.BONUS
    rest = list(steps)
    assert run.result.output_token_ids == g
    assert sum(len(s.emitted_token_ids) for s in [first, second, *rest]) == 8


# --- stops and traces -------------------------------------------------------------------


def test_stops_at_eos_and_max_tokens():
    v = make_tiny_verifier(vocab_size=64, hidden=32, layers=3, seed=1)
    prompt = [3, 14, 15]
    g = generate(v, PlainDrafter(), prompt, max_new_tokens=10, stop_on_eos=False).output_token_ids
    eos_tok = g[4]
    first_eos = g.index(eos_tok)
    v.config.eos_token_id = eos_tok
    out = generate(v, NgramDrafter(4), prompt, max_new_tokens=10)
    assert out.output_token_ids == g[: first_eos + 1]
    assert out.stop_reason == "eos"
    out = generate(v, RandomDrafter(64, k=6), prompt, max_new_tokens=3, stop_on_eos=False)
    assert out.output_token_ids == g[:3] and out.stop_reason == "max_tokens"


def test_stop_string_cuts_output(embedded_verifier):
    v = embedded_verifier
    ids = v.encode("Count from 1 to 20, separated by commas.", chat=True)
    full = generate(v, NgramDrafter(4), ids, max_new_tokens=40)
    assert "5" in full.output_text
    out = generate(v, NgramDrafter(4), ids, max_new_tokens=40, stop_strings=["5"])
    assert out.stop_reason == "stop_string"
    assert "5" not in out.output_text
    assert full.output_text.startswith(out.output_text)


def test_trace_metrics_follow_reference_definitions(tiny):
    out = generate(
        tiny, RandomDrafter(64, k=4, sharpness=0.1), [1, 2, 3], max_new_tokens=30, stop_on_eos=False
    )
    drafts = [s for s in out.steps if s.num_drafted]
    assert out.acceptance_length == pytest.approx(
        1 + sum(s.num_accepted for s in drafts) / len(drafts)
    )
    a = out.per_position_acceptance
    assert len(a) == 4 and all(x >= y for x, y in itertools.pairwise(a))
    for s in out.steps:
        assert s.emitted_token_ids[: s.num_accepted] == s.draft_token_ids[: s.num_accepted]
        assert len(s.draft_probs) == len(s.target_probs) == s.num_drafted
        assert s.draft_time_s >= 0 and s.verify_time_s > 0


# --- bad input ----------------------------------------------------------------------------


def test_bad_engine_input_raises_clear_errors(tiny):
    with pytest.raises(SpecUIError, match="empty"):
        Decoding(tiny, PlainDrafter(), [])
    with pytest.raises(SpecUIError, match="context window"):
        Decoding(tiny, PlainDrafter(), [1] * 300)
    with pytest.raises(SpecUIError, match="temperature"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(SpecUIError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=1.5)
    with pytest.raises(SpecUIError, match="token ids"):
        Decoding(tiny, PlainDrafter(), [1, 999])


# --- the learned drafters plugged into the loop -------------------------------------------

ALGORITHMS = algorithm_names()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_greedy_output_with_random_learned_drafter_equals_plain(fixture_verifier, algorithm):
    from specui.algorithms import create_drafter

    v = fixture_verifier
    gen = torch.Generator().manual_seed(5)
    for seed in range(3):
        drafter = create_drafter(algorithm, v, seed=seed, num_layers=1)
        prompt = torch.randint(0, v.vocab_size - 1, (6 + 5 * seed,), generator=gen).tolist()
        plain = generate(v, PlainDrafter(), prompt, max_new_tokens=30, stop_on_eos=False)
        spec = generate(v, drafter, prompt, max_new_tokens=30, stop_on_eos=False)
        assert spec.output_token_ids == plain.output_token_ids, (algorithm, seed)
        assert all(s.num_drafted > 0 for s in spec.steps[:-1])
        sampled = generate(
            v,
            drafter,
            prompt,
            max_new_tokens=20,
            sampling=SamplingParams(temperature=1.0),
            seed=seed,
            stop_on_eos=False,
        )
        assert len(sampled.output_token_ids) == 20


def test_a_one_hot_distribution_is_sampled_without_a_draw():
    """Greedy rows allow one token: returned as is, the generator left where it was; any
    other distribution is drawn from."""
    from specui.sampling import sample

    p = torch.zeros(50)
    p[7] = 1.0
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    assert sample(p, g) == 7 and torch.equal(g.get_state(), state)
    q = torch.full((50,), 1 / 50)
    draws = {sample(q, g) for _ in range(200)}
    assert len(draws) > 20 and not torch.equal(g.get_state(), state)


def test_greedy_acceptance_from_argmaxes_is_the_acceptance_rule_on_one_hot_rows():
    """The engine's greedy shortcut (``accept_greedy``: argmaxes, no one-hot rows) returns what
    speculative sampling returns on greedy's one-hot p, for drafts that match for 0..k slots."""
    gen = torch.Generator().manual_seed(0)
    greedy = SamplingParams(temperature=0.0)
    for trial in range(60):
        k = 1 + trial % 6
        logits = torch.randn(k + 1, 37, generator=gen)
        best = logits.argmax(-1).tolist()
        matched = trial % (k + 1)  # drafts equal to the argmaxes up to here, then one that differs
        drafts = best[:matched] + [(best[i] + 1) % 37 for i in range(matched, k)]
        p = process_logits(logits, greedy)
        rule = engine.accept_drafts(drafts, p, None, torch.Generator().manual_seed(trial))
        n, final, kind, target_probs = engine.accept_greedy(drafts, logits)
        assert (n, final, kind) == rule
        assert n == matched and final == best[matched]
        assert target_probs == [float(p[i, t]) for i, t in enumerate(drafts)]
