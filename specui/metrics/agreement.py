"""Step agreement: do two backends draft the same thing, not just as well?

Two greedy runs of one drafter (vLLM and the local engine, or two precisions) can match in
tau and still draft differently.  At every output position where a step starts on both
sides with the same context (before the two outputs first differ), their accepted counts
must be equal if they run the same drafter on the same inputs (a step that starts where the
outputs first differ still had the same context).  Two kinds of step are not
comparisons of drafting and are left out:

- the first step (vLLM's is the prefill, which drafts nothing);
- steps whose block of K + 1 would not fit the ``max_new_tokens`` budget: there the local
  engine drafts only what the budget has room for while vLLM drafts all K and cuts the
  output afterwards (counting drafts past the budget as accepted).

Used by ``tests/vllm/test_vllm_shipped.py`` and the doctor's ``--vllm`` mode (issue 23).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specui.trace import StepTrace


@dataclass(frozen=True)
class Disagreement:
    prompt: int
    position: int  # output position the step starts at
    accepted_a: int
    accepted_b: int
    drafts_a: list[int]  # side a's drafted tokens (empty where the side records none)
    output: list[int]  # the (shared) output from that position, K + 1 tokens


@dataclass
class StepAgreement:
    share: float  # agreeing steps / compared steps (0 when none compared)
    steps: int  # compared steps
    disagreements: list[Disagreement] = field(default_factory=list)

    def describe(self) -> list[str]:
        return [
            f"prompt {d.prompt} position {d.position}: {d.accepted_a} vs {d.accepted_b} accepted; "
            f"drafts {d.drafts_a}, output {d.output}"
            for d in self.disagreements
        ]


def _by_position(steps: Sequence[StepTrace]) -> tuple[dict[int, StepTrace], list[int]]:
    at, out = {}, []
    for s in steps:
        at[len(out)] = s
        out += s.emitted_token_ids
    return at, out


def step_agreement(
    a: Sequence[Sequence[StepTrace]],
    b: Sequence[Sequence[StepTrace]],
    max_new_tokens: int | None = None,
    num_speculative_tokens: int = 0,
) -> StepAgreement:
    """Agreement of two runs' steps, prompt by prompt (``a[p]``, ``b[p]``: each prompt's steps),
    of one drafter with ``num_speculative_tokens`` under a ``max_new_tokens`` budget."""
    if len(a) != len(b):
        raise ValueError(f"the runs cover {len(a)} and {len(b)} prompts")
    same = common = 0
    found: list[Disagreement] = []
    for p, (steps_a, steps_b) in enumerate(zip(a, b, strict=True)):
        (at_a, out_a), (at_b, out_b) = _by_position(steps_a), _by_position(steps_b)
        # A step starting at the first differing position still had the same context.
        last = next(
            (i for i, (x, y) in enumerate(zip(out_a, out_b, strict=False)) if x != y),
            min(len(out_a), len(out_b)),
        )
        if max_new_tokens is not None:  # the last position a whole block starts at
            last = min(last, max_new_tokens - num_speculative_tokens - 1)
        for pos in sorted((at_a.keys() & at_b.keys()) - {0}):
            if pos > last:
                continue
            common += 1
            sa, sb = at_a[pos], at_b[pos]
            if sa.num_accepted == sb.num_accepted:
                same += 1
            else:
                width = max(len(sa.draft_token_ids), len(sb.draft_token_ids)) + 1
                found.append(
                    Disagreement(
                        p,
                        pos,
                        sa.num_accepted,
                        sb.num_accepted,
                        list(sa.draft_token_ids),
                        out_a[pos : pos + width],
                    )
                )
    return StepAgreement(same / common if common else 0.0, common, found)
