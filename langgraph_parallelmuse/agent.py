"""The checkpointed think ⇄ act rollout subgraph, and the runner that starts and forks it.

Every ``think`` and ``act`` node is a checkpoint, one thread per trajectory. The snapshots whose
next node is ``think`` are the fork points of partial rollout: a branch is a new thread seeded
with such a snapshot's values, so it shares the parent's prefix byte for byte (the prompt is a
pure function of the recorded steps) and never re-runs the prefix's tool calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config

# Kept by LangGraph for langgraph-api: the config key through which a graph lends its saver to subgraphs.
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.errors import GraphInterrupt
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.config import DriverName, ParallelMuseConfig
from langgraph_parallelmuse.control_tokens import defuse_control_tokens
from langgraph_parallelmuse.driver import FreeDriver, GuidedDriver, StepContext, StepDriver, call_key, pick_driver
from langgraph_parallelmuse.errors import ConfigError, ParallelMuseError, ends_the_run, is_context_overflow
from langgraph_parallelmuse.infograph import merge_context
from langgraph_parallelmuse.lineage import Job, Pick, branch_job, first_own_step
from langgraph_parallelmuse.persistence import async_saver, in_threads, unwrapped
from langgraph_parallelmuse.protocol import (
    SYSTEM_PROMPT,
    action_start,
    build_messages,
    content_text,
    describe_tools,
    one_line,
    parse_action,
    region_spans,
)
from langgraph_parallelmuse.redact import redact, secrets_of
from langgraph_parallelmuse.retry import with_retries
from langgraph_parallelmuse.segments import Sampling, TurnResult, derive_seed, generate_turn
from langgraph_parallelmuse.state import Action, AgentState, Observation, Origin, Step, Trajectory, count_tool_calls
from langgraph_parallelmuse.uncertainty import (
    CONFIDENCE_WINDOW,
    lowest_group_confidence,
    require_logprobs,
    score_steps,
)

_DEFAULT_CONFIG = ParallelMuseConfig()


def close_open_tag(text: str) -> str:
    """Re-append the closing tag a stop string swallowed (``</tool_call>`` / ``</answer>``).

    The tag closed is the action's, as :func:`~.protocol.parse_action` reads it: the first one
    opened after the reasoning. A tag the reasoning mentions, or one the action itself mentions
    (an answer about ``<tool_call>`` tags), must not be the one closed.

    Example:
        >>> close_open_tag("<think>no <tool_call> needed</think><answer>Paris")
        '<think>no <tool_call> needed</think><answer>Paris</answer>'
        >>> close_open_tag("<think>x</think><answer>wrap it in <tool_call> tags")
        '<think>x</think><answer>wrap it in <tool_call> tags</answer>'
    """
    action = text[action_start(text) :]
    opened = [(at, tag) for tag in ("tool_call", "answer") if (at := action.find(f"<{tag}>")) >= 0]
    if not opened:
        return text
    at, tag = min(opened)
    return text if action.find(f"</{tag}>", at) >= 0 else text + f"</{tag}>"


def _context_exhausted(steps: Sequence[Step], observations: Sequence[Observation], cfg: ParallelMuseConfig) -> bool:
    if not steps:
        return False
    last = steps[-1]
    obs_chars = sum(len(o["content"]) for o in observations if o["step"] == last["index"])
    # Only the kept turn enters the conversation: generated_tokens also counts the resamples the driver
    # rejected, which forced an answer with room to spare. Without logprobs only that sum is known.
    turn_tokens = len(last["tokens"]) or last["generated_tokens"]
    # ~3 chars a token is a conservative estimate for English tool output.
    estimate = last["context_tokens"] + turn_tokens + obs_chars // 3 + 32
    return estimate + cfg.max_step_tokens > cfg.max_context_tokens


def _ended_by(exc: BaseException, index: int, model: BaseChatModel, *, trimmed: bool) -> dict[str, Any] | None:
    """The update that ends a trajectory whose step ``index`` raised ``exc`` (a failed call, to retry
    on resume), or ``None`` for a first context overflow, which is retried with old tool output trimmed.

    An overflow even after the trim ends it as exhausted: a resume would meet the same wall.
    """
    if not is_context_overflow(exc):
        # A connection error of the openai client names no server ("Connection error."): say which.
        server = f" ({base})" if (base := getattr(model, "openai_api_base", None)) else ""
        error = f"model call failed at step {index}{server}: {_refused_key(exc, model)}{type(exc).__name__}: {exc}"
        return {"status": "failed", "error": redact(error, secrets_of(model))}
    if not trimmed:
        return None
    error = f"the context is exhausted at step {index}: {type(exc).__name__}: {exc}"
    return {"status": "context_exhausted", "answer": None, "error": redact(error, secrets_of(model))}


def _refused_key(exc: BaseException, model: BaseChatModel) -> str:
    """The advice a failed call's error opens with when the server refused the API key (HTTP 401 or
    403), else ``""``: the run's advice to check the server, URL and model sent a user with a wrong key
    everywhere but to the key. First, as the run's summary cuts each error at 300 characters.

    Example:
        >>> class Refused(Exception):
        ...     status_code = 401
        >>> _refused_key(Refused(), object())
        "the server refused the model's API key (HTTP 401): give it a key this server accepts; "
    """
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    if status not in (401, 403):
        return ""
    # ChatOpenAI (ServerChatModel too) reads OPENAI_API_KEY when no api_key= is given.
    where = "set OPENAI_API_KEY (or pass api_key=) to" if hasattr(model, "openai_api_key") else "give it"
    if status == 401:
        return f"the server refused the model's API key (HTTP 401): {where} a key this server accepts; "
    # A 403 comes with a key the server knows: a project without access to the model, a region it does
    # not serve, a proxy's policy. Called a refused key, it sent the user to a key that was right.
    return "the server forbade the call (HTTP 403): check that the API key may use this model from here; "


@dataclass
class _Spent:
    """What a step's model calls cost, rejected attempts included (they are real work)."""

    generated: int = 0
    prompt: int = 0
    cached: int = 0
    calls: int = 0
    conversation_calls: int = 0
    conversation_prompt: int = 0
    conversation_cached: int = 0
    cache_reported: bool = False

    def add(self, turn: TurnResult) -> None:
        self.generated += turn.generated_tokens
        self.prompt += turn.prompt_tokens
        self.cached += turn.cached_prompt_tokens
        self.calls += turn.calls
        self.conversation_calls += turn.conversation_calls
        self.conversation_prompt += turn.conversation_prompt_tokens
        self.conversation_cached += turn.conversation_cached_tokens
        self.cache_reported = self.cache_reported or turn.cache_reported


