"""Real-model tests of the agent and the full graph on the embedded default (SmolLM2, CPU).

Marked slow: a few minutes on 2 cores. Run with ``pytest -m slow``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from langgraph_parallelmuse import create_parallelmuse
from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.compress import parse_report
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.facts import step_facts
from langgraph_parallelmuse.infograph import build_graph, effective_subgraph, entity_key
from langgraph_parallelmuse.logprobs import tokens_in_span
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.protocol import neutralize
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

pytestmark = pytest.mark.slow

DOCS = [
    {
        "id": "d1",
        "title": "Eiffel Tower",
        "text": "The Eiffel Tower is a wrought-iron lattice tower on the "
        "Champ de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company "
        "designed and built the tower from 1887 to 1889.",
    },
    {
        "id": "d2",
        "title": "Gustave Eiffel",
        "text": "Alexandre Gustave Eiffel was a French civil engineer. He was born in Dijon in 1832.",
    },
    {"id": "d3", "title": "Louvre", "text": "The Louvre is the world's most-visited art museum, in Paris."},
]
QUESTION = "In which city was the engineer who gave his name to the Eiffel Tower born?"


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    import json

    path: Path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS))
    return make_corpus_tools(CorpusIndex.from_jsonl(path, cache_dir=path.parent))


@pytest.fixture(scope="module")
def model():
    return LocalChatModel.embedded()


@pytest.mark.timeout(600)
async def test_real_trajectory_records_aligned_finite_logprobs_per_region(model, tools):
    runner = RolloutRunner(model, tools)
    traj = await runner.run(
        QUESTION, trajectory_id="t0", thread_id="slow-agent", config=make_config(seed=3, max_turns=4)
    )
    assert traj["status"] in {"answered", "max_turns"}
    assert any(o["name"] == "search" and not o["error"] for o in traj["observations"])
    history = [s async for s in runner.graph.aget_state_history(runner._thread("slow-agent"))]
    assert sum(1 for s in history if s.next == ("think",)) == len(traj["steps"])  # one fork point per step
    for step in traj["steps"]:
        assert step["tokens"], "every step generated tokens with logprobs"
        for tok in step["tokens"]:
            assert math.isfinite(tok["logprob"]) and tok["logprob"] <= 0.0
            # Offsets line up with the step text (a token may hold only part of a character).
            assert step["text"][tok["start"] : tok["end"]] in tok["token"] or tok["token"] == ""
        assert tokens_in_span(step["tokens"], step["regions"]["reasoning"])
    search = next(s for s in traj["steps"] if s["action"].get("name") == "search")
    query_tokens = tokens_in_span(search["tokens"], search["regions"]["exploration"])
    assert "".join(t["token"] for t in query_tokens).strip() in search["action"]["arguments"]["query"]
    assert traj["uncertainty"][search["index"]]["exploration"] is not None


@pytest.mark.timeout(900)
async def test_full_graph_on_the_embedded_default_n4(model, tools):
    graph = create_parallelmuse(model, tools, config={"n": 4, "m": 1, "k": 1, "t": 2, "seed": 1, "max_turns": 4})
    events = []
    result = None
    async for mode, chunk in graph.astream({"question": QUESTION}, stream_mode=["custom", "values"]):
        if mode == "custom":
            events.append(chunk["event"])
        else:
            result = chunk
    assert len(result["trajectories"]) == 4
    kinds = sorted(t["origin"]["kind"] for t in result["trajectories"])
    assert kinds == ["branch", "branch", "fill", "initial"]
    branch = next(t for t in result["trajectories"] if t["origin"]["kind"] == "branch")
    parent = next(t for t in result["trajectories"] if t["origin"]["kind"] == "initial")
    cut = branch["origin"]["step"]
    assert branch["steps"][:cut] == parent["steps"][:cut]  # the shared prefix, not regenerated
    answered = [t for t in result["trajectories"] if t["answer"]]
    assert len(result["reports"]) == len(answered)
    # The guided reports' facts are the trajectories' records; the model wrote only the reasoning lines.
    by_id = {t["id"]: t for t in result["trajectories"]}
    for report in result["reports"]:
        traj = by_id[report["trajectory_id"]]
        sections, answer = parse_report(report["text"])
        assert sections["Solution methods"] == "; ".join(map(neutralize, step_facts(QUESTION, traj))), report["text"]
        assert answer == report["answer"] == " ".join(traj["answer"].split())
        effective = effective_subgraph(build_graph(QUESTION, traj))["entities"]
        assert all(f" {k} " in f" {entity_key(report['text'])} " for k in effective), report["text"]
    # The aggregator read the reports and picked one of their answers.
    assert result["answer_source"] == "aggregator"
    assert result["answer"] in {r["answer"] for r in result["reports"]}
    assert result["messages"][-1].content == result["answer"]
    assert {"trajectory_finished", "branch_picked", "answer"} <= set(events)
    # Each branch's first regenerated step was served the parent's prefix from the KV cache
    # (unrelated prompts sharing only the system prompt would not reach the fork point's length).
    for br in (t for t in result["trajectories"] if t["origin"]["kind"] == "branch"):
        first = br["steps"][br["origin"]["step"]]
        assert br["origin"]["prefix_tokens"] > 0
        assert first["cached_prompt_tokens"] >= br["origin"]["prefix_tokens"] - 16, (first, br["origin"])


@pytest.mark.timeout(900)
async def test_beyond_paper_options_on_the_real_model(model, tools, tmp_path):
    """Multi-round branching with sibling diversity, then a calibration fitted on those trajectories."""
    from langgraph_parallelmuse.calibration import Calibration
    from langgraph_parallelmuse.driver import call_key
    from langgraph_parallelmuse.schedule import partial_rollout

    runner = RolloutRunner(model, tools)
    cfg = make_config(n=6, m=1, k=1, t=2, rounds=2, diverse_branches=True, seed=5, max_turns=4)
    trajectories, picks = await partial_rollout(runner, QUESTION, config=cfg, run_id="slow-beyond")
    assert len(trajectories) == 6 and picks and picks[0]["round"] == 1
    by_id = {t["id"]: t for t in trajectories}
    for branch in (t for t in trajectories if t["origin"]["kind"] == "branch"):
        parent, step = by_id[branch["origin"]["parent"]], branch["origin"]["step"]
        assert branch["steps"][:step] == parent["steps"][:step]
        if branch["origin"]["round"] == 2:
            assert parent["origin"]["kind"] == "branch" and step > parent["origin"]["step"]
        # Diversity is wired on the real path: the calls taken at the fork point, read from the
        # checkpoints, hold the parent's and every sibling's (the resampling itself is unit-tested
        # with scripted replies).
        taken = await runner.taken_calls(branch["origin"], branch["thread_id"], cfg.t)
        for action in (parent["steps"][step]["action"], branch["steps"][step]["action"]):
            if action.get("type") == "tool_call":
                assert call_key(action) in taken

    with pytest.warns(UserWarning, match="few samples"):  # six trajectories of one question: enough to apply
        path = Calibration.fit([t["uncertainty"] for t in trajectories], quantile=0.5).save(tmp_path / "cal.json")
    # One fork of two branches is enough to see the threshold applied (and halves this test's time).
    calibrated = make_config(cfg, n=3, rounds=1, calibration=str(path))
    trajectories, picks = await partial_rollout(runner, QUESTION, config=calibrated, run_id="slow-calibrated")
    threshold = Calibration.load(path).thresholds["exploration"]
    assert len(trajectories) == 3
    assert all(p["score"] > threshold for p in picks)


@pytest.mark.timeout(900)
async def test_graph_shaped_reports_and_crossover_on_the_real_model(model, tools):
    from langgraph_parallelmuse.crossover import pick_pairs
    from langgraph_parallelmuse.driver import call_key
    from langgraph_parallelmuse.infograph import build_graph, effective_subgraph

    config = {"n": 3, "mode": "none", "seed": 2, "max_turns": 4, "report_form": "graph", "crossover": 1}
    result = await create_parallelmuse(model, tools, config=config).ainvoke({"question": QUESTION})
    by_id = {t["id"]: t for t in result["trajectories"]}
    assert len(by_id) == 3
    for report in result["reports"]:
        traj = by_id[report["trajectory_id"]]
        effective = effective_subgraph(build_graph(QUESTION, traj))
        assert all(e["name"] in report["text"] for e in effective["entities"].values()), report["text"]
        assert report["answer"] == " ".join(traj["answer"].split())
        assert report["text"].splitlines()[-2].startswith("Reasoning:")
    crossed = [t for t in by_id.values() if t["origin"]["kind"] == "crossover"]
    # n=3 with one slot reserved: the rollout ran t0 and f0; the slot went to a crossover exactly
    # when those two offered a pair, else to a from-scratch fill.
    pairs = pick_pairs(QUESTION, [by_id["t0"], by_id["f0"]], count=1)
    assert [x["origin"]["parents"] for x in crossed] == [p["parents"] for p in pairs]
    assert sorted(by_id) == sorted(["t0", "f0", "x0" if pairs else "f1"])
    assert result["stats"]["crossover"]["fills"] == 1 - len(pairs)
    for x in crossed:
        parents = [by_id[p] for p in x["origin"]["parents"]]
        assert len(parents) == 2 and x["stats"]["tool_calls"] == 0
        taken = {call_key(s["action"]) for p in parents for s in p["steps"]}
        assert all(call_key(s["action"]) in taken for s in x["steps"][: x["origin"]["step"]])
        assert x["steps"][-1]["action"]["type"] == "answer"
    assert result["answer"] in {r["answer"] for r in result["reports"]}
