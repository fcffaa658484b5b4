"""The information-state graph of a trajectory: exact entities and relations, the effective subgraph, Γ."""

from __future__ import annotations

import warnings

import pytest

from langgraph_parallelmuse.infograph import (
    build_graph,
    effective_steps,
    effective_subgraph,
    entity_key,
    graph_stats,
    named_spans,
    read_segments,
    redundancy,
    redundancy_summary,
    warn_unreadable,
)

QUESTION = "Who was the first president of the association which published Journal of Psychotherapy Integration?"

JPI_SNIPPET = "The Journal of Psychotherapy Integration is published by the American Psychological Association."
HALL_SNIPPET = "G. Stanley Hall's book. Hall was the first president of the American Psychological Association."


def search(index: int, query: str, **extra):
    return {"index": index, "action": {"type": "tool_call", "name": "search", "arguments": {"query": query}}, **extra}


def visit(index: int, doc: str):
    return {"index": index, "action": {"type": "tool_call", "name": "visit", "arguments": {"doc": doc}}}


def answer(index: int, text: str):
    return {"index": index, "action": {"type": "answer", "answer": text}}


def hits(step: int, *docs: tuple[str, str, str]):
    content = "\n\n".join(f"[{n}] {title} (id: {doc_id})\n{text}" for n, (doc_id, title, text) in enumerate(docs, 1))
    return {"step": step, "name": "search", "content": content, "error": False, "doc_ids": [d for d, _, _ in docs]}


def opened(step: int, doc_id: str, title: str, text: str):
    return {"step": step, "name": "visit", "content": f"{title}\n\n{text}", "error": False, "doc_ids": [doc_id]}


def two_hop(*, dead_end: bool = False):
    """Hop 1 finds the journal's publisher (the bridge), hop 2 its first president; optionally a dead-end
    search in between."""
    steps = [search(0, "Journal of Psychotherapy Integration publisher")]
    observations = [
        hits(0, ("d6", "Journal of Psychotherapy Integration", JPI_SNIPPET), ("d4", "Riemann integral", "A journal."))
    ]
    if dead_end:
        steps.append(search(1, "Sigmund Freud"))
        observations.append(hits(1, ("d9", "Sigmund Freud", "Freud founded psychoanalysis.")))
    n = len(steps)
    steps += [
        visit(n, "d6"),
        # The hop's bridge is recorded on the step whose query builds on it (the issue-21 driver's field).
        search(n + 1, "first president of that association", bridge="American Psychological Association"),
        answer(n + 2, "G. Stanley Hall"),
    ]
    observations += [
        opened(n, "d6", "Journal of Psychotherapy Integration", JPI_SNIPPET + " It was established in 1991."),
        hits(
            n + 1,
            ("d10", "Adolescence", HALL_SNIPPET),
            ("d18", "Families, Systems and Health", "Published by the American Psychological Association."),
            ("d6", "Journal of Psychotherapy Integration", JPI_SNIPPET),
        ),
    ]
    return {
        "id": "t0",
        "origin": {"kind": "initial"},
        "steps": steps,
        "observations": observations,
        "answer": "G. Stanley Hall",
    }


def _edges(graph):
    return {(r["source"], r["target"], r["kind"], r["step"], r["tool"]) for r in graph["relations"]}


def test_the_graph_of_a_scripted_trajectory_is_exactly_the_expected_one_with_its_bridge_pinned():
    graph = build_graph(QUESTION, two_hop())

    assert {k: (e["kinds"], e["step"], e["doc_ids"]) for k, e in graph["entities"].items()} == {
        "journal of psychotherapy integration": (["opened", "query", "title"], 0, ["d6"]),
        "riemann integral": (["title"], 0, ["d4"]),
        "american psychological association": (["bridge"], 2, []),
        "first president of that association": (["query"], 2, []),
        "adolescence": (["title"], 2, ["d10"]),
        "families systems and health": (["title"], 2, ["d18"]),
        "g stanley hall": (["answer"], 3, []),
    }
    jpi, apa, q2 = (
        "journal of psychotherapy integration",
        "american psychological association",
        "first president of that association",
    )
    assert _edges(graph) == {
        (jpi, "riemann integral", "found", 0, "search"),
        # The bridge came from what hop 1 read (the hit and the opened page), not from the results of the
        # search built on it (which all name it too).
        (jpi, apa, "mentions", 0, "search"),
        (jpi, apa, "mentions", 1, "visit"),
        (q2, "adolescence", "found", 2, "search"),
        (q2, "families systems and health", "found", 2, "search"),
        (q2, jpi, "found", 2, "search"),
        (apa, "adolescence", "found", 2, "search"),
        (apa, "families systems and health", "found", 2, "search"),
        (apa, jpi, "found", 2, "search"),
        ("adolescence", "g stanley hall", "supports", 2, "search"),
    }
    assert graph["answer"] == "g stanley hall"


