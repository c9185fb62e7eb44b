"""The two decoding policies: ``fixed`` sends every draft the drafter makes (the raw drafter at
its K); ``adaptive`` sends, each step, the number of drafts 0..K that maximises expected
tokens per second under the measured cost model (``cost.py``, ``choose.py``), skips drafting
when the drafter's running acceptance cannot pay for it, and, for a hybrid, picks the lookup's
or the learned drafter's draft.

What it reads, and when (the sampled output stays the verifier's; docs/decoding.md):

* per-slot estimates from the proposal (``Proposal.confidences``: DSpark's confidence head, a
  learned drafter's top-1 probability, a lookup's match shares), each made from the slots
  before it, calibrated per proposer by a Platt scaling with an offset per slot position
  (fitted on stored runs, ``calibration.py``);
* per proposer, the running conditional acceptance of each slot position over the run so far
  (each position's prior the one before it), updated after each verify, never from this
  step's drafts;
* the throughput so far, on the cost model's clock (so a seeded run decides alike each time).

Whether a learned drafter drafts at all is decided before its draft runs (a step it does not
draft costs no draft forward), on two things: the gain its running rates expect, less its
steady-state draft time; and what its drafting steps actually gained against a plain step of
the same time (``Rates.payoff``, a running mean).  The second catches what the first cannot
see: per-slot estimates that pick which slots to send make the running rates of the sent slots
look better than drafting is, and a draft the estimates then cut to nothing still cost its
forward.  A drafter that does not pay is still drafted now and then (a probe), so a run that
turns predictable can win it back; probes come at intervals that double up to
``MAX_PROBE_INTERVAL`` steps and spend at most ``PROBE_BUDGET`` of the run's time, a probe's
price including the drafter's catch-up on every position committed since it last drafted (a
prompt's first draft reads the whole prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from specui.algorithms.base import DraftContext, Drafter
from specui.algorithms.simple import LOOKUPS
from specui.policy.calibration import SlotCalibration, load_calibrations
from specui.policy.choose import best_gain, draft_gain, sequential_keep
from specui.policy.cost import CostModel, cost_model, drafter_key
from specui.trace import Proposal

MAX_MEASURED_ROWS = 17  # longer blocks extrapolate the curve (a 25-row measure costs seconds)
FIRST_PROBE_INTERVAL = 8
MAX_PROBE_INTERVAL = 128
PROBE_BUDGET = 0.01  # the share of a run's time probes of a drafter that does not pay may take
RATE_MEMORY = 512  # steps of a position's history that count fully (older halve)
PAYOFF_MEMORY = 8  # drafting steps the realized payoff averages over (older fade)
PAYOFF_EVIDENCE = 4  # drafting steps before the realized payoff may veto the expected gain
PRIOR_WEIGHT = 2.0  # samples' worth of belief in a position's prior (see Rates.conditional)


@dataclass
class Decision:
    """What a policy sends this step: ``proposal`` (empty for a plain step), who drafted it,
    the drafted tail it did not send, and every proposer whose draft ran."""

    proposal: Proposal
    proposer: str | None = None
    unsent: list[int] = field(default_factory=list)
    drafted: tuple[str, ...] = ()


class Policy(Protocol):
    name: str

    def start(self, verifier: Any, drafter: Drafter) -> None: ...

    def propose(self, ctx: DraftContext, drafter: Drafter, max_k: int) -> Decision: ...

    def observe(self, decision: Decision, num_accepted: int, num_emitted: int) -> None: ...

    def settings(self) -> dict[str, Any]: ...


def truncate(proposal: Proposal, n: int) -> tuple[Proposal, list[int]]:
    """The first ``n`` slots of ``proposal`` and the tokens of the rest."""
    if len(proposal) <= n:
        return proposal, []
    conf = proposal.confidences
    kept = Proposal(
        token_ids=proposal.token_ids[:n],
        probs=proposal.probs[:n] if proposal.probs is not None else None,
        confidences=conf[:n] if conf is not None else None,
        truncated_confidences=(conf[n:] if conf is not None else None)
        or proposal.truncated_confidences,
    )
    return kept, proposal.token_ids[n:]


def split(drafter: Drafter) -> tuple[tuple[str, Drafter] | None, tuple[str, Drafter] | None]:
    """(lookup, learned): a hybrid's two proposers, or the one a drafter is."""
    proposers = getattr(drafter, "proposers", None)
    if proposers is not None:
        return proposers[0], proposers[1]
    if drafter.algorithm in LOOKUPS:
        return (drafter.algorithm, drafter), None
    return None, (drafter.algorithm, drafter)


