"""DSpark's confidence policy as a run's setting (torch-free): the modes a user picks from,
the drafter option a choice becomes, and the label a stored run's settings keep.

The policy itself (how many slots to send) is ``drafter.ConfidencePolicy``; the Playground and
the run settings (``specui.service.run_settings``, through ``AlgorithmSpec.drafter_options``)
read what they need from here, so a new mode is added in this package only.
"""

from __future__ import annotations

from typing import Any

MODES = ("off", "threshold", "cost")  # off: every drafted slot is sent to the verifier


def policy_option(mode: str, threshold: float) -> dict[str, Any] | None:
    """The drafter's ``confidence_policy`` option for a mode and threshold (None: off)."""
    if mode == "off":
        return None
    return {"mode": mode, "threshold": float(threshold)}


def policy_label(policy: dict[str, Any] | str | None) -> str | None:
    """How a run's settings record the policy: "threshold:0.3"; None when every slot is sent."""
    if not policy:
        return None
    if isinstance(policy, dict):
        return f"{policy.get('mode')}:{policy.get('threshold')}"
    return str(policy)
