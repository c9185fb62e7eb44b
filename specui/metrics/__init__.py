"""The metrics package: what the numbers mean, how they are computed over stored runs, and
their CSV (docs/algorithms.md, "Metrics").

    definitions   tau, tokens per step, a_k, acceptance rate and their empty cases (pure
                  Python; the trace and the vLLM counters use it too)
    calibration   ECE, AUROC, Brier, temperature scaling, bootstrap intervals (numpy)
    columns       each comparison and step column's label, definition and unit
    confidence    confidence-head scores read from the store, with their labels
    comparison    one row per run (``compare``) plus the Compare tab's chart data
    agreement     do two runs of one drafter draft the same thing (vLLM against local)
    csv           CSV export

The names below are importable from ``specui.metrics`` and load their module on first use:
``specui.trace`` sits below the store in the import order and imports ``definitions``,
which runs this file first, so this file must not import the store-reading modules itself.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "definitions": (
        "NO_DRAFT_ACCEPTANCE_LENGTH",
        "AcceptanceCounts",
        "DraftStep",
        "acceptance_length",
        "accepted_at_positions",
        "draft_acceptance_rate",
        "per_position_acceptance",
        "tokens_per_verifier_step",
    ),
    "calibration": (
        "BOOTSTRAP_RESAMPLES",
        "INTERVAL_LEVEL",
        "ConfidenceMetrics",
        "ConfidenceSamples",
        "ReliabilityBin",
        "apply_temperature",
        "auroc",
        "bootstrap_indices",
        "brier_score",
        "confidence_labels",
        "expected_calibration_error",
        "fit_temperature",
        "ratio_interval",
        "tau_difference_interval",
        "reliability_bins",
        "slot_rate_auroc",
    ),
    "columns": ("BASE_COLUMNS", "STEP_COLUMNS", "Column", "position_column"),
    "confidence": (
        "Calibration",
        "ConfidenceReport",
        "calibrate",
        "confidence_report",
        "load_confidences",
    ),
    "comparison": ("Comparison", "compare", "comparison_csv_text", "find_baseline"),
    "agreement": ("Disagreement", "StepAgreement", "step_agreement"),
    "csv": ("csv_text", "iter_step_rows", "write_csv", "write_steps_csv"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(f"{__name__}.{module}")
    for n in _MODULES[module]:  # bound once: later lookups are plain attributes
        globals()[n] = getattr(loaded, n)
    return globals()[name]

