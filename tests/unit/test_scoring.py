"""Answer metrics (normalisation, aliases, yes/no, word boundaries), recall, and the LLM judge."""

from __future__ import annotations

import pytest
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage

from langgraph_parallelmuse.eval import (
    contains_gold,
    exact_match,
    f1_score,
    llm_judge,
    normalize_answer,
    normalize_vote_key,
    parse_judgement,
    retrieval_recall,
    score_answer,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  An   apple, a   DAY! ", "apple day"),
        ("theatre", "theatre"),  # articles only as whole words
        ("G. Stanley Hall", "g stanley hall"),
        ("", ""),
        (None, ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match_takes_best_alias():
    assert exact_match("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"]) == 1.0
    assert exact_match("the latin.", ["Latin"]) == 1.0
    assert exact_match("Greek", ["Latin"]) == 0.0


def test_single_string_answer_is_one_alias_not_characters():
    assert exact_match("paris", "Paris") == 1.0
    assert exact_match("p", "Paris") == 0.0


def test_f1_partial_and_max_over_aliases():
    assert f1_score("Stanley Hall the psychologist", ["G. Stanley Hall"]) == pytest.approx(2 / 3)
    # the exact alias wins over the partial one
    assert f1_score("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"]) == 1.0
    assert f1_score("Rome", ["Paris"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("yes", ["yes"], 1.0),
        ("Yes.", ["yes"], 1.0),
        ("no", ["yes"], 0.0),
        ("no it is not", ["no"], 0.0),  # would get token overlap without the special case
        ("yes", ["yes they are"], 0.0),
        ("noanswer", ["no answer"], 0.0),
    ],
)
def test_f1_yes_no_special_case(prediction, gold, expected):
    assert f1_score(prediction, gold) == expected


@pytest.mark.parametrize("prediction", [None, "", "   ", "the"])
def test_empty_prediction_scores_zero(prediction):
    assert score_answer(prediction, ["Paris"]) == {"em": 0.0, "f1": 0.0, "contains": 0.0}


def test_empty_answers_rejected():
    with pytest.raises(ValueError, match="answers is empty"):
        score_answer("Paris", [])


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("He was born in 1990.", ["1990"], 1.0),
        ("19900 people", ["1990"], 0.0),
        ("in 11990", ["1990"], 0.0),
        ("The answer is G. Stanley Hall, a psychologist", ["G. Stanley Hall"], 1.0),
        ("Parisian food", ["Paris"], 0.0),
        ("Rome, not Paris", ["Berlin", "Paris"], 1.0),
        ("anything", ["the"], 0.0),  # an answer that normalises to nothing never matches
    ],
)
def test_contains_gold_word_boundaries(prediction, gold, expected):
    assert contains_gold(prediction, gold) == expected


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        # Before: 1.0 each, through the alias "it" of Italy, "no" of Norway, the yes/no gold "no".
        ("It is Greece", ["seemingly in Italy", "IT", "ITA", "Italy", "Italia", "it"], 0.0),
        ("There is no record of Sweden", ["Norway", "NO", "NOR", "no"], 0.0),
        ("Yes, there is no doubt", ["no"], 0.0),
        ("yes and no", ["yes"], 0.0),
        # Still credited: the short alias or yes/no as the whole answer, a longer alias in a
        # sentence, and a short gold that is the answer's only form.
        ("IT.", ["Italy", "it"], 1.0),
        ("No", ["no"], 1.0),
        ("It is in Italy", ["Italy", "it"], 1.0),
        ("The state has 4 districts", ["4"], 1.0),
    ],
)
def test_contains_gold_credits_yes_no_and_short_aliases_only_as_the_whole_answer(prediction, gold, expected):
    assert contains_gold(prediction, gold) == expected


def test_score_answer_combines_metrics():
    scores = score_answer("It was Latin", ["Latin"])
    assert scores["em"] == 0.0
    assert scores["f1"] == pytest.approx(0.5)
    assert scores["contains"] == 1.0


