"""Functional-region uncertainty of agent steps, and the choice of branch points.

Uncertainty of region f at step t is a perplexity over that region's generated tokens, computed
on *raw* log-probabilities (before temperature and top-p warping):

- ``nll`` (paper Eq. 1): ``exp(-mean(log p(sampled token)))``;
- ``entropy`` (official code): per token, renormalise the top-k probabilities, take
  ``H = -sum(p_norm * logprob)``, then ``exp(mean(H))``.

A region a step does not have gets ``None`` (never a fake number).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from langgraph_parallelmuse.errors import MissingLogprobsError
from langgraph_parallelmuse.logprobs import tokens_in_span
from langgraph_parallelmuse.state import Step, TokenRecord

Estimator = Literal["nll", "entropy"]
Mode = Literal["exploration", "reasoning", "mixed", "all", "none"]

REGIONS_OF_MODE: dict[str, tuple[str, ...]] = {
    "exploration": ("exploration",),
    "reasoning": ("reasoning",),
    "mixed": ("exploration", "reasoning"),
    "all": ("all",),
    "none": (),
}
"""The regions whose uncertainty picks branch points in each mode (``none``: no branching)."""

# Tokens per sliding window of DeepConf's group confidence. DeepConf uses 2,048 for long reasoning
# traces; this agent's trajectories generate a few hundred tokens, a step's thought a few dozen.
CONFIDENCE_WINDOW = 32


def token_entropy(record: TokenRecord) -> float:
    """Entropy of one token over its renormalised top-k alternatives (official ParallelMuse)."""
    tops = record["top_logprobs"]
    if not tops:
        return -record["logprob"]  # no alternatives: the sampled token's surprisal is all we have
    peak = max(lp for _, lp in tops)
    weights = [math.exp(lp - peak) for _, lp in tops]
    total = sum(weights)
    return -sum(w / total * lp for w, (_, lp) in zip(weights, tops, strict=True))


_MAX_EXPONENT = 700.0  # math.exp overflows a float above about 709.78


def perplexity(records: Sequence[TokenRecord], estimator: Estimator = "nll") -> float | None:
    """Perplexity of a token sequence, ``None`` for an empty one.

    Example:
        >>> recs = [{"token": "a", "logprob": -1.0, "top_logprobs": [], "start": 0, "end": 1}]
        >>> round(perplexity(recs, "nll"), 4)
        2.7183
    """
    if not records:
        return None
    if estimator == "nll":
        mean = -sum(r["logprob"] for r in records) / len(records)
    elif estimator == "entropy":
        mean = sum(token_entropy(r) for r in records) / len(records)
    else:
        raise ValueError(f"unknown estimator {estimator!r}: use 'nll' or 'entropy'")
    # A backend's missing or -inf logprob is floored at -9999 (logprobs.py); exp of its mean would
    # overflow. Capped, such a region still ranks as the most uncertain, and stays finite for JSON.
    return math.exp(min(mean, _MAX_EXPONENT))


def token_confidence(record: TokenRecord, top_k: int = 16) -> float:
    """DeepConf's token confidence: the negative mean of the top-``top_k`` logprobs (large when the
    model put nearly all mass on one token); a token without alternatives uses its own logprob.

    Example:
        >>> token_confidence({"token": "a", "logprob": -0.1, "top_logprobs": [["a", -0.1], ["b", -3.9]]})
        2.0
    """
    tops = [lp for _, lp in record.get("top_logprobs", [])[:top_k]] or [record["logprob"]]
    return -sum(tops) / len(tops)


def lowest_group_confidence(records: Sequence[TokenRecord], *, window: int, top_k: int = 16) -> float | None:
    """DeepConf's lowest group confidence: the minimum, over sliding windows of ``window`` tokens, of
    the windows' mean token confidence (a shorter sequence is one window); ``None`` for no tokens.

    Example:
        >>> tok = lambda c: {"token": "x", "logprob": -c, "top_logprobs": [["x", -c]]}
        >>> lowest_group_confidence([tok(5), tok(5), tok(1), tok(1), tok(5)], window=2)
        1.0
    """
    if not records:
        return None
    conf = [token_confidence(r, top_k) for r in records]
    size = min(window, len(conf))
    running = sum(conf[:size])
    lowest = running
    for i in range(size, len(conf)):
        running += conf[i] - conf[i - size]
        lowest = min(lowest, running)
    # The running sum drifts by rounding: a window of certain tokens (logprob 0) after unsure ones came
    # out a hair below 0, which no confidence is, and `calibrate` refused those runs as damaged. No
    # window's mean is below its least confident token's.
    return max(lowest / size, min(conf))


def step_uncertainty(step: Step, estimator: Estimator = "nll") -> dict[str, float | None]:
    """Perplexity of the reasoning, exploration and whole generated region of one step; ``None`` for a
    region the step does not have, or has empty (``<think></think>``).

    Example:
        >>> text, tokens = "<think></think>", [{"token": "<think", "logprob": -0.1, "top_logprobs": [],
        ...     "start": 0, "end": 6}, {"token": "></", "logprob": -4.0, "top_logprobs": [], "start": 6, "end": 9}]
        >>> step_uncertainty({"regions": {"reasoning": [7, 7]}, "tokens": tokens})["reasoning"] is None
        True
    """
    out: dict[str, float | None] = {}
    for region in ("reasoning", "exploration"):
        span = step["regions"].get(region)
        # An empty span still overlaps a token across it ("></" of <think></think>): that token is a
        # tag's, and scoring it would make the region the step lacks its most uncertain.
        has = span is not None and span[1] > span[0]
        out[region] = perplexity(tokens_in_span(step["tokens"], span), estimator) if has else None
    out["all"] = perplexity(step["tokens"], estimator)
    return out


def score_steps(steps: Sequence[Step], estimator: Estimator = "nll") -> list[dict[str, float | None]]:
    """Per-step region perplexities of a trajectory."""
    return [step_uncertainty(step, estimator) for step in steps]


def require_logprobs(
    generated: str,
    tokens: Sequence[TokenRecord],
    *,
    reader: str = "uncertainty-guided branching needs",
    way_out: str = "mode='none'",
) -> None:
    """Raise :class:`MissingLogprobsError` when a model call generated text but no logprobs.

    The agent checks every step's model output as it arrives, so a backend without logprobs
    fails on its first call, whether or not it reports token usage.

    Args:
        generated: The call's generated text.
        tokens: Its token records.
        reader: What reads the logprobs, as the message says it.
        way_out: The setting that runs without them.

    Example:
        >>> require_logprobs("", [])  # nothing generated: nothing to score
        >>> require_logprobs("Paris", [])
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.MissingLogprobsError: the model returned no token logprobs, ...
    """
    if generated.strip() and not tokens:
        raise MissingLogprobsError(
            f"the model returned no token logprobs, which {reader}. Use a backend that returns them "
            "(ChatOpenAI(..., logprobs=True, top_logprobs=16) against vLLM/SGLang/llama.cpp/OpenAI, or "
            f"LocalChatModel), or set {way_out}."
        )


def select_branch_steps(
    uncertainty: Sequence[dict[str, float | None]],
    *,
    mode: str,
    k: int,
    eligible: Sequence[int] | None = None,
    taken: Sequence[tuple[int, str]] = (),
) -> list[tuple[int, str, float]]:
    """Pick the top-k most uncertain steps of one trajectory.

    Args:
        uncertainty: Per-step region scores from :func:`score_steps`; a missing or non-finite
            score is never picked.
        mode: A key of :data:`REGIONS_OF_MODE`: ``exploration``, ``reasoning``, ``all``, ``mixed``
            (ceil(k/2) by exploration then floor(k/2) by reasoning, no step twice) or ``none``.
        k: Steps to pick; fewer come back when fewer steps have the region.
        eligible: Step indices that may be picked (default: all).
        taken: ``(step, region)`` fork points already taken from this trajectory (online branching
            forks some as they finish): they count in k and in their region's share, and are not
            picked again; only the rest of the k is returned.

    Returns:
        ``(step index, region, score)`` tuples, most uncertain first within each region.

    Example:
        >>> u = [{"reasoning": 1.2, "exploration": 3.0, "all": 2.0},
        ...      {"reasoning": 5.0, "exploration": 1.1, "all": 2.5},
        ...      {"reasoning": 2.0, "exploration": None, "all": 2.0}]
        >>> select_branch_steps(u, mode="mixed", k=2)
        [(0, 'exploration', 3.0), (1, 'reasoning', 5.0)]
        >>> select_branch_steps(u, mode="mixed", k=2, taken=[(0, "exploration")])  # the reasoning share is left
        [(1, 'reasoning', 5.0)]
    """
    if mode not in REGIONS_OF_MODE:
        raise ValueError(f"unknown mode {mode!r}: use {', '.join(REGIONS_OF_MODE)}")
    regions = REGIONS_OF_MODE[mode] if k > 0 else ()
    allowed = set(range(len(uncertainty)) if eligible is None else eligible) - {step for step, _ in taken}
    left = k - len(taken)
    picks: list[tuple[int, str, float]] = []
    for i, region in enumerate(regions):
        chosen = {p[0] for p in picks}
        # A non-finite score is no score: NaN compares false either way, so the sort could not place it.
        scored = [
            (step, region, u[region])
            for step, u in enumerate(uncertainty)
            if step in allowed and step not in chosen and u.get(region) is not None and math.isfinite(u[region])
        ]
        # Ties go to the earlier step: it shares less prefix but is where the paper finds
        # uncertainty peaks, and a deterministic order keeps runs reproducible.
        scored.sort(key=lambda item: (-item[2], item[0]))
        # k is split over the mode's regions, the first ones taking the remainder (mixed: ceil, floor);
        # fork points already taken use their region's share.
        share = (k + len(regions) - 1 - i) // len(regions) - sum(r == region for _, r in taken)
        picks += scored[: max(0, min(share, left - len(picks)))]
    return picks
