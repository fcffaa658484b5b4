"""The guided driver's choices: which picks become bridges, and what evidence they are chosen from."""

from __future__ import annotations

import asyncio
import json

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.candidates import candidates
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.driver import GuidedDriver, StepContext
from langgraph_parallelmuse.protocol import parse_action
from langgraph_parallelmuse.segments import Choose, Pick, Sampling, generate_turn
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
from tests.unit.fakes import ScoringChatModel

TOOLS = frozenset({"search", "visit"})
YES_NO = "Is Hello Love's performer older than Willie Nelson?"


def _obs(step: int, name: str, content: str, doc_ids: list[str], *, error: bool = False) -> dict:
    return {
        "step": step,
        "name": name,
        "arguments": {},
        "content": content,
        "error": error,
        "seconds": 0.0,
        "doc_ids": doc_ids,
    }


def _step(index: int, name: str, **extra) -> dict:
    args = {"query": f"q{index}"} if name == "search" else {"doc": f"d{index}"}
    return {
        "index": index,
        "text": f"<think>t{index}</think>",
        "action": {"type": "tool_call", "name": name, "arguments": args},
        **extra,
    }


def test_an_unsure_yes_no_pick_searches_on_without_a_bridge():
    evidence = "Hello Love is an album by Hank Snow. Hank Snow was born in 1914. Willie Nelson was born in 1933."
    steps = [_step(0, "search"), _step(1, "visit")]
    ctx = StepContext(YES_NO, steps, [_obs(1, "visit", evidence, ["z"])], 2, False, 64, TOOLS, scoring=True)
    driver = GuidedDriver()
    model = ScoringChatModel(script=["Check ages", "Hank Snow birth"], option_logprobs={"yes": -0.5, "no": -0.9})
    turn = asyncio.run(generate_turn(model, [], driver.plan(ctx), sampling=Sampling(temperature=0)))
    # "yes" held 60% of the mass: not sure enough to answer, and no entity to search from.
    assert "bridge" not in turn.segments
    assert parse_action(turn.text)["arguments"] == {"query": "Hank Snow birth"}
    later = StepContext(
        YES_NO, [*steps, _step(2, "search"), _step(3, "visit")], ctx.observations, 4, False, 64, TOOLS, scoring=True
    )
    assert driver.question(later) == YES_NO
    assert [s.options for s in driver.plan(later) if isinstance(s, Choose)] == [("yes", "no")]


def test_an_either_or_question_is_asked_as_it_is_whatever_was_recorded_as_a_bridge():
    question = "Which came first the forming of The Dandy Warhols or the birth of Robert Young?"
    evidence = "The Dandy Warhols are a band formed in 1994. Robert Young was born in 1907."
    steps = [_step(0, "search"), _step(1, "visit"), _step(2, "search", bridge="Dandy Warhols"), _step(3, "visit")]
    ctx = StepContext(question, steps, [_obs(3, "visit", evidence, ["w"])], 4, False, 64, TOOLS, scoring=True)
    driver = GuidedDriver()
    assert driver.question(ctx) == question
    assert [s.options for s in driver.plan(ctx) if isinstance(s, Choose)] == [("Dandy Warhols", "Robert Young")]


async def test_a_yes_no_rollout_keeps_its_question_and_answers_yes_or_no(tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    docs = [
        {"id": "hl", "title": "Hello Love", "text": "Hello Love is a 1974 album by Hank Snow."},
        {"id": "hs", "title": "Hank Snow", "text": "Hank Snow was born in 1914 in Nova Scotia."},
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    script = ["Find the album", "Hello Love album", "Open it", "Check age", "Hank Snow", "Open", "Done", "x", "y"]
    model = ScoringChatModel(script=script, option_logprobs={"yes": -0.6, "no": -0.8})
    runner = RolloutRunner(model, make_corpus_tools(CorpusIndex.from_jsonl(path)), driver=GuidedDriver())
    traj = await runner.run(YES_NO, trajectory_id="t", thread_id="yn/t", config=ParallelMuseConfig(temperature=0))
    queries = [s["action"]["arguments"]["query"] for s in traj["steps"] if s["action"].get("name") == "search"]
    assert len(queries) > 1 and not any(q.lower().startswith(("yes", "no")) for q in queries)
    assert not any("bridge" in s for s in traj["steps"])
    assert traj["answer"] in ("yes", "no")


def test_a_failed_visit_leaves_the_bridge_to_the_search_snippets():
    question = "What is the name of the waterfall in the country where the Bubye River is found?"
    found = _obs(
        0,
        "search",
        "[1] Bubye River (id: https://x/bubye)\nThe Bubye River is a river in Zimbabwe.",
        ["https://x/bubye"],
    )
    failed = _obs(1, "visit", "Error: visit https://x/bubye failed (HTTP 403 from x).", [], error=True)
    ctx = StepContext(
        question, [_step(0, "search"), _step(1, "visit")], [found, failed], 2, False, 64, TOOLS, scoring=True
    )
    driver = GuidedDriver()
    assert "Zimbabwe" in driver.evidence(ctx, opened=True)
    choose = driver.plan(ctx)[-1]
    assert isinstance(choose, Choose) and "Zimbabwe" in choose.options


def test_search_markup_is_dropped_from_the_evidence_even_around_an_id_with_parentheses():
    content = (
        "[1] Mercury (planet) - Wikipedia (id: https://en.wikipedia.org/wiki/Mercury_(planet))\n"
        "Mercury is the smallest planet in the Solar System.\n\n"
        "[2] Hello Love (id: Hello_Love_(album))\nHello Love is an album by Hank Snow."
    )
    ids = ["https://en.wikipedia.org/wiki/Mercury_(planet)", "Hello_Love_(album)"]
    ctx = StepContext("Who performed Hello Love?", [], [_obs(0, "search", content, ids)], 1, False, 64, TOOLS)
    evidence = GuidedDriver().evidence(ctx)
    assert evidence.splitlines()[0] == "Mercury (planet) - Wikipedia" and "Hello Love\n" in evidence
    assert "(id:" not in evidence and "[1]" not in evidence
    assert not [c for c in candidates("Which planet is smallest?", evidence) if "_" in c]


def test_a_bridge_from_evidence_with_a_tab_still_makes_a_valid_tool_call():
    evidence = 'Her best known song was "Blue\tMoon Rising", recorded on 12\tMay 1974 in Nashville.'
    ctx = StepContext("What song made the singer famous?", [], [], 2, False, 64, TOOLS, scoring=True)
    driver = GuidedDriver()
    for option in candidates("What song made the singer famous?", evidence):
        model = ScoringChatModel(script=[" lyrics"])
        segments = driver.search(ctx, bridge=Pick(0, option, (), (0.0,), (1.0,)))
        turn = asyncio.run(generate_turn(model, [], segments, sampling=Sampling(temperature=0)))
        assert parse_action(turn.text) == {
            "type": "tool_call",
            "name": "search",
            "arguments": {"query": option + " lyrics"},
        }
