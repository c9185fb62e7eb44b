"""Step rendering: the right class per token, visible whitespace, escaped text."""

from __future__ import annotations

import re

from specui.trace import FinalTokenKind, GenerationResult, StepTrace
from specui.ui.render import output_html, stats_markdown, step_html


def _step(num_accepted, kind, emitted, texts=("a", " b", "\n", "<script>")):
    return StepTrace(
        step=0,
        context_len=5,
        draft_token_ids=[1, 2, 3, 4],
        draft_texts=list(texts),
        draft_probs=[0.9, 0.8, 0.7, 0.6],
        target_probs=[0.9, 0.7, 0.1, 0.2],
        confidences=[0.95, 0.8, 0.4, 0.1],
        num_accepted=num_accepted,
        final_token_id=9,
        final_token_text="Z",
        final_token_kind=kind,
        emitted_token_ids=emitted,
        draft_time_s=0.01,
        verify_time_s=0.1,
    )


def _classes(html: str) -> list[str]:
    return re.findall(r'class="tok (\w+)"', html)


def test_rejection_mid_block_marks_accepted_rejected_discarded_corrected():
    html = step_html(_step(2, FinalTokenKind.CORRECTED, [1, 2, 9]))
    assert _classes(html) == ["accepted", "accepted", "rejected", "discarded", "corrected"]
    assert "␣b" in html and "↵" in html  # whitespace visible
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<sup class="conf">0.95</sup>' in html


def test_all_accepted_ends_with_bonus_and_stop_truncation_discards_the_rest():
    assert _classes(step_html(_step(4, FinalTokenKind.BONUS, [1, 2, 3, 4, 9])))[-1] == "bonus"
    cut = step_html(_step(4, FinalTokenKind.BONUS, [1, 2]))  # EOS at the second token
    assert _classes(cut) == ["accepted", "accepted", "discarded", "discarded"]


def test_output_colours_tokens_by_origin():
    html = output_html([_step(2, FinalTokenKind.CORRECTED, [1, 2, 9])])
    assert _classes(html) == ["accepted", "accepted", "corrected"]
    assert ">a<" in html and "> b<" in html


def test_live_stats_show_tokens_per_step_beside_tau():
    """Two steps that drafted (2 of 4 accepted: 3 tokens each) and two that did not (1 each):
    tau 3.00 over the drafts, tokens per step 2.00 over every step."""
    plain = StepTrace(
        step=1,
        context_len=8,
        draft_token_ids=[],
        draft_texts=[],
        draft_probs=[],
        target_probs=[],
        confidences=None,
        num_accepted=0,
        final_token_id=9,
        final_token_text="Z",
        final_token_kind=FinalTokenKind.BONUS,
        emitted_token_ids=[9],
        draft_time_s=0.0,
        verify_time_s=0.1,
    )
    drafted = _step(2, FinalTokenKind.CORRECTED, [1, 2, 9])
    steps = [drafted, plain, drafted, plain]
    result = GenerationResult([1], [], "", steps=steps, num_speculative_tokens=4)
    stats = stats_markdown(result, running=True)
    assert "**tau** (1 + accepted/drafts) **3.00**" in stats
    assert "**tokens per step** (tokens/steps) **2.00**" in stats


def test_a_step_names_its_proposer_and_greys_the_drafts_the_policy_did_not_send():
    step = _step(4, FinalTokenKind.BONUS, [1, 2, 3, 4, 9])
    step.proposer, step.unsent_token_ids, step.unsent_texts = "suffix", [7, 8], ["ta", "il"]
    html = step_html(step)
    assert "suffix ×4" in html
    assert _classes(html)[-2:] == ["unsent", "unsent"] and ">ta<" in html
    step.proposer, step.unsent_token_ids, step.unsent_texts = None, [], []
    assert "×" not in step_html(step) and "unsent" not in step_html(step)
