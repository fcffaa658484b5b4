"""Online partial rollout with scripted logprobs: branches start while the parent runs, low-confidence
trajectories stop early, consensus cancels what is left, and a crashed online run resumes."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import math
import re
import threading

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.config import get_config

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.errors import ConfigError, MissingLogprobsError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.schedule import budget_stats, online_rollout, run_schedule
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    agent_step,
    answer_text,
    call_text,
    make_tools,
    research_responder,
)

QUESTION = "What is the capital of France?"
# The fake's alternative token sits 1 nat below the sampled one, so DeepConf's token confidence is
# 0.5 - logprob: a sampled logprob near 0 reads as unsure, a very negative one as sure.
SURE, UNSURE = -3.0, -0.02


def _calibration(tmp_path, *, exploration=3.0, floor=None):
    path = tmp_path / "cal.json"
    data = {"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": exploration, "reasoning": 50.0}}
    if floor is not None:
        data.update(confidence_floor=floor, confidence_window=4)
    path.write_text(json.dumps(data))
    return str(path)


class Runners:
    """Gives each trajectory a number at its first step (written into its thought), so later steps of
    the same trajectory can be recognised in their prompts."""

    def __init__(self, plan):
        self.plan, self.counter, self.lock = plan, itertools.count(), threading.Lock()

    def __call__(self, index, messages):
        if index == 0:
            with self.lock:
                me = next(self.counter)
            return self.plan(me, 0, f"runner {me} starts")
        me = int(re.search(r"runner (\d+) starts", " ".join(str(m.content) for m in messages)).group(1))
        return self.plan(me, index, f"runner {me} goes on")


def _by_trajectory(plan, calls=None):
    """A responder that hands ``plan`` the trajectory id (its thread id's last part) and the step,
    and records the trajectory of each call in ``calls``."""

    def respond(messages):
        trajectory = get_config()["configurable"]["thread_id"].split("/")[-1]
        if calls is not None:
            calls.append(trajectory)
        return plan(trajectory, agent_step(messages))

    return respond


async def _online(model, config, run_id: str):
    """``online_rollout`` of QUESTION with ``model``: its trajectories, picks and events ("event:id")."""
    events: list[str] = []
    trajs, picks = await online_rollout(
        RolloutRunner(model, make_tools()[0]),
        QUESTION,
        config=config,
        run_id=run_id,
        on_event=lambda e, **d: events.append(f"{e}:{d.get('id') or (d.get('trajectory') or {}).get('id', '')}"),
    )
    return trajs, picks, events


# ----------------------------------------------------------------------------- online branching


async def test_a_branch_starts_before_its_parent_ends(tmp_path):
    def plan(me, step, thought):
        if step == 0:  # an uncertain search: crosses the calibrated threshold (e^2.5 > 3)
            return Reply(call_text("search", thought, query=f"q{me}"), regions={"tool_call": -2.5}, logprob=SURE)
        if step == 1:
            return Reply(call_text("visit", thought, doc="Paris"), logprob=SURE, delay=0.3)
        return Reply(answer_text("Paris", thought), logprob=SURE, delay=0.3)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(n=3, k=1, t=2, branching="online", calibration=_calibration(tmp_path), seed=1)
    events: list[tuple[str, str]] = []
    trajs, picks = await online_rollout(
        RolloutRunner(model, make_tools()[0]),
        QUESTION,
        config=config,
        run_id="on",
        on_event=lambda e, **d: events.append((e, d.get("id") or (d.get("trajectory") or {}).get("id", ""))),
    )
    assert [(p["parent"], p["step"], p["region"]) for p in picks] == [("t0", 0, "exploration")]
    assert sorted(t["id"] for t in trajs) == ["t0", "t0.s0.b0", "t0.s0.b1"]
    # The fork happened while the parent ran: both branches started before t0 finished.
    order = [f"{e}:{i}" for e, i in events]
    assert order.index("trajectory_started:t0.s0.b1") < order.index("trajectory_finished:t0")
    assert order.index("branch_picked:") < order.index("trajectory_finished:t0")
    # The branches' first calls came before the parent's last one.
    steps = [agent_step(c["messages"]) for c in model.calls if "research assistant" in c["messages"][0].content]
    assert steps.index(2) > [i for i, s in enumerate(steps) if s == 0][2]


async def test_k_bounds_the_fork_points_and_the_leftover_budget_goes_to_fills(tmp_path):
    def plan(me, step, thought):
        uncertain = {"tool_call": -2.5}  # every step crosses the threshold
        if step < 2:
            return Reply(call_text("search", thought, query=f"q{me}-{step}"), regions=uncertain)
        return Reply(answer_text("Paris", thought))

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(n=6, k=2, t=2, branching="online", calibration=_calibration(tmp_path), seed=1)
    trajs, picks = await online_rollout(RolloutRunner(model, make_tools()[0]), QUESTION, config=config, run_id="k")
    assert [(p["parent"], p["step"]) for p in picks] == [("t0", 0), ("t0", 1)]  # its first k crossing steps
    kinds = sorted(t["origin"]["kind"] for t in trajs)
    assert kinds == ["branch"] * 4 + ["fill", "initial"] and len(trajs) == 6


async def test_the_forks_a_parent_did_not_take_start_as_fills_as_soon_as_it_ends(tmp_path):
    def plan(me, step, thought):
        slow = 0.0 if me == 0 else 0.3  # t0 (the first to start) ends long before the others
        if step == 0:
            regions = {"tool_call": -2.5} if me == 0 else {}  # only t0's first step crosses the threshold
            return Reply(call_text("search", thought, query=f"q{me}"), regions=regions, logprob=SURE, delay=slow)
        return Reply(answer_text("Paris", thought), logprob=SURE, delay=slow)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(n=6, k=2, t=2, branching="online", calibration=_calibration(tmp_path), seed=1)
    trajs, picks, events = await _online(model, config, "up")
    assert [(p["parent"], p["step"]) for p in picks] == [("t0", 0)]  # one of its k=2 fork points taken
    assert sorted(t["id"] for t in trajs) == ["f0", "f1", "f2", "t0", "t0.s0.b0", "t0.s0.b1"]
    # The two untaken branch slots started as fills while the branches still ran, not after them.
    first_branch_end = min(events.index(f"trajectory_finished:t0.s0.b{i}") for i in range(2))
    assert events.index("trajectory_started:f2") < first_branch_end


async def test_fork_points_the_threshold_did_not_take_go_to_the_parents_top_steps_when_it_ends(tmp_path):
    def plan(me, step, thought):
        if step < 2:  # only the first search crosses the threshold; the second is uncertain, below it
            regions = {"tool_call": -2.5 if step == 0 else -0.9}
            return Reply(call_text("search", thought, query=f"q{me}-{step}"), regions=regions, logprob=SURE)
        return Reply(answer_text("Paris", thought), logprob=SURE)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(n=6, k=2, t=2, branching="online", calibration=_calibration(tmp_path), seed=1)
    trajs, picks = await online_rollout(RolloutRunner(model, make_tools()[0]), QUESTION, config=config, run_id="tk")
    # Step 0 forked at once (it crossed); step 1 is t0's most uncertain remaining step, forked at its end.
    assert [(p["parent"], p["step"]) for p in picks] == [("t0", 0), ("t0", 1)]
    assert sorted(t["id"] for t in trajs) == ["f0", "t0", "t0.s0.b0", "t0.s0.b1", "t0.s1.b0", "t0.s1.b1"]
    by_id = {t["id"]: t for t in trajs}
    assert by_id["t0.s1.b0"]["steps"][0]["text"] == by_id["t0"]["steps"][0]["text"]  # the shared prefix


async def test_in_mixed_mode_the_forks_taken_online_keep_their_regions_share_of_k(tmp_path):
    """k=2 in mixed mode is one exploration and one reasoning fork point. Before, the fork point
    left at the parent's end was split again as if it were all of k, and went to exploration."""

    def plan(me, step, thought):
        if step < 2:  # step 0 crosses on its query; step 1 is unsure in its thinking, below any threshold
            regions = {"tool_call": -2.5, "think": -0.1} if step == 0 else {"tool_call": -0.2, "think": -1.5}
            return Reply(call_text("search", thought, query=f"q{me}-{step}"), regions=regions, logprob=SURE)
        return Reply(answer_text("Paris", thought), regions={"think": -0.1}, logprob=SURE)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(n=4, k=2, t=1, mode="mixed", branching="online", calibration=_calibration(tmp_path), seed=1)
    _, picks = await online_rollout(RolloutRunner(model, make_tools()[0]), QUESTION, config=config, run_id="mx")
    assert [(p["parent"], p["step"], p["region"]) for p in picks] == [("t0", 0, "exploration"), ("t0", 1, "reasoning")]


async def test_without_a_calibration_the_threshold_is_this_runs_own_estimate():
    config = make_config(n=4, k=1, t=2, branching="online")
    assert config.calibration is None  # valid: the 80th percentile of the run's finished steps stands in


def test_online_settings_are_checked():
    with pytest.raises(ConfigError, match="branching='online' forks the initial trajectories once"):
        make_config(branching="online", rounds=2)
    with pytest.raises(ConfigError, match=r"consensus=0.3: a share in \(0.5, 1\]"):
        make_config(branching="online", consensus=0.3)
    with pytest.raises(ConfigError, match="early_stop needs calibration="):
        make_config(early_stop=True)


@pytest.mark.parametrize("limit", [1, 2])
async def test_run_schedule_online_keeps_at_most_max_concurrency_trajectories_in_flight(tmp_path, limit):
    # Before, max_concurrency was accepted and ignored: every fork started at once beside its parent.
    def plan(me, step, thought):
        if step < 2:  # every search crosses the threshold: t0 forks twice while it runs
            reply = call_text("search", thought, query=f"q{me}-{step}")
            return Reply(reply, regions={"tool_call": -2.5}, logprob=SURE, delay=0.01)
        return Reply(answer_text("Paris", thought), logprob=SURE, delay=0.01)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(
        n=8, k=2, t=3, branching="online", calibration=_calibration(tmp_path), seed=1, max_concurrency=limit
    )
    trajs, picks = await run_schedule(RolloutRunner(model, make_tools()[0]), QUESTION, config=config, run_id="mc")
    assert len(trajs) == 8 and [(p["parent"], p["step"]) for p in picks] == [("t0", 0), ("t0", 1)]
    assert model.peak_in_flight == limit


# ----------------------------------------------------------------------------- early stop


async def test_a_low_confidence_trajectory_stops_early_and_is_left_out_of_the_vote(tmp_path):
    def plan(me, step, thought):
        confidence = UNSURE if me == 1 else SURE
        if step == 0:
            return Reply(call_text("search", thought, query=f"q{me}"), logprob=confidence)
        return Reply(answer_text("Lyon" if me == 1 else "Paris", thought), logprob=confidence)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    calibration = _calibration(tmp_path, exploration=1e9, floor=1.0)  # no forks; stop below confidence 1
    graph = create_parallelmuse(
        model,
        make_tools()[0],
        config={"n": 3, "k": 0, "t": 1, "branching": "online", "calibration": calibration, "early_stop": True},
    )
    out = await graph.ainvoke({"question": QUESTION})
    by_status = {t["status"]: t for t in out["trajectories"]}
    stopped = by_status["stopped"]
    assert len(stopped["steps"]) == 1 and stopped["answer"] is None
    assert "lowest group confidence 0.5" in stopped["error"] and "< floor 1.000" in stopped["error"]
    assert sorted(t["status"] for t in out["trajectories"]) == ["answered", "answered", "stopped"]
    assert stopped["id"] not in {r["trajectory_id"] for r in out["reports"]}  # not aggregated
    assert out["answer"] == "Paris"


def test_early_stop_waits_for_a_full_window_of_the_trajectorys_own_tokens(tmp_path):
    """The floor is fitted on finished trajectories' full windows. Before, a prefix shorter than one
    window was judged by its mean: 10 unsure first tokens stopped a trajectory whose finished
    statistic (3.75) is far above the floor."""
    from langgraph_parallelmuse.agent import _low_confidence

    path = tmp_path / "cal.json"
    cal = {"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": 1e9}}
    path.write_text(json.dumps({**cal, "confidence_floor": 2.0, "confidence_window": 32}))
    config = make_config(n=2, k=0, t=1, branching="online", calibration=str(path), early_stop=True)

    def step(*confidences):
        return {"tokens": [{"token": "x", "logprob": -c, "top_logprobs": [["x", -c]]} for c in confidences]}

    assert _low_confidence([step(*[1.0] * 10)], config) is None  # 10 tokens: no window yet
    assert _low_confidence([step(*[1.0] * 10), step(*[5.0] * 100)], config) is None  # every window >= 3.75
    assert "lowest group confidence 1.000 < floor 2.000" in _low_confidence([step(*[1.0] * 40)], config)


