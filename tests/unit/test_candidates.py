"""Candidate spans and the questions they answer: either-or options, years, a second part's reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langgraph_parallelmuse.candidates import (
    _trim,
    answer_kind,
    answer_type,
    candidates,
    choice_options,
    compound_parts,
    follow_up,
)

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


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        # A relative wh-word before the asking one does not decide the kind.
        ("Chiang Kai-shek was the late President of the Republic of China, who died on which date?", "date"),
        ('The show "Scaredy Squirrel" which was written by who?', "person"),
        ("The state where Henry Worrall died has how many congressional districts?", "number"),
        ("Scott Howell is a consultant who has worked with the mayor of what city?", "name"),
        # With no wh-word that asks, the first one decides.
        ("Name the director who made Jaws.", "person"),
    ],
)
def test_the_kind_is_read_at_the_wh_word_that_asks(question, kind):
    assert answer_kind(question) == kind


def test_a_date_asked_after_a_relative_who_is_a_candidate():
    # Read as a "who" question, every span with a digit was left out.
    question = "Chiang Kai-shek was the late President of the Republic of China, who died on which date?"
    assert "April 5, 1975" in candidates(question, "Chiang Kai-shek died on April 5, 1975, in Taipei.")


def test_a_decimal_number_is_one_candidate_and_a_sentence_s_stop_ends_a_number():
    evidence = (
        "Seattle averages 6.8 inches of snow and 1,250.5 hours of sun. "
        "It was listed as Stiles 1.2.1.6 in 1998. The Needle opened then."
    )
    options = candidates("What is the usual average snowfall in Seattle?", evidence, limit=100)
    assert {"6.8", "1,250.5", "1998"} <= set(options)
    assert not {"6", "8", "5", "1.6", "Stiles 1.2"} & set(options)
    assert not [o for o in options if "1998" in o and o != "1998"]


@pytest.mark.timeout(30)  # the old split took minutes here (5 s at 20,000 spaces, quadratic); now milliseconds
def test_a_long_run_of_spaces_between_names_is_split_in_linear_time():
    """The " and " split tried every start inside a run of blanks before it was anchored at the run's first."""
    assert candidates("Which city is it?", "Alpha" + " " * 100_000 + "Beta") == ["Alpha Beta"]


@pytest.mark.parametrize(
    ("question", "kind", "noun"),
    [
        # The wh-word after a function word asks; one after a noun starts a relative clause.
        ("Chiang Kai-shek, who died on which date?", "date", None),
        ("The director who made Jaws was born in what city?", "name", "city"),
        ("Do you know who wrote Hamlet?", "person", None),
        ("Name the director who made Jaws", "person", None),
    ],
)
def test_the_wh_word_that_asks_decides_what_is_asked(question, kind, noun):
    assert (answer_kind(question), answer_type(question)) == (kind, noun)


@pytest.mark.timeout(10)  # 16 s before: the words before each wh-word were read from the start (quadratic)
def test_a_question_of_many_relative_wh_words_is_read_in_linear_time():
    question = "Ab " + "which ab " * 4444 + "?"
    assert (answer_kind(question), answer_type(question)) == ("name", None)


@pytest.mark.timeout(10)  # 27 s before: each "and" was tried as the split, each read to the end (quadratic)
def test_a_between_question_of_many_ands_is_read_in_linear_time():
    question = "Between " + "ab and " * 11_428 + "?"
    assert (choice_options(question), answer_kind(question)) == ([], "name")
    assert choice_options("Between Simon and Garfunkel and Queen, which band is older?") == [
        "Simon",
        "Garfunkel and Queen",
    ]


def test_a_fraction_is_no_candidate_for_a_thing_named_by_its_type():
    # MuSiQue "In what county is the city where Harris W. Fawell was born?": the agent answered
    # "29.582799", a coordinate of the page it read.
    evidence = (
        "Missouri City is in eastern Fort Bend County at 29.58278 N (29.582799, - 95.539423). "
        "It runs Windows 3.1 and its album 1989 sold well."
    )
    options = candidates("In what county is Missouri City?", evidence, limit=100)
    assert "Fort Bend County" in options
    assert not [o for o in options if o.startswith("29.")]
    # A name ending in a fraction stays; a quantity asked by a measure noun keeps its fraction (the
    # measure names no type: "the name of the height" is no answer).
    assert "Windows 3.1" in options
    assert answer_type("What is the height of the tower?") is None
    assert candidates("What is the height of the tower?", "The tower is 324.5 metres tall.") == ["324.5"]


