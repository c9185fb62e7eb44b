"""Step traces as HTML: each step's draft block with accepted, rejected,
discarded, corrected and bonus tokens in distinct colours, confidences beside
the drafted tokens, and probabilities on hover."""

from __future__ import annotations

import html
import math

from specui.trace import FinalTokenKind, GenerationResult, StepTrace

CSS = """
.specui-legend span, .specui-steps .tok, .specui-output .tok {
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace; white-space: pre-wrap;
  border-radius: 3px; padding: 0 2px; margin: 0 1px; line-height: 1.9;
}
.specui-steps { max-height: 460px; overflow-y: auto; font-size: 13px; }
.specui-step { border-bottom: 1px solid #8883; padding: 2px 0; }
.specui-step .idx { color: #888; display: inline-block; min-width: 5.5em; font-size: 11px; }
.tok.accepted  { background: #c8f7c5; color: #064e03; }
.tok.rejected  { background: #ffd1d1; color: #7a0000; text-decoration: line-through; }
.tok.discarded { background: #eeeeee; color: #999999; text-decoration: line-through; }
.tok.corrected { background: #ffe2b3; color: #7a4300; font-weight: 600; }
.tok.bonus     { background: #cfe3ff; color: #003c8f; font-weight: 600; }
.tok.prompt    { color: #777; }
.tok.unsent    { background: transparent; color: #aaaaaa; outline: 1px dotted #bbbbbb; }
.specui-step .who { color: #888; font-size: 11px; margin-right: 4px; }
.tok.unknown   { font-style: italic; text-decoration: none;
                 outline: 1px dashed currentColor; outline-offset: -2px; }
.specui-step .counts { color: #888; font-size: 11px; margin-left: 4px; }
.tok sup.conf  { font-size: 9px; color: #555; margin-left: 1px; }
.specui-output { font-size: 14px; max-height: 460px; overflow-y: auto; }
.specui-output .tok { margin: 0; padding: 0; }
/* Compare: a header wraps between words, never inside one ("Algorit|hm").  Gradio's header
   cells break anywhere (word-break: break-word), which also lets the table size a column
   below its longest header word; with normal breaking that word is the column's minimum. */
#comparison .header-cell, #comparison .header-cell * {
  word-break: normal !important; overflow-wrap: normal !important; hyphens: none !important;
}
"""

LEGEND = (
    '<div class="specui-legend">'
    '<span class="tok accepted">accepted draft</span> '
    '<span class="tok rejected">rejected draft</span> '
    '<span class="tok discarded">discarded (after a rejection)</span> '
    '<span class="tok corrected">corrected (verifier)</span> '
    '<span class="tok bonus">bonus (verifier)</span> '
    "<small>superscript: DSpark confidence · hover a token: draft q and verifier p · "
    "␣ space, ↵ newline, → tab</small></div>"
)


def visible(text: str) -> str:
    """Make whitespace visible inside a token chip (code stays readable)."""
    return text.replace(" ", "␣").replace("\t", "→").replace("\n", "↵")


def _chip(text: str, cls: str, title: str = "", conf: float | None = None) -> str:
    sup = f'<sup class="conf">{conf:.2f}</sup>' if conf is not None else ""
    t = f' title="{html.escape(title)}"' if title else ""
    return f'<span class="tok {cls}"{t}>{html.escape(visible(text))}{sup}</span>'


def _prob(name: str, value: float) -> str:
    return "" if math.isnan(value) else f" · {name}={value:.3f}"


