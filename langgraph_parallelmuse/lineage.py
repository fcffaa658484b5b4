"""Where a trajectory comes from: the picks, the jobs and their origin records.

This is the one place a trajectory's identity is made. A job is a plain dict (a persistent
checkpointer stores ``Send`` payloads as they are): its id, the thread it runs in and its
:class:`~langgraph_parallelmuse.state.Origin`. A branch's origin names everything the fork needs,
read off the parent trajectory when the job is made: the parent's thread and the checkpoint just
before the regenerated step, so the runner forks from a reference, never from a copy of the
parent.
"""

from __future__ import annotations

from collections.abc import Sequence

from typing_extensions import TypedDict

from langgraph_parallelmuse.errors import ParallelMuseError
from langgraph_parallelmuse.state import Origin, Trajectory


class Pick(TypedDict):
    """A checkpoint chosen for branching: the state just before ``parent``'s step ``step``."""

    parent: str
    step: int
    region: str | None  # None for a fork made by hand (RolloutRunner.fork)
    score: float | None
    round: int


class Job(TypedDict):
    """One trajectory to run in thread ``thread_id``: from scratch, or forked (``origin["kind"] == "branch"``)."""

    id: str
    thread_id: str
    origin: Origin


def first_own_step(origin: Origin) -> int:
    """The index of a trajectory's first own step: a branch's or crossover's earlier steps are its parent's.

    Example:
        >>> first_own_step({"kind": "branch", "parent": "t0", "step": 2}), first_own_step({"kind": "initial"})
        (2, 0)
    """
    return (origin.get("step") or 0) if origin.get("kind") in ("branch", "crossover") else 0


def thread_of(run_id: str, job_id: str) -> str:
    """The thread a job runs in; deterministic, so a resumed run finds its finished trajectories.

    Example:
        >>> thread_of("run-1", "t0.s1.b0")
        'run-1/t0.s1.b0'
    """
    return f"{run_id}/{job_id}"


def branch_id(parent_id: str, step: int, sibling: int) -> str:
    """The id of branch ``sibling`` forked at ``step`` of trajectory ``parent_id``.

    Example:
        >>> branch_id("t0", 1, 2)
        't0.s1.b2'
    """
    return f"{parent_id}.s{step}.b{sibling}"


def scratch_job(kind: str, index: int, *, run_id: str, round: int = 0) -> Job:
    """A from-scratch job: ``initial`` (``t{i}``) or ``fill`` (``f{i}``).

    Example:
        >>> scratch_job("fill", 2, run_id="r", round=1)
        {'id': 'f2', 'thread_id': 'r/f2', 'origin': {'kind': 'fill', 'parent': None, 'round': 1}}
    """
    job_id = f"{'t' if kind == 'initial' else 'f'}{index}"
    return Job(id=job_id, thread_id=thread_of(run_id, job_id), origin=Origin(kind=kind, parent=None, round=round))


def next_fill_index(trajectories: Sequence[Trajectory]) -> int:
    """One past the highest fill index in use, so a new fill never takes the id (and the thread) of a
    fill that ran: counting the fills is not enough once a stop drops a fill that never took a step
    (``f1``) while keeping a later one (``f2``), whose thread a reused id would resume.

    Example:
        >>> next_fill_index([{"id": "t0", "origin": {"kind": "initial"}}, {"id": "f2", "origin": {"kind": "fill"}}])
        3
    """
    used = [int(t["id"][1:]) for t in trajectories if t["origin"].get("kind") == "fill"]
    return max(used, default=-1) + 1


def branch_job(parent: Trajectory, pick: Pick, sibling: int, *, run_id: str) -> Job:
    """Branch ``sibling`` of ``pick``: a new thread continuing from the checkpoint before the step.

    Raises:
        ParallelMuseError: The parent has no checkpoint before that step in its own thread (a
            branch's prefix steps live in its parent's thread, so they are not fork points of it).

    Example:
        >>> parent = {"id": "t0", "thread_id": "r/t0", "fork_points": ["c0", "c1"],
        ...           "steps": [{"context_tokens": 20}, {"context_tokens": 90}]}
        >>> pick = Pick(parent="t0", step=1, region="exploration", score=3.2, round=1)
        >>> job = branch_job(parent, pick, 0, run_id="r")
        >>> job["id"], job["origin"]["checkpoint_id"], job["origin"]["prefix_tokens"]
        ('t0.s1.b0', 'c1', 90)
    """
    step = pick["step"]
    points = parent.get("fork_points") or []
    # Not points[-1]: a step counted from the end made a job whose origin named step -1 and the
    # checkpoint before the last step.
    checkpoint = points[step] if 0 <= step < len(points) else None
    if checkpoint is None:
        raise ParallelMuseError(f"no checkpoint before step {step} in thread {parent['thread_id']!r}")
    job_id = branch_id(parent["id"], step, sibling)
    origin = Origin(
        kind="branch",
        parent=parent["id"],
        parent_thread=parent["thread_id"],
        checkpoint_id=checkpoint,
        step=step,
        prefix_tokens=parent["steps"][step]["context_tokens"],
        region=pick["region"],
        score=pick["score"],
        round=pick["round"],
    )
    return Job(id=job_id, thread_id=thread_of(run_id, job_id), origin=origin)
