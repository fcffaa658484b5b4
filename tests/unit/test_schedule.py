"""The partial-rollout schedule: one plan for the graph and for ``partial_rollout``; multi-round
branching within N; calibrated thresholds; sibling diversity."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from collections import Counter

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.schedule import partial_rollout, pick_branches, round_budget, run_schedule
from tests.unit.fakes import (
    OLD_CALIBRATION,
    Reply,
    ScriptedChatModel,
    answer_text,
    call_text,
    make_tools,
    research_responder,
)
from tests.unit.test_graph import QUESTION, STEPS, by_step


class _NoScanSaver(InMemorySaver):
    """A saver that refuses a search over every thread (a database reads its whole table for one)."""

    async def alist(self, config, **kwargs):
        assert config is not None, "a search of every thread's checkpoints"
        async for item in super().alist(config, **kwargs):
            yield item


def _runner(agent=None):
    model = ScriptedChatModel(responder=research_responder(agent or by_step()))
    tools, calls = make_tools()
    return RolloutRunner(model, tools, checkpointer=_NoScanSaver()), model, calls


def _shape(trajectories):
    return sorted(
        (t["id"], t["origin"]["kind"], t["origin"].get("step"), t["origin"].get("round")) for t in trajectories
    )


@pytest.mark.parametrize(
    "config",
    [
        {"n": 8, "m": 1, "k": 2, "t": 3},
        {"n": 8, "m": 1, "k": 2, "t": 3, "rounds": 2},
        {"n": 9, "m": 1, "k": 1, "t": 2, "rounds": 3},
        {"n": 6, "m": 2, "k": 1, "t": 2, "mode": "reasoning"},
        {"n": 4, "mode": "none"},
    ],
)
async def test_graph_and_partial_rollout_run_the_same_schedule(config):
    cfg = make_config(config)
    graph = create_parallelmuse(ScriptedChatModel(responder=research_responder(by_step())), make_tools()[0], config=cfg)
    out = await graph.ainvoke({"question": QUESTION})
    runner, _, _ = _runner()
    trajectories, _ = await partial_rollout(runner, QUESTION, config=cfg, run_id="direct")
    assert _shape(out["trajectories"]) == _shape(trajectories)
    assert len(trajectories) == cfg.n


@pytest.mark.parametrize(
    ("n", "k", "t", "rounds", "forkable"),
    [
        (8, 2, 3, 2, True),
        (14, 2, 2, 2, True),
        (14, 2, 2, 3, True),
        (9, 2, 2, 4, True),
        # k=1 forks step 1 only; its branches' later steps have no tool call: the leftover is filled.
        (12, 1, 2, 2, False),
    ],
)
async def test_multi_round_branching_stays_within_n_and_spends_the_leftover_on_branches(n, k, t, rounds, forkable):
    runner, _, _ = _runner()
    cfg = make_config(n=n, k=k, t=t, rounds=rounds)
    trajectories, picks = await partial_rollout(runner, QUESTION, config=cfg, run_id="mr")
    assert len(trajectories) == n
    assert len({t["thread_id"] for t in trajectories}) == n
    later = [tr for tr in trajectories if tr["origin"].get("round", 0) >= 2 and tr["origin"]["kind"] == "branch"]
    assert bool(later) == forkable  # when later rounds find nothing to fork, fills make up N
    by_id = {tr["id"]: tr for tr in trajectories}
    for branch in later:
        parent = by_id[branch["origin"]["parent"]]
        # A later-round branch forks its parent *after* the parent's own fork point...
        assert parent["origin"]["kind"] == "branch"
        assert branch["origin"]["round"] == parent["origin"]["round"] + 1
        assert branch["origin"]["step"] > parent["origin"]["step"]
        # ...and starts from exactly the parent's conversation up to that step.
        step = branch["origin"]["step"]
        assert branch["steps"][:step] == parent["steps"][:step]
        before = [o for o in branch["observations"] if o["step"] < step]
        assert before == [o for o in parent["observations"] if o["step"] < step]
    assert {p["round"] for p in picks} == set(range(1, max(p["round"] for p in picks) + 1))


@pytest.mark.parametrize(("n", "t"), [(3, 1), (4, 2)])
async def test_a_middle_round_with_fewer_slots_left_than_rounds_still_branches(n, t):
    """Before: round 2's share of the one slot left was 1 // 2 = 0, read as nothing picked, and a
    from-scratch fill took the slot the branches of the branches were kept for."""
    # Ten steps, the earlier more uncertain: every branch has later steps of its own to fork.
    steps = [Reply(call_text("search", f"thought {i}", query=f"q{i}"), logprob=-(10 - i) * 0.3) for i in range(9)]
    steps.append(Reply(answer_text("Paris"), logprob=-0.01))
    runner, _, _ = _runner(by_step(steps))
    cfg = make_config(n=n, m=1, k=1, t=t, mode="all", rounds=3, max_turns=10)
    assert [round_budget(cfg, 1, 1), round_budget(cfg, 1 + t, 2), round_budget(cfg, n, 3)] == [t, 1, 0]
    trajectories, picks = await partial_rollout(runner, QUESTION, config=cfg, run_id="mid")
    kinds = Counter((tr["origin"]["kind"], tr["origin"].get("round")) for tr in trajectories)
    assert kinds == Counter({("initial", 0): 1, ("branch", 1): t, ("branch", 2): 1})
    assert [p["round"] for p in picks] == [1, 2]


@pytest.mark.parametrize(("n", "t", "rounds"), [(3, 1, 3), (4, 2, 3), (9, 2, 4), (14, 2, 3), (20, 1, 5)])
def test_later_rounds_share_what_is_left_never_none_of_it_nor_beyond_it(n, t, rounds):
    cfg = make_config(n=n, m=1, k=1, t=t, rounds=rounds)
    done = 1 + round_budget(cfg, 1, 1)
    for round in range(2, rounds + 1):
        budget, left = round_budget(cfg, done, round), n - done
        # A round with slots left is never given none (read as nothing picked), nor more than is left.
        assert 0 < budget <= left if left else budget == 0
        done += budget
    assert done == n  # the last round takes the rest


async def test_rounds_2_with_default_budget_forks_the_round_1_branch_at_its_uncertain_step():
    # STEPS: step 1 (visit) is the most uncertain exploration, then step 0 (search). Round 1 forks
    # both; in round 2 only the step-0 branches have a later tool step to fork (their step 1).
    graph = create_parallelmuse(
        ScriptedChatModel(responder=research_responder(by_step())),
        make_tools()[0],
        config={"n": 8, "k": 2, "t": 3, "rounds": 2},
    )
    out = await graph.ainvoke({"question": QUESTION})
    kinds = Counter((t["origin"]["kind"], t["origin"].get("round")) for t in out["trajectories"])
    assert kinds == Counter({("initial", 0): 1, ("branch", 1): 6, ("branch", 2): 1})
    (late,) = [t for t in out["trajectories"] if t["origin"].get("round") == 2]
    assert late["id"] == "t0.s0.b0.s1.b0" and late["origin"]["parent"] == "t0.s0.b0"
    budget = out["stats"]["budget"]
    assert budget["branches_by_round"] == {"1": 6, "2": 1} and budget["fill"] == 0


async def test_partial_rollout_reuses_given_samples_for_its_from_scratch_jobs():
    runner, model, _ = _runner()
    cfg = make_config(n=8, k=2, t=3)
    samples, _ = await partial_rollout(runner, QUESTION, config=make_config(cfg, mode="none"), run_id="s")
    calls = len(model.calls)
    trajectories, picks = await partial_rollout(runner, QUESTION, config=cfg, run_id="p", reuse=samples)
    assert [t["id"] for t in trajectories[:2]] == ["t0", "f0"]
    assert trajectories[0] is samples[0] and trajectories[1] is samples[1]
    assert len(trajectories) == 8 and len(picks) == 2
    # Only the six branches called the model: 2 regenerated steps each from step 1, 3 from step 0.
    assert len(model.calls) - calls == 3 * 2 + 3 * 3


@pytest.mark.parametrize("limit", [1, 2])
async def test_run_schedule_keeps_at_most_max_concurrency_trajectories_in_flight(limit):
    # Before, max_concurrency was accepted and ignored: the branch wave put 6 model calls in flight at once.
    slow = [dataclasses.replace(step, delay=0.01) for step in STEPS]  # the calls overlap while they wait
    runner, model, _ = _runner(by_step(slow))
    cfg = make_config(n=8, k=2, t=3, max_concurrency=limit)
    trajectories, picks = await run_schedule(runner, QUESTION, config=cfg, run_id="mc")
    assert len(trajectories) == 8 and len(picks) == 2  # the whole schedule ran, only narrower
    assert model.peak_in_flight == limit


async def test_run_schedule_within_max_concurrency_still_reuses_the_given_samples():
    runner, model, _ = _runner()
    cfg = make_config(n=8, k=2, t=3, max_concurrency=1)
    samples, _ = await run_schedule(runner, QUESTION, config=make_config(cfg, mode="none"), run_id="s")
    trajectories, _ = await run_schedule(runner, QUESTION, config=cfg, run_id="p", reuse=samples)
    assert trajectories[:2] == samples[:2] and len(trajectories) == 8


# ------------------------------------------------------------------ calibrated threshold


def _calibration_file(tmp_path, thresholds, estimator="nll"):
    path = tmp_path / "cal.json"
    Calibration(estimator=estimator, quantile=0.8, thresholds=thresholds, samples={}).save(path)
    return str(path)


async def test_calibrated_mode_branches_at_every_step_over_the_threshold_capped_by_the_budget(tmp_path):
    # Exploration PPL: step 0 = e^0.2 ≈ 1.22, step 1 = e^2.5 ≈ 12.2 (STEPS).
    runner, _, _ = _runner()
    one = make_config(n=8, t=3, calibration=_calibration_file(tmp_path, {"exploration": 2.0}))
    trajectories, picks = await partial_rollout(runner, QUESTION, config=one, run_id="c1")
    assert [(p["step"], p["region"]) for p in picks] == [(1, "exploration")]
    assert Counter(t["origin"]["kind"] for t in trajectories) == Counter({"initial": 1, "branch": 3, "fill": 4})

    low = make_config(n=6, t=3, calibration=_calibration_file(tmp_path, {"exploration": 1.0}))
    trajectories, picks = await partial_rollout(runner, QUESTION, config=low, run_id="c2")
    # Both steps qualify, most uncertain first, but n=6 holds only one group of T=3 branches.
    assert [p["step"] for p in picks] == [1]
    assert len(trajectories) == 6


def test_calibration_fit_save_load_roundtrip(tmp_path):
    runs = [[{"reasoning": float(i), "exploration": None, "all": float(i)} for i in range(1, 11)]]
    with pytest.warns(UserWarning, match="few samples"):  # 10 steps of one trajectory
        cal = Calibration.fit(runs, quantile=0.9, estimator="entropy")
    assert cal.thresholds["reasoning"] == pytest.approx(9.1) and "exploration" not in cal.thresholds
    assert cal.samples == {"reasoning": 10, "exploration": 0, "all": 10}
    assert Calibration.load(cal.save(tmp_path / "c.json")) == cal


@pytest.mark.parametrize("stop_quantile", [-0.5, 0.0, 1.0, 1.5])
def test_calibration_refuses_a_stop_quantile_outside_zero_one(stop_quantile):
    """Before the fix -0.5 gave a floor near the top (early stop would stop nearly everything) and
    1.5 an IndexError."""
    runs = [[{"reasoning": 1.0, "exploration": 2.0, "all": 1.5}]]
    with pytest.raises(ConfigError, match=rf"stop_quantile={stop_quantile}: use a value strictly between 0 and 1"):
        Calibration.fit(runs, confidences=[1.0, 2.0, 3.0, 4.0], stop_quantile=stop_quantile)


def test_calibration_records_where_it_came_from(tmp_path):
    runs = [[{"reasoning": 1.0 + i % 5, "exploration": 2.0, "all": 1.5}] * 3 for i in range(20)]
    ids = [f"q{i // 2}" for i in range(20)]  # two trajectories per question
    cal = Calibration.fit(runs, model="vllm Qwen3-32B", top_logprobs=16, questions=ids)
    assert (cal.model, cal.top_logprobs, cal.trajectories) == ("vllm Qwen3-32B", 16, 20)
    assert cal.questions == tuple(f"q{i}" for i in range(10))  # once each, in order
    path = cal.save(tmp_path / "c.json")
    stored = json.loads(path.read_text())
    assert stored["questions"][:2] == ["q0", "q1"] and stored["samples"]["exploration"] == 60
    assert Calibration.load(path) == cal


def test_a_calibration_file_written_before_it_recorded_its_origin_loads_and_gives_back_its_dict(tmp_path):
    old = OLD_CALIBRATION
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    cal = Calibration.load(path)
    assert (cal.model, cal.top_logprobs, cal.questions, cal.trajectories) == (None, None, None, None)
    # A benchmark's rows store this dict: a resumed run must find the same one.
    assert cal.to_dict() == old


def test_a_calibration_from_few_steps_or_trajectories_warns_when_fitted():
    """Before: 15 trajectories' 36 exploration steps gave a threshold without a word of how noisy it is."""
    plain, exploring = {"reasoning": 1.2, "all": 1.5}, {"reasoning": 1.2, "exploration": 2.0, "all": 1.5}
    thin = [[plain] * 4 + [exploring] * (2 if i < 18 else 1) for i in range(25)]
    with pytest.warns(UserWarning, match=r"few samples \(exploration: 43 steps\)"):
        Calibration.fit(thin)
    with pytest.warns(UserWarning, match=r"few samples \(15 trajectories\)"):
        Calibration.fit([[{"all": 1.5}] * 4] * 15)
    with pytest.warns(UserWarning, match=r"few samples \(confidence floor: 5 trajectories\)"):
        Calibration.fit([[{"all": 1.5}] * 4] * 25, confidences=[1.0] * 5 + [None] * 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Calibration.fit([[{"all": 1.5}] * 4] * 25, confidences=[1.0] * 25)


@pytest.mark.parametrize("how", ["replaced", "rewritten"])
def test_a_calibration_file_changed_under_its_old_mtime_is_read_again(tmp_path, how):
    """Before: the cache was keyed by mtime alone, and a file replaced by one with its old mtime
    (cp -p, rsync -t, a rewrite within the clock's tick) kept giving the old thresholds."""
    path = tmp_path / "cal.json"
    Calibration("nll", 0.8, {"all": 2.0}, {"all": 60}).save(path)
    before = os.stat(path)
    assert Calibration.load(path).thresholds == {"all": 2.0}
    if how == "replaced":  # a new file moved over the old one: another inode
        Calibration("nll", 0.8, {"all": 9.0}, {"all": 60}).save(tmp_path / "new.json")
        os.replace(tmp_path / "new.json", path)
    else:  # the same file, the same size: only its ctime tells
        time.sleep(0.05)
        Calibration("nll", 0.8, {"all": 9.0}, {"all": 60}).save(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert Calibration.load(path).thresholds == {"all": 9.0}


@pytest.mark.parametrize(
    ("content", "config", "needle"),
    [
        (None, {}, "not found"),
        ("{not json", {}, "malformed"),
        (json.dumps({"estimator": "nll", "quantile": 0.8, "thresholds": {}}), {}, "no thresholds"),
        (
            json.dumps({"estimator": "entropy", "quantile": 0.8, "thresholds": {"exploration": 2}}),
            {},
            "same estimator",
        ),
        (json.dumps({"estimator": "nll", "quantile": 0.8, "thresholds": {"reasoning": 2}}), {}, "no threshold"),
        (json.dumps({"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": 2}}), {"n": 3}, r"m \+ t"),
        (
            json.dumps({"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": 2}, "questions": "q1"}),
            {},
            "questions must be a list of ids",
        ),
    ],
)
def test_a_bad_calibration_raises_config_error_naming_the_fix(tmp_path, content, config, needle):
    path = tmp_path / "cal.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        make_config(calibration=str(path), **config)


