"""Stage 2 as plain functions: write one trajectory's report, then choose the answer.

The graph's ``compress`` (map) and ``aggregate`` (reduce) nodes call exactly these, and so does the
benchmark harness, so an answer and its ``answer_source`` come out the same on the same
trajectories wherever they are computed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel

from langgraph_parallelmuse.aggregate import BASELINES, aggregate_reports, majority_vote
from langgraph_parallelmuse.compress import compress_trajectory
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.graph_report import write_graph_report
from langgraph_parallelmuse.state import Report, Trajectory

__all__ = ["Choice", "choose_answer", "compression_stats", "write_report"]


@dataclass(frozen=True)
class Choice:
    """The final answer of a run and where it came from.

    Attributes:
        answer: The answer, or ``None`` when no trajectory produced one.
        source: ``"aggregator"``, ``"majority_fallback"`` (aggregation failed), a baseline's name,
            or ``"none"``.
        tokens: Tokens the aggregator generated (0 for a baseline).
        prompt_tokens: Prompt tokens the aggregator was sent.
        cached_prompt_tokens: Of those, what the backend reported as served from its prefix cache.
        error: Why the aggregator's pick was not used (``majority_fallback``), else ``None``.
        note: That the aggregator read the reports cut to fit its context window, else ``None``.
    """

    answer: str | None
    source: str
    tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    error: str | None = None
    note: str | None = None


async def write_report(
    model: BaseChatModel, question: str, trajectory: Trajectory, *, config: ParallelMuseConfig, guided: bool
) -> Report:
    """Compress one finished trajectory with the run's settings (the map step): the three-section
    report, or with ``report_form="graph"`` the graph-shaped one (:mod:`~langgraph_parallelmuse.graph_report`).

    Example:
        >>> import asyncio
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> model = FakeListChatModel(responses=["split it", "search(q=France)", "so Paris"])
        >>> traj = {"id": "t0", "steps": [], "observations": [], "answer": "Paris"}
        >>> asyncio.run(write_report(model, "Capital?", traj, config=ParallelMuseConfig(), guided=True))["status"]
        'ok'
    """
    if config.report_form == "graph":
        return await write_graph_report(
            model, question, trajectory, guided=guided, seed=config.seed, max_report_tokens=config.max_report_tokens
        )
    # The free form's log shows each tool response as the agent kept it (max_observation_chars): a
    # fact the agent read and answered from is in the log the report is written from.
    return await compress_trajectory(
        model,
        question,
        trajectory,
        guided=guided,
        max_report_tokens=config.max_report_tokens,
        max_observation_chars=config.max_observation_chars,
        seed=config.seed,
    )


async def choose_answer(
    aggregator: BaseChatModel,
    question: str,
    trajectories: Sequence[Trajectory],
    reports: Sequence[Report],
    *,
    config: ParallelMuseConfig,
    guided: bool,
) -> Choice:
    """Pick the answer by ``config.aggregation`` (the reduce step).

    ``parallelmuse`` reads only the reports; when that yields nothing although some trajectory
    answered, the majority vote over the trajectories stands in (``majority_fallback``). The
    baselines vote over the trajectories.

    Example:
        >>> import asyncio
        >>> trajs = [{"answer": "Paris"}, {"answer": "Lyon"}, {"answer": "Paris"}]
        >>> cfg = ParallelMuseConfig(aggregation="majority")
        >>> choice = asyncio.run(choose_answer(None, "Capital?", trajs, [], config=cfg, guided=False))
        >>> choice.answer, choice.source, choice.error
        ('Paris', 'majority', None)
    """
    if not any(t["answer"] for t in trajectories):
        return Choice(answer=None, source="none", error=_unanswered(trajectories))
    if config.aggregation != "parallelmuse":
        answer = BASELINES[config.aggregation](trajectories)
        if answer is None:  # answered, but nothing to vote on: "no trajectory answered" would be false
            return Choice(answer=None, source="none", error=_no_vote_key(trajectories))
        return Choice(answer=answer, source=config.aggregation)
    result = await aggregate_reports(
        aggregator,
        question,
        list(reports),
        guided=guided,
        seed=config.seed,
        max_tokens=config.max_aggregate_tokens,
    )
    answer, source = result.answer, result.source
    error = result.error
    if answer is None and any(t["answer"] for t in trajectories):
        answer, source = majority_vote(trajectories), "majority_fallback"
        error = error or "no report carries an answer"
        if answer is None:
            error = f"{error}; {_no_vote_key(trajectories)}"
    return Choice(
        answer=answer,
        source=source if answer is not None else "none",
        tokens=result.tokens,
        prompt_tokens=result.prompt_tokens,
        cached_prompt_tokens=result.cached_prompt_tokens,
        error=error,
        note=result.note,
    )


def _no_vote_key(trajectories: Sequence[Trajectory]) -> str:
    """Why answers got no vote: each normalises to nothing (:func:`~.answers.normalize_vote_key`).

    A placeholder ("—", "%") must not outvote real answers, so it gets no key; with no other answer
    the run has none, and says why instead of "no trajectory answered".

    Example:
        >>> _no_vote_key([{"answer": "—"}, {"answer": "%"}, {"answer": "—"}])
        "the trajectories' answers ('—', '%') have no words or numbers to vote on"
    """
    answers = ", ".join(repr(a) for a in dict.fromkeys(t["answer"] for t in trajectories if t["answer"]))
    return f"the trajectories' answers ({answers:.200}) have no words or numbers to vote on"


# What to change when trajectories ran out of context: "2 context_exhausted" and their errors named no setting.
_EXHAUSTED_HINT = (
    "; the context filled up: give the model a longer context (max_context_tokens) or lower max_observation_chars"
)


def _unanswered(trajectories: Sequence[Trajectory]) -> str:
    """Why no trajectory answered: their statuses and distinct errors (every one ran out of context,
    say), and what to change when one ran out of context.

    Example:
        >>> exhausted = {"status": "context_exhausted", "error": "the context is exhausted at step 0"}
        >>> print(_unanswered([exhausted] * 2).replace("; ", "\\n"))
        no trajectory answered (2 context_exhausted): the context is exhausted at step 0
        the context filled up: give the model a longer context (max_context_tokens) or lower max_observation_chars
        >>> _unanswered([{"status": "max_turns"}])
        'no trajectory answered (1 max_turns)'
    """
    counts = Counter(t.get("status") for t in trajectories)
    errors = list(dict.fromkeys(t["error"] for t in trajectories if t.get("error")))
    shown = "; ".join(errors[:3]) + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
    what = ", ".join(f"{n} {status}" for status, n in counts.items())
    hint = _EXHAUSTED_HINT if counts["context_exhausted"] else ""
    return f"no trajectory answered ({what})" + (f": {shown}" if shown else "") + hint


def compression_stats(reports: Sequence[Report]) -> dict[str, Any]:
    """Reports written, their tokens against the trajectories', and how many fell back.

    ``compression_ratio`` counts the tokens the compressor generated; ``text_ratio`` the report's
    whole text, estimated as the trajectory's tool responses are (four characters a token): a
    guided report's facts are written from the records, not generated, but the aggregator reads them.

    Example:
        >>> stats = compression_stats([{"tokens": 10, "trajectory_tokens": 200, "status": "ok", "text": "x" * 80}])
        >>> stats["compression_ratio"], stats["text_ratio"]
        (0.05, 0.1)
    """
    report_tokens = sum(r["tokens"] for r in reports)
    text_tokens = sum(len(r["text"]) // 4 for r in reports)
    traj_tokens = sum(r["trajectory_tokens"] for r in reports)
    return {
        "reports": len(reports),
        "prompt_tokens": sum(r.get("prompt_tokens", 0) for r in reports),
        "cached_prompt_tokens": sum(r.get("cached_prompt_tokens", 0) for r in reports),
        "report_tokens": report_tokens,
        "trajectory_tokens": traj_tokens,
        "fallback_reports": sum(1 for r in reports if r["status"] == "fallback"),
        "fallback_problems": sorted({r["problem"] for r in reports if r.get("problem")}),
        "compression_ratio": report_tokens / traj_tokens if traj_tokens else None,
        "report_text_tokens": text_tokens,
        "text_ratio": text_tokens / traj_tokens if traj_tokens else None,
    }
