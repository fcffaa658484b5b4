"""Fault injected: a failing or misbehaving agent model.

Transient server errors (HTTP 503/429, ``ConnectionError``, timeouts) on a call are retried and
the run succeeds; non-transient errors are not retried. A trajectory whose model keeps failing is
reported as ``failed`` and left out of aggregation while the others go on; if every trajectory
fails the graph returns ``answer=None`` with a "no answer" message, not an exception. Malformed
replies (unclosed tags, bad JSON, no action, empty or cut-off answers) become error observations,
bounded by ``max_turns``. Context-length errors are not retried blindly.
"""

from __future__ import annotations

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.driver import FreeDriver
from langgraph_parallelmuse.errors import ContextOverflowError, MissingLogprobsError, RolloutFailedError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.protocol import FINAL_TURN_NOTE, neutralize
from tests.reliability.helpers import KwargsModel, ServerError, seed_table
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    agent_step,
    answer_text,
    call_text,
    majority_from_prompt,
    make_tools,
    report_from_prompt,
    research_responder,
    role_of,
)

pytestmark = pytest.mark.timeout(60)

QUESTION = "What is the capital of France?"
STEPS = [
    Reply(
        call_text("search", "Find the country first", query="capital of France"),
        regions={"tool_call": -0.2, "think": -0.3},
    ),
    Reply(call_text("visit", "Open the page", doc="Paris"), regions={"tool_call": -2.5}),
    Reply(answer_text("Paris", "It says Paris")),
]


async def _run(script, config=None):
    tools, calls = make_tools()
    model = ScriptedChatModel(script=list(script))
    runner = RolloutRunner(model, tools, driver=FreeDriver())
    traj = await runner.run(
        QUESTION,
        trajectory_id="t0",
        thread_id="model-faults/t0",
        config=config or ParallelMuseConfig(),
    )
    return traj, model, calls


# ----------------------------------------------------------------------------- transient errors


@pytest.mark.parametrize(
    "exc",
    [
        ServerError(503),
        ServerError(502),
        ServerError(429, "rate limited"),
        ConnectionError("reset"),
        TimeoutError("read timeout"),
    ],
    ids=["503", "502", "429", "connection", "timeout"],
)
async def test_transient_model_error_on_first_call_is_retried(exc, fast_retries):
    traj, model, _ = await _run([exc, *[s.text for s in STEPS]])
    assert traj["status"] == "answered" and traj["answer"] == "Paris"
    assert len(model.calls) == 4  # the failed call + one per step
    assert model.calls[0]["messages"] == model.calls[1]["messages"]  # same prompt retried


async def test_persistent_server_error_fails_the_trajectory_after_bounded_retries(fast_retries):
    traj, model, _ = await _run([ServerError(503)] * 10)
    assert traj["status"] == "failed"
    assert "model call failed at step 0: ServerError: HTTP 503" in traj["error"]
    assert len(model.calls) == 3  # 1 + 2 retries, not forever


@pytest.mark.parametrize("exc", [ServerError(400, "bad request"), ValueError("nope"), ServerError(401, "invalid key")])
async def test_non_transient_model_error_is_not_retried(exc, fast_retries):
    traj, model, _ = await _run([exc] * 5)
    assert traj["status"] == "failed" and len(model.calls) == 1


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 8192 tokens",  # OpenAI, vLLM
        "the request exceeds the available context size, try increasing it",  # llama.cpp's server
    ],
)
async def test_context_length_error_is_not_retried_blindly(message, fast_retries):
    exc = ServerError(400, message)
    traj, model, _ = await _run([STEPS[0].text, exc, exc, exc])
    # One retry only, with trimmed tool output and a forced answer; never the same prompt again.
    assert len(model.calls) == 3
    assert model.calls[1]["messages"] != model.calls[2]["messages"]
    assert FINAL_TURN_NOTE in model.calls[2]["messages"][-1].content
    # Ended as exhausted, with the server's words: not a "failed" call that a resume would retry.
    assert traj["status"] == "context_exhausted" and traj["answer"] is None
    assert traj["error"].startswith("the context is exhausted at step 1: ServerError") and message in traj["error"]


async def test_context_length_error_forces_a_final_answer(fast_retries):
    exc = ServerError(400, "This model's maximum context length is 8192 tokens")

    def script_item(messages):
        if FINAL_TURN_NOTE in messages[-1].content:
            return answer_text("Paris")
        return STEPS[0].text if agent_step(messages) == 0 else exc

    tools, _ = make_tools()
    model = ScriptedChatModel(responder=script_item)
    runner = RolloutRunner(model, tools, driver=FreeDriver())
    traj = await runner.run(QUESTION, trajectory_id="t0", thread_id="ctx/t0")
    assert traj["status"] == "answered"


