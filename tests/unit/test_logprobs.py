"""The logprob normaliser on real-shaped payloads of every backend, and tokens ↔ regions."""

from __future__ import annotations

import math
import random

import pytest

from langgraph_parallelmuse.errors import ProtocolError
from langgraph_parallelmuse.logprobs import normalize_logprobs, piece_bytes, shift, tokens_in_span
from langgraph_parallelmuse.protocol import region_spans


def _spans(records):
    return [(r["token"], r["start"], r["end"]) for r in records]


def _covered(records, text):
    """The text each record covers, joined: equals ``text`` when offsets line up."""
    return "".join(text[r["start"] : r["end"]] for r in records)


# ----------------------------------------------------------------------------- OpenAI chat


def _openai_entry(token, logprob, tops):
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in tops],
    }


def test_openai_chat_payload_with_bytes_and_top_logprobs():
    text = "<think>Paris</think>"
    payload = {
        "content": [
            _openai_entry("<", -0.01, [("<", -0.01), (" ", -5.0)]),
            _openai_entry("think", -0.02, [("think", -0.02)]),
            _openai_entry(">", -0.03, [(">", -0.03)]),
            _openai_entry("Paris", -0.7, [("Lyon", -1.2), ("Paris", -0.7), ("Nice", -3.0)]),
            _openai_entry("</", -0.04, [("</", -0.04)]),
            _openai_entry("think", -0.05, [("think", -0.05)]),
            _openai_entry(">", -0.06, [(">", -0.06)]),
        ],
        "refusal": None,
    }
    recs = normalize_logprobs(payload, text)

    assert [r["token"] for r in recs] == ["<", "think", ">", "Paris", "</", "think", ">"]
    assert [r["logprob"] for r in recs] == [-0.01, -0.02, -0.03, -0.7, -0.04, -0.05, -0.06]
    assert _covered(recs, text) == text
    assert (recs[3]["start"], recs[3]["end"]) == (7, 12)
    # Alternatives become [token, logprob] pairs, best first (whatever order the server used).
    assert recs[3]["top_logprobs"] == [["Paris", -0.7], ["Lyon", -1.2], ["Nice", -3.0]]
    for rec in recs:
        assert text[rec["start"] : rec["end"]] == rec["token"]


def test_vllm_chat_minus_inf_and_sentinel_are_clamped_to_a_finite_floor():
    text = "ab"
    payload = {
        "content": [
            {
                "token": "a",
                "logprob": float("-inf"),
                "bytes": [97],
                "top_logprobs": [
                    {"token": "a", "logprob": float("-inf")},
                    {"token": "z", "logprob": -0.1},
                ],
            },
            {"token": "b", "logprob": -9999.0, "bytes": [98], "top_logprobs": []},
        ]
    }
    recs = normalize_logprobs(payload, text)

    assert [r["logprob"] for r in recs] == [-9999.0, -9999.0]
    assert all(math.isfinite(lp) for r in recs for _, lp in r["top_logprobs"])
    assert recs[0]["top_logprobs"] == [["z", -0.1], ["a", -9999.0]]
    assert _spans(recs) == [("a", 0, 1), ("b", 1, 2)]


def test_chat_payload_without_bytes_uses_token_strings_for_offsets():
    recs = normalize_logprobs(
        {
            "content": [
                {"token": "Hel", "logprob": -0.1, "top_logprobs": []},
                {"token": "lo", "logprob": -0.2, "top_logprobs": []},
            ]
        },
        "Hello",
    )
    assert _spans(recs) == [("Hel", 0, 3), ("lo", 3, 5)]


def test_bare_list_of_entries_and_none_are_accepted():
    recs = normalize_logprobs([{"token": "x", "logprob": -1.0, "top_logprobs": []}], "x")
    assert _spans(recs) == [("x", 0, 1)]
    assert normalize_logprobs(None) == []
    assert normalize_logprobs({"content": None}) == []


