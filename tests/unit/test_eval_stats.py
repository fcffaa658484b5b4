"""Bootstrap intervals: determinism, coverage of the mean, degenerate inputs, paired differences."""

from __future__ import annotations

import inspect
import random

import pytest

from langgraph_parallelmuse.eval import (
    bootstrap_ci,
    bootstrap_ratio,
    format_diff,
    paired_bootstrap_diff,
    within_noise,
)
from langgraph_parallelmuse.eval import stats as stats_module

SCORES = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1]


@pytest.fixture(params=["numpy", "pure"])
def backend(request, monkeypatch):
    if request.param == "numpy":
        if stats_module._np is None:
            pytest.skip("numpy not installed")
    else:
        monkeypatch.setattr(stats_module, "_np", None)
    return request.param


def test_same_seed_same_interval(backend):
    assert bootstrap_ci(SCORES, seed=7) == bootstrap_ci(SCORES, seed=7)


def test_interval_contains_mean(backend):
    mean, low, high = bootstrap_ci(SCORES)
    assert mean == pytest.approx(sum(SCORES) / len(SCORES))
    assert low <= mean <= high
    assert low < high


def test_constant_values_zero_width(backend):
    for value in (1.0, 0.0, 0.1):
        mean, low, high = bootstrap_ci([value] * 37)
        assert mean == pytest.approx(value)
        assert low == high == value


def test_higher_confidence_is_wider(backend):
    _, low90, high90 = bootstrap_ci(SCORES, confidence=0.90)
    _, low99, high99 = bootstrap_ci(SCORES, confidence=0.99)
    assert low99 <= low90 and high90 <= high99


def test_pure_python_close_to_numpy(monkeypatch):
    if stats_module._np is None:
        pytest.skip("numpy not installed")
    rng = random.Random(3)
    values = [rng.random() for _ in range(100)]
    with_numpy = bootstrap_ci(values)
    monkeypatch.setattr(stats_module, "_np", None)
    pure = bootstrap_ci(values)
    assert pure[0] == pytest.approx(with_numpy[0])
    assert pure[1:] == pytest.approx(with_numpy[1:], abs=0.02)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n_resamples": 0}, "n_resamples"), ({"confidence": 1.0}, "confidence")],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_ci(SCORES, **kwargs)
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([])


def test_paired_diff_sign(backend):
    better = [1] * 18 + [0] * 2
    worse = [1] * 6 + [0] * 14
    diff, low, high = paired_bootstrap_diff(better, worse)
    assert diff == pytest.approx(0.6)
    assert 0 < low <= diff <= high
    assert not within_noise(low, high)
    neg, nlow, nhigh = paired_bootstrap_diff(worse, better)
    assert neg == pytest.approx(-0.6)
    assert nlow <= neg <= nhigh < 0


def test_paired_diff_identical_systems_within_noise(backend):
    diff, low, high = paired_bootstrap_diff(SCORES, SCORES)
    assert (diff, low, high) == (0.0, 0.0, 0.0)
    assert within_noise(low, high)


def test_paired_diff_length_mismatch():
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap_diff([1, 0], [1])


def test_within_noise():
    assert within_noise(-0.1, 0.1)
    assert within_noise(0.0, 0.2)
    assert not within_noise(0.01, 0.2)
    assert not within_noise(-0.2, -0.01)


def test_bootstrap_ratio_is_the_ratio_of_totals_with_an_interval_around_it():
    generated = [600, 500, 700, 650, 3000]
    scratch = [1000, 900, 1100, 1000, 4000]
    ratio, low, high = bootstrap_ratio(generated, scratch, seed=3)
    assert ratio == pytest.approx(5450 / 8000)  # totals, not the mean of per-question ratios (0.666)
    assert low < ratio < high
    assert bootstrap_ratio(generated, scratch, seed=3) == (ratio, low, high)
    assert bootstrap_ratio([5, 5], [10, 10]) == (0.5, 0.5, 0.5)


def test_bootstrap_ratio_refuses_what_has_no_ratio():
    with pytest.raises(ValueError, match="equal lengths"):
        bootstrap_ratio([1, 2], [1])
    with pytest.raises(ValueError, match="positive reference"):
        bootstrap_ratio([1, 2], [0, 0])
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ratio([], [])


def test_the_mean_of_constant_scores_lies_in_its_interval():
    """fsum([0.2] * 3) / 3 is 0.20000000000000004, above the interval clamped to 0.2: the bench's
    accuracy plot got a negative error bar and ended the run with a traceback."""
    for value, n in [(0.2, 3), (0.1818, 6), (0.1, 3)]:
        mean, low, high = bootstrap_ci([value] * n)
        assert low <= mean <= high


