"""The four learned drafters: checkpoints round-trip, inference agrees with training, bad files
are refused.

Uses the tiny fixture verifier (6 layers, hidden 64, vocab 512): everything here runs in seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specui.algorithms import algorithm_names, create_drafter
from specui.algorithms.base import DraftContext
from specui.algorithms.checkpoint import load_drafter, save_drafter, validate_checkpoint
from specui.algorithms.dspark.drafter import ConfidencePolicy
from specui.errors import SpecUIError
from specui.trace import SamplingParams
from specui.verifier.model import Verifier
from tests.support.families import dflash_family
from tests.support.paths import FIXTURES

ALGOS = algorithm_names()
DFLASH_FAMILY = dflash_family()
TOL = 1e-4


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    return Verifier.load(str(FIXTURES / "verifier"))


@pytest.fixture(scope="module")
def seq(verifier: Verifier) -> tuple[torch.Tensor, torch.Tensor]:
    """A random 40-token sequence and the verifier taps of every aux layer id 0..N: [T, N+1, H]."""
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, verifier.vocab_size - 1, (40,), generator=g)
    return x, verifier.taps(x, list(range(verifier.num_layers + 1)))


def features(taps: torch.Tensor, aux: list[int]) -> torch.Tensor:
    return taps[:, aux].flatten(1)  # [T, n_aux*H]


def ctx(
    ids: torch.Tensor,
    feats: torch.Tensor,
    sampling: SamplingParams | None = None,
    generator: torch.Generator | None = None,
) -> DraftContext:
    return DraftContext(
        token_ids=ids, features=feats, sampling=sampling or SamplingParams(), generator=generator
    )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# --- round trip and checkpoint schema ---------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_round_trip_gives_identical_weights_and_proposals(
    algo: str, verifier: Verifier, seq, tmp_path: Path
) -> None:
    x, taps = seq
    d = create_drafter(algo, verifier, seed=1)
    save_drafter(d, tmp_path / algo)
    loaded = load_drafter(tmp_path / algo, verifier)
    a, b = d.model.state_dict(), loaded.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    f = features(taps, d.aux_layer_ids)
    p1, p2 = d.propose(ctx(x[:25], f[:24])), loaded.propose(ctx(x[:25], f[:24]))
    assert p1.token_ids == p2.token_ids and len(p1) == d.num_speculative_tokens
    hot = SamplingParams(temperature=1.0)
    s1, s2 = (
        m.propose(ctx(x[:25], f[:24], hot, torch.Generator().manual_seed(3))) for m in (d, loaded)
    )
    assert s1.token_ids == s2.token_ids and torch.equal(s1.probs, s2.probs)


def _schema(v: object) -> object:
    """Keys and value types, recursively (null matches any type: nullable fields)."""
    if isinstance(v, dict):
        return {k: _schema(v[k]) for k in v}
    if isinstance(v, list):
        return [_schema(v[0])] if v else []
    return type(v).__name__


def _same_schema(got: object, want: object, path: str = "") -> list[str]:
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{path}: {got} is not an object"]
        out = [f"{path}.{k}: missing" for k in want.keys() - got.keys()]
        out += [f"{path}.{k}: not in the fixture" for k in got.keys() - want.keys()]
        return out + [
            p
            for k in want.keys() & got.keys()
            for p in _same_schema(got[k], want[k], f"{path}.{k}")
        ]
    if isinstance(want, list):
        return [] if not want or not got else _same_schema(got[0], want[0], path + "[0]")
    if (
        "NoneType" in (got, want)
        or got == want
        or {got, want} == {"int", "float"}
        and want == "float"
    ):
        return []
    return [f"{path}: {got} where the fixture has {want}"]


@pytest.mark.parametrize("algo", ALGOS)
def test_saved_config_has_the_fixture_keys_and_types(
    algo: str, verifier: Verifier, tmp_path: Path
) -> None:
    save_drafter(create_drafter(algo, verifier, seed=0), tmp_path)
    got = json.loads((tmp_path / "config.json").read_text())
    want = json.loads((FIXTURES / algo / "config.json").read_text())
    assert _same_schema(_schema(got), _schema(want)) == []
    assert got["speculators_model_type"] == algo and got["speculators_version"] == "0.9.0"
    assert (
        got["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        == create_drafter(algo, verifier, seed=0).num_speculative_tokens
    )


@pytest.mark.parametrize("algo", ALGOS)
def test_fixture_checkpoint_saves_back_with_the_same_config(
    algo: str, verifier: Verifier, tmp_path: Path
) -> None:
    d = load_drafter(FIXTURES / algo, verifier)
    save_drafter(d, tmp_path)
    got = json.loads((tmp_path / "config.json").read_text())
    want = json.loads((FIXTURES / algo / "config.json").read_text())
    for volatile in ("transformers_version",):
        got.pop(volatile), want.pop(volatile)
    assert got == want
    saved, orig = (
        load_file(tmp_path / "model.safetensors"),
        load_file(FIXTURES / algo / "model.safetensors"),
    )
    assert saved.keys() == orig.keys() and all(torch.equal(saved[k], orig[k]) for k in orig)


def test_bfloat16_checkpoint_records_its_dtype_and_loads_as_float32(
    verifier: Verifier, seq, tmp_path: Path
) -> None:
    d = create_drafter("dflash", verifier, seed=2)
    save_drafter(d, tmp_path, dtype="bfloat16")
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_file(tmp_path / "model.safetensors")["fc.weight"].dtype == torch.bfloat16
    loaded = load_drafter(tmp_path, verifier)
    assert loaded.model.fc.weight.dtype == torch.float32
    assert torch.equal(loaded.model.fc.weight, d.model.fc.weight.to(torch.bfloat16).float())


def test_failed_save_keeps_the_previous_checkpoint(
    verifier: Verifier, tmp_path: Path, monkeypatch
) -> None:
    import specui.algorithms.checkpoint as ckpt

    first = create_drafter("eagle3", verifier, seed=3)
    save_drafter(first, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", broken_save)
    with pytest.raises(OSError):
        save_drafter(create_drafter("eagle3", verifier, seed=4), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp files either
    assert validate_checkpoint(tmp_path, verifier) == []


# --- the incremental inference path agrees with the training layout ---------------------------


def sliding(window: int) -> dict:
    """Two sliding-attention layers with the given window (a variant's keywords)."""
    return dict(layer_types=["sliding_attention"] * 2, sliding_window=window)


DFLASH_VARIANTS = {
    "dflash": dict(num_layers=2, block_size=6),
    # sliding layers, causal inside the block, a window shorter than the context
    "dflash-sliding-causal": dict(
        num_layers=2, block_size=5, **sliding(7), sliding_window_non_causal=False
    ),
    "dflash-reduced-vocab": dict(num_layers=1, block_size=4, draft_vocab=list(range(0, 512, 3))),
    "dspark": dict(num_layers=2, block_size=5, markov_rank=8),
    "dspark-no-markov": dict(num_layers=1, block_size=4, markov_rank=0),
    "dspark-gated": dict(num_layers=1, block_size=4, markov_rank=8, markov_head_type="gated"),
    "dspark-rnn-not-from-anchor": dict(
        num_layers=1, block_size=5, markov_rank=8, markov_head_type="rnn", sample_from_anchor=False
    ),
}


def _drafter(algo: str, verifier: Verifier, seq, seed: int, **sizes):  # noqa: ANN202
    """(a new drafter of ``algo``, the token ids of ``seq``, the taps of ``seq`` it reads)."""
    x, taps = seq
    d = create_drafter(algo, verifier, seed=seed, **sizes)
    return d, x, features(taps, d.aux_layer_ids)


def _variant(variants: dict, variant: str, verifier: Verifier, seq, seed: int):  # noqa: ANN202
    """(its algorithm, then ``_drafter``'s three) for ``variants[variant]``'s sizes."""
    algo = variant.split("-")[0]
    return algo, *_drafter(algo, verifier, seq, seed, **variants[variant])


def test_every_registered_learned_algorithm_is_held_to_its_training_forward() -> None:
    """The two tests below hold each drafter's one serving path (its call, in torch ops here: the
    same contract the C call is held to in test_one_call_drafting.py) to its module's training
    forward.  A newly registered algorithm fails here until a variant of it is added."""
    covered = {v.split("-")[0] for v in [*DFLASH_VARIANTS, *EAGLE_VARIANTS]}
    registered = set(algorithm_names())
    assert registered and registered <= covered, sorted(registered - covered)


@pytest.mark.parametrize("variant", DFLASH_VARIANTS)
def test_dflash_family_inference_matches_training_forward(
    variant: str, verifier: Verifier, seq
) -> None:
    algo, d, x, f = _variant(DFLASH_VARIANTS, variant, verifier, seq, 5)
    m = d.model
    anchors = torch.tensor([3, 9, 10, 17, 30])
    with torch.no_grad():
        out = m.forward_blocks(f, x, anchors)
    for a, p in enumerate(anchors.tolist()):  # one growing generation: caches extend step by step
        _, logits = d.draft_block(ctx(x[: p + 1], f[:p]))
        assert max_diff(logits, out.logits[a]) <= TOL, f"anchor {p}"
        if algo == "dspark":
            first = 0 if m.config.sample_from_anchor else 1
            forced = x[p + 1 : p + 1 + d.num_speculative_tokens].tolist()
            _, _, mk, conf = d.draft_chain(ctx(x[: p + 1], f[:p]), forced_tokens=forced)
            assert max_diff(mk, out.markov_logits[a, first:]) <= TOL
            assert max_diff(conf, out.confidence_logits[a, first:]) <= TOL
    if "sliding" in variant:  # the window and in-block causality really shape the result
        m.config.sliding_window_non_causal = True
        _, bidir = d.draft_block(ctx(x[:31], f[:30]))
        assert max_diff(bidir[0], out.logits[-1, 0]) > 1e-3  # slot 0 now sees the later slots
        m.config.sliding_window_non_causal, m.config.layer.sliding_window = False, 1000
        d.reset()
        _, wide = d.draft_block(ctx(x[:31], f[:30]))
        assert max_diff(wide, out.logits[-1]) > 1e-3  # context beyond 7 positions now counts


EAGLE_VARIANTS = {
    "eagle3": dict(num_speculative_tokens=3),
    "eagle3-2layers-sliding": dict(
        num_layers=2,
        num_speculative_tokens=3,
        **sliding(6),
        norm_output=False,
        norm_before_residual=False,
    ),
    "eagle3-qwen3-fcnorm": dict(
        model_type="qwen3", num_speculative_tokens=2, norm_before_fc=False, fc_norm=True
    ),
    "peagle": dict(num_speculative_tokens=4),
    "peagle-sliding-reduced-vocab": dict(
        num_speculative_tokens=3,
        **sliding(5),
        draft_vocab=list(range(100, 400)),
    ),
}


@pytest.mark.parametrize("variant", EAGLE_VARIANTS)
def test_eagle_family_inference_matches_training_forward(
    variant: str, verifier: Verifier, seq
) -> None:
    algo, d, x, f = _variant(EAGLE_VARIANTS, variant, verifier, seq, 6)
    m, K = d.model, d.num_speculative_tokens
    T1 = x.numel() - 1  # shifted layout: row i = (x[i+1], taps of position i)
    rows = [2, 3, 15, 16, 27]
    if algo == "eagle3":
        with torch.no_grad():
            out = m.forward_ttt(f[:T1], x[1:], K)
        for i in rows:
            _, _, logits = d.draft_steps(
                ctx(x[: i + 2], f[: i + 1]), forced_tokens=x[i + 2 : i + 2 + K].tolist()
            )
            assert max_diff(logits, out.logits[:, i]) <= TOL, f"row {i}"
    else:
        anchors = torch.cat([torch.arange(T1)] + [torch.tensor(rows)] * (K - 1))
        depths = torch.cat(
            [torch.zeros(T1, dtype=torch.long)] + [torch.full((len(rows),), k) for k in range(1, K)]
        )
        with torch.no_grad():
            out = m.forward_rows(f[:T1], x[1:], anchors, depths)
        for n, i in enumerate(rows):
            want = torch.stack(
                [out.logits[i]] + [out.logits[T1 + k * len(rows) + n] for k in range(K - 1)]
            )
            assert max_diff(d.draft_rows(ctx(x[: i + 2], f[: i + 1])), want) <= TOL, f"anchor {i}"


@pytest.mark.parametrize("algo", ALGOS)
def test_training_forwards_train_the_drafter_and_never_the_verifier(
    algo: str, verifier: Verifier, seq
) -> None:
    x, taps = seq
    m = create_drafter(algo, verifier, seed=13).model
    f = features(taps, m.config.aux_layer_ids)
    if algo in DFLASH_FAMILY:
        out = m.forward_blocks(f, x, torch.tensor([4, 12, 20]))
        loss = (out.markov_logits if algo == "dspark" else out.logits).logsumexp(-1).sum()
        if algo == "dspark":
            loss = loss + out.confidence_logits.sum()
    elif algo == "eagle3":
        loss = m.forward_ttt(f[:-1], x[1:], 3).logits.logsumexp(-1).sum()
    else:
        out = m.forward_rows(
            f[:-1], x[1:], torch.tensor([0, 1, 2, 3, 1, 2, 1]), torch.tensor([0, 0, 0, 0, 1, 1, 2])
        )
        loss = out.logits.logsumexp(-1).sum()
    loss.backward()
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight"} <= trainable
    assert all(m.get_parameter(n).grad is not None for n in trainable)
    assert ("embed_tokens.weight" in trainable) == (
        algo == "peagle"
    )  # P-EAGLE trains its own embedding
    assert "lm_head.weight" not in trainable
    assert all(p.grad is None for p in verifier.model.parameters())


@pytest.mark.parametrize("algo", ALGOS)
def test_asking_twice_or_restarting_gives_the_same_proposal(
    algo: str, verifier: Verifier, seq
) -> None:
    d, x, f = _drafter(algo, verifier, seq, 8)
    first = d.propose(ctx(x[:20], f[:19])).token_ids
    assert d.propose(ctx(x[:20], f[:19])).token_ids == first  # same step again (no reset)
    d.propose(ctx(x[:33], f[:32]))
    other = x.clone()
    other[5] = (other[5] + 1) % 500  # a different prompt without reset(): caches must notice
    d.propose(ctx(other[:25], f[:24]))
    d.reset()
    assert d.propose(ctx(x[:20], f[:19])).token_ids == first


# --- proposals ------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_proposal_probs_are_the_processed_draft_distribution(
    algo: str, verifier: Verifier, seq
) -> None:
    d, x, f = _drafter(algo, verifier, seq, 9)
    greedy = d.propose(ctx(x[:20], f[:19]))
    # Greedy drafts are deterministic: no q (acceptance reads it as one-hot on the token), and
    # the tokens are the argmaxes, which a near-zero temperature draws as well.
    assert greedy.probs is None and len(greedy) == d.num_speculative_tokens
    cold = d.propose(
        ctx(x[:20], f[:19], SamplingParams(temperature=1e-4), torch.Generator().manual_seed(0))
    )
    assert cold.token_ids == greedy.token_ids
    assert torch.equal(cold.probs.argmax(-1), torch.tensor(greedy.token_ids))
    sampling = SamplingParams(temperature=1.3, top_k=50)
    draws = [
        d.propose(ctx(x[:20], f[:19], sampling, torch.Generator().manual_seed(s)))
        for s in (1, 1, 2)
    ]
    assert draws[0].token_ids == draws[1].token_ids  # the generator decides
    for p in draws:
        assert torch.allclose(p.probs.sum(-1), torch.ones(len(p)))
        assert ((p.probs > 0).sum(-1) <= 50).all()
        assert all(p.probs[k, t] > 0 for k, t in enumerate(p.token_ids))