# ----------------------------------------------------------------------------- completions


def test_openai_vllm_completions_payload():
    text = " Paris, France"
    payload = {
        "tokens": [" Paris", ",", " France"],
        "token_logprobs": [-0.5, -0.01, -1.5],
        "top_logprobs": [
            {" Lyon": -1.0, " Paris": -0.5},
            {",": -0.01},
            {" France": -1.5, " Texas": -0.4},
        ],
        "text_offset": [100, 106, 107],  # offsets into the prompt+completion: not used as-is
    }
    recs = normalize_logprobs(payload, text)

    assert _spans(recs) == [(" Paris", 0, 6), (",", 6, 7), (" France", 7, 14)]
    assert [r["logprob"] for r in recs] == [-0.5, -0.01, -1.5]
    assert recs[0]["top_logprobs"] == [[" Paris", -0.5], [" Lyon", -1.0]]
    assert recs[2]["top_logprobs"] == [[" Texas", -0.4], [" France", -1.5]]
    assert _covered(recs, text) == text


def test_completions_payload_without_top_logprobs():
    recs = normalize_logprobs({"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0], "top_logprobs": None}, "ab")
    assert [r["top_logprobs"] for r in recs] == [[], []]
    assert [r["logprob"] for r in recs] == [-1.0, -2.0]


def test_completions_payload_with_mismatched_lengths_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="differ in length"):
        normalize_logprobs({"tokens": ["a", "b"], "token_logprobs": [-1.0]})


# ----------------------------------------------------------------------------- llama.cpp


def test_llama_cpp_old_form_with_probs():
    # The whole /completion response: "content" is the text (a string), not a token list.
    payload = {
        "content": "Paris",
        "completion_probabilities": [
            {
                "content": "Par",
                "probs": [{"tok_str": "Lon", "prob": 0.2}, {"tok_str": "Par", "prob": 0.8}],
            },
            {"content": "is", "probs": [{"tok_str": "is", "prob": 1.0}]},
        ],
    }
    recs = normalize_logprobs(payload, "Paris")

    assert _spans(recs) == [("Par", 0, 3), ("is", 3, 5)]
    assert recs[0]["logprob"] == pytest.approx(math.log(0.8))
    assert recs[1]["logprob"] == pytest.approx(0.0)
    assert recs[0]["top_logprobs"][0][0] == "Par"
    assert recs[0]["top_logprobs"][1][0] == "Lon"
    assert recs[0]["top_logprobs"][1][1] == pytest.approx(math.log(0.2))


def test_llama_cpp_old_form_zero_probability_is_the_floor_not_an_error():
    recs = normalize_logprobs(
        {
            "completion_probabilities": [
                {
                    "content": "x",
                    "probs": [{"tok_str": "x", "prob": 0.0}, {"tok_str": "y", "prob": 1.0}],
                }
            ]
        },
        "x",
    )
    assert recs[0]["logprob"] == -9999.0
    assert recs[0]["top_logprobs"][0] == ["y", 0.0]


def test_llama_cpp_new_form_with_logprob_and_top_logprobs():
    payload = {
        "completion_probabilities": [
            {
                "id": 3681,
                "token": "Par",
                "bytes": [80, 97, 114],
                "logprob": -0.22,
                "top_logprobs": [
                    {"id": 3681, "token": "Par", "bytes": [80, 97, 114], "logprob": -0.22},
                    {"id": 42, "token": "Lon", "bytes": [76, 111, 110], "logprob": -1.6},
                ],
            },
            {
                "id": 285,
                "token": "is",
                "bytes": [105, 115],
                "logprob": -0.01,
                "top_logprobs": [{"id": 285, "token": "is", "bytes": [105, 115], "logprob": -0.01}],
            },
        ]
    }
    recs = normalize_logprobs(payload, "Paris")
    assert _spans(recs) == [("Par", 0, 3), ("is", 3, 5)]
    assert [r["logprob"] for r in recs] == [-0.22, -0.01]
    assert recs[0]["top_logprobs"] == [["Par", -0.22], ["Lon", -1.6]]


# ----------------------------------------------------------------------------- UTF-8 and text


def _split_e_acute_payload():
    # "Café!" where "é" (0xC3 0xA9) is split over two byte tokens, as byte-level BPE does.
    return {
        "content": [
            {"token": "Caf", "logprob": -0.1, "bytes": list(b"Caf"), "top_logprobs": []},
            {"token": "bytes:\\xc3", "logprob": -0.5, "bytes": [0xC3], "top_logprobs": []},
            {"token": "bytes:\\xa9", "logprob": -0.7, "bytes": [0xA9], "top_logprobs": []},
            {"token": "!", "logprob": -0.2, "bytes": [33], "top_logprobs": []},
        ]
    }


def test_multibyte_char_split_over_two_tokens_keeps_offsets_aligned_with_the_text():
    text = "Café!"
    recs = normalize_logprobs(_split_e_acute_payload(), text)

    # Offsets are character offsets into the text, not byte offsets and not token-string lengths.
    assert (recs[0]["start"], recs[0]["end"]) == (0, 3)
    assert (recs[-1]["start"], recs[-1]["end"]) == (4, 5)
    assert text[recs[-1]["start"] : recs[-1]["end"]] == "!"
    # Both byte tokens of the split "é" cover it; none overlaps "!".
    middle = recs[1:3]
    assert [(r["start"], r["end"]) for r in middle] == [(3, 4), (3, 4)]
    assert _covered([recs[0], recs[1], recs[3]], text) == text
    # Offsets never decrease.
    assert all(a["end"] <= b["start"] or a["start"] == b["start"] for a, b in zip(recs, recs[1:], strict=False))


def test_an_invalid_byte_counts_as_its_replacement_character_for_every_later_token():
    """A character the model never completed is one U+FFFD in the text; before the fix every later
    token started one character early, so the reasoning region took in the tag before it."""
    toks = [
        ("\ufffd", [0xE4, 0xBD]),
        ("<think>", list(b"<think>")),
        ("abc", list(b"abc")),
        ("</think>", list(b"</think>")),
    ]
    payload = {"content": [{"token": t, "logprob": -0.1, "bytes": b, "top_logprobs": []} for t, b in toks]}
    text = "\ufffd<think>abc</think>"
    recs = normalize_logprobs(payload, text)
    assert [text[r["start"] : r["end"]] for r in recs] == ["\ufffd", "<think>", "abc", "</think>"]
    assert [r["token"] for r in tokens_in_span(recs, (text.index("abc"), text.index("abc") + 3))] == ["abc"]
    # A continuation byte outside the range its lead byte allows (E0 takes A0-BF) is one more U+FFFD.
    lead = [("\ufffd", [0xE0]), ("\ufffd", [0x82]), ("a", [0x61])]
    payload = {"content": [{"token": t, "logprob": -0.1, "bytes": b, "top_logprobs": []} for t, b in lead]}
    assert [(r["start"], r["end"]) for r in normalize_logprobs(payload, "\ufffd\ufffda")] == [(0, 1), (1, 2), (2, 3)]


def _decoded(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@pytest.mark.parametrize("seed", range(4))
def test_byte_offsets_follow_the_decoded_text_for_random_bytes(seed):
    """Offsets are computed in one pass over the reply (decoding every token's prefix again was
    quadratic): on random valid and invalid bytes cut at random, a token starts after the
    characters that end before it (a cut where decoding both sides gives the text) and ends after
    every character its bytes touch."""
    rng = random.Random(seed)
    invalid = [b"\x80", b"\xbf", b"\xe0", b"\xe4\xbd", b"\xed", b"\xf0\x9f", b"\xff"]
    pool = [*(c.encode() for c in "aü你😀\ufffd"), *invalid]
    for _ in range(300):
        data = b"".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, len(data) - 1)))
        bounds = [0, *cuts, len(data)]
        pieces = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        payload = [{"token": _decoded(p), "logprob": -0.1, "bytes": list(p), "top_logprobs": []} for p in pieces]
        text = _decoded(data)
        whole_cuts = [p for p in range(len(data) + 1) if _decoded(data[:p]) + _decoded(data[p:]) == text]
        expected = [
            (max(len(_decoded(data[:p])) for p in whole_cuts if p <= a), len(_decoded(data[:b])))
            for a, b in zip(bounds, bounds[1:], strict=False)
        ]
        assert [(r["start"], r["end"]) for r in normalize_logprobs(payload, text)] == expected, (data, pieces)


