"""Checkpoint storage of a run on a real SQLite saver: linear in the steps, not quadratic.

Every think/act step of a trajectory is a checkpoint of its thread; a checkpoint must not store the
thread's whole step list again (SQLite keeps every channel value in every checkpoint), and the
report's ``Send`` payload, checkpointed twice, must not carry the token logprobs.
"""

from __future__ import annotations

import sqlite3

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.graph import create_parallelmuse
from tests.unit.fakes import Reply, ScriptedChatModel, answer_text, call_text, make_tools, research_responder

THOUGHT = "The page lists the founding century and the northern bridge, so the next query narrows it. " * 3
OBSERVATION = "Result snippet: the city on the river was founded in the ninth century by traders. " * 18


def _agent(turns: int):
    def agent(index, messages):
        if index >= turns - 1:
            return Reply(answer_text("Paris", THOUGHT))
        return Reply(call_text("search", THOUGHT, query=f"query {index}"), regions={"tool_call": -0.5})

    return agent


def _bytes(path, sql: str) -> int:
    with sqlite3.connect(path) as con:
        return con.execute(sql).fetchone()[0] or 0


async def _trajectory_bytes(tmp_path, turns: int) -> tuple[int, int]:
    path = tmp_path / f"t{turns}.sqlite"
    model = ScriptedChatModel(responder=lambda messages: _agent(turns)(sum(m.type == "ai" for m in messages), messages))
    tools, _ = make_tools(search=lambda q: OBSERVATION)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        runner = RolloutRunner(model, tools, checkpointer=saver)
        cfg = ParallelMuseConfig(max_turns=turns, max_observation_chars=2000)
        traj = await runner.run("Which city?", trajectory_id="t0", thread_id="t0", config=cfg)
    assert traj["status"] == "answered" and len(traj["steps"]) == turns
    checkpoints = _bytes(path, "select sum(length(checkpoint)) from checkpoints")
    writes = _bytes(path, "select sum(length(value)) from writes")
    return checkpoints, writes


async def test_a_trajectory_thread_stores_each_step_once_not_once_per_later_checkpoint(tmp_path):
    short_ckpt, short_writes = await _trajectory_bytes(tmp_path, 6)
    long_ckpt, long_writes = await _trajectory_bytes(tmp_path, 12)
    # Each step's record and tool response are stored once, in the writes, so the checkpoints
    # themselves stay a small fraction of them (with the whole lists in every checkpoint they were
    # ~4x the writes at 6 steps, ~8x at 12) ...
    assert long_ckpt < 0.5 * long_writes, (long_ckpt, long_writes)
    # ... and twice the steps cost about twice the bytes (quadratic growth was ~3.5x).
    assert (long_ckpt + long_writes) < 2.3 * (short_ckpt + short_writes), (
        short_ckpt,
        short_writes,
        long_ckpt,
        long_writes,
    )


async def test_the_report_payloads_do_not_store_the_token_logprobs_again(tmp_path):
    path = tmp_path / "run.sqlite"
    model = ScriptedChatModel(responder=research_responder(_agent(6)))
    tools, _ = make_tools(search=lambda q: OBSERVATION)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        graph = create_parallelmuse(
            model,
            tools,
            config={"n": 3, "mode": "none", "max_turns": 6},
            checkpointer=saver,
            trajectory_checkpointer=saver,
        )
        out = await graph.ainvoke({"question": "Which city?"}, {"configurable": {"thread_id": "outer"}})
        # The state and the output keep every step's tokens.
        assert all(step["tokens"] for traj in out["trajectories"] for step in traj["steps"])
        assert len(out["reports"]) == 3
    trajectories = _bytes(
        path, "select sum(length(value)) from writes where thread_id='outer' and channel='trajectories'"
    )
    sends = _bytes(path, "select sum(length(value)) from writes where thread_id='outer' and channel='__pregel_tasks'")
    # The compress payloads were each a whole trajectory (as many bytes as the trajectories' writes).
    assert sends < 0.35 * trajectories, (sends, trajectories)