# ----------------------------------------------------------------------------- consensus stop


async def test_consensus_cancels_running_work_without_losing_its_finished_steps(tmp_path):
    def plan(me, step, thought):
        if step == 0:
            return Reply(call_text("search", thought, query=f"q{me}"), logprob=SURE)
        if me < 3:  # the first three agree
            return Reply(answer_text("Paris", thought), logprob=SURE, delay=0.1)
        return Reply(call_text("visit", thought, doc="Paris"), logprob=SURE, delay=5.0)  # still running

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    runner = RolloutRunner(model, make_tools()[0])
    config = make_config(
        n=6, k=0, t=1, branching="online", calibration=_calibration(tmp_path, exploration=1e9), consensus=0.75
    )
    events, ids = [], collections.defaultdict(list)

    def on_event(event, **data):
        events.append(event)
        ids[event].append(data["trajectory"]["id"] if "trajectory" in data else data.get("id"))

    trajs, _ = await online_rollout(runner, QUESTION, config=config, run_id="c", on_event=on_event)
    assert "consensus_reached" in events
    # A progress display saw each start end: the cancelled ones too (before, they ran on there forever).
    assert sorted(ids["trajectory_started"]) == sorted(ids["trajectory_finished"]) == sorted(t["id"] for t in trajs)
    answered = [t for t in trajs if t["status"] == "answered"]
    cancelled = [t for t in trajs if t["status"] == "cancelled"]
    assert len(answered) == 3 and len(cancelled) == 3
    assert all(t["answer"] is None and len(t["steps"]) == 1 for t in cancelled)
    for t in cancelled:  # the finished step is in the trajectory's checkpoints
        snap = await runner.graph.aget_state(runner._thread(t["thread_id"]))
        assert snap.values["steps"][0] == t["steps"][0]