async def _sample_step(
    model: BaseChatModel,
    driver: StepDriver,
    ctx: StepContext,
    messages: Sequence[BaseMessage],
    *,
    sampling: Sampling,
    seed: Callable[[int], int],
    spent: _Spent,
) -> tuple[str, Action, TurnResult, str | None]:
    """Generate one turn, resampling (up to ``driver.retries`` times) what the driver rejects.

    Returns:
        The kept turn's text, action and result, and why the driver still rejects it (``None``:
        accepted): when the resamples run out, the last one is kept, so the trajectory goes on.
    """
    # At temperature 0 every call is greedy: a resample would be the same turn again, paid for twice.
    attempts = driver.retries + 1 if sampling.temperature > 0 else 1
    for attempt in range(attempts):
        turn = await generate_turn(model, messages, driver.plan(ctx), sampling=sampling, seed=seed(attempt))
        truncated = turn.finish_reason == "length"
        text = turn.text if truncated else close_open_tag(turn.text)
        action = parse_action(text, truncated=truncated)
        spent.add(turn)
        if (rejected := driver.reject(ctx, text, action)) is None:
            break
    return text, action, turn, rejected


def _low_confidence(own: Sequence[Step], cfg: ParallelMuseConfig) -> str | None:
    """Why a trajectory stops early (DeepConf): its lowest group confidence fell below the floor."""
    calibration = Calibration.load(cfg.calibration)
    tokens = [tok for s in own for tok in s["tokens"]]
    if len(tokens) < calibration.confidence_window:
        # A shorter prefix's mean is no window of the statistic the floor was fitted on (the finished
        # trajectories' full windows): a few unsure first tokens would stop what calibration keeps.
        return None
    lowest = lowest_group_confidence(tokens, window=calibration.confidence_window)
    if lowest is None or calibration.confidence_floor is None or lowest >= calibration.confidence_floor:
        return None
    return (
        f"stopped early: lowest group confidence {lowest:.3f} < floor {calibration.confidence_floor:.3f} "
        f"(window {calibration.confidence_window} tokens)"
    )


def _outcome(step: Step, *, final: bool, exhausted: bool) -> dict[str, Any]:
    """The state update of a finished think step."""
    update: dict[str, Any] = {"steps": [step]}
    action = step["action"]
    if action["type"] == "answer":
        update.update(status="answered", answer=action["answer"])
    elif final:
        update.update(status="context_exhausted" if exhausted else "max_turns", answer=None)
        if action["type"] == "invalid":  # the last turn's reply was no answer: say why, not only "max_turns"
            update["error"] = f"the last turn gave no answer: {action.get('error', 'unreadable reply')}"
        elif exhausted:  # a valid tool call: without this, "context_exhausted" came with no error at all
            update["error"] = "the last turn, its context full, made a tool call instead of answering"
    else:
        update["status"] = "running"
    return update


def _first_regenerated(origin: Origin, index: int) -> bool:
    """Whether step ``index`` is a branch's first regenerated step (its fork point)."""
    return origin.get("kind") == "branch" and origin.get("step") == index


TakenCalls = Callable[[Origin, str, int], Awaitable[frozenset[str]]]
# A branch's thread (lineage.branch_job): its siblings' differ in the number after ".b".
_SIBLING = re.compile(r"^(.*\.s\d+\.b)\d+$")