def test_the_effective_subgraph_of_a_two_hop_answer_keeps_both_hops_and_drops_the_dead_ends():
    traj = two_hop(dead_end=True)
    graph = build_graph(QUESTION, traj)
    effective = effective_subgraph(graph)
    jpi, apa = "journal of psychotherapy integration", "american psychological association"

    assert set(effective["entities"]) == {
        jpi,
        apa,
        "first president of that association",
        "adolescence",
        "g stanley hall",
    }
    assert not {"sigmund freud", "riemann integral", "families systems and health"} & set(effective["entities"])
    # Hop 1 (its search and the page it opened), hop 2's search; not the dead-end search (step 1).
    assert effective_steps(effective) == [0, 2, 3]
    # Hop 2 re-found the journal after it was used: that later relation does not lead to the answer.
    assert ("first president of that association", jpi, "found", 3, "search") not in _edges(effective)
    assert redundancy(graph, effective) == pytest.approx(1 - 5 / 8)
    assert graph_stats(QUESTION, traj) == {
        "entities": 8,
        "effective_entities": 5,
        "redundancy": pytest.approx(1 - 5 / 8),
        "effective_steps": [0, 2, 3],
    }


def test_an_answer_no_document_supports_is_the_whole_effective_subgraph():
    traj = {**two_hop(), "answer": "Carl Jung"}
    stats = graph_stats(QUESTION, traj)
    assert (stats["effective_entities"], stats["effective_steps"]) == (1, [])


def test_a_yes_no_answer_rests_on_the_opened_documents_and_the_hits_the_question_names():
    question = "Are Christopher Nolan and Sathish Kalathil both film directors?"
    traj = {
        "steps": [search(0, "Christopher Nolan"), visit(1, "n1"), answer(2, "yes")],
        "observations": [
            hits(0, ("n1", "Christopher Nolan", "A director."), ("x", "Dunkirk", "A film.")),
            opened(1, "n1", "Christopher Nolan", "Nolan is a film director."),
        ],
        "answer": "yes",
    }
    effective = effective_subgraph(build_graph(question, traj))
    assert set(effective["entities"]) == {"christopher nolan", "yes"}


def test_without_an_answer_nothing_is_effective_and_every_entity_is_redundant():
    traj = {**two_hop(), "answer": None}
    assert graph_stats(QUESTION, traj)["redundancy"] == 1.0


def test_failed_calls_and_unknown_tools_show_no_documents():
    traj = {
        "steps": [search(0, "Paris"), answer(1, "Paris")],
        "observations": [{"step": 0, "name": "search", "content": "[1] Paris (id: p)\nx", "error": True}],
        "answer": "Paris",
    }
    assert set(build_graph("Where?", traj)["entities"]) == {"paris"}


def test_a_document_a_later_search_shows_again_does_not_make_that_search_effective():
    # Before the fix the re-found hit gave the answer a "supports" relation at step 1, so the dead-end
    # search for Freud counted as effective (Γ 0.0 instead of 0.25).
    hall = f"[1] Adolescence (id: d10)\n{HALL_SNIPPET}"
    traj = {
        "steps": [
            search(0, "American Psychological Association president"),
            search(1, "Sigmund Freud"),
            answer(2, "G. Stanley Hall"),
        ],
        "observations": [
            {"step": 0, "name": "search", "error": False, "doc_ids": ["d10"], "content": hall},
            {
                "step": 1,
                "name": "search",
                "error": False,
                "doc_ids": ["d10", "d9"],
                "content": f"{hall}\n\n[2] Sigmund Freud (id: d9)\nFreud founded psychoanalysis.",
            },
        ],
        "answer": "G. Stanley Hall",
    }
    question = "Who was the first president of the American Psychological Association?"
    graph = build_graph(question, traj)
    assert sorted(effective_subgraph(graph)["entities"]) == [
        "adolescence",
        "american psychological association",
        "g stanley hall",
    ]
    assert effective_steps(effective_subgraph(graph)) == [0]
    assert graph_stats(question, traj)["redundancy"] == 0.25