async def test_a_branch_cancelled_before_its_own_first_step_is_not_a_trajectory(tmp_path):
    """Its thread holds only the parent's prefix; before the fix it came back as a "cancelled"
    trajectory with no step of its own, counted as a branch."""
    step1_calls = collections.Counter()

    def plan(me, step, thought):
        if step == 1:
            step1_calls[me] += 1
            if step1_calls[me] > 1:  # a branch's first own step: still running at the consensus
                return Reply(call_text("search", thought, query="c"), delay=5.0)
            return Reply(call_text("search", thought, query="b"), regions={"tool_call": -2.5})  # forked at once
        text = answer_text("Paris", thought) if step == 2 else call_text("search", thought, query="a")
        return Reply(text, delay=0.3 if step == 2 else 0.0)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(n=6, k=1, t=2, branching="online", calibration=_calibration(tmp_path), consensus=0.75)
    events = []
    trajs, picks = await online_rollout(
        RolloutRunner(model, make_tools()[0]),
        QUESTION,
        config=config,
        run_id="c",
        on_event=lambda e, **d: events.append(e),
    )
    assert "consensus_reached" in events and [(p["parent"], p["step"]) for p in picks] == [("t0", 1)]
    assert events.count("trajectory_started") == 6  # both branches did start
    assert sorted(t["id"] for t in trajs) == ["f0", "f1", "f2", "t0"]
    budget = budget_stats(trajs, config)  # the two branches were stopped, not replaced by fills
    assert (budget["branches_planned"], budget["branches"], budget["shortfall_filled"]) == (2, 0, 0)