def test_a_date_is_no_candidate_for_a_thing_named_by_its_type_late_in_the_question():
    # MuSiQue: "The basis of the ETUC's jurisdiction began with the signing of what treaty?" was
    # answered "October 6, 1913"; HotpotQA's "… a second campus in which California city?" "1999".
    evidence = (
        "On October 6, 1913 the union met. The Treaty of Rome was signed in 1957. "
        "The campus in San Diego opened in 1999."
    )
    question = "The basis of the ETUC's jurisdiction began with the signing of what treaty?"
    assert answer_type(question) == "treaty"
    options = candidates(question, evidence, limit=100)
    assert "Treaty of Rome" in options
    assert "October 6, 1913" not in options
    assert "1999" not in candidates("Which California city has the second campus?", evidence, limit=100)
    # A bare number may name a thing of another type ("1989" an album, "747" a model, "1992" an
    # election); a type that is a time keeps every date; no noun phrase is read through a function
    # word ("… starred in what for seven years?").
    assert "1989" in candidates("Her best album is which album?", "Her album 1989 sold well.", limit=100)
    assert "747" in candidates("Which model did Boeing launch in 1966?", "Boeing launched the 747 in 1966.", limit=100)
    assert "1992" in candidates("Which election did he win?", "He won the 1992 election.", limit=100)
    temple = "The temple was built in May 1745, in the 1700s. The battle started on 1 July 1916."
    assert "May 1745" in candidates("What month was the temple built?", temple, limit=100)
    assert "1700s" in candidates("Which century was the temple built in?", temple, limit=100)
    assert "1 July 1916" in candidates("On what day did the battle start?", temple, limit=100)
    assert "1913" in candidates("In which year did the union meet?", evidence, limit=100)
    assert "1913" in candidates("The union met in what century?", evidence, limit=100)
    assert answer_type("She starred in what for seven years?") is None
    assert answer_type("The team is based in what state?") == "state"


@pytest.mark.parametrize(
    "question",
    [
        "In which century was the castle built?",
        "What century was the castle built in?",
        "It was built in which century?",
    ],
)
def test_a_century_question_gets_the_ordinal_centuries_the_evidence_names(question):
    """A century question's answer is an ordinal century ("the 12th century"), which no year span is."""
    evidence = (
        "The castle was built in the 12th century by the Normans and rebuilt in 1850. The church dates from "
        "the Nineteenth Century. The temple is from the 5th century BC. Its 14th-century tower stands."
    )
    options = candidates(question, evidence, limit=100)
    assert answer_kind(question) == "date"
    assert options[:4] == ["12th century", "1850", "Nineteenth Century", "5th century BC"]
    # An adjective is no century, and a year is made into no century the evidence does not name.
    assert "14th-century" not in options
    assert "14th century" not in options
    assert candidates(question, "The castle was built in 1150 and rebuilt in 1850.", limit=100) == ["1150", "1850"]


@pytest.mark.timeout(30)  # a guard: the leading words are stripped in one pass, however many
def test_a_name_made_of_function_words_only_is_a_candidate_whole():
    """ "The Who" lost its "The" and "Who", all function words, was no candidate at all."""
    evidence = "Tommy is an album. The Who recorded Tommy in 1969. It sold well. She said so."
    options = candidates("Which band recorded Tommy?", evidence, limit=100)
    assert options[0] == "The Who"
    assert not {"Who", "It", "She"} & set(options)
    assert candidates("Which band released Soul Mining?", "Soul Mining is an album by The The.") == ["The The"]
    assert candidates("Which city is it?", "The " * 100_000 + "Paris") == ["Paris"]
    # A leading function word still goes from a span with a word of content: "However It" is nothing.
    assert _trim("However It") == "" and _trim("The Beatles") == "Beatles"


def test_centuries_are_options_only_when_a_century_is_asked():
    """Asked for a year, "12th century" took the place of a year among the options."""
    evidence = "The church was built in the 12th century and rebuilt in 1345 and 1890."
    assert candidates("In what year was the church rebuilt?", evidence, limit=2) == ["1345", "1890"]
    assert candidates("In which century was the church built?", evidence, limit=2) == ["12th century", "1345"]


@pytest.mark.timeout(
    10
)  # 3 s at 20,000 characters before, minutes here: the right option was searched from each capital
def test_a_long_right_option_is_read_once():
    question = "Who is it, Ann or " + "A" * 100_000 + " b?"
    assert choice_options(question) == []
    assert candidates(question, "Bob Ross was born in 1901.") == ["Bob Ross"]


def test_a_decomposed_accent_is_read_as_its_composed_letter():
    """A page that writes its accents as combining marks ("E\u0301mile") gave "E" and "Zola", and never
    named an option of the question, which writes them composed."""
    assert candidates("Who wrote it?", "It was written by E\u0301mile Zola in 1880.") == ["\u00c9mile Zola"]
    assert candidates("Which city is it in?", "It is in Ko\u0308ln, Germany.") == ["K\u00f6ln", "Germany"]
    question = "Who is older, Beyonc\u00e9 or Adele?"
    assert candidates(question, "Beyonce\u0301 was born in 1981.") == ["Beyonc\u00e9", "Adele"]
    assert candidates("Which city is it?", "x", titles=["Ko\u0308ln (city)"], exclude=["K\u00f6ln"]) == []