class FixedPolicy:
    """Every draft the drafter makes, up to the room left; a hybrid's lookup first.

    It asks for the per-slot estimates too (a softmax over the draft logits the drafter made
    anyway): it sends every drafted slot, so its runs store each drafted slot's estimate with
    its outcome, the unselected sample the calibration is measured on
    (``specui.metrics.slot_calibration``)."""

    name = "fixed"

    def start(self, verifier: Any, drafter: Drafter) -> None:
        pass

    def propose(self, ctx: DraftContext, drafter: Drafter, max_k: int) -> Decision:
        if drafter.num_speculative_tokens == 0 or max_k <= 0:
            return Decision(Proposal(token_ids=[]))
        ctx = replace(ctx, estimates=True)
        lookup, learned = split(drafter)
        drafted: list[str] = []
        for pair in (lookup, learned):
            if pair is None:
                continue
            name, proposer = pair
            proposal = proposer.propose(ctx)
            drafted.append(name)
            if len(proposal):
                sent, unsent = truncate(proposal, max_k)
                return Decision(sent, name, unsent, tuple(drafted))
        return Decision(Proposal(token_ids=[]), None, [], tuple(drafted))

    def observe(self, decision: Decision, num_accepted: int, num_emitted: int) -> None:
        pass

    def settings(self) -> dict[str, Any]:
        return {"policy": self.name}