def step_html(step: StepTrace) -> str:
    chips = []
    # A stop condition (EOS, budget, stop string) may cut the step's tokens short.
    kept = len(step.emitted_token_ids)
    unknown = 0
    for i, (tid, text) in enumerate(zip(step.draft_token_ids, step.draft_texts, strict=True)):
        if i < step.num_accepted and i >= kept:
            cls = "discarded"
        elif i < step.num_accepted:
            cls = "accepted"
        elif i == step.num_accepted:
            cls = "rejected"
        else:
            cls = "discarded"
        if tid < 0:
            # A slot whose token the backend did not report (vLLM's rejected drafts):
            # a placeholder, never a made-up token.
            unknown += 1
            chips.append(
                _chip(
                    "?",
                    f"{cls} unknown",
                    f"slot {i + 1}: {cls} draft token, not reported by the backend",
                )
            )
            continue
        conf = step.confidences[i] if step.confidences and i < len(step.confidences) else None
        title = (
            f"id {tid}"
            + _prob("draft q", step.draft_probs[i])
            + _prob("verifier p", step.target_probs[i])
        )
        if conf is not None:
            title += f" · confidence {conf:.3f}"
        chips.append(_chip(text, cls, title, conf))
    kind = "bonus" if step.final_token_kind == FinalTokenKind.BONUS else "corrected"
    if kept > step.num_accepted:  # the verifier's own token survived the stop conditions
        chips.append(
            _chip(
                step.final_token_text,
                kind,
                f"id {step.final_token_id} · {kind} token from the verifier",
            )
        )
    # Drafted but not sent: the policy cut the block before the verifier (greyed).
    for i, tid in enumerate(step.unsent_token_ids):
        text = step.unsent_texts[i] if i < len(step.unsent_texts) else f"[{tid}]"
        chips.append(_chip(text, "unsent", f"id {tid} · drafted, not sent by the policy"))
    label = f"#{step.step} +{len(step.emitted_token_ids)}"
    who = (
        f'<span class="who" title="who drafted the sent block, and how many drafts the policy'
        f' sent">{html.escape(step.proposer)} ×{step.num_drafted}</span>'
        if step.proposer
        else ""
    )
    timing = f"draft {step.draft_time_s * 1e3:.0f} ms · verify {step.verify_time_s * 1e3:.0f} ms"
    counts = (
        f'<span class="counts">{step.num_drafted} drafted, {step.num_accepted} accepted</span>'
        if unknown
        else ""
    )
    return (
        f'<div class="specui-step"><span class="idx" title="{timing}">{label}</span>{who}'
        f"{''.join(chips)}{counts}</div>"
    )


def steps_html(steps: list[StepTrace], limit: int = 400) -> str:
    """Newest step first, so the live view needs no scrolling."""
    shown = steps[-limit:][::-1]
    body = "".join(step_html(s) for s in shown) or "<i>no steps yet</i>"
    return f'<div class="specui-steps">{body}</div>'


def output_html(steps: list[StepTrace]) -> str:
    """The generated text, each token coloured by where it came from."""
    chips = []
    for s in steps:
        for i, tid in enumerate(s.emitted_token_ids):
            if i < s.num_accepted and i < len(s.draft_texts):
                chips.append(_raw_chip(s.draft_texts[i], "accepted", f"draft token {tid}"))
            else:
                kind = "bonus" if s.final_token_kind == FinalTokenKind.BONUS else "corrected"
                chips.append(_raw_chip(s.final_token_text, kind, f"verifier token {tid}"))
    return f'<div class="specui-output">{"".join(chips)}</div>'


def _raw_chip(text: str, cls: str, title: str) -> str:
    return f'<span class="tok {cls}" title="{html.escape(title)}">{html.escape(text)}</span>'


def stats_markdown(result: GenerationResult, running: bool, state: str | None = None) -> str:
    """Live tau, tokens per step, a_k, tokens/s and draft vs verify time; ``state`` replaces the
    running / done label (a replay says "replaying")."""
    s = result.summary() if result.steps else None
    if s is None:
        return "waiting for the first step…"
    n_tokens = sum(len(st.emitted_token_ids) for st in result.steps)
    wall = sum(st.draft_time_s + st.verify_time_s for st in result.steps)
    a = ", ".join(f"{x:.2f}" for x in result.per_position_acceptance) or "–"
    state = state or ("running" if running else f"done ({result.stop_reason})")
    if wall > 0:
        timing = (
            f"**{n_tokens / wall:.1f} tok/s** · draft {s['draft_time_s']:.2f} s vs verify"
            f" {s['verify_time_s']:.2f} s"
        )
    else:  # vLLM does not report per-step times; a finished request has its wall time
        timing = "per-step times not recorded"
        if not running and result.wall_time_s > 0:
            timing += (
                f" · request: **{n_tokens / result.wall_time_s:.1f} tok/s** over"
                f" {result.wall_time_s:.2f} s"
            )
    return (
        f"**{state}** · steps {len(result.steps)} · tokens {n_tokens}  \n"
        f"**tau** (1 + accepted/drafts) **{result.acceptance_length:.2f}** · "
        f"**tokens per step** (tokens/steps) **{result.tokens_per_step:.2f}** · "
        f"draft acceptance rate {result.draft_acceptance_rate:.2f}  \n"
        f"per-position acceptance a_k: {a}  \n"
        f"{timing}"
    )
