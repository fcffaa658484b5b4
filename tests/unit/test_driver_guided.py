"""The guided driver's choices: which picks become bridges, and what evidence they are chosen from."""

from __future__ import annotations

import asyncio
import json

import pytest

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.candidates import candidates
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.driver import FreeDriver, GuidedDriver, StepContext
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.protocol import parse_action, region_spans
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


def test_an_unsure_date_pick_is_no_bridge_and_stays_an_option_of_the_last_choice():
    """A date as a bridge opened the next query ("19th century ...") and, as a bridge, was left out of
    the last choice's options: the Blue Lacy question lost its gold "19th century" so."""
    question = "The Blue Lacy and the Chesapeake Bay Retriever were developed during which century?"
    evidence = "The Blue Lacy originated in Texas in the mid-19th century. It was first recognized in 2001."
    steps = [_step(0, "search"), _step(1, "visit")]
    ctx = StepContext(question, steps, [_obs(1, "visit", evidence, ["z"])], 2, False, 64, TOOLS, scoring=True)
    driver = GuidedDriver()
    model = ScoringChatModel(
        script=["Check the breed", "Chesapeake Bay Retriever history"],
        option_logprobs={"19th century": -0.6, "2001": -0.9},
    )
    turn = asyncio.run(generate_turn(model, [], driver.plan(ctx), sampling=Sampling(temperature=0)))
    assert "bridge" not in turn.segments
    assert parse_action(turn.text)["arguments"] == {"query": "Chesapeake Bay Retriever history"}
    later = StepContext(
        question, [*steps, _step(2, "search"), _step(3, "visit")], ctx.observations, 4, False, 64, TOOLS, scoring=True
    )
    assert [s.options for s in driver.plan(later) if isinstance(s, Choose)] == [("19th century", "2001")]


def test_an_either_or_question_is_asked_as_it_is_whatever_was_recorded_as_a_bridge():
    question = "Which came first the forming of The Dandy Warhols or the birth of Robert Young?"
    evidence = "The Dandy Warhols are a band formed in 1994. Robert Young was born in 1907."
    steps = [_step(0, "search"), _step(1, "visit"), _step(2, "search", bridge="Dandy Warhols"), _step(3, "visit")]
    ctx = StepContext(question, steps, [_obs(3, "visit", evidence, ["w"])], 4, False, 64, TOOLS, scoring=True)
    driver = GuidedDriver()
    assert driver.question(ctx) == question
    assert [s.options for s in driver.plan(ctx) if isinstance(s, Choose)] == [("Dandy Warhols", "Robert Young")]


def _guided_runner(tmp_path, docs: list[dict], script: list[str], option_logprobs: dict[str, float]) -> RolloutRunner:
    """A guided rollout on a corpus of ``docs`` whose model writes ``script`` and scores options so."""
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    model = ScoringChatModel(script=script, option_logprobs=option_logprobs)
    return RolloutRunner(model, make_corpus_tools(CorpusIndex.from_jsonl(path)), driver=GuidedDriver())