async def test_the_in_process_engines_overflow_error_trims_and_answers_instead_of_ending_the_run():
    """The in-process engine says ``ContextOverflowError`` (an ``InputError``): before the fix it
    aborted the whole run ("shorten the messages") instead of trimming like a server's 400."""
    overflow = ContextOverflowError("the prompt has 9000 tokens but max_context_tokens is 8192: shorten the messages")

    def script_item(messages):
        if FINAL_TURN_NOTE in messages[-1].content:
            return answer_text("Paris")
        return STEPS[0].text if agent_step(messages) == 0 else overflow

    tools, _ = make_tools()
    runner = RolloutRunner(ScriptedChatModel(responder=script_item), tools, driver=FreeDriver())
    traj = await runner.run(QUESTION, trajectory_id="t0", thread_id="ctx-local/t0")
    assert traj["status"] == "answered" and traj["answer"] == "Paris"


async def test_an_overflow_that_trimming_cannot_fix_ends_the_trajectory_not_the_run():
    overflow = ContextOverflowError("the prompt has 9000 tokens but max_context_tokens is 8192")
    traj, model, _ = await _run([STEPS[0].text, overflow, overflow])
    assert traj["status"] == "context_exhausted" and "ContextOverflowError" in traj["error"]
    assert len(model.calls) == 3


async def test_context_budget_forces_the_final_answer_before_the_backend_fails():
    """The library's own guard: an estimated prompt over budget makes the next step final."""
    tools, _ = make_tools(search=lambda q: "evidence " * 3000)  # ~9000 tokens of tool output
    model = ScriptedChatModel(script=[STEPS[0].text, answer_text("Paris")])
    runner = RolloutRunner(model, tools, driver=FreeDriver())
    cfg = ParallelMuseConfig(max_context_tokens=2000, max_observation_chars=30_000, max_turns=6)
    traj = await runner.run(QUESTION, trajectory_id="t0", thread_id="budget/t0", config=cfg)
    assert FINAL_TURN_NOTE in model.calls[1]["messages"][-1].content
    assert traj["status"] == "answered" and len(model.calls) == 2


# ----------------------------------------------------------------------------- failed trajectories


def _graph_failing(failing: str, config: dict):
    table = seed_table(
        config["seed"],
        ["t0", "f0", "f1", "f2", "t0.s1.b0", "t0.s1.b1"],
        max_turns=config.get("max_turns", ParallelMuseConfig().max_turns),
    )

    def respond(messages, kwargs):
        role = role_of(messages)
        if role == "compress":
            return report_from_prompt(messages)
        if role == "aggregate":
            return majority_from_prompt(messages)
        tid, _ = table[kwargs["seed"]]
        if tid == failing:
            return ValueError(f"model refuses trajectory {tid}")
        return STEPS[agent_step(messages)]

    model = KwargsModel(kw_responder=respond)
    tools, _ = make_tools()
    return create_parallelmuse(model, tools, config=config), model


@pytest.mark.parametrize(
    ("failing", "config", "ids"),
    [
        ("f1", {"n": 3, "mode": "none", "seed": 7}, {"t0", "f0", "f1"}),
        (
            "t0.s1.b0",
            {"n": 4, "m": 1, "k": 1, "t": 2, "seed": 7},
            {"t0", "t0.s1.b0", "t0.s1.b1", "f0"},
        ),
        ("t0", {"n": 4, "m": 1, "k": 1, "t": 2, "seed": 7}, {"t0", "f0", "f1", "f2"}),
    ],
    ids=["fill-fails", "branch-fails", "initial-fails"],
)
async def test_a_failed_trajectory_is_excluded_and_the_rest_goes_on(failing, config, ids):
    graph, model = _graph_failing(failing, config)
    out = await graph.ainvoke({"question": QUESTION})
    by_id = {t["id"]: t for t in out["trajectories"]}
    assert set(by_id) == ids
    assert by_id[failing]["status"] == "failed" and by_id[failing]["answer"] is None
    assert f"ValueError: model refuses trajectory {failing}" in by_id[failing]["error"]
    others = [t for t in out["trajectories"] if t["id"] != failing]
    assert all(t["status"] == "answered" and t["answer"] == "Paris" for t in others)
    assert {r["trajectory_id"] for r in out["reports"]} == ids - {failing}
    assert out["stats"]["rollout"]["failed"] == 1
    assert out["answer"] == "Paris" and out["answer_source"] == "aggregator"


