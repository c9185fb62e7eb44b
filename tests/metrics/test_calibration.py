"""specui.metrics.calibration against independent implementations: scipy's Mann-Whitney U
for AUROC, ``scipy.stats.bootstrap`` for the intervals, and a plain loop for ECE."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import bootstrap, mannwhitneyu

from specui.metrics.calibration import (
    auroc,
    expected_calibration_error,
    ratio_interval,
    tau_difference_interval,
)

RESAMPLES = 20_000  # Monte Carlo error of a 2.5% quantile: about 1% of the interval's width


def _scores(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidences rounded to two digits (so ties occur) and labels that follow them."""
    rng = np.random.default_rng(seed)
    scores = np.round(rng.uniform(0, 1, n), 2)
    labels = rng.uniform(0, 1, n) < scores
    return scores, labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_is_the_mann_whitney_u_over_the_pairs(seed: int) -> None:
    scores, labels = _scores(seed, 400)
    pos, neg = scores[labels], scores[~labels]
    u = mannwhitneyu(pos, neg, alternative="two-sided").statistic  # U of the positives, ties half
    assert auroc(scores, labels) == pytest.approx(u / (pos.size * neg.size), rel=1e-12)


def test_ece_matches_a_loop_over_equal_width_bins() -> None:
    scores, labels = _scores(3, 500)
    total = 0.0
    for b in range(10):
        lo, hi = b / 10, (b + 1) / 10
        in_bin = [
            (c, y)
            for c, y in zip(scores, labels, strict=True)
            if lo <= c < hi or (b == 9 and c == 1.0)
        ]
        if in_bin:
            conf = sum(c for c, _ in in_bin) / len(in_bin)
            acc = sum(y for _, y in in_bin) / len(in_bin)
            total += len(in_bin) / scores.size * abs(acc - conf)
    assert expected_calibration_error(scores, labels) == pytest.approx(total, rel=1e-12)


def _prompts(seed: int, n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt (accepted tokens, drafts) with prompts of differing difficulty."""
    rng = np.random.default_rng(seed)
    drafts = rng.integers(20, 80, size=n).astype(float)
    accepted = rng.binomial(
        drafts.astype(int) * 3, np.clip(rng.normal(0.5, 0.15, n), 0.05, 0.95)
    ).astype(float)
    return accepted, drafts


def _close(ours: tuple[float, float] | None, theirs: tuple[float, float]) -> None:
    """Two percentile intervals from independent resamples agree to a few percent of their
    width (each endpoint's resampling noise is about 1% of it at RESAMPLES)."""
    assert ours is not None
    width = theirs[1] - theirs[0]
    assert width > 0
    assert ours[0] == pytest.approx(theirs[0], abs=0.05 * width)
    assert ours[1] == pytest.approx(theirs[1], abs=0.05 * width)


@pytest.mark.parametrize("seed", [0, 1])
def test_ratio_interval_agrees_with_scipy_bootstrap(seed: int) -> None:
    accepted, drafts = _prompts(seed)
    ref = bootstrap(
        (accepted, drafts),
        lambda a, d, axis: a.sum(axis=axis) / d.sum(axis=axis),
        n_resamples=RESAMPLES,
        paired=True,  # a prompt is resampled with both of its counts
        vectorized=True,
        method="percentile",
        rng=np.random.default_rng(100 + seed),
    ).confidence_interval
    _close(ratio_interval(accepted, drafts, resamples=RESAMPLES, seed=seed), (ref.low, ref.high))


def test_paired_speedup_interval_agrees_with_scipy_bootstrap() -> None:
    rng = np.random.default_rng(5)
    tokens = rng.integers(32, 128, size=25).astype(float)
    base_wall = tokens * rng.uniform(0.02, 0.04, size=25)  # prompts differ in cost per token
    wall = base_wall / rng.normal(1.6, 0.2, size=25)  # and in how much the drafter helps

    def speedup(
        w: np.ndarray, t: np.ndarray, bw: np.ndarray, bt: np.ndarray, axis: int
    ) -> np.ndarray:
        return (bw.sum(axis=axis) / bt.sum(axis=axis)) / (w.sum(axis=axis) / t.sum(axis=axis))

    ref = bootstrap(
        (wall, tokens, base_wall, tokens),
        speedup,
        n_resamples=RESAMPLES,
        paired=True,  # the run and its baseline by the same prompts
        vectorized=True,
        method="percentile",
        rng=np.random.default_rng(9),
    ).confidence_interval
    ours = ratio_interval(
        wall, tokens, base_num=base_wall, base_den=tokens, resamples=RESAMPLES, seed=3
    )
    _close(ours, (ref.low, ref.high))


def test_tau_difference_interval_agrees_with_scipy_bootstrap() -> None:
    rng = np.random.default_rng(11)
    drafts_old = rng.integers(20, 60, size=30).astype(float)
    acc_old = rng.binomial(drafts_old.astype(int) * 3, 0.2).astype(float)
    drafts_new = rng.integers(15, 45, size=30).astype(float)
    acc_new = acc_old * rng.uniform(1.2, 2.0, size=30)  # a better drafter on the same prompts

    def diff(an: np.ndarray, dn: np.ndarray, ao: np.ndarray, do: np.ndarray, axis: int):
        return an.sum(axis=axis) / dn.sum(axis=axis) - ao.sum(axis=axis) / do.sum(axis=axis)

    ref = bootstrap(
        (acc_new, drafts_new, acc_old, drafts_old),
        diff,
        n_resamples=RESAMPLES,
        paired=True,  # both drafters by the same prompt draws
        vectorized=True,
        method="percentile",
        rng=np.random.default_rng(12),
    ).confidence_interval
    got = tau_difference_interval(
        list(zip(drafts_new, acc_new, strict=True)),
        list(zip(drafts_old, acc_old, strict=True)),
        resamples=RESAMPLES,
        seed=4,
    )
    assert got is not None
    point = acc_new.sum() / drafts_new.sum() - acc_old.sum() / drafts_old.sum()
    assert got[0] == pytest.approx(point)
    _close(got[1:], (ref.low, ref.high))
    assert tau_difference_interval([(3, 1)], [(3, 2)]) is None  # one prompt: no interval
    with pytest.raises(ValueError):
        tau_difference_interval([(3, 1), (2, 2)], [(3, 2)])
