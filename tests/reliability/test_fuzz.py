"""Fault injected: arbitrary model text and arbitrary logprob payloads (hypothesis).

``protocol.parse_action`` and ``protocol.region_spans`` get random text built from protocol
fragments; they must never raise, and spans must lie inside the text. ``protocol.neutralize``
must leave no protocol tag in any text, so a wrapped tool response never parses as an action.
``logprobs.normalize_logprobs`` gets JSON-like payloads (``st.recursive``); its only documented
error is ``ProtocolError``. Known violations are pinned by explicit, strict-xfail examples.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from langgraph_parallelmuse.answers import (
    normalize_answer,
    normalize_vote_key,
    strip_answer_label,
    token_f1,
    vote_overlap,
    vote_tokens,
)
from langgraph_parallelmuse.compress import SECTIONS, parse_report, reasoning_line
from langgraph_parallelmuse.errors import ProtocolError
from langgraph_parallelmuse.eval.judge import parse_judgement
from langgraph_parallelmuse.eval.scoring import score_answer
from langgraph_parallelmuse.logprobs import normalize_logprobs
from langgraph_parallelmuse.protocol import (
    format_tool_response,
    neutralize,
    parse_action,
    region_spans,
    trajectory_text,
)
from langgraph_parallelmuse.references import inner_reference, reference_depth, resolve

pytestmark = pytest.mark.timeout(60)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ANY_TAG = re.compile(r"<\s*/?\s*(think|tool_call|tool_response|answer)\s*>", re.IGNORECASE)
FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<tool_response>",
    "</tool_response>",
    "< answer >",
    "<ANSWER>",
    "</ Tool_Call >",
    "<",
    ">",
    "/",
    "\n",
    " ",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    '"',
    '"name"',
    '"arguments"',
    '"parameters"',
    '"search"',
    '"q"',
    "null",
    "1",
    "-1e309",
    "NaN",
    "\\",
    "\\u0000",
    '{"name": "search", "arguments": {"query": "q"}}',
    '"{\\"query\\": 1}"',
    "answer",
    "tool_call",
    "é",
    "\udcff",
    "\x00",
]
protocol_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=30).map("".join)


# ----------------------------------------------------------------------------- parser


@FAST
@given(protocol_text, st.booleans())
@example('<think>x</think><tool_call>{"name": "search", "arguments": {"query": "q"}}', False)
@example("<answer></answer><tool_call>", True)
@example("<tool_call><answer>x</answer>", False)
def test_parse_action_never_raises_and_returns_a_well_formed_action(text, truncated):
    action = parse_action(text, truncated=truncated)
    assert action["type"] in ("tool_call", "answer", "invalid")
    if action["type"] == "tool_call":
        assert isinstance(action["name"], str) and isinstance(action["arguments"], dict)
        assert "<tool_call>" in text
        json.dumps(action, allow_nan=True)
    elif action["type"] == "answer":
        assert not truncated
        assert action["answer"] == action["answer"].strip() and action["answer"]
        assert "<answer>" in text
    else:
        assert isinstance(action["error"], str) and action["error"]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "search", "arguments": {"q": ' + "1" * 5000 + "}}</tool_call>",
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        '<tool_call>{"name": "search", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
    ],
    ids=["huge-int", "deep-nesting", "deep-nesting-in-string-args"],
)
def test_parse_action_survives_pathological_json(text):
    assert parse_action(text)["type"] == "invalid"


@FAST
@given(protocol_text)
def test_region_spans_lie_inside_the_text_after_their_opening_tag(text):
    spans = region_spans(text)
    assert set(spans) <= {"reasoning", "exploration", "answer"}
    tags = {"reasoning": "think", "exploration": "tool_call", "answer": "answer"}
    for region, (start, end) in spans.items():
        assert 0 <= start <= end <= len(text)
        # or a step begun inside a think block its template opened: the reasoning up to </think>
        opened_before = region == "reasoning" and start == 0 and text[end:].startswith("</think>")
        assert opened_before or text[:start].endswith(f"<{tags[region]}>")
        assert f"</{tags[region]}>" not in text[start:end]


# ----------------------------------------------------------------------------- neutraliser


@FAST
@given(protocol_text)
@example("<<answer>>")
@example("<ans<answer>wer>")
@example("</tool_response\n>")
def test_neutralised_text_has_no_tags_and_never_parses_as_an_action(text):
    safe = neutralize(text)
    assert ANY_TAG.search(safe) is None
    assert neutralize(safe) == safe  # idempotent
    assert safe.replace("&lt;", "<") == text.replace("&lt;", "<")  # only '<' of tags changed
    wrapped = format_tool_response(text)
    assert [m.group(0) for m in ANY_TAG.finditer(wrapped)] == [
        "<tool_response>",
        "</tool_response>",
    ]
    assert parse_action(wrapped)["type"] == "invalid"
    assert region_spans(wrapped) == {}
    # Embedded after a model turn, the tool response adds no action of its own.
    turn = "<think>look it up</think>\n"
    assert parse_action(turn + wrapped)["type"] == "invalid"
    log = trajectory_text("q", [{"index": 0, "text": turn}], [{"step": 0, "content": text}], max_observation_chars=50)
    assert ANY_TAG.search(neutralize(log)) is None


# Tag-like text: angle brackets, slashes and runs of every kind of blank around tag names.
tag_soup = st.lists(
    st.sampled_from(
        ["<", "</", "/", ">", " ", "  ", "\n", "\t", "\r\n", "answer", "THINK", "tool_call", "tool_response", "x"]
    ),
    max_size=40,
).map("".join)


@FAST
@given(tag_soup)
@example("<  / \n answer \t>")
@example("< //answer>")
@example("<\n\n/\n\nthink\n\n>")
def test_the_neutraliser_defuses_exactly_the_tags_the_backtracking_pattern_matched(text):
    """Its pattern's quantifiers became possessive (linear time); it must match what it matched before."""
    assert neutralize(text) == ANY_TAG.sub(lambda m: "&lt;" + m.group(0)[1:], text)


