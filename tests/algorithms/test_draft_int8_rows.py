"""The learned drafters beside a ``gguf-q8`` verifier: their one call multiplies Q8_0 copies of
their weights by int8 rows (the verifier's kernel), their torch modules stay bf16, and they draft
what the bf16 path drafts on almost every slot."""

from __future__ import annotations

import pytest

from specui.algorithms import algorithm_names
from specui.algorithms.layer_call import DraftLayerCall
from specui.algorithms.resolve import resolve_drafter
from specui.data import load_prompts
from specui.engine import Decoding
from specui.kernels.layers import WEIGHT_BF16
from specui.kernels.packing import GGUF_INT8_ROWS, GGUF_TYPES
from specui.verifier.model import Verifier
from tests.support.families import family_founders
from tests.support.kernel_marks import needs_kernel

pytestmark = [needs_kernel, pytest.mark.slow]


@pytest.fixture(scope="module")
def q8_verifier() -> Verifier:
    return Verifier.load("embedded", precision="gguf-q8")


def _call_types(drafter) -> set[int]:
    return {layer.qkv.type for layer in drafter.layer_call.layers.table}


@pytest.mark.parametrize("name", algorithm_names())
def test_the_one_call_reads_q8_0_blocks_with_int8_rows_and_the_modules_stay_bf16(q8_verifier, name):
    drafter = resolve_drafter(name, q8_verifier)
    assert drafter.layer_call is not None
    assert _call_types(drafter) == {GGUF_TYPES["Q8_0"] | GGUF_INT8_ROWS}
    linears = [m for m in drafter.model.modules() if getattr(m, "weight_q8", None) is not None]
    # their bf16 copies stay (the torch modules' path); the float32 weights of the load went
    # (specui.algorithms.serving)
    assert linears and all(m.weight_kernel is not None and m.weight.is_meta for m in linears)
    markov = getattr(drafter, "markov_call", None)
    if markov is not None:  # the chain reads single bf16 rows of W1 and W2
        assert markov.w2.type_id == WEIGHT_BF16


class _Both:
    """Drafts with ``sent`` and, from the same context, with ``other``."""

    def __init__(self, sent, other) -> None:
        self.sent, self.other, self.pairs = sent, other, []

    def __getattr__(self, name):
        return getattr(self.sent, name)

    def reset(self) -> None:
        self.sent.reset()
        self.other.reset()

    def propose(self, ctx):
        a, b = self.sent.propose(ctx), self.other.propose(ctx)
        self.pairs += list(zip(a.token_ids, b.token_ids, strict=False))
        return a


# One drafter of each family (their row layouts differ).
@pytest.mark.parametrize("name", family_founders())
def test_int8_rows_draft_what_the_bf16_path_drafts(q8_verifier, name):
    int8 = resolve_drafter(name, q8_verifier)
    bf16 = resolve_drafter(name, q8_verifier)
    for linear in bf16.call_linears():
        linear.__dict__.pop("weight_q8", None)
    bf16.layer_call = DraftLayerCall.build(bf16.model, bf16.model.head_module())
    assert _call_types(bf16) == {WEIGHT_BF16}
    both = _Both(int8, bf16)
    for p in load_prompts("gsm-symbolic", split="eval", limit=2):
        for _ in Decoding(q8_verifier, both, p.encode(q8_verifier), max_new_tokens=48):
            pass
    same = sum(a == b for a, b in both.pairs) / len(both.pairs)
    # Int8 rows move a draft logit by ~1%: a slot flips only at a near tie.
    assert len(both.pairs) > 100 and same >= 0.9, same
