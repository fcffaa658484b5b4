"""What a calibration makes of a step's scores when one of them is damaged."""

from __future__ import annotations

import math

import pytest

from langgraph_parallelmuse.calibration import Calibration


@pytest.mark.parametrize("bad", [math.nan, math.inf, None])
@pytest.mark.parametrize("bad_region", ["exploration", "reasoning"])
def test_a_region_without_a_finite_score_does_not_hide_the_other_regions_crossing(bad, bad_region):
    """A NaN exploration score lost every comparison and stayed the best, so ``('exploration', nan)``
    came back and a reasoning score far over its threshold never forked."""
    cal = Calibration("nll", 0.8, {"exploration": 2.0, "reasoning": 2.0}, {})
    good_region = "reasoning" if bad_region == "exploration" else "exploration"
    assert cal.excess({bad_region: bad, good_region: 9.0}, mode="mixed") == (good_region, 4.5)


def test_a_step_with_no_finite_score_in_its_mode_has_no_excess():
    cal = Calibration("nll", 0.8, {"exploration": 2.0, "reasoning": 2.0}, {})
    assert cal.excess({"exploration": math.nan, "reasoning": math.nan}, mode="mixed") is None
    assert cal.excess({"exploration": math.nan, "reasoning": 9.0}, mode="exploration") is None