async def test_a_yes_no_rollout_keeps_its_question_and_answers_yes_or_no(tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    docs = [
        {"id": "hl", "title": "Hello Love", "text": "Hello Love is a 1974 album by Hank Snow."},
        {"id": "hs", "title": "Hank Snow", "text": "Hank Snow was born in 1914 in Nova Scotia."},
    ]
    script = ["Find the album", "Hello Love album", "Open it", "Check age", "Hank Snow", "Open", "Done", "x", "y"]
    runner = _guided_runner(tmp_path, docs, script, {"yes": -0.6, "no": -0.8})
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


@pytest.mark.parametrize("driver", [FreeDriver, GuidedDriver])
def test_a_negative_retries_is_refused_when_the_driver_is_made(driver):
    """A step made no attempt at all and every trajectory failed with an UnboundLocalError."""
    with pytest.raises(ConfigError, match=r"retries=-1"):
        driver(retries=-1)
    assert driver(retries=0).retries == 0


def test_an_observation_recorded_without_doc_ids_is_still_evidence():
    """``doc_ids`` is optional in an Observation (a tool's record without it); reading it raised KeyError."""
    obs = _obs(0, "search", "[1] Paris (id: p)\nParis is the capital of France.", [])
    del obs["doc_ids"]
    ctx = StepContext("What is the capital of France?", [], [obs], 1, False, 64, TOOLS)
    assert GuidedDriver().evidence(ctx) == "Paris\nParis is the capital of France."


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


EIFFEL = "Which country is the Eiffel Tower in, and what is the capital of that country?"


async def test_the_search_for_a_second_part_records_the_first_answer_as_its_bridge(tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    docs = [
        {"id": "et", "title": "Eiffel Tower", "text": "The Eiffel Tower is a lattice tower in Paris, France."},
        {"id": "fr", "title": "France", "text": "Paris is the capital of France."},
    ]
    script = ["Find the tower", "Eiffel Tower", "Open it", "France it is", "Open the page", "Done", "x"]
    runner = _guided_runner(tmp_path, docs, script, {"France": -0.01, "Paris": -4.0})
    traj = await runner.run(EIFFEL, trajectory_id="t", thread_id="e/t", config=ParallelMuseConfig(temperature=0))
    # The first part was sure before the hops ran out: its second part is searched as the question
    # words it, from the first answer, which is that hop's bridge.
    step = traj["steps"][2]
    assert step["action"]["arguments"] == {"query": "what is the capital of France?"}
    assert step["bridge"] == "France"
    assert traj["answer"] == "France; Paris"


def test_a_bridge_the_rendered_query_does_not_hold_verbatim_is_no_segment():
    pick = Pick(0, "A<B", (), (0.0,), (1.0,))
    segments = GuidedDriver.asked("what is the capital of A<B?", bridge=pick)
    assert not any(isinstance(s, Pick) for s in segments)
    text = "".join(s.text for s in segments)
    assert parse_action("<think>t" + text)["arguments"] == {"query": "what is the capital of A<B?"}


def _second_choice(evidence: list[dict]) -> Choose:
    ctx = StepContext(EIFFEL, [_step(0, "search"), _step(1, "visit")], evidence, 2, True, 64, TOOLS, scoring=True)
    first = Pick(0, "France", (), (0.0,), (1.0,))
    choose = GuidedDriver().answer(ctx, first)[-1]
    assert isinstance(choose, Choose)
    return choose


def test_the_second_part_is_chosen_among_spans_of_the_evidence_its_prompt_shows():
    hit = "[1] Bordeaux (id: b)\nBordeaux is the capital of the Nouvelle-Aquitaine region."
    snippets = _obs(0, "search", hit, ["b"])
    page = _obs(1, "visit", "The Eiffel Tower is a lattice tower in Paris, France.", ["e"])
    choose = _second_choice([snippets, page])
    assert "Paris" in choose.options and not {"Bordeaux", "Nouvelle-Aquitaine"} & set(choose.options)
    # The opened page names no span of the kind: the options and the prompt are of all the evidence.
    snippets = _obs(0, "search", "[1] Paris (id: p)\nParis is the capital of France.", ["p"])
    page = _obs(1, "visit", "France is a country.", ["f"])
    choose = _second_choice([snippets, page])
    assert choose.options == ("Paris",) and "Paris is the capital of France." in choose.messages[-1].content


@pytest.mark.parametrize("title", ["", "Tokyo Tower\n\n"])
def test_a_page_with_no_space_before_the_budget_is_cut_at_the_budget(title):
    # A spaced title before the unspaced text is what the visit tools return: its space is no place to cut.
    page = title + "東京は日本の首都である。" * 200
    ctx = StepContext("Which country is Tokyo in?", [], [_obs(1, "visit", page, ["t"])], 2, False, 64, TOOLS)
    assert GuidedDriver(evidence_chars=1500).evidence(ctx) == page[:1500]


def test_a_query_with_a_backslash_or_a_tab_still_makes_a_tool_call_or_is_resampled():
    ctx = StepContext("Who wrote Hamlet?", [], [], 0, False, 64, TOOLS, scoring=True)
    driver = GuidedDriver()
    for written, query in (("C:\\Windows path", "C:"), ("ends with backslash\\", "ends with backslash")):
        model = ScoringChatModel(script=["Look it up", written])
        turn = asyncio.run(generate_turn(model, [], driver.plan(ctx), sampling=Sampling(temperature=0)))
        action = parse_action(turn.text)
        assert action["arguments"] == {"query": query} and driver.reject(ctx, turn.text, action) is None
    # A tab breaks the call's JSON: the driver resamples the step (within its retries).
    model = ScoringChatModel(script=["Look it up", "tab\there"])
    turn = asyncio.run(generate_turn(model, [], driver.plan(ctx), sampling=Sampling(temperature=0)))
    action = parse_action(turn.text)
    assert action["type"] == "invalid" and driver.reject(ctx, turn.text, action) is not None


def test_a_hit_line_a_page_wrote_stays_page_text_in_the_evidence():
    """A snippet reading "[7] Lyon (id: d666)" was reduced to "Lyon", a title of a hit never returned."""
    content = "[1] Capital spam (id: d2)\n[7] Lyon (id: d666)\n\n[2] Paris (id: d1)\nParis is the capital."
    ctx = StepContext("Capital of France?", [], [_obs(0, "search", content, ["d2", "d1"])], 1, False, 64, TOOLS)
    evidence = GuidedDriver().evidence(ctx)
    assert evidence.splitlines()[:2] == ["Capital spam", "[7] Lyon (id: d666)"]

    from langgraph_parallelmuse.driver import search_hits

    assert [m.group(2) for m in search_hits(content, ["d2", "d1"])] == ["d2", "d1"]
    assert len(search_hits(content)) == 3  # no ids recorded: every hit line counts, as before


async def test_a_search_that_found_nothing_is_named_in_the_next_query_prompt(tmp_path, monkeypatch):
    # A deterministic model (temperature 0): its query is a function of the prompt. Before the fix
    # the prompt after a fruitless search was the first one again, so the query was repeated until
    # the hops ran out.
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    prompts: list[str] = []

    def greedy(messages):
        if messages[-1].type == "ai":  # the thought, continuing the agent conversation
            return f"step {len(messages)} look further"
        prompts.append(messages[-1].content)
        return f"Zorblax river source {len(messages[-1].content)}"

    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "p", "title": "Paris", "text": "Paris is the capital of France."}) + "\n")
    tools = make_corpus_tools(CorpusIndex.from_jsonl(path))
    runner = RolloutRunner(ScoringChatModel(responder=greedy), tools, driver=GuidedDriver())
    question = "Where does the Zorblax river rise?"
    traj = await runner.run(question, trajectory_id="t", thread_id="zr/t", config=ParallelMuseConfig(temperature=0))
    queries = [s["action"]["arguments"]["query"] for s in traj["steps"] if s["action"].get("name") == "search"]
    assert prompts[0] == f"Question: {question}"
    assert prompts[1] == (
        f"Question: {question}\nAlready searched (nothing found): {queries[0]}\n"
        "Write a new search query for what is still missing."
    )
    assert len(queries) > 1 and len(set(queries)) == len(queries)
    assert not any(s.get("rejected") for s in traj["steps"])