@dataclass
class Rates:
    """One proposer's running acceptance: slot j reached (all before it accepted) and sent,
    and of those accepted."""

    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    # What its drafting steps gained over a plain step of the same (model) time, in tokens: a
    # running mean over about the last ``PAYOFF_MEMORY`` of them, and how many it holds.
    payoff: float = 0.0
    payoff_steps: int = 0

    def pays(self) -> bool:
        """Whether drafting has paid so far (or too few drafting steps have been seen to say)."""
        return self.payoff_steps < PAYOFF_EVIDENCE or self.payoff > 0

    def record_payoff(self, gain: float) -> None:
        self.payoff_steps = min(self.payoff_steps + 1, PAYOFF_MEMORY)
        self.payoff += (gain - self.payoff) / self.payoff_steps

    def conditional(self, n: int) -> list[float]:
        """P(slot j accepted | slots before it accepted), j = 1..n.  Each position starts from
        the one before it (slot 1 from 1/2) with the weight of ``PRIOR_WEIGHT`` samples: a
        position the policy has not sent yet is taken to be like the last one it has, so a
        drafter that is right on slot 1 gets its longer blocks tried."""
        out, prior = [], 0.5
        for j in range(n):
            r = self.reached[j] if j < len(self.reached) else 0
            a = self.accepted[j] if j < len(self.accepted) else 0
            prior = (a + PRIOR_WEIGHT * prior) / (r + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def update(self, sent: int, num_accepted: int) -> None:
        if self.reached and self.reached[0] >= RATE_MEMORY:  # forget slowly: halve the counts
            self.reached = [r // 2 for r in self.reached]
            self.accepted = [a // 2 for a in self.accepted]
        while len(self.reached) < sent:
            self.reached.append(0)
            self.accepted.append(0)
        for j in range(min(num_accepted + 1, sent)):
            self.reached[j] += 1
            if j < num_accepted:
                self.accepted[j] += 1


class AdaptivePolicy:
    """See the module docstring.  One instance per run (lane): it learns over its prompts."""

    name = "adaptive"

    def __init__(
        self,
        cost: CostModel | None = None,
        calibrations: dict[str, SlotCalibration] | None = None,
        shared_rates: dict[str, Rates] | None = None,
    ) -> None:
        """``cost``: the cost model (None: measured or read at ``start``).  ``calibrations``:
        each proposer's calibration (None: the ones fitted on stored runs, read at ``start``,
        ``specui.policy.calibration``; a proposer without one is read raw).  ``shared_rates``:
        running rates by drafter, shared with the process's other runs (``make_policy`` passes
        one): a run starts from what the last run of its drafter learned, so the Playground's
        second Generate does not probe a drafter that the first found useless."""
        self.cost = cost
        self.calibrations = dict(calibrations or {})
        self._read_calibrations = calibrations is None
        self.rates: dict[str, Rates] = {}
        self.shared = shared_rates
        self.tokens = 0.0
        self.seconds = 0.0
        self._since_probe = 0
        self._probe_interval = FIRST_PROBE_INTERVAL
        self._probe_credit = 0.0  # seconds of probing earned (PROBE_BUDGET of each step's)
        self._keys: dict[str, str] = {}  # proposer name -> its entry in the cost model's drafts
        self._learned: str | None = None  # the learned proposer's name, if any

    def start(self, verifier: Any, drafter: Drafter) -> None:
        """Measure (or read) the cost model this run's choices need, and read the fitted
        calibration (refitted after each bench: a run started later reads the newer fit)."""
        if self._read_calibrations:
            fingerprint = getattr(verifier, "fingerprint", None)
            self.calibrations = load_calibrations(fingerprint) if fingerprint else {}
        lookup, learned = split(drafter)
        named = [p for p in (lookup, learned) if p is not None]
        parts = tuple(d for _, d in named)
        self._keys = {name: drafter_key(d) for name, d in named}
        self._learned = learned[0] if learned is not None else None
        if self.shared is not None:
            for name, key in self._keys.items():
                self.rates[name] = self.shared.setdefault(key, Rates())
        if not parts or drafter.num_speculative_tokens == 0:
            return
        if self.cost is not None:  # a given model is used as it is (a draft it lacks costs 0)
            return
        rows = min(drafter.num_speculative_tokens + 1, MAX_MEASURED_ROWS)
        self.cost = cost_model(verifier, rows, parts)

    def rate(self) -> float:
        """The throughput to beat: this run's so far, on the model's clock, or plain's."""
        assert self.cost is not None
        plain = 1 / self.cost.verify(1)
        return max(plain, self.tokens / self.seconds) if self.seconds > 0 else plain

    def _rates(self, name: str) -> Rates:
        return self.rates.setdefault(name, Rates())

    def estimates(self, name: str, proposal: Proposal) -> list[float]:
        if proposal.confidences is not None and len(proposal.confidences) == len(proposal):
            cal = self.calibrations.get(name)
            if cal is None:
                return [min(max(c, 1e-6), 1 - 1e-6) for c in proposal.confidences]
            # Slot j's estimate and its position: both known before the verify.
            return [cal.probability(c, j) for j, c in enumerate(proposal.confidences)]
        return self._rates(name).conditional(len(proposal))

    def propose(self, ctx: DraftContext, drafter: Drafter, max_k: int) -> Decision:
        if drafter.num_speculative_tokens == 0 or max_k <= 0:
            return Decision(Proposal(token_ids=[]))
        if self.cost is None:
            raise RuntimeError("AdaptivePolicy.start was not called")
        verify, rate = self.cost.verify, self.rate()
        lookup, learned = split(drafter)
        drafted: list[str] = []
        best_lookup: Decision | None = None
        gain_lookup = 0.0  # a plain step gains nothing: anything sent must beat it
        if lookup is not None:
            name, proposer = lookup
            found, _ = truncate(proposer.propose(ctx), max_k)
            drafted.append(name)
            if len(found):
                # A lookup's draft is fixed by the context alone: every slot's estimate may
                # be read at once (no sampled token behind it).
                est = self.estimates(name, found)
                n = sequential_keep(est, est, verify, rate)
                if n:
                    sent, unsent = truncate(found, n)
                    gain_lookup = best_gain(1.0, est[:n], 0, verify, rate)
                    best_lookup = Decision(sent, name, unsent)
        if learned is not None:
            name, proposer = learned
            k = min(proposer.num_speculative_tokens, max_k)
            rates = self._rates(name)
            self._since_probe += 1
            pays, priors = False, []
            # Cheapest test first: on a run of plain steps this is all a step pays for.
            if rates.pays():
                priors = rates.conditional(k)
                pays = draft_gain(priors, verify, rate, self._draft_s(name)) > gain_lookup
            probe = not pays and best_lookup is None and self._probe_due(name, proposer, ctx)
            if pays or probe:
                priors = priors or rates.conditional(k)
                self._since_probe = 0
                if pays:  # probes are for a drafter that does not pay: they earn anew after
                    self._probe_interval = FIRST_PROBE_INTERVAL
                    self._probe_credit = 0.0
                else:
                    self._probe_credit -= self._probe_cost(name, proposer, ctx)
                    self._probe_interval = min(2 * self._probe_interval, MAX_PROBE_INTERVAL)
                ctx = replace(ctx, estimates=True)
                found, _ = truncate(proposer.propose(ctx), max_k)
                drafted.append(name)
                est = self.estimates(name, found)
                # A probe sends at least one slot: it is how the running rates learn.
                n = sequential_keep(est, priors, verify, rate) or (1 if probe else 0)
                if n or best_lookup is None:
                    sent, unsent = truncate(found, n)
                    return Decision(sent, name if n else None, unsent, tuple(drafted))
        if best_lookup is not None:
            best_lookup.drafted = tuple(drafted)
            return best_lookup
        return Decision(Proposal(token_ids=[]), None, [], tuple(drafted))

    def _draft_s(self, name: str) -> float:
        assert self.cost is not None
        return self.cost.draft_s.get(self._keys.get(name, ""), 0.0)

    def _probe_cost(self, name: str, proposer: Drafter, ctx: DraftContext) -> float:
        """Seconds a probe adds to a plain step: the draft, its catch-up on the positions
        committed since the drafter last read, and a verify row."""
        assert self.cost is not None
        cached = getattr(proposer, "cached_positions", None)
        behind = max(0, len(ctx.token_ids) - 1 - cached()) if cached is not None else 0
        per_position = self.cost.catchup_s.get(self._keys.get(name, ""), 0.0)
        extra_row = self.cost.verify(2) - self.cost.verify(1)
        return self._draft_s(name) + per_position * behind + extra_row

    def _probe_due(self, name: str, proposer: Drafter, ctx: DraftContext) -> bool:
        """A probe of a drafter that does not pay: at the doubling interval, once the run has
        earned its price (``PROBE_BUDGET`` of each step's time)."""
        if self._since_probe < self._probe_interval:
            return False
        return self._probe_credit >= self._probe_cost(name, proposer, ctx)

    def observe(self, decision: Decision, num_accepted: int, num_emitted: int) -> None:
        if self.cost is None:  # a plain run: nothing to learn
            return
        if decision.proposer is not None:
            self._rates(decision.proposer).update(len(decision.proposal), num_accepted)
        one = self.cost.verify(1)
        verify = self.cost.verify(len(decision.proposal) + 1)
        seconds = verify
        for name in decision.drafted:
            seconds += self._draft_s(name)
        learned = self._learned
        if learned is not None and learned in decision.drafted:
            # Its drafting step against a plain step of the same time, in tokens: what it
            # added beyond the one token, less the time it took at plain decoding's rate.
            added = num_accepted if decision.proposer == learned else 0
            spent = self._draft_s(learned) + (verify - one if decision.proposer == learned else 0)
            self._rates(learned).record_payoff(added - spent / one)
        self._probe_credit += PROBE_BUDGET * seconds
        self.tokens += num_emitted
        self.seconds += seconds

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.name}
        if self.cost is not None:
            out["cost_model"] = self.cost.to_dict()
        if self.calibrations:
            out["calibration"] = {
                name: {"scale": c.scale, "biases": list(c.biases)}
                for name, c in sorted(self.calibrations.items())
            }
        return out