@dataclass(frozen=True)
class _StepNodes:
    """The think and act nodes of the rollout graph and what they read."""

    model: BaseChatModel
    by_name: dict[str, BaseTool]
    driver_for: Callable[[DriverName], StepDriver]
    system: str
    taken_calls: TakenCalls | None

    async def _avoid(self, origin: Origin, index: int, cfg: ParallelMuseConfig) -> frozenset[str]:
        """With ``diverse_branches``, the tool calls a branch's first regenerated step must not repeat."""
        if not (cfg.diverse_branches and self.taken_calls is not None and _first_regenerated(origin, index)):
            return frozenset()
        return await self.taken_calls(origin, get_config()["configurable"]["thread_id"], cfg.t)

    async def think(self, state: AgentState, runtime: Runtime[ParallelMuseConfig]) -> dict[str, Any]:
        """Generate step ``len(steps)``: a thought, then a tool call or the answer."""
        cfg = runtime.context or _DEFAULT_CONFIG
        driver, steps, observations = self.driver_for(cfg.driver), state.get("steps", []), state.get("observations", [])
        index = len(steps)
        origin = state.get("origin") or {}
        avoid = await self._avoid(origin, index, cfg)
        exhausted = _context_exhausted(steps, observations, cfg)
        sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p, top_logprobs=cfg.top_logprobs)
        spent, started, trim = _Spent(), time.perf_counter(), None
        while True:
            ctx = StepContext(
                state["question"],
                steps,
                observations,
                index,
                # A crossover answers from its merged context at once: it reads nothing its parents did not.
                final=exhausted or index >= cfg.max_turns - 1 or origin.get("kind") == "crossover",
                max_step_tokens=cfg.max_step_tokens,
                tool_names=frozenset(self.by_name),
                avoid=avoid,
                scoring=bool(getattr(self.model, "supports_scoring", False)),
            )
            messages = build_messages(
                state["question"],
                steps,
                observations,
                system=self.system,
                final_turn=ctx.final and isinstance(driver, FreeDriver),
                max_observation_chars=trim,
            )
            try:
                text, action, turn, rejected = await _sample_step(
                    self.model,
                    driver,
                    ctx,
                    messages,
                    sampling=sampling,
                    seed=lambda attempt: derive_seed(cfg.seed, state.get("trajectory_id"), index, attempt),
                    spent=spent,
                )
                if (reader := _logprobs_reader(cfg)) is not None:  # fail on the first call, not after a wave
                    require_logprobs("".join(turn.segments.values()), turn.tokens, **reader)
                break
            except Exception as exc:  # noqa: BLE001 - a dead model ends this trajectory, not the run
                if ends_the_run(exc):
                    raise
                if (ended := _ended_by(exc, index, self.model, trimmed=trim is not None)) is not None:
                    return ended
                # Blind retries cannot fit the window: shrink old tool output and answer now.
                exhausted, trim = True, 200
        step = Step(
            index=index,
            text=text,
            tokens=turn.tokens,
            regions=region_spans(text),
            action=action,
            prompt_tokens=spent.prompt,
            context_tokens=turn.context_tokens,
            generated_tokens=spent.generated,
            cached_prompt_tokens=spent.cached,
            calls=spent.calls,
            conversation_calls=spent.conversation_calls,
            conversation_prompt_tokens=spent.conversation_prompt,
            conversation_cached_tokens=spent.conversation_cached,
            cache_reported=spent.cache_reported,
            finish_reason=turn.finish_reason,
            seconds=time.perf_counter() - started,
        )
        if "bridge" in turn.segments:
            step["bridge"] = turn.segments["bridge"]
        if rejected is not None:
            step["rejected"] = rejected
        update = _outcome(step, final=ctx.final, exhausted=exhausted)
        if cfg.early_stop and update["status"] == "running":
            own = [*steps[origin.get("step") or 0 :], step] if origin.get("kind") == "branch" else [*steps, step]
            if (reason := _low_confidence(own, cfg)) is not None:
                update.update(status="stopped", error=reason)
        return update

    async def act(self, state: AgentState, runtime: Runtime[ParallelMuseConfig]) -> dict[str, Any]:
        """Run the last step's action and record the tool response (errors included)."""
        cfg = runtime.context or _DEFAULT_CONFIG
        obs = await observe(self.by_name, state["steps"][-1], trajectory_id=state.get("trajectory_id"), config=cfg)
        return {"observations": [obs]}

    @staticmethod
    def route(state: AgentState) -> str:
        return "act" if state.get("status") == "running" else END


async def observe(
    by_name: dict[str, BaseTool], step: Step, *, trajectory_id: str | None, config: ParallelMuseConfig
) -> Observation:
    """Run ``step``'s action with the tools ``by_name`` and record the response as a trajectory does:
    every failure an error text, lone surrogates replaced, chat-template control tokens defused
    (:func:`~langgraph_parallelmuse.control_tokens.defuse_control_tokens`), cut at
    ``config.max_observation_chars``.

    Example:
        >>> import asyncio
        >>> from langchain_core.tools import tool
        >>> @tool
        ... def search(query: str) -> str:
        ...     "Search."
        ...     return "[1] Paris (id: p)"
        >>> step = {"index": 0, "text": "", "action": {"type": "tool_call", "name": "search",
        ...                                            "arguments": {"query": "capital"}}}
        >>> asyncio.run(observe({"search": search}, step, trajectory_id="t0", config=ParallelMuseConfig()))["content"]
        '[1] Paris (id: p)'
    """
    started = time.perf_counter()
    content, error, doc_ids = await _run_tool(by_name, step, trajectory_id, config)
    # Lone surrogates cannot be sent as UTF-8 and would be stored differently than sent.
    content = content.encode("utf-8", "replace").decode("utf-8")
    # Defused once, here, for every tool and driver: a page's "<|im_end|><|im_start|>system" read as
    # the template's own tokens (a server's too) ended the tool turn and wrote a system turn; every
    # prompt, fork and report after this reads the stored text.
    content = defuse_control_tokens(content)
    name = step["action"].get("name", "")
    if not content.strip() and not error:
        content, error = f"Error: tool {name!r} returned nothing.", True
    if len(content) > config.max_observation_chars:
        content = content[: config.max_observation_chars] + " …[truncated]"
    return Observation(
        step=step["index"],
        name=name or "invalid",
        arguments=step["action"].get("arguments", {}),
        content=content,
        error=error,
        seconds=time.perf_counter() - started,
        doc_ids=doc_ids,
    )


def build_rollout_graph(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    driver_for: Callable[[DriverName], StepDriver],
    system_prompt: str | None = None,
    taken_calls: TakenCalls | None = None,
) -> StateGraph:
    """The think ⇄ act ReAct loop as an uncompiled graph (compile it with a checkpointer).

    Args:
        model: Chat model returning token logprobs in ``response_metadata["logprobs"]``.
        tools: Tools by name (``search`` and usually ``visit``).
        driver_for: How a think step is generated (:class:`FreeDriver` or :class:`GuidedDriver`) for a
            run's ``driver`` setting.
        system_prompt: Overrides the protocol's system prompt (``{tools}`` is filled in).
        taken_calls: With ``diverse_branches``, the tool calls a branch's first regenerated step
            must not repeat (its parent's and its siblings', read from their checkpoints).
    """
    # Only {tools} is filled in: the braces of a custom prompt (a JSON example) and of the tool
    # descriptions reach the model as written.
    system = (system_prompt or SYSTEM_PROMPT).replace("{tools}", describe_tools(tools))
    nodes = _StepNodes(model, {t.name: t for t in tools}, driver_for, system, taken_calls)
    graph = StateGraph(AgentState, context_schema=ParallelMuseConfig)
    graph.add_node("think", nodes.think)
    graph.add_node("act", nodes.act)
    graph.add_edge(START, "think")
    graph.add_conditional_edges("think", nodes.route, ["act", END])
    graph.add_edge("act", "think")
    return graph


