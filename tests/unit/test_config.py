"""Config validation: every bad setting fails fast with a ConfigError naming it; budget maths."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.config import (
    MAX_N,
    ParallelMuseConfig,
    ParallelMuseContext,
    context_overrides,
    make_config,
    misplaced_settings,
    resolve_config,
)
from langgraph_parallelmuse.errors import ConfigError


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"n": 2, "m": 3}, ["m=3", "n=2"]),
        ({"n": 6, "m": 1, "k": 2, "t": 3}, ["n=6", "m + m*k*t = 7"]),
        ({"n": 7, "m": 2, "k": 1, "t": 3}, ["n=7", "m + m*k*t = 8"]),
        ({"k": -1}, ["k=-1"]),
        ({"t": 0}, ["t=0"]),
        ({"m": 0}, ["m=0"]),
        ({"n": 0, "m": 0}, ["n=0"]),
        ({"mode": "random"}, ["mode"]),
        ({"estimator": "variance"}, ["estimator"]),
        ({"aggregation": "best"}, ["aggregation"]),
        ({"driver": "turbo"}, ["driver"]),
        ({"temperature": -0.1}, ["temperature=-0.1"]),
        ({"temperature": 2.5}, ["temperature=2.5"]),
        ({"top_p": 0.0}, ["top_p=0.0"]),
        ({"top_p": 1.5}, ["top_p=1.5"]),
        ({"max_turns": 0}, ["max_turns=0"]),
        ({"top_logprobs": 21}, ["top_logprobs=21"]),
        ({"top_logprobs": -1}, ["top_logprobs=-1"]),
        ({"estimator": "entropy", "top_logprobs": 1}, ["estimator='entropy'", "top_logprobs"]),
        ({"max_step_tokens": 0}, ["max_step_tokens=0"]),
        ({"max_context_tokens": 0}, ["max_context_tokens=0"]),
        ({"max_report_tokens": 0}, ["max_report_tokens=0"]),
        ({"max_concurrency": 0}, ["max_concurrency=0"]),
        ({"max_observation_chars": 0}, ["max_observation_chars=0"]),
        ({"tool_timeout": 0}, ["tool_timeout=0"]),
        ({"nn": 8}, ["nn"]),  # unknown field: a typo must not be ignored
        ({"n": "eight"}, ["n"]),
        ({"report_form": "table"}, ["report_form"]),
        ({"crossover": -1}, ["crossover=-1"]),
        ({"crossover": 1, "aggregation": "majority"}, ["crossover", "aggregation='majority'"]),
        ({"n": 8, "crossover": 2}, ["n - crossover = 6", "m + m*k*t = 7"]),
        ({"n": 2, "mode": "none", "crossover": 2}, ["m=1 > n - crossover = 0"]),
    ],
)
def test_invalid_settings_raise_config_error_naming_the_setting(settings, names):
    with pytest.raises(ConfigError) as info:
        make_config(settings)
    message = str(info.value)
    assert message.startswith("invalid ParallelMuse config: ")
    for name in names:
        assert name in message


def test_a_seed_the_model_or_the_bootstrap_would_refuse_is_refused_before_the_run():
    """seed=-1 was accepted: the run went through its rollouts and reports, then the aggregator's call to the
    in-process engine ("pass an integer in [0, 2**64)") ended it, and a bench's intervals failed in numpy."""
    for seed in (-1, 2**64):
        with pytest.raises(ConfigError, match=rf"seed={seed}: use a whole number in \[0, 2\*\*64\), or no seed"):
            make_config(seed=seed)
    assert [make_config(seed=s).seed for s in (None, 0, 2**64 - 1)] == [None, 0, 2**64 - 1]


def test_a_budget_beyond_max_n_is_refused_before_anything_is_planned():
    """n=10**9 was accepted: the first wave made a job for each fill and ran out of memory (3 GB and
    16 s to a MemoryError) before any model call."""
    with pytest.raises(ConfigError, match=rf"n={10**9}: at most {MAX_N} trajectories per question"):
        make_config(n=10**9)
    assert make_config(n=MAX_N, mode="none").n == MAX_N


