"""The metrics package: what the numbers mean, how they are computed over stored runs, and
their CSV (docs/algorithms.md, "Metrics").

    calibration   ECE, AUROC, Brier, temperature scaling, bootstrap intervals (numpy)
    columns       each comparison and step column's label, definition and unit
    confidence    confidence-head scores read from the store, with their labels
    comparison    one row per run (``compare``) plus the Compare tab's chart data
    agreement     do two runs of one drafter draft the same thing (vLLM against local)
    csv           CSV export

What tau, a_k and the acceptance rate mean is ``specui.acceptance``, below the trace and the
store, which use it too.  The names below are importable from ``specui.metrics`` and load
their module on first use, so importing one formula does not load the store readers.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
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