def test_both_tokens_of_a_split_char_at_a_region_start_are_in_the_region():
    recs = normalize_logprobs(_split_e_acute_payload(), "Café!")
    assert [r["token"] for r in tokens_in_span(recs, [3, 5])] == ["bytes:\\xc3", "bytes:\\xa9", "!"]


def test_tokens_running_past_the_text_are_clipped():
    # The server dropped a stop string from the text but still reported its tokens.
    payload = {
        "content": [
            {"token": "Paris", "logprob": -0.1, "top_logprobs": []},
            {"token": "</answer>", "logprob": -0.1, "top_logprobs": []},
        ]
    }
    recs = normalize_logprobs(payload, "Paris")
    assert _spans(recs) == [("Paris", 0, 5), ("</answer>", 5, 5)]


def _vllm_entry(token: str, logprob: float = -0.1) -> dict:
    """vLLM's chat logprobs: a token holding part of a character is U+FFFD with that character's
    bytes (``token.encode("utf-8", errors="replace")``), not the bytes the token held."""
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def test_vllm_split_characters_sent_as_replacement_characters_keep_later_offsets():
    """Before: each U+FFFD token counted as one character of its own, so every later token started
    a character early and the exploration region scored the thought's last token."""
    call = '{"name": "search", "arguments": {"query": "故宫"}}'
    text = f"<think>去北京</think><tool_call>{call}</tool_call>"
    toks = ["<think>", "去", "北", "\ufffd", "\ufffd", "</think>", "<tool_call>"]
    toks += ['{"name": "search", "arguments": {"query": "', "故", "宫", '"}}', "</tool_call>"]
    recs = normalize_logprobs({"content": [_vllm_entry(t) for t in toks]}, text)
    assert [text[r["start"] : r["end"]] for r in recs] == [t if t != "\ufffd" else "京" for t in toks]
    spans = region_spans(text)
    assert [r["token"] for r in tokens_in_span(recs, spans["reasoning"])] == ["去", "北", "\ufffd", "\ufffd"]
    assert [r["token"] for r in tokens_in_span(recs, spans["exploration"])] == toks[7:11]
    # The same tokens without bytes (token strings only) line up the same way.
    bare = normalize_logprobs({"content": [{"token": t, "logprob": -0.1, "top_logprobs": []} for t in toks]}, text)
    assert _spans(bare) == _spans(recs)


