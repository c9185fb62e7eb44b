"""The fitted calibration of each drafter's per-slot estimates, kept beside the cost model.

A learned drafter's raw estimate of slot j is its top-1 probability there; DSpark's is its
confidence head; the suffix lookup's is its match share.  None of them is a probability of
acceptance as it comes: a drafter trained to imitate the verifier is over-confident where the
verifier samples, and a match share counts tree branches, not outcomes.  The policy sends a
slot when its estimate pays for its verify row, so an over-confident estimate sends slots that
lose.  Each proposer therefore gets a temperature T, fitted on stored runs' slots
(``specui.metrics.slot_calibration``), and the policy reads ``sigmoid(logit(c) / T)``.

The fit is kept per verifier weights (a drafter's acceptance is against one verifier), in
``data_dir()/cost_models/calibration-<fingerprint>.json``, one entry per proposer name (the
algorithm, as the policy names it: ``dflash``, ``dspark``, ``suffix``...).  ``specui runs
calibrate`` refits it from the store; ``specui bench`` refits it after every bench.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specui.atomic import write_text
from specui.paths import data_dir

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class SlotCalibration:
    """One proposer's fitted temperature and what it did on the slots it was fitted on."""

    proposer: str  # the policy's name for it: the drafter's algorithm
    temperature: float
    slots: int  # slots (up to each step's first rejection) it was fitted on
    runs: int
    ece_raw: float  # ECE of the raw estimates on those slots
    ece_calibrated: float  # ECE after the temperature (in-sample: read it as a lower bound)


def calibration_path(verifier_fingerprint: str) -> Path:
    digest = hashlib.sha256(verifier_fingerprint.encode()).hexdigest()[:20]
    return data_dir() / "cost_models" / f"calibration-{digest}.json"


def load_calibrations(verifier_fingerprint: str) -> dict[str, SlotCalibration]:
    """The fitted calibrations for this verifier by proposer ({} when none, or unreadable)."""
    path = calibration_path(verifier_fingerprint)
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != CALIBRATION_VERSION:
            return {}
        return {name: SlotCalibration(**entry) for name, entry in raw["proposers"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("calibration %s unreadable (%s); estimates are used raw", path, e)
        return {}


def load_temperatures(verifier_fingerprint: str) -> dict[str, float]:
    """Proposer name -> fitted temperature, what ``AdaptivePolicy`` reads at its start."""
    return {n: c.temperature for n, c in load_calibrations(verifier_fingerprint).items()}


def save_calibrations(
    verifier_fingerprint: str, calibrations: dict[str, SlotCalibration]
) -> Path | None:
    """Write the fits (replacing the file: each fit covers every stored run it could read).
    None when the data folder is read-only: the policy then uses the estimates raw."""
    path = calibration_path(verifier_fingerprint)
    body: dict[str, Any] = {
        "version": CALIBRATION_VERSION,
        "verifier": verifier_fingerprint,
        "proposers": {name: asdict(c) for name, c in sorted(calibrations.items())},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(body, indent=1))
    except OSError as e:
        log.warning("could not save the calibration to %s: %s", path, e)
        return None
    return path