# ----------------------------------------------------------------------------- logprob normaliser

KEYS = [
    "content",
    "token",
    "logprob",
    "top_logprobs",
    "bytes",
    "probs",
    "prob",
    "tok_str",
    "tokens",
    "token_logprobs",
    "text_offset",
    "completion_probabilities",
]
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
json_like = st.recursive(
    json_scalar,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=4)), children, max_size=5),
    ),
    max_leaves=25,
)


def _check_records(records, text):
    assert isinstance(records, list)
    for rec in records:
        assert isinstance(rec["token"], str)
        assert isinstance(rec["logprob"], float) and not math.isnan(rec["logprob"])
        assert 0 <= rec["start"] <= rec["end"]
        if text is not None:
            assert rec["end"] <= len(text)
        for alt in rec["top_logprobs"]:
            assert isinstance(alt[0], str) and not math.isnan(alt[1])


@FAST
@given(json_like, st.one_of(st.none(), st.text(max_size=10)))
@example({"content": [{"token": "a", "logprob": -1, "top_logprobs": 5}]}, None)
@example({"content": [{"token": "a", "probs": None}]}, None)
@example({"completion_probabilities": 5}, None)
@example({"tokens": 5, "token_logprobs": []}, None)
@example({"content": [{"token": "a", "logprob": 10**400}]}, None)
def test_normalize_logprobs_raises_only_protocol_error_on_any_payload(payload, text):
    try:
        records = normalize_logprobs(payload, text)
    except ProtocolError:
        return
    _check_records(records, text)


