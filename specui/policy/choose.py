"""How many drafts to send, in closed form over the cost model (no state; ``adaptive.py`` keeps
the running estimates).

The objective is output tokens per second over the whole generation.  A step that sends n
drafts emits ``1 + s_1 + ... + s_n`` tokens in expectation (``s_j``: the probability slots
1..j are all accepted) and costs ``V(n + 1)`` to verify, plus the draft if one was made.  For a
ratio of sums the per-step rule that maximises it is Dinkelbach's: with ``rate`` the best
throughput known (never below plain decoding's ``1 / V(1)``), pick the n maximising
``sum_{j<=n} s_j - rate * (V(n + 1) - V(1))``; drafting at all is worth it when that gain beats
``rate * draft_cost``.  A slot whose acceptance cannot pay for its verify row is not sent.

Lossless sampling needs one more thing (docs/decoding.md, "The policy"): whether slot i is sent
may depend on the drafts before it but not on slot i's own token, else the verified tokens are
not the drafter's q any more.  ``sequential_keep`` decides slot by slot, reading slot i's
estimate (made from the slots before it) and, for the slots after it, only the running
acceptance rates, which no draft of this step has touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Verify = Callable[[int], float]  # seconds to verify a block of that many rows


def best_gain(
    survive_from: float, estimates: Sequence[float], start: int, verify: Verify, rate: float
) -> float:
    """The best over m >= 1 of sending slots ``start+1 .. start+m`` after ``start`` sent ones,
    whose survival is ``survive_from``; each next slot accepted with ``estimates[j]``:
    ``sum s_j - rate * (V(start + m + 1) - V(start + 1))``.  -inf with no slots."""
    best = float("-inf")
    expected, survive = 0.0, survive_from
    for m, e in enumerate(estimates, start=1):
        survive *= e
        expected += survive
        best = max(best, expected - rate * (verify(start + m + 1) - verify(start + 1)))
    return best


def sequential_keep(
    estimates: Sequence[float], priors: Sequence[float], verify: Verify, rate: float
) -> int:
    """How many leading slots to send, slot by slot: slot i goes if some block that includes it
    gains more than stopping before it, with slot i's own ``estimates[i]`` and, after it, the
    ``priors`` (which must not depend on this step's drafts).  Stops at the first slot that
    does not pay."""
    n, survive = 0, 1.0
    for i, e in enumerate(estimates):
        ahead = [e, *priors[i + 1 : len(estimates)]]
        if best_gain(survive, ahead, i, verify, rate) <= 0:
            break
        survive *= e
        n = i + 1
    return n


def draft_gain(priors: Sequence[float], verify: Verify, rate: float, draft_s: float) -> float:
    """What drafting this step is expected to gain over a plain step, from the running rates
    alone (before any draft is made): the best block's gain less the draft's time."""
    return best_gain(1.0, priors, 0, verify, rate) - rate * draft_s


def expected_speedup(tau: float, verify_rows: int, verify: Verify, draft_s: float = 0.0) -> float:
    """Plain decoding's time per token over a speculator's that emits ``tau`` tokens a step
    verifying ``verify_rows`` rows: the break-even picture's y axis (``bench`` prints it)."""
    return tau * verify(1) / (verify(verify_rows) + draft_s)


def tau_of_geometric(a1: float, k: int) -> float:
    """tau when each slot is accepted with ``a1`` given the ones before it, K slots sent."""
    return 1 + sum(a1**j for j in range(1, k + 1))


def break_even_acceptance(verify: Verify, k: int, draft_s: float = 0.0) -> float | None:
    """The per-slot acceptance at which sending ``k`` drafts a step (each accepted with that
    probability given the ones before it) runs as fast as plain decoding; None when even
    certain acceptance does not pay."""
    if expected_speedup(tau_of_geometric(1.0, k), k + 1, verify, draft_s) < 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):  # bisection: the speedup grows with the acceptance
        mid = (lo + hi) / 2
        if expected_speedup(tau_of_geometric(mid, k), k + 1, verify, draft_s) < 1:
            lo = mid
        else:
            hi = mid
    return hi


def run_speedup(row: dict, verify: Verify) -> float | None:
    """A stored run's expected speedup under the cost model, from its counts (a Compare row):
    tokens per step times a plain step's time over its mean step's (verify of the mean block
    plus the mean draft)."""
    steps = row.get("num_steps") or 0
    if not steps:
        return None
    rows = 1 + (row.get("num_drafted_tokens") or 0) / steps
    lo = int(rows)
    # the verify of a fractional block: between its neighbours' (the curve is near-linear)
    v = verify(lo) + (rows - lo) * (verify(lo + 1) - verify(lo))
    draft = (row.get("draft_time_s") or 0.0) / steps
    return (row.get("num_output_tokens") or 0) / steps * verify(1) / (v + draft)


@dataclass(frozen=True)
class CurvePoint:
    """One block size of the cost curve: what the Playground's chart draws."""

    rows: int  # verified rows: K drafts + 1
    verify_ms: float
    ratio: float  # to a one-row verify
    break_even: float | None  # per-slot acceptance at which K = rows - 1 drafts pay (no draft)


def cost_curve(verify_s: Sequence[float]) -> list[CurvePoint]:
    """The measured rows of a cost model with the break-even acceptance of each K on them."""

    def verify(rows: int) -> float:  # break_even_acceptance(k) reads rows 1 and k + 1 only
        return verify_s[rows - 1]

    return [
        CurvePoint(
            r, s * 1e3, s / verify_s[0], break_even_acceptance(verify, r - 1) if r > 1 else None
        )
        for r, s in enumerate(verify_s, start=1)
    ]