async def test_a_consensus_among_branches_forked_while_the_loop_waits_cancels_their_parent(tmp_path):
    """The paper's N=8, M=1, k=2, T=3. The loop waited on the tasks running when it began to wait; the
    branches forked during that wait were not watched, so their consensus was noticed only when t0
    ended: t0 made all 9 of its calls and came back answered, the token saving of the stop lost."""
    calls: list[str] = []

    def plan(trajectory, step):
        if trajectory != "t0":  # f0 and every branch agree at once
            return Reply(answer_text("Paris", trajectory), logprob=SURE, delay=0.05)
        if step == 0:  # crosses the threshold: three branches fork at once
            return Reply(call_text("search", "t0", query="q"), regions={"tool_call": -2.5}, logprob=SURE, delay=0.2)
        if step < 8:
            return Reply(call_text("search", "t0", query=f"q{step}"), logprob=SURE, delay=1.0)
        return Reply(answer_text("Lyon", "t0"), logprob=SURE)

    model = ScriptedChatModel(responder=_by_trajectory(plan, calls))
    config = make_config(n=8, m=1, k=2, t=3, branching="online", calibration=_calibration(tmp_path), consensus=0.75)
    trajs, picks, events = await _online(model, config, "cb")
    assert {t["id"]: t["status"] for t in trajs}["t0"] == "cancelled"
    assert events.index("consensus_reached:") < events.index("trajectory_finished:t0")
    assert calls.count("t0") == 2  # its first step, and the second, in flight at the stop
    assert [(p["parent"], p["step"]) for p in picks] == [("t0", 0)]  # it did not live to take its second