# Well-typed payloads (the shapes real servers send, with hostile values): must always work.
token = st.text(min_size=0, max_size=4)
logprob = st.one_of(
    st.floats(max_value=0, allow_nan=False),
    st.just(float("-inf")),
    st.integers(min_value=-(10**6), max_value=0),
)
raw_bytes = st.lists(st.integers(min_value=0, max_value=255), max_size=4)
alt = st.fixed_dictionaries({"token": token, "logprob": logprob}, optional={"bytes": raw_bytes})
chat_entry = st.fixed_dictionaries(
    {"token": token, "logprob": logprob},
    optional={"top_logprobs": st.lists(alt, max_size=3), "bytes": raw_bytes},
)
chat_payload = st.one_of(
    st.fixed_dictionaries({"content": st.one_of(st.none(), st.lists(chat_entry, max_size=8))}),
    st.lists(chat_entry, max_size=8),
)
llama_entry = st.fixed_dictionaries(
    {"content": token},
    optional={
        "probs": st.lists(
            st.fixed_dictionaries({"tok_str": token, "prob": st.floats(min_value=0, max_value=1)}),
            max_size=3,
        )
    },
).map(lambda e: e if "probs" in e else {**e, "logprob": -0.5})
llama_payload = st.fixed_dictionaries({"completion_probabilities": st.lists(llama_entry, max_size=6)})


@st.composite
def completions_payload(draw):
    tokens = draw(st.lists(token, max_size=6))
    return {
        "tokens": tokens,
        "token_logprobs": [draw(logprob) for _ in tokens],
        "top_logprobs": [draw(st.dictionaries(token, logprob, max_size=3)) for _ in tokens],
    }


@FAST
@given(
    st.one_of(chat_payload, llama_payload, completions_payload()),
    st.one_of(st.none(), st.text(max_size=12)),
)
@example(
    {
        "content": [
            {"token": "\ufffd", "logprob": -1, "bytes": [0xE2, 0x82]},
            {"token": "\ufffd", "logprob": -1, "bytes": [0xAC]},
        ]
    },
    "€",
)
@example({"content": [{"token": "x", "logprob": -1, "bytes": [0xFF]}] * 3}, "")
def test_well_typed_payloads_normalise_with_offsets_in_bounds(payload, text):
    records = normalize_logprobs(payload, text)
    _check_records(records, text)
    starts = [r["start"] for r in records]
    assert starts == sorted(starts)  # tokens come in text order


# ----------------------------------------------------------------------------- answers, reports, verdicts
# Text a model or a user writes: combining marks, right-to-left and CJK letters, emoji, a lone
# surrogate, NUL, CR, U+2028, zero-width and format characters, compatibility forms, and the marks
# the normalisers treat specially (articles, labels, number punctuation, a sharp).
ODD_TEXT = [
    "\u0301", "\u05d0", "\u202e", "北", "京", "😀", "\ud800", "\x00", "\r", "\u2028", "\u200b", "\ufeff", "İ",
    "ß", "ﬁ", "Ⓐ", "⁶", "₂", "−", "–", "—", "'", "’", ".", ",", "-", "#", "^", "%", " ", "\n", "\t", "a", "A",
    "the", "an", "The", "answer", "Answer:", "final answer:", "：", "*", "1", "3", "_", "`", "“", "ʼ", "\u00ad",
    "é", "Å", "が", "\u3099", "ǅ", "½", "①",
]  # fmt: skip
odd_text = st.lists(st.one_of(st.sampled_from(ODD_TEXT), st.text(max_size=3)), max_size=20).map("".join)


@FAST
@given(odd_text, odd_text)
def test_scoring_normalisation_is_idempotent_and_token_f1_symmetric(a, b):
    assert normalize_answer(normalize_answer(a)) == normalize_answer(a)
    assert 0.0 <= token_f1(a, b) == token_f1(b, a) <= 1.0
    assert 0.0 <= vote_overlap(a, b) <= 1.0
    assert math.isclose(vote_overlap(a, b), vote_overlap(b, a))
    # Equal answers agree fully, unless nothing of them is left to compare (HotpotQA's script
    # gives "the" against "the" no token credit either).
    assert token_f1(a, a) == (1.0 if normalize_answer(a) else 0.0)
    assert vote_overlap(a, a) == (1.0 if vote_tokens(a) else 0.0)


@FAST
@given(odd_text, st.lists(odd_text, min_size=1, max_size=3))
def test_an_exact_match_also_scores_full_f1_and_contains(prediction, golds):
    scores = score_answer(prediction, golds)
    assert all(0.0 <= value <= 1.0 for value in scores.values())
    if scores["em"]:
        assert scores["f1"] == scores["contains"] == 1.0