async def _run_tool(
    by_name: dict[str, BaseTool], step: Step, trajectory_id: str | None, cfg: ParallelMuseConfig
) -> tuple[str, bool, list[str]]:
    """Execute a step's action: ``(content, is_error, doc_ids)``; every failure becomes an error text.

    A tool reports a failure by raising, by an error ``ToolMessage``, or, returning content and an
    artifact, by ``"error": True`` in the artifact (the web tools, whose failures are also texts the
    agent reads).

    Raises:
        ConfigError: The tool called LangGraph's ``interrupt()``, which no trajectory can resume from.
    """
    action = step["action"]
    name, args = action.get("name", ""), action.get("arguments", {})
    if action["type"] != "tool_call":
        # No tags in the hint: it travels inside a tool response, where tags are neutralised.
        hint = (
            f"Error: {action.get('error', 'unreadable reply')}. Reply with your thinking in a think "
            "block, then exactly one tool call (JSON with name and arguments) or an answer block."
        )
        return hint, True, []
    if name not in by_name:
        return f"Error: unknown tool {name!r}; available tools: {', '.join(sorted(by_name))}.", True, []
    call = {"type": "tool_call", "name": name, "args": args, "id": f"{trajectory_id}-{step['index']}"}
    deadline = asyncio.timeout(cfg.tool_timeout)  # the whole call, retries of transient failures included
    try:
        async with deadline:
            result = await with_retries(lambda: by_name[name].ainvoke(call))
    except GraphInterrupt:
        # Read as a tool error, the human was never asked. Passed on, it would pause the trajectory's
        # own graph, which the run cannot resume (LangGraph's ToolNode passes it on to its graph).
        raise ConfigError(
            f"tool {name!r} called interrupt(), which a trajectory's tool cannot: the trajectories run in their "
            "own graphs, which the run cannot resume. Pause the run itself instead, e.g. "
            "create_parallelmuse(..., checkpointer=saver, interrupt_before=['aggregate']), or ask before or "
            "after this graph in a node of your app"
        ) from None
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the agent sees the failure and goes on
        # A CancelledError the tool raised itself (a client cancelled inside it) is the tool's failure;
        # it crashed the whole run. This task's own cancellation (cancelling()) still ends the run.
        if isinstance(exc, asyncio.CancelledError) and asyncio.current_task().cancelling():
            raise
        if isinstance(exc, TimeoutError) and deadline.expired():
            return f"Error: tool {name!r} timed out after {cfg.tool_timeout:g} s.", True, []
        # Any other error, the tool's own timeout included (its message names the socket or API).
        return redact(f"Error: tool {name!r} failed: {type(exc).__name__}: {exc}"), True, []
    artifact = getattr(result, "artifact", None)
    # A tool of the user's own may put anything there: only a collection of ids counts (not a string).
    listed = artifact.get("doc_ids") if isinstance(artifact, dict) else None
    collection = isinstance(listed, Iterable) and not isinstance(listed, str | bytes | dict)
    doc_ids = [str(d) for d in listed] if collection else []
    error = (isinstance(result, ToolMessage) and result.status == "error") or (
        isinstance(artifact, dict) and artifact.get("error") is True
    )
    content = result.content if isinstance(result, ToolMessage) else result
    # A tool function that returns None comes back from LangChain as the JSON text "null".
    if content is None or (isinstance(result, ToolMessage) and content == "null"):
        return f"Error: tool {name!r} returned nothing (None).", True, doc_ids
    # A tool's several results (content blocks) go one a line, not run together.
    return content_text(content, sep="\n"), error, doc_ids


# What LangGraph itself keeps in a run's configurable: the checkpoint coordinates, and its
# internals ("__pregel_*"), which belong to the caller's own run.
_RUN_KEYS = frozenset({"thread_id", "checkpoint_id", "checkpoint_ns", "checkpoint_map"})


def _callers_keys() -> dict[str, Any]:
    """The caller's own ``configurable`` keys, for the trajectory threads' runs.

    LangGraph drops the caller's whole ``configurable`` from a run given a ``thread_id`` of its own,
    so a tool reading ``config["configurable"]["user_id"]`` and a configurable model
    (``configurable_fields``, ``init_chat_model(configurable_fields=...)``) saw none of them in a
    trajectory, while the reports and the aggregator, in the caller's run, did. Empty outside a run.

    Example:
        >>> _callers_keys()
        {}
    """
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # called outside a run (RolloutRunner used on its own)
        return {}
    return {k: v for k, v in configurable.items() if k not in _RUN_KEYS and not k.startswith("__")}


# The saver of the run a rollout serves (the ParallelMuse graph's own, which LangGraph Server
# supplies at run time), lent to that graph's runner for the run: a runner given no checkpointer
# keeps its trajectories there, so they persist where the run's checkpoints do (a server's
# PostgreSQL) instead of in a process's memory, which a restart empties.
_LENT: contextvars.ContextVar[tuple[RolloutRunner, BaseCheckpointSaver] | None] = contextvars.ContextVar(
    "parallelmuse_trajectory_saver", default=None
)


