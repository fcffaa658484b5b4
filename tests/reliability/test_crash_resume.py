"""Fault injected: the process dies (SIGKILL) in the middle of a run; and heavy load.

A subprocess runs the full graph on a SQLite checkpointer (``crash_worker.py``) and is killed
with SIGKILL once the initial trajectory and at least one branch have finished while the slow
fill is still running. A second subprocess resumes the same thread: the final answer must come
out and no finished trajectory may call the model again (counted per trajectory from the side
file every model call appends to). Under load (N=16 per question, 4 questions in ``abatch``)
the number of model calls in flight never exceeds ``max_concurrency``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.lineage import Pick, branch_job, scratch_job
from tests.reliability.crash_worker import IDS
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    agent_step,
    answer_text,
    call_text,
    make_tools,
    report_from_prompt,
    research_responder,
    role_of,
)

ROOT = Path(__file__).resolve().parents[2]


def _worker(db: Path, side: Path, phase: str, result: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.reliability.crash_worker",
            str(db),
            str(side),
            phase,
            str(result),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _calls(side: Path) -> list[tuple[str, str, int]]:
    if not side.exists():
        return []
    out = []
    for line in side.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], parts[1], int(parts[2])))
    return out


async def _finished_in_db(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:  # the run's id names its question and settings: read it back
        rows = conn.execute("SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id LIKE 'crash-1:%/%'")
        run_ids = {thread.rsplit("/", 1)[0] for (thread,) in rows}
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        runner = RolloutRunner(ScriptedChatModel(), make_tools()[0], checkpointer=saver)
        return {tid for run_id in run_ids for tid in IDS if await runner.existing(f"{run_id}/{tid}") is not None}


@pytest.mark.timeout(90)
async def test_sigkill_mid_run_then_resume_keeps_finished_trajectories(tmp_path):
    db, side = tmp_path / "runs.sqlite", tmp_path / "calls.log"
    first = _worker(db, side, "1", tmp_path / "result1.json")
    try:
        deadline = time.monotonic() + 60
        branch_done = None
        while time.monotonic() < deadline and first.poll() is None:
            calls = _calls(side)
            branch_done = next((c for c in calls if c[1] == "t0.s1.b0" and c[2] == 2), None)
            if branch_done:
                break
            await asyncio.sleep(0.02)
        assert first.poll() is None, first.stderr.read().decode()[-2000:]
        assert branch_done, "no branch reached its answer step in time"
        await asyncio.sleep(0.6)  # let that answer step's checkpoint land
        assert first.poll() is None, "the run finished before it could be killed"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        first.stdout.close()
        first.stderr.close()
    assert first.returncode == -signal.SIGKILL
    assert not (tmp_path / "result1.json").exists()

    finished = await _finished_in_db(db)
    assert {"t0", "f0", "t0.s1.b0"} <= finished
    assert "t0.s1.b1" not in finished  # the kill really was mid-run
    before = Counter(tid for phase, tid, _ in _calls(side) if phase == "1")

    second = _worker(db, side, "2", tmp_path / "result2.json")
    try:
        _, err = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0, err.decode()[-3000:]
    result = json.loads((tmp_path / "result2.json").read_text())

    assert result["resumed"] is True and result["pending_before"]
    assert result["answer"] == "Paris" and result["answer_source"] == "aggregator"
    assert result["trajectories"] == {tid: "answered" for tid in IDS}
    assert result["reports"] == sorted(IDS)
    after = Counter(tid for phase, tid, _ in _calls(side) if phase == "2")
    for tid in finished:
        assert after[tid] == 0, f"finished trajectory {tid} was re-generated: {after}"
    # Unfinished work resumed from its last checkpoint: at most its 3 steps were generated again.
    assert 1 <= after["t0.s1.b1"] <= 2  # a branch of step 1 generates steps 1 and 2 only
    assert before["t0"] == 3


QUESTIONS = [
    "What is the capital of France?",
    "Where is the Louvre?",
    "Who built the Eiffel Tower?",
    "Which river flows through Paris?",
]


def _load_graph(limit: int, *, aggregator_delay: float = 0.01, separate_aggregator: bool = False):
    steps = [
        Reply(
            call_text("search", "Find it", query="capital of France"),
            regions={"tool_call": -1.5},
            delay=0.01,
        ),
        Reply(call_text("visit", "Open it", doc="Paris"), regions={"tool_call": -2.5}, delay=0.01),
        Reply(answer_text("Paris"), delay=0.01),
    ]
    aggregate = lambda msgs: Reply("<answer>Paris</answer>", delay=aggregator_delay)  # noqa: E731
    model = ScriptedChatModel(
        responder=research_responder(
            lambda i, msgs: steps[min(i, 2)],
            compress=lambda msgs: Reply(report_from_prompt(msgs), delay=0.01),
            aggregate=aggregate,
        )
    )
    aggregator = ScriptedChatModel(responder=aggregate) if separate_aggregator else None
    config = {"n": 16, "m": 1, "k": 2, "t": 3, "max_concurrency": limit}
    graph = create_parallelmuse(model, make_tools()[0], config=config, aggregator_model=aggregator)
    return graph, model, aggregator


@pytest.mark.timeout(90)
class _Killed(BaseException):
    """The process dying: not an Exception, so no retry or error handler of the library takes it."""


class _DyingSaver(InMemorySaver):
    """Dies on the checkpoint save that follows the ``act`` task of an armed thread (its ``die_at``-th),
    after that task's writes were saved: what a SIGKILL or a dropped database leaves in that window."""

    def __init__(self) -> None:
        super().__init__()
        self.die_at: dict[str, int] = {}

    async def aput(self, config, checkpoint, metadata, new_versions):
        thread = config["configurable"]["thread_id"]
        if thread in self.die_at and "observations" in new_versions:
            self.die_at[thread] -= 1
            if self.die_at[thread] == 0:
                del self.die_at[thread]
                raise _Killed(thread)
        return await super().aput(config, checkpoint, metadata, new_versions)


