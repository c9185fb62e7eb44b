"""The drafters' C call (``specui.algorithms.layer_call.DraftLayerCall``) against the same call in
torch ops (``TorchLayerCall``), on the same bf16-kernel weights.

- The layers, final norm and head in one C call (``DraftLayerCall``) give each step's draft logits
  close to the torch ops' (the same matmul kernel; norms, rotary and attention summed in another
  order, then rounded to bf16 before the next matmul: within 1% of the largest logit, the same
  argmax on 99% of slots), on the contexts of a real greedy decode with each shipped drafter.
  DFlash and DSpark make their context rows in the call (``norm(fc(taps))``), so that is compared
  too.  The call's greedy pick is exactly the argmax of the logits it returns, through d2t.
- DSpark's Markov chain in one call (``MarkovChainCall``) gives the torch loop's very bits: the same
  1-row matmul, the same float32 add, torch's first-maximum argmax (ties and NaN included),
  remembered biases included.
"""

from __future__ import annotations

import pytest
import torch

from specui import kernels
from specui.algorithms.base import DraftContext, LearnedDrafter
from specui.algorithms.resolve import resolve_drafter, shipped_drafters
from specui.engine import generate
from tests.support.families import dflash_family, eagle_family

pytestmark = pytest.mark.skipif(
    not kernels.bf16_kernel_available(), reason="the bf16 kernel does not run on this CPU"
)
ALGOS = sorted(shipped_drafters())


@pytest.fixture(scope="module")
def prompt(embedded_verifier) -> torch.Tensor:
    from specui.data import load_prompts

    return load_prompts("spec-bench", limit=1)[0].encode(embedded_verifier)


def draft(drafter: LearnedDrafter, ctx: DraftContext, forced: list[int] | None = None):
    """(draft tokens [K], draft logits [K, Vd]) of one step; ``forced``: the tokens the sequential
    drafters (EAGLE-3's steps, DSpark's chain) read, so both paths draft on the same prefix."""
    algo = drafter.algorithm
    if algo in ("eagle3", "dspark"):
        step = drafter.draft_steps if algo == "eagle3" else drafter.draft_chain
        tokens, _, logits, *_ = step(ctx, forced_tokens=forced)
        return tokens, logits
    if algo == "peagle":
        logits = drafter.draft_rows(ctx)
    else:
        logits = drafter.draft_block(ctx, drafter.model.config.first_draft_slot)[1]
    return drafter.pick(logits, ctx)[0], logits


@pytest.mark.parametrize("algo", ALGOS)
def test_one_call_drafts_the_torch_ops_logits(algo, embedded_verifier, prompt):
    one_call = resolve_drafter(algo, embedded_verifier)
    one_call.matmuls_in_bf16()
    assert one_call.layer_call is not None, f"{algo}: the one-call layers do not serve it"
    # DFlash's family: the context rows are made in the call, from the verifier's taps
    assert one_call.layer_call.has_context == (algo in dflash_family())
    torch_ops = resolve_drafter(algo, embedded_verifier)
    torch_ops.matmuls_in_bf16()
    torch_ops.layer_call = None
    torch_ops.markov_call = None  # DSpark's chain in torch too (an unused attribute elsewhere)
    contexts: list[DraftContext] = []
    propose = one_call.propose

    def record(ctx: DraftContext):
        contexts.append(ctx)
        return propose(ctx)

    one_call.propose = record  # type: ignore[method-assign]
    call, picks = one_call.layer_call, []
    run = call.run

    def run_and_check(*args, **kwargs):
        out = run(*args, **kwargs)
        if out.logits is not None:  # the call's greedy pick: the argmax of its logits, via d2t
            best = out.logits.argmax(-1)
            d2t = one_call.model.d2t
            picks.append(torch.equal(out.tokens, best if d2t is None else best + d2t[best]))
        return out

    call.run = run_and_check  # type: ignore[method-assign]
    generate(embedded_verifier, one_call, prompt, max_new_tokens=24)
    del one_call.propose, call.run
    assert len(contexts) > 5
    assert picks and all(picks)
    one_call.reset()
    torch_ops.reset()
    worst, same, total = 0.0, 0, 0
    for ctx in contexts:  # in order: both drafters' caches grow as in the engine
        tokens, want = draft(torch_ops, ctx)
        _, got = draft(one_call, ctx, tokens.tolist())
        assert got.shape == want.shape
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        same += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += want.shape[0]
    print(f"{algo}: worst relative difference {worst:.2e}, argmax {same}/{total}")
    # The matmuls round their input rows to bf16: where float32 sums in another order move a value
    # across a bf16 rounding boundary, the difference carries (2^-9 relative) to what follows.
    assert worst < 1e-2
    assert same >= 0.99 * total


