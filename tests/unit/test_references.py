"""The hops of a multi-hop question: which phrase a hop resolves, and the question it leaves."""

from __future__ import annotations

from dataclasses import replace

import pytest
from langchain_core.messages import AIMessage

from langgraph_parallelmuse.driver import GuidedDriver, StepContext
from langgraph_parallelmuse.references import inner_reference, reference_depth, resolved_question
from langgraph_parallelmuse.segments import Choose, Gen, Lit, Pick


@pytest.mark.parametrize(
    ("question", "span", "noun"),
    [
        # Nested relative clauses: the one that starts last is found first.
        (
            "What county shares a border with the county where Black Hawk Township is located?",
            "the county where Black Hawk Township is located",
            "county",
        ),
        # After "where" a preposition is the question's again; after "that", at the end, the clause's.
        (
            "Who was mayor of the city where Barack Obama was born at the time of his birth?",
            "the city where Barack Obama was born",
            "city",
        ),
        (
            "Who founded the company that James Woods' character is based on?",
            "the company that James Woods' character is based on",
            "company",
        ),
        # A possessive inside a relative clause is innermost.
        (
            "How many Publix stores are in the state that borders the east of the state where Hello Love's "
            "performer lived in when he died?",
            "Hello Love's performer",
            "performer",
        ),
        ("Who is the sibling of the performer of Decade?", "the performer of Decade", "performer"),
        # A name may start with an accented capital.
        ("Where was the composer of Ödipus born?", "the composer of Ödipus", "composer"),
        ("Where was Émile Zola's publisher based?", "Émile Zola's publisher", "publisher"),
        ("What currency predated the Euro in the country Signmark is from?", "the country Signmark is from", "country"),
        # A clause ends at a comma and after "is located": the rest is the question's own.
        (
            "When did the country where the village of Clonbrook is located, become a member of CARICOM?",
            "the country where the village of Clonbrook is located",
            "country",
        ),
        # A comma between two names, an apostrophe, a "und" or an "alma mater" does not cut a name.
        (
            "Which county borders the county in which Millbrook, New Jersey is located?",
            "the county in which Millbrook, New Jersey is located",
            "county",
        ),
        (
            "What did the author of Red, White and Blue Skies study?",
            "the author of Red, White and Blue Skies",
            "author",
        ),
        ("Where was the composer of Rosa und Blanka born?", "the composer of Rosa und Blanka", "composer"),
        (
            "Which city is the birthplace of the director of The Man Who Stole the Kings' Crown?",
            "the director of The Man Who Stole the Kings' Crown",
            "director",
        ),
        ("When did the Anna Lind's alma mater open?", "the Anna Lind's alma mater", "alma mater"),
        # The noun is the head's, not the preposition's before "whom".
        (
            "Who mothered the king under whom Rome reached its largest size?",
            "the king under whom Rome reached its largest size",
            "king",
        ),
    ],
)
def test_the_innermost_phrase_naming_an_entity_is_the_next_hop(question, span, noun):
    reference = inner_reference(question)
    assert reference is not None and (reference.span, reference.noun) == (span, noun)