# Savers known to take any thread id. LangGraph Platform's threads are UUIDs its API created, and
# whether its own saver takes another ("<thread>:<run>/t0") is not known: it is not lent, nor any
# other saver not known to: the runner's in-memory saver serves, as before.
_LENDABLE = frozenset(
    {
        ("langgraph.checkpoint.memory", "InMemorySaver"),
        ("langgraph.checkpoint.sqlite.aio", "AsyncSqliteSaver"),
        ("langgraph.checkpoint.postgres.aio", "AsyncPostgresSaver"),
    }
)


def lendable(saver: BaseCheckpointSaver | None) -> bool:
    """Whether trajectory threads may live in ``saver``: one of LangGraph's memory, SQLite and Postgres
    savers (or a subclass, as ``langgraph dev``'s; the sync SQLite one through :func:`async_saver`), or
    langgraph-api's adapter around one; and, if it is bound to an event loop (the async SQLite and
    Postgres savers), bound to the running one (the sync API runs the graph on a loop of its own).

    Example:
        >>> lendable(InMemorySaver()), lendable(None)
        (True, False)
    """
    if not isinstance(saver, BaseCheckpointSaver):  # None, or a graph's checkpointer=True/False
        return False
    if in_threads(saver):
        return True
    saver = unwrapped(saver)  # what counts is the saver inside langgraph-api's adapter
    if not any((c.__module__, c.__qualname__) in _LENDABLE for c in type(saver).__mro__):
        return False
    loop = getattr(saver, "loop", None)
    try:
        return loop is None or loop is asyncio.get_running_loop()
    except RuntimeError:  # no running loop: a sync caller, which uses the saver's own
        return True


@contextmanager
def lend_checkpointer(runner: RolloutRunner, saver: BaseCheckpointSaver | None) -> Iterator[None]:
    """Inside this block, ``runner`` (if built without a checkpointer) keeps its trajectory threads in ``saver``.

    The ParallelMuse graph lends its run's saver to its own runner around every rollout; a saver that
    is not :func:`lendable`, or ``None`` (a run without a checkpointer), leaves the runner's own.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> runner, saver = RolloutRunner(FakeListChatModel(responses=[]), []), InMemorySaver()
        >>> with lend_checkpointer(runner, saver):
        ...     runner.saver is saver
        True
        >>> runner.saver is saver
        False
    """
    token = _LENT.set((runner, async_saver(saver)) if lendable(saver) else None)
    try:
        yield
    finally:
        _LENT.reset(token)


def _logprobs_reader(cfg: ParallelMuseConfig) -> dict[str, str] | None:
    """What reads a step's logprobs, as :func:`require_logprobs` names it, or ``None`` when nothing does.

    Branching ranks steps by them; early stop on plain sampling (mode 'none') reads their confidence,
    and without them would silently never stop anything.
    """
    if cfg.mode != "none":
        return {}
    if cfg.early_stop:
        return {"reader": "early_stop reads (DeepConf's token confidence)", "way_out": "early_stop=False"}
    return None