def test_vllm_split_characters_are_matched_by_their_bytes_and_a_dropped_stop_string_is_clipped():
    # 京 (3 bytes) came as 1 + 2 marks, 😀 (4 bytes) as 1 + 3; the literal 京 between them repeats in
    # the text, and only the marks' byte counts tell which 京 it is. The server dropped "</answer>".
    toks = ["\ufffd", "\ufffd\ufffd", "京", "\ufffd", "\ufffd\ufffd", "\ufffd", "\ufffd\ufffd\ufffd", "</", "answer>"]
    recs = normalize_logprobs({"content": [_vllm_entry(t) for t in toks]}, "京京京😀")
    assert [(r["start"], r["end"]) for r in recs] == [
        (0, 1),
        (0, 1),
        (1, 2),
        (2, 3),
        (2, 3),
        (3, 4),
        (3, 4),
        (4, 4),
        (4, 4),
    ]
    assert piece_bytes(toks[:7], "京京京😀") == [
        b"\xe4",
        b"\xba\xac",
        "京".encode(),
        b"\xe4",
        b"\xba\xac",
        b"\xf0",
        b"\x9f\x98\x80",
    ]


def test_thirty_split_characters_in_a_thought_leave_the_tool_call_its_own_tokens():
    call = '{"name": "search", "arguments": {"query": "q"}}'
    text = f"<think>{'京' * 30}</think><tool_call>{call}</tool_call>"
    toks = ["<think>", *["\ufffd"] * 60, "</think>", "<tool_call>", call, "</tool_call>"]
    recs = normalize_logprobs({"content": [_vllm_entry(t) for t in toks]}, text)
    spans = region_spans(text)
    assert len(tokens_in_span(recs, spans["reasoning"])) == 60
    assert [r["token"] for r in tokens_in_span(recs, spans["exploration"])] == [call]
    # Each pair of marks covers its own character: one byte to the first, two to the second.
    assert [(r["start"], r["end"]) for r in recs[1:5]] == [(7, 8), (7, 8), (8, 9), (8, 9)]


