"""Candidate spans and the questions they answer: either-or options, years, a second part's reference."""

from __future__ import annotations

import pytest

from langgraph_parallelmuse.candidates import answer_kind, candidates, choice_options, follow_up

EIFFEL = "Which country is the Eiffel Tower in?"


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        # A title with "or" in it is no comparison: the question asks for a date, a number, a person.
        ("When was the singer of Love or Lust born?", "date"),
        ("When, exactly, was the singer of Love or Lust born?", "date"),
        ("How many copies did the song Love or Lust sell?", "number"),
        ("Who directed Dr. Strangelove or How I Learned to Stop Worrying?", "person"),
        # A phrase naming an entity (a hop's question) with an "or" in it compares nothing either.
        ('Which is the city where Tom Waits or "Iggy Pop" was born?', "name"),
    ],
)
def test_an_or_that_compares_nothing_gives_no_options(question, kind):
    assert choice_options(question) == []
    assert answer_kind(question) == kind


@pytest.mark.parametrize(
    ("question", "options"),
    [
        # Options that are no names.
        ("Which came first, the chicken or the egg?", ["chicken", "egg"]),
        ("Which is bigger, cats or dogs?", ["cats", "dogs"]),
        # A note in parentheses is no part of the name the evidence uses.
        ("Who is older, Sid Haig (actor) or Vic Darchinyan?", ["Sid Haig", "Vic Darchinyan"]),
        ("Which is longer, the Nile or the Amazon (river)?", ["Nile", "Amazon"]),
        # What follows the comma asks (a relative clause): no option.
        ("When was the singer born, who sang Love or Lust?", []),
        # After a comma the right option may go on past its name.
        ("Which river is longer, the Nile or the Amazon river?", ["Nile", "Amazon river"]),
        ("Which city is larger, Paris or London, England?", ["Paris", "London, England"]),
    ],
)
def test_a_comparison_names_its_options_whole(question, options):
    assert choice_options(question) == options


def test_an_option_is_in_the_evidence_only_as_whole_words():
    # "Ian Jones" is not named by a page on Brian Jones: no choice between two options unread.
    options = candidates("Who is older, Ian Jones or Tom Waits?", "Brian Jones was born in 1942.")
    assert "Ian Jones" not in options and "Brian Jones" in options
    assert candidates("Who is older, Ian Jones or Tom Waits?", "Ian Jones was born in 1942.") == [
        "Ian Jones",
        "Tom Waits",
    ]


def test_a_year_is_no_piece_of_a_grouped_or_decimal_number():
    evidence = "Foo had 6,960 residents, 1,250 shops and 3.1415 parks. It was founded in 1901."
    assert candidates("When was Foo founded?", evidence) == ["1901"]


@pytest.mark.parametrize(
    ("part", "first", "resolved"),
    [
        ("what is the capital of that country?", EIFFEL, "what is the capital of France?"),
        # A relative "that" is no reference; the phrase naming the answer's type is.
        (
            "what is the river that flows through that country?",
            EIFFEL,
            "what is the river that flows through France?",
        ),
        ("what is its capital?", EIFFEL, "what is France's capital?"),
        ("who founded it and when?", EIFFEL, "who founded France and when?"),
        ("when was he born?", "Who directed Jaws?", "when was France born?"),
        ("who married her?", "Who sang Jolene?", "who married France?"),
        # After a "who" question, a demonstrative before a noun that names a person; a work it names
        # is the first part's subject, not its answer ("Who directed Jaws, and when was that film released?").
        ("when was that director born?", "Who directed Jaws?", "when was France born?"),
        ("when was that film released?", "Who directed Jaws?", "when was that film released?"),
        # No reference: the part as it is, not a phrase replaced by the answer.
        ("what year did this happen?", EIFFEL, "what year did this happen?"),
    ],
)
def test_a_second_part_names_the_first_answer_where_it_refers_to_it(part, first, resolved):
    assert follow_up(part, "France", first=first) == resolved