class RolloutRunner:
    """Runs trajectories of the rollout subgraph in their own threads, and forks them.

    Args:
        model: The agent model.
        tools: Agent tools (``search``, ``visit``).
        driver: Step driver of runs whose ``driver`` setting is ``auto``; default picks guided for a
            model that continues a prefilled turn (the in-process model), free otherwise. A run whose
            settings say ``free`` or ``guided`` gets that driver (:meth:`driver_for`).
        checkpointer: Where trajectory snapshots live (default: the saver a run lends, else in memory).
        system_prompt: Optional system prompt override.
        guided_driver: The guided driver's settings, for runs whose ``driver`` setting picks it.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> import asyncio
        >>> runner = RolloutRunner(FakeListChatModel(responses=["<think>easy</think><answer>4</answer>"]), [])
        >>> no_branching = ParallelMuseConfig(mode="none")  # a fake model has no logprobs to score
        >>> traj = asyncio.run(runner.run("2+2?", trajectory_id="t0", thread_id="demo:t0", config=no_branching))
        >>> traj["answer"], traj["status"]
        ('4', 'answered')
    """

    def __init__(
        self,
        model: BaseChatModel,
        tools: Sequence[BaseTool],
        *,
        driver: StepDriver | DriverName = "auto",
        checkpointer: BaseCheckpointSaver | None = None,
        system_prompt: str | None = None,
        guided_driver: GuidedDriver | None = None,
    ) -> None:
        self.model = model
        self.tools = list(tools)
        self.system_prompt = system_prompt
        self._guided = guided_driver
        self.driver = pick_driver(model, driver, guided_driver) if isinstance(driver, str) else driver
        own = "guided" if isinstance(self.driver, GuidedDriver) else "free"
        self._drivers: dict[str, StepDriver] = {"auto": self.driver, own: self.driver}
        checkpointer = None if checkpointer is None else async_saver(checkpointer)
        if checkpointer is not None and type(checkpointer).aget_tuple is BaseCheckpointSaver.aget_tuple:
            # The rollout subgraph runs async; a sync-only saver fails only at its first checkpoint.
            raise ConfigError(
                f"trajectory checkpointer {type(checkpointer).__name__} has no async methods: pass its async "
                "counterpart (AsyncSqliteSaver, AsyncPostgresSaver; open_checkpointer(url) opens one), or InMemorySaver"
            )
        self._own_checkpointer = checkpointer is not None
        #: Whether a run may lend this runner its saver (False for a graph compiled with checkpointer=False).
        self.borrows = True
        self.checkpointer = checkpointer or InMemorySaver()
        self.graph: CompiledStateGraph = build_rollout_graph(
            model, self.tools, driver_for=self.driver_for, system_prompt=system_prompt, taken_calls=self.taken_calls
        ).compile(checkpointer=self.checkpointer, name="rollout")

    def driver_for(self, setting: DriverName) -> StepDriver:
        """The step driver of a run whose settings say ``setting`` (``auto``: the runner's own).

        Raises:
            ConfigError: ``guided`` for a model that cannot continue a prefilled turn.

        Example:
            >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
            >>> type(RolloutRunner(FakeListChatModel(responses=[]), []).driver_for("free")).__name__
            'FreeDriver'
        """
        if setting not in self._drivers:
            self._drivers[setting] = pick_driver(self.model, setting, self._guided)
        return self._drivers[setting]

    @property
    def keeps_trajectories(self) -> bool:
        """Whether the runner was given a checkpointer of its own (``trajectory_checkpointer``)."""
        return self._own_checkpointer

    @property
    def saver(self) -> BaseCheckpointSaver:
        """Where trajectory threads live now: the runner's own checkpointer if it was given one, else
        the saver a run lends (:func:`lend_checkpointer`), else the runner's in-memory saver."""
        lent = _LENT.get()
        if lent is not None and lent[0] is self and self.borrows and not self._own_checkpointer:
            return lent[1]
        return self.checkpointer

    def forget(self, run_id: str) -> list[str]:
        """Delete the trajectory threads of run ``run_id`` (``<run_id>/...``) from the runner's in-memory
        saver, and return them; a runner given a checkpointer keeps what it holds (empty list).

        For a run nothing can resume (no checkpointer of its own or lent): kept, each such run's threads
        stayed in memory for the life of the process, a service's memory growing with every question.

        Example:
            >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
            >>> import asyncio
            >>> runner = RolloutRunner(FakeListChatModel(responses=["<think>x</think><answer>4</answer>"]), [])
            >>> plain = ParallelMuseConfig(mode="none")
            >>> _ = asyncio.run(runner.run("2+2?", trajectory_id="t0", thread_id="r1/t0", config=plain))
            >>> runner.forget("r1"), dict(runner.checkpointer.storage)
            (['r1/t0'], {})
        """
        if self._own_checkpointer:
            return []
        saver, prefix = self.checkpointer, f"{run_id}/"
        # A copy of the keys: the sync API's loop may add another run's threads meanwhile.
        threads = [thread for thread in list(saver.storage) if thread.startswith(prefix)]
        for thread in threads:
            saver.delete_thread(thread)
        return threads

    def _thread(self, thread_id: str, metadata: dict | None = None, checkpoint_id: str | None = None) -> dict:
        # Fresh checkpoint coordinates (not the caller's) keep this graph out of the parent run's
        # checkpoint namespace: re-running a subgraph *node* from a checkpoint restarts it (langgraph#8458).
        configurable: dict[str, Any] = {
            **_callers_keys(),
            "thread_id": thread_id,
            CONFIG_KEY_CHECKPOINTER: self.saver,
        }
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable, "metadata": metadata or {}, "run_name": "parallelmuse.rollout"}

    async def existing(self, thread_id: str, config: ParallelMuseConfig | None = None) -> Trajectory | None:
        """The finished trajectory of a thread, if it already ran (resume support).

        A failed trajectory (its model could not be called) is not finished: running its job again
        continues it from its last finished step.
        """
        snap = await self.graph.aget_state(self._thread(thread_id))
        if snap.values and not snap.next and snap.values.get("status") not in (None, "running", "failed"):
            return await self._trajectory(thread_id, snap.values, 0.0, config)
        return None

    async def origin_of(self, thread_id: str) -> Origin | None:
        """The origin a thread was started with, or ``None`` while it holds nothing."""
        snap = await self.graph.aget_state(self._thread(thread_id))
        return snap.values.get("origin") if snap.values else None

    async def run_job(
        self,
        job: Job,
        *,
        question: str | None = None,
        config: ParallelMuseConfig | None = None,
        on_step: Callable[[Trajectory], Awaitable[None]] | None = None,
    ) -> Trajectory:
        """Run one job of the schedule in its thread (or return it if that thread already finished;
        a thread that failed continues from its last finished step).

        A from-scratch job needs the ``question``; a branch continues a new thread from the checkpoint its
        origin names (the shared prefix keeps its steps and tool responses; nothing of it is re-run).
        ``on_step`` is awaited with the trajectory so far after each think step (online branching).
        """
        thread_id, origin = job["thread_id"], job["origin"]
        if (done := await self.existing(thread_id, config)) is not None:
            return done
        started = time.perf_counter()
        branch, crossed = origin.get("kind") == "branch", origin.get("kind") == "crossover"
        metadata = {"trajectory_id": job["id"], "origin_kind": origin.get("kind")}
        if branch:
            metadata.update(
                parent_thread=origin["parent_thread"],
                fork_checkpoint_id=origin["checkpoint_id"],
                fork_step=origin["step"],
            )
        if crossed:
            metadata.update(parent_threads=origin["parent_threads"])
        tc = self._thread(thread_id, metadata)
        current = await self.graph.aget_state(tc)
        payload: dict[str, Any] | None = None
        if current.values and not current.next and current.values.get("status") == "failed":
            # The failed call wrote no step: reopening the thread before it retries that call and
            # keeps every step finished before the failure (a server that was down, now up).
            await self.graph.aupdate_state(tc, {"status": "running", "error": None}, as_node="act")
        elif not current.values:
            # A thread with values resumes from its last checkpoint (payload None), even when it shows no
            # next task: a run killed after a task's writes were saved but before the checkpoint after
            # it shows none, and seeding it again lost that tool response (or doubled a branch's prefix).
            if branch:
                seed = await self._fork_values(origin)
            elif crossed:
                seed = await self._crossover_values(origin, question)
            else:
                seed = {"question": self._question(question, job)}
            fresh = {"trajectory_id": job["id"], "origin": origin, "status": "running", "answer": None}
            if branch or crossed:
                await self.graph.aupdate_state(tc, {**seed, **fresh}, as_node="act")
            else:
                payload = {**seed, **fresh}
        context = config or _DEFAULT_CONFIG
        # A step is two supersteps (think, act). Inside a parent run this graph inherits the parent's
        # recursion limit: a caller's, or LangChain's default 25 a LangChain runnable around the graph
        # fills in, ended every trajectory past 12 turns with GraphRecursionError; max_turns is the
        # bound. Set here, it wins: LangGraph's config merge skips only its own default, by its type.
        tc["recursion_limit"] = 2 * context.max_turns + 6
        known: list[str | None] = []
        if on_step is None:
            await self.graph.ainvoke(payload, tc, context=context)
        else:
            # Sync durability: the step's checkpoint is saved before its update is emitted, so the
            # snapshot (and a fork from it) holds the step that just finished, not the one before.
            updates = self.graph.astream(payload, tc, context=context, stream_mode="updates", durability="sync")
            async for update in updates:
                if "think" in update:
                    step = await self.snapshot(thread_id, config, known=known)
                    known = step["fork_points"]
                    await on_step(step)
        final = await self.graph.aget_state(tc)
        return await self._trajectory(thread_id, final.values, time.perf_counter() - started, config, known=known)

    async def snapshot(
        self, thread_id: str, config: ParallelMuseConfig | None = None, *, known: Sequence[str | None] = ()
    ) -> Trajectory:
        """A thread's trajectory as its last checkpoint holds it (a running or cancelled one included).

        ``known``: fork points of an earlier snapshot of the thread, so only the checkpoints after
        them are read (see :meth:`_fork_points`).
        """
        snap = await self.graph.aget_state(self._thread(thread_id))
        return await self._trajectory(thread_id, snap.values, 0.0, config, known=known)

    @staticmethod
    def _question(question: str | None, job: Job) -> str:
        if question is None:
            raise ParallelMuseError(f"job {job['id']!r} runs from scratch: pass its question")
        return question

    async def run(
        self,
        question: str,
        *,
        trajectory_id: str,
        thread_id: str,
        config: ParallelMuseConfig | None = None,
        origin: Origin | None = None,
    ) -> Trajectory:
        """Run one trajectory from scratch (or return it if its thread already finished)."""
        origin = origin or Origin(kind="initial", parent=None, round=0)
        return await self.run_job(
            Job(id=trajectory_id, thread_id=thread_id, origin=origin), question=question, config=config
        )

    async def fork(
        self,
        parent: Trajectory,
        step: int,
        *,
        run_id: str,
        sibling: int = 0,
        config: ParallelMuseConfig | None = None,
        region: str | None = None,
        score: float | None = None,
    ) -> Trajectory:
        """Branch ``sibling`` of ``parent`` at step ``step``, in thread ``{run_id}/{parent}.s{step}.b{sibling}``.

        The branch keeps steps ``< step`` and their tool responses (not re-fetched) and
        regenerates step ``step`` and everything after it.
        """
        pick = Pick(parent=parent["id"], step=step, region=region, score=score, round=1)
        return await self.run_job(branch_job(parent, pick, sibling, run_id=run_id), config=config)

    async def fork_point(self, parent_thread: str, step: int):
        """The snapshot just before step ``step``'s think node in ``parent_thread``."""
        async for snap in self.graph.aget_state_history(self._thread(parent_thread)):
            if snap.next == ("think",) and len(snap.values.get("steps", [])) == step:
                return snap
        raise ParallelMuseError(f"no checkpoint before step {step} in thread {parent_thread!r}")

    async def _fork_values(self, origin: Origin) -> dict[str, Any]:
        """The values of the checkpoint a branch starts from, checked to be that fork point."""
        snap = await self.graph.aget_state(self._thread(origin["parent_thread"], checkpoint_id=origin["checkpoint_id"]))
        if not snap.values:
            raise ParallelMuseError(
                f"checkpoint {origin['checkpoint_id']!r} of thread {origin['parent_thread']!r}, where a branch starts, "
                "is not in the trajectory checkpointer: an in-memory saver lost it (a restarted process?). Keep "
                "trajectories in a database: trajectory_checkpointer=, or a checkpointer on the graph."
            )
        if snap.next != ("think",) or len(snap.values.get("steps", [])) != origin["step"]:
            raise ParallelMuseError(
                f"checkpoint {origin['checkpoint_id']!r} of thread {origin['parent_thread']!r} is not the fork point "
                f"before step {origin['step']}"
            )
        return dict(snap.values)

    async def _crossover_values(self, origin: Origin, question: str | None) -> dict[str, Any]:
        """The merged context a crossover starts from, read off its parents' finished threads."""
        parents = []
        for thread, chosen in zip(origin["parent_threads"], origin["parent_steps"], strict=True):
            values = (await self.graph.aget_state(self._thread(thread))).values
            parents.append((values.get("steps", []), values.get("observations", []), chosen))
            question = question or values.get("question")
        steps, observations = merge_context(parents)
        if len(steps) != origin["step"]:
            raise ParallelMuseError(
                f"crossover of threads {origin['parent_threads']!r}: the parents' records give {len(steps)} merged "
                f"steps, the job expects {origin['step']}"
            )
        return {"question": question, "steps": steps, "observations": observations}

    async def taken_calls(self, origin: Origin, thread_id: str, siblings: int) -> frozenset[str]:
        """Tool calls already taken at a branch's fork point: its parent's and every sibling's that got
        that far, read from their checkpoints. The siblings are the ``siblings`` (T) branches of the
        same pick, in the threads the schedule names like the branch's own ``thread_id``
        (``<run>/<parent>.s<step>.b<i>``): read by name, not found by a search of the saver's
        metadata, which a database answers by reading every thread it holds."""
        step = origin["step"]
        threads = [origin["parent_thread"], thread_id]
        if (named := _SIBLING.match(thread_id)) is not None:
            threads += [f"{named[1]}{i}" for i in range(siblings)]
        keys: set[str] = set()
        for thread in dict.fromkeys(threads):
            snap = await self.graph.aget_state(self._thread(thread))
            steps = snap.values.get("steps", [])
            if len(steps) > step and steps[step]["action"].get("type") == "tool_call":
                keys.add(call_key(steps[step]["action"]))
        return frozenset(keys)

    async def _fork_points(self, thread_id: str, steps: int, known: Sequence[str | None] = ()) -> list[str | None]:
        """Per step, the id of this thread's checkpoint just before it (``None``: the step is a branch's
        prefix, whose fork point lives in the parent's thread).

        The history is read newest first and only down to the steps ``known`` already covers: a
        thread's step count never falls, and every checkpoint holds all steps so far, so reading
        the whole history after each step (online branching snapshots every step) cost the cube
        of the steps (9 s for a 20-step trajectory; BENCHMARKS section 9, "Session 33").
        """
        points: list[str | None] = [*known[:steps], *[None] * (steps - len(known))]
        async for snap in self.graph.aget_state_history(self._thread(thread_id)):
            at = len(snap.values.get("steps", []))
            if at < len(known):
                break
            if snap.next == ("think",) and at < steps:
                points[at] = snap.config["configurable"]["checkpoint_id"]
                if known and at == len(known):  # the oldest point missing: the rest are known
                    break
        return points

    async def _trajectory(
        self,
        thread_id: str,
        values: dict,
        seconds: float,
        config: ParallelMuseConfig | None,
        *,
        known: Sequence[str | None] = (),
    ) -> Trajectory:
        origin = values.get("origin") or Origin(kind="initial", parent=None)
        steps, observations = values.get("steps", []), values.get("observations", [])
        first_own = first_own_step(origin)
        own = steps[first_own:]
        own_obs = [o for o in observations if o["step"] >= first_own]
        trajectory = Trajectory(
            id=values.get("trajectory_id", thread_id),
            thread_id=thread_id,
            origin=origin,
            steps=steps,
            observations=observations,
            fork_points=await self._fork_points(thread_id, len(steps), known),
            status=values.get("status", "failed"),
            answer=values.get("answer"),
            error=values.get("error"),
            uncertainty=score_steps(steps, (config or _DEFAULT_CONFIG).estimator),
            stats={
                "generated_tokens": sum(s["generated_tokens"] for s in own),
                "prompt_tokens": sum(s["prompt_tokens"] for s in own),
                # Computed: each conversation call of a branch sends the parent's prompt at the fork point
                # again (a guided step's plain query and answer prompts do not).
                "reused_prefix_tokens": origin.get("prefix_tokens", 0) * sum(s["conversation_calls"] for s in own),
                "cached_prompt_tokens": sum(s["cached_prompt_tokens"] for s in own),
                "conversation_prompt_tokens": sum(s["conversation_prompt_tokens"] for s in own),
                "conversation_cached_tokens": sum(s["conversation_cached_tokens"] for s in own),
                "cache_reported": any(s["cache_reported"] for s in own),
                "lowest_confidence": lowest_group_confidence(
                    [tok for s in own for tok in s["tokens"]], window=CONFIDENCE_WINDOW
                ),
                "tool_calls": count_tool_calls(own_obs, steps=own),
                "seconds": seconds,
            },
        )
        trajectory["stats"].update(_problems(own, own_obs))
        return trajectory


