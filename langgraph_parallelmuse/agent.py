"""The checkpointed think ⇄ act rollout subgraph, and the runner that starts and forks it.

Every ``think`` and ``act`` node is a checkpoint, one thread per trajectory. The snapshots whose
next node is ``think`` are the fork points of partial rollout: a branch is a new thread seeded
with such a snapshot's values, so it shares the parent's prefix byte for byte (the prompt is a
pure function of the recorded steps) and never re-runs the prefix's tool calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.driver import Driver, FreeDriver, GuidedDriver, StepContext, call_key
from langgraph_parallelmuse.errors import ParallelMuseError
from langgraph_parallelmuse.protocol import SYSTEM_PROMPT, build_messages, describe_tools, parse_action, region_spans
from langgraph_parallelmuse.retry import with_retries
from langgraph_parallelmuse.segments import Sampling, derive_seed, generate_turn
from langgraph_parallelmuse.state import AgentState, Observation, Origin, Step, Trajectory
from langgraph_parallelmuse.uncertainty import score_steps

_DEFAULT_CONFIG = ParallelMuseConfig()


def pick_driver(model: BaseChatModel, setting: str, guided: GuidedDriver | None = None) -> Driver:
    """``auto`` guides models that can continue a prefilled turn (the in-process model)."""
    if setting == "guided" or (setting == "auto" and getattr(model, "supports_prefill", False)):
        return guided or GuidedDriver()
    return FreeDriver()


def close_open_tag(text: str) -> str:
    """Re-append the closing tag a stop string swallowed (``</tool_call>`` / ``</answer>``)."""
    for tag in ("tool_call", "answer"):
        if text.rfind(f"<{tag}>") > text.rfind(f"</{tag}>"):
            return text + f"</{tag}>"
    return text


def _context_exhausted(steps: Sequence[Step], observations: Sequence[Observation], cfg: ParallelMuseConfig) -> bool:
    if not steps:
        return False
    last = steps[-1]
    obs_chars = sum(len(o["content"]) for o in observations if o["step"] == last["index"])
    # ~3 chars a token is a conservative estimate for English tool output.
    estimate = last["context_tokens"] + last["generated_tokens"] + obs_chars // 3 + 32
    return estimate + cfg.max_step_tokens > cfg.max_context_tokens


_OVERFLOW_HINTS = (
    "context length",
    "context_length",
    "maximum context",
    "too many tokens",
    "context window",
    "prompt is too long",
    "exceeds the context",
)


def is_context_overflow(exc: BaseException) -> bool:
    """A backend's "prompt does not fit the context window" error (OpenAI, vLLM, llama.cpp wording)."""
    text = f"{getattr(exc, 'code', '')} {exc}".lower()
    return any(hint in text for hint in _OVERFLOW_HINTS)


def _tool_text(content: Any) -> str:
    if isinstance(content, bytes):
        return content.decode("utf-8", errors="replace")
    if isinstance(content, list):
        return "\n".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
    return str(content)