def test_a_title_in_typographic_quotes_is_a_candidate_whole():
    evidence = "The single \u201cFalling Away from Me\u201d was released in 1999."
    assert candidates("What song is it?", evidence)[0] == "Falling Away from Me"


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r", "\u2028", "\u2029", "\x85"])
def test_names_on_lines_of_their_own_stay_apart(newline):
    """Lines split by a "\\r" or a U+2028 alone ran into one name, "Paris London Rome"."""
    evidence = newline.join(["Cities:", "Paris", "London", "Rome"])
    assert candidates("Which city is it?", evidence) == ["Cities", "Paris", "London", "Rome"]


def test_limit_zero_gives_no_candidate():
    assert candidates("Which city is it?", "Paris is nice. Rome too.", limit=0) == []
    assert candidates("Which city is it?", "Paris is nice. Rome too. Oslo too.", limit=2) == ["Paris", "Rome"]


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Pieces of evidence and questions: names of several scripts, combining marks, right-to-left and CJK
# text, emoji, line breaks of every kind, zero-width and control characters, quotes, numbers, dates.
PIECES = [
    "Paris", "E\u0301mile Zola", "\u014csaka", "\u6771\u4eac", "\u0645\u0631\u062d\u0628\u0627", "\U0001f600",
    "\u0130stanbul", "\u01c5", "\ufb01sh", " ", "\n", "\r", "\u2028", "\u200b", "\x00", "\t", ".", ",", "'s",
    "\u2019s", '"', "\u201c", "\u201d", "(", ")", "\\", "1998", "6,960", "3.14", "12 May 1974", "12th century",
    "The", "It", "of", "and", "is a", "striker", "or", "older", "Who", "Which city", "When", "How many", "Is",
    "Between", "?",
]  # fmt: skip
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=5)), max_size=30).map("".join)


@FAST
@given(texts, texts, st.lists(texts, max_size=2), st.integers(0, 20))
def test_every_candidate_is_a_span_of_what_was_read(question, evidence, titles, limit):
    """Candidates come only from the evidence and titles (read composed, whitespace runs as one space),
    distinct case-insensitively, at most ``limit``, and never break a query's JSON; yes/no only for a
    yes/no question and a comparison's options only once the evidence names one of them."""
    out = candidates(question, evidence, titles=titles, limit=limit)
    compare = choice_options(unicodedata.normalize("NFC", question))
    if answer_kind(unicodedata.normalize("NFC", question)) == "yesno":
        assert out == ["yes", "no"]
        return
    if compare and out == compare:
        return
    read = [" ".join(unicodedata.normalize("NFC", text).split()).lower() for text in (evidence, *titles)]
    assert len(out) <= limit and len({o.lower() for o in out}) == len(out)
    for span in out:
        assert span == span.strip() and any(span.lower() in text for text in read)
        assert not ({'"', "\\"} & set(span) or any(c < " " for c in span))


@FAST
@given(texts, texts)
def test_any_question_is_read_without_error(question, answer):
    """A guard (property test): no question, however odd, makes the question readers raise."""
    for part in (question, *(compound_parts(question) or ())):
        answer_kind(part), answer_type(part), choice_options(part)
    resolved = follow_up(question, answer, first=question)
    assert resolved == question or answer in resolved


def test_typographic_quotes_are_no_part_of_an_option():
    """Options in typographic quotes kept them ("“Thriller”"), which no page names: the question got
    the years of its evidence as options instead of the two albums."""
    question = "Which came first, \u201cThriller\u201d or \u201cBad\u201d?"
    assert choice_options(question) == ["Thriller", "Bad"]
    assert candidates(question, "Thriller (1982) and Bad (1987).") == ["Thriller", "Bad"]
    assert choice_options("Which came first, \u2018Thriller\u2019 or \u2018Bad\u2019?") == ["Thriller", "Bad"]


# Spans of equal rank in several sentences, a title, an excluded span, dates, a choice: every place
# where a set of words decides which spans are options and in what order.
_OPTIONS_IN_A_PROCESS = """
import json
from langgraph_parallelmuse.candidates import candidates
ev = ("Paris is the capital of France. Lyon, Marseille and Toulouse are large cities of France. "
      "Berlin, Madrid and Rome are capitals of other countries. Vienna hosted the Congress of Vienna in 1815.\\n"
      "Prague and Warsaw joined the Union in 2004. The Seine flows through Paris and Rouen.")
print(json.dumps([
    candidates("Which city is the capital of France?", ev, titles=["Paris (city)", "Rouen"], exclude=["Toulouse"]),
    candidates("When did Prague join the Union?", ev),
    candidates("Which is the capital of France, Paris or Lyon?", ev),
]))
"""


def test_options_do_not_depend_on_the_string_hash_seed():
    """A guard: a set of strings iterates in an order that changes with each process's hash seed
    (``PYTHONHASHSEED``), and "same seed, same answer" needs the same options in the same order in
    every process. Two processes with other hash seeds must give the same candidates."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", _OPTIONS_IN_A_PROCESS],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        for seed in ("0", "1")
    ]
    assert runs[0] == runs[1]
    assert json.loads(runs[0])[0][:2] == ["Paris", "Lyon"]