def test_config_error_is_a_value_error_and_not_a_pydantic_error():
    with pytest.raises(ValueError) as info:
        make_config(max_turns=0)
    assert type(info.value) is ConfigError
    assert info.value.__cause__ is None  # raised "from None": no pydantic traceback noise


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        make_config(t=0, temperature=9, max_turns=0)
    message = str(info.value)
    assert "t=0" in message and "temperature=9" in message and "max_turns=0" in message


def test_mode_none_needs_no_branch_budget_and_entropy_no_top_logprobs():
    cfg = make_config(n=1, m=1, k=2, t=3, mode="none")
    assert (cfg.branch_budget, cfg.fill_budget) == (0, 0)
    assert make_config(mode="none", estimator="entropy", top_logprobs=0).top_logprobs == 0


@pytest.mark.parametrize(
    ("n", "m", "k", "t", "mode", "branches", "fill"),
    [
        (8, 1, 2, 3, "exploration", 6, 1),  # paper defaults: 1 initial + 6 branches + 1 fill
        (7, 1, 2, 3, "reasoning", 6, 0),
        (10, 2, 1, 2, "mixed", 4, 4),
        (5, 1, 0, 3, "exploration", 0, 4),  # k = 0: plain sampling with the fill budget
        (3, 1, 2, 3, "none", 0, 2),
        (4, 4, 1, 1, "none", 0, 0),
        (1, 1, 0, 1, "all", 0, 0),
        (11, 2, 2, 2, "all", 8, 1),
    ],
)
def test_budget_arithmetic(n, m, k, t, mode, branches, fill):
    cfg = make_config(n=n, m=m, k=k, t=t, mode=mode)
    assert cfg.branch_budget == branches
    assert cfg.fill_budget == fill
    assert cfg.m + cfg.branch_budget + cfg.fill_budget == cfg.n


def test_defaults_are_the_papers():
    cfg = make_config()
    assert (cfg.n, cfg.m, cfg.k, cfg.t) == (8, 1, 2, 3)
    assert (cfg.temperature, cfg.top_p) == (0.6, 0.95)
    assert cfg.fill_budget == 1


def test_make_config_merges_a_config_a_dict_and_overrides():
    base = ParallelMuseConfig(n=4, k=1, t=2)
    cfg = make_config(base, t=3, n=5)
    assert (cfg.n, cfg.k, cfg.t) == (5, 1, 3)
    assert (base.n, base.t) == (4, 2)  # the input is not modified
    assert make_config({"n": 4, "k": 1}, t=2).fill_budget == 1
    # An override that breaks the budget is still caught.
    with pytest.raises(ConfigError, match="n=4"):
        make_config(base, t=5)


def test_early_stop_with_a_calibration_that_did_not_load_reports_only_the_load_error(tmp_path):
    # Before: "early_stop needs calibration= a file with a confidence floor" beside "not found".
    with pytest.raises(ConfigError) as info:
        make_config(calibration=str(tmp_path / "missing.json"), early_stop=True)
    assert "not found: write one with `parallelmuse calibrate`" in str(info.value)
    assert "early_stop needs" not in str(info.value)
    with pytest.raises(ConfigError, match="early_stop needs calibration= a file with a confidence floor"):
        make_config(early_stop=True)


@pytest.mark.parametrize("config", ["n=4", 5, [1, 2]])
def test_make_config_refuses_what_is_neither_a_mapping_nor_a_config(config):
    with pytest.raises(
        ConfigError, match=r"\(\w+\): pass a dict of settings \(e.g. \{'n': 8\}\) or a ParallelMuseConfig"
    ):
        make_config(config)


def test_config_is_frozen():
    cfg = make_config()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        cfg.n = 3
    assert cfg.n == 8


def test_crossover_slots_come_out_of_the_rollout_stage():
    cfg = make_config(n=8, crossover=1)
    assert (cfg.rollout_n, cfg.branch_budget, cfg.fill_budget) == (7, 6, 0)
    assert make_config(n=4, mode="none", crossover=1).fill_budget == 2


# ----------------------------------------------------------------------------- a parent graph's context


class _Settings:
    """A parent app's context object carrying ParallelMuse's settings as an attribute."""

    def __init__(self, parallelmuse: object) -> None:
        self.k, self.temperature, self.parallelmuse = 4, 0.0, parallelmuse