def build_rollout_graph(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    driver: Driver,
    system_prompt: str | None = None,
    fork_actions: dict[str, set[str]] | None = None,
) -> StateGraph:
    """The think ⇄ act ReAct loop as an uncompiled graph (compile it with a checkpointer).

    Args:
        model: Chat model returning token logprobs in ``response_metadata["logprobs"]``.
        tools: Tools by name (``search`` and usually ``visit``).
        driver: How a think step is generated (:class:`FreeDriver` or :class:`GuidedDriver`).
        system_prompt: Overrides the protocol's system prompt (``{tools}`` is filled in).
        fork_actions: Tool calls already taken at each fork checkpoint (by checkpoint id), shared
            by the branches of that checkpoint when ``diverse_branches`` is on.
    """
    fork_actions = {} if fork_actions is None else fork_actions
    by_name = {t.name: t for t in tools}
    system = (
        (system_prompt or SYSTEM_PROMPT).replace("{tools}", describe_tools(tools)).replace("{{", "{").replace("}}", "}")
    )

    async def think(state: AgentState, runtime: Runtime[ParallelMuseConfig]) -> dict[str, Any]:
        cfg = runtime.context or _DEFAULT_CONFIG
        steps, observations = state.get("steps", []), state.get("observations", [])
        index = len(steps)
        origin = state.get("origin") or {}
        # The first regenerated step of a branch: with diverse_branches it must not redo the
        # parent's or an earlier sibling's tool call.
        fork = origin.get("checkpoint_id") if cfg.diverse_branches and origin.get("step") == index else None
        exhausted = _context_exhausted(steps, observations, cfg)
        sampling = Sampling(temperature=cfg.temperature, top_p=cfg.top_p, top_logprobs=cfg.top_logprobs)
        spent_generated = spent_prompt = spent_cached = spent_calls = 0
        started = time.perf_counter()
        trim: int | None = None
        while True:
            ctx = StepContext(
                state["question"],
                steps,
                observations,
                index,
                final=exhausted or index >= cfg.max_turns - 1,
                max_step_tokens=cfg.max_step_tokens,
                tool_names=frozenset(by_name),
                avoid=frozenset(fork_actions.get(fork, ())) if fork else frozenset(),
            )
            messages = build_messages(
                state["question"],
                steps,
                observations,
                system=system,
                final_turn=ctx.final and isinstance(driver, FreeDriver),
                max_observation_chars=trim,
            )
            try:
                for attempt in range(driver.retries + 1):
                    turn = await generate_turn(
                        model,
                        messages,
                        driver.plan(ctx),
                        sampling=sampling,
                        seed=derive_seed(cfg.seed, state.get("trajectory_id"), index, attempt),
                    )
                    truncated = turn.finish_reason == "length"
                    text = turn.text if truncated else close_open_tag(turn.text)
                    action = parse_action(text, truncated=truncated)
                    spent_generated += turn.generated_tokens
                    spent_prompt += turn.prompt_tokens
                    spent_cached += turn.cached_prompt_tokens
                    spent_calls += turn.calls
                    if driver.reject(ctx, text, action) is None:
                        break
                break
            except ParallelMuseError:
                raise
            except Exception as exc:  # noqa: BLE001 - a dead model ends this trajectory, not the run
                if is_context_overflow(exc) and trim is None:
                    # Blind retries cannot fit the window: shrink old tool output and answer now.
                    exhausted, trim = True, 200
                    continue
                return {"status": "failed", "error": f"model call failed at step {index}: {type(exc).__name__}: {exc}"}
        step = Step(
            index=index,
            text=text,
            tokens=turn.tokens,
            regions=region_spans(text),
            action=action,
            prompt_tokens=spent_prompt,
            context_tokens=turn.context_tokens,
            generated_tokens=spent_generated,
            cached_prompt_tokens=spent_cached,
            calls=spent_calls,
            finish_reason=turn.finish_reason,
            seconds=time.perf_counter() - started,
        )
        if fork and action["type"] == "tool_call":
            fork_actions.setdefault(fork, set()).add(call_key(action))
        update: dict[str, Any] = {"steps": [step]}
        if action["type"] == "answer":
            update.update(status="answered", answer=action["answer"])
        elif ctx.final:
            update.update(status="context_exhausted" if exhausted else "max_turns", answer=None)
        else:
            update["status"] = "running"
        return update

    async def act(state: AgentState, runtime: Runtime[ParallelMuseConfig]) -> dict[str, Any]:
        cfg = runtime.context or _DEFAULT_CONFIG
        step = state["steps"][-1]
        action = step["action"]
        started = time.perf_counter()
        name, args = action.get("name", ""), action.get("arguments", {})
        doc_ids: list[str] = []
        error = True
        if action["type"] != "tool_call":
            # No tags in the hint: it travels inside a tool response, where tags are neutralised.
            content = (
                f"Error: {action.get('error', 'unreadable reply')}. Reply with your thinking in a think "
                "block, then exactly one tool call (JSON with name and arguments) or an answer block."
            )
        elif name not in by_name:
            content = f"Error: unknown tool {name!r}; available tools: {', '.join(sorted(by_name))}."
        else:
            call = {
                "type": "tool_call",
                "name": name,
                "args": args,
                "id": f"{state.get('trajectory_id')}-{step['index']}",
            }
            try:
                # The timeout bounds the whole call, retries of transient failures included.
                result = await asyncio.wait_for(
                    with_retries(lambda: by_name[name].ainvoke(call)), timeout=cfg.tool_timeout
                )
                content = _tool_text(result.content if isinstance(result, ToolMessage) else result)
                artifact = getattr(result, "artifact", None)
                if isinstance(artifact, dict):
                    doc_ids = [str(d) for d in artifact.get("doc_ids", [])]
                error = isinstance(result, ToolMessage) and result.status == "error"
            except TimeoutError:
                content = f"Error: tool {name!r} timed out after {cfg.tool_timeout:g} s."
            except Exception as exc:  # noqa: BLE001 - the agent sees the failure and goes on
                content = f"Error: tool {name!r} failed: {type(exc).__name__}: {exc}"
        # Lone surrogates cannot be sent as UTF-8 and would be stored differently than sent.
        content = content.encode("utf-8", "replace").decode("utf-8")
        if not content.strip() and not error:
            content, error = f"Error: tool {name!r} returned nothing.", True
        if len(content) > cfg.max_observation_chars:
            content = content[: cfg.max_observation_chars] + " …[truncated]"
        obs = Observation(
            step=step["index"],
            name=name or "invalid",
            arguments=args,
            content=content,
            error=error,
            seconds=time.perf_counter() - started,
            doc_ids=doc_ids,
        )
        return {"observations": [obs]}

    def route(state: AgentState) -> str:
        return "act" if state.get("status") == "running" else END

    graph = StateGraph(AgentState, context_schema=ParallelMuseConfig)
    graph.add_node("think", think)
    graph.add_node("act", act)
    graph.add_edge(START, "think")
    graph.add_conditional_edges("think", route, ["act", END])
    graph.add_edge("act", "think")
    return graph


