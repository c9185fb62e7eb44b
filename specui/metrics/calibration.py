"""Confidence calibration and bootstrap intervals, in numpy alone (no sklearn, no store).

* Confidence labels: slot k (0-based) of a step counts as accepted iff k < num_accepted;
  slots after the first rejection count as not accepted.
* ECE uses equal-width bins; AUROC is the Mann-Whitney U statistic over the pairs, ties
  counting half; the temperature is fitted by the log loss of sigmoid(logit(c) / T).
* Intervals are percentile bootstraps over prompts: how much a number would move on other
  prompts like these.  They do not cover a machine that was slow for a whole run (the
  benchmark interleaves runs for that).  A dozen prompts leave tau uncertain by about
  +-0.2: read a bar verdict with it.

tests/metrics/test_calibration.py checks AUROC against scipy's Mann-Whitney U and the intervals
against ``scipy.stats.bootstrap``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specui.errors import SpecUIError

BOOTSTRAP_RESAMPLES = 2000
INTERVAL_LEVEL = 0.95


def expected_calibration_error(
    confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray, n_bins: int = 10
) -> float:
    """Sum over equal-width bins of (bin share) * |accuracy - mean confidence|."""
    c, y = _arrays(confidences, labels)
    if c.size == 0:
        raise ValueError("no samples")
    bins = np.minimum((c * n_bins).astype(np.int64), n_bins - 1)
    conf_sum = np.bincount(bins, weights=c, minlength=n_bins)
    acc_sum = np.bincount(bins, weights=y.astype(np.float64), minlength=n_bins)
    return float(np.abs(acc_sum - conf_sum).sum() / c.size)  # sum_b n_b/N * |acc_b - conf_b|


def auroc(
    scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray
) -> float | None:
    """Area under the ROC curve (Mann-Whitney U, ties count half); None with one class."""
    s, y = _arrays(scores, labels)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    _, inverse, counts = np.unique(s[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    avg_rank = (ends - counts + 1 + ends) / 2.0  # 1-based mean rank of each tie group
    ranks = np.empty(s.size)
    ranks[order] = avg_rank[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def brier_score(
    confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray
) -> float:
    """Mean squared error of the confidences as probabilities of acceptance."""
    c, y = _arrays(confidences, labels)
    if c.size == 0:
        raise ValueError("no samples")
    return float(np.mean((c - y) ** 2))


@dataclass(frozen=True)
class ReliabilityBin:
    lo: float
    hi: float
    count: int
    mean_confidence: float | None
    accuracy: float | None


def reliability_bins(
    confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray, n_bins: int = 10
) -> list[ReliabilityBin]:
    """The reliability diagram's data: accuracy against mean confidence per bin."""
    c, y = _arrays(confidences, labels)
    bins = np.minimum((c * n_bins).astype(np.int64), n_bins - 1)
    out = []
    for b in range(n_bins):
        m = bins == b
        n = int(m.sum())
        out.append(
            ReliabilityBin(
                b / n_bins,
                (b + 1) / n_bins,
                n,
                float(c[m].mean()) if n else None,
                float(y[m].mean()) if n else None,
            )
        )
    return out


EPS = 1e-7  # confidences are clipped to [EPS, 1 - EPS] before a logit or a log


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, EPS, 1 - EPS)
    return np.log(c) - np.log1p(-c)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free


def fit_temperature(
    confidences: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray
) -> float:
    """Temperature T minimising the log loss of sigmoid(logit(c) / T) on labels.

    The loss is convex in a = 1/T (a one-weight logistic regression), so the
    root of its derivative mean((sigmoid(a z) - y) z) is found by bisection;
    a is kept in [1e-3, 1e3]."""
    c, y = _arrays(confidences, labels)
    if c.size == 0 or y.all() or not y.any():
        raise SpecUIError("fitting a temperature needs both accepted and rejected slots")
    z = _logit(c)
    yf = y.astype(np.float64)

    def grad(a: float) -> float:
        return float(np.mean((_sigmoid(a * z) - yf) * z))

    lo, hi = 1e-3, 1e3
    if grad(lo) >= 0:
        return 1 / lo
    if grad(hi) <= 0:
        return 1 / hi
    for _ in range(200):  # geometric bisection: a spans six decades
        mid = math.sqrt(lo * hi)
        if grad(mid) > 0:
            hi = mid
        else:
            lo = mid
        if hi / lo < 1 + 1e-12:
            break
    return 1.0 / math.sqrt(lo * hi)


