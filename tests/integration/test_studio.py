"""LangGraph Studio / ``langgraph dev``: the embedded graph served over the LangGraph HTTP API.

Starts the installed ``langgraph dev`` (langgraph-cli, in-memory runtime) from the repo root on a
free loopback port with analytics, version check and tracing off, waits for ``GET /ok``, then
drives the ``parallelmuse`` graph of ``langgraph.json`` through ``langgraph_sdk``: a thread, a
streamed run (``custom`` progress events + ``values``) with a small per-run ``context``.
Real model (SmolLM2 on CPU): a few minutes; select with ``pytest -m integration``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ROOT, free_port, offline_env

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


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"langgraph dev exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(f"{url}/ok", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"langgraph dev not healthy after {timeout}s:\n{_tail(log)}")


@pytest.fixture
def server(tmp_path: Path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "langgraph-dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                _langgraph_exe(),
                "dev",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-browser",
                "--no-reload",
                "--config",
                str(ROOT / "langgraph.json"),
            ],
            cwd=ROOT,
            env=offline_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_healthy(proc, url, log)
        yield url, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and nothing else
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


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
