"""A drafter loaded to serve (``resolve_drafter`` beside the app's ``gguf-q8`` verifier) lets the
float32 copies of its load go (``specui.algorithms.serving``): it drafts exactly what the same
drafter with every copy kept drafts, and holds less by at least those copies' bytes."""

from __future__ import annotations

import pytest
import torch

from specui.algorithms.checkpoint import load_drafter
from specui.algorithms.resolve import resolve_drafter, shipped_drafters
from specui.algorithms.serving import _linears
from specui.data import load_prompts
from specui.engine import Decoding
from specui.policy.cost import drafter_key
from specui.verifier.batch_invariant import BF16Linear
from specui.verifier.model import Verifier
from specui.workbench import held_bytes
from tests.support.kernel_marks import needs_kernel

pytestmark = needs_kernel

ALGOS = sorted(shipped_drafters())


@pytest.fixture(scope="module")
def q8_verifier() -> Verifier:
    return Verifier.load("embedded", precision="gguf-q8")


def with_every_copy(name: str, verifier: Verifier):
    """The drafter as ``resolve_drafter`` made it before: the kernels' copies and the float32
    ones of the load."""
    drafter = load_drafter(shipped_drafters()[name], verifier)
    drafter.matmuls_in_bf16(int8_rows=True)
    return drafter


class _Both:
    """Drafts with ``sent`` and, from the same context, with ``other``; keeps both proposals."""

    def __init__(self, sent, other) -> None:
        self.sent, self.other, self.pairs = sent, other, []

    def __getattr__(self, name):
        return getattr(self.sent, name)

    def reset(self) -> None:
        self.sent.reset()
        self.other.reset()

    def propose(self, ctx):
        a, b = self.sent.propose(ctx), self.other.propose(ctx)
        self.pairs.append((a, b))
        return a


def _float32_linear_bytes(drafter) -> int:
    return sum(
        m.weight.numel() * 4
        for m in _linears(drafter)
        if isinstance(m, BF16Linear) and not m.weight.is_meta and m.weight.dtype == torch.float32
    )


@pytest.mark.parametrize("name", ALGOS)
def test_a_serving_drafter_drafts_the_same_and_holds_less(q8_verifier, name):
    served = resolve_drafter(name, q8_verifier)
    kept = with_every_copy(name, q8_verifier)
    assert served.layer_call is not None
    dropped = _float32_linear_bytes(kept)
    assert dropped > 0 and _float32_linear_bytes(served) == 0
    # The memory: every float32 linear weight gone, and an embedding equal to the verifier's
    # (EAGLE-3's and P-EAGLE's borrowed one) is the verifier's own tensor.
    embed = getattr(served.model, "embed_tokens", None)
    if embed is not None:
        dropped += embed.weight.numel() * 4
        assert embed.weight.data_ptr() == q8_verifier.embed_tokens.weight.data_ptr()
    assert held_bytes(served, q8_verifier) <= held_bytes(kept, q8_verifier) - dropped
    # The adaptive policy files draft times under the weights' fingerprint: the same one.
    assert drafter_key(served) == drafter_key(kept)
    # The output: the same draft tokens and draft probabilities at every step of a decode.
    both = _Both(served, kept)
    prompt = load_prompts("gsm-symbolic", split="eval", limit=1)[0]
    run = Decoding(q8_verifier, both, prompt.encode(q8_verifier), max_new_tokens=32)
    for _ in run:
        pass
    assert len(both.pairs) > 3
    for a, b in both.pairs:
        assert a.token_ids == b.token_ids
        assert (a.probs is None) == (b.probs is None)
        if a.probs is not None:
            assert torch.equal(a.probs, b.probs)