def apply_temperature(confidences: Sequence[float] | np.ndarray, temperature: float) -> np.ndarray:
    """sigmoid(logit(c) / T): T > 1 pulls confidences towards 1/2, T < 1 away from it."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _sigmoid(_logit(np.asarray(confidences, dtype=np.float64)) / temperature)


@dataclass(frozen=True)
class ConfidenceMetrics:
    n: int  # slots
    accepted_rate: float
    ece: float
    auroc: float | None
    brier: float

    @classmethod
    def of(cls, confidences: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> ConfidenceMetrics:
        return cls(
            n=int(confidences.size),
            accepted_rate=float(np.mean(labels)),
            ece=expected_calibration_error(confidences, labels, n_bins),
            auroc=auroc(confidences, labels),
            brier=brier_score(confidences, labels),
        )


@dataclass
class ConfidenceSamples:
    confidences: np.ndarray  # [N] float
    labels: np.ndarray  # [N] bool: slot accepted
    slots: np.ndarray  # [N] int: slot index k (0-based)


def confidence_labels(num_accepted: int, n_slots: int) -> list[bool]:
    """Slot k of a step is accepted iff k < num_accepted."""
    return [k < num_accepted for k in range(n_slots)]


def slot_rate_auroc(samples: ConfidenceSamples) -> float | None:
    """AUROC of the slot index alone: each slot scored by its slot's acceptance rate.

    Acceptance falls with k, so pooled over slots even a head that knows nothing
    but k ranks well; its own AUROC means something only above this baseline.
    (In-sample rates: if anything the baseline is flattered.)"""
    if samples.slots.size == 0:
        return None
    counts = np.bincount(samples.slots)
    rate = np.bincount(samples.slots, weights=samples.labels.astype(np.float64)) / np.maximum(
        counts, 1
    )
    return auroc(rate[samples.slots], samples.labels)


def _arrays(
    a: Sequence[float] | np.ndarray, b: Sequence[bool] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b).astype(bool).ravel()
    if x.shape != y.shape:
        raise ValueError(f"{x.size} scores but {y.size} labels")
    return x, y


# --- intervals over prompts ---------------------------------------------------------------


def bootstrap_indices(n: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """[resamples, n] prompt indices drawn with replacement (seeded: a comparison is
    reproducible)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def ratio_interval(
    num: Sequence[float] | np.ndarray,
    den: Sequence[float] | np.ndarray,
    *,
    base_num: Sequence[float] | np.ndarray | None = None,
    base_den: Sequence[float] | np.ndarray | None = None,
    level: float = INTERVAL_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``sum(num) / sum(den)`` over prompts (one entry each).

    With ``base_num`` / ``base_den`` (the baseline's, same prompts in the same order) the
    statistic is ``(sum(base_num) / sum(base_den)) / (sum(num) / sum(den))`` -- a speedup from
    time per token -- with both runs resampled by the same prompt draws (paired: a prompt that
    is slow for both moves neither).  None under two prompts or where a resample divides by 0.
    """
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = a.size
    if n < 2 or b.size != n:
        return None
    idx = bootstrap_indices(n, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = a[idx].sum(1) / b[idx].sum(1)
        if base_num is not None and base_den is not None:
            bn, bd = np.asarray(base_num, dtype=np.float64), np.asarray(base_den, dtype=np.float64)
            if bn.size != n or bd.size != n:
                raise ValueError("the baseline needs one entry per prompt of the run")
            stat = (bn[idx].sum(1) / bd[idx].sum(1)) / stat
    if not np.all(np.isfinite(stat)):
        return None
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def tau_difference_interval(
    new: Sequence[tuple[int, int]],
    old: Sequence[tuple[int, int]],
    *,
    level: float = INTERVAL_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float] | None:
    """tau(new) - tau(old) and its paired percentile-bootstrap interval over prompts.

    ``new`` and ``old`` hold one ``(drafts, accepted draft tokens)`` pair per prompt, the
    same prompts in the same order; tau of a run is ``1 + sum(accepted) / sum(drafts)``.
    Both runs are resampled by the same prompt draws, so a prompt that is easy for both
    moves neither: this is the interval a "ship only where better" decision reads.
    None under two prompts or where a resample has no draft.
    """
    a, b = np.asarray(new, dtype=np.float64), np.asarray(old, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] != 2:
        raise ValueError("new and old need one (drafts, accepted) pair per prompt each")
    n = a.shape[0]
    if n < 2 or a[:, 0].sum() == 0 or b[:, 0].sum() == 0:
        return None
    point = a[:, 1].sum() / a[:, 0].sum() - b[:, 1].sum() / b[:, 0].sum()
    idx = bootstrap_indices(n, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = a[idx, 1].sum(1) / a[idx, 0].sum(1) - b[idx, 1].sum(1) / b[idx, 0].sum(1)
    if not np.all(np.isfinite(stat)):
        return None
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return float(point), float(lo), float(hi)