@pytest.mark.parametrize(
    ("question", "span", "asked", "resolved"),
    [
        # The phrase is the question's subject: its clause stops before the question's verb.
        (
            "The state where Henry Worrall died has how many congressional districts?",
            "The state where Henry Worrall died",
            "Which is the state where Henry Worrall died?",
            "Kansas has how many congressional districts?",
        ),
        (
            "The composer of Aschenbrodel was born in which city?",
            "The composer of Aschenbrodel",
            "What is the composer of Aschenbrodel?",
            "Kansas was born in which city?",
        ),
        (
            "The country Dai Jitao is from borders which sea?",
            "The country Dai Jitao is from",
            "Which is the country Dai Jitao is from?",
            "Kansas borders which sea?",
        ),
        # The question's verb may be a copula and a participle, as a clause's is.
        (
            "The university where Obama studied was founded in what year?",
            "The university where Obama studied",
            "Which is the university where Obama studied?",
            "Kansas was founded in what year?",
        ),
        # The question's verb may take an object before what it asks; with no asking word after it,
        # the phrase is still the subject.
        (
            "The country where the Nile ends shares a border with which country?",
            "The country where the Nile ends",
            "Which is the country where the Nile ends?",
            "Kansas shares a border with which country?",
        ),
        (
            "The man who founded Microsoft, when was he born?",
            "The man who founded Microsoft",
            "Which is the man who founded Microsoft?",
            "Kansas, when was he born?",
        ),
        # "the Nile ends borders which sea" is no phrase: its "which" asks.
        (
            "The country where the Nile ends borders which sea?",
            "The country where the Nile ends",
            "Which is the country where the Nile ends?",
            "Kansas borders which sea?",
        ),
        (
            "The film in which Tom Hanks played Forrest Gump won how many Oscars?",
            "The film in which Tom Hanks played Forrest Gump",
            "Which is the film in which Tom Hanks played Forrest Gump?",
            "Kansas won how many Oscars?",
        ),
    ],
)
def test_a_phrase_that_starts_the_question_is_a_hop(question, span, asked, resolved):
    reference = inner_reference(question)
    assert reference is not None and (reference.span, reference.question) == (span, asked)
    assert resolved_question(question, ["Kansas"]) == resolved


@pytest.mark.parametrize(
    "question",
    [
        "Who is the wife of Kim Jong-chul?",  # the phrase is what is asked, not a hop on the way
        "Who is older, Sid Haig or Vic Darchinyan?",
        "The manuscript is in the hand of a German musician whose godfather is whom?",  # the clause asks
        "The ship sank during a storm that Norway recorded when?",
        "Tom Reed coaches at a college which also has a campus in which Texas city?",
        # The phrase is what is asked, whatever follows its comma.
        "What was the job of Ann Lee, whose diary was published in 1950?",
        "What is a Canadian firm that builds, sells, and repairs boats in Halifax?",
        "Name the father of John Grey, 2nd Earl Grey, who married whom?",
        # An indefinite phrase after "is" or a comma describes a name the question gives.
        "The Dig is a British quiz show that follows students as they travel, which is hosted by whom?",
        "The band plays at the Red Lion Pub in Leeds, a venue that hosts folk nights with this 3-letter name.",
        # A clause cut before its preposition goes on: no phrase rather than "… is based" + "on in …".
        "The real life person that James Woods' character is based on in the film In Love and War won what medal?",
        "Which medal did the person that the film's hero is based on in Love and War win?",
    ],
)
def test_a_question_without_a_hop_on_the_way_has_no_phrase(question):
    assert inner_reference(question) is None


def test_an_either_or_question_chooses_among_its_options_whatever_its_hops():
    question = "Which film has the director who died first, Mad Max or Alien?"
    read = {"step": 1, "name": "visit", "arguments": {}, "content": "Mad Max and Alien.", "error": False}
    steps = [{"action": {"type": "tool_call", "name": n, "arguments": {}}} for n in ("search", "visit")]
    ctx = StepContext(
        question, steps, [{**read, "seconds": 0.0, "doc_ids": ["m"]}], 2, False, 64, frozenset({"search"}), scoring=True
    )
    assert inner_reference(question) is not None
    assert GuidedDriver().plan(ctx)[-1].options == ("Mad Max", "Alien")


def test_each_bridge_resolves_the_innermost_phrase_in_turn():
    question = (
        "How many Publix stores are in the state that borders the east of the state where Hello Love's performer lived?"
    )
    steps = ["Hank Snow", "Tennessee", "North Carolina"]
    assert [resolved_question(question, steps[:n]) for n in (1, 2, 3)] == [
        "How many Publix stores are in the state that borders the east of the state where Hank Snow lived?",
        "How many Publix stores are in the state that borders the east of Tennessee?",
        "How many Publix stores are in North Carolina?",
    ]


