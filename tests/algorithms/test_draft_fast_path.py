"""The drafters' serving path beside a kernel verifier (``LearnedDrafter.matmuls_in_bf16``: bf16
kernels, fused weights, the layers in one C call) drafts what the float32 drafter drafts (its call
in torch ops, ``layer_call.TorchLayerCall``, held to the training forward in test_drafters.py).

Real shipped drafters beside the embedded verifier, on the contexts of real greedy decodes: each
step's draft logits of both paths, their argmax compared slot by slot.  The sequential drafters
(EAGLE-3's steps, DSpark's Markov head) feed the serving path the reference's tokens, so a slot
is compared on the same prefix rather than after an earlier flip.  bf16 weights move near-ties, so
the bar is agreement on 99% of slots, not equality (the verifier decides every token anyway).
"""

from __future__ import annotations

import pytest
import torch

from specui import kernels
from specui.algorithms.base import DraftContext, LearnedDrafter
from specui.algorithms.layers import MLP, Attention, KVBuffer
from specui.algorithms.resolve import resolve_drafter, shipped_drafters
from specui.engine import generate
from specui.verifier.batch_invariant import BF16Linear

ALGOS = sorted(shipped_drafters())
PROMPTS, NEW_TOKENS = 3, 40
MIN_AGREEMENT = 0.99


@pytest.fixture(scope="module")
def prompt_ids(embedded_verifier) -> list[torch.Tensor]:
    from specui.data import load_prompts

    return [p.encode(embedded_verifier) for p in load_prompts("spec-bench", limit=PROMPTS)]


def draft_logits(drafter: LearnedDrafter, ctx: DraftContext, forced: list[int] | None):
    """Draft logits [K, Vd] of one step (``forced``: the tokens the sequential drafters read)."""
    algo = drafter.algorithm
    if algo == "eagle3":
        return drafter.draft_steps(ctx, forced_tokens=forced)[2]
    if algo == "dspark":
        return drafter.draft_chain(ctx, forced_tokens=forced)[2]
    if algo == "peagle":
        return drafter.draft_rows(ctx)
    return drafter.draft_block(ctx, drafter.model.config.first_draft_slot)[1]


def recorded_contexts(drafter: LearnedDrafter, verifier, prompt: torch.Tensor) -> list:
    """The contexts the engine hands ``drafter`` in a greedy decode of ``prompt``."""
    contexts = []
    propose = drafter.propose

    def record(ctx: DraftContext):
        contexts.append(ctx)
        return propose(ctx)

    drafter.propose = record  # type: ignore[method-assign]
    generate(verifier, drafter, prompt, max_new_tokens=NEW_TOKENS)
    del drafter.propose
    return contexts


@pytest.mark.parametrize("algo", ALGOS)
def test_serving_path_drafts_what_the_float32_torch_call_drafts(
    algo, embedded_verifier, prompt_ids
):
    reference = resolve_drafter(algo, embedded_verifier)  # float32, its call in torch ops
    serving = resolve_drafter(algo, embedded_verifier)
    serving.matmuls_in_bf16()
    # the serving path is on: stacked q/k/v and gate/up, the bf16 kernel's copy where it runs
    fused = [m for m in serving.model.modules() if isinstance(m, Attention | MLP)]
    assert fused and all(m.stacked is not None for m in fused)
    if kernels.bf16_kernel_available():
        linears = [m for m in serving.model.modules() if isinstance(m, BF16Linear)]
        assert linears and all(m.weight_kernel is not None for m in linears)
        assert serving.layer_call is not None  # the layers, norm and head in one C call
        if algo == "dspark":
            assert serving.markov_call is not None  # and the Markov chain
    same = total = 0
    for prompt in prompt_ids:
        contexts = recorded_contexts(reference, embedded_verifier, prompt)
        reference.reset()
        serving.reset()
        for ctx in contexts:
            if ctx.token_ids.numel() < 2:
                continue
            want = draft_logits(reference, ctx, None).argmax(-1)
            d2t = reference.model.d2t
            from_draft = want + d2t[want] if d2t is not None else want
            got = draft_logits(serving, ctx, from_draft.tolist()).argmax(-1)
            same += int((got == want).sum())
            total += want.numel()
    print(f"{algo}: {same}/{total} = {same / total:.2%}")
    assert total > 100 * PROMPTS
    assert same / total >= MIN_AGREEMENT, f"{algo}: {same}/{total} slots agree"


def test_a_kv_buffer_grows_keeps_its_rows_and_overwrites_in_place():
    buffer, gen = KVBuffer(), torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 1, 1, 3, 5, 8, generator=gen)  # [1, 1, Hkv, S, D] each
    keys, values = buffer.write(0, k, v)
    assert torch.equal(keys, k) and torch.equal(values, v)
    more_k, more_v = torch.randn(2, 1, 1, 3, 100, 8, generator=gen)  # past the first capacity
    keys, values = buffer.write(5, more_k, more_v)
    assert keys.shape[-2] == 105 and torch.equal(keys[..., :5, :], k)
    assert torch.equal(values[..., 5:, :], more_v)
    draft_k, draft_v = torch.randn(2, 1, 1, 3, 2, 8, generator=gen)  # a step's rows, rewritten
    keys, values = buffer.write(4, draft_k, draft_v)
    assert keys.shape[-2] == 6 and torch.equal(keys[..., :4, :], k[..., :4, :])
    assert torch.equal(keys[..., 4:, :], draft_k) and torch.equal(values[..., 4:, :], draft_v)
