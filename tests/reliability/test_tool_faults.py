"""Fault injected: failing tools.

A tool that raises, hangs past ``tool_timeout``, returns nothing, returns a huge text, returns
non-UTF-8 bytes or a string with lone surrogates, or fails transiently once. The trajectory must
go on with an error observation (never crash or hang), huge output is cut to
``max_observation_chars``, and only transient failures (``TimeoutError``/``ConnectionError``) are
retried, with exponential backoff and jitter.
"""

from __future__ import annotations

import asyncio
import json
import time
import types

import pytest
from langchain_core.messages import HumanMessage

from langgraph_parallelmuse import retry
from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.driver import FreeDriver
from tests.unit.fakes import ScriptedChatModel, answer_text, call_text, make_tools

pytestmark = pytest.mark.timeout(60)

QUESTION = "What is the capital of France?"
SCRIPT = [call_text("search", query="capital of France"), answer_text("Paris")]


async def _run(search, *, config=None, script=SCRIPT):
    tools, calls = make_tools(search=search)
    model = ScriptedChatModel(script=list(script))
    runner = RolloutRunner(model, tools, driver=FreeDriver())
    traj = await runner.run(
        QUESTION,
        trajectory_id="t0",
        thread_id="tool-faults/t0",
        config=config or ParallelMuseConfig(),
    )
    return traj, model, calls


def _next_prompt(model, step=1) -> str:
    """The tool response the model saw before step ``step``."""
    msg = model.calls[step]["messages"][-1]
    assert isinstance(msg, HumanMessage)
    return msg.content


def _flaky(exc: BaseException, times: int = 1, result: str = "Paris is the capital of France."):
    state = {"n": 0}

    def search(query):
        state["n"] += 1
        if state["n"] <= times:
            raise exc
        return result

    return search


def _raise(exc):
    def search(query):
        raise exc

    return search


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (ValueError("bad query syntax"), "failed: ValueError: bad query syntax"),
        (RuntimeError("index corrupted"), "failed: RuntimeError: index corrupted"),
        (KeyError("doc"), "failed: KeyError"),
        (PermissionError("403 forbidden"), "failed: PermissionError: 403 forbidden"),
    ],
)
async def test_non_transient_tool_exception_is_an_error_observation_and_not_retried(exc, shown):
    traj, model, calls = await _run(_raise(exc))
    assert traj["status"] == "answered" and traj["answer"] == "Paris"
    obs = traj["observations"][0]
    assert obs["error"] is True and shown in obs["content"]
    assert len(calls["search"]) == 1  # not retried
    assert shown in _next_prompt(model)  # the agent saw the failure


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("read timed out"),
        ConnectionError("reset by peer"),
        ConnectionResetError("reset"),
    ],
)
async def test_transient_tool_error_is_retried_then_succeeds(exc, fast_retries):
    traj, model, calls = await _run(_flaky(exc))
    assert len(calls["search"]) == 2
    obs = traj["observations"][0]
    assert obs["error"] is False and obs["content"] == "Paris is the capital of France."
    assert traj["status"] == "answered"


async def test_persistent_transient_error_gives_up_after_the_retry_budget(fast_retries):
    traj, _, calls = await _run(_raise(ConnectionError("no route")))
    assert len(calls["search"]) == 3  # 1 call + 2 retries, then an error observation
    obs = traj["observations"][0]
    assert obs["error"] is True and "ConnectionError: no route" in obs["content"]
    assert traj["status"] == "answered"


async def test_a_tools_own_timeout_is_reported_with_its_message_not_as_the_deadline(fast_retries):
    # Before the fix any TimeoutError read as the library's deadline: the tool's own message was lost.
    traj, _, calls = await _run(_raise(TimeoutError("upstream search API: 5 s read timeout")))
    assert len(calls["search"]) == 3  # a timeout is still transient: retried, then reported
    obs = traj["observations"][0]
    assert obs["error"] is True and "TimeoutError: upstream search API: 5 s read timeout" in obs["content"]
    assert "timed out after" not in obs["content"]


async def test_hanging_tool_is_abandoned_after_tool_timeout():
    async def hang(query):
        await asyncio.sleep(3600)

    started = time.perf_counter()
    traj, model, calls = await _run(hang, config=ParallelMuseConfig(tool_timeout=0.3))
    elapsed = time.perf_counter() - started
    assert elapsed < 5
    obs = traj["observations"][0]
    assert obs["error"] is True and obs["content"] == "Error: tool 'search' timed out after 0.3 s."
    assert traj["status"] == "answered" and len(model.calls) == 2


async def test_timeout_bounds_the_retries_too():
    """A tool that keeps timing out on its own is retried, but never past ``tool_timeout``."""

    async def slow_then_fail(query):
        await asyncio.sleep(0.2)
        raise TimeoutError("upstream timeout")

    started = time.perf_counter()
    traj, _, calls = await _run(slow_then_fail, config=ParallelMuseConfig(tool_timeout=0.5))
    assert time.perf_counter() - started < 5
    assert 1 <= len(calls["search"]) <= 3
    assert traj["observations"][0]["error"] is True
    assert traj["status"] == "answered"


async def test_huge_tool_output_is_truncated_to_max_observation_chars():
    huge = "Paris " * 200_000  # 1.2 MB
    traj, model, _ = await _run(lambda q: huge, config=ParallelMuseConfig(max_observation_chars=500))
    content = traj["observations"][0]["content"]
    assert len(content) <= 500 + len(" …[truncated]")
    assert content.endswith(" …[truncated]")
    assert len(_next_prompt(model)) < 1000
    assert traj["status"] == "answered"


