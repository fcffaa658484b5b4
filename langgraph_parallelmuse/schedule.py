"""The partial-rollout schedule: which trajectories run, from where, in which wave.

One plan serves every executor: the graph launches each wave with ``Send``, and
:func:`partial_rollout` runs the same waves with asyncio (benchmarks, scripts), so
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
import contextlib
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langgraph_parallelmuse.answers import normalize_vote_key
from langgraph_parallelmuse.calibration import Calibration, quantile_of
from langgraph_parallelmuse.concurrency import gather_all, settle
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.lineage import Job, Pick, branch_id, branch_job, next_fill_index, scratch_job, thread_of
from langgraph_parallelmuse.state import Trajectory, lineage_key
from langgraph_parallelmuse.uncertainty import REGIONS_OF_MODE, require_logprobs, select_branch_steps

if TYPE_CHECKING:
    from langgraph_parallelmuse.agent import RolloutRunner


def _fills(trajectories: Sequence[Trajectory], count: int, *, round: int, run_id: str) -> list[Job]:
    start = next_fill_index(trajectories)
    return [scratch_job("fill", start + i, run_id=run_id, round=round) for i in range(count)]


def first_wave(config: ParallelMuseConfig, *, run_id: str) -> list[Job]:
    """The M initial trajectories and the fill-ins that can run beside them.

    Example:
        >>> [j["thread_id"] for j in first_wave(ParallelMuseConfig(), run_id="r")]
        ['r/t0', 'r/f0']
    """
    initial = [scratch_job("initial", i, run_id=run_id) for i in range(config.m)]
    return initial + _fills([], config.fill_budget, round=0, run_id=run_id)


def round_budget(config: ParallelMuseConfig, done: int, round: int) -> int:
    """Branches round ``round`` may launch when ``done`` trajectories exist.

    Round 1 gets the planned M*k*T (or the calibrated cap); later rounds share what is left, a
    middle round's share rounded up and the last round taking all the rest.

    Example:
        >>> cfg = ParallelMuseConfig(n=3, k=1, t=1, rounds=3)
        >>> [round_budget(cfg, 1, 1), round_budget(cfg, 2, 2), round_budget(cfg, 3, 3)]
        [1, 1, 0]
    """
    remaining = max(config.rollout_n - done, 0)
    if config.mode == "none" or round > config.rounds:
        return 0
    if round == 1:
        return min(config.branch_budget, remaining)
    if round == config.rounds:
        return remaining
    # Rounded down, fewer slots than rounds gave a middle round 0: next_wave read that as nothing
    # picked and filled the rest from scratch, so the branches of the branches never ran.
    return min(remaining, math.ceil(remaining / (config.rounds - round + 1)))


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
        steps = [s for t in sources for s in t["steps"]]
        generated = "".join(s["text"] for s in steps if s["generated_tokens"])
        require_logprobs(generated, [tok for s in steps for tok in s["tokens"]])
    calibration = Calibration.load(config.calibration) if config.calibration is not None else None
    scored: list[tuple[float, Pick]] = []  # (sort key, pick)
    # In lineage order ("t2" before "t10"), so a tie in the ranking below goes as every vote's does.
    for traj in sorted(sources, key=lambda t: lineage_key(t["id"])):
        # A failed trajectory's steps are still valid fork points.
        first = (traj["origin"].get("step") or 0) + 1 if round > 1 else 0
        eligible = range(first, len(traj["uncertainty"]))
        if calibration is not None:
            for i in eligible:
                hit = calibration.excess(traj["uncertainty"][i], mode=config.mode)
                if hit is not None and hit[1] > 1.0:
                    region, ratio = hit
                    score = traj["uncertainty"][i][region]
                    scored.append((ratio, Pick(parent=traj["id"], step=i, region=region, score=score, round=round)))
        else:
            k = config.k if round == 1 else 1
            for i, region, score in select_branch_steps(traj["uncertainty"], mode=config.mode, k=k, eligible=eligible):
                # Round 1 keeps each trajectory's top-k in order (the sort is stable);
                # later rounds rank the branches' best steps against each other.
                pick = Pick(parent=traj["id"], step=i, region=region, score=score, round=round)
                scored.append((score if round > 1 else 0.0, pick))
    return [p for _, p in sorted(scored, key=lambda kp: -kp[0])][:limit]


def next_wave(
    trajectories: Sequence[Trajectory],
    picks: Sequence[Pick],
    config: ParallelMuseConfig,
    *,
    round: int,
    run_id: str,
) -> list[Job]:
    """The jobs of round ``round``: T branches per pick within the round's budget, then, in the last
    round (or when nothing was picked), fills up to N.

    Example:
        >>> cfg = ParallelMuseConfig(n=4, k=1, t=2)
        >>> t0 = {"id": "t0", "thread_id": "r/t0", "origin": {"kind": "initial"}, "fork_points": ["c0", "c1"],
        ...       "steps": [{"context_tokens": 20}, {"context_tokens": 90}]}
        >>> initial = [t0, {"id": "f0", "origin": {"kind": "fill"}}]
        >>> pick = Pick(parent="t0", step=1, region="exploration", score=3.2, round=1)
        >>> [j["id"] for j in next_wave(initial, [pick], cfg, round=1, run_id="r")]
        ['t0.s1.b0', 't0.s1.b1']
    """
    budget = round_budget(config, len(trajectories), round)
    by_id = {t["id"]: t for t in trajectories}
    jobs: list[Job] = []
    for pick in picks:
        for j in range(config.t):
            if len(jobs) == budget:
                break
            jobs.append(branch_job(by_id[pick["parent"]], pick, j, run_id=run_id))
    if round >= config.rounds or not picks:
        jobs += _fills(trajectories, config.rollout_n - len(trajectories) - len(jobs), round=round, run_id=run_id)
    return jobs


def budget_stats(trajectories: Sequence[Trajectory], config: ParallelMuseConfig) -> dict[str, Any]:
    """How the N trajectories arose, against what the schedule planned."""
    kinds = [t["origin"].get("kind") for t in trajectories]
    branches = kinds.count("branch")
    planned = config.rollout_n - config.m - config.fill_budget if config.mode != "none" else 0
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
        # Fills beyond the plan's stand for branches that could not be made; after a consensus
        # stop the missing branches were never replaced, so the gap alone is not a count of fills.
        "shortfall_filled": max(0, min(planned - branches, kinds.count("fill") - config.fill_budget)),
        "fill": kinds.count("fill"),
        "crossover_reserved": config.crossover,  # slots kept for after the reports (stats["crossover"])
    }


async def partial_rollout(
    runner: RolloutRunner,
    question: str,
    *,
    config: ParallelMuseConfig,
    run_id: str,
    reuse: Sequence[Trajectory] = (),
    limit: contextlib.AbstractAsyncContextManager | None = None,
) -> tuple[list[Trajectory], list[Pick]]:
    """Run the whole schedule with asyncio: the rollout stage of the graph, without the graph.

    Args:
        runner: Runs and forks trajectories.
        question: The question.
        config: Budget and sampling settings.
        run_id: Prefix of the trajectory thread ids.
        reuse: Already sampled from-scratch trajectories that stand in, in order, for the
            schedule's from-scratch jobs (the benchmark pairs methods on the same samples).
        limit: Bounds the trajectories in flight (``None``: a whole wave at once).

    Returns:
        The N trajectories (in wave order) and every pick.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> from langgraph_parallelmuse.agent import RolloutRunner
        >>> runner = RolloutRunner(FakeListChatModel(responses=["<think>x</think><answer>4</answer>"]), [])
        >>> trajs, picks = asyncio.run(partial_rollout(runner, "2+2?", config=ParallelMuseConfig(n=3, mode="none"),
        ...                                            run_id="demo"))
        >>> [t["id"] for t in trajs], picks
        (['t0', 'f0', 'f1'], [])
    """
    pool = iter(reuse)
    trajectories: list[Trajectory] = []

    async def run(job: Job) -> Trajectory:
        if job["origin"].get("kind") != "branch" and (sample := next(pool, None)) is not None:
            return sample
        # Held as the graph's rollout node holds its slot: a reused sample calls no model, so takes none.
        async with limit if limit is not None else contextlib.nullcontext():
            return await runner.run_job(job, question=question, config=config)

    trajectories += await gather_all(*(run(job) for job in first_wave(config, run_id=run_id)))
    picks: list[Pick] = []
    round = 0
    while len(trajectories) < config.rollout_n:
        round += 1
        chosen = pick_branches(trajectories, config, round=round)
        wave = next_wave(trajectories, chosen, config, round=round, run_id=run_id)
        trajectories += await gather_all(*(run(job) for job in wave))
        picks += chosen
    return trajectories, picks


OnEvent = Callable[..., None]


class _Online:
    """One question's online partial rollout: the state shared by its running trajectories."""

    def __init__(
        self,
        runner: RolloutRunner,
        question: str,
        config: ParallelMuseConfig,
        run_id: str,
        *,
        reuse: Sequence[Trajectory],
        on_event: OnEvent,
        limit: contextlib.AbstractAsyncContextManager | None,
    ) -> None:
        self.runner, self.question, self.config, self.run_id = runner, question, config, run_id
        self.pool, self.on_event, self.limit = iter(reuse), on_event, limit
        self.calibration = Calibration.load(config.calibration) if config.calibration is not None else None
        self.done: list[Trajectory] = []
        self.picks: list[Pick] = []
        self.tasks: dict[asyncio.Task, Job] = {}
        # Every task reports its end here: asyncio.wait watches only the tasks it was handed, so a branch
        # forked during the wait went unwatched, and its consensus or its error waited for its parent's end.
        self.ended: asyncio.Queue[asyncio.Task] = asyncio.Queue()
        self.examined: dict[str, int] = {}  # trajectory id -> steps already considered for a fork
        self.earlier: dict[str, dict[int, tuple[str, float]]] = {}  # forks a resumed run's first run took
        self.seen_scores: list[float] = []  # this run's finished step scores (the estimate, uncalibrated)
        self.launched = 0
        self.announced: set[str] = set()  # running, as far as the progress events told
        self.stopped = False

    @property
    def room(self) -> int:
        """Trajectories the budget N still allows to start."""
        return self.config.rollout_n - self.launched

    def forks(self, parent: Trajectory) -> int:
        """Fork points ``parent`` has taken (at most k)."""
        return sum(p["parent"] == parent["id"] for p in self.picks)

    def start(self, job: Job) -> None:
        self.launched += 1
        task = asyncio.ensure_future(self._run(job))
        self.tasks[task] = job
        task.add_done_callback(self.ended.put_nowait)

    async def next_ended(self) -> list[asyncio.Task]:
        """The tasks that have ended since the last call, in the order they ended (waits for one)."""
        ended = [await self.ended.get()]
        while not self.ended.empty():
            ended.append(self.ended.get_nowait())
        # A done-callback runs a loop turn after its task ends: those ended but not yet reported are read
        # now, so a consensus is judged on every answer there is (and their reports come stale).
        ended += [task for task in self.tasks if task.done()]
        return [task for task in dict.fromkeys(ended) if task in self.tasks]

    async def _run(self, job: Job) -> Trajectory:
        sample = next(self.pool, None) if job["origin"].get("kind") != "branch" else None
        on_step = self.examine if job["origin"].get("kind") == "initial" else None
        # Announced inside its slot of max_concurrency, as the graph's post-hoc nodes do: announced when
        # queued, every trajectory of N looked running at once.
        async with self.limit if self.limit is not None and sample is None else contextlib.nullcontext():
            self.announced.add(job["id"])
            self.on_event(
                "trajectory_started", id=job["id"], kind=job["origin"]["kind"], step=job["origin"].get("step")
            )
            if (traj := sample) is None:
                traj = await self.runner.run_job(job, question=self.question, config=self.config, on_step=on_step)
            self.announced.discard(job["id"])
            self.on_event("trajectory_finished", trajectory=traj)
        if traj["origin"].get("kind") == "initial":
            await self.examine(traj)  # a finished or reused parent: every step is considered
            self.complete(traj)
        return traj

    async def examine(self, parent: Trajectory) -> None:
        """Fork each newly finished step of an initial trajectory that crosses the threshold, at once."""
        start = self.examined.get(parent["id"], 0)
        self.examined[parent["id"]] = len(parent["uncertainty"])
        earlier = await self._earlier_forks(parent, range(start, len(parent["uncertainty"])))
        for step in range(start, len(parent["uncertainty"])):
            if self.stopped:
                return
            # Read after the parent's k forks too: every finished step feeds the uncalibrated threshold,
            # which without the ordinary steps after a parent's forks was a percentile of crossing ones.
            hit = self._crossing(parent["uncertainty"][step])
            # A resumed run takes the forks its first run took, up to the last of them (their branches may
            # have finished): without a calibration, which steps cross depends on the order steps finished in.
            if any(at >= step for at in earlier):
                hit = earlier.get(step)
            if hit is None or self.room <= 0 or self.forks(parent) >= self.config.k:
                continue
            region, score = hit
            self.fork(parent, Pick(parent=parent["id"], step=step, region=region, score=score, round=1))

    async def _earlier_forks(self, parent: Trajectory, steps: range) -> dict[int, tuple[str, float]]:
        """The steps of ``parent`` an earlier run of this run id forked at (their branch threads exist)."""
        found = self.earlier.setdefault(parent["id"], {})
        for step in steps:
            origin = await self.runner.origin_of(thread_of(self.run_id, branch_id(parent["id"], step, 0)))
            if origin is not None:
                found[step] = (origin["region"], origin["score"])
        return found

    def complete(self, parent: Trajectory) -> None:
        """An initial trajectory has ended with fewer than k fork points taken: its most uncertain
        remaining steps (the paper's top-k) take the rest, so the budget still goes to branches that
        share a prefix rather than to from-scratch fills."""
        # The forks taken online keep their region's share of k (mixed: ceil(k/2) exploration).
        taken = [(p["step"], p["region"]) for p in self.picks if p["parent"] == parent["id"]]
        if self.stopped or len(taken) >= self.config.k:
            return
        for step, region, score in select_branch_steps(
            parent["uncertainty"], mode=self.config.mode, k=self.config.k, taken=taken
        ):
            if self.room <= 0:
                return
            self.fork(parent, Pick(parent=parent["id"], step=step, region=region, score=score, round=1))

    def fork(self, parent: Trajectory, pick: Pick) -> None:
        """Start T branches (within the budget) from ``pick``'s checkpoint of ``parent``."""
        self.picks.append(pick)
        self.on_event("branch_picked", **pick)
        for sibling in range(min(self.config.t, self.room)):
            self.start(branch_job(parent, pick, sibling, run_id=self.run_id))

    def _crossing(self, scores: dict[str, float | None]) -> tuple[str, float] | None:
        """The mode's region a step crosses the threshold in, and its score; ``None`` if it does not."""
        if self.calibration is not None:
            hit = self.calibration.excess(scores, mode=self.config.mode)
            return (hit[0], scores[hit[0]]) if hit is not None and hit[1] > 1.0 else None
        # No calibration: the step must exceed this run's finished steps' 80th percentile so far.
        # A non-finite score is no score, as in ``select_branch_steps`` and ``Calibration.excess``: a NaN
        # won max() over the other region (hiding its crossing), and once among the seen scores it could
        # make the percentile NaN, which no later step crosses.
        regions = [
            (r, score)
            for r in REGIONS_OF_MODE[self.config.mode]
            if (score := scores.get(r)) is not None and math.isfinite(score)
        ]
        if not regions:
            return None
        region, score = max(regions, key=lambda rs: rs[1])
        threshold = quantile_of(self.seen_scores, 0.8) if len(self.seen_scores) >= _MIN_ESTIMATE else None
        self.seen_scores.append(score)
        return (region, score) if threshold is not None and score > threshold else None

    def settled(self) -> bool:
        return consensus_reached(self.done, self.config.consensus)

    async def halt(self) -> BaseException | None:
        """Cancel the running trajectories and wait until every one has ended (``settle``).

        Returns:
            The first error a trajectory ended with, other than its cancellation; each one is read,
            so asyncio logs none of them as never retrieved.
        """
        self.stopped = True  # a parent being cancelled forks no branch that would be left running
        await settle(self.tasks)
        errors = [task.exception() for task in self.tasks if not task.cancelled()]
        return next((error for error in errors if error is not None), None)

    async def cancel_running(self) -> None:
        """The consensus stop: cancel what runs, and record how far each trajectory got.

        Raises:
            Exception: The error a trajectory ended with before the stop reached it. Recorded from
                its checkpoints instead, it was lost: the run returned as if nothing had failed.
        """
        if (error := await self.halt()) is not None:
            raise error
        # Those that ended before the stop reached them keep their own result (and ended first).
        for task, job in sorted(self.tasks.items(), key=lambda tj: tj[0].cancelled()):
            if not task.cancelled():
                self.done.append(task.result())
                continue
            # What a cancelled one finished stays checkpointed; the record says why it ended.
            traj = await self.runner.snapshot(job["thread_id"], self.config)
            status = traj["status"] if traj["status"] != "running" else "cancelled"
            record = {**traj, "status": status, "answer": traj["answer"] if status != "cancelled" else None}
            # One cancelled before its own first step is no trajectory (a branch holds only its parent's prefix).
            if len(traj["steps"]) > (traj["origin"].get("step") or 0):
                self.done.append(record)
            if job["id"] in self.announced:  # a progress display showed it running: it ends there too
                self.on_event("trajectory_finished", trajectory=record)
        self.tasks.clear()


