"""Static checks of identity: is this the model its config names, for the verifier given?

The algorithm is told from the weights (the tensors each registered model has), the
verifier from shapes, and from content hashes of weights and tokenizer where the
declared verifier is a folder at hand.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specui.algorithms.spec import ALGORITHMS
from specui.doctor.findings import Finding, Severity

if TYPE_CHECKING:
    from specui.verifier.model import Verifier
from specui.doctor.facts import Facts


def check_algorithm(facts: Facts) -> list[Finding]:
    """The algorithm the config claims against the one whose tensors the file holds."""
    d, claimed = facts.config or {}, facts.model_type
    if claimed is None:
        return [
            Finding(
                "config_unreadable",
                Severity.ERROR,
                "config.json names no speculators_model_type",
                evidence=f"keys: {', '.join(sorted(d))[:200]}",
                cause="not a speculators-format checkpoint",
                fix="convert it with the speculators library, or set speculators_model_type",
            )
        ]
    if claimed not in ALGORITHMS:
        return [
            Finding(
                "algorithm_mismatch",
                Severity.ERROR,
                f"unknown speculators_model_type {claimed!r}",
                evidence=f"known: {', '.join(ALGORITHMS.names())}",
                cause="a typo or an algorithm SpecUI lacks",
                fix="set the type the checkpoint was trained as",
            )
        ]
    fits = {name: _key_distance(spec, d, facts.tensor_names) for name, spec in ALGORITHMS.items()}
    exact = [n for n, dist in fits.items() if dist == 0]
    out: list[Finding] = []
    if facts.tensor_names and fits.get(claimed) != 0 and exact:
        out.append(
            Finding(
                "algorithm_mismatch",
                Severity.ERROR,
                f"config.json claims {claimed}, but the weights are a {exact[0]} checkpoint",
                evidence=(
                    f"the tensors match the {exact[0]} model exactly; as {claimed}, {fits[claimed]}"
                    " tensors are missing or left unused"
                ),
                cause=(
                    f"the config was copied from another checkpoint or edited: a {claimed} loader"
                    " ignores or lacks parts"
                ),
                fix=(
                    "set speculators_model_type, architectures and speculators_config.algorithm to"
                    f" {exact[0]}"
                ),
                data={"claimed": claimed, "weights": exact[0]},
            )
        )
    spec = ALGORITHMS[claimed]
    arch = (d.get("architectures") or [None])[0]
    inner = (d.get("speculators_config") or {}).get("algorithm")
    want = spec.config_class.architecture
    if (arch and arch != want) or (inner and inner != claimed):
        out.append(
            Finding(
                "algorithm_mismatch",
                Severity.WARNING,
                "config.json names two algorithms",
                evidence=(
                    f"speculators_model_type {claimed!r}, architectures {[arch]},"
                    f" speculators_config.algorithm {inner!r}"
                ),
                cause="an edited config",
                fix=f"architectures [{want!r}] and algorithm {claimed!r}",
            )
        )
    return out


def _key_distance(spec: Any, d: dict[str, Any], have: set[str]) -> int | None:
    """Tensors missing plus tensors unused if the weights were ``spec``'s model (None: no fit)."""
    try:
        cfg = spec.config_class.from_dict(d)
        with torch.device("meta"):
            expected = set(spec.model_class(cfg).state_dict())
    except Exception:  # noqa: BLE001 - any config that does not build is simply no fit
        return None
    missing = expected - have - set(spec.model_class.verifier_fallback)
    return len(missing) + len(have - expected)


def check_verifier(facts: Facts, verifier: Verifier, verifier_folder: Path | None) -> list[Finding]:
    """The verifier the checkpoint declares against the one given: shapes, and content hashes
    of weights and tokenizer where the declared one is a folder at hand."""
    from specui.algorithms.base import verifier_identity

    d = facts.config or {}
    declared = (d.get("speculators_config") or {}).get("verifier") or {}
    name, archs = declared.get("name_or_path"), list(declared.get("architectures") or [])
    given = verifier_identity(verifier)
    layer = d.get("transformer_layer_config") or {}
    shape = []
    for what, ours, theirs in (
        ("hidden size", layer.get("hidden_size"), verifier.hidden_size),
        ("vocab size", layer.get("vocab_size"), verifier.vocab_size),
    ):
        if ours is not None and ours != theirs:
            shape.append(f"{what} {ours} (the verifier's: {theirs})")
    if archs and given["verifier_architectures"] and archs != given["verifier_architectures"]:
        shape.append(f"architecture {archs} (the verifier's: {given['verifier_architectures']})")
    if shape:
        return [
            Finding(
                "verifier_mismatch",
                Severity.ERROR,
                f"trained for another verifier ({name or 'unnamed'})",
                evidence="; ".join(shape)
                + f"; declared verifier {name!r}, given {given['verifier_name_or_path']!r}",
                cause="the drafter conditions on another model's hidden states and vocabulary",
                fix=(
                    f"serve it with the verifier it was trained for ({name}), or train a drafter"
                    " for this one"
                ),
                data={"declared": name, "given": given["verifier_name_or_path"]},
            )
        ]
    out: list[Finding] = []
    at_hand = Path(name).expanduser() if name else None
    if at_hand is not None and at_hand.is_dir() and verifier_folder is not None:
        out += _content_checks(at_hand, verifier, verifier_folder)
    elif name and name != given["verifier_name_or_path"]:
        out.append(
            Finding(
                "verifier_revision",
                Severity.WARNING,
                f"declared verifier {name!r}, running with {given['verifier_name_or_path']!r}",
                evidence=(
                    "hidden size, vocab size and architecture agree; the declared weights are not"
                    " at hand to compare"
                ),
                cause="another model of the same shape, or another revision or fine-tune of it",
                fix=(
                    "check that this is the model the drafter was trained on (the acceptance below"
                    " tells)"
                ),
            )
        )
    return out


def _content_checks(declared: Path, verifier: Verifier, verifier_folder: Path) -> list[Finding]:
    from specui.verifier.fingerprint import folder_fingerprint

    out = []
    theirs = folder_fingerprint(declared)
    if theirs is not None and theirs != verifier.fingerprint:
        out.append(
            Finding(
                "verifier_revision",
                Severity.ERROR,
                "trained for another revision of the verifier's weights",
                evidence=(
                    f"weights fingerprint of {declared}: {theirs}; of the verifier given:"
                    f" {verifier.fingerprint}"
                ),
                cause=(
                    "same architecture and shapes, other weights: the hidden states the drafter"
                    " learned differ"
                ),
                fix=f"verify with {declared}, or retrain on this verifier",
            )
        )
    a, b = _file_hash(declared / "tokenizer.json"), _file_hash(verifier_folder / "tokenizer.json")
    if a and b and a != b:
        out.append(
            Finding(
                "verifier_revision",
                Severity.ERROR,
                "the declared verifier's tokenizer differs",
                evidence=f"tokenizer.json sha256 {a[:12]} vs {b[:12]}",
                cause="token ids mean other text",
                fix="use the tokenizer the drafter was trained with",
            )
        )
    return out


def _file_hash(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
