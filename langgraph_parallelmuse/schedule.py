"""The partial-rollout schedule: which trajectories run, from where, in which wave.

One plan serves every executor: the graph launches each wave with ``Send``, and
:func:`partial_rollout` runs the same waves with ``asyncio.gather`` (benchmarks, scripts), so
what a benchmark measures is exactly what the graph does.

1. First wave: the M initial trajectories and, beside them, the from-scratch fill-ins that need
   no uncertainty (N - M - planned branches; none when later rounds will spend the leftover).
2. Round 1: T branches from each picked checkpoint of the initial trajectories (top-k per
   trajectory by the mode's region, or every step over a calibrated threshold).
3. Rounds 2..R (``rounds`` > 1): T branches from the most uncertain *regenerated* step of each
   previous-round branch, most uncertain first, within the leftover budget.
The last wave tops the total up to N with from-scratch fills, so nothing is silently short.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.state import Origin, Trajectory
from langgraph_parallelmuse.uncertainty import require_logprobs, select_branch_steps


@dataclass(frozen=True)
class Pick:
    """A checkpoint chosen for branching: the state just before ``parent``'s step ``step``."""

    parent: str
    step: int
    region: str
    score: float
    round: int


@dataclass(frozen=True)
class Job:
    """One trajectory to run: from scratch (``parent`` is None) or forked from a pick."""

    id: str
    origin: Origin
    parent: str | None = None


def _fills(trajectories: Sequence[Trajectory], count: int, *, round: int) -> list[Job]:
    start = sum(1 for t in trajectories if t["origin"].get("kind") == "fill")
    return [Job(f"f{start + i}", Origin(kind="fill", parent=None, round=round)) for i in range(count)]


def first_wave(config: ParallelMuseConfig) -> list[Job]:
    """The M initial trajectories and the fill-ins that can run beside them.

    Example:
        >>> [j.id for j in first_wave(ParallelMuseConfig())]
        ['t0', 'f0']
    """
    initial = [Job(f"t{i}", Origin(kind="initial", parent=None, round=0)) for i in range(config.m)]
    return initial + _fills([], config.fill_budget, round=0)


def round_budget(config: ParallelMuseConfig, done: int, round: int) -> int:
    """Branches round ``round`` may launch when ``done`` trajectories exist.

    Round 1 gets the planned M*k*T (or the calibrated cap); later rounds share what is left,
    the last one taking all of it.
    """
    remaining = max(config.n - done, 0)
    if config.mode == "none" or round > config.rounds:
        return 0
    if round == 1:
        return min(config.branch_budget, remaining)
    return remaining if round == config.rounds else remaining // (config.rounds - round + 1)


def pick_branches(trajectories: Sequence[Trajectory], config: ParallelMuseConfig, *, round: int) -> list[Pick]:
    """The checkpoints to fork in round ``round``.

    Round 1 reads the initial trajectories; round r > 1 reads the branches of round r - 1, where
    only steps after the fork (the ones the branch generated itself) are eligible.

    Raises:
        MissingLogprobsError: The model returned no logprobs (round 1, any branching mode).
    """
    if round == 1:
        sources = [t for t in trajectories if t["origin"].get("kind") == "initial"]
    else:
        sources = [
            t for t in trajectories if t["origin"].get("kind") == "branch" and t["origin"].get("round") == round - 1
        ]
    limit = math.ceil(round_budget(config, len(trajectories), round) / config.t)
    if not sources or limit == 0:
        return []
    if round == 1:
        require_logprobs([s for t in sources for s in t["steps"]])
    calibration = Calibration.load(config.calibration) if config.calibration is not None else None
    scored: list[tuple[float, Pick]] = []  # (sort key, pick)
    for traj in sorted(sources, key=lambda t: t["id"]):
        # A failed trajectory's steps are still valid fork points.
        first = (traj["origin"].get("step") or 0) + 1 if round > 1 else 0
        eligible = range(first, len(traj["uncertainty"]))
        if calibration is not None:
            for i in eligible:
                hit = calibration.excess(traj["uncertainty"][i], mode=config.mode)
                if hit is not None and hit[1] > 1.0:
                    region, ratio = hit
                    scored.append((ratio, Pick(traj["id"], i, region, traj["uncertainty"][i][region], round)))
        else:
            k = config.k if round == 1 else 1
            for i, region, score in select_branch_steps(traj["uncertainty"], mode=config.mode, k=k, eligible=eligible):
                # Round 1 keeps each trajectory's top-k in order (the sort is stable);
                # later rounds rank the branches' best steps against each other.
                scored.append((score if round > 1 else 0.0, Pick(traj["id"], i, region, score, round)))
    return [p for _, p in sorted(scored, key=lambda kp: -kp[0])][:limit]