@pytest.mark.parametrize(
    ("question", "bridges", "resolved"),
    [
        # A clause ends at its own verb where the question's follows it ...
        (
            "What time does the city where Oakbridge Hall is close its libraries?",
            ["Leeds"],
            "What time does Leeds close its libraries?",
        ),
        (
            "How many cars did the town where the 12th Motor Fair open build in 1999?",
            ["Turin"],
            "How many cars did Turin build in 1999?",
        ),
        (
            "What position does the player who scored for Leeds United play?",
            ["Pedro"],
            "What position does Pedro play?",
        ),
        (
            'What did the man who wrote "the Long Road" use as his pen name?',
            ["Tom Hale"],
            "What did Tom Hale use as his pen name?",
        ),
        (
            "Who mothered the king under whom the empire that conquered Gaul reached its largest size?",
            ["Rome"],
            "Who mothered the king under whom Rome reached its largest size?",
        ),
        (
            "When did the country in which the singer of Moonlight is a citizen join the EU?",
            ["Ann Holt", "Ireland"],
            "When did Ireland join the EU?",
        ),
        # ... at a second verb "is" after "who" ...
        (
            "What colour is the house in which the sister of the painter who also painted Blue Harbour is living?",
            ["Anna Berg"],
            "What colour is the house in which the sister of Anna Berg is living?",
        ),
        # ... after "is set" or "is part of", and at a sentence's stop.
        (
            "What part of the country where the novel Red Sky is set are the highlands?",
            ["Scotland"],
            "What part of Scotland are the highlands?",
        ),
        (
            "Where is the district that Elmwood is part of located in Canada?",
            ["York"],
            "Where is York located in Canada?",
        ),
        (
            "Bob visited the city where the river Lune ends. Who founded that city?",
            ["Lancaster"],
            "Bob visited Lancaster. Who founded that city?",
        ),
        # An "in" after "located" is the next phrase's.
        (
            "Which office represents the country where Mount Ash is located in the city where the treaty was signed?",
            ["Paris", "Chile"],
            "Which office represents Chile in Paris?",
        ),
        # A name goes on past a comma before another name, and "the" before a possessive is the phrase's.
        (
            "When did the city where the next Summer Games will be held join the league?",
            ["Paris"],
            "When did Paris join the league?",
        ),
        # ... and where a question word asks with a copula, its participle is the question's.
        ("When was the company that Steve Jobs founded established?", ["Apple"], "When was Apple established?"),
        ("Where was the man who founded Acme Corp born?", ["Wile"], "Where was Wile born?"),
        (
            "When was the airline that flew the Concorde taken over by the state?",
            ["Air France"],
            "When was Air France taken over by the state?",
        ),
        # The clause's copula keeps its own participle only when another follows for the question:
        # "admitted" was taken into the phrase, which left "When was Indiana to the union?".
        (
            "When was the state where Greenfield-Central High is admitted to the union?",
            ["Indiana"],
            "When was Indiana admitted to the union?",
        ),
        ("When was the city where the Olympics were held founded?", ["Athens"], "When was Athens founded?"),
        ("Who founded the birthplace of Otto, Count of Flanders?", ["Ghent"], "Who founded Ghent?"),
        ("Who directed the film that was shot in Tarn, Texas in 1990", ["Red Dust"], "Who directed Red Dust?"),
        (
            "Who wrote the history of the Nordic Trade Council's charter?",
            ["Oslo Treaty"],
            "Who wrote the history of Oslo Treaty?",
        ),
    ],
)
def test_a_resolved_question_keeps_the_words_around_the_phrase(question, bridges, resolved):
    assert resolved_question(question, bridges) == resolved


PUBLIX = (
    "How many Publix stores are in the state that borders the east of the state where Hello Love's performer lived?"
)


@pytest.mark.parametrize(
    ("question", "depth"),
    [
        ("Who is older, Sid Haig or Vic Darchinyan?", 0),
        ("Who is the sibling of the performer of Decade?", 1),
        ("How many stores are in the state where Hello Love's performer lived?", 2),
        (PUBLIX, 3),
        # "There is a …" names the entity it introduces; it does not describe one named before.
        ("There is a country where the author of Blue Lake was born. What is the capital of that country?", 2),
        ("There was a school where the painter of Dawn studied. Who founded it?", 2),
    ],
)
def test_the_depth_counts_the_entities_named_one_inside_the_next(question, depth):
    assert reference_depth(question) == depth