def test_a_visit_that_opened_nothing_is_no_document():
    traj = {
        "steps": [search(0, "Christopher Nolan"), visit(1, "nolan"), answer(2, "yes")],
        "observations": [
            {
                "step": 0,
                "name": "search",
                "error": False,
                "doc_ids": ["n1"],
                "content": "[1] Christopher Nolan (id: n1)\nA director.",
            },
            # What the corpus visit tool returns for an unknown id: not an error, no document.
            {
                "step": 1,
                "name": "visit",
                "error": False,
                "doc_ids": [],
                "content": "No document 'nolan': that id or title is unknown. Use an id from the search results.",
            },
        ],
        "answer": "yes",
    }
    graph = build_graph("Are Christopher Nolan and Sathish Kalathil both film directors?", traj)
    assert sorted(graph["entities"]) == ["christopher nolan", "yes"]


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        (
            "Who was the first president of the American Psychological Association?",
            ["American Psychological Association"],
        ),
        ("If Gallu is a demon Lilu is what?", ["Gallu", "Lilu"]),
        ("Apollo 11 landed in 1969.", ["Apollo 11", "1969"]),
        ('the "sturm und drang" era', ["sturm und drang"]),
        ("first president of that association", []),
        # Punctuation between two capitalised words ends a name; dots inside one keep it whole.
        ("born in 1873 in Kerry, Ireland", ["1873", "Kerry", "Ireland"]),
        ("the Luftwaffe (German air force)", ["Luftwaffe", "German"]),
        ("a U.S. Army general", ["U.S. Army"]),
        # A closing possessive is no part of the name (a real query: the report's sub-answer read
        # "Dai Xuantang's"); one inside a title is.
        ("Dai Xuantang's debt load", ["Dai Xuantang"]),
        ("James Garner’s role in Ender's Game", ["James Garner", "Ender's Game"]),
        ("Paris's mayor", ["Paris"]),
        ("Mark Brennan's (Scott McGregor) departure", ["Mark Brennan", "Scott McGregor"]),
        # An "'s" with nothing it owns after it is the name's own: the report's "McDonald's" read "McDonald".
        ("McDonald's", ["McDonald's"]),
        ("Who founded McDonald's?", ["McDonald's"]),
        ("They met at McDonald's in 1961.", ["McDonald's", "1961"]),
        # Before a word that joins or goes on to what the name owns, a title, or a long aside, it is not.
        ("Stephen Fung's and Daniel Wu's new company", ["Stephen Fung", "Daniel Wu"]),
        ("Nick Hexum's then fiancée", ["Nick Hexum"]),
        ("on Evanescence's The Open Door Tour", ["Evanescence", "Open Door Tour"]),
        ("John Eager Howard's (" + "a" * 90 + ") country estate", ["John Eager Howard"]),
        # After "and"/"or" the next name's "'s" tells; a short aside or "My" is no owned word.
        ("Domino's and Papa John's were sold", ["Domino's", "Papa John's"]),
        ("Frankie & Benny's and Chiquito", ["Frankie & Benny's", "Chiquito"]),
        ("Gino's (which is exclusive to West Virginia), and", ["Gino's", "West Virginia"]),
        ("Yes Sir, That's My Baby", ["Sir", "That's", "Baby"]),
        # A time, a ratio or a date is one number: "10:30" was the spans "10" and "30".
        ("the 10:30 train", ["10:30"]),
        ("born 1950/51 in Genesis 1:3", ["1950/51", "Genesis 1:3"]),
    ],
)
def test_named_spans(text, spans):
    assert named_spans(text) == spans


def test_the_run_summary_separates_from_scratch_trajectories_from_branches():
    scratch = two_hop(dead_end=True)
    branch = {**two_hop(), "id": "t0.s1.b0", "origin": {"kind": "branch"}}
    summary = redundancy_summary(QUESTION, [scratch, branch])
    assert summary["by_kind"]["initial"]["entities"] == 8
    assert summary["by_kind"]["branch"]["effective_entities"] == 5
    assert summary["per_trajectory"]["t0.s1.b0"]["redundancy"] == pytest.approx(1 - 5 / 7)


