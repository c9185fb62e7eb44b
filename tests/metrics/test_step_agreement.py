"""``specui.metrics.agreement``: two runs of one drafter compared step by step, on the steps
that start at the same position with the same context and a whole block of budget."""

from __future__ import annotations

import pytest

from specui.metrics.agreement import step_agreement
from specui.trace import FinalTokenKind, StepTrace


def _step(drafts: list[int], accepted: int, final: int) -> StepTrace:
    emitted = [*drafts[:accepted], final]
    return StepTrace(
        step=0,
        context_len=0,
        draft_token_ids=drafts,
        draft_texts=[""] * len(drafts),
        draft_probs=[1.0] * len(drafts),
        target_probs=[1.0] * len(drafts),
        confidences=None,
        num_accepted=accepted,
        final_token_id=final,
        final_token_text="",
        final_token_kind=FinalTokenKind.CORRECTED,
        emitted_token_ids=emitted,
        draft_time_s=0.0,
        verify_time_s=0.0,
    )


def test_equal_steps_agree_and_a_different_count_is_named_with_its_drafts():
    a = [[_step([], 0, 1), _step([2, 3], 2, 4), _step([5, 9], 1, 6), _step([7], 1, 8)]]
    # b: the same output 1 2 3 4 5 6 7 8, but at position 4 it accepted both drafts (5, 6) and
    # ends with 7, so its next step starts at 7, a position a has no step at.
    b = [[_step([], 0, 1), _step([2, 3], 2, 4), _step([5, 6], 2, 7), _step([8], 0, 8)]]
    got = step_agreement(a, b)
    assert got.steps == 2 and got.share == pytest.approx(
        0.5
    )  # positions 1 and 4 (0 is the prefill)
    (d,) = got.disagreements
    assert (d.prompt, d.position, d.accepted_a, d.accepted_b, d.drafts_a) == (0, 4, 1, 2, [5, 9])
    assert d.output == [5, 6, 7]


def test_steps_after_the_outputs_part_or_past_the_last_full_block_are_not_compared():
    a = [[_step([], 0, 1), _step([2], 1, 3), _step([4], 0, 5), _step([6], 0, 7)]]
    b = [
        [_step([], 0, 1), _step([2], 1, 3), _step([4], 1, 9), _step([6], 1, 7)]
    ]  # outputs part at position 4
    got = step_agreement(
        a, b
    )  # positions 1 and 3 (where the outputs part: same context); 4, 5 follow others
    assert got.steps == 2 and [d.position for d in got.disagreements] == [3]
    assert (
        step_agreement(a, b, max_new_tokens=4, num_speculative_tokens=1).steps == 1
    )  # a block from 3 would not fit
    with pytest.raises(ValueError, match="prompts"):
        step_agreement(a, [])