@pytest.mark.timeout(30)  # two ways to read each dot: 24 dots took 11 s, 60 would take years; now microseconds
def test_a_run_of_dots_in_a_relative_clause_is_read_in_linear_time():
    question = "Who directed the film that ends with a long pause" + "." * 60 + " and a cut?"
    assert reference_depth(question) == 1


@pytest.mark.parametrize(
    ("question", "span"),
    [
        # A name's comma stays inside the clause whichever letters of its word are capitals.
        (
            "Which county borders the county in which McDonald, Ohio is located?",
            "the county in which McDonald, Ohio is located",
        ),
        ("What river flows through the city where eBay, Inc. was founded?", "the city where eBay, Inc. was founded"),
    ],
)
def test_a_comma_after_a_name_with_capitals_inside_its_word_stays_in_the_clause(question, span):
    reference = inner_reference(question)
    assert reference is not None and reference.span == span


# Guards, each read in milliseconds now: the old patterns read each run or clause once per word or
# phrase in it (quadratic), or a comma-separated run of words with several capitals every way.
@pytest.mark.timeout(10)  # 11-21 s before: a name was tried from each word of the run, read to its end
def test_a_long_capitalised_run_is_read_in_linear_time():
    assert inner_reference("Who is " + "Ab " * 6666 + "?") is None
    assert inner_reference("Who is " + "A'" * 10000 + "?") is None  # 16 s before: each letter starts a word


@pytest.mark.timeout(10)  # a name could start at any of a word's capitals: 7^12 ways, years
def test_words_of_many_capitals_before_commas_are_read_in_linear_time():
    assert inner_reference("What is the city where " + "AbAbAbAbAbAbAb, " * 12 + "?") is None
    assert inner_reference("What is the city where " + "McDonald, " * 40 + "?") is None


@pytest.mark.timeout(10)  # 14 s before (40,000 chars): from each capital of the word, read to its end
def test_a_long_word_in_a_relative_clause_is_read_in_linear_time():
    assert inner_reference("What is the city where " + "Ab" * 20000 + "?") is None


@pytest.mark.timeout(10)  # over 40 s before, for every plan step: each phrase was read to the question's end
def test_a_question_of_many_nested_phrases_is_read_in_bounded_time():
    question = "How many stores are in the state where " + "the city where " * 1330 + "Hello Love's performer lived?"
    assert GuidedDriver().budget(question) == (10, 20)  # hops for the 8 innermost phrases at most
    # A phrase longer than any real one is not read as one (cut, it would be a clause's first part).
    assert inner_reference(question).span == "Hello Love's performer"


def test_a_questions_phrases_are_found_once_for_all_its_plan_steps():
    question = "How many stores are in the state where the city where Hello Love's performer lived is located?"
    budget = GuidedDriver().budget(question)
    hits = reference_depth.cache_info().hits
    assert GuidedDriver().budget(question) == budget
    assert reference_depth.cache_info().hits == hits + 1
    assert inner_reference(question) is inner_reference(question)


def _hops_done(question: str, searches: int) -> StepContext:
    """``searches`` hops done (each a search and a visit of its hit), the last one's hit not opened yet."""
    steps, observations = [], []
    for hop in range(searches):
        for name in ("search", "visit"):
            if name == "visit" and hop == searches - 1:
                break
            index = len(steps)
            steps.append(
                {"index": index, "action": {"type": "tool_call", "name": name, "arguments": {"q": str(index)}}}
            )
            observations.append(
                {
                    "step": index,
                    "name": name,
                    "arguments": {},
                    "content": f"doc {hop}",
                    "error": False,
                    "seconds": 0.0,
                    "doc_ids": [f"d{hop}"],
                }
            )
    return StepContext(question, steps, observations, len(steps), False, 64, frozenset({"search", "visit"}))