async def test_long_error_text_is_truncated_too():
    traj, _, _ = await _run(_raise(ValueError("x" * 100_000)), config=ParallelMuseConfig(max_observation_chars=300))
    content = traj["observations"][0]["content"]
    assert content.startswith("Error: tool 'search' failed: ValueError: xxx")
    assert len(content) <= 300 + len(" …[truncated]")


async def test_a_cancelled_error_the_tool_raises_itself_is_its_failure_not_the_runs():
    """Before: a tool whose own client was cancelled inside it (CancelledError, no Exception) ended
    the whole run (NodeCancelledError under a graph) instead of giving the agent an error."""
    traj, model, _ = await _run(_raise(asyncio.CancelledError()))
    assert traj["status"] == "answered" and len(model.calls) == 2
    assert traj["observations"][0]["content"].startswith("Error: tool 'search' failed: CancelledError")


async def test_the_runs_own_cancellation_during_a_tool_call_still_cancels_it():
    """A guard: the fix for a tool's own CancelledError must not swallow the run's cancellation."""
    started = asyncio.Event()

    async def hang(query):
        started.set()
        await asyncio.sleep(60)

    run = asyncio.ensure_future(_run(hang))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_empty_tool_output_does_not_stop_the_trajectory():
    traj, model, _ = await _run(lambda q: "")
    assert traj["status"] == "answered" and len(model.calls) == 2
    assert "returned nothing" in _next_prompt(model)


async def test_empty_tool_output_is_an_error_observation():
    traj, _, _ = await _run(lambda q: "")
    obs = traj["observations"][0]
    assert obs["error"] is True and "returned nothing" in obs["content"]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\xff\xfe caf\xe9 \x80\x81", id="bytes"),
        pytest.param(
            b"\xff\xfe caf\xe9".decode("utf-8", "surrogateescape"),
            id="lone-surrogates",
        ),
        pytest.param("nul\x00byte", id="nul"),
    ],
)
async def test_non_utf8_tool_output_continues_with_valid_text(raw):
    traj, model, _ = await _run(lambda q: raw)
    assert traj["status"] == "answered" and traj["answer"] == "Paris"
    content = traj["observations"][0]["content"]
    assert isinstance(content, str)
    content.encode("utf-8")  # storable and sendable: no lone surrogates survive
    _next_prompt(model).encode("utf-8")
    json.dumps(traj)  # the trajectory is still plain JSON


async def test_unknown_tool_name_is_an_error_observation():
    script = [call_text("browse", url="x"), answer_text("Paris")]
    traj, _, calls = await _run(None, script=script)
    obs = traj["observations"][0]
    assert obs["error"] is True and "unknown tool 'browse'" in obs["content"]
    assert "search, visit" in obs["content"] and calls == {"search": [], "visit": []}


async def test_tool_with_wrong_arguments_is_an_error_observation():
    script = [
        '<think>x</think><tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>',
        answer_text("Paris"),
    ]
    traj, _, calls = await _run(None, script=script)
    obs = traj["observations"][0]
    assert obs["error"] is True and "ValidationError" in obs["content"]
    assert traj["status"] == "answered"


async def test_backoff_is_exponential_with_jitter_and_only_for_transient_errors(monkeypatch):
    sleeps: list[float] = []

    async def fake_sleep(delay):
        sleeps.append(delay)

    monkeypatch.setattr(retry, "asyncio", types.SimpleNamespace(sleep=fake_sleep, TimeoutError=TimeoutError))
    attempts = {"n": 0}

    async def always_down():
        attempts["n"] += 1
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await retry.with_retries(always_down, retries=3, base_delay=0.5)
    assert attempts["n"] == 4
    assert len(sleeps) == 3
    for i, delay in enumerate(sleeps):  # base * 2**i * (1 + U[0, 1))
        assert 0.5 * 2**i <= delay < 0.5 * 2**i * 2

    sleeps.clear()
    attempts["n"] = 0

    async def bad_request():
        attempts["n"] += 1
        raise ValueError("400")

    with pytest.raises(ValueError):
        await retry.with_retries(bad_request, retries=3)
    assert attempts["n"] == 1 and sleeps == []


async def test_a_web_search_tavily_failed_is_recorded_as_a_failed_call():
    """The web tools return Tavily's failures as texts the agent reads; the trajectory must still
    record the step as a failed call (not as a page of the web) and the agent must see which service failed."""
    import socket

    from langgraph_parallelmuse.tools import make_tavily_tools

    with socket.socket() as s:  # a port nothing listens on: Tavily is unreachable
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tools = make_tavily_tools(api_key="tvly-test", base_url=f"http://127.0.0.1:{port}", retries=0)
    model = ScriptedChatModel(script=list(SCRIPT))
    traj = await RolloutRunner(model, tools, driver=FreeDriver()).run(
        QUESTION, trajectory_id="t0", thread_id="tool-faults/tavily", config=ParallelMuseConfig()
    )
    obs = traj["observations"][0]
    assert obs["error"] is True and "web search on Tavily failed" in obs["content"]
    assert "web search on Tavily failed" in _next_prompt(model)
    assert traj["status"] == "answered"  # the agent went on
