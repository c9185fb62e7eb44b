"""The training objectives against the speculators 0.9.0 reference layouts, and the
small pieces (weights, anchors, metrics, schedule) on hand-made inputs."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from specui.algorithms import algorithm_names
from specui.algorithms.checkpoint import load_model
from specui.algorithms.dflash.objective import decay_weights, dpace_weights, select_anchors
from specui.algorithms.eagle3.objective import pack_shifted
from specui.algorithms.objective import (
    Targets,
    block_metrics,
    most_frequent_tokens,
    objective_for,
    pack,
)
from specui.data.hidden import SampleTensors, topk_targets
from specui.errors import SpecUIError
from specui.training.config import TrainConfig
from specui.training.data import batch_indices
from specui.training.step import lr_at
from tests.support.families import dflash_family, eagle_family

ATOL = 1e-4


def ref(fixture_dir, algo: str) -> dict[str, torch.Tensor]:
    return load_file(str(fixture_dir / algo / "reference.safetensors"))


def with_targets(verifier, input_ids, hidden_states, last_hidden, loss_mask) -> SampleTensors:
    """A sample as the extraction writes it: the verifier's top-k after each position."""
    ids, logprobs = topk_targets(verifier, last_hidden)
    return SampleTensors(
        input_ids=input_ids,
        hidden_states=hidden_states,
        target_ids=ids,
        target_logprobs=logprobs,
        loss_mask=loss_mask,
    )


def unshifted_sample(r: dict[str, torch.Tensor], verifier) -> SampleTensors:
    return with_targets(
        verifier,
        r["input_ids"][0],
        r["hidden_states"][0],
        r["verifier_last_hidden_states"][0],
        r["loss_mask"][0],
    )


def objective(algo: str, verifier, **kw):
    cfg = TrainConfig.from_dict(
        {"algorithm": algo, "aux_layer_ids": [1, 3, 4], "block_size": 8, **kw}
    )
    return objective_for(cfg, verifier)


def assert_targets_match(got: Targets, dense: torch.Tensor) -> None:
    """Stored top-k targets are the top-k of the reference's dense verifier logits."""
    want = Targets.from_logits(dense, got.ids.shape[-1])
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("algo", dflash_family())
def test_block_layout_matches_the_speculators_reference(algo, fixture_dir, fixture_verifier):
    r = ref(fixture_dir, algo)
    obj = objective(algo, fixture_verifier, max_anchors=512)
    model = load_model(fixture_dir / algo, fixture_verifier)
    # loss_mask is 1 only at position 20, so the anchor is deterministic (as in the reference).
    sample = unshifted_sample(r, fixture_verifier)
    _, anchors, out, targets, valid = obj.blocks(model, [sample], torch.Generator().manual_seed(0))
    assert anchors.tolist() == r["anchor_position"].tolist()
    # One anchor: [A=1, B, ...] as the reference's [batch=1, B, ...].
    assert_targets_match(targets, r["block_targets"])
    torch.testing.assert_close(out.logits, r["block_logits"], atol=ATOL, rtol=0)
    assert valid.tolist() == r["block_loss_mask"].bool().tolist()
    if algo == "dspark":
        torch.testing.assert_close(out.markov_logits, r["markov_logits"], atol=ATOL, rtol=0)
        torch.testing.assert_close(out.confidence_logits, r["confidence_logits"], atol=ATOL, rtol=0)


def verifier_sample(fixture_dir, verifier) -> SampleTensors:
    v = load_file(str(fixture_dir / "verifier" / "reference.safetensors"))
    taps = v["taps"]  # [N+1, T, H]
    return with_targets(
        verifier,
        v["input_ids"],
        torch.cat([taps[i] for i in (1, 3, 4)], -1),
        taps[-1],
        torch.ones_like(v["input_ids"]),
    )


@pytest.mark.parametrize("algo", eagle_family())
def test_shifted_layout_matches_the_speculators_reference(algo, fixture_dir, fixture_verifier):
    r = ref(fixture_dir, algo)
    p = pack_shifted([verifier_sample(fixture_dir, fixture_verifier)])
    assert p.input_ids.tolist() == r["input_ids"][0].tolist()
    torch.testing.assert_close(p.hidden_states, r["hidden_states"][0], atol=ATOL, rtol=0)
    # The shifted targets are the verifier's after the reference's last-layer states.
    ref_ids, ref_lp = topk_targets(fixture_verifier, r["verifier_last_hidden_states"][0])
    assert torch.equal(p.target_ids, ref_ids)
    targets = Targets(p.target_ids, p.target_logprobs)
    if algo == "eagle3":  # step s of row i is scored against row i+s: step 0 against row i itself
        assert_targets_match(targets, r["step0_targets"][0])
    else:  # row (a, d) is scored against the verifier at shifted index a+d
        q = r["row_anchor_pos"][r["chain_row_indices"]] + r["row_depth"][r["chain_row_indices"]]
        assert_targets_match(targets[q], r["chain_targets"])