@pytest.mark.parametrize("aggregation", ["parallelmuse", "majority", "weighted", "max_tool_calls"])
async def test_all_trajectories_failing_raises_one_error_that_keeps_the_partial_run(aggregation, fast_retries):
    """An all-failed run is an error naming the cause and the model, not a silent ``answer=None``."""
    model = ScriptedChatModel(responder=lambda msgs: ServerError(500, "engine crashed"))
    tools, calls = make_tools()
    graph = create_parallelmuse(model, tools, config={"n": 3, "mode": "none", "aggregation": aggregation})
    with pytest.raises(RolloutFailedError, match=r"every trajectory failed \(3 of 3\).*engine crashed") as err:
        await graph.ainvoke({"question": QUESTION})
    assert "ScriptedChatModel" in str(err.value)
    result = err.value.result  # nothing is lost: the trajectories and their reasons come with it
    assert result["question"] == QUESTION
    assert [t["status"] for t in result["trajectories"]] == ["failed"] * 3
    assert all("engine crashed" in t["error"] for t in result["trajectories"])
    assert result["stats"]["rollout"]["failed"] == 3
    assert len(model.calls) == 9  # 3 trajectories x (1 + 2 retries), no compress/aggregate calls


async def test_a_setting_that_ends_the_run_in_the_aggregator_keeps_the_rollout_and_the_reports():
    """Before, a scoring aggregator on a server without prompt_logprobs raised after the whole rollout,
    and a graph without a checkpointer lost every trajectory and report with it."""
    from langgraph_parallelmuse.models.server import ServerCheckError

    def no_scoring(messages):
        return ServerCheckError("http://127.0.0.1:8001/v1 returned no prompt_logprobs: scoring needs vLLM")

    model = ScriptedChatModel(responder=research_responder(lambda i, m: STEPS[min(i, len(STEPS) - 1)]))
    aggregator = ScriptedChatModel(responder=research_responder(lambda i, m: STEPS[0], aggregate=no_scoring))
    tools, _ = make_tools()
    graph = create_parallelmuse(model, tools, aggregator_model=aggregator, config={"n": 3, "mode": "none"})
    with pytest.raises(ServerCheckError, match="no prompt_logprobs") as err:
        await graph.ainvoke({"question": QUESTION})
    result = err.value.result
    assert result["question"] == QUESTION
    assert [t["answer"] for t in result["trajectories"]] == ["Paris"] * 3
    assert sorted(r["trajectory_id"] for r in result["reports"]) == sorted(t["id"] for t in result["trajectories"])
    assert result["stats"]["rollout"]["answered"] == 3


async def test_all_trajectories_failing_in_exploration_mode_raises():
    model = ScriptedChatModel(responder=lambda msgs: ValueError("broken"))
    tools, _ = make_tools()
    graph = create_parallelmuse(model, tools, config={"n": 4, "m": 1, "k": 1, "t": 2})
    with pytest.raises(RolloutFailedError, match="ValueError: broken") as err:
        await graph.ainvoke({"question": QUESTION})
    assert len(err.value.result["trajectories"]) == 4


async def test_asking_again_continues_failed_trajectories_from_their_last_step(fast_retries):
    """A server that was down, then up: on the same checkpointed thread, the same question continues
    each failed trajectory from the step that failed (before the fix a failed thread counted as
    finished, so the run failed again without calling the model)."""
    down = {"now": True}

    def respond(messages):
        role = role_of(messages)
        if role == "aggregate":
            return majority_from_prompt(messages)
        if down["now"] and agent_step(messages) == 1:
            return ServerError(503, "model not loaded yet")
        return STEPS[agent_step(messages)]

    model = ScriptedChatModel(responder=respond)
    tools, calls = make_tools()
    saver = InMemorySaver()
    graph = create_parallelmuse(
        model,
        tools,
        config={"n": 2, "mode": "none", "aggregation": "majority"},
        checkpointer=saver,
        trajectory_checkpointer=saver,
    )
    thread = {"configurable": {"thread_id": "chat-1"}}
    with pytest.raises(RolloutFailedError, match="ask again on the same thread"):
        await graph.ainvoke({"question": QUESTION}, thread)
    down["now"] = False
    out = await graph.ainvoke({"question": QUESTION}, thread)
    assert out["answer"] == "Paris"
    assert [t["status"] for t in out["trajectories"]] == ["answered", "answered"]
    assert all(len(t["steps"]) == 3 for t in out["trajectories"])
    first_steps = [c for c in model.calls if role_of(c["messages"]) == "agent" and agent_step(c["messages"]) == 0]
    assert len(first_steps) == 2 and len(calls["search"]) == 2  # nothing finished ran twice


