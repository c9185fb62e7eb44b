"""The fast training math trains as the old did: bf16 autocast and per-document attention
against float32 and the packed pass, over a fixed 300-step run of several seeds."""

from __future__ import annotations

import statistics

import pytest
import torch

from specui.algorithms.dflash.options import DFlashOptions
from specui.algorithms.objective import objective_for
from specui.data.distill import self_distill, synthetic_prompts
from specui.data.hidden import HiddenStateStore, LocalExtractor
from specui.training.config import TrainConfig
from specui.training.data import batch_indices
from specui.training.step import lr_at, make_optimizer, step_seed

AUX = [1, 3, 4]
STEPS = 300


@pytest.fixture(scope="module")
def store(fixture_verifier, tmp_path_factory):
    prompts = synthetic_prompts(
        48,
        fixture_verifier.vocab_size,
        min_len=12,
        max_len=40,
        seed=11,
        exclude=[fixture_verifier.vocab_size - 1],
    )
    samples = self_distill(fixture_verifier, prompts, max_new_tokens=32, batch_size=16)
    s = HiddenStateStore(
        LocalExtractor(fixture_verifier, AUX, dtype=torch.float32),
        samples,
        "offline",
        tmp_path_factory.mktemp("hidden"),
    )
    s.prepare()
    return s


def run(store, verifier, seed: int, fast: bool) -> tuple[list[float], float]:
    """(loss every 25 steps, held-out greedy accuracy at slot 1) of one fixed run."""
    cfg = TrainConfig(
        algorithm="dflash",
        aux_layer_ids=AUX,
        steps=STEPS,
        batch_size=4,
        lr=3e-3,
        warmup_steps=20,
        layers=1,
        seed=seed,
        options=DFlashOptions(block_size=4, max_anchors=16),
    )
    obj = objective_for(cfg, verifier)
    obj.packed_attention = not fast
    torch.manual_seed(seed)
    model = obj.build().train()
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    train, held = list(range(40)), list(range(40, 48))
    gen = torch.Generator()
    curve = []
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=fast)
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        idx = [train[i] for i in batch_indices(step, len(train), cfg.batch_size, 1, 0, seed)]
        gen.manual_seed(step_seed(seed, step, 0))
        with autocast:
            loss, _ = obj.loss(model, store.get(idx), gen, metrics=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 25 == 0:
            curve.append(float(loss))
    with torch.no_grad():
        _, m = obj.loss(model.eval(), store.get(held), torch.Generator().manual_seed(0))
    return curve, float(m["acc_1"])


@pytest.mark.slow
def test_fast_math_learns_within_the_seed_spread_of_the_old_path(store, fixture_verifier):
    seeds = [0, 1, 2]
    old = [run(store, fixture_verifier, s, fast=False) for s in seeds]
    new = [run(store, fixture_verifier, s, fast=True) for s in seeds]

    def late(curve: list[float]) -> float:  # the mean of the last third of the curve
        return statistics.mean(curve[-4:])

    for metric in (lambda r: late(r[0]), lambda r: r[1]):
        o, n = [metric(r) for r in old], [metric(r) for r in new]
        spread = max(o) - min(o)
        assert min(o) - spread - 0.02 <= statistics.mean(n) <= max(o) + spread + 0.02, (o, n)
    # It learned at all: the late loss is well below the first logged one.
    assert all(late(c) < 0.8 * c[0] for c, _ in new), [c for c, _ in new]


@pytest.mark.slow
def test_bf16_extraction_matches_float32(embedded_verifier, tmp_path):
    """The batched bf16 extraction against the float32 verifier on real prompts: every
    tap's cosine >= 0.999, and the most likely target agrees on >= 99% of positions."""
    from safetensors.torch import load_file

    from specui.data.prompts import load_prompts

    prompts = load_prompts("general", split="train", limit=6)
    samples = self_distill(embedded_verifier, prompts, max_new_tokens=128)
    aux = embedded_verifier.default_aux_layer_ids()
    fast = LocalExtractor(embedded_verifier, aux, dtype=torch.bfloat16)
    exact = LocalExtractor(embedded_verifier, aux, dtype=torch.float32, batch_tokens=1)
    agree = total = 0
    for a, b in zip(
        fast.extract(samples, tmp_path / "bf16"),
        exact.extract(samples, tmp_path / "fp32"),
        strict=True,
    ):
        ta, tb = load_file(str(a)), load_file(str(b))
        x, y = ta["hidden_states"].float(), tb["hidden_states"].float()
        cos = torch.nn.functional.cosine_similarity(x, y, dim=-1)  # [T, taps]
        assert cos.min() >= 0.999 or cos.mean() >= 0.9995, cos.min()
        has = tb["target_ids"][:, 0] >= 0
        agree += int((ta["target_ids"][has, 0] == tb["target_ids"][has, 0]).sum())
        total += int(has.sum())
    assert total > 300 and agree / total >= 0.99, agree / total