def next_wave(
    trajectories: Sequence[Trajectory], picks: Sequence[Pick], config: ParallelMuseConfig, *, round: int
) -> list[Job]:
    """The jobs of round ``round``: T branches per pick within the round's budget, then, in the last
    round (or when nothing was picked), fills up to N.

    Example:
        >>> cfg = ParallelMuseConfig(n=4, k=1, t=2)
        >>> initial = [{"id": "t0", "origin": {"kind": "initial"}}, {"id": "f0", "origin": {"kind": "fill"}}]
        >>> [j.id for j in next_wave(initial, [Pick("t0", 1, "exploration", 3.2, 1)], cfg, round=1)]
        ['t0.s1.b0', 't0.s1.b1']
    """
    budget = round_budget(config, len(trajectories), round)
    jobs: list[Job] = []
    for pick in picks:
        for j in range(config.t):
            if len(jobs) == budget:
                break
            origin = Origin(
                kind="branch", parent=pick.parent, step=pick.step, region=pick.region, score=pick.score, round=round
            )
            jobs.append(Job(f"{pick.parent}.s{pick.step}.b{j}", origin, parent=pick.parent))
    if round >= config.rounds or not picks:
        jobs += _fills(trajectories, config.n - len(trajectories) - len(jobs), round=round)
    return jobs


def budget_stats(trajectories: Sequence[Trajectory], config: ParallelMuseConfig) -> dict[str, Any]:
    """How the N trajectories arose, against what the schedule planned."""
    kinds = [t["origin"].get("kind") for t in trajectories]
    branches = kinds.count("branch")
    planned = config.n - config.m - config.fill_budget if config.mode != "none" else 0
    by_round: dict[str, int] = {}
    for t in trajectories:
        if t["origin"].get("kind") == "branch":
            key = str(t["origin"].get("round", 1))
            by_round[key] = by_round.get(key, 0) + 1
    return {
        "n": config.n,
        "initial": kinds.count("initial"),
        "branches_planned": planned,
        "branches": branches,
        "branches_by_round": by_round,
        "shortfall_filled": planned - branches,
        "fill": kinds.count("fill"),
    }


async def run_job(
    runner: RolloutRunner,
    job: Job,
    question: str,
    *,
    run_id: str,
    config: ParallelMuseConfig,
    parent: Trajectory | None = None,
) -> Trajectory:
    """Run one job in thread ``{run_id}/{job.id}``: from scratch, or forked from ``parent``."""
    thread_id = f"{run_id}/{job.id}"
    if job.parent is None:
        return await runner.run(question, trajectory_id=job.id, thread_id=thread_id, config=config, origin=job.origin)
    if parent is None or parent["id"] != job.parent:
        raise ValueError(f"job {job.id!r} forks {job.parent!r}: pass that trajectory as parent")
    return await runner.fork(
        parent, job.origin["step"], trajectory_id=job.id, thread_id=thread_id, config=config, origin=job.origin
    )


async def partial_rollout(
    runner: RolloutRunner,
    question: str,
    *,
    config: ParallelMuseConfig,
    run_id: str,
    reuse: Sequence[Trajectory] = (),
) -> tuple[list[Trajectory], list[Pick]]:
    """Run the whole schedule with asyncio: the rollout stage of the graph, without the graph.

    Args:
        runner: Runs and forks trajectories.
        question: The question.
        config: Budget and sampling settings.
        run_id: Prefix of the trajectory thread ids.
        reuse: Already sampled from-scratch trajectories that stand in, in order, for the
            schedule's from-scratch jobs (the benchmark pairs methods on the same samples).

    Returns:
        The N trajectories (in wave order) and every pick.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> runner = RolloutRunner(FakeListChatModel(responses=["<think>x</think><answer>4</answer>"]), [])
        >>> trajs, picks = asyncio.run(partial_rollout(runner, "2+2?", config=ParallelMuseConfig(n=3, mode="none"),
        ...                                            run_id="demo"))
        >>> [t["id"] for t in trajs], picks
        (['t0', 'f0', 'f1'], [])
    """
    pool = iter(reuse)
    trajectories: list[Trajectory] = []

    async def run(job: Job) -> Trajectory:
        if job.parent is None and (sample := next(pool, None)) is not None:
            return sample
        parent = next((t for t in trajectories if t["id"] == job.parent), None)
        return await run_job(runner, job, question, run_id=run_id, config=config, parent=parent)

    trajectories += await asyncio.gather(*(run(job) for job in first_wave(config)))
    picks: list[Pick] = []
    round = 0
    while len(trajectories) < config.n:
        round += 1
        chosen = pick_branches(trajectories, config, round=round)
        wave = next_wave(trajectories, chosen, config, round=round)
        trajectories += await asyncio.gather(*(run(job) for job in wave))
        picks += chosen
    return trajectories, picks