_MIN_ESTIMATE = 5  # finished steps before an uncalibrated run trusts its own threshold
_MIN_VOTES = 3


def consensus_reached(trajectories: Sequence[Trajectory], consensus: float | None) -> bool:
    """The consensus stop's test: at least 3 finished answers, and the most common one holds the
    share ``consensus`` asks (``None``: no consensus stop).

    Example:
        >>> consensus_reached([{"answer": "Paris"}, {"answer": "paris"}, {"answer": "Lyon"}], 0.6)
        True
    """
    if consensus is None:
        return False
    votes = [k for t in trajectories if (k := normalize_vote_key(t["answer"]))]
    return len(votes) >= _MIN_VOTES and max(map(votes.count, votes)) / len(votes) >= consensus


async def online_rollout(
    runner: RolloutRunner,
    question: str,
    *,
    config: ParallelMuseConfig,
    run_id: str,
    reuse: Sequence[Trajectory] = (),
    on_event: OnEvent | None = None,
    limit: contextlib.AbstractAsyncContextManager | None = None,
) -> tuple[list[Trajectory], list[Pick]]:
    """Online partial rollout (``branching="online"``): branch while the parent runs.

    The M initial trajectories and the planned fills start at once, as in the post-hoc schedule.
    Whenever an initial trajectory finishes a step whose region perplexity (by ``mode``) crosses the
    threshold, T branches from the checkpoint before that step start immediately and the parent
    goes on. k keeps its meaning, fork points per initial trajectory: its first k crossing steps
    fork at once, and if it ends with fewer, its most uncertain remaining steps (the post-hoc
    top-k) take the rest when it ends. The threshold is the calibration's (from other questions), else
    the 80th percentile of this run's finished steps so far. As soon as every initial trajectory has
    ended (no fork can come any more), fills top the total up to N beside the running branches.
    With ``consensus``, once that share of at least 3 finished answers agree, no more trajectories
    start and running ones are cancelled (status ``cancelled``; their finished steps
    stay checkpointed, so a resumed run does not redo them).

    Args:
        runner: Runs and forks trajectories.
        question: The question.
        config: Budget, thresholds and stops.
        run_id: Prefix of the trajectory thread ids.
        reuse: From-scratch samples that stand in for the schedule's from-scratch jobs.
        on_event: ``on_event(name, **data)`` for progress (``branch_picked`` when the fork happens).
        limit: Bounds the trajectories in flight.

    Returns:
        The trajectories (in the order they ended) and the picks.

    Raises:
        Exception: The error that ended a trajectory's run (``MissingLogprobsError``, a failed
            checkpoint write), as soon as it comes: the others are cancelled first, as in a post-hoc
            wave, and a step they had in flight is generated again on resume.
    """
    run = _Online(runner, question, config, run_id, reuse=reuse, on_event=on_event or _ignore, limit=limit)
    fills = config.rollout_n - config.m - config.m * config.k * config.t
    for job in [scratch_job("initial", i, run_id=run_id) for i in range(config.m)]:
        run.start(job)
    for i in range(fills):
        run.start(scratch_job("fill", i, run_id=run_id))
    try:
        while run.tasks:
            for task in await run.next_ended():
                run.done.append(task.result())  # an error ends the run at once, as gather_all's waves do
                del run.tasks[task]
            if run.settled():
                run.on_event("consensus_reached", answers=len(run.done))
                await run.cancel_running()
            elif run.room > 0 and not any(j["origin"]["kind"] == "initial" for j in run.tasks.values()):
                # Once every initial trajectory has ended no fork can come, so the forks they did not take
                # go to fills now, beside the running branches, rather than as a wave of their own.
                top_up = run.room
                for i in range(top_up):
                    run.start(scratch_job("fill", fills + i, run_id=run_id, round=1))
                fills += top_up
    finally:
        # An error or a cancellation of the node must not leave trajectories writing to their threads.
        await run.halt()  # the error that ended the run, if any, is already on its way up
    return run.done, run.picks


def _ignore(*args: Any, **kwargs: Any) -> None:
    pass


async def run_schedule(
    runner: RolloutRunner,
    question: str,
    *,
    config: ParallelMuseConfig,
    run_id: str,
    reuse: Sequence[Trajectory] = (),
) -> tuple[list[Trajectory], list[Pick]]:
    """The rollout stage by ``config.branching``: :func:`partial_rollout` (post hoc) or :func:`online_rollout`.

    At most ``config.max_concurrency`` trajectories run at once, each holding a slot while it runs, as
    in the graph: a caller that lowered it to spare a server would otherwise still send it a whole
    wave (N at once online).
    """
    schedule = online_rollout if config.branching == "online" else partial_rollout
    limit = asyncio.Semaphore(config.max_concurrency)
    return await schedule(runner, question, config=config, run_id=run_id, reuse=reuse, limit=limit)
