"""What a calibration makes of a step's scores when one of them is damaged."""

from __future__ import annotations

import math

import pytest

from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.errors import ConfigError


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


_HEAD = '{"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": 2.0}'


@pytest.mark.parametrize(
    "content",
    [
        _HEAD + ', "confidence_window": Infinity}',
        _HEAD + ', "samples": {"exploration": 1e999}}',
        _HEAD + ', "top_logprobs": -Infinity}',
        '{"estimator": "nll", "quantile": 1' + "0" * 400 + ', "thresholds": {"exploration": 2.0}}',
        '{"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": 1' + "0" * 400 + "}}",
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["window-inf", "samples-1e999", "top-logprobs-inf", "quantile-400-digits", "threshold-400-digits", "deep"],
)
def test_a_calibration_file_with_numbers_beyond_a_float_is_a_config_error_not_a_traceback(tmp_path, content):
    """JSON reads Infinity, 1e999 and 400-digit integers, which int() or float() refuse with an
    OverflowError (and a deep nesting with a RecursionError): they escaped load() as tracebacks."""
    path = tmp_path / "cal.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="is malformed"):
        Calibration.load(path)


def test_fitting_on_a_score_beyond_a_float_is_a_config_error():
    with pytest.raises(ConfigError, match="not numbers"):
        Calibration.fit([[{"all": 10**400}]] * 20)
    with pytest.raises(ConfigError, match="not numbers"):
        Calibration.fit([[{"all": 2.0}]] * 20, confidences=[10**400])


def test_a_calibration_path_under_the_home_directory_is_found(tmp_path, monkeypatch):
    """A ``~`` path from Studio's context form or a Python config reaches no shell: load() said
    "not found" for a file that was there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cal.json").write_text(_HEAD + "}")
    assert Calibration.load("~/cal.json").thresholds == {"exploration": 2.0}
    # And save() writes there (it looked for a directory named "~").
    assert Calibration("nll", 0.8, {"all": 2.0}, {"all": 60}).save("~/other.json") == tmp_path / "other.json"
    assert Calibration.load(tmp_path / "other.json").thresholds == {"all": 2.0}
    with pytest.raises(ConfigError, match="not found"):  # an unknown user's ~ is no traceback
        Calibration.load("~no-such-user-here/cal.json")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (', "top_logprobs": -3', "top_logprobs=-3: use 0..20"),
        (', "top_logprobs": 2.7', "top_logprobs=2.7: use 0..20"),
        (', "top_logprobs": true', "top_logprobs=True: use 0..20"),
    ],
    ids=["negative", "fraction", "bool"],
)
def test_a_calibration_file_with_a_top_logprobs_no_run_can_use_is_malformed(tmp_path, extra, said):
    """int() read -3, 2.7 (as 2) and true (as 1): an early_stop run then advised ``set top_logprobs=-3``,
    a value the config refuses, or compared the wrong count."""
    path = tmp_path / "cal.json"
    path.write_text(_HEAD + extra + "}")
    with pytest.raises(ConfigError, match=f"is malformed: {said}"):
        Calibration.load(path)


@pytest.mark.parametrize("estimator", ["null", '"NLL"', "1", "{}"])
def test_a_calibration_file_with_an_unknown_estimator_is_malformed(tmp_path, estimator):
    """str() read null as the estimator 'None': a run refused the file as fitted with estimator='None'."""
    path = tmp_path / "cal.json"
    path.write_text(_HEAD.replace('"nll"', estimator) + "}")
    with pytest.raises(ConfigError, match="is malformed: estimator .* must be one of 'nll', 'entropy'"):
        Calibration.load(path)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (', "model": 3', "model 3 must be the name of the model the runs were scored on, a string"),
        (', "model": ["a"]', r"model \['a'\] must be the name of the model"),
        (', "trajectories": "many"', "trajectories 'many' must be the whole number of trajectories fitted on, >= 1"),
        (', "trajectories": 2.7', "trajectories 2.7 must be the whole number"),
        (', "trajectories": -3', "trajectories -3 must be the whole number"),
        (', "trajectories": true', "trajectories True must be the whole number"),
    ],
    ids=["model-number", "model-list", "trajectories-text", "trajectories-fraction", "negative", "bool"],
)
def test_a_calibration_file_with_a_model_or_trajectories_of_another_type_is_malformed_naming_the_field(
    tmp_path, extra, said
):
    """str() read "model": 3 as the model '3' (a run then warned it was fitted on another model), int() read
    "trajectories": 2.7 as 2, -3 and true as counts, and "many" was reported by int()'s message alone."""
    path = tmp_path / "cal.json"
    path.write_text(_HEAD + extra + "}")
    with pytest.raises(ConfigError, match=f"calibration file .*cal.json' is malformed: {said}"):
        Calibration.load(path)
    path.write_text(_HEAD + ', "model": "embedded float32", "trajectories": 20}')
    loaded = Calibration.load(path)
    assert (loaded.model, loaded.trajectories) == ("embedded float32", 20)


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_calibration_path_is_named_as_blank(blank):
    """An empty path was read as the working directory: "calibration '.' is not a file"."""
    with pytest.raises(ConfigError, match="calibration path .* is blank"):
        Calibration.load(blank)


def test_a_calibration_file_saved_with_a_byte_order_mark_loads(tmp_path):
    # Before: "malformed (Unexpected UTF-8 BOM ...): regenerate it", for a file an editor saved again.
    path = Calibration("nll", 0.8, {"all": 2.0}, {"all": 60}).save(tmp_path / "cal.json")
    path.write_text("\ufeff" + path.read_text(), encoding="utf-8")
    assert Calibration.load(path).thresholds == {"all": 2.0}