@pytest.mark.parametrize("algo", algorithm_names(trainable=True))
def test_loss_is_finite_and_reaches_every_trainable_parameter(algo, fixture_dir, fixture_verifier):
    obj = objective(algo, fixture_verifier, markov_rank=16, max_anchors=8)
    model = obj.build().train()
    s = verifier_sample(fixture_dir, fixture_verifier)
    loss, metrics = obj.loss(model, [s, s], torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)
    loss.backward()
    no_grad = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)
    ]
    assert no_grad == []
    assert 1.0 <= float(metrics["accept_len"]) <= 1 + obj.num_positions


def test_kl_loss_option_changes_the_loss(fixture_dir, fixture_verifier):
    s = verifier_sample(fixture_dir, fixture_verifier)
    ce = objective("dflash", fixture_verifier, max_anchors=8)
    kl = objective("dflash", fixture_verifier, max_anchors=8, loss="kl")
    model = ce.build()
    g = torch.Generator
    assert not torch.isclose(
        ce.loss(model, [s], g().manual_seed(0))[0], kl.loss(model, [s], g().manual_seed(0))[0]
    )


def test_unknown_loss_is_refused():
    with pytest.raises(SpecUIError, match="loss"):
        TrainConfig(algorithm="dflash", loss="hinge")


# --- pieces ------------------------------------------------------------------------------------


def test_decay_weights_follow_exp_minus_k_minus_1_over_gamma():
    w = decay_weights(4, gamma=2.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-1.5)]))


def test_dpace_weights_a_slot_by_the_accepted_tokens_it_gates():
    # Slot 0 certain, slot 1 hopeless: slot 0 gates itself and (a little of) the rest.
    ce = torch.tensor([[0.0, 50.0, 0.0]])
    w = dpace_weights(ce, torch.ones(1, 3), alpha=0.0)
    assert torch.allclose(w, torch.tensor([[1.0, 0.0, 0.0]]), atol=1e-6)
    w_smooth = dpace_weights(ce, torch.ones(1, 3), alpha=0.5)
    assert w_smooth[0, 0] > w_smooth[0, 1] > w_smooth[0, 2] > 0
    assert dpace_weights(ce, torch.tensor([[1.0, 0.0, 1.0]]))[0, 1] == 0  # masked slot


