"""Answer labels: the shown answer and its vote key read the same label off it."""

from __future__ import annotations

import pytest

from langgraph_parallelmuse.aggregate import majority_vote
from langgraph_parallelmuse.answers import normalize_vote_key, strip_answer_label


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        ("Answer： Paris", "Paris"),  # a full-width colon: NFKC makes it a colon
        ("Ａｎｓｗｅｒ: Paris", "Paris"),
        ("Answer: Answer: Paris", "Paris"),
        ("**Final answer:** Answer： Paris", "Paris"),
        ("Answer： 10⁶", "10⁶"),  # the shown answer keeps its own characters
    ],
)
def test_labels_are_read_as_nfkc_writes_them_and_all_go(answer, shown):
    """The label was looked for before NFKC folding ("Answer：" kept, key "answer paris"), and only
    once (the key of "Answer: Answer: Paris" was "answer paris" while the shown answer was "Paris")."""
    assert strip_answer_label(answer) == shown
    assert normalize_vote_key(answer) == normalize_vote_key(shown)


def test_a_label_written_differently_does_not_split_a_vote(make_trajectory):
    answers = ["Lyon", "Answer： Paris", "Answer: Answer: Paris"]
    assert majority_vote([make_trajectory(f"t{i}", answer=a) for i, a in enumerate(answers)]) == "Paris"


@pytest.mark.parametrize(("answer", "shown"), [("Answer Me", "Answer Me"), ("Answer:", ""), (None, "")])
def test_an_answer_without_a_label_is_kept_and_a_label_alone_is_no_answer(answer, shown):
    assert strip_answer_label(answer) == shown
    assert normalize_vote_key(answer) == normalize_vote_key(shown)


@pytest.mark.parametrize(
    ("one", "other"),
    [("Zürich", "Zurich"), ("Beyoncé", "BEYONCE"), ("İstanbul", "Istanbul"), ("Việt Nam", "Viet Nam")],
)
def test_a_latin_name_with_and_without_its_accents_is_one_vote(one, other):
    assert normalize_vote_key(one) == normalize_vote_key(other)


@pytest.mark.parametrize(("one", "other"), [("1,000", "1000"), ("1,00,000", "100000"), ("2,500,000", "2500000")])
def test_a_number_with_or_without_its_digit_group_separators_is_one_vote(one, other):
    """Indian grouping ("1,00,000") kept its first comma ("1,00000"), where the entity keys dropped it."""
    assert normalize_vote_key(one) == normalize_vote_key(other)


@pytest.mark.parametrize(("one", "other"), [("が", "か"), ("हिंदी", "हद"), ("3.5", "35"), ("Αθήνα", "Αθηνα")])
def test_marks_of_other_scripts_and_number_punctuation_still_tell_answers_apart(one, other):
    assert normalize_vote_key(one) != normalize_vote_key(other)


def test_answers_written_without_their_accents_do_not_lose_the_vote(make_trajectory):
    # Two of three votes for Zurich were split across "Zürich" and "Zurich", and Geneva won the tie.
    answers = {"t0": "Geneva", "t1": "Zürich", "t2": "Geneva", "t3": "Zurich", "t4": "Zurich"}
    assert majority_vote([make_trajectory(i, answer=a) for i, a in answers.items()]) == "Zurich"


@pytest.mark.parametrize(("one", "other"), [("Å, Lofoten", "Lofoten"), ("À bout de souffle", "Bout de souffle")])
def test_an_accented_word_is_no_article_once_its_accent_is_folded(one, other):
    # Folded before the articles were read, "Å" and "à" were the article "a" and left the key.
    assert normalize_vote_key(one) != normalize_vote_key(other)
    assert normalize_vote_key("The Å") == normalize_vote_key("Å")


@pytest.mark.parametrize("spaced", ["1914 – 1918", "1914 - 1918", "1914  —  1918", "1914- 1918", "1914– 1918"])
def test_a_range_written_with_spaces_around_its_dash_is_one_vote_with_the_range_without(spaced):
    # The spaced dash was a separator: "1914 1918", a vote apart from "1914–1918".
    assert normalize_vote_key(spaced) == normalize_vote_key("1914–1918") == "1914-1918"


@pytest.mark.parametrize("two_numbers", ["5 -3", "10 -20 °C"])
def test_a_dash_spaced_on_one_side_only_is_no_range(two_numbers):
    # Perhaps a second, negative number: kept apart from the range.
    assert normalize_vote_key(two_numbers) != normalize_vote_key(two_numbers.replace(" -", "-"))


def test_a_spaced_range_does_not_lose_its_vote(make_trajectory):
    answers = {"t0": "1939-1945", "t1": "1914–1918", "t2": "1939-1945", "t3": "1914 – 1918", "t4": "1914 - 1918"}
    winner = majority_vote([make_trajectory(i, answer=a) for i, a in answers.items()])
    assert normalize_vote_key(winner) == "1914-1918"