# ----------------------------------------------------------------------------- resume


async def test_a_crashed_online_run_resumes_without_redoing_finished_trajectories(tmp_path):
    crash = {"armed": True}
    calls: list[tuple[str, int]] = []

    def plan(me, step, thought):
        calls.append((thought.split()[1], step))
        if step == 0:
            return Reply(call_text("search", thought, query=f"q{me}"), regions={"tool_call": -2.5}, logprob=SURE)
        if crash["armed"] and step == 2 and me == 2:  # the second branch dies at its last step
            crash["armed"] = False
            raise MissingLogprobsError("simulated crash")
        if step == 1:  # the second branch crashes after the first has ended
            return Reply(call_text("visit", thought, doc="Paris"), delay=0.5 if me == 2 else 0.0)
        return Reply(answer_text("Paris", thought), delay=2.0 if crash["armed"] and me == 0 else 0.0)

    runners = Runners(plan)
    model = ScriptedChatModel(responder=research_responder(runners))
    config = {"n": 3, "k": 1, "t": 2, "branching": "online", "calibration": _calibration(tmp_path), "seed": 1}
    thread = {"configurable": {"thread_id": "crash"}}
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "run.sqlite")) as saver:
        graph = create_parallelmuse(
            model, make_tools()[0], config=config, checkpointer=saver, trajectory_checkpointer=saver
        )
        with pytest.raises(MissingLogprobsError):
            await graph.ainvoke({"question": QUESTION}, thread)
        before = len(calls)
        out = await graph.ainvoke(None, thread)
    assert sorted(t["status"] for t in out["trajectories"]) == ["answered"] * 3
    again = calls[before:]
    # No finished step was generated again: the crashed branch's first steps are checkpointed and the
    # other branch had ended. A step in flight at the crash may be: the crash stops the run at once (as
    # a post-hoc wave's does), so the parent's last step, cancelled there, is generated on resume.
    assert sorted(again) == [("0", 2), ("2", 2)], again


async def test_a_trajectory_is_announced_as_started_when_it_gets_a_slot_of_max_concurrency(tmp_path):
    """Announced when queued, all N looked running at once under max_concurrency=2."""

    def plan(me, step, thought):
        if step < 2:
            return Reply(call_text("search", thought, query=f"q{me}-{step}"), regions={"tool_call": -2.5}, delay=0.05)
        return Reply(answer_text("Paris", thought), delay=0.05)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = make_config(n=6, k=2, t=2, branching="online", calibration=_calibration(tmp_path), seed=1)
    running, peak = set(), 0

    def on_event(event, **data):
        nonlocal peak
        if event == "trajectory_started":
            running.add(data["id"])
        elif event == "trajectory_finished":
            running.discard(data["trajectory"]["id"])
        peak = max(peak, len(running))

    trajs, _ = await online_rollout(
        RolloutRunner(model, make_tools()[0]),
        QUESTION,
        config=config,
        run_id="s",
        on_event=on_event,
        limit=asyncio.Semaphore(2),
    )
    assert len(trajs) == 6 and not running and peak == 2


