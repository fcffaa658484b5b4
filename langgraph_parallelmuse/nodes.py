"""The ParallelMuse graph's nodes and edge functions, as methods of one small object.

:class:`ParallelMuseNodes` holds what every node needs (the rollout runner, the models, the
concurrency limit, the factory config) and nothing else; each method is one node or one
conditional edge of :func:`~langgraph_parallelmuse.graph.build_parallelmuse_graph`, callable alone
in a test. Data flows one way: the schedule decides the jobs, the runner runs them, Stage 2
(:mod:`~langgraph_parallelmuse.stage2`) writes the reports and chooses the answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.config import get_config, get_stream_writer
from langgraph.runtime import get_runtime
from langgraph.types import Overwrite, Send

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import ParallelMuseConfig, resolve_config
from langgraph_parallelmuse.driver import GuidedDriver
from langgraph_parallelmuse.errors import InputError
from langgraph_parallelmuse.lineage import Job
from langgraph_parallelmuse.models.routing import routing_scope
from langgraph_parallelmuse.schedule import budget_stats, first_wave, next_wave, pick_branches
from langgraph_parallelmuse.stage2 import choose_answer, compression_stats, write_report
from langgraph_parallelmuse.state import ParallelMuseState, Trajectory

MAX_QUESTION_CHARS = 4000

_ENGINE_COUNTERS = ("requests", "prefill_tokens_computed", "prefill_tokens_reused", "decode_tokens", "batches")


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


def emit(event: str, **data: Any) -> None:
    """Send a progress event to the ``custom`` stream (a no-op outside a graph run)."""
    try:
        get_stream_writer()({"event": event, **data})
    except RuntimeError:  # called outside a graph run (e.g. a unit test of a node)
        pass


def engine_delta(start: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """In-process engine counters of this run (the engine is shared, so concurrent runs mix in).

    Example:
        >>> engine_delta({"requests": 1}, {"requests": 3, "prefill_tokens_reused": 4})["requests"]
        2
    """
    out = {k: now.get(k, 0) - start.get(k, 0) for k in _ENGINE_COUNTERS}
    prompt = out["prefill_tokens_computed"] + out["prefill_tokens_reused"]
    out["cache_token_reuse"] = out["prefill_tokens_reused"] / prompt if prompt else 0.0
    out["cache_bytes"] = now.get("cache_bytes", 0)
    return out


def rollout_summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Token, tool-call and outcome totals of the rollout stage."""
    keys = ("generated_tokens", "prompt_tokens", "reused_prefix_tokens", "cached_prompt_tokens", "tool_calls")
    out: dict[str, Any] = {k: sum(t["stats"][k] for t in trajectories) for k in keys}
    out["trajectories"] = len(trajectories)
    out["answered"] = sum(1 for t in trajectories if t["answer"])
    out["failed"] = sum(1 for t in trajectories if t["status"] == "failed")
    out["by_kind"] = {
        kind: sum(1 for t in trajectories if t["origin"].get("kind") == kind) for kind in ("initial", "branch", "fill")
    }
    return out