@FAST
@given(odd_text)
@example("Answer: Answer： 10⁶")
@example("**Final answer:** ﬁ")
@example("Answer:\u0301_")
@example("_")
def test_an_answer_label_is_cut_off_the_front_and_changes_no_vote(text):
    # (The key is not idempotent by design: the articles are read before the accents and the
    # punctuation go, so the key of "Å" is "a", and "a" before another word is an article.)
    stripped = strip_answer_label(text)
    # The emphasis closing the answer goes with a label's ("Answer: **Paris**" is "Paris"); without a
    # label the answer is kept whole ("_" is "_").
    assert text.strip().endswith(stripped) or text.strip().rstrip(" \t\n*_").endswith(stripped)
    assert normalize_vote_key(stripped) == normalize_vote_key(text)


REPORT_FRAGMENTS = [
    *SECTIONS, ":", "：", "\n", "\r\n", " ", "**", "#", "- ", "1. ", "Final answer", "FINAL ANSWER", " - ", "—",
    "<answer>", "</answer>", "<ANSWER>", "Answer:", "<think>", "</think>", "Paris", "\u2028",
]  # fmt: skip
report_text = st.lists(
    st.one_of(st.sampled_from(REPORT_FRAGMENTS), st.sampled_from(ODD_TEXT), st.text(max_size=4)), max_size=40
).map("".join)


@FAST
@given(report_text)
@example("<answer>")  # an unclosed tag written again took the next one into the answer
@example("Final reasoning: c\n<answer></answer>")
def test_a_report_never_loses_its_answer_tag_and_its_parts_are_well_formed(text):
    sections, answer = parse_report(text)
    assert set(sections) <= set(SECTIONS)
    assert answer is None or answer == " ".join(answer.split()) != ""
    assert "\n" not in reasoning_line(text)
    if "<think>" not in text:
        assert parse_report(text + "<answer>Lyon</answer>")[1] == "Lyon"


QUESTION_WORDS = [
    "the", "a", "an", "The", "country", "city", "where", "which", "who", "whose", "that", "in which", ",", "?",
    ".", "'s", "’s", "of", "is", "was", "located", "born", "found", "Bubye", "River", "Hello", "Love", "performer",
    "What", "When", "did", "Mr.", "W.", "-", "Johnnycake", "alma mater", "Ⓐ", "É", "北京", "\u0301", "\n", "İ",
]  # fmt: skip
question_text = st.lists(st.one_of(st.sampled_from(QUESTION_WORDS), st.sampled_from(ODD_TEXT)), max_size=40).map(
    " ".join
)


@FAST
@given(question_text)
def test_a_hop_phrase_is_the_questions_own_words_and_resolving_it_ends(question):
    reference = inner_reference(question)
    if reference is not None:
        assert reference.span and reference.span in " ".join(question.split())
        assert "Bridge" in resolve(question, reference, "Bridge")
    assert 0 <= reference_depth(question) <= 8


VERDICT_FRAGMENTS = [
    "correct", "Correct", ":", "：", "=", "-", "—", "yes", "no", "true", "false", "\n", " ", "**", '"correct"',
    "<think>", "</think>", "< / think >", "reasoning", ",", ".",
]  # fmt: skip
judge_reply = st.lists(
    st.one_of(st.sampled_from(VERDICT_FRAGMENTS), st.sampled_from(ODD_TEXT), st.text(max_size=3)), max_size=30
).map("".join)


@FAST
@given(judge_reply, st.sampled_from(["yes", "no"]), st.sampled_from(["correct: ", "**Correct:** ", '{"correct": "']))
def test_a_judge_reply_gives_a_documented_verdict_and_its_last_verdict_line_wins(reply, word, key):
    assert parse_judgement(reply) in (True, False, None)
    # A reply that opens a think block it never closes was cut off: it holds no verdict.
    if not re.match(r"(?i)\s*<\s*think\s*>", re.split(r"(?i)<\s*/\s*think\s*>", reply)[-1]):
        assert parse_judgement(f"{reply}\n{key}{word}") is (word == "yes")