def test_reduced_draft_vocabulary_drafts_only_kept_tokens(
    verifier: Verifier, seq, tmp_path: Path
) -> None:
    x, taps = seq
    kept = list(range(1, 512, 2))
    d = create_drafter("dspark", verifier, seed=10, markov_rank=4, draft_vocab=kept)
    f = features(taps, d.aux_layer_ids)
    p = d.propose(
        ctx(x[:20], f[:19], SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    )
    assert set(p.token_ids) <= set(kept)
    assert p.probs[:, 0::2].sum() == 0
    save_drafter(d, tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert stored["t2d"].dtype == torch.bool and int(stored["t2d"].sum()) == len(kept)
    assert (
        "lm_head.weight" not in stored
    )  # DFlash family: the verifier's head, draft rows picked at load
    assert (
        load_drafter(tmp_path, verifier).propose(ctx(x[:20], f[:19])).token_ids
        == d.propose(ctx(x[:20], f[:19])).token_ids
    )


@pytest.mark.parametrize("algo", ALGOS)
def test_a_single_committed_token_is_handled(algo: str, verifier: Verifier, seq) -> None:
    d, x, f = _drafter(algo, verifier, seq, 11)
    p = d.propose(ctx(x[:1], f[:0]))
    # A block drafts from the anchor alone; EAGLE rows need one feature.
    assert len(p) == (d.num_speculative_tokens if algo in DFLASH_FAMILY else 0)


def test_load_drafter_overrides_k(verifier: Verifier, seq) -> None:
    x, taps = seq
    for i, algo in enumerate(ALGOS):
        k = 5 if i % 2 else 2  # away from each fixture's own K (7, 8, 4, 3)
        d = load_drafter(FIXTURES / algo, verifier, num_speculative_tokens=k)
        assert d.num_speculative_tokens == k
        assert len(d.propose(ctx(x[:20], features(taps, d.aux_layer_ids)[:19]))) == k


def test_load_drafter_passes_options_to_the_drafter(verifier: Verifier) -> None:
    d = load_drafter(
        FIXTURES / "dspark", verifier, confidence_policy={"mode": "threshold", "threshold": 0.4}
    )
    assert d.confidence_policy == ConfidencePolicy(mode="threshold", threshold=0.4)
    with pytest.raises(SpecUIError, match="confidence_policy"):
        load_drafter(FIXTURES / "dflash", verifier, confidence_policy={"mode": "threshold"})
    with pytest.raises(SpecUIError, match="confidence policy"):
        load_drafter(
            FIXTURES / "dspark", verifier, confidence_policy={"mode": "threshold", "cutoff": 1}
        )


def test_create_sets_k_from_either_block_size_or_num_speculative_tokens(verifier: Verifier) -> None:
    assert create_drafter("dflash", verifier, num_speculative_tokens=5).model.config.block_size == 6
    assert (
        create_drafter(
            "dspark", verifier, num_speculative_tokens=5, markov_rank=4
        ).model.config.block_size
        == 5
    )
    assert (
        create_drafter("dspark", verifier, block_size=7, markov_rank=4).num_speculative_tokens == 7
    )
    with pytest.raises(SpecUIError, match="block_size"):
        create_drafter("dflash", verifier, num_speculative_tokens=5, block_size=5)


def test_create_rejects_bad_options(verifier: Verifier) -> None:
    with pytest.raises(SpecUIError, match="unknown dflash option"):
        create_drafter("dflash", verifier, markov_rank=3)
    with pytest.raises(SpecUIError, match="out of range"):
        create_drafter("eagle3", verifier, aux_layer_ids=[1, 9])
    with pytest.raises(SpecUIError, match="mask_token_id"):
        create_drafter("peagle", verifier, mask_token_id=512)
    with pytest.raises(SpecUIError, match="unknown speculators_model_type"):
        create_drafter("medusa", verifier)


# --- DSpark confidence policy ---------------------------------------------------------------


def test_a_runs_confidence_policy_is_labelled_by_the_dspark_package() -> None:
    from specui.algorithms.dspark.policy import policy_option
    from specui.service import DecodeRequest, run_settings

    def label(mode: str) -> str | None:
        request = DecodeRequest(
            drafter="dspark", drafter_options={"confidence_policy": policy_option(mode, 0.3)}
        )
        return run_settings(request, 7).confidence_policy

    assert (label("threshold"), label("cost"), label("off")) == ("threshold:0.3", "cost:0.3", None)
    assert run_settings(DecodeRequest(drafter="dflash"), 7).confidence_policy is None


def test_confidence_policy_threshold_keeps_the_surviving_prefix() -> None:
    conf = [0.9, 0.8, 0.9, 0.5, 0.99]  # cumprod 0.9, 0.72, 0.648, 0.324, 0.321
    assert ConfidencePolicy().keep(conf) == 5  # off
    assert ConfidencePolicy(mode="threshold", threshold=0.7).keep(conf) == 2
    assert ConfidencePolicy(mode="threshold", threshold=0.3).keep(conf) == 5
    assert ConfidencePolicy(mode="threshold", threshold=0.95).keep(conf) == 1  # min_tokens
    assert ConfidencePolicy(mode="threshold", threshold=0.95, min_tokens=0).keep(conf) == 0


def test_confidence_policy_cost_maximises_tokens_per_cost() -> None:
    conf = [0.9, 0.8, 0.9, 0.5, 0.99]
    survive = torch.tensor(conf).cumprod(0).tolist()
    for token_cost in (0.0, 0.05, 0.3, 2.0):
        policy = ConfidencePolicy(
            mode="cost", draft_cost=0.2, verify_cost=1.0, verify_token_cost=token_cost
        )
        rate = [(1 + sum(survive[:n])) / (0.2 + 1.0 + token_cost * n) for n in range(1, 6)]
        assert policy.keep(conf) == 1 + max(range(5), key=lambda n: (rate[n], -n))
    assert (
        ConfidencePolicy(mode="cost", verify_token_cost=0.0).keep(conf) == 5
    )  # free tokens: send all
    assert ConfidencePolicy(mode="cost", verify_token_cost=5.0).keep(conf) == 1
    with pytest.raises(SpecUIError):
        ConfidencePolicy(mode="sometimes")


def test_dspark_policy_truncates_the_proposal_and_reports_dropped_scores(
    verifier: Verifier, seq
) -> None:
    d, x, f = _drafter("dspark", verifier, seq, 12, markov_rank=8, block_size=6)

    def drafted():  # sampled, so the proposal carries q to cut as well
        return d.propose(
            ctx(x[:20], f[:19], SamplingParams(temperature=1.0), torch.Generator().manual_seed(4))
        )

    full = drafted()
    assert len(full.confidences) == 6 and full.truncated_confidences is None
    survive = torch.tensor(full.confidences).cumprod(0)
    threshold = float((survive[1] + survive[2]) / 2)  # between the 2nd and 3rd slot's survival
    d.confidence_policy = ConfidencePolicy(mode="threshold", threshold=threshold)
    cut = drafted()
    assert cut.token_ids == full.token_ids[:2]
    assert torch.equal(cut.probs, full.probs[:2])
    assert (
        cut.confidences == full.confidences[:2]
        and cut.truncated_confidences == full.confidences[2:]
    )


# --- refusing checkpoints that do not fit ---------------------------------------------------


def _copy(tmp_path: Path, algo: str = "dflash") -> Path:
    dst = tmp_path / algo
    shutil.copytree(FIXTURES / algo, dst)
    return dst


def _edit_config(folder: Path, edit) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(folder: Path, edit) -> None:
    t = load_file(folder / "model.safetensors")
    edit(t)
    save_file(t, folder / "model.safetensors")


BAD = {
    "hidden size": (
        "dflash",
        lambda f: _edit_config(f, lambda c: c["transformer_layer_config"].update(hidden_size=32)),
    ),
    "vocab size": (
        "eagle3",
        lambda f: _edit_config(f, lambda c: c["transformer_layer_config"].update(vocab_size=1000)),
    ),
    "out of range": (
        "peagle",
        lambda f: _edit_config(f, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 9])),
    ),
    "unknown speculators_model_type": (
        "dflash",
        lambda f: _edit_config(f, lambda c: c.update(speculators_model_type="medusa")),
    ),
    "mask_token_id": ("dspark", lambda f: _edit_config(f, lambda c: c.update(mask_token_id=600))),
    "lacks tensors layers.1.mlp.up_proj.weight": (
        "dflash",
        lambda f: _edit_tensors(f, lambda t: t.pop("layers.1.mlp.up_proj.weight")),
    ),
    "tensor fc.weight has shape [64, 128]": (
        "eagle3",
        lambda f: _edit_tensors(f, lambda t: t.update({"fc.weight": torch.zeros(64, 128)})),
    ),
    "NaN": ("dspark", lambda f: _edit_tensors(f, lambda t: t["norm.weight"].fill_(float("nan")))),
    "not a readable safetensors": (
        "peagle",
        lambda f: (f / "model.safetensors").write_bytes(
            (f / "model.safetensors").read_bytes()[:5000]
        ),
    ),
    "not valid JSON": (
        "dflash",
        lambda f: (f / "config.json").write_text('{"speculators_model_type": "dflash",'),
    ),
    "has no config.json": ("dflash", lambda f: (f / "config.json").unlink()),
    "has no model.safetensors": ("eagle3", lambda f: (f / "model.safetensors").unlink()),
    "block_size' must be int": (
        "dflash",
        lambda f: _edit_config(f, lambda c: c.update(block_size="8")),
    ),
}