def _repetition(n):
    """A repetition loop of ``n`` 哈 in a thought, as vLLM sends it: byte-level BPE tokens
    [E5 93 88 E5][93 88] per two characters, decoded "哈\ufffd" and "\ufffd\ufffd"."""
    return ["<think>", *["哈\ufffd", "\ufffd\ufffd"] * (n // 2), "</think>"], f"<think>{'哈' * n}</think>"


def test_a_short_repetition_of_split_characters_is_aligned():
    pieces, text = _repetition(20)
    assert b"".join(piece_bytes(pieces, text)) == text.encode()


@pytest.mark.parametrize("n", [200, 2_400, 20_000])
def test_a_repetition_loop_of_split_characters_is_aligned_without_blowing_up(n):
    """Each run of three marks fits one to three 哈, so the ends the tokens could reach grew with the
    loop, each kept with a copy of its runs so far: 2,400 characters took 75 s, synchronously in the
    async generate path (20,000 would take hours). Only the nearest ends are followed now."""
    pieces, text = _repetition(n)
    assert b"".join(piece_bytes(pieces, text)) == text.encode()


def test_a_repetition_loop_of_split_characters_keeps_the_later_regions_offsets():
    pieces, text = _repetition(2_400)
    recs = normalize_logprobs({"content": [_vllm_entry(t) for t in pieces]}, text)
    assert _spans(recs[:2]) == [("<think>", 0, 7), ("哈\ufffd", 7, 9)]
    assert _spans(recs[-1:]) == [("</think>", len(text) - 8, len(text))]


@pytest.mark.parametrize(
    "payload",
    [
        {"content": [{"token": "a", "logprob": float("inf"), "top_logprobs": [{"token": "a", "logprob": 3.0}]}]},
        {"tokens": ["a"], "token_logprobs": ["inf"], "top_logprobs": [{"a": 1e-9}]},
        {"completion_probabilities": [{"content": "a", "probs": [{"tok_str": "a", "prob": 1.5}]}]},
    ],
)
def test_a_positive_or_infinite_logprob_is_certainty_not_more(payload):
    """Before: +inf passed as a number, and the entropy estimator's exp(inf - inf) made a NaN score."""
    (rec,) = normalize_logprobs(payload, "a")
    assert rec["logprob"] == 0.0 and all(lp == 0.0 for _, lp in rec["top_logprobs"])


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": []},
        {"tokens": ["a"]},  # completions without token_logprobs
        "not a payload",
        42,
    ],
)
def test_unknown_payload_shape_is_a_protocol_error(payload):
    with pytest.raises(ProtocolError):
        normalize_logprobs(payload)