def test_block_metrics_count_leading_correct_slots():
    correct = torch.tensor([[True, True, False], [False, True, True], [True, True, True]])
    accept = torch.tensor([[1.0, 0.5, 0.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    m = block_metrics(correct, accept, mask, 3)
    assert float(m["acc_1"]) == pytest.approx(2 / 3)
    assert float(m["acc_3"]) == pytest.approx(1 / 2)  # the third block has no slot 3
    assert float(m["accept_len"]) == pytest.approx(1 + (2 + 0) / 2)  # complete blocks only
    assert float(m["accept_len_expected"]) == pytest.approx(1 + (1.5 + 0) / 2)


def test_anchors_are_response_positions_away_from_each_documents_end():
    def sample(n: int, prompt: int) -> SampleTensors:
        mask = torch.zeros(n, dtype=torch.long)
        mask[prompt:] = 1
        k = torch.zeros(n, 4, dtype=torch.long)
        return SampleTensors(
            torch.zeros(n, dtype=torch.long), torch.zeros(n, 2), k, k.float(), mask
        )

    p = pack([sample(20, 5), sample(12, 2)])
    anchors = select_anchors(p, block_size=4, max_anchors=100, gen=torch.Generator())
    assert anchors.tolist() == list(range(5, 16)) + list(range(20 + 2, 20 + 8))
    few = select_anchors(p, block_size=4, max_anchors=3, gen=torch.Generator().manual_seed(1))
    assert len(few) == 6 and few.tolist() == sorted(few.tolist())


def test_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(algorithm="dflash", lr=1.0, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)
    assert lr_at(110, cfg) == pytest.approx(0.1)
    lin = TrainConfig(
        algorithm="dflash", lr=1.0, warmup_steps=0, steps=100, min_lr_ratio=0.0, schedule="linear"
    )
    assert lr_at(25, lin) == pytest.approx(0.75)


def test_batches_cover_each_epoch_once_and_split_across_processes():
    seen = [i for step in range(5) for i in batch_indices(step, 10, 2, 1, 0, seed=3)]
    assert sorted(seen) == list(range(10))
    r0, r1 = batch_indices(0, 10, 2, 2, 0, 3), batch_indices(0, 10, 2, 2, 1, 3)
    assert not set(r0) & set(r1)


def test_draft_vocabulary_is_the_most_frequent_response_tokens():
    from specui.data.distill import TokenSample

    samples = [TokenSample("a", (9, 9, 9), (5, 5, 5, 7, 7, 1)), TokenSample("b", (9,), (7, 3))]
    assert most_frequent_tokens(samples, 10, 3).tolist() == [
        1,
        5,
        7,
    ]  # 7x3, 5x3, then ids 1 and 3 once: 1 first
    assert most_frequent_tokens(samples, 10, 6).tolist() == [
        0,
        1,
        2,
        3,
        5,
        7,
    ]  # padded with the lowest ids


# --- per-document attention ------------------------------------------------------------------


def two_documents(fixture_dir, verifier) -> list[SampleTensors]:
    s = verifier_sample(fixture_dir, verifier)
    n = len(s)
    cut = SampleTensors(
        *(
            t[: n * 2 // 3]
            for t in (s.input_ids, s.hidden_states, s.target_ids, s.target_logprobs, s.loss_mask)
        )
    )
    return [s, cut]


@pytest.mark.parametrize("algo", algorithm_names(trainable=True))
def test_per_document_attention_gives_the_packed_loss_and_gradients(
    algo, fixture_dir, fixture_verifier
):
    """One pass per document computes what the packed pass under its document mask did
    (to 1e-5 in float32), without the scores across documents."""
    obj = objective(algo, fixture_verifier, markov_rank=16, max_anchors=8)
    model = obj.build().train()
    batch = two_documents(fixture_dir, fixture_verifier)
    results = []
    for packed in (True, False):
        obj.packed_attention = packed
        model.zero_grad()
        loss, metrics = obj.loss(model, batch, torch.Generator().manual_seed(0))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), metrics, grads))
    (l0, m0, g0), (l1, m1, g1) = results
    torch.testing.assert_close(l1, l0, atol=1e-5, rtol=1e-5)
    assert g0.keys() == g1.keys() and g0
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4, msg=name)
    assert m0["accept_len"] == pytest.approx(float(m1["accept_len"]), nan_ok=True)


def test_dflash_blocks_of_each_document_match_the_packed_pass(fixture_dir, fixture_verifier):
    obj = objective("dflash", fixture_verifier, max_anchors=8)
    model = obj.build()
    batch = two_documents(fixture_dir, fixture_verifier)
    outs = []
    for packed in (True, False):
        obj.packed_attention = packed
        _, anchors, out, _, valid = obj.blocks(model, batch, torch.Generator().manual_seed(0))
        outs.append((anchors, out.logits, valid))
    (a0, x0, v0), (a1, x1, v1) = outs
    assert torch.equal(a0, a1) and torch.equal(v0, v1) and len(a0) > 8  # anchors in both documents
    torch.testing.assert_close(x1[v1], x0[v0], atol=1e-5, rtol=0)


def test_metrics_are_computed_only_when_asked(fixture_dir, fixture_verifier):
    obj = objective("dflash", fixture_verifier, max_anchors=8)
    model = obj.build()
    s = verifier_sample(fixture_dir, fixture_verifier)
    loss, metrics = obj.loss(model, [s], torch.Generator().manual_seed(0), metrics=False)
    assert metrics == {} and torch.isfinite(loss)
    loss2, metrics2 = obj.loss(model, [s], torch.Generator().manual_seed(0))
    assert loss2 == loss and "accept_len" in metrics2


def test_targets_outside_the_draft_vocabulary_are_dropped():
    """A reduced draft vocabulary keeps the best kept token as the target; a position
    whose top-k holds none is no target at all."""
    t = Targets(
        torch.tensor([[5, 2, 9], [7, 8, 4]]), torch.tensor([[-0.1, -2.0, -3.0], [-0.5, -1.0, -4.0]])
    )
    from specui.algorithms.objective import draft_index

    d = t.to_draft(draft_index(torch.tensor([2, 9]), 10))
    assert d.top.tolist() == [0, -1]  # token 2 is draft slot 0; row 1 keeps nothing
    assert d.valid.tolist() == [True, False]
    assert d.ids[0].tolist() == [0, 1, -1]
    p = d.probs()
    assert p[0, 2] == 0 and p[0].sum() == pytest.approx(1.0) and p[1].sum() == 0
