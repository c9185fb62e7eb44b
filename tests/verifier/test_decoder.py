"""``specui.verifier.decoder``: the bf16 (int8) verifier's fast forward computes what
transformers' modules compute, bit for bit, and its preallocated cache crops and grows like a
``DynamicCache``."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specui.verifier.decoder import KVBuffer
from specui.verifier.model import Verifier


def _steps(v: Verifier, cache, ids: torch.Tensor, layers: list[int]):
    outs = [v.forward(ids[:20], cache, logits=False)]
    outs.append(v.forward(ids[20:29], cache, aux_layer_ids=layers))  # a verify block
    v.crop(cache, 23)  # a rejection after 3 accepted drafts
    outs.append(v.forward(ids[23:24], cache, aux_layer_ids=layers))  # one-token steps
    outs.append(v.forward(ids[24:25], cache, aux_layer_ids=layers))
    return outs


@pytest.mark.parametrize("precision", ["bf16", "int8"])  # int8: q/k/v and gate/up fused, same bits
def test_the_fast_decoder_gives_the_transformers_logits_and_taps_bit_for_bit(
    fixture_dir, precision
):
    v = Verifier.load(str(fixture_dir / "verifier"), precision=precision)
    assert v._fast is not None and isinstance(v.new_cache(), KVBuffer)
    ids = torch.randint(0, v.vocab_size, (30,), generator=torch.Generator().manual_seed(0))
    layers = list(range(v.num_layers + 1))
    fast = _steps(v, v.new_cache(), ids, layers)
    slow = _steps(v, DynamicCache(config=v.config), ids, layers)
    for f, s in zip(fast, slow, strict=True):
        assert torch.equal(f.logits, s.logits)
        assert (f.aux_hidden is None) == (s.aux_hidden is None)
        assert f.aux_hidden is None or torch.equal(f.aux_hidden, s.aux_hidden)


def test_the_kv_buffer_crops_and_grows_keeping_its_prefix():
    cache = KVBuffer(layers=2, kv_heads=1, head_dim=4, max_len=64, capacity=4)
    cache.reserve(3)
    cache.data[:, :, :, :3] = 1.0
    cache.length = 3
    cache.reserve(10)  # past the capacity: a bigger buffer, the prefix copied
    assert cache.data.shape[3] >= 10 and torch.equal(
        cache.data[:, :, :, :3], torch.ones(2, 2, 1, 3, 4)
    )
    cache.crop(-1)
    assert cache.get_seq_length() == 2
    cache.crop(5)  # keeping more than it holds keeps all
    assert cache.get_seq_length() == 2
