"""Sticky routing: every request of one question (its branches and reports too) hits one server."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.models import StickyRouter
from tests.unit.fakes import ScriptedChatModel, make_tools, research_responder
from tests.unit.test_graph import by_step

QUESTIONS = [f"Question number {i}?" for i in range(12)]


def _servers(n: int) -> list[ScriptedChatModel]:
    return [ScriptedChatModel(responder=research_responder(by_step())) for _ in range(n)]


def test_same_question_same_server_whatever_follows():
    router = StickyRouter(models=_servers(3))
    base = [SystemMessage("sys"), HumanMessage("Where is the Louvre?")]
    longer = [*base, AIMessage("<think>x</think>"), HumanMessage("<tool_response>y</tool_response>")]
    assert router.pick(base) is router.pick(longer)


def test_questions_spread_over_servers():
    router = StickyRouter(models=_servers(3))
    assert len({id(router.pick([HumanMessage(q)])) for q in QUESTIONS}) > 1


async def test_a_whole_parallelmuse_run_stays_on_one_server():
    servers = _servers(3)
    tools, _ = make_tools()
    graph = create_parallelmuse(StickyRouter(models=servers), tools, config={"n": 4, "m": 1, "k": 1, "t": 2})
    out = await graph.ainvoke({"question": "What is the capital of France?"})
    assert out["answer"] == "Paris"
    used = [s for s in servers if s.calls]
    assert len(used) == 1 and len(used[0].calls) >= 4 + len(out["reports"])


def test_no_servers_is_a_config_error():
    with pytest.raises(ConfigError, match="at least one model"):
        StickyRouter(models=[])