class ParallelMuseNodes:
    """The nodes of one ParallelMuse graph.

    Args:
        runner: Runs and forks the trajectories (owns the trajectory checkpointer).
        aggregator: Model that reads the reports (the agent model unless a separate one is given).
        config: The factory settings; a run's ``context`` overrides any field.
        guided_aggregate: Prefill the aggregator's answer (a model that continues an assistant turn).

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> model = FakeListChatModel(responses=["<think>x</think><answer>4</answer>"])
        >>> config = ParallelMuseConfig(n=2, mode="none")
        >>> nodes = ParallelMuseNodes(RolloutRunner(model, []), aggregator=model, config=config)
        >>> [s.node for s in nodes.launch_initial({"question": "2+2?", "run_id": "r"})]
        ['initial_rollout', 'initial_rollout']
    """

    def __init__(
        self,
        runner: RolloutRunner,
        *,
        aggregator: BaseChatModel,
        config: ParallelMuseConfig,
        guided_aggregate: bool | None = None,
    ) -> None:
        self.runner = runner
        self.model = runner.model
        self.aggregator = aggregator
        self.config = config
        self.guided_reports = isinstance(runner.driver, GuidedDriver)
        self.guided_aggregate = self.guided_reports if guided_aggregate is None else guided_aggregate
        self._limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def settings(self) -> ParallelMuseConfig:
        """This run's settings: the factory config with the run's context applied (outside a run: the former)."""
        try:
            context = get_runtime().context
        except RuntimeError:
            return self.config
        return resolve_config(self.config, context)

    def limit(self, settings: ParallelMuseConfig) -> asyncio.Semaphore:
        """Trajectories/reports in flight: one bound per event loop and ``max_concurrency``, shared by the
        runs on that loop that use the same value (``batch`` too)."""
        per_loop = self._limits.setdefault(asyncio.get_running_loop(), {})
        if settings.max_concurrency not in per_loop:
            per_loop[settings.max_concurrency] = asyncio.Semaphore(settings.max_concurrency)
        return per_loop[settings.max_concurrency]

    # ------------------------------------------------------------------ Stage 1

    async def prepare(self, state: ParallelMuseState) -> dict[str, Any]:
        question = question_from_input(state)
        settings = self.settings()
        parent_thread = (get_config().get("configurable") or {}).get("thread_id")
        digest = hashlib.sha256(question.encode()).hexdigest()[:10]
        # Deterministic ids under a checkpointed parent thread make a resumed run find its
        # finished trajectories; otherwise every run gets fresh threads.
        run_id = f"{parent_thread}:{digest}" if parent_thread else f"run-{uuid.uuid4().hex[:12]}:{digest}"
        emit("run_started", question=question, **{k: getattr(settings, k) for k in ("n", "m", "k", "t", "mode")})
        stats: dict[str, Any] = {"config": settings.model_dump(), "timeline": {"start": time.time()}}
        engine_start: dict[str, Any] = {}
        if callable(engine_stats := getattr(self.model, "engine_stats", None)):
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

    @staticmethod
    def _send(node: str, state: ParallelMuseState, job: Job) -> Send:
        # The job names its thread and, for a branch, the parent's thread and checkpoint: the
        # payload never carries a trajectory.
        return Send(node, {"question": state["question"], "job": job})

    def launch_initial(self, state: ParallelMuseState) -> list[Send]:
        jobs = first_wave(self.settings(), run_id=state["run_id"])
        return [self._send("initial_rollout", state, job) for job in jobs]

    async def rollout(self, payload: dict[str, Any]) -> dict[str, Any]:
        job: Job = payload["job"]
        settings = self.settings()
        with routing_scope(payload["question"]):
            async with self.limit(settings):
                emit("trajectory_started", id=job["id"], kind=job["origin"]["kind"], step=job["origin"].get("step"))
                traj = await self.runner.run_job(job, question=payload["question"], config=settings)
        emit(
            "trajectory_finished",
            id=traj["id"],
            kind=traj["origin"].get("kind"),
            status=traj["status"],
            answer=traj["answer"],
            steps=len(traj["steps"]),
            generated_tokens=traj["stats"]["generated_tokens"],
        )
        return {"trajectories": [traj]}

    async def select_branches(self, state: ParallelMuseState) -> dict[str, Any]:
        """The uncertainty node, once per round: score the latest trajectories, pick checkpoints."""
        settings = self.settings()
        if len(state["trajectories"]) >= settings.n:
            return {}
        round = state.get("round", 0) + 1
        picks = pick_branches(state["trajectories"], settings, round=round)
        for pick in picks:
            emit("branch_picked", **pick)
        stamp = "selected" if round == 1 else f"selected_round{round}"
        return {"round": round, "picks": picks, "stats": {"timeline": {stamp: time.time()}}}

    def launch_branches(self, state: ParallelMuseState) -> list[Send] | str:
        settings = self.settings()
        if len(state["trajectories"]) >= settings.n:
            return "collect"
        round = state["round"]
        picks = [p for p in state.get("picks", []) if p["round"] == round]
        jobs = next_wave(state["trajectories"], picks, settings, round=round, run_id=state["run_id"])
        # next_wave tops up to N, so jobs is never empty here; "collect" keeps the run alive if it were.
        return [self._send("branch_rollout", state, job) for job in jobs] or "collect"

    async def collect(self, state: ParallelMuseState) -> dict[str, Any]:
        return {
            "stats": {
                "rollout": rollout_summary(state["trajectories"]),
                "budget": budget_stats(state["trajectories"], self.settings()),
                "timeline": {"rolled_out": time.time()},
            }
        }

    # ------------------------------------------------------------------ Stage 2

    def launch_compress(self, state: ParallelMuseState) -> list[Send] | str:
        if self.settings().aggregation != "parallelmuse":
            return "aggregate"
        answered = [t for t in state["trajectories"] if t["answer"]]
        return [Send("compress", {"question": state["question"], "trajectory": t}) for t in answered] or "aggregate"

    async def compress(self, job: dict[str, Any]) -> dict[str, Any]:
        settings, traj = self.settings(), job["trajectory"]
        with routing_scope(job["question"]):
            async with self.limit(settings):
                report = await write_report(
                    self.model, job["question"], traj, config=settings, guided=self.guided_reports
                )
        emit(
            "report_written",
            trajectory_id=traj["id"],
            status=report["status"],
            answer=report["answer"],
            tokens=report["tokens"],
        )
        return {"reports": [report]}

    async def aggregate(self, state: ParallelMuseState) -> dict[str, Any]:
        settings = self.settings()
        trajectories, reports = state.get("trajectories", []), state.get("reports", [])
        stats: dict[str, Any] = {"timeline": {"end": time.time()}}
        with routing_scope(state["question"]):
            async with self.limit(settings):
                choice = await choose_answer(
                    self.aggregator,
                    state["question"],
                    trajectories,
                    reports,
                    config=settings,
                    guided=self.guided_aggregate,
                )
        if settings.aggregation == "parallelmuse":
            stats["compress"] = compression_stats(reports)
        if callable(engine_stats := getattr(self.model, "engine_stats", None)):
            stats["engine"] = engine_delta(state.get("engine_start") or {}, await asyncio.to_thread(engine_stats))
        emit("answer", answer=choice.answer, source=choice.source)
        text = choice.answer if choice.answer is not None else "No answer: every trajectory failed to produce one."
        return {
            "answer": choice.answer,
            "answer_source": choice.source,
            "stats": stats,
            "messages": [AIMessage(text, name="parallelmuse", response_metadata={"answer_source": choice.source})],
        }
