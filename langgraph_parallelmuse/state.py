"""Typed state of the rollout subgraph and of the ParallelMuse graph, with explicit reducers.

Records are plain ``TypedDict``s of JSON-friendly values so every checkpointer (memory, SQLite,
Postgres) can store them and results can be dumped as JSON unchanged.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NotRequired

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages

# typing_extensions: pydantic builds JSON schemas (Studio's input and output forms) from these only on 3.12+ otherwise.
from typing_extensions import TypedDict


class TokenRecord(TypedDict):
    """One generated token: text, raw logprob, top alternatives, char span in the step text."""

    token: str
    logprob: float
    top_logprobs: list[list[Any]]  # [[token, logprob], ...] best first
    start: int
    end: int


class Action(TypedDict, total=False):
    """What a think step decided: a tool call, an answer, or nothing usable."""

    type: Literal["tool_call", "answer", "invalid"]
    name: str
    arguments: dict[str, Any]
    answer: str
    error: str


class Step(TypedDict):
    """One think step of a trajectory (tool responses are not steps: they are never scored)."""

    index: int
    text: str  # the assistant turn exactly as it is sent back to the model
    tokens: list[TokenRecord]  # generated tokens only; prefilled protocol text has none
    regions: dict[str, list[int]]  # region -> [char_start, char_end) inside ``text``
    action: Action
    prompt_tokens: int  # summed over the step's model calls (a guided step makes several)
    context_tokens: int  # prompt tokens of the step's first call: the conversation before it
    generated_tokens: int  # includes resampled attempts the driver rejected and what scoring a choice decoded
    cached_prompt_tokens: int  # prompt tokens a prefix cache served (observed: as the backend reported)
    calls: int
    conversation_calls: int  # calls on the conversation itself (not on a segment's own plain prompt)
    conversation_prompt_tokens: int
    conversation_cached_tokens: int
    cache_reported: bool  # the backend reports cached prompt tokens at all
    finish_reason: str
    seconds: float
    bridge: NotRequired[str]  # the entity this step's query starts from (the last hop's best span)
    # Why the driver still objects to this turn (a repeated tool call, an empty thought): kept because
    # its resamples ran out, or none was tried (temperature 0, where a resample is the same turn).
    rejected: NotRequired[str]


class Observation(TypedDict):
    """The tool response to step ``step`` (wrapped and neutralised before the model sees it)."""

    step: int
    name: str
    arguments: dict[str, Any]
    content: str
    error: bool
    seconds: float
    doc_ids: NotRequired[list[str]]  # documents the tool showed or opened (retrieval recall)


def count_tool_calls(observations: Sequence[Observation], *, steps: Sequence[Step] | None = None) -> int:
    """Tool calls among observations: every call the agent made, failed ones too, but not the error
    replies to an unreadable turn (those answer no call).

    An unreadable turn's reply is recorded under the name ``invalid``, which a tool of the user's own
    (or a call the model made up) may also have: with the trajectory's ``steps``, what each observation
    answers is read from its step's action instead, so such a call counts. Without them, or for an
    observation whose step is not among them (or a step record without its ``index`` or its action's
    ``type``), the name decides.

    Example:
        >>> steps = [{"index": 0, "action": {"type": "tool_call", "name": "invalid"}},
        ...          {"index": 1, "action": {"type": "invalid"}}]
        >>> observations = [{"step": 0, "name": "invalid"}, {"step": 1, "name": "invalid"}]
        >>> count_tool_calls(observations, steps=steps), count_tool_calls(observations)
        (1, 0)
    """
    # Hand-built records may lack a step's index or its action's type: the name decides there.
    kinds = {s["index"]: kind for s in steps or () if "index" in s and (kind := (s.get("action") or {}).get("type"))}
    return sum(
        1
        for o in observations
        if (kinds[o["step"]] == "tool_call" if o.get("step") in kinds else o["name"] != "invalid")
    )


_ROOT_ID = re.compile(r"^([tfx])(\d+)$")  # initial, fill, crossover (lineage.py)
_HOP_ID = re.compile(r"^[sb]\d+$")  # a branch's step and sibling


def lineage_key(trajectory_id: str) -> tuple[Any, ...]:
    """Sort key of a trajectory id in lineage order: initial trajectories (``t2`` before ``t10``),
    each followed by its branches (``t0.s4.b1``), then fills, then crossovers.

    Ids come from the lineage, never from when a trajectory happened to finish, so whatever
    depends on the order of trajectories (a vote's ties) comes out the same in every run and
    every schedule (post hoc or online) that ran the same trajectories. A label before the id
    (the bench's ``exp.t0.s1.b0``) orders last; ids of another making follow, in natural order.

    Example:
        >>> sorted(["t10", "x0", "f0", "t0.s4.b1", "t2", "t0", "exp.t0.s1.b0"], key=lineage_key)
        ['t0', 'exp.t0.s1.b0', 't0.s4.b1', 't2', 't10', 'f0', 'x0']
    """
    parts = trajectory_id.split(".")
    label = ""
    if len(parts) > 1 and not _ROOT_ID.match(parts[0]) and _ROOT_ID.match(parts[1]):
        label, parts = parts[0], parts[1:]
    root = _ROOT_ID.match(parts[0])
    if root is not None and all(_HOP_ID.match(p) for p in parts[1:]):
        hops = tuple(int(p[1:]) for p in parts[1:])
        return (0, "tfx".index(root[1]), int(root[2]), hops, label)
    # Numbers as numbers, and typed so a number never meets a word in a comparison.
    return (1, tuple((0, int(p)) if p.isdecimal() else (1, p) for p in re.split(r"(\d+)", trajectory_id) if p))


TrajectoryStatus = Literal[
    "running",
    "answered",
    "max_turns",
    "context_exhausted",
    "failed",
    "stopped",  # early stop: its confidence fell below the calibrated floor (``error`` says how far)
    "cancelled",  # consensus stop: the answers already agreed; its finished steps stay checkpointed
]


class Origin(TypedDict, total=False):
    """How a trajectory arose: from scratch, forked from a parent's checkpoint, or crossed from two parents."""

    kind: Literal["initial", "branch", "fill", "crossover"]
    parent: str | None  # parent trajectory id
    parent_thread: str | None
    checkpoint_id: str | None
    step: int | None  # index of the regenerated step (steps before it are the shared prefix)
    prefix_tokens: int  # prompt tokens of the parent's conversation at the fork point
    region: str | None
    score: float | None
    round: int
    # A crossover (crossover.py): both parents, their threads, and the steps of each it starts from.
    parents: list[str]
    parent_threads: list[str]
    parent_steps: list[list[int]]
    reason: str  # why this pair: "disagree" or "evidence"


def append_all(state: list, writes: list[list]) -> list:
    """Batch reducer of a :class:`~langgraph.channels.delta.DeltaChannel`: append every write in order.

    Example:
        >>> append_all([1], [[2], [3, 4]])
        [1, 2, 3, 4]
    """
    return [*state, *(item for write in writes for item in write)]


class AgentState(TypedDict, total=False):
    """State of the checkpointed think/act rollout subgraph (one thread per trajectory).

    ``steps`` and ``observations`` grow by one record a step: as delta channels, a checkpoint
    stores only that step's write (plus a full snapshot every ``snapshot_frequency`` updates), not
    the whole list again, so a thread's storage grows linearly with its steps, not quadratically.
    """

    question: str
    trajectory_id: str
    origin: Origin
    steps: Annotated[list[Step], DeltaChannel(append_all)]
    observations: Annotated[list[Observation], DeltaChannel(append_all)]
    status: TrajectoryStatus
    answer: str | None
    error: str | None


class TrajectoryStats(TypedDict):
    generated_tokens: int  # tokens generated by this trajectory's own steps
    prompt_tokens: int  # prompt tokens sent by its own steps
    # Computed: the parent's prefix, sent again by each of the branch's conversation calls.
    reused_prefix_tokens: int
    # Observed: what the backend reported as served from its prefix cache (all calls, and the
    # calls on the conversation, which continue the parent's prompt).
    cached_prompt_tokens: int
    conversation_prompt_tokens: int
    conversation_cached_tokens: int
    cache_reported: bool
    # DeepConf's lowest sliding-window confidence over its own tokens (None: no logprobs).
    lowest_confidence: float | None
    tool_calls: int  # tool calls made by its own steps (prefix calls are not re-run)
    seconds: float
    # What went wrong in its own steps while it still ran (agent.turn_problems; a run's ``stats.rollout``
    # sums them): its tool calls whose response was an error and up to three distinct such responses
    # (redacted), its turns the driver could not read, and its turns kept though the driver rejected them.
    tool_errors: NotRequired[int]
    tool_error_reasons: NotRequired[list[str]]
    invalid_turns: NotRequired[int]
    rejected_turns: NotRequired[int]


class Trajectory(TypedDict):
    """A finished trajectory as the ParallelMuse graph keeps it."""

    id: str
    thread_id: str
    origin: Origin
    steps: list[Step]
    observations: list[Observation]
    # Per step, the id of the checkpoint just before it in this thread (its fork point); None for
    # a branch's prefix steps, whose fork points live in the parent's thread.
    fork_points: list[str | None]
    status: TrajectoryStatus
    answer: str | None
    error: NotRequired[str | None]
    uncertainty: list[dict[str, float | None]]  # per step: region -> perplexity (None: no region)
    stats: TrajectoryStats


class Report(TypedDict):
    """A compressed trajectory (Stage 2 map output)."""

    trajectory_id: str
    text: str
    answer: str | None
    status: Literal["ok", "fallback"]  # fallback: the model-written part failed twice (what it wrote is kept)
    tokens: int  # generated tokens of the report
    trajectory_tokens: int  # tokens of the trajectory text it compresses
    prompt_tokens: int  # prompt tokens sent to write it
    cached_prompt_tokens: int  # observed: what the backend served from its prefix cache
    seconds: float
    problem: NotRequired[str | None]  # why a report fell back (a failed model call names its error)


def _merge_by(key: str):
    def reducer(left: list[dict] | None, right: list[dict] | dict | None) -> list[dict]:
        out = list(left or [])
        if right is None:
            return out
        index = {rec[key]: i for i, rec in enumerate(out)}
        for rec in [right] if isinstance(right, dict) else right:
            if rec[key] in index:
                out[index[rec[key]]] = rec
            else:
                index[rec[key]] = len(out)
                out.append(rec)
        return out

    reducer.__doc__ = (
        f"Reducer: append records, replacing an earlier one with the same ``{key}``, so a resumed "
        "or retried run stays idempotent."
    )
    return reducer


merge_trajectories = _merge_by("id")
merge_reports = _merge_by("trajectory_id")


def merge_stats(left: dict | None, right: dict | None) -> dict:
    """Reducer: shallow-merge stats dicts; numbers under the same key are summed, the run's settings
    (``config``) replaced.

    Example:
        >>> merge_stats({"config": {"n": 8}, "tokens": 5}, {"config": {"n": 8}, "tokens": 2})
        {'config': {'n': 8}, 'tokens': 7}
    """
    out = dict(left or {})
    for key, value in (right or {}).items():
        if key == "config":  # settings, not counts: a fork that edited them records the new ones
            out[key] = value
        elif isinstance(value, (int, float)) and isinstance(out.get(key), (int, float)):
            out[key] = out[key] + value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_stats(out[key], value)
        else:
            out[key] = value
    return out


class ParallelMuseInput(TypedDict, total=False):
    """Graph input: a ``question``, or chat ``messages`` whose last human message is the question."""

    question: str
    messages: Annotated[list[AnyMessage], add_messages]


class ParallelMuseOutput(TypedDict, total=False):
    question: str
    messages: Annotated[list[AnyMessage], add_messages]
    answer: str | None
    answer_source: str
    reports: list[Report]
    trajectories: list[Trajectory]
    stats: dict[str, Any]


class ParallelMuseState(TypedDict, total=False):
    """Full state of the ParallelMuse graph."""

    question: str
    # What the last run was asked: its question and the human message it came from (if any), so the
    # next turn of a checkpointed chat tells a new message from the previous run's question; and the
    # settings its trajectories depend on, so a fork whose question or settings were edited after
    # ``prepare`` runs in threads of its own (nodes.ParallelMuseNodes.run_id).
    asked: dict[str, Any]
    run_id: str  # prefix of the trajectory thread ids of this run
    settings: dict[str, Any]  # the run's ParallelMuseConfig, fixed when it starts (a resume keeps it)
    spans: Annotated[list[list[Any]], operator.add]  # [stage, start, end] of every node run (active seconds)
    messages: Annotated[list[AnyMessage], add_messages]
    trajectories: Annotated[list[Trajectory], merge_trajectories]
    reports: Annotated[list[Report], merge_reports]
    picks: Annotated[list[dict[str, Any]], operator.add]  # every round's picks (lineage.Pick records)
    crossovers: Annotated[list[dict[str, Any]], operator.add]  # the pairs crossed (crossover.CrossPair records)
    round: int  # the branching round in progress (0 before the first)
    engine_start: dict[str, Any]  # in-process engine counters at run start, and the process (stats.engine: the delta)
    answer: str | None
    answer_source: str  # "aggregator" | "majority_fallback" | baseline name | "none"
    stats: Annotated[dict[str, Any], merge_stats]
