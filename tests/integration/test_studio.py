"""LangGraph Studio / ``langgraph dev``: the embedded graph served over the LangGraph HTTP API.

Starts the installed ``langgraph dev`` (langgraph-cli, in-memory runtime) from the repo root on a
free loopback port with analytics, version check and tracing off, waits for ``GET /ok``, then
drives the ``parallelmuse`` graph of ``langgraph.json`` through ``langgraph_sdk``: a thread, a
streamed run (``custom`` progress events + ``values``) with a small per-run ``context``. A second
server runs ``--config langgraph.postgres.json`` with ``PARALLELMUSE_DB`` on the real PostgreSQL
of the ``postgres`` fixture: the run's checkpoints are read back from its ``checkpoints`` table.
Real model (SmolLM2 on CPU): a few minutes; select with ``pytest -m integration``.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ROOT, free_port, offline_spec

pytestmark = pytest.mark.integration

QUESTION = "Which city is the Eiffel Tower in?"
# Small enough for a loaded 2-core CI box; fields of ParallelMuseContext.
CONTEXT = {
    "n": 2,
    "k": 0,
    "t": 1,
    "max_turns": 3,
    "max_step_tokens": 64,
    "max_report_tokens": 96,
    "seed": 0,
}


def _langgraph_exe() -> str:
    exe = Path(sys.executable).with_name("langgraph")
    found = str(exe) if exe.exists() else shutil.which("langgraph")
    if not found:
        pytest.fail("langgraph-cli is not installed: pip install -e '.[studio]'")
    return found


def _tail(log: Path, n: int = 4000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else ""


@contextmanager
def langgraph_dev(tmp_path: Path, config: str, **env: str) -> Iterator[tuple[str, Path]]:
    """``langgraph dev --config CONFIG`` on a free loopback port until the block ends; yields (url, log)."""
    from langgraph_parallelmuse.serving import serve
    from langgraph_parallelmuse.serving.process import http_ready

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        _langgraph_exe(),
        "dev",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-browser",
        "--no-reload",
        "--config",
        str(ROOT / config),
    ]
    spec = offline_spec("langgraph-dev", command, port, http_ready(f"{url}/ok"), **env)
    with serve([spec], log_dir=tmp_path, startup_timeout=180) as (server,):
        yield url, server.log_path


@pytest.fixture
def server(tmp_path: Path):
    with langgraph_dev(tmp_path, "langgraph.json") as running:
        yield running


@pytest.mark.timeout(1200)
async def test_langgraph_dev_runs_the_embedded_graph(server):
    from langgraph_sdk import get_client

    url, log = server
    client = get_client(url=url, api_key=None, timeout=httpx.Timeout(1200, connect=10))

    assistants = await client.assistants.search(graph_id="parallelmuse")
    assert assistants, f"graph 'parallelmuse' not registered:\n{_tail(log)}"
    schemas = await client.assistants.get_schemas(assistants[0]["assistant_id"])
    # Studio's settings form is the graph's context_schema (ParallelMuseContext).
    assert {"n", "k", "t", "mode", "max_turns"} <= set(schemas["context_schema"]["properties"])

    thread = await client.threads.create()
    events: list[dict] = []
    final: dict | None = None
    errors: list = []
    async for part in client.runs.stream(
        thread["thread_id"],
        "parallelmuse",
        input={"question": QUESTION},
        context=CONTEXT,
        stream_mode=["custom", "values"],
    ):
        if part.event == "custom":
            events.append(part.data)
        elif part.event == "values":
            final = part.data
        elif part.event == "error":
            errors.append(part.data)
    assert not errors, f"{errors}\n{_tail(log)}"

    runs = await client.runs.list(thread["thread_id"])
    assert [r["status"] for r in runs] == ["success"], _tail(log)

    assert final is not None
    assert "answer" in final and "answer_source" in final
    # A real answer from the aggregator, and the trajectories it came from really answered.
    assert isinstance(final["answer"], str) and final["answer"].strip(), final
    assert final["answer_source"] == "aggregator"
    assert any(t["status"] == "answered" for t in final["trajectories"])
    assert final["answer"] in {r["answer"] for r in final["reports"]}
    assert len(final["trajectories"]) == 2
    assert {t["origin"]["kind"] for t in final["trajectories"]} == {"initial", "fill"}
    assert final["stats"]["config"]["n"] == 2  # the run's context reached the graph
    assert final["messages"][-1]["type"] == "ai"

    kinds = [e.get("event") for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "answer"
    assert kinds.count("trajectory_finished") == 2
    assert events[-1]["answer"] == final["answer"] and events[-1]["source"] == final["answer_source"]

    state = await client.threads.get_state(thread["thread_id"])
    assert state["values"]["answer"] == final["answer"] and not state["next"]


# One trajectory and its report: the test is about where the checkpoints go, not the method.
TINY = {"n": 1, "k": 0, "t": 1, "max_turns": 2, "max_step_tokens": 32, "max_report_tokens": 48, "seed": 0}


@pytest.mark.timeout(900)
async def test_langgraph_dev_keeps_checkpoints_in_postgres(postgres, tmp_path):
    import psycopg
    from langgraph_sdk import get_client

    with langgraph_dev(tmp_path, "langgraph.postgres.json", PARALLELMUSE_DB=postgres.url) as (url, log):
        client = get_client(url=url, api_key=None, timeout=httpx.Timeout(900, connect=10))
        thread = await client.threads.create()
        final = await client.runs.wait(
            thread["thread_id"], "parallelmuse", input={"question": QUESTION}, context=TINY, raise_error=True
        )
        runs = await client.runs.list(thread["thread_id"])
        state = await client.threads.get_state(thread["thread_id"])
    assert [r["status"] for r in runs] == ["success"], _tail(log)
    assert len(final["trajectories"]) == 1 and final["stats"]["config"]["n"] == 1
    assert state["checkpoint"]["checkpoint_id"]

    # The server is gone: what it checkpointed is in the database, the last state included.
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        ids = [
            row[0]
            for row in conn.execute(
                "select checkpoint_id from checkpoints where thread_id = %s and checkpoint_ns = ''",
                [thread["thread_id"]],
            )
        ]
        # The trajectory's own thread (its think/act steps, the fork points) is there too, not in the
        # server's memory: a restarted server resumes a run's branches from it.
        trajectory = final["trajectories"][0]["thread_id"]
        steps = conn.execute("select count(*) from checkpoints where thread_id = %s", [trajectory]).fetchone()[0]
    assert len(ids) >= 3, ids  # input, the nodes' steps, the end
    assert state["checkpoint"]["checkpoint_id"] in ids
    assert trajectory.startswith(f"{thread['thread_id']}:") and steps >= 3, (trajectory, steps)