def test_bootstrap_ratio_without_a_resample_to_divide_says_so():
    """One resample that misses the only sized question has no ratio: about a third of the seeds
    draw one; each of them says so, and every other seed gives its ratio."""
    refused = 0
    for seed in range(30):
        try:
            _, low, high = bootstrap_ratio([1, 1, 1], [3, 0, 0], n_resamples=1, seed=seed)
        except ValueError as err:
            assert "no resample had a positive reference" in str(err)
            refused += 1
        else:
            assert 0 < low <= high
    assert 0 < refused < 30


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_are_refused_naming_the_question(backend, bad):
    """Before: a NaN score gave a part-NaN interval, and format_diff printed it as a significant difference."""
    with pytest.raises(ValueError, match=r"values\[1\] is .*finite"):
        bootstrap_ci([1, bad, 0, 1])
    with pytest.raises(ValueError, match=r"a\[2\] is .*finite"):
        paired_bootstrap_diff([1, 0, bad, 1], [0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"b\[0\] is .*finite"):
        paired_bootstrap_diff([1, 0, 1, 1], [bad, 0, 0, 0])
    with pytest.raises(ValueError, match=r"numerators\[1\] is .*finite"):
        bootstrap_ratio([1, bad, 2], [1, 1, 1])
    with pytest.raises(ValueError, match=r"denominators\[1\] is .*finite"):
        bootstrap_ratio([1, 2, 3], [1, bad, 1])


def test_bootstrap_ratio_of_questions_with_one_ratio_lies_in_its_zero_width_interval(backend):
    """Before: summing 0.1 * n and 0.3 * n put the ratio 1e-15 outside its own interval."""
    for n in range(1, 41):
        for num, den in [(0.1, 0.3), (0.7, 2.2), (3.3, 0.9), (1.1, 1.7)]:
            ratio, low, high = bootstrap_ratio([num] * n, [den] * n, n_resamples=50, seed=n)
            assert low <= ratio <= high
            assert low == high == num / den


def test_bootstrap_ratio_keeps_its_interval_where_a_question_has_no_reference():
    ratio, low, high = bootstrap_ratio([1, 2, 3, 4], [2, 0, 3, 5], seed=1)
    assert ratio == pytest.approx(10 / 10)
    assert low < high


def test_every_public_function_is_exported():
    # Before: format_diff (which the package re-exports) was missing from __all__, so a star import lacked it.
    defined = {
        name
        for name, value in vars(stats_module).items()
        if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == stats_module.__name__
    }
    assert defined == set(stats_module.__all__)


def test_paired_diff_of_one_pair_is_within_noise(backend):
    # One question's difference has nothing to resample: a zero-wide interval read as significant.
    diff, low, high = paired_bootstrap_diff([1.0], [0.0])
    assert diff == 1.0 and within_noise(low, high)
    assert format_diff(diff, low, high).endswith("~")


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_a_seed_numpy_would_refuse_is_refused_by_name_on_either_path(backend, seed):
    """numpy's generator failed a negative seed with "expected non-negative integer" (naming no argument),
    where the pure-Python path took it: the same call worked or failed depending on numpy."""
    for call in (
        lambda: bootstrap_ci(SCORES, seed=seed),
        lambda: paired_bootstrap_diff(SCORES, SCORES[::-1], seed=seed),
        lambda: bootstrap_ratio(SCORES, [1] * len(SCORES), seed=seed),
    ):
        with pytest.raises(ValueError, match=f"seed must be a whole number >= 0 or None, got {seed!r}"):
            call()


def test_no_seed_draws_fresh_resamples_as_a_bench_without_one_records(backend):
    """A bench run with seed=None records it so; its summary (and --report-only) failed on the new check."""
    mean, low, high = bootstrap_ci([1, 0, 1, 1], seed=None)
    assert mean == 0.75 and low <= mean <= high
    diff, low, high = paired_bootstrap_diff([1, 0, 1], [0, 0, 1], seed=None)
    assert low <= diff <= high


@pytest.mark.parametrize("bad", [None, "yes", [1.0]])
def test_a_value_that_is_no_number_is_refused_naming_the_question(bad):
    # Before: float()'s TypeError or ValueError ("float() argument must be a string or a real number,
    # not 'NoneType'"), naming neither the argument nor the question; e.g. an unreadable judge verdict.
    with pytest.raises(ValueError, match=r"values\[1\] is .*finite number"):
        bootstrap_ci([1.0, bad, 0.0])
    with pytest.raises(ValueError, match=r"b\[0\] is .*finite number"):
        paired_bootstrap_diff([1.0, 0.0], [bad, 1.0])