MAX_REASONS = 3  # distinct tool errors a trajectory's (and the rollout's) stats name


def turn_problems(trajectory: Trajectory) -> dict[str, Any]:
    """What went wrong in a trajectory's own steps (a branch's prefix is its parent's) while it still ran.

    ``tool_errors`` counts the tool calls (as ``tool_calls`` does) whose response was an error, and
    ``tool_error_reasons`` names up to :data:`MAX_REASONS` distinct ones, on one line and redacted;
    ``invalid_turns`` counts the turns read as no tool call and no answer, ``rejected_turns`` those
    kept though the driver rejected them. A trajectory can answer after every search failed: only
    these say so.

    Example:
        >>> turn_problems({"origin": {"kind": "initial"}, "steps": [{"action": {"type": "invalid"}}],
        ...     "observations": [{"step": 0, "name": "invalid", "error": True, "content": "Error: unreadable"},
        ...                      {"step": 1, "name": "search", "error": True, "content": "Error: HTTP 401"}]})
        {'tool_errors': 1, 'tool_error_reasons': ['Error: HTTP 401'], 'invalid_turns': 1, 'rejected_turns': 0}
    """
    first_own = first_own_step(trajectory["origin"])
    return _problems(trajectory["steps"][first_own:], [o for o in trajectory["observations"] if o["step"] >= first_own])


def _problems(steps: Sequence[Step], observations: Sequence[Observation]) -> dict[str, Any]:
    """:func:`turn_problems` of a trajectory's own steps and their observations."""
    # The error replies to unreadable turns answer no call: they are the invalid turns, not tool errors.
    failed = [o for o in observations if o["error"] and count_tool_calls([o], steps=steps)]
    reasons = dict.fromkeys(redact(one_line(o["content"], 200)) for o in failed)
    return {
        "tool_errors": len(failed),
        "tool_error_reasons": list(reasons)[:MAX_REASONS],
        "invalid_turns": sum(1 for s in steps if s["action"]["type"] == "invalid"),
        "rejected_turns": sum(1 for s in steps if "rejected" in s),
    }