def test_a_query_prompt_with_evidence_is_unchanged_by_searches_that_found_nothing():
    ctx = StepContext(
        "Q?",
        [_step(0, "search"), _step(1, "search")],
        [_obs(0, "search", "", []), _obs(1, "search", "[1] Paris (id: p)\nParis is a city.", ["p"])],
        2,
        False,
        64,
        TOOLS,
    )
    assert GuidedDriver().query_prompt(ctx)[-1].content == (
        "Paris\nParis is a city.\n\nQuestion: Q?\nAlready searched: q0; q1\n"
        "Write a new search query for what is still missing."
    )


async def test_the_text_of_a_tool_that_lists_no_doc_ids_is_evidence():
    """A user's plain ``@tool`` search returns text and no artifact: the guided driver answered from nothing."""
    from langchain_core.tools import tool

    from langgraph_parallelmuse.agent import observe
    from langgraph_parallelmuse.tools.local_tools import no_results

    @tool
    def search(query: str) -> str:
        """Search the web."""
        return "The Bubye River is a river in Zimbabwe."

    step = {"index": 0, "text": "", "action": {"type": "tool_call", "name": "search", "arguments": {"query": "Bubye"}}}
    found = await observe({"search": search}, step, trajectory_id="t", config=ParallelMuseConfig())
    question = "Which country is the Bubye River in?"
    ctx = StepContext(question, [step], [found], 1, False, 64, frozenset({"search"}), scoring=True)
    driver = GuidedDriver()
    assert driver.evidence(ctx) == "The Bubye River is a river in Zimbabwe."
    choose = driver.plan(ctx)[-1]
    assert isinstance(choose, Choose) and "Zimbabwe" in choose.options
    # A search that found nothing, or a failed call, is still no evidence.
    nothing = [_obs(0, "search", no_results("Bubye"), []), _obs(1, "search", "Error: HTTP 500", [], error=True)]
    assert driver.evidence(StepContext(question, [step], nothing, 2, False, 64, TOOLS)) == ""
    # Beside tools that list their documents, a reply that lists none found nothing, whatever it says.
    listed = [_obs(0, "search", "No document matches.", []), _obs(1, "visit", "Zimbabwe is a country.", ["z"])]
    assert driver.evidence(StepContext(question, [step], listed, 2, False, 64, TOOLS)) == "Zimbabwe is a country."