@dataclass
class _AppContext:
    k: int = 4
    parallelmuse: ParallelMuseConfig | None = None  # declared, unset: ParallelMuse's defaults


@pytest.mark.parametrize(
    ("context", "read"),
    [
        ({"k": 4, "parallelmuse": {"n": 4, "k": 1}}, {"n": 4, "k": 1}),
        (_Settings({"k": 1}), {"k": 1}),
        (_Settings(ParallelMuseContext(seed=7)), {"seed": 7}),
        (_AppContext(), {}),
        (_AppContext(parallelmuse=ParallelMuseConfig(k=1)), ParallelMuseConfig(k=1).model_dump()),
        ({"temperature": 0.0, "parallelmuse": {}}, {}),
    ],
)
def test_a_parents_parallelmuse_entry_is_read_alone(context, read):
    """Before, every field of the parent's named like a setting was read: its retriever's k=4 failed
    every run, and its model's temperature=0.0 made every sample greedy."""
    assert context_overrides(context) == read
    base = ParallelMuseConfig(temperature=0.3)
    assert resolve_config(base, context) == make_config(base, **read)  # the app's temperature=0.0 unread


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"k": 1, "top_kk": 3}, r"context\['parallelmuse'\]: invalid context: top_kk"),
        (4, "is of type int: give a dict"),
    ],
)
def test_a_parallelmuse_entry_that_is_not_settings_is_refused(entry, said):
    # A typo in the app's own entry for ParallelMuse is no field of the app's: it would go unused silently.
    with pytest.raises(ConfigError, match=said):
        context_overrides({"parallelmuse": entry})


def test_only_a_parents_field_is_blamed_for_a_bad_setting():
    base = ParallelMuseConfig(n=4, k=1, t=2)
    with pytest.raises(
        ConfigError, match=r"= 9: raise n or lower k/t \(read from the parent graph's context field 'k'; "
    ):
        resolve_config(base, {"user_id": "u1", "k": 4})
    for ours in (ParallelMuseContext(k=4), {"parallelmuse": {"k": 4}}):
        with pytest.raises(ConfigError, match=r"= 9: raise n or lower k/t$"):
            resolve_config(base, ours)


def test_a_parents_own_field_mirrored_into_configurable_is_not_a_misplaced_setting():
    # langgraph-api copies a run's context into configurable: the app's k beside its parallelmuse entry
    # would be reported as a setting ParallelMuse does not read, on every run.
    assert misplaced_settings({"k": 4, "n": 4}, {"k": 4, "parallelmuse": {"n": 2}}) == {}
    assert misplaced_settings({"k": 4, "n": 4}, _AppContext()) == {"n": 4}
    assert misplaced_settings({"k": 4}, None) == {"k": 4}


def _calibration(tmp_path, *, top_logprobs, estimator="nll", floor=None):
    path = tmp_path / f"cal-{estimator}-{top_logprobs}.json"
    thresholds = {"reasoning": 1.5, "exploration": 1.5, "all": 1.5}
    Calibration(estimator, 0.8, thresholds, {}, confidence_floor=floor, top_logprobs=top_logprobs).save(path)
    return str(path)


@pytest.mark.parametrize(
    ("settings", "uses"),
    [
        ({"estimator": "entropy"}, "estimator='entropy'"),
        ({"early_stop": True}, "early_stop"),
        ({"estimator": "entropy", "early_stop": True}, "estimator='entropy' and early_stop"),
    ],
)
def test_a_calibration_scored_with_other_top_logprobs_is_refused_where_they_matter(tmp_path, settings, uses):
    # The entropy of the same tokens is another number from 16 top logprobs than from 2 (PPL 1.81 vs
    # 1.15), and so is DeepConf's confidence: a threshold or floor fitted on 16 is no bound on 2.
    path = _calibration(tmp_path, top_logprobs=16, estimator=settings.get("estimator", "nll"), floor=4.0)
    with pytest.raises(ConfigError) as info:
        make_config(settings, calibration=path, top_logprobs=2)
    assert (
        f"calibration was fitted with top_logprobs=16 but top_logprobs=2, which {uses} read: set "
        "top_logprobs=16 or recalibrate with top_logprobs=2"
    ) in str(info.value)
    assert make_config(settings, calibration=path, top_logprobs=16).top_logprobs == 16


