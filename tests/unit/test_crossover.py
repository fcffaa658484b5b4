"""Crossover of paths: the pair, the lineage, the merged context (only what the parents read), the budget."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.answers import normalize_vote_key
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.crossover import crossover_job, crossover_stage, crossover_wave, pick_pairs
from langgraph_parallelmuse.driver import EVIDENCE_SYSTEM, QUERY_SYSTEM, GuidedDriver
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.lineage import scratch_job
from langgraph_parallelmuse.protocol import FINAL_TURN_NOTE, format_tool_response
from langgraph_parallelmuse.schedule import partial_rollout
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    agent_step,
    answer_text,
    call_text,
    make_tools,
    research_responder,
    role_of,
)
from tests.unit.test_facts import trajectories
from tests.unit.test_infograph import answer, hits, opened, search, visit

QUESTION = "Where is the thing?"
DOCS = {
    "Alpha": "Alpha is in Paris.",
    "Beta": "Beta is in Lyon.",
    "Delta": "Delta is in Rome.",  # a tool shows it only to a query neither parent made
}


def corpus_search(query: str) -> str:
    name = next((n for n in DOCS if n in query), "Delta")
    shown = [(name.lower(), name, DOCS[name]), ("g", "Gamma", "Gamma is a dead end.")]
    return "\n\n".join(f"[{i}] {title} (id: {doc})\n{text}" for i, (doc, title, text) in enumerate(shown, 1))


def _answer_from(text: str) -> str:
    return "Paris" if "Alpha is in Paris" in text else "Lyon" if "Beta is in Lyon" in text else "Rome"


def agent(queries):
    """Step 0 searches the next of ``queries``; later steps answer from what the conversation holds."""
    order = itertools.cycle(queries)

    def step(index, messages):
        if index == 0:
            return call_text("search", query=next(order))
        return answer_text(_answer_from(" ".join(str(m.content) for m in messages)))

    return step


def _graph(config, queries=("Alpha", "Beta")):
    model = ScriptedChatModel(responder=research_responder(agent(queries)))
    tools, calls = make_tools(search=corpus_search)
    return create_parallelmuse(model, tools, config=config), model, calls


async def test_a_crossover_names_both_parents_and_sees_only_what_they_read():
    graph, model, calls = _graph({"n": 3, "mode": "none", "crossover": 1, "seed": 0})
    out = await graph.ainvoke({"question": QUESTION})

    by_id = {t["id"]: t for t in out["trajectories"]}
    assert Counter(t["origin"]["kind"] for t in out["trajectories"]) == {"initial": 1, "fill": 1, "crossover": 1}
    cross = by_id["x0"]
    origin = cross["origin"]
    assert set(origin["parents"]) == {"t0", "f0"} and origin["reason"] == "disagree"
    assert origin["parent_threads"] == [by_id[p]["thread_id"] for p in origin["parents"]]
    assert origin["parent"] == origin["parents"][0] and origin["parent_steps"] == [[0], [0]]
    # The merged context is the parents' evidence steps; the crossover only answered.
    assert [s["action"]["arguments"]["query"] for s in cross["steps"][:2]] == [
        by_id[p]["steps"][0]["action"]["arguments"]["query"] for p in origin["parents"]
    ]
    assert cross["steps"][2]["action"]["type"] == "answer" and cross["answer"] == "Paris"
    assert cross["stats"]["tool_calls"] == 0 and len(calls["search"]) == 2
    assert cross["stats"]["generated_tokens"] == cross["steps"][2]["generated_tokens"]
    # Its prompt: the question and the parents' steps and tool responses, nothing else.
    (prompt,) = [
        c["messages"] for c in model.calls if role_of(c["messages"]) == "agent" and agent_step(c["messages"]) == 2
    ]
    parents_read = {format_tool_response(o["content"]) for p in origin["parents"] for o in by_id[p]["observations"]}
    shown = {
        m.content.removesuffix("\n" + FINAL_TURN_NOTE) for m in prompt[1:] if m.content.startswith("<tool_response>")
    }
    assert shown == parents_read
    assert all("Delta" not in str(m.content) for m in prompt)
    # Its report is read with the others; the run's stats say how the reserved slot was used.
    assert {r["trajectory_id"] for r in out["reports"]} == {"t0", "f0", "x0"}
    assert out["answer"] == "Paris"
    assert out["stats"]["crossover"]["trajectories"] == 1 and out["stats"]["crossover"]["fills"] == 0
    assert out["stats"]["budget"]["crossover_reserved"] == 1
    assert set(out["stats"]["infograph"]["per_trajectory"]) == {"t0", "f0", "x0"}


async def test_a_slot_no_pair_takes_runs_a_fill_so_the_run_keeps_its_budget():
    graph, _, _ = _graph({"n": 3, "mode": "none", "crossover": 1}, queries=("Alpha",))
    out = await graph.ainvoke({"question": QUESTION})
    # Both trajectories agree on the same evidence: nothing to cross.
    assert sorted(t["id"] for t in out["trajectories"]) == ["f0", "f1", "t0"]
    assert out["stats"]["crossover"]["fills"] == 1 and out["stats"]["crossover"]["pairs"] == []
    assert len(out["reports"]) == 3


async def test_a_run_where_nothing_answered_still_runs_its_crossover_slots_as_fills():
    def never_answers(index, messages):
        return call_text("search", query="Alpha")

    tools, _ = make_tools(search=lambda q: "[1] Alpha (id: a)\nAlpha is in Paris.")
    model = ScriptedChatModel(responder=research_responder(never_answers))
    graph = create_parallelmuse(model, tools, config={"n": 3, "mode": "none", "crossover": 1, "max_turns": 2})
    out = await graph.ainvoke({"question": QUESTION})
    # Before the fix the run skipped the crossover stage and ended with N - C trajectories.
    assert sorted(t["id"] for t in out["trajectories"]) == ["f0", "f1", "t0"]
    assert out["stats"]["crossover"]["fills"] == 1 and out["stats"]["crossover"]["trajectories"] == 0


async def test_with_branching_the_rollout_stage_leaves_the_crossover_slots_free():
    graph, _, _ = _graph({"n": 8, "crossover": 1, "seed": 0})
    out = await graph.ainvoke({"question": QUESTION})
    kinds = Counter(t["origin"]["kind"] for t in out["trajectories"])
    assert len(out["trajectories"]) == 8 and kinds["initial"] == 1 and kinds["branch"] > 0
    assert out["stats"]["rollout"]["trajectories"] == 7
    assert kinds["crossover"] == 1 and out["stats"]["crossover"]["fills"] == 0


async def test_online_branching_also_leaves_the_crossover_slots_free():
    graph, _, _ = _graph({"n": 4, "k": 1, "t": 2, "branching": "online", "crossover": 1, "seed": 0})
    out = await graph.ainvoke({"question": QUESTION})
    assert out["stats"]["rollout"]["trajectories"] == 3 and len(out["trajectories"]) == 4


@pytest.mark.parametrize("crossover", [0, 1])
async def test_graph_shaped_reports_are_what_the_aggregator_reads(crossover):
    graph, model, _ = _graph({"n": 3, "mode": "none", "report_form": "graph", "crossover": crossover})
    out = await graph.ainvoke({"question": QUESTION})
    roles = Counter(role_of(c["messages"]) for c in model.calls)
    assert roles["compress"] == 0 and roles["graph_report"] == len(out["reports"]) == 3
    assert all(r["text"].startswith("Evidence:\ns") for r in out["reports"])
    (aggregate,) = [c["messages"] for c in model.calls if role_of(c["messages"]) == "aggregate"]
    assert aggregate[-1].content.count("Evidence:\ns") == 3
    assert Counter(t["origin"]["kind"] for t in out["trajectories"])["crossover"] == crossover
    assert out["answer"] in ("Paris", "Lyon")


def _guided_responder(queries):
    order = iter(queries)

    def respond(messages):
        system = messages[0].content
        if system == QUERY_SYSTEM:
            return next(order, "Delta")
        if system == EVIDENCE_SYSTEM:
            return _answer_from(messages[-1].content)
        return "I should check the evidence"

    return respond


async def test_a_guided_crossover_answers_from_its_parents_evidence_alone(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": n.lower(), "title": n, "text": t}) + "\n" for n, t in DOCS.items())
        + json.dumps({"id": "g", "title": "Gamma", "text": "Gamma is a dead end."})
        + "\n"
    )
    search_tool, visit_tool = make_corpus_tools(CorpusIndex.from_jsonl(corpus, cache_dir=tmp_path), k=2)
    model = ScriptedChatModel(responder=_guided_responder(["Alpha", "Beta"]))
    runner = RolloutRunner(model, [search_tool, visit_tool], driver=GuidedDriver(hops=1))
    config = make_config(n=3, mode="none", crossover=1, seed=0)
    parents, _ = await partial_rollout(runner, QUESTION, config=config, run_id="r")
    before = len(model.calls)
    (cross,), (pair,) = await crossover_stage(runner, QUESTION, parents, config=config, run_id="r")

    assert set(pair["parents"]) == {"t0", "f0"} and pair["reason"] == "disagree"
    assert cross["origin"]["parents"] == pair["parents"] and cross["answer"] == "Paris"
    assert cross["stats"]["tool_calls"] == 0
    # Every model call of the crossover holds both parents' evidence and nothing they did not read.
    during = [" ".join(str(m.content) for m in c["messages"]) for c in model.calls[before:]]
    assert during and any("Alpha is in Paris" in d and "Beta is in Lyon" in d for d in during)
    assert not any("Delta" in d for d in during)


def _traj(tid, query, answer_text_, doc):
    return {
        "id": tid,
        "thread_id": f"r/{tid}",
        "origin": {"kind": "initial"},
        "steps": [search(0, query), answer(1, answer_text_)],
        "observations": [hits(0, (doc.lower(), doc, DOCS.get(doc, f"{doc} is in {answer_text_}.")))],
        "answer": answer_text_,
    }


def test_pairs_disagreeing_come_first_then_complementary_evidence():
    a = _traj("a", "Alpha", "Paris", "Alpha")
    b = _traj("b", "Alpha2", "Paris", "Alpha2")
    c = _traj("c", "Beta", "Lyon", "Beta")
    unsupported = {**_traj("d", "Beta", "Oslo", "Beta")}
    pairs = pick_pairs(QUESTION, [a, b, c, unsupported], count=3)
    assert [(p["parents"], p["reason"]) for p in pairs] == [
        (["a", "c"], "disagree"),
        (["b", "c"], "disagree"),
        (["a", "b"], "evidence"),
    ]
    assert pick_pairs(QUESTION, [a, a], count=1) == []  # the same evidence: nothing to gain
    assert pick_pairs(QUESTION, [a, c], count=0) == []


def test_tied_pairs_are_taken_in_lineage_order():
    # Ids were sorted as text: "t10" came before "t2", unlike the votes' lineage order.
    t2, t10 = _traj("t2", "Alpha", "Paris", "Alpha"), _traj("t10", "Alpha2", "Paris", "Alpha2")
    c = _traj("t3", "Beta", "Lyon", "Beta")
    assert [p["parents"] for p in pick_pairs(QUESTION, [t10, c, t2], count=1)] == [["t2", "t3"]]


def test_a_crossover_is_never_a_parent():
    a, c = _traj("a", "Alpha", "Paris", "Alpha"), _traj("c", "Beta", "Lyon", "Beta")
    x = {**_traj("x0", "Beta", "Rome", "Beta"), "origin": {"kind": "crossover"}}
    assert [p["parents"] for p in pick_pairs(QUESTION, [a, c, x], count=5)] == [["a", "c"]]


async def test_a_crossover_stage_fill_never_resumes_the_thread_of_a_cancelled_fill():
    slow = {"on": True}

    def responder(messages):
        if agent_step(messages) == 0:
            return call_text("search", query="Alpha")
        return Reply(answer_text("Paris"), delay=30 if slow["on"] else 0)

    tools, _ = make_tools(search=corpus_search)
    runner = RolloutRunner(ScriptedChatModel(responder=responder), tools)
    config = make_config({"n": 8, "mode": "none", "crossover": 1})
    # What a consensus stop leaves: f2 cancelled after its first step, f1 dropped before any.
    task = asyncio.ensure_future(runner.run_job(scratch_job("fill", 2, run_id="r"), question=QUESTION, config=config))
    while not (await runner.snapshot("r/f2"))["steps"]:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    cancelled = {**await runner.snapshot("r/f2"), "status": "cancelled"}
    rollout = [{"id": t, "origin": {"kind": k}, "answer": None} for t, k in (("t0", "initial"), ("f0", "fill"))]
    rollout.append(cancelled)
    slow["on"] = False
    (fresh,), _ = await crossover_stage(runner, QUESTION, rollout, config=config, run_id="r")
    # Before the fix the fill was numbered by counting fills: f2, which resumed the cancelled thread.
    assert fresh["id"] == "f3" and fresh["thread_id"] == "r/f3"
    assert fresh["origin"]["kind"] == "fill" and fresh["answer"] == "Paris"
    assert (await runner.snapshot("r/f2"))["steps"] == cancelled["steps"]


async def test_no_crossover_or_fill_starts_after_a_consensus_stop():
    """Once the answers agree no more trajectories start: the reserved slots ran fills after the stop."""

    def agrees(index, messages):
        return call_text("search", query="Alpha") if index == 0 else answer_text("Paris")

    tools, _ = make_tools(search=lambda q: "[1] Alpha (id: a)\nAlpha is in Paris.")
    model = ScriptedChatModel(responder=research_responder(agrees))
    config = {"n": 8, "k": 1, "t": 1, "branching": "online", "consensus": 0.6, "crossover": 2, "seed": 0}
    out = await create_parallelmuse(model, tools, config=config).ainvoke({"question": QUESTION})
    assert len(out["trajectories"]) == out["stats"]["rollout"]["trajectories"]
    cross = out["stats"]["crossover"]
    assert (cross["skipped"], cross["trajectories"], cross["fills"], cross["pairs"]) == ("consensus", 0, 0, [])
    # The benchmarks' stage without the graph stops too.
    runner = RolloutRunner(model, tools)
    settings = make_config(config)
    assert await crossover_stage(runner, QUESTION, out["trajectories"], config=settings, run_id="r") == ([], [])


def _lineage(tid, answer_text_, *, kind="initial"):
    """A search and a visit of the same page, both leading to the answer (two effective steps)."""
    page = "Alpha is in Paris, near Lyon."
    return {
        "id": tid,
        "thread_id": f"r/{tid}",
        "origin": {"kind": kind},
        "steps": [search(0, "Alpha"), visit(1, "a"), answer(2, answer_text_)],
        "observations": [hits(0, ("a", "Alpha", page)), opened(1, "a", "Alpha", page)],
        "answer": answer_text_,
    }


def test_a_pair_one_parent_of_which_adds_nothing_comes_last_and_its_lineage_says_so():
    """A branch and its parent read the same evidence and disagreed: crossed first, the merged context
    held the parent's steps alone while the lineage listed the branch's as taken too."""
    parent, branch = _lineage("t0", "Paris"), _lineage("t0.s1.b0", "Lyon", kind="branch")
    other = _traj("f0", "Gamma", "Rome", "Gamma")  # one effective step: ranked below the two above
    pairs = pick_pairs(QUESTION, [parent, branch, other], count=3)
    assert [(p["parents"], p["reason"]) for p in pairs] == [
        (["t0", "f0"], "disagree"),
        (["t0.s1.b0", "f0"], "disagree"),
        (["t0", "t0.s1.b0"], "disagree"),
    ]
    origin = crossover_job(pairs[2], [parent, branch, other], 0, run_id="r")["origin"]
    assert origin["parent_steps"] == [[0, 1], []] and origin["step"] == 2
    origin = crossover_job(pairs[0], [parent, branch, other], 0, run_id="r")["origin"]
    assert origin["parent_steps"] == [[0, 1], [0]] and origin["step"] == 3


def _plain_search(query: str) -> str:
    name = next((n for n in DOCS if n in query), "Delta")
    return f"{name}: {DOCS[name]}\nGamma: Gamma is a dead end."


@pytest.mark.parametrize(("settings", "uses"), [({"report_form": "graph"}, "report_form='graph'"), ({}, "crossover")])
async def test_a_run_whose_tools_the_graph_cannot_read_warns_instead_of_crossing_nothing(settings, uses):
    """Any tools named search/visit run, but the graph reads only its format: with plain-text results
    every graph report said "no document read leads to the answer" and no pair was found, silently."""
    model = ScriptedChatModel(responder=research_responder(agent(("Alpha", "Beta"))))
    tools, _ = make_tools(search=_plain_search)
    graph = create_parallelmuse(model, tools, config={"n": 3, "mode": "none", "crossover": 1, **settings})
    with pytest.warns(UserWarning, match=rf"{re.escape(uses)}.* found no document in any trajectory's tool output"):
        out = await graph.ainvoke({"question": QUESTION})
    assert out["stats"]["crossover"]["pairs"] == [] and out["stats"]["crossover"]["fills"] == 1


def test_a_crossover_keeps_one_parents_chain_of_bridges():
    # Two chains read as one put parent B's bridge for the first phrase in place of the second:
    # the crossover answered "How many stores are in Hank Snow?".
    from langgraph_parallelmuse.driver import GuidedDriver, StepContext
    from langgraph_parallelmuse.infograph import merge_context

    def search(i, query, bridge=None):
        step = {
            "index": i,
            "text": f"<think>t{i}</think>",
            "action": {"type": "tool_call", "name": "search", "arguments": {"query": query}},
        }
        return {**step, "bridge": bridge} if bridge else step

    def seen(i, text):
        return {"step": i, "name": "search", "arguments": {}, "content": text, "error": False, "seconds": 0.0}

    a = (
        [search(0, "Hello Love album"), search(1, "Hank Snow home", bridge="Hank Snow")],
        [seen(0, "Hello Love is an album by Hank Snow."), seen(1, "Hank Snow lived in Tennessee.")],
        [0, 1],
    )
    b = (
        [
            search(0, "Hello Love performer"),
            search(1, "Hank Snow residence", bridge="Hank Snow"),
            search(2, "Tennessee stores", bridge="Tennessee"),
        ],
        [
            seen(0, "Hello Love is an album by Hank Snow."),
            seen(1, "Hank Snow lived in Tennessee."),
            seen(2, "Tennessee has 4,000 stores."),
        ],
        [0, 1, 2],
    )
    steps, observations = merge_context([a, b])
    assert [s.get("bridge") for s in steps] == [None, None, None, "Hank Snow", "Tennessee"]
    question = "How many stores are in the state where Hello Love's performer lived?"
    ctx = StepContext(question, steps, observations, len(steps), True, 64)
    assert GuidedDriver().question(ctx) == "How many stores are in Tennessee?"


def test_a_merge_of_no_parents_is_empty():
    from langgraph_parallelmuse.infograph import merge_context

    assert merge_context([]) == ([], [])


KINDS = {"initial": "t", "fill": "f", "branch": "b", "crossover": "x"}


@st.composite
def rollouts(draw: st.DrawFn) -> list[dict]:
    """Rollout trajectories of any kind (a crossover one from an earlier stage too) over generated records."""
    out = []
    for i in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(sorted(KINDS)))
        tid = f"{KINDS[kind]}{i}"
        traj = {**draw(trajectories()), "id": tid, "thread_id": f"r/{tid}", "origin": {"kind": kind}}
        out.append({**traj, "status": "answered" if traj["answer"] else "no_answer"})
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([QUESTION, "Paris", "Where was Stephen King born?"]), rollouts(), st.integers(0, 4))
def test_pairs_never_repeat_or_pair_a_trajectory_with_itself_and_every_slot_runs(question, trajs, count):
    """A guard (property test): the pairing's promises hold on any lineage of rollouts."""
    by_id = {t["id"]: t for t in trajs}
    pairs = pick_pairs(question, trajs, count=count)
    assert len(pairs) <= count
    assert len({frozenset(p["parents"]) for p in pairs}) == len(pairs)
    for pair in pairs:
        parents = [by_id[p] for p in pair["parents"]]
        assert len(set(pair["parents"])) == 2 and all(pair["steps"])
        assert all(p["origin"]["kind"] != "crossover" and normalize_vote_key(p["answer"]) for p in parents)
    config = make_config(n=count + 2, mode="none", crossover=count)
    jobs = crossover_wave(trajs, pairs, config, run_id="r")
    # Every reserved slot runs, under an id of its own: a fill never takes a thread that ran.
    assert len(jobs) == count and len({j["id"] for j in jobs}) == count
    assert not {j["id"] for j in jobs if j["origin"]["kind"] == "fill"} & set(by_id)