def test_a_deeper_question_opens_its_later_hops_before_it_answers():
    driver = GuidedDriver()
    # After three searches (turn 6 of 6) a question naming one entity answers from what it read ...
    assert driver.next_action(_hops_done(QUESTION, 3)) == "answer"
    # ... one naming three, one inside the next, has two hops more: it opens the third search's hit
    # and searches on, and answers on its tenth turn.
    deep = _hops_done(PUBLIX, 3)
    assert driver.budget(PUBLIX) == (5, 10) and driver.next_action(deep) == "visit"
    assert driver.next_action(_hops_done(PUBLIX, 5)) == "answer"
    # The config's max_turns still bounds it: a final turn answers whatever the budget.
    assert driver.next_action(replace(deep, final=True)) == "answer"
    # A comparison is answered among its options whatever phrases it holds: no hop more.
    comparison = "Which came first the forming of The Dandy Warhols or the birth of Robert Young?"
    assert reference_depth(comparison) == 2 and driver.budget(comparison) == (3, 6)
    # More hops get the turns to open them.
    assert GuidedDriver(hops=4).budget(QUESTION) == (4, 8)


QUESTION = "What is the name of the waterfall in the country where the Bubye River is found?"
OPENED = "The Bubye River is a river in Zimbabwe, near Beitbridge."
SNIPPET = "Bambarakanda Falls is a waterfall in Sri Lanka."


def _ctx(steps, *, final=False):
    found = {"step": 0, "name": "search", "arguments": {}, "content": SNIPPET, "error": False, "seconds": 0.0}
    read = {**found, "step": 1, "name": "visit", "content": OPENED}
    return StepContext(
        QUESTION,
        steps,
        [{**found, "doc_ids": ["b", "f"]}, {**read, "doc_ids": ["b"]}],
        len(steps),
        final,
        64,
        frozenset({"search", "visit"}),
        scoring=True,
    )


HOP = [{"action": {"type": "tool_call", "name": n, "arguments": {}}} for n in ("search", "visit")]


def test_an_unresolved_phrase_gets_a_bridge_of_its_kind_and_a_query_for_the_resolved_question():
    choose = GuidedDriver().plan(_ctx(HOP))[-1]
    # The choice is the phrase's entity, asked as a question of its own and by its kind, not the
    # answer's, from the opened document only (not the search's snippets).
    assert isinstance(choose, Choose) and "Zimbabwe" in choose.options and "Beitbridge" in choose.options
    assert "Sri Lanka" not in choose.options and SNIPPET not in choose.messages[-1].content
    assert choose.messages[-1].content.endswith(
        "Question: Which is the country where the Bubye River is found?\nAnswer with the name of the country."
    )
    # Even a sure pick opens the next query (nothing is answered while the bridge is unknown).
    pick = Pick(0, "Zimbabwe", (), (0.0,), (1.0,))
    bridge, query = choose.then(pick)[1:3]
    assert bridge.name == "bridge" and bridge.text == "Zimbabwe"
    assert (
        isinstance(query, Gen)
        and query.messages[-2].content == "Question: What is the name of the waterfall in Zimbabwe?"
    )
    assert query.messages[-1] == AIMessage("Zimbabwe")


def test_once_resolved_the_answer_is_chosen_for_the_resolved_question():
    steps = [*HOP, {**HOP[0], "bridge": "Zimbabwe"}, HOP[1]]
    choose = GuidedDriver().plan(_ctx(steps))[-1]
    assert isinstance(choose, Choose) and "Zimbabwe" not in choose.options  # the bridge is not the answer
    assert "Bambarakanda Falls" in choose.options  # the answer reads the snippets too
    assert "Question: What is the name of the waterfall in Zimbabwe?" in choose.messages[-1].content


def test_the_last_turn_answers_even_with_a_phrase_unresolved():
    plan = GuidedDriver().plan(_ctx(HOP, final=True))
    assert isinstance(plan[-1], Choose) and f"Question: {QUESTION}" in plan[-1].messages[-1].content
    # Even an unsure pick is the answer on the last turn, not the bridge of another search.
    opening = plan[-1].then(Pick(0, "Sri Lanka", (), (0.0,), (0.5,)))[0]
    assert isinstance(opening, Lit) and opening.text == "</think>\n<answer>"


def test_evidence_is_cut_at_a_word_boundary():
    read = {"step": 0, "name": "visit", "arguments": {}, "content": "Journal of Psychotherapy", "error": False}
    ctx = StepContext("q", [], [{**read, "seconds": 0.0, "doc_ids": ["j"]}], 1, False, 64)
    assert GuidedDriver(evidence_chars=14).evidence(ctx) == "Journal of"
