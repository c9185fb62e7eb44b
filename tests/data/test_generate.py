"""The verifier's batched greedy decoder (specui.verifier.batched), held to transformers'
`generate` (its reference), and self_distill on top of it (specui.data.generate)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specui.data.distill import (
    cache_name,
    distill_in_processes,
    self_distill,
    synthetic_prompts,
)
from specui.data.generate import generate_responses
from specui.data.prompts import Prompt
from specui.errors import SpecUIError
from specui.verifier.batched import BatchedDecoder, reference_greedy, unsupported_reason
from tests.support.verifiers import make_tiny_verifier

EOS = 3


def _prompts(n: int, seed: int = 1, vocab: int = 8, lo: int = 2, hi: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    # No EOS inside a prompt: it would not end the prompt, but keeps the test about responses.
    allowed = torch.tensor([t for t in range(vocab) if t != EOS])
    return [allowed[torch.randint(len(allowed), (k,), generator=g)].tolist() for k in lengths]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_verifier(eos=EOS)


def test_batched_fp32_equals_one_prompt_at_a_time(tiny):
    prompts = _prompts(13)
    alone = [reference_greedy(tiny, [p], 30)[0] for p in prompts]
    generator = BatchedDecoder(tiny, torch.float32, slots=4)
    batched = generate_responses(tiny, prompts, 30, batch_size=4, generator=generator)
    assert batched == alone
    lengths = {len(r) for r in alone}
    # Rows end at different times (some at EOS, kept, some at the cap): slots were refilled.
    assert len(lengths) > 2 and 30 in lengths
    assert all(r[-1] == EOS for r in alone if len(r) < 30)
    assert generator.prefills == len(prompts) > generator.slots


def test_slots_are_refilled_as_rows_finish(tiny):
    prompts = _prompts(5, seed=7, lo=3, hi=15)
    assert len({len(p) for p in prompts}) > 2
    generator = BatchedDecoder(tiny, torch.float32, slots=2)
    finished, progress, live = [], [], []

    step = generator.step

    def counting_step(tokens, lengths):
        live.append(tokens.shape[0])
        return step(tokens, lengths)

    generator.step = counting_step
    out = generate_responses(
        tiny,
        prompts,
        12,
        batch_size=2,
        generator=generator,
        on_done=lambda i, r: finished.append((i, r)),
        progress=lambda d, t: progress.append((d, t)),
    )
    assert generator.prefills == 5
    assert sorted(i for i, _ in finished) == list(range(5))
    assert all(out[i] == r for i, r in finished)
    assert progress == [(d, 5) for d in range(1, 6)]
    # Two rows in flight until the prompts run out, then one: never a step on a finished row.
    assert live[0] == 2 and max(live) == 2 and live[-1] == 1
    assert live == sorted(live, reverse=True)
    assert out == [reference_greedy(tiny, [p], 12)[0] for p in prompts]


def test_bf16_batched_matches_fp32_greedy_on_the_tiny_model(tiny):
    prompts = _prompts(6, seed=3)
    fp32 = [reference_greedy(tiny, [p], 16)[0] for p in prompts]
    bf16 = generate_responses(tiny, prompts, 16, batch_size=3, dtype=torch.bfloat16)
    # bf16 weights on a random model: most, not necessarily all, tokens agree.
    same = sum(a == b for r, s in zip(fp32, bf16, strict=True) for a, b in zip(r, s, strict=False))
    assert same >= 0.8 * sum(map(len, fp32))


def test_a_model_the_loop_does_not_cover_falls_back_to_transformers():
    from transformers import LlamaConfig, LlamaForCausalLM

    from specui.verifier.model import Verifier

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        hidden_act="gelu",
        eos_token_id=EOS,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    gelu = Verifier(model.float(), None, name="tiny-gelu")
    assert "gelu" in unsupported_reason(gelu)
    prompts = _prompts(5, seed=5)
    # The loop computes SiLU: had it run, some tokens would differ from the model's own.
    assert generate_responses(gelu, prompts, 10, batch_size=2) == reference_greedy(
        gelu, prompts, 10
    )
    with pytest.raises(SpecUIError, match="gelu"):
        BatchedDecoder(gelu)


def test_bad_arguments_are_user_errors(tiny):
    with pytest.raises(SpecUIError, match="max_new_tokens"):
        generate_responses(tiny, [[1, 2]], 0)
    with pytest.raises(SpecUIError, match="engine"):
        generate_responses(tiny, [[1, 2]], 4, engine="vllm")
    with pytest.raises(SpecUIError, match="empty prompt"):
        generate_responses(tiny, [[]], 4)
    with pytest.raises(SpecUIError, match="no room"):
        generate_responses(tiny, [[1, 2], [1] * tiny.max_context], 4)


def _id_prompts(n: int, seed: int = 0) -> list[Prompt]:
    return synthetic_prompts(n, 8, min_len=3, max_len=12, seed=seed, exclude=[EOS])


def test_self_distill_keeps_what_finished_when_killed_and_resumes(tiny, tmp_path):
    prompts = _id_prompts(7)
    full = self_distill(tiny, prompts, max_new_tokens=10, batch_size=3, engine="transformers")

    class Killed(Exception):
        pass

    def kill_after_three(done: int, total: int) -> None:
        if done == 3:
            raise Killed

    with pytest.raises(Killed):
        self_distill(
            tiny,
            prompts,
            max_new_tokens=10,
            batch_size=3,
            cache_dir=tmp_path,
            progress=kill_after_three,
        )
    path = tmp_path / cache_name(tiny, 10)
    assert len(path.read_text().splitlines()) == 3  # each response appended as it finished

    generated = []

    def record(done: int, total: int) -> None:
        generated.append((done, total))

    again = self_distill(
        tiny, prompts, max_new_tokens=10, batch_size=3, cache_dir=tmp_path, progress=record
    )
    assert again == full
    assert generated[-1] == (4, 4)  # only the four that were missing
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 7


def test_self_distill_engines_agree_and_unknown_engine_is_refused(tiny):
    prompts = _id_prompts(5, seed=2)
    fast = self_distill(tiny, prompts, max_new_tokens=12, batch_size=2)
    assert fast == self_distill(
        tiny, prompts, max_new_tokens=12, batch_size=2, engine="transformers"
    )
    with pytest.raises(SpecUIError, match="engine"):
        self_distill(tiny, prompts, max_new_tokens=12, engine="nope")


def test_worker_processes_fill_one_cache(tmp_path, tiny):
    folder = tmp_path / "tiny"
    model = copy.deepcopy(tiny.model)
    model.generation_config.eos_token_id = EOS
    model.save_pretrained(folder)
    from specui.verifier.model import Verifier

    loaded = Verifier.load(str(folder))
    prompts = _id_prompts(9, seed=4)
    ours = self_distill(
        loaded, prompts[:4], max_new_tokens=8, batch_size=2, cache_dir=tmp_path / "c"
    )
    seen = []
    distill_in_processes(
        str(folder),
        prompts,
        2,
        max_new_tokens=8,
        cache_dir=tmp_path / "c",
        batch_size=2,
        progress=lambda d, t: seen.append((d, t)),
    )
    lines = (tmp_path / "c" / cache_name(loaded, 8)).read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 9  # the four cached ones were not made again
    assert seen[-1] == (5, 5)
    alone = self_distill(loaded, prompts, max_new_tokens=8, engine="transformers")
    assert self_distill(loaded, prompts, max_new_tokens=8, cache_dir=tmp_path / "c") == alone
    assert alone[:4] == ours


def _agreement(reference, other) -> float:
    """Share of reference tokens matched before the first difference of each response."""
    same = 0
    for r, o in zip(reference, other, strict=True):
        for a, b in zip(r, o, strict=False):
            if a != b:
                break
            same += 1
    return same / sum(map(len, reference))


@pytest.mark.slow
def test_embedded_bf16_batched_agrees_with_fp32_as_well_as_transformers_bf16(embedded_verifier):
    from specui.data import load_prompts

    v = embedded_verifier
    prompts = [p.encode(v) for p in load_prompts("general", split="train", limit=8)]
    fp32 = [reference_greedy(v, [p], 24)[0] for p in prompts]
    bf16_model = copy.copy(v)
    bf16_model.model = copy.deepcopy(v.model).to(torch.bfloat16)
    hf_bf16 = reference_greedy(bf16_model, prompts, 24)
    fast = generate_responses(v, prompts, 24, batch_size=3, dtype=torch.bfloat16)
    eos = v.eos_token_ids
    for r in fast:  # cut as reference_greedy cuts: after the first EOS, kept
        assert len(r) <= 24 and not any(t in eos for t in r[:-1])
        assert len(r) == 24 or r[-1] in eos
    assert _agreement(fp32, fast) >= _agreement(fp32, hf_bf16)
    # fp32 through the loop is the model's own greedy decoding.
    assert generate_responses(v, prompts, 24, batch_size=3) == fp32


def test_slot_attention_is_each_rows_own_attention():
    from specui import kernels

    if not kernels.attention_supported(6, 2, 16):
        pytest.skip("SpecUI's CPU kernels do not run here")
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(5, 2, 40, 16, generator=g), torch.randn(5, 2, 40, 16, generator=g)
    q = torch.randn(4, 6, 16, generator=g)
    starts = [3, 39, 0, 17]
    out = kernels.slot_attention(q, keys, values, starts, 0.25)
    for r, start in enumerate(starts):
        alone = kernels.attention(q[r : r + 1], keys[r], values[r], start, 0.25)
        assert torch.equal(out[r : r + 1], alone)
    with pytest.raises(ValueError, match="slot attention"):
        kernels.slot_attention(q, keys, values, [40, 0, 0, 0], 0.25)


def test_a_prompts_prefill_attention_runs_on_the_kernel(embedded_verifier, monkeypatch):
    """Each prompt's prefill attends on the kernel (causal rows over its slot's cache), every
    layer, and the responses stay those of one prompt at a time."""
    from specui import kernels

    generator = BatchedDecoder(embedded_verifier, torch.float32, slots=4)
    if not generator.attention_kernel:
        pytest.skip("SpecUI's CPU kernels do not run here")
    rows = []
    attention = kernels.attention

    def counted(q, *args, **kwargs):
        rows.append(q.shape[0])
        return attention(q, *args, **kwargs)

    monkeypatch.setattr(kernels, "attention", counted)
    prompts = _prompts(5, vocab=500, lo=20, hi=60)
    batched = generate_responses(embedded_verifier, prompts, 8, batch_size=4, generator=generator)
    layers = len(embedded_verifier.model.model.layers)
    assert sorted(rows) == sorted(len(p) for p in prompts for _ in range(layers))
    monkeypatch.setattr(kernels, "attention", attention)
    assert batched == [reference_greedy(embedded_verifier, [p], 8)[0] for p in prompts]