@pytest.mark.parametrize(
    "entry",
    [
        {"token": "a", "logprob": float("nan"), "top_logprobs": []},
        {"token": "a", "logprob": "abc", "top_logprobs": []},
        {"token": "a", "logprob": None, "top_logprobs": []},
        {"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "b", "logprob": float("nan")}]},
        {"token": "a", "top_logprobs": []},  # no logprob at all
        {"logprob": -0.1, "top_logprobs": []},  # no token text
        {"token": "a", "logprob": -0.1, "top_logprobs": ["b"]},  # alternative not an object
    ],
)
def test_bad_entries_are_protocol_errors(entry):
    with pytest.raises(ProtocolError):
        normalize_logprobs({"content": [entry]}, "a")


def test_nan_in_completions_payload_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="NaN"):
        normalize_logprobs({"tokens": ["a"], "token_logprobs": [float("nan")]})


def test_protocol_error_is_a_value_error():
    assert issubclass(ProtocolError, ValueError)


# ----------------------------------------------------------------------------- regions → tokens


def _records(tokens):
    return normalize_logprobs(
        {"content": [{"token": t, "logprob": -0.1 * (i + 1), "top_logprobs": []} for i, t in enumerate(tokens)]},
        "".join(tokens),
    )


def test_tokens_in_span_with_tags_split_over_several_tokens():
    tokens = [
        "<",
        "think",
        ">",
        "need",
        " data",
        "</",
        "think",
        ">",
        "\n",
        "<",
        "tool",
        "_call",
        ">",
        '{"name":',
        ' "search"',
        "}",
        "</",
        "tool",
        "_call",
        ">",
    ]
    text = "".join(tokens)
    recs = _records(tokens)
    spans = region_spans(text)

    assert text[slice(*spans["reasoning"])] == "need data"
    assert text[slice(*spans["exploration"])] == '{"name": "search"}'
    assert [r["token"] for r in tokens_in_span(recs, spans["reasoning"])] == ["need", " data"]
    assert [r["token"] for r in tokens_in_span(recs, spans["exploration"])] == [
        '{"name":',
        ' "search"',
        "}",
    ]


def test_a_token_straddling_a_tag_boundary_belongs_to_the_region():
    tokens = ["<tool", "_call>{", '"name": "visit"', "}</", "tool_call>"]
    text = "".join(tokens)
    recs = _records(tokens)
    span = region_spans(text)["exploration"]
    assert text[slice(*span)] == '{"name": "visit"}'
    assert [r["token"] for r in tokens_in_span(recs, span)] == ["_call>{", '"name": "visit"', "}</"]


def test_tokens_in_an_empty_span_and_outside_the_text():
    recs = _records(["ab", "cd"])
    assert tokens_in_span(recs, [2, 2]) == []
    assert tokens_in_span(recs, [10, 12]) == []
    assert [r["token"] for r in tokens_in_span(recs, [1, 3])] == ["ab", "cd"]


def test_shift_moves_offsets_and_leaves_the_input_untouched():
    recs = _records(["ab", "cd"])
    moved = shift(recs, 10)
    assert [(r["start"], r["end"]) for r in moved] == [(10, 12), (12, 14)]
    assert [(r["start"], r["end"]) for r in recs] == [(0, 2), (2, 4)]


def test_llama_cpp_old_form_a_sampled_token_missing_from_its_candidates_is_bounded_by_them():
    """It is less likely than every listed candidate: before, it got the floor (-9999), and one such
    token made its step's perplexity 2e217, the top fork pick of the trajectory."""
    payload = {
        "completion_probabilities": [
            {"content": "z", "probs": [{"tok_str": "x", "prob": 0.6}, {"tok_str": "y", "prob": 0.1}]}
        ]
    }
    assert normalize_logprobs(payload, "z")[0]["logprob"] == pytest.approx(math.log(0.1))
