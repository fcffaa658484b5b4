"""Answers chosen by the model's likelihood among spans of what the trajectory read, and hops that adapt."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import HumanMessage

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.candidates import answer_kind, candidates, choice_options
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.driver import GuidedDriver, StepContext
from langgraph_parallelmuse.errors import ProtocolError
from langgraph_parallelmuse.logprobs import tokens_in_span
from langgraph_parallelmuse.segments import Choose, Lit, Sampling, generate_turn
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
from tests.unit.fakes import ScoringChatModel

QUESTION = "In which city was the author of Harbor Lights born?"
DOCS = [
    {
        "id": "hl",
        "title": "Harbor Lights",
        "text": "Harbor Lights is a 1952 novel by Ellen Marsh. It is set in Boston and Maine.",
    },
    {
        "id": "em",
        "title": "Ellen Marsh",
        "text": "Ellen Marsh (born 1921) is a writer. She was born in Dublin, Ireland.",
    },
]
# Step by step: thought + query; thought (visit); thought (choice: unsure, so the bridge opens
# the query) + query continuation; thought (visit); thought (choice: sure, the answer).
SCRIPT = ["Find the novel", "Harbor Lights novel", "Open it", "Who wrote it", " birthplace", "Open her page", "Done"]
LOGPROBS = {"Ellen Marsh": -2.0, "Boston": -6.0, "Maine": -6.0, "Dublin": -0.1}


@pytest.fixture
def corpus_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return make_corpus_tools(CorpusIndex.from_jsonl(path))


async def _run(tools):
    model = ScoringChatModel(script=list(SCRIPT), option_logprobs=LOGPROBS)
    runner = RolloutRunner(model, tools, driver=GuidedDriver())
    traj = await runner.run(
        QUESTION, trajectory_id="t0", thread_id="choose/t0", config=ParallelMuseConfig(temperature=0)
    )
    return model, traj


async def test_an_unsure_choice_is_the_bridge_of_the_next_hop_and_a_sure_one_is_the_answer(corpus_tools):
    _, traj = await _run(corpus_tools)
    actions = [s["action"] for s in traj["steps"]]
    assert [a.get("name", a["type"]) for a in actions] == ["search", "visit", "search", "visit", "answer"]
    # The model's best span after the first hop held a third of the mass: it became the bridge.
    assert traj["steps"][2]["bridge"] == "Ellen Marsh"
    assert actions[2]["arguments"]["query"] == "Ellen Marsh birthplace"
    assert actions[3]["arguments"]["doc"] == "em"  # the bridge's search found the next document
    assert traj["answer"] == "Dublin" and "bridge" not in traj["steps"][4]


async def test_candidates_come_only_from_text_the_trajectory_had_read(corpus_tools):
    model, traj = await _run(corpus_tools)
    first, second = (json.dumps([m.content for m in messages]) for messages, _ in (model.scored[0], model.scored[-1]))
    scored_first = [text for messages, text in model.scored if json.dumps([m.content for m in messages]) == first]
    scored_second = [text for messages, text in model.scored if json.dumps([m.content for m in messages]) == second]
    read_by_step_2 = " ".join(o["content"] for o in traj["observations"][:2])
    read_by_step_4 = " ".join(o["content"] for o in traj["observations"][:4])
    assert scored_first and all(text in read_by_step_2 for text in scored_first)
    assert "Dublin" not in scored_first  # in the corpus, not yet read
    assert "Dublin" in scored_second and all(text in read_by_step_4 for text in scored_second)
    assert "Ellen Marsh" not in scored_second  # the first hop's bridge is a way to the answer, not the answer


async def test_the_chosen_answer_and_bridge_carry_the_scoring_logprobs_in_their_regions(corpus_tools):
    _, traj = await _run(corpus_tools)
    answer_step, bridge_step = traj["steps"][4], traj["steps"][2]
    answer_tokens = tokens_in_span(answer_step["tokens"], answer_step["regions"]["answer"])
    assert "".join(t["token"] for t in answer_tokens) == "Dublin"
    assert [t["logprob"] for t in answer_tokens] == [-0.1]
    call = tokens_in_span(bridge_step["tokens"], bridge_step["regions"]["exploration"])
    assert [t["logprob"] for t in call if t["token"] in ("Ellen", "Marsh")] == [-2.0, -2.0]


def test_a_question_asking_for_two_things_gets_two_chosen_spans():
    # The model likes the question's own subject best: it is not an answer of either part.
    model = ScoringChatModel(option_logprobs={"Eiffel Tower": -0.01, "France": -0.05, "Paris": -0.1})
    evidence = "The Eiffel Tower is a lattice tower in Paris, France. Paris is the capital of France."
    question = "Which country is the Eiffel Tower in, and what is the capital of that country?"
    read = {"step": 0, "name": "visit", "arguments": {}, "content": evidence, "error": False, "seconds": 0.0}
    driver = GuidedDriver()
    ctx = StepContext(question, [], [{**read, "doc_ids": ["e"]}], 1, True, 64, frozenset({"search"}), scoring=True)
    first = candidates("Which country is the Eiffel Tower in?", evidence)
    segments = [Choose(tuple(first), [HumanMessage(evidence)], then=lambda pick: driver.answer(ctx, pick))]
    turn = asyncio.run(generate_turn(model, [], segments, sampling=Sampling(temperature=0)))
    assert turn.text.endswith("<answer>France; Paris</answer>")
    second = {
        text for messages, text in model.scored if "Question: what is the capital of France?" in messages[-1].content
    }
    assert second and not second & {"Eiffel Tower", "France"}
    assert model.scored[-1][0][-1].content.endswith(
        "Question: what is the capital of France?\nAnswer with the name of the capital."
    )


def test_a_second_part_answered_before_the_hops_run_out_is_searched_for_first():
    # The first part settled early ("France"), the second was answered from what was read for the
    # first: the Eiffel Tower's search hits, where the 135M model took Sorbonne University for the
    # capital. Now the second part is searched as its own question, then answered.
    model = ScoringChatModel(option_logprobs={"France": -0.01, "Paris": -5.0}, script=["Look it up"])
    evidence = "The Eiffel Tower is a lattice tower in Paris, France. Sorbonne University is in Paris."
    question = "Which country is the Eiffel Tower in, and what is the capital of that country?"
    steps = [
        {"action": {"type": "tool_call", "name": "search", "arguments": {"query": "Eiffel Tower"}}},
        {"action": {"type": "tool_call", "name": "visit", "arguments": {"doc": "e"}}},
    ]
    read = {"step": 1, "name": "visit", "arguments": {}, "content": evidence, "error": False, "seconds": 0.0}
    ctx = StepContext(question, steps, [{**read, "doc_ids": ["e"]}], 2, False, 64, frozenset({"search"}), scoring=True)
    turn = asyncio.run(generate_turn(model, [], GuidedDriver().plan(ctx), sampling=Sampling(temperature=0)))
    call = json.loads(turn.text.split("<tool_call>", 1)[1].removesuffix("</tool_call>"))
    assert call == {"name": "search", "arguments": {"query": "what is the capital of France?"}}
    # Once a search has asked it, the second part is chosen from the evidence: the answer has both.
    asked = [*steps, {"action": {"type": "tool_call", "name": "search", "arguments": call["arguments"]}}]
    ctx = StepContext(question, asked, ctx.observations, 3, False, 64, frozenset({"search"}), scoring=True)
    model = ScoringChatModel(option_logprobs={"France": -0.01, "Paris": -5.0}, script=["Answer"])
    turn = asyncio.run(generate_turn(model, [], GuidedDriver().plan(ctx), sampling=Sampling(temperature=0)))
    assert turn.text.endswith("<answer>France; Paris</answer>")


def test_the_first_choice_of_a_question_asking_for_two_things_answers_its_first_part():
    evidence = "The Eiffel Tower is a lattice tower in Paris, France."
    read = {"step": 1, "name": "visit", "arguments": {}, "content": evidence, "error": False, "seconds": 0.0}
    question = "Which country is the Eiffel Tower in, and what is the capital of that country?"
    steps = [{"action": {"type": "tool_call", "name": n, "arguments": {}}} for n in ("search", "visit")]
    ctx = StepContext(question, steps, [{**read, "doc_ids": ["e"]}], 2, False, 64, frozenset({"search"}), scoring=True)
    choose = GuidedDriver().plan(ctx)[-1]
    assert isinstance(choose, Choose) and "France" in choose.options
    assert choose.messages[-1].content.endswith(
        "Question: Which country is the Eiffel Tower in?\nAnswer with the name of the country."
    )


def test_an_unsure_first_pick_of_a_question_asking_for_two_things_stays_a_candidate():
    # The first hop's pick was unsure, so it opened the next query (its bridge); it may still be the
    # first part's answer. In a plain two-hop question the bridge is left out (the test above).
    evidence = "The Eiffel Tower is a lattice tower in Paris, France. Notre-Dame de Paris is a cathedral."
    read = {"step": 1, "name": "visit", "arguments": {}, "content": evidence, "error": False, "seconds": 0.0}
    question = "Which country is the Eiffel Tower in, and what is the capital of that country?"
    steps = [
        {"action": {"type": "tool_call", "name": "search", "arguments": {}}},
        {"action": {"type": "tool_call", "name": "visit", "arguments": {}}},
        {"action": {"type": "tool_call", "name": "search", "arguments": {}}, "bridge": "France"},
        {"action": {"type": "tool_call", "name": "visit", "arguments": {}}},
    ]
    ctx = StepContext(question, steps, [{**read, "doc_ids": ["e"]}], 4, False, 64, frozenset({"search"}), scoring=True)
    choose = GuidedDriver().plan(ctx)[-1]
    assert isinstance(choose, Choose) and "France" in choose.options
    plain = StepContext(
        "Which country is the cathedral of the Eiffel Tower's city in?",
        steps,
        ctx.observations,
        4,
        False,
        64,
        frozenset({"search"}),
        scoring=True,
    )
    assert "France" not in GuidedDriver().options(plain, plain.question)


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        ("Which country is the Eiffel Tower in?", "country"),
        ("Which American rock band has more members?", "band"),
        ("What city did the author move to?", "city"),
        ("What is the capital of France?", "capital"),
        ("What kind of plant is Ficus?", None),
        ("What is the name of the band?", None),
        ("Who wrote Hamlet?", None),
        ("When was X born?", None),
    ],
)
def test_the_answer_prompt_names_the_type_a_question_asks_for(question, kind):
    from langgraph_parallelmuse.candidates import answer_type

    assert answer_type(question) == kind
    ctx = StepContext(question, [], [], 0, False, 64)
    ask = f"Answer with the name of the {kind}." if kind else "Answer with a short phrase."
    assert GuidedDriver().evidence_prompt(ctx)[-1].content.endswith(f"Question: {question}\n{ask}")


def test_choose_refuses_a_model_that_cannot_score():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    seg = [Lit("<answer>"), Choose(("a", "b"), [HumanMessage("q")])]
    with pytest.raises(TypeError, match="cannot score"):
        asyncio.run(generate_turn(FakeListChatModel(responses=["x"]), [], seg, sampling=Sampling()))


class _EndScoringModel(ScoringChatModel):
    """Scores options as :class:`ScoringChatModel` does, with ``end`` as every end-of-reply logprob."""

    end: float = 0.0

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        result = await super()._agenerate(messages, stop, run_manager, **kwargs)
        result.generations[0].message.response_metadata["end_logprob"] = self.end
        return result


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_an_end_of_reply_logprob_is_checked_as_every_logprob_is(temperature):
    picks = []
    seg = [Choose(("A", "B"), [HumanMessage("q")], then=lambda pick: picks.append(pick) or [pick])]
    sampling = Sampling(temperature=temperature)
    # -inf is the floor (vLLM's -inf for a token outside its kept vocabulary), not NaN shares.
    model = _EndScoringModel(option_logprobs={"A": -1.0, "B": -2.0}, end=float("-inf"))
    asyncio.run(generate_turn(model, [], seg, sampling=sampling, seed=1))
    assert picks[0].shares == pytest.approx((0.731, 0.269), abs=1e-3)
    model = _EndScoringModel(option_logprobs={"A": -1.0, "B": -2.0}, end=float("nan"))
    with pytest.raises(ProtocolError, match="NaN"):
        asyncio.run(generate_turn(model, [], seg, sampling=sampling, seed=1))


@pytest.mark.parametrize(
    ("question", "evidence", "answer"),
    [
        # A number with a thousands separator is one candidate, not "6" and "960".
        ("At the 2011 census, what was the population of Young?", "Young had a population of 6,960 in 2011.", "6,960"),
        # A year question gets the year of a full date as well as the date.
        ("In what year was Reuven Rivlin born?", "Reuven Rivlin (born 9 September 1939) is a politician.", "1939"),
        # A question asking for a description gets the predicate's head noun.
        ("What position did Agüero play?", "Agüero is an Argentine footballer who plays as a striker.", "striker"),
        ("If Gallu is a demon Lilu is what?", "Lilu is a masculine Akkadian spirit of the wind.", "spirit"),
        # An initial does not end a sentence, and a possessive is the name without its "'s".
        ("Who was the first president of the APA?", "It began with G. Stanley Hall's book.", "G. Stanley Hall"),
        ("What country was Ibsen a citizen of?", "It was Norway's major anniversary of Ibsen.", "Norway"),
        # The noun the answer is named by is not the question's subject.
        ("In what county is West Chicago?", "West Chicago is a city in DuPage County, Illinois.", "DuPage County"),
        # Half the words may be the question's: a sibling shares a surname.
        ("Who is the sibling of Neil Young?", "He is the father of Neil Young and Astrid Young.", "Astrid Young"),
        # A quoted title is whole, its lower-case words in it and the comma before the closing quote out.
        (
            "What song debuted in the episode of South Park?",
            'Korn performed "Falling Away from Me," in the episode.',
            "Falling Away from Me",
        ),
        # A name may start with a capital of any script.
        ("Which city was Ken Tanaka born in?", "Ken Tanaka was born in Ōsaka, Japan.", "Ōsaka"),
        ("Who wrote Germinal?", "Germinal is a novel by Émile Zola, published in 1885.", "Émile Zola"),
        ("Who scored the goal?", "The goal was scored by Ángel Di María in the final.", "Ángel Di María"),
        ("Which region is Paris in?", "Paris is the capital of Île-de-France.", "Île-de-France"),
        ("What song was it?", 'She sang "Ça plane pour moi" on the show.', "Ça plane pour moi"),
    ],
)
def test_candidates_hold_numbers_years_descriptions_and_names_whole(question, evidence, answer):
    assert answer in candidates(question, evidence)


def test_spans_hold_no_tab_line_break_or_control_character():
    evidence = 'Hello Love was released on 12\tMay 1974. Her song "Blue\tMoon\x0bRising" and "Odd\x00Song" charted.'
    options = candidates("What song made the singer famous?", evidence) + candidates(
        "When was Hello Love released?", evidence
    )
    assert "Blue Moon Rising" in options and "12 May 1974" in options
    assert not [o for o in options if any(c < " " for c in o)]


def test_the_question_s_own_entity_is_not_a_candidate():
    options = candidates("Who is the sibling of Neil Young?", "He is the father of Neil Young and Astrid Young.")
    assert "Neil Young" not in options and "Astrid Young" in options


def test_names_only_questions_get_no_lowercase_descriptions():
    options = candidates("Which city was Ellen Marsh born in?", "Ellen Marsh is a writer. She was born in Dublin.")
    assert "writer" not in options and "Dublin" in options


def test_a_decade_is_offered_whole_and_a_year_once():
    evidence = "The band formed in the 1920s. It split in 1931 and on 2 May 1931."
    options = candidates("When was the band formed?", evidence)
    assert options == ["1920s", "1931", "2 May 1931"]


@pytest.mark.parametrize(
    ("question", "evidence", "options"),
    [
        # The options are what the evidence names: a determiner and an event noun drop.
        (
            "Which came first the forming of The Dandy Warhols or the birth of Robert Young?",
            "The Dandy Warhols formed in 1994. Robert Young was born in 1964.",
            ["Dandy Warhols", "Robert Young"],
        ),
        (
            "Which plant is larger, the Pterocarya or the Cotula?",
            "Pterocarya is a genus. Cotula is a genus.",
            ["Pterocarya", "Cotula"],
        ),
        (
            "Between Iain Banks and Irwin Shaw, which writer has had a more diverse career?",
            "Iain Banks was a Scottish writer. Irwin Shaw was an American playwright and novelist.",
            ["Iain Banks", "Irwin Shaw"],
        ),
        # Both options once the evidence names one: a lone option would be no choice.
        ("Who is older, Sid Haig or Vic Darchinyan?", "Sid Haig was born in 1939.", ["Sid Haig", "Vic Darchinyan"]),
        # An "or" that joins no two options ("in or around") is no comparison.
        (
            "Who directed the film shot in or around Leland in 1986?",
            "Stephen King directed it near Leland.",
            ["Stephen King"],
        ),
        # The asking sentence of a question in two sentences is its last.
        (
            "The director Armando Iannucci has an OBE. Does the director Puneet Sira also have one?",
            "Puneet Sira is an Indian director.",
            ["yes", "no"],
        ),
    ],
)
def test_a_comparison_is_answered_among_the_options_its_question_names(question, evidence, options):
    assert candidates(question, evidence) == options


@pytest.mark.parametrize(
    ("question", "options"),
    [
        # A phrase's modifier is not the option: "the director of Jaws" is not Jaws (and, as the
        # evidence does not name "director of Jaws", the candidates come from the evidence).
        (
            "Who was born first, the director of Jaws or the director of Alien?",
            ["director of Jaws", "director of Alien"],
        ),
        # A period is not two options.
        ("Between 1939 and 1945, which country had the most ships?", []),
    ],
)
def test_what_a_comparison_does_not_name_is_no_option(question, options):
    assert choice_options(question) == options


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        # A wh-word right after a noun starts a relative clause: the question is still yes/no.
        ("Was the director who made Jaws born in Ohio?", "yesno"),
        ("Did the band whose singer is Neil Young form in 1966?", "yesno"),
        ("Is the city where Ken Tanaka was born in Japan?", "yesno"),
        # One after a function word, or a verb of asking, is what the question asks.
        ("Is Paris in what country?", "name"),
        ("Was Jaws directed by whom?", "person"),
        ("Do you know who wrote Hamlet?", "person"),
    ],
)
def test_a_relative_wh_word_leaves_a_yes_no_question_yes_no(question, kind):
    assert answer_kind(question) == kind


@pytest.mark.parametrize(
    "question",
    ["Which president of the U.S. was born in Hawaii?", "What film starring Harry Connick Jr. was released in 1995?"],
)
def test_an_abbreviation_does_not_end_the_asking_sentence(question):
    assert candidates(question, "Barack Obama was born in Hawaii. Hope Floats (1998) starred Harry Connick Jr.") != [
        "yes",
        "no",
    ]


@pytest.mark.parametrize("options", [("", "Paris"), ("Paris", " \n")])
def test_choose_refuses_an_empty_option(options):
    # Scored on the end of the reply alone, an empty option would win over every answer.
    with pytest.raises(ValueError, match=r"must not be empty or blank: option \d"):
        Choose(options, [HumanMessage("q")])


def test_a_duplicate_option_is_scored_once_and_a_pick_s_index_is_its_place_among_the_distinct_ones():
    # A comparison naming the same option twice ("the Beatles or Beatles") is a sure choice: two
    # copies held half the probability each and missed the confidence bar.
    question = "Which band formed first, the Beatles or Beatles?"
    options = candidates(question, "The Beatles formed in 1960.")
    assert options == ["Beatles", "Beatles"]
    picks = []
    model = ScoringChatModel(option_logprobs={"Beatles": -0.1, "Stones": -9.0, "Kinks": -0.01})
    for given in (options, ["Beatles", "Stones", "Beatles", "Kinks"]):
        seg = Choose(tuple(given), [HumanMessage(question)], then=lambda pick: picks.append(pick) or [pick])
        asyncio.run(generate_turn(model, [], [seg], sampling=Sampling(temperature=0), seed=1))
        assert seg.options == tuple(dict.fromkeys(given))
        assert picks[-1].text == seg.options[picks[-1].index]
    assert picks[0].share == 1.0 >= GuidedDriver().answer_confidence
    assert (picks[1].index, picks[1].text, len(picks[1].shares)) == (2, "Kinks", 3)
    assert [text for _, text in model.scored].count("Beatles") == 2
