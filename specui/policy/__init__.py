"""How many drafts each step sends: the measured cost model (``cost.py``), the choice in closed
form (``choose.py``) and the two policies the decoding loop runs (``adaptive.py``): ``fixed``
(every draft, the raw drafter at its K) and ``adaptive`` (the default for the Playground, the
CLI and the bench).  docs/decoding.md, "The policy", says why each piece is as it is."""

from __future__ import annotations

from specui.errors import SpecUIError
from specui.policy.adaptive import AdaptivePolicy, Decision, FixedPolicy, Policy, Rates

POLICIES = ("adaptive", "fixed")
DEFAULT_POLICY = "adaptive"
# Every run's adaptive policy in this process learns into (and starts from) these.
SHARED_RATES: dict[str, Rates] = {}


def make_policy(name: str | None, **options) -> Policy:
    """A fresh policy by name (None: the default)."""
    name = name or DEFAULT_POLICY
    if name == "adaptive":
        return AdaptivePolicy(**{"shared_rates": SHARED_RATES, **options})
    if name == "fixed":
        return FixedPolicy()
    raise SpecUIError(f"unknown decoding policy {name!r}; known: {', '.join(POLICIES)}")


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "AdaptivePolicy",
    "Decision",
    "FixedPolicy",
    "Policy",
    "make_policy",
]