def test_retrieval_recall():
    assert retrieval_recall(["d1", "d2", "d3"], ["d1", "d2"]) == 1.0
    assert retrieval_recall(["d1", "d1", "d9"], ["d1", "d2"]) == 0.5
    assert retrieval_recall([], ["d1"]) == 0.0
    with pytest.raises(ValueError, match="supporting_doc_ids is empty"):
        retrieval_recall(["d1"], [])


@pytest.mark.parametrize(
    "variant",
    [
        "Paris",
        "paris.",
        "Answer: Paris",
        "answer:  the Paris.",
        "**Final Answer:** Paris",
        " PARIS ",
        "“Paris”",
        "ＰＡＲＩＳ。",
    ],
)
def test_vote_key_groups_equivalent_answers(variant):
    assert normalize_vote_key(variant) == "paris"


def test_vote_key_keeps_answer_word_without_label():
    assert normalize_vote_key("Answer Me") == "answer me"
    assert normalize_vote_key(None) == ""


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("3.5", "35"),
        ("-5", "5"),
        ("1/2", "12"),
        ("C++", "C"),
        ("9:30", "930"),
        ("2.5 million", "25 million"),
        # Every Unicode punctuation character went: "C#" was "c", "#1" was "1", "-.5" was ".5".
        ("C#", "C"),
        ("F#", "F"),
        ("A# minor", "minor"),
        ("-.5", ".5"),
    ],
)
def test_vote_key_keeps_the_punctuation_that_makes_a_different_answer(one, other):
    """Deleting punctuation put "3.5" and "35" in one vote group, shown by whichever came first."""
    assert normalize_vote_key(one) != normalize_vote_key(other)
    # Scoring stays the standard HotpotQA normalisation, which deletes punctuation.
    assert normalize_answer(one) == normalize_answer(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("北京", "北京。"),
        ("Hamlet", "“Hamlet”"),
        ("1914-1918", "1914–1918"),
        ("-5", "\u22125"),  # a minus sign
        ("-.5", "\u2212.5"),
        ("Ender's Game", "Ender’s Game"),
        ("Zürich", "Zu\u0308rich"),  # composed and decomposed
        ("ABC", "ＡＢＣ"),
        ("3,000", "3000"),
        ("U.S.", "US"),
        # Hyphens inside a word became spaces: "Spider-Man" and "Spiderman" voted apart.
        ("Spider-Man", "Spiderman"),
        ("e-mail", "email"),
        ("Wi-Fi", "WiFi"),
        ("B-52", "B52"),
        ("COVID-19", "COVID19"),
        ("“The Hamlet”", "Hamlet"),
        ("10⁻⁶", "10^-6"),
        ("H₂O", "H2O"),
        # Format characters were kept: "Paris\u200b" voted apart from "Paris".
        ("Paris", "Paris\u200b"),
        ("Paris", "\ufeffPa\u00adris"),
        ("C#", "“C#”."),
        ("Paris", "# Paris"),  # a "#" that touches no word is markup
        # ... and one before a word or number is a number sign or markup: one answer.
        ("1", "#1"),
        ("Room 5", "Room #5"),
        ("Lyon", "###Lyon"),
    ],
)
def test_vote_key_groups_one_answer_written_with_other_characters(one, other):
    assert normalize_vote_key(one) == normalize_vote_key(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("A-ha", "Ha"),
        ("The A-Team", "The Team"),
        ("A-League", "League"),
        ("Texas A&M", "Texas M"),
        ("10⁶", "106"),
        ("2³", "23"),
        ("Jean-Paul", "Jean Paul"),
    ],
)
def test_vote_key_keeps_apart_what_the_scorer_keeps_apart(one, other):
    """Punctuation became spaces before the articles went ("A-ha" voted as "Ha", "The A-Team" as
    "The Team"), and NFKC made the exponent of "10⁶" a digit of "106"."""
    assert normalize_vote_key(one) != normalize_vote_key(other)
    assert normalize_answer(one) != normalize_answer(other)


