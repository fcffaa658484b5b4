"""Region uncertainty (nll and entropy perplexities) and the choice of branch steps."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.errors import MissingLogprobsError
from langgraph_parallelmuse.protocol import region_spans
from langgraph_parallelmuse.uncertainty import (
    lowest_group_confidence,
    perplexity,
    require_logprobs,
    score_steps,
    select_branch_steps,
    step_uncertainty,
    token_entropy,
)


def _tok(logprob, tops=(), start=0, end=1, token="x"):
    return {
        "token": token,
        "logprob": logprob,
        "top_logprobs": [[f"t{i}", lp] for i, lp in enumerate(tops)],
        "start": start,
        "end": end,
    }


def _step_from_tokens(pieces, *, generated_tokens=None):
    """A step whose text is the concatenation of ``pieces`` = [(token, logprob, tops), ...]."""
    tokens, pos = [], 0
    for text, lp, tops in pieces:
        tokens.append(_tok(lp, tops, pos, pos + len(text), text))
        pos += len(text)
    text = "".join(p[0] for p in pieces)
    return {
        "index": 0,
        "text": text,
        "tokens": tokens,
        "regions": region_spans(text),
        "action": {},
        "prompt_tokens": 10,
        "context_tokens": 10,
        "generated_tokens": len(tokens) if generated_tokens is None else generated_tokens,
        "cached_prompt_tokens": 0,
        "calls": 1,
        "finish_reason": "stop",
        "seconds": 0.0,
    }


# ----------------------------------------------------------------------------- estimators


def test_nll_perplexity_by_hand():
    recs = [_tok(-1.0), _tok(-2.0), _tok(-0.0)]
    assert perplexity(recs, "nll") == pytest.approx(math.exp(1.0))
    assert perplexity([_tok(math.log(0.25))], "nll") == pytest.approx(4.0)


def test_a_floored_logprob_ranks_highest_instead_of_overflowing():
    """A backend's missing or -inf logprob is floored at -9999; before the fix exp of its region's
    mean raised OverflowError, which failed the whole question."""
    floored = perplexity([_tok(-0.1), _tok(-9999.0), _tok(-0.1)], "nll")
    assert math.isfinite(floored) and floored > perplexity([_tok(-50.0)], "nll")
    assert math.isfinite(perplexity([_tok(-9999.0, tops=(-9999.0, -9999.0))], "entropy"))


def test_entropy_of_one_token_by_hand():
    # Two alternatives with p ∝ e^-0.5 and e^-1.5: p1 = 1/(1+e^-1).
    p1 = 1 / (1 + math.exp(-1.0))
    p2 = 1 - p1
    expected = -(p1 * -0.5 + p2 * -1.5)
    assert token_entropy(_tok(-0.5, [-0.5, -1.5])) == pytest.approx(expected)


def test_entropy_renormalises_a_truncated_top_k():
    # Four equally likely alternatives that hold only 40% of the mass: renormalised to 1/4 each.
    lp = math.log(0.1)
    # H = -sum(1/4 * log 0.1) over the raw logprobs (the official estimator's formula).
    assert token_entropy(_tok(lp, [lp] * 4)) == pytest.approx(-lp)


def test_entropy_without_alternatives_is_the_surprisal():
    assert token_entropy(_tok(-0.7)) == pytest.approx(0.7)


def test_entropy_perplexity_by_hand():
    recs = [_tok(-0.1, [-0.1, -2.0, -3.0]), _tok(-1.0, [-1.0, -1.0])]

    def h(tops):
        ps = [math.exp(x) for x in tops]
        z = sum(ps)
        return -sum(p / z * x for p, x in zip(ps, tops, strict=True))

    expected = math.exp((h([-0.1, -2.0, -3.0]) + h([-1.0, -1.0])) / 2)
    assert perplexity(recs, "entropy") == pytest.approx(expected)


def test_a_confident_token_has_lower_entropy_than_an_unsure_one():
    sure = _tok(-0.01, [-0.01, -6.0, -7.0])
    unsure = _tok(-1.0, [-1.0, -1.1, -1.2])
    assert perplexity([sure], "entropy") < perplexity([unsure], "entropy")
    assert perplexity([sure], "nll") < perplexity([unsure], "nll")


def test_empty_region_has_no_score_and_bad_estimator_raises():
    assert perplexity([], "nll") is None
    assert perplexity([], "entropy") is None
    with pytest.raises(ValueError, match="unknown estimator"):
        perplexity([_tok(-1.0)], "bogus")


# ----------------------------------------------------------------------------- step scores


def test_step_uncertainty_scores_each_region_on_its_own_tokens():
    step = _step_from_tokens(
        [
            ("<think>", -0.05, ()),
            ("hmm", -1.0, ()),
            ("</think>", -0.05, ()),
            ("<tool_call>", -0.05, ()),
            ('{"name": "search"}', -3.0, ()),
            ("</tool_call>", -0.05, ()),
        ]
    )
    scores = step_uncertainty(step, "nll")
    assert scores["reasoning"] == pytest.approx(math.exp(1.0))
    assert scores["exploration"] == pytest.approx(math.exp(3.0))
    assert scores["all"] == pytest.approx(math.exp((4 * 0.05 + 1.0 + 3.0) / 6))


def test_absent_region_is_none_not_a_number():
    step = _step_from_tokens(
        [
            ("<think>", -0.1, ()),
            ("ok", -0.2, ()),
            ("</think>", -0.1, ()),
            ("<answer>", -0.1, ()),
            ("Paris", -0.3, ()),
            ("</answer>", -0.1, ()),
        ]
    )
    scores = step_uncertainty(step)
    assert scores["exploration"] is None
    assert scores["reasoning"] == pytest.approx(math.exp(0.2))
    assert scores["all"] is not None


def test_an_empty_region_has_no_score_though_a_token_straddles_it():
    # "<think></think>": the reasoning span is [7, 7], and the BPE token "></" overlaps it. Scored, that
    # tag token (-4.0) made the reasoning the step does not have its most uncertain region.
    step = _step_from_tokens(
        [
            ("<", -0.01, ()),
            ("think", -0.01, ()),
            ("></", -4.0, ()),
            ("think", -0.01, ()),
            (">\n<", -0.01, ()),
            ("answer", -0.01, ()),
            (">", -0.01, ()),
            ("Paris", -0.2, ()),
            ("</", -0.01, ()),
            ("answer", -0.01, ()),
            (">", -0.01, ()),
        ]
    )
    assert step["regions"]["reasoning"] == [7, 7]
    scores = step_uncertainty(step, "nll")
    assert scores["reasoning"] is None and scores["exploration"] is None
    assert scores["all"] is not None


def test_step_without_tokens_scores_none_everywhere():
    step = _step_from_tokens([])
    step["text"] = "<think>prefilled</think><tool_call>{}</tool_call>"
    step["regions"] = region_spans(step["text"])
    assert step_uncertainty(step) == {"reasoning": None, "exploration": None, "all": None}


def test_score_steps_is_per_step_and_uses_the_estimator():
    a = _step_from_tokens([("<think>", -0.1, [-0.1, -0.2]), ("a", -0.5, [-0.5, -0.6]), ("</think>", -0.1, [-0.1])])
    b = _step_from_tokens([("<think>", -0.1, [-0.1]), ("b", -2.0, [-2.0, -0.2]), ("</think>", -0.1, [-0.1])])
    nll = score_steps([a, b], "nll")
    ent = score_steps([a, b], "entropy")
    assert len(nll) == len(ent) == 2
    assert nll[0]["reasoning"] == pytest.approx(math.exp(0.5))
    assert nll[1]["reasoning"] == pytest.approx(math.exp(2.0))
    assert ent[0]["reasoning"] != nll[0]["reasoning"]


# ----------------------------------------------------------------------------- branch steps


U = [
    {"reasoning": 1.5, "exploration": 4.0, "all": 2.0},  # 0: exploring blindly
    {"reasoning": 6.0, "exploration": 3.0, "all": 4.5},  # 1: integrating evidence
    {"reasoning": 5.0, "exploration": 1.2, "all": 3.0},  # 2
    {"reasoning": 2.0, "exploration": None, "all": 1.9},  # 3: answer step
]


@pytest.mark.parametrize(
    ("mode", "k", "expected"),
    [
        ("exploration", 2, [(0, "exploration", 4.0), (1, "exploration", 3.0)]),
        ("exploration", 1, [(0, "exploration", 4.0)]),
        ("reasoning", 2, [(1, "reasoning", 6.0), (2, "reasoning", 5.0)]),
        ("all", 2, [(1, "all", 4.5), (2, "all", 3.0)]),
        # mixed: ceil(k/2) by exploration, then floor(k/2) by reasoning among the other steps.
        ("mixed", 2, [(0, "exploration", 4.0), (1, "reasoning", 6.0)]),
        ("mixed", 3, [(0, "exploration", 4.0), (1, "exploration", 3.0), (2, "reasoning", 5.0)]),
        ("mixed", 1, [(0, "exploration", 4.0)]),
        (
            "mixed",
            4,
            [
                (0, "exploration", 4.0),
                (1, "exploration", 3.0),
                (2, "reasoning", 5.0),
                (3, "reasoning", 2.0),
            ],
        ),
        ("none", 2, []),
        ("exploration", 0, []),
    ],
)
def test_select_branch_steps_per_mode(mode, k, expected):
    picks = select_branch_steps(U, mode=mode, k=k)
    assert [(i, r, pytest.approx(s)) for i, r, s in picks] == expected
    assert len({i for i, _, _ in picks}) == len(picks)  # never the same step twice


def test_fewer_scored_steps_than_k_gives_fewer_picks():
    assert [i for i, _, _ in select_branch_steps(U, mode="exploration", k=10)] == [0, 1, 2]
    assert [i for i, _, _ in select_branch_steps(U, mode="reasoning", k=10)] == [1, 2, 3, 0]
    assert select_branch_steps([], mode="exploration", k=2) == []
    only_answer = [{"reasoning": 1.1, "exploration": None, "all": 1.1}]
    assert select_branch_steps(only_answer, mode="exploration", k=2) == []


def test_mixed_skips_a_reasoning_step_already_picked_by_exploration():
    u = [
        {"reasoning": 9.0, "exploration": 9.0, "all": 9.0},
        {"reasoning": 2.0, "exploration": 1.0, "all": 1.0},
        {"reasoning": 3.0, "exploration": None, "all": 1.0},
    ]
    assert select_branch_steps(u, mode="mixed", k=2) == [
        (0, "exploration", 9.0),
        (2, "reasoning", 3.0),
    ]


def test_ties_go_to_the_earlier_step_and_eligible_filters():
    u = [{"reasoning": 2.0, "exploration": 2.0, "all": 2.0}] * 3
    assert [i for i, _, _ in select_branch_steps(u, mode="exploration", k=2)] == [0, 1]
    assert [i for i, _, _ in select_branch_steps(U, mode="exploration", k=2, eligible=[1, 2])] == [
        1,
        2,
    ]


def test_a_non_finite_score_is_never_picked():
    """Before: a NaN score was picked (NaN compares false, so the sort left it in place)."""
    u = [{"exploration": 2.0}, {"exploration": math.nan}, {"exploration": 5.0}, {"exploration": math.inf}]
    assert select_branch_steps(u, mode="exploration", k=2) == [(2, "exploration", 5.0), (0, "exploration", 2.0)]


def test_an_infinite_logprob_from_a_payload_gives_a_finite_entropy():
    from langgraph_parallelmuse.logprobs import normalize_logprobs

    tops = [{"token": "a", "logprob": math.inf}, {"token": "b", "logprob": -1.0}]
    recs = normalize_logprobs({"content": [{"token": "a", "logprob": math.inf, "top_logprobs": tops}]}, "a")
    assert math.isfinite(perplexity(recs, "entropy")) and perplexity(recs, "nll") == 1.0


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="unknown mode"):
        select_branch_steps(U, mode="random", k=1)


# ----------------------------------------------------------------------------- group confidence

# Unsure tokens, then a window of certain ones (logprob 0.0, as float32 rounds a confident token's).
_UNSURE_THEN_CERTAIN = [-0.05, -0.05, -0.1, -2.3, -1.3, -0.05, -0.05, -2.3, -0.05, -2.3, -1.3, -0.7] + [0.0] * 32


def test_a_window_of_certain_tokens_has_confidence_zero_and_calibrates():
    """Before: the running window sum drifted to -5.6e-17, below any confidence, and ``Calibration.fit``
    refused the runs holding such a trajectory as damaged."""
    lowest = lowest_group_confidence([_tok(lp) for lp in _UNSURE_THEN_CERTAIN], window=32)
    assert lowest == 0.0
    runs = [[{"all": 2.0}] * 3 for _ in range(20)]  # enough steps and trajectories: no warning
    assert Calibration.fit(runs, confidences=[lowest] + [1.0] * 19).confidence_samples == 20


@settings(deadline=None)  # a shared, busy machine runs the suite
@given(
    st.lists(st.sampled_from([0.0, -1e-7, -0.05, -0.7, -2.3, -9999.0]), min_size=1, max_size=60),
    st.integers(1, 40),
)
def test_lowest_group_confidence_is_the_least_window_mean(logprobs, window):
    confidences = [-lp for lp in logprobs]
    size = min(window, len(confidences))
    means = [math.fsum(confidences[i : i + size]) / size for i in range(len(confidences) - size + 1)]
    lowest = lowest_group_confidence([_tok(lp) for lp in logprobs], window=window)
    assert lowest >= min(confidences)
    assert math.isclose(lowest, min(means), rel_tol=1e-9, abs_tol=1e-9)


# ----------------------------------------------------------------------------- logprobs present


def test_require_logprobs_names_the_fix():
    with pytest.raises(MissingLogprobsError) as info:
        require_logprobs("<think>generated text</think>", [])
    message = str(info.value)
    assert "logprobs=True" in message
    assert "mode='none'" in message


def test_require_logprobs_accepts_output_with_tokens_or_nothing_generated():
    with_tokens = _step_from_tokens([("<think>", -0.1, ()), ("a", -0.1, ())])
    require_logprobs("<think>a", with_tokens["tokens"])
    require_logprobs("", [])  # prefilled only