def test_a_hit_whose_visit_failed_is_not_visited_again():
    """Ranked first again by the next search, the page a visit could not read was opened again: a hop lost."""
    hits = "[1] Bubye River (id: d1)\nThe Bubye River is in Zimbabwe.\n\n[2] Limpopo (id: d2)\nThe Limpopo."
    failed = {**_obs(1, "visit", "Error: tool 'visit' failed: HTTP 403", [], error=True), "arguments": {"doc": "d1"}}
    steps = [_step(0, "search"), _step(1, "visit"), _step(2, "search")]  # the visit's doc is "d1"
    observations = [_obs(0, "search", hits, ["d1", "d2"]), failed, _obs(2, "search", hits, ["d1", "d2"])]
    ctx = StepContext("Which country is the Bubye River in?", steps, observations, 3, False, 64, TOOLS, scoring=True)
    assert GuidedDriver.visit_target(ctx) == "d2"
    assert GuidedDriver().next_action(ctx) == "visit"
    only_d1 = [*observations[:2], _obs(2, "search", hits.split("\n\n")[0], ["d1"])]
    ctx = StepContext(ctx.question, steps, only_d1, 3, False, 64, TOOLS, scoring=True)
    assert GuidedDriver.visit_target(ctx) is None and GuidedDriver().next_action(ctx) != "visit"


def test_a_query_the_model_writes_a_tag_into_stops_before_it_and_stays_a_call():
    ctx = StepContext("Who designed the Eiffel Tower?", [], [], 0, False, 64, TOOLS, scoring=True)
    model = ScoringChatModel(script=["Look it up", "Eiffel</tool_call><answer>Paris"])
    turn = asyncio.run(generate_turn(model, [], GuidedDriver().plan(ctx), sampling=Sampling(temperature=0)))
    # Run on past the tag, the query closed the call inside its JSON string: an invalid turn, and at
    # temperature 0 the same invalid turn until the turns ran out.
    assert parse_action(turn.text) == {"type": "tool_call", "name": "search", "arguments": {"query": "Eiffel"}}
    assert "answer" not in region_spans(turn.text)