def test_rounds_and_calibration_need_a_branching_mode():
    with pytest.raises(ConfigError, match="rounds=0"):
        make_config(rounds=0)
    with pytest.raises(ConfigError, match="need a branching mode"):
        make_config(rounds=2, mode="none")


# ------------------------------------------------------------------ sibling diversity


def _queries(per_call):
    """Step 0 searches; step 1's query comes from ``per_call`` in call order; step 2 answers."""
    step1_calls = iter(per_call)

    def agent(index, messages):
        if index == 0:
            return STEPS[0]
        if index == 1:
            query = next(step1_calls)
            return Reply(call_text("search", "Look closer", query=query), regions={"tool_call": -2.5})
        return STEPS[2]

    return agent


@pytest.mark.parametrize(
    ("diverse", "step1_replies", "branch_queries", "resampled"),
    [
        # Parent "paris"; branch 0 repeats it, resamples "lyon"; branch 1 repeats its sibling, resamples "nice".
        (True, ["paris", "Paris ", "lyon", "LYON", "nice"], ["lyon", "nice"], [True, True]),
        # Off: the repeats stand.
        (False, ["paris", "paris", "lyon"], ["paris", "lyon"], [False, False]),
        # Bounded: the driver resamples once, then keeps what it got.
        (True, ["paris", "paris", "paris", "paris", "paris"], ["paris", "paris"], [True, True]),
    ],
)
async def test_diverse_branches_resample_a_repeat_of_the_parent_or_a_sibling(
    diverse, step1_replies, branch_queries, resampled
):
    runner, model, calls = _runner(_queries(step1_replies))
    cfg = make_config(diverse_branches=diverse)
    parent = await runner.run(QUESTION, trajectory_id="t0", thread_id="t0", config=cfg)
    branches = [await runner.fork(parent, 1, run_id="r", sibling=j, config=cfg) for j in range(2)]
    got = [b["steps"][1]["action"]["arguments"]["query"].strip().lower() for b in branches]
    assert got == branch_queries
    assert [b["steps"][1]["calls"] == 2 for b in branches] == resampled
    # A rejected attempt's tokens are a real cost: they are counted beside the kept ones.
    for b, again in zip(branches, resampled, strict=True):
        kept = len(b["steps"][1]["tokens"])
        assert (b["steps"][1]["generated_tokens"] > kept) == again
    # Only accepted calls reach the tool: the parent's two searches, then one per branch.
    assert calls["search"][2:] == [q for q in got]


def test_a_tie_between_branches_goes_to_the_earlier_in_lineage_order_not_in_string_order():
    # One slot left and two round-1 branches whose regenerated steps tie: "t2" comes before "t10".
    def branch(parent):
        origin = {"kind": "branch", "parent": parent, "step": 0, "round": 1}
        return {"id": f"{parent}.s0.b0", "origin": origin, "uncertainty": [{}, {"exploration": 5.0}]}

    trajectories = [{"id": "t2", "origin": {"kind": "initial"}}, branch("t10"), branch("t2")]
    cfg = make_config(n=4, m=1, k=1, t=1, rounds=2, mode="exploration")
    assert [p["parent"] for p in pick_branches(trajectories, cfg, round=2)] == ["t2.s0.b0"]
