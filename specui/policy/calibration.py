"""The fitted calibration of each drafter's per-slot estimates, kept beside the cost model.

A learned drafter's raw estimate of slot j is its top-1 probability there; DSpark's is its
confidence head; the suffix lookup's is its match share.  None of them is a probability of
acceptance as it comes: a drafter trained to imitate the verifier is over-confident where the
verifier samples, and a match share counts tree branches, not outcomes.  The policy sends a
slot when its estimate pays for its verify row, so an over-confident estimate sends slots that
lose.  Each proposer therefore gets a Platt scaling with an offset per slot position, fitted on
stored runs' slots (``specui.metrics.slot_calibration``), and the policy reads
``sigmoid(scale * logit(c) + bias[j])`` for slot j (the last offset for every later slot).  A
temperature alone (version 1 of this file) only stretches the logits about 1/2: it cannot move
a drafter whose estimates are off by a base rate, which is what the learned drafters are (their
top-1 probability runs above their acceptance at every level), and acceptance falls with the
slot's position at the same estimate.  Both are known before the verify: the estimate and the
slot's position in the draft, so the sampled output stays lossless.

The fit is kept per verifier weights (a drafter's acceptance is against one verifier), in
``data_dir()/cost_models/calibration-<fingerprint>.json``, one entry per proposer name (the
algorithm, as the policy names it: ``dflash``, ``dspark``, ``suffix``...).  ``specui runs
calibrate`` refits it from the store; ``specui bench`` refits it after every bench.  A file of
version 1 (a temperature each) is read as the Platt scaling it equals; a file of another
version, or an entry with a number that is not finite, is left out with a warning: the policy
then reads those estimates raw.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specui.atomic import write_text
from specui.paths import data_dir

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 2
EPS = 1e-6  # estimates are clipped to [EPS, 1 - EPS] before their logit


@dataclass(frozen=True)
class SlotCalibration:
    """One proposer's fitted Platt scaling and what it does on the slots, in and out of sample.

    The held-out numbers are cross-fitted by prompt: the fit on the even-indexed prompts'
    slots is measured on the odd-indexed prompts' slots and the other way round, the two
    pooled (a prompt decoded by several runs falls in one half, so no slot is measured by a
    fit that saw its prompt).  None where a half had too few slots to fit."""

    proposer: str  # the policy's name for it: the drafter's algorithm
    scale: float  # a in sigmoid(a * logit(c) + bias[j])
    biases: tuple[float, ...]  # bias[j] for slot j (0-based); the last for every later slot
    slots: int  # slots (up to each step's first rejection) it was fitted on
    runs: int
    ece_raw: float  # ECE of the raw estimates on those slots
    ece_calibrated: float  # after the fit, in-sample: read it as a lower bound
    ece_heldout_raw: float | None = None  # the raw estimates on the held-out slots
    ece_heldout: float | None = None  # the calibrated ones there, fitted without them
    heldout_slots: int = 0

    def probability(self, confidence: float, slot: int) -> float:
        """The calibrated acceptance estimate of a raw estimate at slot ``slot`` (0-based)."""
        c = min(max(confidence, EPS), 1 - EPS)
        z = self.scale * math.log(c / (1 - c)) + self.biases[min(slot, len(self.biases) - 1)]
        return 0.5 * (1.0 + math.tanh(0.5 * z))  # the sigmoid, overflow-free

    @property
    def temperature(self) -> float:
        """1 / scale: the temperature the logits are divided by (as version 1 stored it)."""
        return 1.0 / self.scale


def _entry(name: str, entry: dict[str, Any], version: int) -> SlotCalibration:
    """One stored entry; version 1 held a temperature, read as scale 1 / T and no bias."""
    if version == 1:
        entry = dict(entry)
        t = float(entry.pop("temperature"))
        entry["scale"], entry["biases"] = 1.0 / t, (0.0,)
    cal = SlotCalibration(**{**entry, "biases": tuple(float(b) for b in entry["biases"])})
    numbers = [cal.scale, *cal.biases]
    if not cal.biases or not all(math.isfinite(x) for x in numbers) or cal.scale <= 0:
        raise ValueError(f"{name}: scale {cal.scale} and biases {cal.biases} are not a fit")
    return cal


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
        version = raw.get("version")
        if version not in (1, CALIBRATION_VERSION):
            log.warning(
                "calibration %s is version %r, not %d; estimates are used raw",
                path,
                version,
                CALIBRATION_VERSION,
            )
            return {}
        entries = raw["proposers"].items()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("calibration %s unreadable (%s); estimates are used raw", path, e)
        return {}
    out: dict[str, SlotCalibration] = {}
    for name, entry in entries:
        try:  # one bad entry costs its proposer's fit only
            out[name] = _entry(name, entry, version)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("calibration %s: entry %r unreadable (%s); read raw", path, name, e)
    return out


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
