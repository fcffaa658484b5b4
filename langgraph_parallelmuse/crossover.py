"""Crossover of paths (the method's open question 2): fuse two trajectories instead of only voting.

After the reports are written, ``crossover`` extra trajectories each start from a merged context,
the *effective evidence* of two parent trajectories (the tool calls of their effective subgraphs,
:mod:`~langgraph_parallelmuse.infograph`, with the tool responses the parents received), and
answer from it at once: no tool call, so a crossover trajectory never sees text that neither
parent read. Its report joins the others and the aggregator reads them all.

**The pair** (no gold data): the candidates are the answered trajectories whose answer some
document they read leads to (a non-empty effective subgraph), ranked by how much evidence leads to
their answer (effective steps), then by how many trajectories share their answer. A pair is
*complementary* when each parent has an effective tool call the other lacks, so both add to the
merged context. Complementary pairs that *disagree* come first (the best-ranked trajectories with
different answers), then pairs that agree but read *different evidence* (they may have solved
different hops), the most complementary first; a disagreeing pair one of whose parents adds nothing
(a branch and its parent that read the same evidence) comes only after them all.

The graph reads only documents the tools show in their format (see
:mod:`~langgraph_parallelmuse.infograph`): with other tools no trajectory has evidence, no pair
is found, every slot runs a fill, and :func:`~langgraph_parallelmuse.infograph.warn_unreadable`
says why.

**The budget**: the crossovers count inside N. The rollout stage runs ``N - crossover``
trajectories (``ParallelMuseConfig.rollout_n``); after the reports, one crossover per pair runs,
and a slot no pair fills runs a from-scratch fill instead (with its report), so a run always ends
with N trajectories. ``stats["crossover"]`` says how many slots were crossed and filled. After a
consensus stop (``consensus``: no more trajectories start once the answers agree) the slots stay
empty, crossovers and fills alike (``stats["crossover"]["skipped"]`` is ``"consensus"``).

**The lineage**: a crossover's origin (kind ``crossover``) names both parents, their threads and
the steps taken from each into the merged context (not those whose call the other parent's steps
taken before made); its thread is seeded from the parents' checkpointed records when it starts
(the job holds references, never a copy of the parents), and only the steps after the merged
context are its own (tokens, tool calls).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import TypedDict

from langgraph_parallelmuse.answers import normalize_vote_key
from langgraph_parallelmuse.concurrency import gather_all
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.driver import call_key
from langgraph_parallelmuse.infograph import (
    build_graph,
    effective_steps,
    effective_subgraph,
    merged_steps,
    warn_unreadable,
)
from langgraph_parallelmuse.lineage import Job, next_fill_index, scratch_job, thread_of
from langgraph_parallelmuse.schedule import consensus_reached
from langgraph_parallelmuse.state import Origin, Trajectory, lineage_key

if TYPE_CHECKING:
    from langgraph_parallelmuse.agent import RolloutRunner

__all__ = [
    "CrossPair",
    "consensus_stop",
    "crossover_job",
    "crossover_stage",
    "crossover_stats",
    "crossover_wave",
    "pick_pairs",
]


class CrossPair(TypedDict):
    """Two trajectories to cross: their ids (the better-ranked first), the effective steps of each,
    their answers, and why they were paired."""

    parents: list[str]
    steps: list[list[int]]
    answers: list[str]
    reason: Literal["disagree", "evidence"]


def consensus_stop(trajectories: Sequence[Trajectory], config: ParallelMuseConfig) -> bool:
    """Whether the rollout ``trajectories`` ended by a consensus stop (``config.consensus``): it
    cancelled a running trajectory, or their answers hold the share asked (the schedule's test, at
    least 3 finished answers). No more trajectories start after it, crossover ones included.

    Example:
        >>> agreed = [{"answer": "Paris", "status": "answered"}] * 3
        >>> consensus_stop(agreed, ParallelMuseConfig(n=8, branching="online", consensus=0.6))
        True
        >>> consensus_stop(agreed, ParallelMuseConfig(n=8))  # no consensus asked: nothing stopped
        False
    """
    if config.consensus is None:
        return False
    return consensus_reached(trajectories, config.consensus) or any(t["status"] == "cancelled" for t in trajectories)


def _evidence_steps(question: str, trajectory: Trajectory) -> list[int]:
    """The trajectory's effective steps: tool calls whose responses lead to its answer (every relation
    comes from a tool response, so each has one)."""
    return effective_steps(effective_subgraph(build_graph(question, trajectory)))


def _calls(trajectory: Trajectory, steps: Sequence[int]) -> frozenset[str]:
    return frozenset(call_key(trajectory["steps"][i]["action"]) for i in steps)


def pick_pairs(question: str, trajectories: Sequence[Trajectory], *, count: int) -> list[CrossPair]:
    """Up to ``count`` pairs to cross: complementary pairs that disagree, then agreeing ones with
    complementary evidence, then disagreeing pairs one of whose parents adds nothing (see the module
    docstring). Crossover trajectories are never parents.

    Example:
        >>> pick_pairs("Q?", [], count=1)
        []
    """
    if count <= 0:
        return []
    candidates = [
        (t, steps)
        for t in sorted(trajectories, key=lambda t: lineage_key(t["id"]))  # ties: t2 before t10, as votes
        if t["origin"].get("kind") != "crossover"
        and normalize_vote_key(t["answer"])
        and (steps := _evidence_steps(question, t))
    ]
    votes = Counter(normalize_vote_key(t["answer"]) for t, _ in candidates)
    ranked = sorted(candidates, key=lambda c: (-len(c[1]), -votes[normalize_vote_key(c[0]["answer"])]))
    scored: list[tuple[tuple[int, ...], CrossPair]] = []
    for i, (a, a_steps) in enumerate(ranked):
        for j in range(i + 1, len(ranked)):
            b, b_steps = ranked[j]
            pair = CrossPair(
                parents=[a["id"], b["id"]],
                steps=[a_steps, b_steps],
                answers=[a["answer"], b["answer"]],
                reason="disagree",
            )
            ours, theirs = _calls(a, a_steps), _calls(b, b_steps)
            complementary = bool(ours - theirs and theirs - ours)
            if normalize_vote_key(a["answer"]) != normalize_vote_key(b["answer"]):
                scored.append(((0 if complementary else 2, i + j, i), pair))
            elif complementary:
                scored.append(((1, -len(ours ^ theirs), i + j, i), {**pair, "reason": "evidence"}))
    return [pair for _, pair in sorted(scored, key=lambda sp: sp[0])[:count]]


def crossover_job(pair: CrossPair, trajectories: Sequence[Trajectory], index: int, *, run_id: str) -> Job:
    """The job of crossover ``index`` (``x{index}``): its origin names both parents, their threads and
    the steps taken from each into the merged context; ``step`` is where its own steps begin (the
    merged context's length).

    Example:
        >>> def traj(tid, q):
        ...     step = {"index": 0, "action": {"type": "tool_call", "name": "search", "arguments": {"query": q}}}
        ...     return {"id": tid, "thread_id": f"r/{tid}", "steps": [step], "observations": [{"step": 0}]}
        >>> pair = {"parents": ["t0", "f0"], "steps": [[0], [0]], "answers": ["a", "b"], "reason": "disagree"}
        >>> job = crossover_job(pair, [traj("t0", "x"), traj("f0", "y")], 0, run_id="r")
        >>> job["id"], job["origin"]["parents"], job["origin"]["parent_threads"], job["origin"]["step"]
        ('x0', ['t0', 'f0'], ['r/t0', 'r/f0'], 2)
    """
    by_id = {t["id"]: t for t in trajectories}
    parents = [by_id[p] for p in pair["parents"]]
    taken = merged_steps(
        [(p["steps"], p["observations"], steps) for p, steps in zip(parents, pair["steps"], strict=True)]
    )
    job_id = f"x{index}"
    origin = Origin(
        kind="crossover",
        parent=parents[0]["id"],
        parent_thread=parents[0]["thread_id"],
        parents=[p["id"] for p in parents],
        parent_threads=[p["thread_id"] for p in parents],
        parent_steps=taken,
        step=sum(map(len, taken)),
        prefix_tokens=0,  # a merged context is a new prompt: no cached prefix to reuse
        reason=pair["reason"],
        round=0,
    )
    return Job(id=job_id, thread_id=thread_of(run_id, job_id), origin=origin)


def crossover_wave(
    trajectories: Sequence[Trajectory], pairs: Sequence[CrossPair], config: ParallelMuseConfig, *, run_id: str
) -> list[Job]:
    """The crossover stage's jobs: one per pair, and a from-scratch fill for each reserved slot no pair
    took, so the run ends with N trajectories; none after a consensus stop (:func:`consensus_stop`).

    Example:
        >>> [j["id"] for j in crossover_wave([{"id": "t0", "origin": {"kind": "initial"}}], [],
        ...                                  ParallelMuseConfig(n=2, mode="none", crossover=1), run_id="r")]
        ['f0']
    """
    if consensus_stop(trajectories, config):
        return []
    jobs = [crossover_job(pair, trajectories, i, run_id=run_id) for i, pair in enumerate(pairs[: config.crossover])]
    start = next_fill_index(trajectories)
    jobs += [scratch_job("fill", start + i, run_id=run_id) for i in range(config.crossover - len(jobs))]
    return jobs


async def crossover_stage(
    runner: RolloutRunner,
    question: str,
    trajectories: Sequence[Trajectory],
    *,
    config: ParallelMuseConfig,
    run_id: str,
) -> tuple[list[Trajectory], list[CrossPair]]:
    """The crossover stage with asyncio, without the graph (the benchmarks use it): the pairs, then
    their trajectories (and the fills of untaken slots); nothing after a consensus stop. Reports are
    the caller's.

    Example:
        >>> import asyncio
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> from langgraph_parallelmuse.agent import RolloutRunner
        >>> runner = RolloutRunner(FakeListChatModel(responses=["<think>x</think><answer>4</answer>"]), [])
        >>> done, pairs = asyncio.run(crossover_stage(
        ...     runner, "2+2?", [], config=ParallelMuseConfig(n=2, mode="none", crossover=1), run_id="demo"))
        >>> [t["id"] for t in done], pairs
        (['f0'], [])
    """
    if consensus_stop(trajectories, config):
        return [], []
    if config.crossover:
        warn_unreadable(trajectories, uses=f"crossover={config.crossover}")
    pairs = pick_pairs(question, trajectories, count=config.crossover)
    jobs = crossover_wave(trajectories, pairs, config, run_id=run_id)
    done = await gather_all(*(runner.run_job(job, question=question, config=config) for job in jobs))
    return list(done), pairs


def crossover_stats(
    trajectories: Sequence[Trajectory],
    pairs: Sequence[CrossPair],
    config: ParallelMuseConfig,
    *,
    skipped: str | None = None,
) -> dict[str, Any]:
    """How the reserved slots were used, and what the crossover trajectories cost and answered.

    ``skipped`` says why the stage started nothing (``"consensus"``: a consensus stop), else ``None``.

    Example:
        >>> crossover_stats([], [], ParallelMuseConfig(crossover=1))["fills"]
        1
        >>> crossover_stats([], [], ParallelMuseConfig(crossover=1), skipped="consensus")["fills"]
        0
    """
    crossed = [t for t in trajectories if t["origin"].get("kind") == "crossover"]
    return {
        "reserved": config.crossover,
        "skipped": skipped,
        "pairs": [[*p["parents"], p["reason"]] for p in pairs],
        "trajectories": len(crossed),
        # Reserved slots no crossover took: fills ran there, unless the stage was skipped.
        "fills": 0 if skipped else config.crossover - len(crossed),
        "generated_tokens": sum(t["stats"]["generated_tokens"] for t in crossed),
        "prompt_tokens": sum(t["stats"]["prompt_tokens"] for t in crossed),
        "answers": {t["id"]: t["answer"] for t in crossed},
    }