def test_a_calibration_whose_top_logprobs_do_not_matter_or_are_unknown_is_accepted(tmp_path):
    # nll reads the sampled token's logprob alone; a file written before it recorded the count cannot be checked.
    assert make_config(calibration=_calibration(tmp_path, top_logprobs=16), top_logprobs=2).top_logprobs == 2
    unknown = _calibration(tmp_path, top_logprobs=None, estimator="entropy", floor=4.0)
    assert make_config(estimator="entropy", early_stop=True, calibration=unknown, top_logprobs=2).early_stop


def test_early_stop_on_plain_sampling_leads_to_a_valid_config_by_following_the_messages(tmp_path):
    """Before, each fix triggered the other error: early_stop asked for a calibration, and the
    calibration was refused as needing a branching mode (with rounds=1 too)."""
    floor = _calibration(tmp_path, top_logprobs=16, floor=4.0)
    with pytest.raises(ConfigError, match="early_stop needs calibration= a file with a confidence floor"):
        make_config(mode="none", early_stop=True)
    cfg = make_config(mode="none", early_stop=True, calibration=floor)
    assert (cfg.early_stop, cfg.branch_budget, cfg.fill_budget) == (True, 0, cfg.n - 1)
    # A small N: no room is kept for calibrated branches mode='none' never makes.
    assert make_config(mode="none", early_stop=True, calibration=floor, n=2, t=3).n == 2
    # The floor is DeepConf's, read from the top logprobs: still checked without branching.
    with pytest.raises(ConfigError, match="which early_stop read: set top_logprobs=16"):
        make_config(mode="none", early_stop=True, calibration=floor, top_logprobs=2)
    # The estimator and thresholds are branching's: not read, not checked.
    assert make_config(mode="none", early_stop=True, calibration=floor, estimator="entropy").early_stop


def test_settings_mode_none_would_ignore_name_a_way_out_that_validates(tmp_path):
    floor = _calibration(tmp_path, top_logprobs=16, floor=4.0)
    with pytest.raises(ConfigError) as info:
        make_config(mode="none", calibration=floor)
    message = str(info.value)
    assert "only early_stop reads the calibration" in message and "rounds" not in message
    assert "set early_stop=True, a branching mode (e.g. mode='exploration'), or no calibration" in message
    assert make_config(mode="none", calibration=floor, early_stop=True).early_stop
    assert make_config(mode="exploration", calibration=floor).calibration == floor
    with pytest.raises(ConfigError) as info:
        make_config(mode="none", rounds=2)
    assert "need a branching mode" in str(info.value) and "calibration" not in str(info.value)
    assert make_config(mode="exploration", rounds=2).rounds == 2


@pytest.mark.parametrize(("name", "value"), [("n", True), ("max_turns", False), ("seed", True)])
def test_a_numpy_bool_for_a_number_is_refused_as_a_bool_is(name, value):
    """numpy's bool is no bool subclass: pydantic read n=np.True_ (``n=(counts > 0).any()``) as n=1."""
    np = pytest.importorskip("numpy")
    settings = {name: np.bool_(value)}
    with pytest.raises(ConfigError, match="give a number, not true/false"):
        make_config(settings)
    with pytest.raises(ConfigError, match="give a number, not true/false"):
        ParallelMuseContext(**settings)
    assert make_config(diverse_branches=np.True_).diverse_branches is True  # a bool setting takes it


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"N": 4}, "N: Extra inputs are not permitted: no such setting (did you mean 'n'?)"),
        ({"max-turns": 4}, "(did you mean 'max_turns'?)"),
        ({"temprature": 0.2}, "(did you mean 'temperature'?)"),
        ({"user_id": "u1"}, "user_id: Extra inputs are not permitted: no such setting (settings: n, m, k, t,"),
    ],
)
def test_an_unknown_setting_is_named_with_the_one_meant(settings, said):
    """pydantic's "Extra inputs are not permitted" said neither which setting was meant nor which exist."""
    with pytest.raises(ConfigError) as info:
        make_config(settings)
    assert said in str(info.value)