class RolloutRunner:
    """Runs trajectories of the rollout subgraph in their own threads, and forks them.

    Args:
        model: The agent model.
        tools: Agent tools (``search``, ``visit``).
        driver: Step driver; default picks guided for the in-process model, free otherwise.
        checkpointer: Where trajectory snapshots live (default: in memory).
        system_prompt: Optional system prompt override.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> import asyncio
        >>> runner = RolloutRunner(FakeListChatModel(responses=["<think>easy</think><answer>4</answer>"]), [])
        >>> traj = asyncio.run(runner.run("2+2?", trajectory_id="t0", thread_id="demo:t0"))
        >>> traj["answer"], traj["status"]
        ('4', 'answered')
    """

    def __init__(
        self,
        model: BaseChatModel,
        tools: Sequence[BaseTool],
        *,
        driver: Driver | str = "auto",
        checkpointer: BaseCheckpointSaver | None = None,
        system_prompt: str | None = None,
    ) -> None:
        self.model = model
        self.tools = list(tools)
        self.driver = driver if isinstance(driver, (FreeDriver, GuidedDriver)) else pick_driver(model, driver)
        self.checkpointer = checkpointer or InMemorySaver()
        self.fork_actions: dict[str, set[str]] = {}
        self.graph: CompiledStateGraph = build_rollout_graph(
            model, self.tools, driver=self.driver, system_prompt=system_prompt, fork_actions=self.fork_actions
        ).compile(checkpointer=self.checkpointer, name="rollout")

    @staticmethod
    def _thread(thread_id: str, metadata: dict | None = None) -> dict:
        # A fresh config (not the caller's) keeps this graph out of the parent run's checkpoint
        # namespace: re-running a subgraph *node* from a checkpoint restarts it (langgraph#8458).
        return {
            "configurable": {"thread_id": thread_id},
            "metadata": metadata or {},
            "run_name": "parallelmuse.rollout",
        }

    async def existing(self, thread_id: str, config: ParallelMuseConfig | None = None) -> Trajectory | None:
        """The finished trajectory of a thread, if it already ran (resume support)."""
        snap = await self.graph.aget_state(self._thread(thread_id))
        if snap.values and not snap.next and snap.values.get("status") not in (None, "running"):
            return self._trajectory(thread_id, snap.values, 0.0, config)
        return None

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
        if (done := await self.existing(thread_id, config)) is not None:
            return done
        origin = origin or Origin(kind="initial", parent=None, round=0)
        started = time.perf_counter()
        tc = self._thread(thread_id, {"trajectory_id": trajectory_id, "origin_kind": origin.get("kind")})
        snap = await self.graph.aget_state(tc)
        payload = (
            None
            if snap.next
            else {
                "question": question,
                "trajectory_id": trajectory_id,
                "origin": origin,
                "status": "running",
                "answer": None,
            }
        )
        await self.graph.ainvoke(payload, tc, context=config or _DEFAULT_CONFIG)
        final = await self.graph.aget_state(tc)
        return self._trajectory(thread_id, final.values, time.perf_counter() - started, config)

    async def fork_point(self, parent_thread: str, step: int):
        """The snapshot just before step ``step``'s think node in ``parent_thread``."""
        async for snap in self.graph.aget_state_history(self._thread(parent_thread)):
            if snap.next == ("think",) and len(snap.values.get("steps", [])) == step:
                return snap
        raise ParallelMuseError(f"no checkpoint before step {step} in thread {parent_thread!r}")

    async def fork(
        self,
        parent: Trajectory,
        step: int,
        *,
        trajectory_id: str,
        thread_id: str,
        config: ParallelMuseConfig | None = None,
        origin: Origin | None = None,
    ) -> Trajectory:
        """Continue a new thread from the checkpoint before ``parent``'s step ``step``.

        The branch keeps steps ``< step`` and their tool responses (not re-fetched) and
        regenerates step ``step`` and everything after it.
        """
        if (done := await self.existing(thread_id, config)) is not None:
            return done
        started = time.perf_counter()
        snap = await self.fork_point(parent["thread_id"], step)
        prefix_tokens = parent["steps"][step]["context_tokens"] if step < len(parent["steps"]) else 0
        origin = Origin(
            **{
                "kind": "branch",
                "parent": parent["id"],
                "parent_thread": parent["thread_id"],
                "checkpoint_id": snap.config["configurable"]["checkpoint_id"],
                "step": step,
                "prefix_tokens": prefix_tokens,
                "round": 1,
                **(origin or {}),
            }
        )
        parent_action = parent["steps"][step]["action"] if step < len(parent["steps"]) else {}
        if (config or _DEFAULT_CONFIG).diverse_branches and parent_action.get("type") == "tool_call":
            self.fork_actions.setdefault(origin["checkpoint_id"], set()).add(call_key(parent_action))
        tc = self._thread(
            thread_id,
            {
                "trajectory_id": trajectory_id,
                "parent_thread": parent["thread_id"],
                "fork_checkpoint_id": origin["checkpoint_id"],
                "fork_step": step,
            },
        )
        current = await self.graph.aget_state(tc)
        if not current.values:
            values = {
                **snap.values,
                "trajectory_id": trajectory_id,
                "origin": origin,
                "status": "running",
                "answer": None,
            }
            await self.graph.aupdate_state(tc, values, as_node="act")
        await self.graph.ainvoke(None, tc, context=config or _DEFAULT_CONFIG)
        final = await self.graph.aget_state(tc)
        return self._trajectory(thread_id, final.values, time.perf_counter() - started, config)

    @staticmethod
    def _trajectory(thread_id: str, values: dict, seconds: float, config: ParallelMuseConfig | None) -> Trajectory:
        origin = values.get("origin") or Origin(kind="initial", parent=None)
        steps, observations = values.get("steps", []), values.get("observations", [])
        first_own = (origin.get("step") or 0) if origin.get("kind") == "branch" else 0
        own = steps[first_own:]
        own_obs = [o for o in observations if o["step"] >= first_own]
        return Trajectory(
            id=values.get("trajectory_id", thread_id),
            thread_id=thread_id,
            origin=origin,
            steps=steps,
            observations=observations,
            status=values.get("status", "failed"),
            answer=values.get("answer"),
            error=values.get("error"),
            uncertainty=score_steps(steps, (config or _DEFAULT_CONFIG).estimator),
            stats={
                "generated_tokens": sum(s["generated_tokens"] for s in own),
                "prompt_tokens": sum(s["prompt_tokens"] for s in own),
                # Every call of a branch starts with the parent's prompt at the fork point.
                "reused_prefix_tokens": origin.get("prefix_tokens", 0) * sum(s["calls"] for s in own),
                "cached_prompt_tokens": sum(s["cached_prompt_tokens"] for s in own),
                "tool_calls": sum(1 for o in own_obs if o["name"] != "invalid"),
                "seconds": seconds,
            },
        )