async def test_a_rerun_of_an_uncalibrated_online_run_takes_the_forks_its_first_run_took():
    """Without a calibration the threshold pools the steps in the order they finish. Live, the fast
    trajectory's steps came first and it forked at its top step (4); rerun, both came back whole and
    the slow one's steps came first, so its step 0 crossed: new branches were generated and the
    finished ones were dropped."""

    def plan(me, step, thought):
        if step == 5:
            return Reply(answer_text("Paris", thought))
        logprob = -0.01 if me == 0 else [-1.1, -0.01, -0.01, -0.01, -1.6][step]  # PPL 1, or 3 ... 5
        return Reply(
            call_text("search", thought, query=f"q{me}-{step}"), regions={"tool_call": logprob}, delay=0.3 * (me == 0)
        )

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    runner = RolloutRunner(model, make_tools()[0])
    config = make_config(n=4, m=2, k=1, t=1, branching="online", seed=1)
    first, picks = await online_rollout(runner, QUESTION, config=config, run_id="r")
    calls = len(model.calls)
    again, repicks = await online_rollout(runner, QUESTION, config=config, run_id="r")
    assert sorted((p["parent"], p["step"]) for p in picks) == [("t0", 0), ("t1", 4)]
    assert sorted((p["parent"], p["step"]) for p in repicks) == [("t0", 0), ("t1", 4)]
    assert len(model.calls) == calls  # nothing generated again
    assert sorted(t["id"] for t in again) == sorted(t["id"] for t in first)


async def test_studio_sees_the_fork_when_it_happens(tmp_path):
    """Through the graph's custom stream: ``branch_picked`` arrives while the parent still runs."""

    def plan(me, step, thought):
        if step == 0:
            return Reply(call_text("search", thought, query=f"q{me}"), regions={"tool_call": -2.5}, logprob=SURE)
        return Reply(answer_text("Paris", thought), logprob=SURE, delay=0.2)

    model = ScriptedChatModel(responder=research_responder(Runners(plan)))
    config = {"n": 3, "k": 1, "t": 2, "branching": "online", "calibration": _calibration(tmp_path)}
    graph = create_parallelmuse(model, make_tools()[0], config=config)
    events = [c async for c in graph.astream({"question": QUESTION}, stream_mode="custom")]
    names = [(e["event"], e.get("id")) for e in events]
    assert names.index(("branch_picked", None)) < names.index(("trajectory_finished", "t0"))
    assert names[-1][0] == "answer"


# ----------------------------------------------------------------------------- failures


class _FailingRunner:
    """Trajectory t0 raises (a checkpointer write failed); the others take a while."""

    def __init__(self, failing: str | None = "t0"):
        self.failing, self.finished = failing, []

    async def run_job(self, job, *, question=None, config=None, on_step=None):
        if job["id"] == self.failing:
            await asyncio.sleep(0.01)
            raise RuntimeError("checkpointer write failed")
        await asyncio.sleep(0.3)
        self.finished.append(job["id"])
        return {"id": job["id"], "origin": job["origin"], "uncertainty": [], "answer": "x", "status": "answered"}


async def test_a_run_ending_error_of_a_branch_stops_the_run_at_once(tmp_path):
    """Before, an error of a branch forked while the loop waited surfaced only when its parent ended:
    13 more model calls were made behind a failure that had already ended the run."""
    calls: list[str] = []

    def plan(trajectory, step):
        if trajectory == "t0.s0.b0":
            raise MissingLogprobsError("simulated run-ending error")
        if trajectory == "t0" and step == 0:  # forks at once
            return Reply(call_text("search", "t0", query="q"), regions={"tool_call": -2.5}, logprob=SURE, delay=0.1)
        if step < 4:
            return Reply(call_text("search", trajectory, query=f"q{step}"), logprob=SURE, delay=1.0)
        return Reply(answer_text("Paris", trajectory), logprob=SURE, delay=1.0)

    model = ScriptedChatModel(responder=_by_trajectory(plan, calls))
    config = make_config(n=4, m=1, k=1, t=2, branching="online", calibration=_calibration(tmp_path))
    with pytest.raises(MissingLogprobsError):
        await online_rollout(RolloutRunner(model, make_tools()[0]), QUESTION, config=config, run_id="e")
    late = calls[calls.index("t0.s0.b0") + 1 :]
    # At most the calls that began beside the failing one: its sibling's first, and t0's next step.
    assert len(late) <= 2, late


