"""Dynamic checks: measure the drafter on a few prompts, and what changes when a setting does.

* teacher-forced per-position acceptance on the verifier's greedy continuations,
  and a short real decode through the engine;
* a collapse after slot k (a_k far below a_(k-1));
* counterfactuals on the *same* anchors: aux layers shifted by -1 / +1, and the
  prompts without the chat template (same continuation tokens, so only the
  formatting differs).  A setting that drafts better than the configured one is
  what the drafter was trained with;
* the model card's claimed tau against the measured one.

Adjacent layers' residual streams are close, so a +-1 shift changes acceptance by
little (measured on the shipped drafters, gsm-symbolic: 0.14-0.32 tau, paired z
1.6-2.7, while a healthy EAGLE-3 gained 0.28 at z 2.2 from +1).  A shift alone is
therefore only a warning; it is an error when the config's ids are the verifier's
default ``[2, n//2, n-3]`` moved by exactly one (the 0- vs 1-based slip) and
moving them back drafts better.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specui.algorithms.base import Drafter
from specui.doctor.findings import Finding, Severity
from specui.doctor.measure import Acceptance, Sample, real_decode, sample, teacher_forced
from specui.verifier.model import Verifier

COLLAPSE_FACTOR = 5.0  # a_k below a_(k-1) / this is a collapse after slot k-1
COLLAPSE_FROM = 0.25  # ... when a_(k-1) was at least this
NEAR_ZERO = 0.03  # a_1 below this: the drafter is not drafting for this verifier
MIN_ANCHORS = 30


@dataclass(frozen=True)
class DynamicOptions:
    """How much to measure.  Defaults keep a doctor run on a 2-core CPU under two minutes."""

    anchors_per_prompt: int = 16  # teacher-forced blocks per continuation
    decode_prompts: int = 2  # the real decode: prompts ...
    decode_tokens: int = 32  # ... and tokens each


def paired_gain(base: Acceptance, other: Acceptance) -> tuple[float, float]:
    """Mean extra accepted drafts per block of ``other`` over ``base`` on the same anchors,
    and its z score (paired: the anchor's own difficulty cancels)."""
    d = [b - a for a, b in zip(base.lengths, other.lengths, strict=False)]
    n = len(d)
    if n < 2:
        return 0.0, 0.0
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return mean, (mean / (sd / math.sqrt(n)) if sd > 0 else (math.inf if mean > 0 else 0.0))


def acceptance_findings(tf: Acceptance, real: Acceptance | None) -> list[Finding]:
    """What the measured curve says by itself: near zero, a collapse, the engine disagreeing."""
    a = tf.per_position
    out = [
        Finding(
            "acceptance",
            Severity.INFO,
            f"teacher-forced tau {tf.tau:.2f} over {tf.anchors} blocks",
            evidence="a_1..a_K: " + " ".join(f"{x:.3f}" for x in a),
            data=tf.to_dict(),
        )
    ]
    if tf.anchors >= MIN_ANCHORS and a and a[0] < NEAR_ZERO:
        out.append(
            Finding(
                "acceptance_near_zero",
                Severity.ERROR,
                f"acceptance near zero (a_1 = {a[0]:.3f})",
                evidence=(
                    f"{tf.anchors} teacher-forced blocks on the verifier's own greedy continuations"
                ),
                cause=(
                    "the drafter does not predict this verifier: see the causes above (verifier,"
                    " vocab map, aux layers, mask token, chat template)"
                ),
                fix=(
                    "fix the first cause listed; if none is, the drafter needs training for this"
                    " verifier"
                ),
            )
        )
    for k in range(1, len(a)):
        if a[k - 1] >= COLLAPSE_FROM and a[k] < a[k - 1] / COLLAPSE_FACTOR:
            out.append(
                Finding(
                    "collapse",
                    Severity.WARNING,
                    f"acceptance collapses after position {k}",
                    evidence=(
                        f"a_{k} = {a[k - 1]:.3f}, a_{k + 1} = {a[k]:.3f} (falls by more than"
                        f" {COLLAPSE_FACTOR:g}x)"
                    ),
                    cause=(
                        "the slots after the first see another input than in training: in-block"
                        " attention (sliding_window_non_causal), the mask token, or K beyond the"
                        " trained block"
                    ),
                    fix="check those settings against the training run",
                )
            )
            break
    if real is not None and real.anchors:
        out.append(
            Finding(
                "engine_vs_teacher_forced",
                Severity.INFO,
                f"real decode through the engine: tau {real.tau:.2f} over {real.anchors} steps",
                evidence="a_1..a_K: " + " ".join(f"{x:.3f}" for x in real.per_position),
                data=real.to_dict(),
            )
        )
        if real.anchors >= 15 and tf.tau - 1 > 0.3 and real.tau - 1 < 0.4 * (tf.tau - 1):
            out.append(
                Finding(
                    "engine_vs_teacher_forced",
                    Severity.WARNING,
                    "the engine accepts far less than teacher forcing",
                    evidence=f"engine tau {real.tau:.2f} vs teacher-forced {tf.tau:.2f}",
                    cause=(
                        "the drafter's incremental cache or its features differ between the loop"
                        " and a fresh start"
                    ),
                    fix="report it with this output",
                )
            )
    return out


def default_shift(ids: list[int], verifier: Verifier) -> int | None:
    """+1 / -1 when ``ids`` are the verifier's default aux layers moved by exactly one."""
    default = verifier.default_aux_layer_ids()
    for s in (1, -1):
        if len(ids) == len(default) and ids == [d + s for d in default]:
            return s
    return None


def aux_shift_findings(
    drafter: Drafter,
    samples: list[Sample],
    base: Acceptance,
    verifier: Verifier,
    opts: DynamicOptions,
    measured: dict[str, Any],
) -> list[Finding]:
    ids = list(drafter.aux_layer_ids or [])
    if not ids:
        return []
    gains: dict[int, tuple[float, float, Acceptance]] = {}
    for s in (-1, 1):
        shifted = [i + s for i in ids]
        if all(0 <= i <= verifier.num_layers for i in shifted):
            acc = teacher_forced(drafter, samples, shifted, opts.anchors_per_prompt)
            gains[s] = (*paired_gain(base, acc), acc)
            measured[f"aux_shift_{s:+d}"] = {"aux_layer_ids": shifted, **acc.to_dict()}
    pattern = default_shift(ids, verifier)
    if pattern is not None and -pattern in gains:
        gain, z, acc = gains[-pattern]
        back = [i - pattern for i in ids]
        if gain > 0:
            return [
                Finding(
                    "aux_layers_shifted",
                    Severity.ERROR,
                    f"aux layer ids {ids} look off by one: {back} drafts better",
                    evidence=(
                        f"{ids} is the verifier's default {back} shifted by {pattern:+d};"
                        f" teacher-forced tau {base.tau:.2f} as configured, {acc.tau:.2f} with"
                        f" {back} ({gain:+.2f} drafts per block, z {z:.1f})"
                    ),
                    cause=(
                        "the ids were counted from another origin (hidden_states index vs layer"
                        " index) when the config was written"
                    ),
                    fix=f"set the aux layer ids to {back}",
                    data={"configured": ids, "better": back, "gain": gain, "z": z},
                )
            ]
        return [
            Finding(
                "aux_layers_shifted",
                Severity.WARNING,
                f"aux layer ids {ids} are the default shifted by {pattern:+d}",
                evidence=(
                    f"but {back} drafts no better (tau {acc.tau:.2f} vs {base.tau:.2f}): probably"
                    " trained this way"
                ),
                cause="",
                fix="",
            )
        ]
    out = []
    for s, (gain, z, acc) in gains.items():
        if z > 3 and base.tau > 1 and gain / max(base.tau - 1, 1e-9) > 0.15:
            out.append(
                Finding(
                    "aux_layers_shifted",
                    Severity.WARNING,
                    f"aux layers shifted by {s:+d} draft better",
                    evidence=(
                        f"teacher-forced tau {acc.tau:.2f} with {[i + s for i in ids]} vs"
                        f" {base.tau:.2f} as configured ({gain:+.2f} drafts per block, z {z:.1f})"
                    ),
                    cause="the config may not record the layers the drafter was trained on",
                    fix="check the training run's aux layer ids",
                )
            )
    return out


def chat_findings(
    drafter: Drafter,
    samples: list[Sample],
    raw_prompts: list[list[int] | None],
    base: Acceptance,
    verifier: Verifier,
    opts: DynamicOptions,
    measured: dict[str, Any],
) -> list[Finding]:
    """The same continuations after the bare prompt text: better means the drafter was
    trained without (or with another) chat template."""
    pairs = [(s, r) for s, r in zip(samples, raw_prompts, strict=True) if r]
    if not pairs:
        return []
    plain = [sample(verifier, r, s.ids[s.prompt_len :].tolist()) for s, r in pairs]
    aux = list(drafter.aux_layer_ids or [])
    with_chat = (
        base
        if len(pairs) == len(samples)
        else teacher_forced(drafter, [s for s, _ in pairs], aux, opts.anchors_per_prompt)
    )
    without = teacher_forced(drafter, plain, aux, opts.anchors_per_prompt)
    gain, z = paired_gain(with_chat, without)
    measured["chat_template_off"] = without.to_dict()
    if gain <= 0 or z < 2:
        return []
    big = z > 3 and gain / max(with_chat.tau - 1, 1e-9) > 0.15
    return [
        Finding(
            "chat_template",
            Severity.ERROR if big else Severity.WARNING,
            "the drafter drafts better without the chat template",
            evidence=(
                f"teacher-forced tau {with_chat.tau:.2f} with the template, {without.tau:.2f}"
                f" without, on the same continuations ({gain:+.2f} drafts per block, z {z:.1f})"
            ),
            cause="its training data did not use this chat template",
            fix=(
                "serve prompts the way the training data was formatted, or retrain on"
                " chat-formatted data"
            ),
        )
    ]


def card_claim(folder: Path) -> tuple[float | None, str | None]:
    """(the T=0 tau a model card claims, the prompt set it names) from README.md."""
    card = folder / "README.md"
    if not card.is_file():
        return None, None
    text = card.read_text(errors="replace")
    tau = re.search(r"T\s*=\s*0\b[^\n]*?\btau\s*([0-9]+(?:\.[0-9]+)?)", text)
    prompts = re.search(r"--prompts\s+`?([A-Za-z0-9_:.,-]+)", text)
    return (float(tau.group(1)) if tau else None), (prompts.group(1) if prompts else None)


def card_findings(folder: Path, measured_tau: float, prompt_set: str | None) -> list[Finding]:
    claimed, card_set = card_claim(folder)
    if claimed is None or claimed <= 1:
        return []
    same = (
        card_set is not None
        and prompt_set is not None
        and prompt_set.split(":")[0] == card_set.split(":")[0]
    )
    where = f"the card measured on {card_set or 'an unnamed set'}; this run on {prompt_set}"
    data = {"claimed": claimed, "measured": measured_tau, "card_prompts": card_set}
    if measured_tau - 1 >= 0.6 * (claimed - 1):
        return [
            Finding(
                "card_tau",
                Severity.INFO,
                f"model card claims tau {claimed:.2f}; measured {measured_tau:.2f}",
                evidence=where,
                data=data,
            )
        ]
    return [
        Finding(
            "card_tau",
            Severity.WARNING,
            f"measured tau {measured_tau:.2f} is far below the model card's {claimed:.2f}",
            evidence=where
            + (
                " (the same set: the gap is real)"
                if same
                else " (another domain explains part of it)"
            ),
            cause="a setting above, or prompts unlike the drafter's training data",
            fix="compare on the card's prompt set"
            + ("" if same else f" (--prompts {card_set})" if card_set else ""),
            data=data,
        )
    ]


def run_dynamic(
    drafter: Drafter,
    verifier: Verifier,
    folder: Path,
    samples: list[Sample],
    raw_prompts: list[list[int] | None],
    decode_prompts: list[list[int]],
    prompt_set: str | None,
    opts: DynamicOptions,
    measured: dict[str, Any],
) -> list[Finding]:
    """Every dynamic check on prepared samples; the numbers go into ``measured``."""
    aux = list(drafter.aux_layer_ids or [])
    base = teacher_forced(drafter, samples, aux, opts.anchors_per_prompt)
    measured["teacher_forced"] = {"aux_layer_ids": aux, **base.to_dict()}
    real = (
        real_decode(verifier, drafter, decode_prompts, opts.decode_tokens)
        if decode_prompts
        else None
    )
    if real is not None:
        measured["real_decode"] = real.to_dict()
    out = acceptance_findings(base, real)
    out += aux_shift_findings(drafter, samples, base, verifier, opts, measured)
    out += chat_findings(drafter, samples, raw_prompts, base, verifier, opts, measured)
    out += card_findings(folder, base.tau, prompt_set)
    return out