# ----------------------------------------------------------------------------- malformed output


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("<think>I keep thinking and never close", "no <tool_call> or <answer>"),
        ("just prose, no protocol at all", "no <tool_call> or <answer>"),
        ("<think>x</think><tool_call>{name: search, query}</tool_call>", "not valid JSON"),
        ('<think>x</think><tool_call>["search", "q"]</tool_call>', 'must be {"name"'),
        (
            '<think>x</think><tool_call>{"name": "search", "arguments": "q"}</tool_call>',
            "arguments are not a JSON object",
        ),
        (
            '<think>x</think><tool_call>{"name": "search", "arguments": [1]}</tool_call>',
            "must be a JSON object",
        ),
        ("<think>x</think><answer>   </answer>", "the answer is empty"),
        (
            Reply("<think>x</think><answer>Par", finish_reason="length"),
            "cut off by the token limit",
        ),
        (
            Reply('<think>x</think><tool_call>{"name": "sea', finish_reason="length"),
            "cut off by the token limit",
        ),
    ],
    ids=[
        "unclosed-think",
        "prose",
        "bad-json",
        "json-list",
        "string-args",
        "list-args",
        "empty-answer",
        "cut-answer",
        "cut-call",
    ],
)
async def test_malformed_reply_is_an_error_observation_bounded_by_max_turns(reply, error):
    traj, model, calls = await _run([reply] * 10, ParallelMuseConfig(max_turns=3))
    assert len(model.calls) == 3  # never more than max_turns steps
    assert traj["status"] == "max_turns" and traj["answer"] is None
    assert (
        traj["error"].startswith("the last turn gave no answer: ") and error in traj["error"]
    )  # why, not only "max_turns"
    assert [s["action"]["type"] for s in traj["steps"]] == ["invalid"] * 3
    assert len(traj["observations"]) == 2  # the last turn ends the trajectory
    for obs in traj["observations"]:
        assert obs["error"] is True and obs["name"] == "invalid" and error in obs["content"]
    assert calls == {"search": [], "visit": []}
    # The agent was told what went wrong (inside a tool response, so its tags are neutralised).
    assert neutralize(error) in model.calls[1]["messages"][-1].content
    assert FINAL_TURN_NOTE in model.calls[2]["messages"][-1].content


async def test_malformed_reply_then_recovery_answers():
    traj, model, _ = await _run(["garbage", STEPS[0].text, answer_text("Paris")])
    assert traj["status"] == "answered" and traj["answer"] == "Paris"
    assert [o["error"] for o in traj["observations"]] == [True, False]


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("<think>x</think><answer>Paris", {"type": "answer", "answer": "Paris"}),
        (
            '<think>x</think><tool_call>{"name": "search", "arguments": {"query": "q"}}',
            {"type": "tool_call", "name": "search", "arguments": {"query": "q"}},
        ),
        (
            '<think>x</think><tool_call>{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}</tool_call>',
            {"type": "tool_call", "name": "search", "arguments": {"query": "q"}},
        ),
        (
            '<think>x</think><tool_call>{"name": "search", "parameters": {"query": "q"}}</tool_call>',
            {"type": "tool_call", "name": "search", "arguments": {"query": "q"}},
        ),
    ],
    ids=["unclosed-answer", "unclosed-call", "string-json-args", "parameters-key"],
)
async def test_repairable_replies_are_repaired(reply, action):
    traj, _, _ = await _run([reply, answer_text("Paris")])
    assert traj["steps"][0]["action"] == action
    assert traj["status"] == "answered"


async def test_pathological_tool_call_json_is_a_recoverable_invalid_step():
    huge = '<think>x</think><tool_call>{"name": "search", "arguments": {"q": ' + "1" * 5000 + "}}</tool_call>"
    traj, model, _ = await _run([huge, answer_text("Paris")])
    assert traj["steps"][0]["action"]["type"] == "invalid"
    assert traj["status"] == "answered"


async def test_a_backend_without_logprobs_or_usage_fails_on_its_first_call():
    """Before: the first wave ran (model and tool calls paid for), and without usage data it never raised:
    exploration mode silently became plain sampling with fills."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    step = '<think>look</think><tool_call>{"name": "search", "arguments": {"query": "France"}}</tool_call>'
    model = FakeListChatModel(responses=[step] * 50)  # no logprobs, no usage metadata
    tools, calls = make_tools()
    graph = create_parallelmuse(model, tools, config={"n": 8, "max_turns": 3})
    with pytest.raises(MissingLogprobsError, match="mode='none'"):
        await graph.ainvoke({"question": QUESTION})
    assert calls == {"search": [], "visit": []}  # no tool call was paid for
    assert model.i <= 2  # the first call of each first-wave trajectory, at most
