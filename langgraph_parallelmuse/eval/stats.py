"""Bootstrap confidence intervals for per-question scores.

With 100-question dev sets a few points of difference is often noise; these helpers say how much.
numpy is used when installed (fast); otherwise a pure-Python path gives the same kind of interval
(the two paths draw different resamples, so their numbers differ slightly for the same seed).
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Sequence

try:
    import numpy as _np
except ImportError:  # numpy is optional: the library does not depend on it
    _np = None

__all__ = ["bootstrap_ci", "bootstrap_ratio", "format_diff", "paired_bootstrap_diff", "within_noise"]


def _finite(values: Sequence[float], name: str) -> list[float]:
    data = []
    for i, v in enumerate(values):
        try:
            value = float(v)
        except (TypeError, ValueError):  # float()'s own error named neither the argument nor the question
            value = math.nan
        # A NaN made part of the interval NaN, and format_diff printed a NaN interval as a significant
        # difference; an unreadable judge verdict (None) passed on as a score is refused the same way.
        if not math.isfinite(value):
            raise ValueError(
                f"{name}[{i}] is {v!r}: every per-question value must be a finite number; "
                "score that question or leave it out of every system compared"
            )
        data.append(value)
    return data


def _check(
    values: Sequence[float], n_resamples: int, confidence: float, seed: int | None, *, name: str = "values"
) -> list[float]:
    data = _finite(values, name)
    if not data:
        raise ValueError("values is empty: need at least one per-question score")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence}")
    # numpy's generator refuses a negative seed ("expected non-negative integer", naming no argument), where
    # the pure-Python path took it: the same call worked or failed with numpy installed.
    # None (a bench whose settings left it unset) draws fresh resamples on either path.
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ValueError(f"seed must be a whole number >= 0 or None, got {seed!r}")
    return data


def _percentile(sorted_values: list[float], q: float) -> float:
    # Linear interpolation between closest ranks, numpy's default method.
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _interval(
    num: list[float], den: list[float], n_resamples: int, confidence: float, seed: int | None
) -> tuple[float, float]:
    """Percentile interval of ``sum(num) / sum(den)`` over questions resampled with replacement,
    the same rows for both (a mean is the ratio with ``den`` all 1). A resample whose ``den`` sums
    to 0 or less has no ratio and is left out."""
    alpha = (1.0 - confidence) / 2.0
    n = len(num)
    if _np is not None:
        picks = _np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
        tops, bottoms = _np.asarray(num)[picks].sum(axis=1), _np.asarray(den)[picks].sum(axis=1)
        values = sorted((tops[bottoms > 0] / bottoms[bottoms > 0]).tolist())
    else:
        rng = random.Random(seed)
        values = []
        for _ in range(n_resamples):
            picks = rng.choices(range(n), k=n)
            if (bottom := math.fsum(den[i] for i in picks)) > 0:
                values.append(math.fsum(num[i] for i in picks) / bottom)
        values.sort()
    if not values:
        raise ValueError("no resample had a positive reference: use more n_resamples")
    return _percentile(values, alpha), _percentile(values, 1 - alpha)


def bootstrap_ci(
    values: Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> tuple[float, float, float]:
    """Mean of per-question scores with a percentile-bootstrap confidence interval.

    Args:
        values: One score per question (e.g. EM or F1).
        n_resamples: Bootstrap resamples.
        confidence: Interval coverage, in (0, 1).
        seed: Random seed, >= 0 (``None``: fresh resamples); the same seed and input give the same interval.

    Returns:
        ``(mean, low, high)``.

    Raises:
        ValueError: ``values`` is empty or holds something other than a finite number, or
            ``n_resamples`` / ``confidence`` / ``seed`` is out of range.

    Example:
        >>> mean, low, high = bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 0, 1, 1], seed=1)
        >>> mean
        0.7
        >>> low <= mean <= high
        True
    """
    data = _check(values, n_resamples, confidence, seed)
    mean = math.fsum(data) / len(data)
    low, high = _interval(data, [1.0] * len(data), n_resamples, confidence, seed)
    # Floating-point summation may step a hair outside the data range (e.g. constant inputs);
    # a resampled mean never can, so clamp to keep constant scores a zero-width interval.
    # The mean too: fsum([0.2] * 3) / 3 is 0.20000000000000004, above an interval clamped to 0.2,
    # and a plot's error bar of mean - low came out negative (matplotlib refuses it).
    return _clamped(data, mean, low, high)


def _clamped(bounds: list[float], estimate: float, low: float, high: float) -> tuple[float, float, float]:
    """``(estimate, low, high)``, each moved into ``[min(bounds), max(bounds)]``."""
    lo, hi = min(bounds), max(bounds)
    return min(max(estimate, lo), hi), min(max(low, lo), hi), min(max(high, lo), hi)


def paired_bootstrap_diff(
    a: Sequence[float],
    b: Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> tuple[float, float, float]:
    """Mean difference ``a - b`` of paired per-question scores, with a bootstrap interval.

    Questions are resampled as pairs, so the shared difficulty of each question cancels out; this
    is tighter than comparing two independent intervals.

    Args:
        a: Scores of system A, one per question.
        b: Scores of system B on the same questions, in the same order.
        n_resamples: Bootstrap resamples.
        confidence: Interval coverage, in (0, 1).
        seed: Random seed.

    Returns:
        ``(mean_diff, low, high)``; positive means A scores higher. One pair has no spread to
        resample: its interval is ``(-inf, inf)``, within noise.

    Raises:
        ValueError: ``a`` and ``b`` differ in length, are empty, or hold something other than a
            finite number; or an option is out of range (as :func:`bootstrap_ci`).

    Example:
        >>> a = [1, 1, 1, 1, 1, 1, 0, 1]
        >>> b = [0, 0, 0, 0, 0, 1, 0, 0]
        >>> diff, low, high = paired_bootstrap_diff(a, b)
        >>> diff
        0.75
        >>> within_noise(low, high)
        False
    """
    if len(a) != len(b):
        raise ValueError(
            f"paired scores need equal lengths, got {len(a)} and {len(b)}: "
            "score both systems on the same questions in the same order"
        )
    diffs = [x - y for x, y in zip(_finite(a, "a"), _finite(b, "b"), strict=True)]
    diff, low, high = bootstrap_ci(diffs, n_resamples=n_resamples, confidence=confidence, seed=seed)
    if len(diffs) == 1:
        # Resampling one pair gave that difference alone, a zero-wide interval that every caller
        # printing format_diff or within_noise reported as significant.
        return diff, -math.inf, math.inf
    return diff, low, high


def bootstrap_ratio(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> tuple[float, float, float]:
    """Ratio of sums ``sum(numerators) / sum(denominators)`` over questions, with a bootstrap interval.

    The ratio a benchmark reports for totals (tokens of one method against another's, seconds
    against seconds): each question weighs by its size, as in the totals. Questions are resampled
    as pairs.

    Args:
        numerators: One value per question (e.g. a variant's generated tokens).
        denominators: The reference's values on the same questions, in the same order; positive sum.
        n_resamples: Bootstrap resamples.
        confidence: Interval coverage, in (0, 1).
        seed: Random seed.

    Returns:
        ``(ratio, low, high)``.

    Raises:
        ValueError: The sequences differ in length, are empty or hold something other than a finite
            number, or the denominators sum to 0 or less; or an option is out of range (as
            :func:`bootstrap_ci`).

    Example:
        >>> ratio, low, high = bootstrap_ratio([60, 50, 70, 65], [100, 90, 110, 100])
        >>> round(ratio, 3), low <= ratio <= high
        (0.613, True)
    """
    num = _check(numerators, n_resamples, confidence, seed, name="numerators")
    den = _finite(denominators, "denominators")
    if len(num) != len(den):
        raise ValueError(f"paired values need equal lengths, got {len(num)} and {len(den)}")
    if math.fsum(den) <= 0:
        raise ValueError("the denominators sum to 0 or less: a ratio of sums needs a positive reference")
    ratio = math.fsum(num) / math.fsum(den)
    low, high = _interval(num, den, n_resamples, confidence, seed)
    if min(den) <= 0:
        return ratio, low, high
    # With positive denominators every resampled ratio of sums is a weighted mean of the questions' own
    # ratios, so it lies between the smallest and the largest; summation may step a hair outside (the
    # same ratio on every question gave a ratio 1e-15 outside its own zero-width interval): clamp, as
    # bootstrap_ci does.
    return _clamped([n / d for n, d in zip(num, den, strict=True)], ratio, low, high)


def within_noise(low: float, high: float) -> bool:
    """Whether a difference interval contains 0, i.e. the difference is not significant.

    Args:
        low: Lower bound of the interval.
        high: Upper bound of the interval.

    Returns:
        ``True`` if ``low <= 0 <= high``.

    Example:
        >>> within_noise(-0.02, 0.05)
        True
        >>> within_noise(0.01, 0.05)
        False
    """
    return low <= 0.0 <= high


def format_diff(diff: float, low: float, high: float) -> str:
    """A paired difference as the benchmark tables print it: ``~`` marks one within noise.

    Args:
        diff: Mean difference, as from :func:`paired_bootstrap_diff`.
        low: Lower bound of its interval.
        high: Upper bound of its interval.

    Returns:
        ``"+0.050 [+0.00, +0.15] ~"``-style text.

    Example:
        >>> format_diff(0.05, 0.0, 0.15)
        '+0.050 [+0.00, +0.15] ~'
        >>> format_diff(0.1, 0.02, 0.2)
        '+0.100 [+0.02, +0.20]'
    """
    return f"{diff:+.3f} [{low:+.2f}, {high:+.2f}]" + (" ~" if within_noise(low, high) else "")