def test_a_hit_whose_id_holds_parentheses_is_read_whole():
    """Web ids such as ``.../Mercury_(planet)`` made the hit line unmatched: its title and text were
    missing from the graph (the driver's evidence had the same bug)."""
    url = "https://en.wikipedia.org/wiki/Mercury_(planet)"
    obs = hits(0, (url, "Mercury (planet)", "Mercury is the smallest planet."), ("d2", "Venus", "Venus is second."))
    segments = read_segments([obs])
    assert [(s.title, s.doc_id) for s in segments] == [("Mercury (planet)", url), ("Venus", "d2")]
    assert segments[0].text == "mercury planet mercury is smallest planet"


def test_a_name_with_a_composed_or_decomposed_accent_or_other_case_is_one_entity():
    """A query spelling "Beyoncé" with a combining accent and a title with the composed one were two
    entities (the decomposed span even lost its accent: "beyonce")."""
    composed, decomposed = "Beyonc\u00e9", "Beyonce\u0301"
    traj = {
        "steps": [search(0, f"{decomposed} husband"), answer(1, "Jay-Z")],
        "observations": [hits(0, ("d1", composed, f"{composed} married Jay-Z in 2008."))],
        "answer": "Jay-Z",
    }
    assert named_spans(f"{decomposed} husband") == [composed]
    graph = build_graph("Who is the husband of the singer?", traj)
    assert sorted(graph["entities"]) == ["beyoncé", "jayz"]
    assert read_segments([hits(0, ("d2", "Straße", "A street."))])[0].text.startswith("strasse")  # case folded


def _plain(step: int, name: str, content: str, **extra):
    return {"step": step, "name": name, "content": content, "error": False, **extra}


