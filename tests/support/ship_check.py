"""The campaign's ship check at a test's size (``specui.training.campaign_eval.SHIP_SETS``)."""

from __future__ import annotations

import pytest

from specui.training import campaign_eval as ce


def tiny_ship_check(
    monkeypatch: pytest.MonkeyPatch, spec_bench: int = 2, max_new_tokens: int = 12
) -> None:
    """Real benches, few prompts and tokens: ``spec_bench`` Spec-Bench questions at a fixed K,
    two held-out math prompts, two adaptive questions."""
    monkeypatch.setattr(ce, "MAX_NEW_TOKENS", max_new_tokens)
    monkeypatch.setattr(
        ce,
        "SHIP_SETS",
        {
            "ship-spec-bench": ("spec-bench", spec_bench, "fixed"),
            "ship-math": ("gsm-symbolic", 2, "fixed"),
            "ship-spec-bench-adaptive": ("spec-bench", 2, "adaptive"),
        },
    )