# LLM judge -----------------------------------------------------------------------------------


class _RecordingModel(FakeListChatModel):
    """Fake judge that keeps the prompts it was sent."""

    prompts: list[str] = []

    async def ainvoke(self, input, config=None, **kwargs):
        self.prompts.append(input[0].content)
        return await super().ainvoke(input, config, **kwargs)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("extracted_final_answer: Paris\nreasoning: same\ncorrect: yes\nconfidence: 90", True),
        ("extracted_final_answer: Rome\nreasoning: differs\ncorrect: no\nconfidence: 80", False),
        ("**correct:** Yes", True),
        ("- Correct: NO.", False),
        ("Yes", True),
        ("no, the response names another city", False),
        ("<think>draft\ncorrect: no</think>\ncorrect: yes", True),
        ("reasoning: the answer is correct, no doubt", None),
        ("I am not sure.", None),
        ("", None),
    ],
)
async def test_llm_judge_parses_verdict(reply, expected):
    model = FakeListChatModel(responses=[reply])
    assert await llm_judge(model, "Capital of France?", "Paris", ["Paris"]) is expected


async def test_llm_judge_with_generic_fake_model():
    model = GenericFakeChatModel(messages=iter([AIMessage(content="correct: yes")]))
    assert await llm_judge(model, "Capital of France?", "It is Paris.", "Paris") is True


async def test_llm_judge_prompt_holds_question_prediction_and_aliases():
    model = _RecordingModel(responses=["correct: yes"], prompts=[])
    await llm_judge(model, "Who founded it?", "Stanley Hall", ["G. Stanley Hall", "Stanley Hall"])
    (prompt,) = model.prompts
    assert "[question]: Who founded it?" in prompt
    assert "[response]: Stanley Hall" in prompt
    assert "[correct_answer]: G. Stanley Hall (also accepted: Stanley Hall)" in prompt


@pytest.mark.parametrize("prediction", [None, "", "  "])
async def test_llm_judge_empty_prediction_is_wrong_without_call(prediction):
    model = _RecordingModel(responses=["correct: yes"], prompts=[])
    assert await llm_judge(model, "q?", prediction, ["Paris"]) is False
    assert model.prompts == []


@pytest.mark.parametrize("gold", [[], "", "  ", ["", " "]])
async def test_llm_judge_empty_gold_rejected(gold):
    """Before: a blank gold was sent, and the judge's verdict against nothing was scored."""
    with pytest.raises(ValueError, match="gold is empty or blank"):
        await llm_judge(FakeListChatModel(responses=["yes"]), "q?", "Paris", gold)


async def test_llm_judge_blank_aliases_are_left_out_and_non_strings_refused():
    model = _RecordingModel(responses=["correct: yes"], prompts=[])
    await llm_judge(model, "q?", "Paris", ["", "Paris", " "])
    assert "[correct_answer]: Paris\n" in model.prompts[0] + "\n"
    with pytest.raises(ValueError, match="gold holds None"):
        await llm_judge(model, "q?", "Paris", ["Paris", None])