async def test_a_consensus_stop_does_not_hide_a_run_ending_error(tmp_path):
    """The branch's error came while the loop still waited on t0 and f2; f2's answer then made the
    consensus, the stop recorded the failed branch from its checkpoints, and the run returned as if
    nothing had failed (asyncio logged the error as never retrieved)."""

    def plan(trajectory, step):
        if trajectory == "t0.s0.b0":
            raise MissingLogprobsError("simulated run-ending error")
        if trajectory == "t0":  # forks at its first step, then answers slowly
            if step == 0:
                return Reply(call_text("search", "t0", query="q"), regions={"tool_call": -2.5}, logprob=SURE, delay=0.3)
            return Reply(answer_text("Lyon", "t0"), logprob=SURE, delay=3.0)
        delay = {"f0": 0.1, "f1": 0.1, "f2": 1.5}.get(trajectory, 3.0)  # f2's is the third agreeing answer
        answer = "Paris" if trajectory.startswith("f") else "Lyon"
        return Reply(answer_text(answer, trajectory), logprob=SURE, delay=delay)

    model = ScriptedChatModel(responder=_by_trajectory(plan))
    config = make_config(n=6, m=1, k=1, t=2, branching="online", calibration=_calibration(tmp_path), consensus=0.75)
    with pytest.raises(MissingLogprobsError):  # as the same run without consensus raises
        await online_rollout(RolloutRunner(model, make_tools()[0]), QUESTION, config=config, run_id="h")


@pytest.mark.parametrize("branching", ["online", "post_hoc"])
@pytest.mark.parametrize("how", ["a trajectory raises", "the node is cancelled"])
async def test_the_rollout_leaves_no_trajectory_running_behind_it(how, branching):
    # Before the fix the other trajectories went on calling the model and writing to their threads
    # after the schedule had raised or been cancelled.
    runner = _FailingRunner("t0" if how == "a trajectory raises" else None)
    config = make_config(n=4, m=2, k=1, t=1, mode="exploration", branching=branching)
    task = asyncio.ensure_future(run_schedule(runner, QUESTION, config=config, run_id="r"))
    if how == "a trajectory raises":
        with pytest.raises(RuntimeError, match="checkpointer write failed"):
            await task
    else:
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.sleep(0.5)
    assert runner.finished == []


def test_a_nan_step_score_is_no_score_for_the_online_threshold():
    # A NaN beat the other region in max() and, among the seen scores, could make the 80th
    # percentile NaN: no later step crossed it, and the run silently stopped forking.
    from langgraph_parallelmuse.schedule import _Online

    run = _Online(None, QUESTION, make_config(n=8, mode="mixed"), "r", reuse=(), on_event=print, limit=None)
    for score in (1.0, 2.0, 3.0, 4.0, float("nan"), 4.5):
        assert run._crossing({"exploration": score, "reasoning": None}) is None
    assert run._crossing({"exploration": float("nan"), "reasoning": 9.0}) == ("reasoning", 9.0)
    assert run._crossing({"exploration": 50.0, "reasoning": None}) == ("exploration", 50.0)
    assert all(math.isfinite(score) for score in run.seen_scores)


class _NoEarlierRun:
    async def origin_of(self, thread_id):
        return None


def _scored_parent(tid, scores):
    return {
        "id": tid,
        "thread_id": f"r/{tid}",
        "origin": {"kind": "initial"},
        "steps": [{"context_tokens": 10}] * len(scores),
        "uncertainty": [{"all": score} for score in scores],
        "fork_points": [f"{tid}-c{i}" for i in range(len(scores))],
    }


async def test_a_parents_steps_after_its_k_forks_still_count_in_the_uncalibrated_threshold():
    """Before: a parent stopped being read at its k-th fork, so the estimate held its crossing steps but
    not the ordinary ones after them: t1's 4.0 stayed under a threshold of 5.0 (the 80th percentile of
    1..6) instead of crossing 3.0 (of t0's sixteen finished steps)."""
    from langgraph_parallelmuse.schedule import _Online

    config = make_config(n=4, m=2, k=1, t=1, mode="all", branching="online")
    run = _Online(_NoEarlierRun(), QUESTION, config, "r", reuse=(), on_event=lambda *a, **kw: None, limit=None)
    run.start = lambda job: None  # the picks are what is asserted: no branch runs
    await run.examine(_scored_parent("t0", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] + [1.0] * 10))
    assert len(run.seen_scores) == 16
    await run.examine(_scored_parent("t1", [4.0, 4.5]))
    assert [(p["parent"], p["step"]) for p in run.picks] == [("t0", 5), ("t1", 0)]
