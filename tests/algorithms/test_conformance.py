"""Conformance with checkpoints and reference logits written by `speculators` 0.9.0 itself.

Every folder under $SPECUI_FIXTURES (default tests/fixtures/speculators-0.9.0)
whose config.json names a speculators_model_type is loaded with its sibling
``verifier/`` and checked against its ``reference.safetensors`` (inputs taken
from the same file, as its REFERENCE.md describes): the training-layout forward
and the incremental inference path must both reproduce the library's logits
within 1e-4 (float32).  A new folder of the same structure is picked up
without code changes; a type without a check here fails.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specui.algorithms import algorithm_names
from specui.algorithms.base import DraftContext
from specui.algorithms.checkpoint import load_drafter, load_model
from specui.trace import SamplingParams
from specui.verifier.model import Verifier
from tests.support.paths import FIXTURES

TOL = 1e-4


def _algorithm_folders() -> list[Path]:
    if not FIXTURES.is_dir():
        return []
    out = []
    for folder in sorted(FIXTURES.iterdir()):
        cfg = folder / "config.json"
        if cfg.is_file() and "speculators_model_type" in json.loads(cfg.read_text()):
            out.append(folder)
    return out


FOLDERS = _algorithm_folders()
_VERIFIERS: dict[Path, Verifier] = {}


def verifier_for(folder: Path) -> Verifier:
    path = folder.parent / "verifier"
    if path not in _VERIFIERS:
        _VERIFIERS[path] = Verifier.load(str(path))
    return _VERIFIERS[path]


def model_type(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["speculators_model_type"]


def close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = TOL) -> None:
    assert got.shape == want.shape, (
        f"{name}: shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    )
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= tol, f"{name}: max abs diff {diff:.3g} > {tol}"


def ctx(ids: torch.Tensor, feats: torch.Tensor) -> DraftContext:
    return DraftContext(token_ids=ids, features=feats, sampling=SamplingParams(), generator=None)


def test_conformance_fixtures_present() -> None:
    assert FOLDERS, f"no speculators fixture folders under {FIXTURES} (set SPECUI_FIXTURES)"


@pytest.mark.parametrize("verifier_dir", sorted({f.parent / "verifier" for f in FOLDERS}), ids=str)
def test_conformance_verifier_taps_and_logits(verifier_dir: Path) -> None:
    v = verifier_for(verifier_dir)  # verifier_for takes a sibling: any path inside the set works
    ref = load_file(verifier_dir / "reference.safetensors")
    taps = v.taps(ref["input_ids"], list(range(v.num_layers + 1)))  # [T, N+1, H]
    close("verifier taps (tap[N] pre-norm)", taps.transpose(0, 1), ref["taps"])
    close("verifier logits", v.forward(ref["input_ids"]).logits, ref["logits"])


# --- per algorithm: the training-layout forward against the reference ------------------------


def _dflash_family(folder: Path, ref: dict[str, torch.Tensor]) -> None:
    m = load_model(folder, verifier_for(folder))
    B = m.config.block_size
    h, ids, docs = ref["hidden_states"], ref["input_ids"], ref["document_ids"]
    with torch.no_grad():
        out = m.forward_blocks(h, ids, ref["anchor_position"], ref["position_ids"], docs)
        close("fc_output", m.context(ref["hidden_states"][0]), ref["fc_output"][0])
    V = out.logits.shape[-1]
    if "block_layer_outputs" in ref:
        n_layers = ref["block_layer_outputs"].shape[0]
        close(
            "block_layer_outputs",
            torch.stack(out.layer_outputs).reshape(n_layers, -1, out.hidden.shape[-1]),
            ref["block_layer_outputs"].reshape(n_layers, -1, out.hidden.shape[-1]),
        )
    close("block_hidden", out.hidden, ref["block_hidden"].reshape(-1, B, out.hidden.shape[-1]))
    close("block_logits", out.logits, ref["block_logits"].reshape(-1, B, V))
    if model_type(folder) == "dspark" or "markov_logits" in ref:
        assert torch.equal(out.prev_token_ids.reshape(-1), ref["markov_prev_token_ids"].reshape(-1))
        close("markov_logits", out.markov_logits, ref["markov_logits"].reshape(-1, B, V))
        close("confidence_logits", out.confidence_logits, ref["confidence_logits"].reshape(-1, B))


def _eagle3(folder: Path, ref: dict[str, torch.Tensor]) -> None:
    m = load_model(folder, verifier_for(folder))
    S = ref["logits"].shape[0]
    with torch.no_grad():
        out = m.forward_ttt(
            ref["hidden_states"], ref["input_ids"], S, ref["position_ids"], ref["document_ids"]
        )
    for s in range(S):  # padding rows included: the library computes them the same way
        close(f"TTT step {s} logits", out.logits[s], ref["logits"][s])


def _peagle(folder: Path, ref: dict[str, torch.Tensor]) -> None:
    m = load_model(folder, verifier_for(folder))
    h, ids, docs = ref["hidden_states"], ref["input_ids"], ref["document_ids"]
    with torch.no_grad():
        out = m.forward_rows(h, ids, ref["row_anchor_pos"], ref["row_depth"], docs)
    close("all COD rows' logits", out.logits, ref["logits"].reshape(out.logits.shape))
    close("chain logits", out.logits[ref["chain_row_indices"]], ref["chain_logits"])


def _run_check(folder: Path, which: int, what: str) -> None:
    """Check ``which`` of CHECKS (0: training layout, 1: inference path) on ``folder``."""
    checks = CHECKS.get(model_type(folder))
    assert checks is not None, f"{folder.name}: no {what} check for type {model_type(folder)!r}"
    checks[which](folder, load_file(folder / "reference.safetensors"))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_conformance_training_layout_matches_reference(folder: Path) -> None:
    _run_check(folder, 0, "conformance")


# --- per algorithm: the incremental inference path against the same reference -----------------


def _tokens(folder: Path) -> torch.Tensor:
    """The unshifted sequence x the reference was made from."""
    return load_file(folder.parent / "verifier" / "reference.safetensors")["input_ids"]


def _dflash_family_inference(folder: Path, ref: dict[str, torch.Tensor]) -> None:
    d = load_drafter(folder, verifier_for(folder))
    x, G, B = _tokens(folder), ref["hidden_states"][0], d.model.config.block_size
    assert d.block_size == B
    logits_ref = ref["block_logits"].reshape(-1, B, ref["block_logits"].shape[-1])
    for a, p in enumerate(ref["anchor_position"].tolist()):
        d.draft_block(
            ctx(x[: p // 2 + 1], G[: p // 2])
        )  # an earlier step: the caches must extend correctly
        _, logits = d.draft_block(ctx(x[: p + 1], G[:p]))
        close(f"inference block logits (anchor {p})", logits, logits_ref[a])
        if "markov_logits" in ref:
            forced = x[
                p + 1 : p + 1 + d.num_speculative_tokens
            ].tolist()  # teacher forcing, as the reference
            _, _, mk, conf = d.draft_chain(ctx(x[: p + 1], G[:p]), forced_tokens=forced)
            first = 0 if d.model.config.sample_from_anchor else 1
            close(
                "inference markov logits",
                mk,
                ref["markov_logits"].reshape(-1, B, mk.shape[-1])[a, first:],
            )
            close(
                "inference confidence logits",
                conf,
                ref["confidence_logits"].reshape(-1, B)[a, first:],
            )


def _eagle3_inference(folder: Path, ref: dict[str, torch.Tensor]) -> None:
    d = load_drafter(folder, verifier_for(folder))
    x, G, S = _tokens(folder), ref["hidden_states"][0], ref["logits"].shape[0]
    d.num_speculative_tokens = S
    for i in (
        2,
        11,
        20,
        ref["logits"].shape[1] - S - 1,
    ):  # growing: step-0 rows are cached in between
        _, _, logits = d.draft_steps(
            ctx(x[: i + 2], G[: i + 1]), forced_tokens=x[i + 2 : i + 2 + S].tolist()
        )
        close(f"inference steps at row {i}", logits, ref["logits"][:, i])


def _peagle_inference(folder: Path, ref: dict[str, torch.Tensor]) -> None:
    d = load_drafter(folder, verifier_for(folder))
    x, G, a = _tokens(folder), ref["hidden_states"][0], int(ref["chain_anchor"][0])
    d.num_speculative_tokens = ref["chain_logits"].shape[0]
    d.draft_rows(ctx(x[: a // 2 + 2], G[: a // 2 + 1]))
    close(
        "inference rollout logits", d.draft_rows(ctx(x[: a + 2], G[: a + 1])), ref["chain_logits"]
    )


Check = Callable[[Path, dict[str, torch.Tensor]], None]
# Each registered type's checks: (training layout, inference path).
CHECKS: dict[str, tuple[Check, Check]] = {
    "dflash": (_dflash_family, _dflash_family_inference),
    "dspark": (_dflash_family, _dflash_family_inference),
    "eagle3": (_eagle3, _eagle3_inference),
    "peagle": (_peagle, _peagle_inference),
}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_conformance_inference_path_matches_reference(folder: Path) -> None:
    _run_check(folder, 1, "inference")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_manifest_records_every_file_of_the_set() -> None:
    """manifest.json's sizes and hashes are the files' (as scripts/make_fixtures.py writes them)."""
    manifest = json.loads((FIXTURES / "manifest.json").read_text())["files"]
    files = {
        str(f.relative_to(FIXTURES)): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(FIXTURES.rglob("*"))
        if f.is_file() and f.parent != FIXTURES
    }
    assert files == manifest


def test_every_registered_type_has_checks_and_a_fixture() -> None:
    """A type registered without an entry in CHECKS, or a fixture folder, is checked by nothing."""
    registered = algorithm_names()
    assert [name for name in registered if name not in CHECKS] == [], "types without a check"
    assert sorted({model_type(f) for f in FOLDERS}) == sorted(registered), "a fixture per type"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_conformance_reference_inputs_are_our_verifier_taps(folder: Path) -> None:
    """The reference's hidden_states are the taps our Verifier produces, in the documented
    layout."""
    v = verifier_for(folder)
    ref = load_file(folder / "reference.safetensors")
    model = load_model(folder, v)
    x = _tokens(folder)
    feats = v.taps(x, model.config.aux_layer_ids).flatten(1)  # [T, n_aux*H]
    hs = ref["hidden_states"][0]
    if hs.shape[0] == x.numel():  # DFlash family: unshifted
        assert torch.equal(ref["input_ids"][0], x)
        close("hidden_states = cat(taps)", feats, hs)
    else:  # EAGLE family: shifted, row i = (x[i+1], taps of position i)
        assert torch.equal(ref["input_ids"][0], x[1:])
        close("hidden_states = cat(taps) (shifted)", feats[:-1], hs)