def test_tool_outputs_the_graph_cannot_read_get_a_warning_that_names_the_format():
    """A search tool of another format left graph reports and crossover empty without a word."""
    plain = {"observations": [_plain(0, "search", "Alpha: Alpha is in Paris."), _plain(1, "visit", "Alpha\n\nParis.")]}
    with pytest.warns(UserWarning, match=r"crossover=1 found no document .*'\[n\] Title \(id: x\)'.*'doc_ids'"):
        assert warn_unreadable([plain, plain], uses="crossover=1")
    readable = {"observations": [hits(0, ("a", "Alpha", "Alpha is in Paris."))]}
    failed = {"observations": [{**_plain(0, "search", "Error: down"), "error": True}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # One trajectory that read a document is enough; no tool call that worked, nothing to say.
        assert not warn_unreadable([plain, readable], uses="crossover=1")
        assert not warn_unreadable([failed, {"observations": []}], uses="crossover=1")
        # The library's own tools when every search found nothing: no sign of another format.
        none_found = {"observations": [_plain(0, "search", "No results for 'Alpha'. Try other words.")]}
        assert not warn_unreadable([none_found], uses="crossover=1")


def test_a_cjk_answer_inside_a_cjk_page_is_supported_by_it() -> None:
    # Mentions were whole words between spaces, which Japanese never writes: no document supported
    # "333メートル", so the trajectory had no evidence (an empty graph report, no crossover).
    answer = "333メートル"
    traj = {
        "steps": [search(0, "東京タワー 高さ"), {"index": 1, "action": {"type": "answer", "answer": answer}}],
        "observations": [
            {
                "step": 0,
                "name": "search",
                "error": False,
                "doc_ids": ["d1"],
                "content": "[1] 東京タワー (id: d1)\n東京タワーの高さは333メートルです。",
            }
        ],
        "answer": answer,
    }
    effective = effective_subgraph(build_graph("東京タワーの高さは?", traj))
    assert effective["answer"] == "333メートル"
    assert [(r["kind"], r["step"]) for r in effective["relations"] if r["target"] == effective["answer"]] == [
        ("supports", 0)
    ]


def test_a_name_a_page_quotes_or_dashes_in_typographic_punctuation_is_mentioned_by_it() -> None:
    # Only ASCII punctuation was dropped from keys: the page's "“thinking" and "loud”" were other
    # words than the answer's, so the page that names it supported nothing ("no document read leads to
    # the answer"), and a bridge typed "O'Brien" was not the page's "O’Brien".
    traj = {
        "steps": [
            search(0, "Ed Sheeran song for Athina"),
            search(1, "Conan O'Brien host"),
            answer(2, "Thinking Out Loud"),
        ],
        "observations": [
            hits(0, ("d1", "Ed Sheeran", "Sheeran wrote “Thinking Out Loud” for Athina – with Conan O’Brien.")),
            hits(1, ("d2", "Late Night", "A talk show.")),
        ],
        "answer": "Thinking Out Loud",
    }
    graph = build_graph("Which song did Ed Sheeran write for his girlfriend?", traj)
    assert ("ed sheeran", "thinking out loud", "supports", 0) in [
        (r["source"], r["target"], r["kind"], r["step"]) for r in graph["relations"]
    ]
    assert ("ed sheeran", "conan obrien", "mentions", 0) in [
        (r["source"], r["target"], r["kind"], r["step"]) for r in graph["relations"]
    ]
    assert effective_steps(effective_subgraph(graph)) == [0]


def test_a_decimal_answer_is_not_supported_by_a_page_that_holds_its_digits_as_another_number() -> None:
    # The decimal point was dropped with the punctuation: "7.0%" was the entity "70", and a page's
    # "70 museums" was its evidence in the graph report.
    traj = {
        "steps": [search(0, "Mexico share of Spanish Wikipedia edits"), answer(1, "7.0%")],
        "observations": [
            hits(0, ("d1", "Mexico City", "Mexico City has 70 museums."), ("d2", "Wikipedia", "Mexico (7.0%)."))
        ],
        "answer": "7.0%",
    }
    graph = build_graph("What share of Spanish Wikipedia edits come from Mexico?", traj)
    assert [r["source"] for r in graph["relations"] if r["kind"] == "supports"] == ["wikipedia"]


@pytest.mark.parametrize(
    ("said", "page"), [("March 23", "It struck on March 2\u20133, 2012."), ("21", "They won 2\u20131.")]
)
def test_a_range_or_score_on_a_page_does_not_support_the_number_its_digits_run_into(said, page) -> None:
    # With every non-ASCII punctuation mark dropped (this session's first key fix), the en dash went
    # too: "March 2–3" was "march 23", and the page supported the answer "March 23".
    traj = {
        "steps": [search(0, "the outbreak"), answer(1, said)],
        "observations": [hits(0, ("d1", "Outbreak", page))],
        "answer": said,
    }
    graph = build_graph("When did it strike?", traj)
    assert not [r for r in graph["relations"] if r["kind"] == "supports"]
    # Every dash of the vote key's, a wave dash ("2〜3", a Japanese range) too.
    assert entity_key("March 2\u20133") == entity_key("March 2\u301c3") == entity_key("March 2-3") == "march 2-3"


@pytest.mark.parametrize(
    ("said", "page"),
    [
        ("10:30", "Route 1030 leaves daily."),
        ("1030", "It leaves at 10:30."),
        ("2:1", "They won 21 games."),
        ("10.30", "It leaves at 10:30."),
        ("1/2", "Chapter 12 ends it."),
    ],
)
def test_a_time_or_ratio_on_a_page_does_not_support_the_number_its_digits_run_into(said, page) -> None:
    # A colon or a slash between digits was dropped with the punctuation: "10:30" was the entity "1030",
    # and a page's "Route 1030" was its evidence in the graph report.
    traj = {
        "steps": [search(0, "the train"), answer(1, said)],
        "observations": [hits(0, ("d1", "Timetable", page))],
        "answer": said,
    }
    graph = build_graph("When does it leave?", traj)
    assert not [r for r in graph["relations"] if r["kind"] == "supports"]


@pytest.mark.parametrize(
    ("said", "page"),
    [
        ("1,000", "It seats 1000."),
        ("1000", "It seats 1,000."),
        ("100000", "It cost 1,00,000 rupees."),
        ("10:30", "At 10:30."),
    ],
)
def test_a_number_written_with_or_without_digit_group_separators_is_one_entity(said, page) -> None:
    traj = {
        "steps": [search(0, "the hall"), answer(1, said)],
        "observations": [hits(0, ("d1", "Hall", page))],
        "answer": said,
    }
    graph = build_graph("How many seats?", traj)
    assert [r["source"] for r in graph["relations"] if r["kind"] == "supports"] == ["hall"]
    assert entity_key("1,234,567") == "1234567" and entity_key("3,14") == "3,14"
