"""The ParallelMuse graph's nodes and edge functions, as methods of one small object.

:class:`ParallelMuseNodes` holds what every node needs (the rollout runner, the models, the
concurrency limit, the factory config) and nothing else; each method is one node or one
conditional edge of :func:`~langgraph_parallelmuse.graph.build_parallelmuse_graph`, callable alone
in a test. Data flows one way: the schedule decides the jobs, the runner runs them, Stage 2
(:mod:`~langgraph_parallelmuse.stage2`) writes the reports and chooses the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import threading
import time
import unicodedata
import uuid
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.config import get_config, get_stream_writer
from langgraph.constants import CONFIG_KEY_CHECKPOINTER  # kept by LangGraph for langgraph-api
from langgraph.runtime import get_runtime
from langgraph.types import Overwrite, Send

from langgraph_parallelmuse.agent import MAX_REASONS, RolloutRunner, lend_checkpointer, turn_problems
from langgraph_parallelmuse.concurrency import Bounds
from langgraph_parallelmuse.config import (
    ParallelMuseConfig,
    context_overrides,
    make_config,
    misplaced_settings,
    resolve_config,
)
from langgraph_parallelmuse.crossover import consensus_stop, crossover_stats, crossover_wave, pick_pairs
from langgraph_parallelmuse.driver import GuidedDriver
from langgraph_parallelmuse.errors import (
    ConfigError,
    InputError,
    ParallelMuseError,
    RolloutFailedError,
    ThreadBusyError,
    with_result,
)
from langgraph_parallelmuse.infograph import redundancy_summary, warn_unreadable
from langgraph_parallelmuse.lineage import Job
from langgraph_parallelmuse.models.routing import routing_scope
from langgraph_parallelmuse.protocol import one_line
from langgraph_parallelmuse.schedule import budget_stats, first_wave, next_wave, online_rollout, pick_branches
from langgraph_parallelmuse.stage2 import choose_answer, compression_stats, write_report
from langgraph_parallelmuse.state import ParallelMuseState, Trajectory

MAX_QUESTION_CHARS = 4000
# The answer message's response_metadata key naming the question it answers (see question_from_input).
ANSWERED_KEY = "question"
# The engine's counters are this process's: a run resumed elsewhere cannot subtract its start from them.
_PROCESS = uuid.uuid4().hex
# The settings no trajectory depends on: how many run at once, and what Stage 2 makes of them.
_NOT_IN_TRAJECTORIES = frozenset(
    {"max_concurrency", "aggregation", "report_form", "max_report_tokens", "max_aggregate_tokens"}
)

_ENGINE_COUNTERS = (
    "requests",
    "prefill_tokens_computed",
    "prefill_tokens_reused",
    "decode_tokens",
    "scored_tokens",
    "batches",
    "batch_rows",
    "cancelled",
    "prefill_seconds",
    "decode_seconds",
)


class InFlight:
    """Process-wide claims on trajectory threads: one task at a time drives a thread; a second waits.

    Two runs of one question on one parent thread at once (a parent's ``Send`` fan-out asking it twice)
    have one run id, so the same trajectory threads: unclaimed, both sampled into each thread at once,
    twice the model calls for one set of trajectories, and a thread history with two step-0s. Claimed,
    the second run waits for each trajectory the first is running and then finds it finished, as a
    run asking the question again later on the thread does (one run, not two). A claim lasts one node's
    work on a thread, not a run, so a crashed, cancelled or interrupted run leaves none behind, and a
    resumed run claims anew. Waiters poll: runs on other event loops (the sync API's background loop,
    a thread's ``asyncio.run``) share the claims, and a wait is rare and as long as a trajectory.

    Example:
        >>> async def demo():
        ...     claims = InFlight()
        ...     async with claims.claim("chat:ab12/t0"):
        ...         return claims.held("chat:ab12/t0")
        >>> asyncio.run(demo()), InFlight().held("chat:ab12/t0")
        (True, False)
    """

    POLL_SECONDS = 0.05
    #: How long the holder's event loop may run nothing while a task waits for its claim: a loop
    #: that long stuck is blocked, e.g. by a sync ``invoke`` of the same run called inside it, which
    #: waits for the waiter, which waits for the loop, for good.
    STALL_SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, asyncio.AbstractEventLoop] = {}  # key -> the event loop of its holder

    def held(self, key: Hashable) -> bool:
        """Whether some task holds ``key`` now."""
        with self._lock:
            return key in self._held

    def _take(self, key: Hashable) -> asyncio.AbstractEventLoop | None:
        """Take ``key`` for the running task: ``None``, or the event loop of the task holding it."""
        with self._lock:
            holder = self._held.get(key)
            if holder is not None and holder.is_closed():  # its task can never release it
                holder = None
            if holder is None:
                self._held[key] = asyncio.get_running_loop()
            return holder

    @contextlib.asynccontextmanager
    async def claim(self, key: Hashable) -> AsyncIterator[None]:
        """Hold ``key`` inside the block, waiting while another task holds it (a waiter holds nothing).

        Raises:
            RuntimeError: The holder's event loop ran nothing for :attr:`STALL_SECONDS` while this
                task waited (a sync call blocking that loop waits for this task).
        """
        probe: tuple[asyncio.AbstractEventLoop, threading.Event, float] | None = None
        while (holder := self._take(key)) is not None:
            if holder is not asyncio.get_running_loop():  # on this loop, the holder runs while this one sleeps
                probe = self._probe(key, holder, probe)
            await asyncio.sleep(self.POLL_SECONDS)
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(key, None)

    def _probe(
        self, key: Hashable, holder: asyncio.AbstractEventLoop, probe: tuple | None
    ) -> tuple[asyncio.AbstractEventLoop, threading.Event, float] | None:
        """Ask the holder's loop to run a callback; raise when an earlier ask waited too long."""
        if probe is not None and probe[0] is holder and not probe[1].is_set():
            if time.monotonic() - probe[2] > self.STALL_SECONDS:
                raise RuntimeError(
                    f"trajectory thread {key!r} is held by a run whose event loop has run nothing for "
                    f"{self.STALL_SECONDS:.0f} s: a sync call (invoke, batch, stream) made inside that loop "
                    "blocks it while it waits for this run, which waits for that loop; await the async form "
                    "(ainvoke, abatch, astream) there instead"
                )
            return probe
        ran = threading.Event()
        try:
            holder.call_soon_threadsafe(ran.set)
        except RuntimeError:  # closed since: the next _take frees its claim
            return None
        return holder, ran, time.monotonic()

    def forget(self) -> None:
        """Drop every claim (a forked child: the tasks that held them are not in it)."""
        self._lock = threading.Lock()
        self._held = {}


#: The trajectory threads (and online runs) being run in this process, by name.
IN_FLIGHT = InFlight()
os.register_at_fork(after_in_child=IN_FLIGHT.forget)

#: The ``configurable`` key of a run's record, which the compiled graph hands its run and ``prepare``
#: fills in: ``drop``, the run id whose trajectory threads end with the run (``None``: they are kept).
RUN_RECORD = "__parallelmuse_run"
#: What a run at the top writes its checkpoints under: the saver and the thread id.
RunKey = tuple[Any, str]


class BusyThreads:
    """Process-wide: the checkpointed threads a ParallelMuse graph runs on now, one run a thread.

    Two runs on one thread of one saver at once interleave their checkpoints: each returns its own
    answer, and the thread keeps one of them (a chat lost a turn), with no error. A key is a saver and
    a thread id; a run nested in a parent's takes none (a ``Send`` fan-out, two runs one node awaits
    together): LangGraph runs each in a namespace of its own. A run that finds its key held waits
    while the holder is ending (LangGraph Server's ``interrupt`` and ``rollback`` strategies cancel a
    run and start the next one at once), else for :attr:`GRACE_SECONDS` (the cancel may not have
    reached the holder yet), then is refused.

    Example:
        >>> busy = BusyThreads()
        >>> list(busy.take(("saver", "chat-1"))), busy.held(("saver", "chat-1"))
        ([], True)
        >>> busy.release(("saver", "chat-1")), busy.held(("saver", "chat-1"))
        (None, False)
    """

    POLL_SECONDS = 0.02
    GRACE_SECONDS = 1.0
    #: How long a run waits for a cancelled holder to let go of its thread.
    UNWIND_SECONDS = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The saver by identity: a saver class with __eq__ and no __hash__ (a dataclass, a pydantic model)
        # made every run a TypeError, and two equal savers would share their holds.
        self._held: dict[tuple[int, str], asyncio.Task | None] = {}  # -> the task running it (None: sync API)

    def held(self, key: RunKey) -> bool:
        """Whether a run holds ``key`` now."""
        with self._lock:
            return _slot(key) in self._held

    def take(self, key: RunKey | None) -> Iterator[float]:
        """Take ``key`` (``None``: nothing to take) for the calling run; while it is held, yield the
        seconds to sleep before the next try (the caller sleeps as its API does).

        Raises:
            ThreadBusyError: Another run holds the key and is not ending, or has not let it go after
                :attr:`UNWIND_SECONDS`; the message names the thread and what to do.
        """
        started = time.monotonic()
        while key is not None:
            with self._lock:
                holder = self._held.get(_slot(key), False)
                if holder is False:
                    self._held[_slot(key)] = _running_task()
                    return
            # Not a finished task: a run read one chunk a task (langgraph-api, asyncio.wait_for) is
            # between two of them then, not ending.
            ending = holder is not None and holder.cancelling() > 0
            if time.monotonic() - started > (self.UNWIND_SECONDS if ending else self.GRACE_SECONDS):
                raise ThreadBusyError(
                    f"thread {key[1]!r} is running another ParallelMuse run (checkpointer {type(key[0]).__name__}): "
                    "wait for that run to end (or close a stream of it you stopped reading), or give this one "
                    "another thread_id; two runs on one thread at once interleave its checkpoints, and it keeps "
                    "only one of them"
                )
            yield self.POLL_SECONDS

    def drive(self, key: RunKey | None) -> None:
        """Record the calling task as the one running ``key``'s run now: cancelling it ends the run."""
        with self._lock:
            if key is not None and _slot(key) in self._held:
                self._held[_slot(key)] = _running_task()

    def release(self, key: RunKey | None) -> None:
        """Let go of ``key`` (the run holding it ended)."""
        with self._lock:
            if key is not None:
                self._held.pop(_slot(key), None)

    def forget(self) -> None:
        """Drop every hold (a forked child: the runs that held them are not in it)."""
        self._lock = threading.Lock()
        self._held = {}


def _slot(key: RunKey) -> tuple[int, str]:
    # Held only while its run holds the saver, so no other saver can have its id meanwhile.
    return id(key[0]), key[1]


def _running_task() -> asyncio.Task | None:
    """The task of the calling coroutine, ``None`` outside one (the sync API)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


#: The threads ParallelMuse runs hold in this process (see :class:`BusyThreads`).
BUSY_THREADS = BusyThreads()
os.register_at_fork(after_in_child=BUSY_THREADS.forget)


def _prepared_settings(state: ParallelMuseState) -> dict[str, Any]:
    """The settings the trajectories of a run prepared before ``asked`` recorded them (402e770 and
    earlier) depend on: ``prepare``'s ``stats["config"]``, which nothing rewrote before ``collect`` did.

    Without them a fork of such a run whose settings were edited found the threads of the old settings
    finished and answered from them, while its stats named the new settings.

    Example:
        >>> _prepared_settings({"stats": {"config": {"temperature": 0.6, "max_concurrency": 4}}})
        {'temperature': 0.6}
    """
    config = (state.get("stats") or {}).get("config") or {}
    return {k: v for k, v in config.items() if k not in _NOT_IN_TRAJECTORIES}


def _edits(state: ParallelMuseState) -> dict[str, tuple[Any, Any]]:
    """The settings the trajectories depend on that the state now holds otherwise than ``prepare`` saw
    them, each as ``(then, now)``; by the fields prepare saw: a field a later version adds is no edit of
    a run resumed across versions, which must find its threads.

    Example:
        >>> asked = {"question": "Who?", "settings": {"temperature": 0.6, "n": 16}}
        >>> _edits({"question": "Who?", "asked": asked, "settings": {"temperature": 0.1, "n": 16}})
        {'temperature': (0.6, 0.1)}
    """
    seen = (state.get("asked") or {}).get("settings") or _prepared_settings(state)
    now = make_config(state["settings"]).model_dump() if seen else {}
    return {k: (v, now[k]) for k, v in seen.items() if k in now and now[k] != v}


def _repaired(state: ParallelMuseState) -> bool:
    """Whether the state's settings correct settings of the same question that this version refuses
    (as :meth:`ParallelMuseNodes.settings`' error says to): a repair, under which the trajectories
    sampled with the refused settings stay the run's.

    Example:
        >>> state = {"question": "Who?", "asked": {"question": "Who?", "settings": {"seed": -1}}}
        >>> _repaired(state), _repaired({**state, "asked": {"question": "Who?", "settings": {"seed": 7}}})
        (True, False)
    """
    asked = state.get("asked") or {}
    if asked.get("question") != state.get("question"):
        return False
    try:
        make_config(asked.get("settings") or _prepared_settings(state))
    except ConfigError:
        return True
    return False


def _edited(state: ParallelMuseState) -> str:
    """The settings edits :meth:`ParallelMuseNodes.trajectories` refuses, for its message; a ``settings``
    that lacks fields the run had was written partial (``update_state`` replaces the whole dict, and
    each field it left out took its default, not the run's value).

    Example:
        >>> asked = {"question": "Who?", "settings": {"n": 16, "temperature": 0.6}}
        >>> _edited({"question": "Who?", "asked": asked, "settings": {"n": 16, "temperature": 0.1}})
        '; settings temperature=0.1 (was 0.6)'
        >>> _edited({"question": "Who?", "asked": asked, "settings": {"aggregation": "majority"}})[:72]
        '; settings n=8 (was 16): update_state replaces the whole settings, so a '
    """
    edits = _edits(state)
    if not edits:
        return ""
    shown = "; settings " + ", ".join(f"{k}={now!r} (was {then!r})" for k, (then, now) in edits.items())
    if any(k not in state["settings"] for k in edits):
        shown += (
            ": update_state replaces the whole settings, so a field left out takes its default: pass "
            "{**values['settings'], ...} with the fields to change"
        )
    return shown


def _answered_before(messages: Sequence[Any], question: str | None) -> bool:
    """Whether the last answer message in ``messages`` answered ``question`` and a human message
    followed it: the new turn of a chat whose app, not this graph, keeps the state."""
    for at in range(len(messages) - 1, -1, -1):
        if isinstance(messages[at], AIMessage) and ANSWERED_KEY in (messages[at].response_metadata or {}):
            answered = messages[at].response_metadata[ANSWERED_KEY]
            return answered == question and any(isinstance(m, HumanMessage) for m in messages[at + 1 :])
    return False


def _shows_nothing(text: str) -> bool:
    """Whether ``text`` holds only whitespace, control and format characters (U+200B, U+2060, U+FEFF).

    ``str.strip`` keeps the zero-width ones: a question of them alone ran N trajectories on nothing.

    Example:
        >>> _shows_nothing("\u200b \ufeff"), _shows_nothing("\u200bWho?")
        (True, False)
    """
    return all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def question_from_input(state: dict) -> tuple[str, str | None]:
    """The question of a graph input, and the id of the last human message (``None``: none).

    ``question``, else the last human message. On a checkpointed thread the state still holds the
    previous run's question (``asked``: that question and the last human message it saw): a human
    message that came after it is the new turn's question, unless the input set another ``question``.
    As a node of a parent graph whose state has a ``question`` key, the parent keeps the question
    this graph wrote but not ``asked``: the answer message records its question instead, and a human
    message after that answer is again the new turn's question.

    Raises:
        InputError: No usable question (empty, not text, not valid UTF-8, or too long).

    Example:
        >>> question_from_input({"messages": [HumanMessage("Who wrote Dune?", id="m1")]})
        ('Who wrote Dune?', 'm1')
    """
    question, asked = state.get("question"), state.get("asked") or {}
    messages = state.get("messages") or []
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    message_id = humans[-1].id if humans else None
    stale = question == asked.get("question") and message_id != asked.get("message_id")
    # A parent state's default ("question: str = ''") is no question: the messages hold it.
    blank = isinstance(question, str) and _shows_nothing(question) and bool(humans)
    if question is None or blank or stale or (humans and _answered_before(messages, question)):
        if not humans:
            raise InputError("no question: send {'question': '...'} or messages ending in a human message")
        question = humans[-1].content
        if isinstance(question, list):  # content blocks: keep the text parts
            question = " ".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in question)
    if not isinstance(question, str):
        raise InputError(f"the question must be text, got {type(question).__name__}")
    question = question.strip()
    if _shows_nothing(question):
        raise InputError("the question is empty: send a non-empty 'question'")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate (what a non-UTF-8 command-line byte becomes) fails every later write or request.
        raise InputError(
            f"the question is not valid UTF-8 (an undecodable character at position {exc.start}): send it as UTF-8 text"
        ) from None
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question has {len(question)} chars; the limit is {MAX_QUESTION_CHARS}: shorten it")
    return question, message_id


def finished_event(traj: Trajectory) -> dict[str, Any]:
    """The ``trajectory_finished`` progress event of a trajectory: with why it failed or stopped.

    Example:
        >>> finished_event({"id": "t0", "origin": {"kind": "initial"}, "status": "failed", "answer": None,
        ...     "error": "model call failed: HTTP 401", "steps": [], "stats": {"generated_tokens": 0}})["error"]
        'model call failed: HTTP 401'
    """
    return {
        "id": traj["id"],
        "kind": traj["origin"].get("kind"),
        "status": traj["status"],
        "answer": traj["answer"],
        "error": traj.get("error"),
        "steps": len(traj["steps"]),
        "generated_tokens": traj["stats"]["generated_tokens"],
    }


def finished_work(state: ParallelMuseState) -> dict[str, Any]:
    """What a run-ending error of Stage 2 carries as its ``result``: the question, the trajectories,
    the reports so far and the stats.

    Example:
        >>> sorted(finished_work({"question": "2+2?", "trajectories": [], "run_id": "r"}).items())
        [('question', '2+2?'), ('reports', None), ('stats', None), ('trajectories', [])]
    """
    return {key: state.get(key) for key in ("question", "trajectories", "reports", "stats")}


@contextlib.contextmanager
def carrying(work: dict[str, Any]) -> Iterator[None]:
    """Around the aggregator's model call: a run-ending error leaves with ``work`` (this run's
    :func:`finished_work`) as its ``result``, or without a checkpointer the raise would take every
    trajectory and report with it.

    An instance that already carries another run's result (a model wrapper raising one stored error)
    keeps it, and this run raises a copy chained to it (:func:`~langgraph_parallelmuse.errors.with_result`).
    """
    try:
        yield
    except ParallelMuseError as exc:
        ended = with_result(exc, work)
        if ended is exc:
            raise
        raise ended from exc


def emit(event: str, **data: Any) -> None:
    """Send a progress event to the ``custom`` stream (a no-op outside a graph run)."""
    try:
        get_stream_writer()({"event": event, **data})
    except RuntimeError:  # called outside a graph run (e.g. a unit test of a node)
        pass


async def _engine_stats(model: Any) -> dict[str, Any] | None:
    """The counters of the in-process engine ``model`` runs on (``None``: it has none).

    The first access loads the weights, off the event loop: through the model's own async form where it
    has one, as :class:`~langgraph_parallelmuse.models.LocalChatModel` does, whose load a cancelled run
    does not wait for (``asyncio.run`` waits for ``asyncio.to_thread``'s: 40 s after Ctrl-C in the CLI).
    """
    if callable(counters := getattr(model, "aengine_stats", None)):
        return await counters()
    if callable(counters := getattr(model, "engine_stats", None)):
        return await asyncio.to_thread(counters)
    return None


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
    """Token, tool-call and outcome totals of the rollout stage.

    ``cached_prompt_tokens`` and ``conversation_cached_tokens`` are observed (what the backend
    reported as served from its prefix cache; ``cache_reported`` says whether it reports at all);
    ``reused_prefix_tokens`` is computed (the parents' prefixes the branches sent again).
    ``tool_errors``, ``tool_error_reasons``, ``invalid_turns`` and ``rejected_turns`` sum the
    trajectories' :func:`~langgraph_parallelmuse.agent.turn_problems`.
    """
    keys = (
        "generated_tokens",
        "prompt_tokens",
        "reused_prefix_tokens",
        "cached_prompt_tokens",
        "conversation_prompt_tokens",
        "conversation_cached_tokens",
        "tool_calls",
    )
    out: dict[str, Any] = {k: sum(t["stats"][k] for t in trajectories) for k in keys}
    out["cache_reported"] = any(t["stats"]["cache_reported"] for t in trajectories)
    # Counted again only for a trajectory stored before its stats held them (a run resumed across versions).
    problems = [t["stats"] if "tool_errors" in t["stats"] else turn_problems(t) for t in trajectories]
    for key in ("tool_errors", "invalid_turns", "rejected_turns"):
        out[key] = sum(p[key] for p in problems)
    out["tool_error_reasons"] = list(dict.fromkeys(r for p in problems for r in p["tool_error_reasons"]))[:MAX_REASONS]
    out["trajectories"] = len(trajectories)
    out["answered"] = sum(1 for t in trajectories if t["answer"])
    # stopped early, cancelled by consensus; out of turns or of context without an answer
    for status in ("failed", "stopped", "cancelled", "max_turns", "context_exhausted"):
        out[status] = sum(1 for t in trajectories if t["status"] == status)
    out["by_kind"] = {
        kind: sum(1 for t in trajectories if t["origin"].get("kind") == kind) for kind in ("initial", "branch", "fill")
    }
    return out


def report_input(trajectory: Trajectory) -> Trajectory:
    """What a report reads of a trajectory: all of it but the steps' token records.

    A ``Send`` payload is checkpointed twice (the task's write and the next checkpoint's pending
    sends), and the token logprobs are most of a trajectory's bytes; the reports read the steps'
    text, actions and token counts, never the logprobs (the state's ``trajectories`` keeps them).

    Example:
        >>> slim = report_input({"id": "t0", "steps": [{"text": "hi", "tokens": [{"token": "hi"}]}]})
        >>> slim["steps"]
        [{'text': 'hi', 'tokens': []}]
    """
    return {**trajectory, "steps": [{**step, "tokens": []} for step in trajectory["steps"]]}


def _model_name(model: BaseChatModel) -> str | None:
    return getattr(model, "model_name", None) or getattr(model, "model", None)


def describe_model(model: BaseChatModel) -> str:
    """Which model a message is about: its name and, for a server, its base URL.

    Example:
        >>> from langchain_openai import ChatOpenAI
        >>> describe_model(ChatOpenAI(model="smollm2", base_url="http://127.0.0.1:8000/v1", api_key="x"))
        "model 'smollm2' at http://127.0.0.1:8000/v1"
    """
    name = _model_name(model) or type(model).__name__
    url = getattr(model, "openai_api_base", None) or getattr(model, "base_url", None)
    return f"model {name!r}" + (f" at {url}" if url else "")


def failure_message(model: BaseChatModel, trajectories: Sequence[Trajectory]) -> str:
    """One message for a run whose every trajectory failed: how many, the distinct reasons, the model."""
    # One line, bounded: a server's error may be a whole HTML page.
    reasons = list(dict.fromkeys(one_line(t.get("error") or "unknown error", 300) for t in trajectories))
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    return (
        f"every trajectory failed ({len(trajectories)} of {len(trajectories)}): {shown}. {describe_model(model)}: "
        "check that the server is up, the base URL, the model name and the API key (CLI: --base-url, --model, "
        "OPENAI_API_KEY); then ask again on the same thread of a checkpointed graph, and the failed trajectories "
        "continue from their last finished step (CLI: the same command with --resume, when it ran with --db and "
        "--run-id)"
    )


def active_seconds(spans: Sequence[Sequence[Any]], stage: str | None = None) -> float:
    """Seconds covered by the nodes' ``[stage, start, end]`` spans (overlaps once), optionally of one stage.

    Time no node ran in (a crashed process before its resume) is not counted.

    Example:
        >>> active_seconds([["rollout", 0, 10], ["rollout", 5, 12], ["stage2", 100, 103]])
        15.0
    """
    total, reach = 0.0, float("-inf")
    for _, start, end in sorted(sp for sp in spans if stage is None or sp[0] == stage):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _timed(stage: str) -> Callable[[Callable], Callable]:
    """Record a node's wall-clock span in the state's ``spans`` (see :func:`active_seconds`)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        async def run(self: ParallelMuseNodes, arg: Any) -> dict[str, Any]:
            started = time.time()
            update = await method(self, arg)
            return {**update, "spans": [[stage, started, time.time()]]}

        return run

    return wrap


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
        >>> [s.node for s in nodes.launch_initial({"question": "2+2?", "run_id": "r", "settings": config.model_dump()})]
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
        self.guided_aggregate = guided_aggregate
        #: Whether the compiled graph pauses at a node (``create_parallelmuse``'s ``interrupt_before``/``_after``).
        self.paused = False
        #: The answer message's name: ``create_parallelmuse``'s ``name``, so two such nodes of one chat differ.
        self.name = "parallelmuse"
        self._limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._limits_lock = threading.Lock()  # runs on several threads' loops prune it together

    def guided(self, settings: ParallelMuseConfig) -> bool:
        """Whether the run's reports (and, unless the factory said otherwise, its aggregation) are
        guided: they are when its trajectories are (small local models)."""
        return isinstance(self.runner.driver_for(settings.driver), GuidedDriver)

    def settings(self, stored: dict[str, Any] | None = None) -> ParallelMuseConfig:
        """The run's settings.

        ``prepare`` resolves them (the factory config with the run's context applied) and stores
        them in the state; every later node passes that ``stored`` copy, so a resumed run keeps the
        settings it started with. A context that sets a different value on resume is an error.
        """
        try:
            runtime, configurable = get_runtime(), get_config().get("configurable")
        except RuntimeError:  # a node called outside a graph run (a unit test)
            runtime, configurable = None, None
        # update_state(..., as_node=...) runs that node's edges with no runtime: the stored settings route them.
        context = None if runtime is None else runtime.context
        if stored is None:
            misplaced = misplaced_settings(configurable, context)
            if misplaced:
                # A warning, not an error: configurable is shared with the parent app's own nodes,
                # whose keys may happen to share a setting's name.
                warnings.warn(
                    f"config['configurable'] sets {', '.join(f'{k}={v!r}' for k, v in misplaced.items())}, which "
                    f"ParallelMuse does not read: pass run settings as context={misplaced!r} (the graph's "
                    "context_schema); ignore this if those keys are meant for other parts of your app",
                    UserWarning,
                    stacklevel=2,
                )
            return resolve_config(self.config, context)
        try:
            settings = make_config(stored)
        except ConfigError as exc:
            # Written by an earlier version that took them (or by an update_state): no setting given now changes them.
            raise ConfigError(
                f"the settings stored with this run are refused now ({exc}): correct them on the thread with "
                "graph.update_state(config, {'settings': {...}}) and resume, or ask again on another thread_id"
            ) from exc
        # Compared validated: a parent app without this context_schema passes its raw values ("4").
        resolved = resolve_config(settings, context)
        # How many run at once changes no trajectory: a resumed run may lower it (after an overload).
        settings = make_config(settings, max_concurrency=resolved.max_concurrency)
        clash = [k for k in context_overrides(context) if getattr(resolved, k) != getattr(settings, k)]
        if clash:
            started = ", ".join(f"{k}={getattr(settings, k)!r}" for k in clash)
            raise ConfigError(
                f"this run started with {started}; resume it with the same settings, or start a new run "
                "(another thread_id)"
            )
        return settings

    def runner_identity(self) -> list[Any]:
        """What makes this graph's trajectories, beside the question and the settings (stable across
        processes, so a resumed run finds its threads; not the server's URL, which may move)."""
        runner, model = self.runner, self.model
        return [
            type(model).__name__,
            _model_name(model),
            model.name,
            sorted(t.name for t in runner.tools),
            runner.system_prompt,
            repr(runner.driver),  # a frozen dataclass: its settings, no address
        ]

    def limit(self, settings: ParallelMuseConfig) -> Bounds:
        """Trajectories/reports in flight: the factory's ``max_concurrency`` bounds every run on an event
        loop together (``batch`` too); a run whose context sets a lower value also keeps within that,
        shared by the runs that set the same value. A higher value cannot lift the factory's bound."""
        loop = asyncio.get_running_loop()
        with self._limits_lock:
            # A semaphore a task waited on holds its loop, so a closed loop never left this weak mapping:
            # each thread's asyncio.run of a run (a web service's request) kept its loop and semaphores.
            for closed in [other for other in self._limits if other.is_closed()]:
                del self._limits[closed]
            per_loop = self._limits.setdefault(loop, {})
        widest = self.config.max_concurrency
        values = sorted({min(settings.max_concurrency, widest), widest})
        for value in values:
            if value not in per_loop:
                per_loop[value] = asyncio.Semaphore(value)
        try:  # LangGraph's run config bounds one run's tasks; the online schedule runs all in one task
            in_run = get_config().get("max_concurrency")
        except RuntimeError:  # called outside a graph run
            in_run = None
        # The run's own bound is this run's alone (a batch's runs each have it); the narrower first: a run
        # waiting for its own bound holds no slot of the shared one.
        own = [asyncio.Semaphore(in_run)] if in_run and in_run < values[0] else []
        return Bounds(*own, *(per_loop[v] for v in values))

    def claim(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold a trajectory thread (``<run id>/*``: every thread of an online run) for this task alone:
        another run of the same run id waits for it (:class:`InFlight`).

        Keyed by the name alone, not by the saver too: langgraph-api may hand each run its own adapter
        object around one database. Two savers holding a thread of one name at once (two graphs alike
        in every part of the run id) only take turns.
        """
        return IN_FLIGHT.claim(name)

    @contextlib.contextmanager
    def scope(self, question: str) -> Iterator[None]:
        """Around a node's trajectories: calls routed by the question, and trajectory threads kept in
        this run's own checkpointer (the one LangGraph lends the node) unless the runner has one."""
        saver = (get_config().get("configurable") or {}).get(CONFIG_KEY_CHECKPOINTER)
        with routing_scope(question), lend_checkpointer(self.runner, saver):
            yield

    # ------------------------------------------------------------------ Stage 1

    async def prepare(self, state: ParallelMuseState) -> dict[str, Any]:
        started = time.time()
        question, message_id = question_from_input(state)
        settings = self.settings()
        self.runner.driver_for(settings.driver)  # a guided run on a model that cannot be guided fails here
        configurable = get_config().get("configurable") or {}
        record = configurable.get(RUN_RECORD)
        # The factory's pauses, or the run's own (invoke(..., interrupt_before=[...]), Studio's breakpoints).
        paused = self.paused or (isinstance(record, dict) and bool(record.get("paused")))
        if paused and configurable.get(CONFIG_KEY_CHECKPOINTER) is None:
            # LangGraph would stop at the pause and return the state so far as if the run had ended
            # (answer None), with nothing kept to resume from: the trajectories' work was lost.
            raise ConfigError(
                "this run pauses (interrupt_before/interrupt_after, the graph's or the run's) and has no checkpointer "
                "to resume from: pass create_parallelmuse(..., checkpointer=InMemorySaver()) or run it as a node of a "
                "checkpointed graph, with a thread_id"
            )
        parent_thread = configurable.get("thread_id")
        # The question, the settings, what else makes a trajectory (the model, the tools, the system
        # prompt, the driver) and, inside an app, the app's nodes around this graph name the run: the
        # same question asked again on the thread finds its finished trajectories; asked with other
        # settings, or by another graph on the thread (a small and a strong model side by side; two
        # ParallelMuse nodes of one app with other search backends), it samples anew instead of
        # reusing trajectories it did not make. The nodes are read from the checkpoint namespace
        # without task ids and without the counters LangGraph adds when a task retries a subgraph
        # (as its recast_checkpoint_ns does); a top-level run (CLI, Studio) has none, so its key is
        # what it was before nodes counted.
        parts = str(configurable.get("checkpoint_ns") or "").split("|")
        around = [part.split(":")[0] for part in parts if part and not part.isdigit()][:-1]
        key = json.dumps(
            [
                question,
                settings.model_dump(exclude={"max_concurrency"}),
                self.runner_identity(),
                *([around] if around else []),
            ],
            sort_keys=True,
            default=str,
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:10]
        # Deterministic ids under a checkpointed parent thread make a resumed run find its finished
        # trajectories (a run checkpointer, or the runner's own trajectory_checkpointer); otherwise every run
        # gets fresh threads (a thread_id given for tracing alone replayed the first run's trajectories from
        # the runner's in-memory saver).
        checkpointed = parent_thread and (
            configurable.get(CONFIG_KEY_CHECKPOINTER) is not None or self.runner.keeps_trajectories
        )
        run_id = f"{parent_thread}:{digest}" if checkpointed else f"run-{uuid.uuid4().hex[:12]}:{digest}"
        if isinstance(record, dict):
            # No saver keeps this run and none of the runner's: nothing can resume it, so its threads end with it.
            record["drop"] = None if checkpointed or self.runner.keeps_trajectories else run_id
        emit("run_started", question=question, **{k: getattr(settings, k) for k in ("n", "m", "k", "t", "mode")})
        stats: dict[str, Any] = {"config": settings.model_dump(), "timeline": {"start": time.time()}}
        engine_start: dict[str, Any] = {}
        if (counters := await _engine_stats(self.model)) is not None:
            engine_start = {**counters, "process": _PROCESS}
        # A checkpointed chat thread keeps the previous question's records: start this run clean.
        return {
            "question": question,
            "asked": {
                "question": question,
                "message_id": message_id,
                "settings": settings.model_dump(exclude=_NOT_IN_TRAJECTORIES),
            },
            "run_id": run_id,
            "settings": settings.model_dump(),
            "spans": Overwrite([["rollout", started, time.time()]]),
            "engine_start": engine_start,
            "stats": Overwrite(stats),
            "trajectories": Overwrite([]),
            "reports": Overwrite([]),
            "picks": Overwrite([]),
            "crossovers": Overwrite([]),
            "round": 0,
            "answer": None,
            "answer_source": "none",
        }

    @staticmethod
    def _send(node: str, state: ParallelMuseState, job: Job) -> Send:
        # The job names its thread and, for a branch, the parent's thread and checkpoint: the
        # payload never carries a trajectory.
        return Send(node, {"question": state["question"], "settings": state["settings"], "job": job})

    @staticmethod
    def run_id(state: ParallelMuseState) -> str:
        """The run id naming the trajectory threads: ``prepare``'s, unless the question or a setting the
        trajectories depend on was edited since (``update_state`` on a checkpoint after ``prepare``, then a
        fork from it): the threads ``prepare`` named hold the trajectories of what it saw, and the fork
        answered from them without a model call. A setting no trajectory depends on
        (``_NOT_IN_TRAJECTORIES``) is no such edit: the fork keeps the finished trajectories.

        Example:
            >>> state = {"run_id": "chat:ab12", "question": "Who?", "asked": {"question": "Where?"}}
            >>> ParallelMuseNodes.run_id(state)
            'chat:ab12~d991a24e8e'
            >>> asked = {"question": "Who?", "settings": {"temperature": 0.6}}
            >>> state = {"run_id": "chat:ab12", "question": "Who?", "asked": asked}
            >>> ParallelMuseNodes.run_id({**state, "settings": {"temperature": 0.1}})
            'chat:ab12~80a14cdecf'
            >>> ParallelMuseNodes.run_id({**state, "settings": {"max_concurrency": 2, "report_form": "graph"}})
            'chat:ab12'
        """
        asked = state.get("asked") or {}
        if asked.get("question") is None:
            return state["run_id"]
        edits = {k: now for k, (_, now) in _edits(state).items()}
        if asked["question"] == state["question"] and not edits:
            return state["run_id"]
        # An edited question alone keys by itself, as before settings counted: such a fork finds its threads.
        key = json.dumps([state["question"], edits], sort_keys=True, default=str) if edits else state["question"]
        return f"{state['run_id']}~{hashlib.sha256(key.encode()).hexdigest()[:10]}"

    @classmethod
    def trajectories(cls, state: ParallelMuseState) -> list[Trajectory]:
        """The state's trajectories, checked to be this run's: each in a thread of :meth:`run_id`.

        A fork from a checkpoint after the rollout began (the pause before ``aggregate`` or
        ``branch_rollout``, a finished run written ``as_node="prepare"``) whose question or trajectory
        settings were edited held the old ones' trajectories: it answered the edited question from them
        (the answer message saying it answered that question) or mixed them with new ones, while its
        stats named the edited settings. Such a fork is refused before any model call.

        Raises:
            ConfigError: A trajectory ran under another run id; the message says where to fork from.

        Example:
            >>> state = {"run_id": "chat:ab12", "question": "Who?", "asked": {"question": "Who?"},
            ...          "trajectories": [{"id": "t0", "thread_id": "chat:ab12/t0"}]}
            >>> [t["id"] for t in ParallelMuseNodes.trajectories(state)]
            ['t0']
            >>> ParallelMuseNodes.trajectories({**state, "question": "Where?"})
            Traceback (most recent call last):
            ...
            langgraph_parallelmuse.errors.ConfigError: this checkpoint's trajectories (t0) were sampled for ...
        """
        trajectories = state.get("trajectories") or []
        if not trajectories or "run_id" not in state:  # a node called alone, on a state no prepare wrote
            return trajectories
        run_id = cls.run_id(state)
        # A record without its thread (none is written so) is given the benefit of the doubt.
        foreign = [t for t in trajectories if not str(t.get("thread_id") or f"{run_id}/").startswith(f"{run_id}/")]
        if not foreign or _repaired(state):
            return trajectories
        shown = ", ".join(t["id"] for t in foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise ConfigError(
            f"this checkpoint's trajectories ({shown}) were sampled for another question or other settings than "
            f"its state's now (question {state['question']!r:.80}{_edited(state)}): a fork that edits the question "
            "or a setting the trajectories depend on samples its own from the checkpoint after prepare, the one "
            "whose next is initial_rollout or online_rollout (graph.get_state_history): update_state that one "
            "instead; from a "
            "later checkpoint edit only what Stage 2 reads (aggregation, report_form, max_report_tokens, "
            "max_aggregate_tokens) or max_concurrency"
        )

    def launch_initial(self, state: ParallelMuseState) -> list[Send]:
        settings = self.settings(state["settings"])
        self.trajectories(state)  # a fork written as prepare over another run's trajectories
        if settings.branching == "online":
            payload = {"question": state["question"], "settings": state["settings"], "run_id": self.run_id(state)}
            return [Send("online_rollout", payload)]
        jobs = first_wave(settings, run_id=self.run_id(state))
        return [self._send("initial_rollout", state, job) for job in jobs]

    @_timed("rollout")
    async def rollout(self, payload: dict[str, Any]) -> dict[str, Any]:
        job: Job = payload["job"]
        settings = self.settings(payload["settings"])
        with self.scope(payload["question"]):
            # Claimed before the slot: a job waiting for another run's hold on its thread holds no slot.
            async with self.claim(job["thread_id"]), self.limit(settings):
                emit("trajectory_started", id=job["id"], kind=job["origin"]["kind"], step=job["origin"].get("step"))
                traj = await self.runner.run_job(job, question=payload["question"], config=settings)
        emit("trajectory_finished", **finished_event(traj))
        return {"trajectories": [traj]}

    @_timed("rollout")
    async def online_rollout(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The whole rollout stage with online branching: branches start while their parent runs.

        One node, because LangGraph starts a superstep's ``Send`` tasks only when the previous
        superstep has ended; every trajectory still runs in its own checkpointed thread, and the
        progress events (``branch_picked`` at the fork) stream as they happen.
        """
        settings = self.settings(payload["settings"])

        def on_event(event: str, **data: Any) -> None:
            if event == "trajectory_finished":
                data = finished_event(data["trajectory"])
            emit(event, **data)

        # One node runs every trajectory of the run: its threads are claimed whole (see InFlight).
        with self.scope(payload["question"]):
            async with self.claim(f"{payload['run_id']}/*"):
                trajectories, picks = await online_rollout(
                    self.runner,
                    payload["question"],
                    config=settings,
                    run_id=payload["run_id"],
                    on_event=on_event,
                    limit=self.limit(settings),
                )
        return {"trajectories": trajectories, "picks": picks, "round": 1}

    @_timed("rollout")
    async def select_branches(self, state: ParallelMuseState) -> dict[str, Any]:
        """The uncertainty node, once per round: score the latest trajectories, pick checkpoints."""
        settings, trajectories = self.settings(state["settings"]), self.trajectories(state)
        if len(trajectories) >= settings.rollout_n:
            return {}
        round = state.get("round", 0) + 1
        picks = pick_branches(trajectories, settings, round=round)
        for pick in picks:
            emit("branch_picked", **pick)
        stamp = "selected" if round == 1 else f"selected_round{round}"
        return {"round": round, "picks": picks, "stats": {"timeline": {stamp: time.time()}}}

    def launch_branches(self, state: ParallelMuseState) -> list[Send] | str:
        settings, trajectories = self.settings(state["settings"]), self.trajectories(state)
        if len(trajectories) >= settings.rollout_n:
            return "collect"
        round = state["round"]
        picks = [p for p in state.get("picks", []) if p["round"] == round]
        jobs = next_wave(trajectories, picks, settings, round=round, run_id=self.run_id(state))
        # next_wave tops up to N, so jobs is never empty here; "collect" keeps the run alive if it were.
        return [self._send("branch_rollout", state, job) for job in jobs] or "collect"

    @_timed("rollout")
    async def collect(self, state: ParallelMuseState) -> dict[str, Any]:
        """Sum up the rollout stage; a run whose every trajectory failed stops here, with its reasons."""
        trajectories, settings = self.trajectories(state), self.settings(state["settings"])
        stats = {
            # prepare's, unless a fork edited them (update_state): the settings this rollout ran with.
            "config": settings.model_dump(),
            "rollout": rollout_summary(trajectories),
            "budget": budget_stats(trajectories, settings),
            "timeline": {"rolled_out": time.time()},
        }
        if trajectories and all(t["status"] == "failed" for t in trajectories):
            result = {"question": state["question"], "trajectories": trajectories, "stats": stats}
            raise RolloutFailedError(failure_message(self.model, trajectories), result=result)
        asked = state.get("asked") or {}
        if asked.get("question") is None or "settings" in asked:
            return {"stats": stats}
        # A run prepared before ``asked`` kept its settings: they are read from stats["config"], which this
        # rewrites, so they are kept here for the run ids of the nodes after this one (crossover).
        return {"stats": stats, "asked": {**asked, "settings": _prepared_settings(state)}}

    # ------------------------------------------------------------------ Stage 2

    def launch_compress(self, state: ParallelMuseState) -> list[Send] | str:
        if self.settings(state["settings"]).aggregation != "parallelmuse":
            return "aggregate"
        answered = [t for t in self.trajectories(state) if t["answer"]]
        payload = {"question": state["question"], "settings": state["settings"]}
        # With nothing to compress the reserved crossover slots still run (as fills): N stays N.
        after = "select_crossover" if self.settings(state["settings"]).crossover else "aggregate"
        return [Send("compress", {**payload, "trajectory": report_input(t)}) for t in answered] or after

    @_timed("stage2")
    async def compress(self, job: dict[str, Any]) -> dict[str, Any]:
        settings, traj = self.settings(job["settings"]), job["trajectory"]
        with routing_scope(job["question"]):
            async with self.limit(settings):
                report = await write_report(
                    self.model, job["question"], traj, config=settings, guided=self.guided(settings)
                )
        emit(
            "report_written",
            trajectory_id=traj["id"],
            status=report["status"],
            answer=report["answer"],
            tokens=report["tokens"],
            problem=report.get("problem"),
        )
        return {"reports": [report]}

    # ------------------------------------------------------------------ crossover (beyond the paper)

    @_timed("stage2")
    async def select_crossover(self, state: ParallelMuseState) -> dict[str, Any]:
        """After the reports: the pairs of trajectories to cross (``crossover`` > 0; none after a
        consensus stop, which starts no more trajectories). Warns when the graph reports or the
        crossover rely on tool outputs the information-state graph cannot read."""
        settings, trajectories = self.settings(state["settings"]), self.trajectories(state)
        crossing = bool(settings.crossover) and not consensus_stop(trajectories, settings)
        graph_reports = settings.report_form == "graph"
        if graph_reports or crossing:
            uses = " and ".join(u for u, on in (("report_form='graph'", graph_reports), ("crossover", crossing)) if on)
            warn_unreadable(trajectories, uses=uses)
        if settings.crossover and not crossing:
            return {"stats": {"crossover": {"skipped": "consensus"}}}
        if not crossing:
            return {}
        pairs = pick_pairs(state["question"], trajectories, count=settings.crossover)
        for pair in pairs:
            emit("crossover_picked", **pair)
        return {"crossovers": pairs}

    def launch_crossover(self, state: ParallelMuseState) -> list[Send] | str:
        # Checked first: an edit at the pause before aggregate (update_state runs this edge) is refused when made.
        settings, trajectories = self.settings(state["settings"]), self.trajectories(state)
        if not settings.crossover:
            return "aggregate"
        jobs = crossover_wave(trajectories, state.get("crossovers", []), settings, run_id=self.run_id(state))
        return [self._send("crossover_rollout", state, job) for job in jobs] or "aggregate"

    async def crossover_rollout(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One crossover trajectory (or the fill of an untaken slot) and its report."""
        update = await self.rollout(payload)
        traj = update["trajectories"][0]
        if not traj["answer"]:
            return update
        report = await self.compress({**payload, "trajectory": traj})
        return {**update, "reports": report["reports"], "spans": update["spans"] + report["spans"]}

    async def aggregate(self, state: ParallelMuseState) -> dict[str, Any]:
        started = time.time()
        settings = self.settings(state["settings"])
        trajectories, reports = self.trajectories(state), state.get("reports", [])
        # Written again here: a fork after collect that edits only Stage 2's settings (aggregation) runs no collect.
        stats: dict[str, Any] = {"config": settings.model_dump(), "timeline": {"end": time.time()}}
        # A failed call falls back to the vote; a setting every call would meet ends the run.
        with carrying(finished_work(state)), routing_scope(state["question"]):
            async with self.limit(settings):
                choice = await choose_answer(
                    self.aggregator,
                    state["question"],
                    trajectories,
                    reports,
                    config=settings,
                    guided=self.guided(settings) if self.guided_aggregate is None else self.guided_aggregate,
                )
        stats["infograph"] = redundancy_summary(state["question"], trajectories)
        if settings.crossover:
            skipped = (state.get("stats") or {}).get("crossover", {}).get("skipped")
            stats["crossover"] = crossover_stats(trajectories, state.get("crossovers", []), settings, skipped=skipped)
        if settings.aggregation == "parallelmuse":
            stats["compress"] = compression_stats(reports)
            stats["aggregate"] = {
                "tokens": choice.tokens,
                "prompt_tokens": choice.prompt_tokens,
                "cached_prompt_tokens": choice.cached_prompt_tokens,
                "error": choice.error,
                "note": choice.note,
            }
        spans = [*state.get("spans", []), ["stage2", started, time.time()]]
        stats["seconds"] = {
            "rollout": active_seconds(spans, "rollout"),
            "stage2": active_seconds(spans, "stage2"),
            "total": active_seconds(spans),
        }
        if (now := await _engine_stats(self.model)) is not None:
            start = state.get("engine_start") or {}
            if start.get("process") == _PROCESS:
                stats["engine"] = engine_delta(start, now)
            else:  # resumed in another process: its counters began at zero, without the first part
                stats["engine"] = {**engine_delta({}, now), "partial": "the run resumed in another process"}
        emit("answer", answer=choice.answer, source=choice.source, error=choice.error)
        text = choice.answer if choice.answer is not None else f"No answer: {choice.error or 'no trajectory answered'}."
        return {
            "answer": choice.answer,
            "answer_source": choice.source,
            "stats": stats,
            "messages": [
                AIMessage(
                    text,
                    name=self.name,
                    # The question it answers: a parent app's state keeps this message, not ``asked``.
                    response_metadata={"answer_source": choice.source, ANSWERED_KEY: state["question"]},
                )
            ],
        }