def test_the_markov_chain_call_gives_the_torch_loops_bits(embedded_verifier):
    drafter = resolve_drafter("dspark", embedded_verifier)
    drafter.matmuls_in_bf16()
    call, m = drafter.markov_call, drafter.model
    assert call is not None
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(7, m.config.draft_vocab_size, generator=gen) * 4
    anchor = 1234

    def torch_loop_on(
        base: torch.Tensor, forced: list[int] | None
    ) -> tuple[list[int], torch.Tensor]:
        prev, tokens, rows = torch.tensor(anchor), [], []
        for k in range(base.shape[0]):
            bias, _, _ = m.heads(torch.zeros(m.config.layer.hidden_size), prev, confidence=False)
            logits = base[k] + bias
            best = logits.argmax()
            tokens.append(int(best + m.d2t[best]) if m.d2t is not None else int(best))
            rows.append(logits)
            prev = torch.tensor(forced[k] if forced is not None else tokens[-1])
        return tokens, torch.stack(rows)

    def torch_loop(forced: list[int] | None) -> tuple[list[int], torch.Tensor]:
        return torch_loop_on(base, forced)

    forced = torch.randint(0, m.config.layer.vocab_size, (7,), generator=gen).tolist()
    for fed in (None, forced, None):  # the third call reads biases the first two remembered
        tokens, logits, _ = call.run(base, anchor, fed)
        want_tokens, want_logits = torch_loop(fed)
        assert tokens.tolist() == want_tokens
        assert torch.equal(logits, want_logits)
    assert int((call.memo_token >= 0).sum()) >= 7
    # torch's argmax on ties (the first) and NaN (the first NaN), as the C pick gives them
    tied = torch.full((3, m.config.draft_vocab_size), -5.0)
    tied[0, [40, 41, 4000]] = 9.0
    tied[1, [17, 300]] = float("nan")
    tied[2, -1] = 1e30
    for fed in (None, forced):
        tokens, logits, _ = call.run(tied, anchor, fed)
        want_tokens, want_logits = torch_loop_on(tied, fed)
        assert tokens.tolist() == want_tokens
        assert torch.equal(logits.isnan(), want_logits.isnan())
    with pytest.raises(ValueError, match="outside"):
        call.run(base, m.config.layer.vocab_size + 5)


def test_context_features_of_the_wrong_shape_are_refused(embedded_verifier):
    drafter = resolve_drafter("dflash", embedded_verifier)
    drafter.matmuls_in_bf16()
    call = drafter.layer_call
    assert call is not None and call.has_context
    hidden = drafter.model.config.layer.hidden_size
    rows = torch.zeros(3, hidden)
    taps = torch.zeros(2, 3 * hidden - 1)  # one tap short of the fc's width
    with pytest.raises(ValueError, match="context features"):
        call.run(rows, torch.arange(3), 0, ctx_rows=2, see_block=True, context_features=taps)


def test_the_markov_call_gives_the_confidence_heads_bits(embedded_verifier):
    drafter = resolve_drafter("dspark", embedded_verifier)
    drafter.matmuls_in_bf16()
    call, m = drafter.markov_call, drafter.model
    assert call is not None and call.confidence is not None  # the shipped head reads W1[prev]
    gen = torch.Generator().manual_seed(3)
    slots, hidden_size = 7, m.config.layer.hidden_size
    base = torch.randn(slots, m.config.draft_vocab_size, generator=gen) * 4
    hidden = torch.randn(slots, hidden_size, generator=gen)
    anchor = 321
    forced = torch.randint(0, m.config.layer.vocab_size, (slots,), generator=gen).tolist()
    for fed in (None, forced):
        tokens, _, conf = call.run(base, anchor, fed, hidden)
        prevs = torch.tensor([anchor, *(fed or tokens.tolist())[: slots - 1]])
        want = m.confidence(hidden, prevs)  # the torch head: BF16Linear on [hidden; W1[prev]]
        assert conf is not None and torch.equal(conf, want)
    assert call.run(base, anchor)[2] is None  # no hidden rows, no confidence
    with pytest.raises(ValueError, match="hidden rows"):
        call.run(base, anchor, None, hidden[:, :-1])


@pytest.mark.parametrize("algo", [a for a in eagle_family() if a in ALGOS])
def test_committed_rows_as_keys_and_values_only_leave_the_read_rows_bits(algo, embedded_verifier):
    """``kv_only_before_logits`` skips the last layer's attention and MLP for the rows before
    ``logits_from`` (their outputs are NaN, so the skip did happen), and the rows that are read
    get the very bits of the full pass: they see the same keys and values."""
    drafter = resolve_drafter(algo, embedded_verifier)
    drafter.matmuls_in_bf16()
    call, m = drafter.layer_call, drafter.model
    assert call is not None and call.has_head
    gen = torch.Generator().manual_seed(5)
    n, hidden = 12, m.config.layer.hidden_size
    ids = torch.randint(0, m.config.layer.vocab_size, (n,), generator=gen)
    taps = torch.randn(n, len(m.config.aux_layer_ids) * hidden, generator=gen)
    rows, feature = m.embed_tokens(ids), m.features(taps)
    full = call.run(rows.clone(), torch.arange(n), 0, feature=feature, logits_from=n - 3)
    call.kv.data.zero_()
    skip = call.run(
        rows.clone(),
        torch.arange(n),
        0,
        feature=feature,
        logits_from=n - 3,
        kv_only_before_logits=True,
    )
    assert torch.equal(skip.logits, full.logits) and torch.equal(skip.tokens, full.tokens)
    assert torch.equal(skip.hidden[n - 3 :], full.hidden[n - 3 :])
    assert torch.equal(skip.normed[n - 3 :], full.normed[n - 3 :])
    assert skip.hidden[: n - 3].isnan().all() and skip.normed[: n - 3].isnan().all()
    assert not full.hidden.isnan().any()