@pytest.mark.parametrize("problem", BAD)
def test_bad_checkpoint_is_refused_with_a_message_naming_it(
    problem: str, verifier: Verifier, tmp_path: Path
) -> None:
    algo, break_it = BAD[problem]
    folder = _copy(tmp_path, algo)
    assert validate_checkpoint(folder, verifier) == []
    break_it(folder)
    problems = validate_checkpoint(folder, verifier)
    assert problems and any(problem in p for p in problems), problems
    with pytest.raises(SpecUIError, match=problem.replace("[", r"\[")) as err:
        load_drafter(folder, verifier)
    assert "\n" not in str(err.value)


def test_missing_folder_is_refused(verifier: Verifier, tmp_path: Path) -> None:
    with pytest.raises(SpecUIError, match="not found"):
        load_drafter(tmp_path / "nowhere", verifier)


def test_eagle3_checkpoint_without_embedding_borrows_the_verifiers(
    verifier: Verifier, tmp_path: Path
) -> None:
    folder = _copy(tmp_path, "eagle3")
    _edit_tensors(folder, lambda t: (t.pop("embed_tokens.weight"), t.pop("lm_head.weight")))
    assert validate_checkpoint(folder, verifier) == []
    m = load_drafter(folder, verifier).model
    assert torch.equal(m.embed_tokens.weight, verifier.embed_tokens.weight)
    assert torch.equal(m.lm_head.weight, verifier.lm_head.weight)


def test_saved_checkpoint_files_are_readable_by_others(tmp_path, fixture_verifier):
    import os
    import stat

    from specui.algorithms import create_drafter
    from specui.algorithms.checkpoint import save_drafter

    folder = save_drafter(
        create_drafter("dflash", fixture_verifier, num_layers=1).model, tmp_path / "d"
    )
    for name in ("config.json", "model.safetensors"):
        assert os.stat(folder / name).st_mode & stat.S_IROTH, name
