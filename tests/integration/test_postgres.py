"""LangGraph checkpoints in a real PostgreSQL (Debian's postgresql-15) started by the test suite."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

import pytest

pytestmark = pytest.mark.integration

psycopg = pytest.importorskip("psycopg", reason="pip install -e '.[persist]' (langgraph-checkpoint-postgres)")


async def test_async_saver_setup_put_and_get(postgres) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    assert postgres.url.startswith("postgresql://postgres@127.0.0.1:")
    async with AsyncPostgresSaver.from_conn_string(postgres.url) as saver:
        await saver.setup()
        await saver.setup()  # idempotent: a restarted service runs it again
        checkpoint = {**empty_checkpoint(), "channel_values": {"answer": "Paris"}}
        config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
        stored = await saver.aput(config, checkpoint, {"source": "input", "step": 0}, {})
        got = await saver.aget_tuple({"configurable": {"thread_id": "t-1"}})
    assert got is not None and got.config["configurable"]["checkpoint_id"] == stored["configurable"]["checkpoint_id"]
    assert got.checkpoint["channel_values"] == {"answer": "Paris"}
    assert got.metadata["step"] == 0
    # A second connection (another process would do the same) sees it: it is in the database.
    with psycopg.connect(postgres.url) as conn:
        (count,) = conn.execute("select count(*) from checkpoints where thread_id = 't-1'").fetchone()
    assert count == 1


class Tally(TypedDict):
    seen: Annotated[list[str], operator.add]


def _tally():
    """A graph whose one node notes how many times it ran on the thread before."""
    from langgraph.graph import START, StateGraph

    builder = StateGraph(Tally)
    builder.add_node("note", lambda state: {"seen": [f"call {len(state['seen'])}"]})
    builder.add_edge(START, "note")
    return builder


async def test_graph_state_survives_a_new_saver(postgres) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    builder = _tally()
    config = {"configurable": {"thread_id": "tally"}}
    async with AsyncPostgresSaver.from_conn_string(postgres.url) as saver:
        await saver.setup()
        await builder.compile(checkpointer=saver).ainvoke({"seen": []}, config)
    async with AsyncPostgresSaver.from_conn_string(postgres.url) as saver:  # as after a restart
        graph = builder.compile(checkpointer=saver)
        result = await graph.ainvoke({"seen": []}, config)
        history = [s async for s in graph.aget_state_history(config)]
    assert result["seen"] == ["call 0", "call 1"]
    assert len(history) >= 4


async def test_a_connection_the_server_dropped_is_replaced_and_the_next_run_goes_on(postgres) -> None:
    """A database restart, a failover or an idle timeout ends the saver's connections; the library's
    saver (a checked pool) opens new ones, where one long-held connection failed every later call."""
    from langgraph_parallelmuse.persistence import open_checkpointer

    builder = _tally()
    config = {"configurable": {"thread_id": "dropped"}}
    async with open_checkpointer(postgres.url) as saver:
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke({"seen": []}, config)
        with psycopg.connect(postgres.url, autocommit=True) as admin:  # the server ends every other session
            ended = admin.execute(
                "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid()) t"
            ).fetchone()[0]
        assert ended >= 1
        result = await graph.ainvoke({"seen": []}, config)
    assert result["seen"] == ["call 0", "call 1"]  # the first run's checkpoint was read back, then extended


async def test_deleting_a_thread_deletes_its_trajectory_threads_and_no_other(postgres) -> None:
    from langgraph_parallelmuse.persistence import open_checkpointer
    from tests.unit.test_graph import check_delete_with_trajectories

    async with open_checkpointer(postgres.url) as saver:
        await check_delete_with_trajectories(saver)
    with psycopg.connect(postgres.url) as conn:  # every table, not only what the saver lists
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            (count,) = conn.execute(f"select count(*) from {table} where thread_id like 'chat\\_1:%'").fetchone()
            (kept,) = conn.execute(f"select count(*) from {table} where thread_id like 'chat\\_1:notes%'").fetchone()
            assert count == kept > 0, table


async def test_a_run_rolled_back_by_langgraph_server_leaves_the_thread_as_it_was_before_it(postgres) -> None:
    """LangGraph Server's multitask_strategy="rollback" calls adelete_for_runs, which AsyncPostgresSaver
    lacks: the server's next request failed and it ran nothing more until restarted."""
    from langgraph_parallelmuse.persistence import open_checkpointer

    builder = _tally()
    thread = {"configurable": {"thread_id": "rolled-back"}}
    async with open_checkpointer(postgres.url) as saver:
        graph = builder.compile(checkpointer=saver)
        for run in ("run-a", "run-b"):
            await graph.ainvoke({"seen": []}, {"configurable": {**thread["configurable"], "run_id": run}})
        await saver.adelete_for_runs(["run-b"])
        state = await graph.aget_state(thread)
        left = [s async for s in graph.aget_state_history(thread)]
    with psycopg.connect(postgres.url) as conn:
        (writes,) = conn.execute(
            "select count(*) from checkpoint_writes w where w.thread_id = 'rolled-back' and not exists "
            "(select 1 from checkpoints c where c.checkpoint_id = w.checkpoint_id)"
        ).fetchone()
    assert state.values == {"seen": ["call 0"]}
    assert {s.metadata.get("run_id") for s in left} == {"run-a"} and writes == 0