def test_parse_judgement_takes_last_verdict_line():
    assert parse_judgement("correct: yes\n...on reflection...\ncorrect: no") is False


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        # Before: forms of the verdict judges commonly write were unreadable (None, scored as wrong).
        ('{"extracted_final_answer": "Paris", "correct": "yes"}', True),
        ('```json\n{"extracted_final_answer": "Rome", "correct": false}\n```', False),
        ("Correct - yes", True),
        ("correct：yes", True),
        ("reasoning: they differ\ncorrect — No", False),
        # A dash that starts a comment is no verdict: the verdict line above stands.
        ("correct: yes\n...\nCorrect — no meaningful difference", True),
        ("correct: yes\n\nCorrect - no caveats.", True),
        ("Correct — Yes, both name Paris.", True),
        ("**Correct** - no, it names Lyon.", False),
        ("Correct - No (the years differ)", False),
        # The prompt's own "correct: Answer 'yes' if ..." echoed after the verdict is not one.
        ("correct: yes\nconfidence: 100\ncorrect: Answer 'yes' if ... 'no' otherwise", True),
    ],
)
def test_parse_judgement_reads_json_dash_and_full_width_colon_verdicts(reply, expected):
    assert parse_judgement(reply) is expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        # Before: the draft "correct: no" of a reasoning cut off by max_tokens was taken as the verdict.
        ("<think>Gold is Paris. First guess\ncorrect: no\nwait, 'the city of Paris' is Paris, so", None),
        # An R1-style template opens the think block in the prompt: the reply holds only its end.
        ("correct: no ... hmm, actually they match\n</think>\nThe answers match.", None),
        ("correct: no ... hmm, actually they match\n</think>\ncorrect: yes", True),
        ("<think>a</think>\n<think>b</think>\ncorrect: yes", True),
        ("< /Think >\ncorrect: no", False),
        # A reply that reopens a think block after its verdict keeps the verdict (only a reply that is
        # all unclosed reasoning has none): a mention of the tag turned a stated verdict unreadable.
        ("<think>a</think>\ncorrect: yes\n<think>on reflection", True),
        ("correct: yes (the <think> block above was a draft)", True),
    ],
)
def test_parse_judgement_reads_only_what_follows_the_reasoning(reply, expected):
    assert parse_judgement(reply) is expected


@pytest.mark.timeout(30)  # a guard: each reply below is read in milliseconds
@pytest.mark.parametrize("filler", ["\n" * 100_000, "\n-" * 50_000, " \n" * 50_000], ids=["blank", "dashes", "spaces"])
def test_a_reply_of_many_blank_lines_is_read_in_linear_time(filler):
    # A model that degenerates into blank lines until its token limit: the line form's leading \W* ran
    # across lines from each line start to the reply's end (100,000 blank lines: 169 s).
    assert parse_judgement(filler) is None
    assert parse_judgement("reasoning: same city" + filler + "**correct:** yes" + filler) is True


@pytest.mark.timeout(30)  # a guard: each reply below is read in milliseconds (before: minutes)
@pytest.mark.parametrize("run", [":" * 100_000, "-" * 100_000, "—" * 100_000], ids=["colons", "dashes", "em-dashes"])
def test_correct_before_a_long_run_of_separators_is_read_in_linear_time(run):
    # A looping reply: the lazy marks between "correct" and its separator tried each separator of the
    # run as the one, then read the rest of the run for the verdict (20,000 colons: 8 s).
    assert parse_judgement("correct" + run + "x") is None
    assert parse_judgement("correct" + run + " yes") is True


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        # Before: a grader's one-word verdict was unreadable, and the judged accuracy left its question out.
        ("CORRECT", True),
        ("Incorrect.", False),
        ("incorrect, because the years differ", False),
        ("**Correct** — both name Paris", True),
        ("INCORRECT\n\nThe gold is Lyon.", False),
        # A verdict line still wins, and correct as a key or an adjective is no verdict.
        ("Correct.\ncorrect: no", False),
        ("Correct answer: Rome", None),
        ("Correct: Paris", None),
        ("correct\nno", None),
        ("correct" + "-" * 1000 + "x", None),
        # A looping reply cut at its token limit ends in its run; a "no" after the word is no "correct".
        ("correct" + "-" * 1000, None),
        ("Correct (yes/no): no", False),
        ("correct (yes/no): yes", True),
        ("Correct, no.", None),
        ("Correct.\nno", None),
    ],
)
def test_parse_judgement_reads_a_reply_that_opens_with_correct_or_incorrect(reply, expected):
    assert parse_judgement(reply) is expected