def _search_visit_answer(messages):
    step = agent_step(messages)
    if step == 0:
        return Reply(call_text("search", "look", query="capital of France"), regions={"tool_call": -2.5})
    if step == 1:
        return Reply(call_text("visit", "open", doc="Paris"), regions={"tool_call": -2.0})
    return Reply(answer_text("Paris"))


async def test_a_thread_killed_after_a_tools_writes_resumes_with_that_tool_response():
    # Killed after `act` saved its writes but before the next checkpoint, a thread shows no next task;
    # before the fix it was taken for a new one: a from-scratch trajectory was sent its question again
    # (the visit's response was lost, the next step written without it) and a branch was seeded again
    # on top of its own steps (its prefix doubled).
    cfg = ParallelMuseConfig(n=4, m=1, k=1, t=2, max_turns=4, seed=1)
    saver = _DyingSaver()
    model = ScriptedChatModel(responder=_search_visit_answer)
    runner = RolloutRunner(model, make_tools()[0], checkpointer=saver)
    question = "What is the capital of France?"
    job = scratch_job("initial", 0, run_id="r")
    saver.die_at[job["thread_id"]] = 2  # after the visit ran
    with pytest.raises(_Killed):
        await runner.run_job(job, question=question, config=cfg)
    resumed = await runner.run_job(job, question=question, config=cfg)
    assert resumed["status"] == "answered"
    assert [s["index"] for s in resumed["steps"]] == [0, 1, 2]
    assert [o["step"] for o in resumed["observations"]] == [0, 1]
    assert "Document Paris" in str([m.content for m in model.calls[-1]["messages"]])  # the answer saw the visit

    parent = await runner.run_job(scratch_job("initial", 1, run_id="r"), question=question, config=cfg)
    branch = branch_job(parent, Pick(parent="t1", step=1, region="exploration", score=3.0, round=1), 0, run_id="r")
    saver.die_at[branch["thread_id"]] = 2  # the first save is the fork's seed; the second, after its own act
    with pytest.raises(_Killed):
        await runner.run_job(branch, config=cfg)
    resumed = await runner.run_job(branch, config=cfg)
    assert [s["index"] for s in resumed["steps"]] == [0, 1, 2]
    assert [o["step"] for o in resumed["observations"]] == [0, 1]


async def test_concurrency_limit_holds_under_load_in_abatch():
    """N=16 (1 initial + 6 branches + 9 fills) x 4 questions, max_concurrency=4.

    The aggregator is a separate model here, so this measures every trajectory and report call.
    """
    graph, model, aggregator = _load_graph(4, separate_aggregator=True)
    outs = await graph.abatch([{"question": q} for q in QUESTIONS])
    assert [o["answer"] for o in outs] == ["Paris"] * 4
    assert all(len(o["trajectories"]) == 16 for o in outs)
    assert all(
        Counter(t["origin"]["kind"] for t in o["trajectories"]) == Counter({"initial": 1, "branch": 6, "fill": 9})
        for o in outs
    )
    assert all(t["status"] == "answered" for o in outs for t in o["trajectories"])
    roles = Counter(role_of(c["messages"]) for c in model.calls)
    assert roles["compress"] == 64 and roles["aggregate"] == 0 and len(aggregator.calls) == 4
    assert model.peak_in_flight <= 4, f"{model.peak_in_flight} model calls in flight, limit 4"
    assert model.peak_in_flight == 4  # the load really saturated the limit


@pytest.mark.timeout(60)
async def test_aggregation_calls_respect_max_concurrency_in_a_batch():
    model = ScriptedChatModel(
        responder=research_responder(
            lambda i, msgs: Reply(answer_text("Paris"), delay=0.01),
            aggregate=lambda msgs: Reply("<answer>Paris</answer>", delay=0.5),
        )
    )
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 1, "mode": "none", "max_concurrency": 1})
    outs = await graph.abatch([{"question": q} for q in QUESTIONS[:2]])
    assert [o["answer"] for o in outs] == ["Paris", "Paris"]
    assert model.peak_in_flight <= 1, f"{model.peak_in_flight} model calls in flight, limit 1"


@pytest.mark.timeout(60)
async def test_a_runs_context_max_concurrency_bounds_that_run():
    """The factory allows 8 in flight; the run's context asks for 2, and gets it."""
    graph, model, _ = _load_graph(8)
    out = await graph.ainvoke({"question": QUESTIONS[0]}, context={"max_concurrency": 2})
    assert len(out["trajectories"]) == 16 and out["stats"]["config"]["max_concurrency"] == 2
    assert model.peak_in_flight == 2, f"{model.peak_in_flight} model calls in flight, the run asked for 2"
