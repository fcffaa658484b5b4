"""Benchmark harness: ParallelMuse against its baselines at an equal budget, on the same samples.

Per question, N from-scratch trajectories are sampled once. They serve every method that needs
from-scratch samples (no scaling, majority, DeepConf weighted vote, max #tool calls, aggregation
only), trajectory 0 is the initial trajectory M=1 of partial rollout, and the fill-ins of partial
rollout are from-scratch trajectories 1, 2, … (they are from-scratch samples by definition), so
differences between methods are paired. Each partial-rollout mode runs the graph's schedule
(:func:`~langgraph_parallelmuse.schedule.partial_rollout`) and adds only its branches.
Reports are written once per trajectory and shared by every method that aggregates it. As in the
graph, at most ``max_concurrency`` (``--set``) trajectories or reports of a question are in flight.

Results are appended to a JSONL file one question at a time; a rerun skips finished questions.
A question whose every trajectory of a set failed (the model could not be called: every from-scratch
sample, or every branch a partial-rollout mode ran), whose every report or an aggregation's model call
failed with the server down, or whose judging failed (the judge could not be called), is not recorded:
a rerun runs it again.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.concurrency import gather_all
from langgraph_parallelmuse.config import ParallelMuseConfig, make_config
from langgraph_parallelmuse.driver import GuidedDriver, call_key, pick_driver
from langgraph_parallelmuse.errors import ConfigError, CorpusError, RolloutFailedError
from langgraph_parallelmuse.eval.datasets import QAItem
from langgraph_parallelmuse.eval.judge import JudgeError, llm_judge
from langgraph_parallelmuse.eval.scoring import retrieval_recall, score_answer
from langgraph_parallelmuse.eval.stats import bootstrap_ci, format_diff, paired_bootstrap_diff, within_noise
from langgraph_parallelmuse.files import replacing
from langgraph_parallelmuse.lineage import Pick
from langgraph_parallelmuse.protocol import one_line
from langgraph_parallelmuse.retry import is_transient_name
from langgraph_parallelmuse.schedule import run_schedule
from langgraph_parallelmuse.stage2 import choose_answer, write_report
from langgraph_parallelmuse.state import Trajectory

METRICS = ("em", "f1", "contains")


@dataclass(frozen=True)
class Method:
    """A method the bench can score, and which shared stages it needs."""

    description: str
    per_mode: bool = False  # one entry per partial-rollout mode: ``{name}_{mode}``
    partial: bool = False  # needs the partial-rollout trajectories
    reports: bool = False  # needs compressed reports


METHODS: dict[str, Method] = {
    "no_scaling": Method("mean score of the single from-scratch trajectories"),
    "majority": Method("majority vote over the N from-scratch answers"),
    "weighted": Method("DeepConf weighted vote over the N from-scratch answers"),
    "max_tool_calls": Method("answer of the from-scratch trajectory with the most tool calls"),
    "aggregation_only": Method("compressed-report aggregation over the N from-scratch trajectories", reports=True),
    "partial": Method("partial rollout, majority-voted", per_mode=True, partial=True),
    "parallelmuse": Method(
        "partial rollout + compressed-report aggregation", per_mode=True, partial=True, reports=True
    ),
}


# The ParallelMuseConfig fields BenchSettings sets itself (crossover: off), and how to choose each.
_OWN_FIELDS = {
    "n": "use --n",
    "m": "M is 1 in the bench",
    "k": "use --k",
    "t": "use --t",
    "mode": "use --modes",
    "estimator": "use --estimator",
    "seed": "use --seed",
    "max_turns": "use --max-turns",
    # Crossover trajectories follow the reports inside N; the bench's paired sets have no place for
    # them (its baselines would reject the setting, its report methods would run N - crossover).
    "crossover": "the bench runs none; crossover is measured by benchmarks/infograph.py",
    # A partial mode's initial and fill trajectories are the bench's from-scratch samples, run
    # without stops, so a stop setting would reach only the branches and its figures would mislead.
    **dict.fromkeys(
        ("early_stop", "consensus"),
        "the partial modes reuse the from-scratch samples; stops are measured by benchmarks/online_rollout.py",
    ),
    # Each method's record sets its own (majority, weighted, parallelmuse, ...): a value given here would
    # be recorded in every result's settings and applied to none.
    "aggregation": "the bench runs every aggregation method it is asked for: use --methods",
}


@dataclass(frozen=True)
class BenchSettings:
    """What to run per question (paper defaults: N=8, M=1, k=2, T=3).

    Raises:
        ConfigError: An unknown method, or settings that make an invalid ParallelMuse config.

    Example:
        >>> BenchSettings(methods=("majority", "parallelmuse"), modes=("exploration",)).method_names()
        ['majority', 'parallelmuse_exploration']
    """

    n: int = 8
    k: int = 2
    t: int = 3
    modes: tuple[str, ...] = ("exploration", "reasoning", "mixed")
    methods: tuple[str, ...] = tuple(METHODS)
    estimator: str = "nll"
    seed: int = 0
    setting: str = "distractor"  # or "open": the whole corpus
    max_turns: int = ParallelMuseConfig.model_fields["max_turns"].default
    # Which model answered and which judged: a rerun with another model or judge must not continue
    # a table measured with the first (the CLI writes its flags here, credentials redacted).
    model: str = "embedded"
    judge: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more ParallelMuseConfig fields
    # Which texts the tools searched, as the CLI fingerprints its --corpus files: a rerun on another
    # corpus must not continue a table measured on the first (None: not given).
    corpus: str | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown bench method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}")
        if fixed := [f for f in _OWN_FIELDS if f in self.extra]:
            flags = "; ".join(f"{f}: {_OWN_FIELDS[f]}" for f in fixed)
            raise ConfigError(f"--set {', '.join(fixed)}: not taken from --set ({flags})")
        if "none" in self.modes:
            raise ConfigError("modes: 'none' is from-scratch sampling, which the bench always runs; drop it")
        self.config()
        # A mode's config holds the partial-rollout budget, which no other method spends.
        for mode in self.modes if self.needs("partial") else ():
            self.config(mode)

    def config(self, mode: str = "none") -> ParallelMuseConfig:
        """The ParallelMuse config of one partial-rollout mode (``none``: from-scratch sampling)."""
        extra = dict(self.extra)
        if mode == "none":  # branching-only settings do not apply to from-scratch sampling
            extra.update(rounds=1, calibration=None, branching="post_hoc")
        return make_config(
            n=self.n,
            m=1,
            k=self.k,
            t=self.t,
            mode=mode,
            estimator=self.estimator,
            seed=self.seed,
            max_turns=self.max_turns,
            **extra,
        )

    def needs(self, stage: str) -> bool:
        """Whether any selected method needs ``stage`` (``partial`` or ``reports``)."""
        return any(getattr(METHODS[m], stage) for m in self.methods)

    def method_names(self) -> list[str]:
        """The method entries each question record will hold."""
        return [f"{m}_{mode}" if METHODS[m].per_mode else m for m in self.methods for mode in self._modes(m)]

    def _modes(self, method: str) -> tuple[str, ...]:
        return self.modes if METHODS[method].per_mode else ("",)


def documents_seen(traj: Trajectory, kind: str | None = None) -> list[str]:
    """The documents a trajectory opened (``visit``) or was shown: a hit's ``(id: …)`` line must be in
    the observation, which the agent cuts at ``max_observation_chars`` (a tool lists every hit).

    Args:
        traj: A trajectory.
        kind: Only the observations of this tool (``"visit"``: the documents opened).

    Example:
        >>> documents_seen({"observations": [{"name": "search", "content": "[1] A (id: d1)", "doc_ids": ["d1", "d2"]}]})
        ['d1']
    """
    return [
        d
        for o in traj["observations"]
        if kind is None or o["name"] == kind
        for d in o.get("doc_ids", [])
        if o["name"] == "visit" or f"(id: {d})" in o["content"]
    ]


def well_formed(traj: Trajectory) -> bool:
    """Whether a trajectory followed the protocol: it searched at least once and gave an answer.

    A search whose tool failed counts: the agent made the call the protocol asks for.

    Example:
        >>> well_formed({"answer": "Paris", "observations": [{"name": "search", "error": False}]})
        True
        >>> well_formed({"answer": "Paris", "observations": [{"name": "visit", "error": False}]})
        False
    """
    return bool(traj["answer"]) and any(o["name"] == "search" for o in traj["observations"])


_COST_KEYS = ("generated_tokens", "prompt_tokens", "reused_prefix_tokens", "cached_prompt_tokens", "tool_calls")


def _cost(trajs: Sequence[Trajectory], reports: dict[str, dict] | None = None) -> dict[str, float]:
    out = {k: float(sum(t["stats"][k] for t in trajs)) for k in _COST_KEYS}
    if reports is not None:
        out["report_tokens"] = float(sum(reports[t["id"]]["tokens"] for t in trajs if t["id"] in reports))
    return out


def _mean_single(group: Sequence[Trajectory], answers: Sequence[str]) -> dict[str, float]:
    """The mean score of the group's single trajectories ("no scaling")."""
    per = [score_answer(t["answer"], answers) for t in group]
    return {m: sum(p[m] for p in per) / len(per) for m in METRICS}


async def _judge_methods(
    judge: BaseChatModel, item: QAItem, methods: dict[str, dict], trajectories: dict[str, Trajectory]
) -> None:
    """Add the judge's verdict to every method: ``judge`` is 1.0 (the answer matches the gold) or 0.0,
    ``None`` when the judge's reply held no readable verdict, and ``judge_unreadable`` counts those.

    A single-trajectory mean ("no scaling") judges each of its trajectories: ``judge`` is the mean of
    the readable verdicts (``None`` if none was), ``judge_unreadable`` the trajectories whose was not.
    """
    verdicts: dict[str, float | None] = {}

    async def verdict(answer: str | None) -> float | None:
        key = " ".join((answer or "").lower().split())
        if key not in verdicts:  # one judge call per distinct answer
            said = await llm_judge(judge, item.question, answer, item.answers)
            verdicts[key] = None if said is None else float(said)
        return verdicts[key]

    for rec in methods.values():
        if rec["answer"] is not None or "source" in rec:
            scores = [await verdict(rec["answer"])]
        else:
            scores = [await verdict(trajectories[i]["answer"]) for i in rec["trajectories"]]
        # Unreadable is not wrong: a judge that answers out of format would score every method 0.
        readable = [score for score in scores if score is not None]
        rec["judge"] = sum(readable) / len(readable) if readable else None
        rec["judge_unreadable"] = len(scores) - len(readable)


def _label_branch(trajectory: Trajectory, mode: str, picks: list[Pick]) -> Trajectory:
    """``trajectory`` as this mode's record shows it: a branch gets a mode-prefixed id and the region
    and score of the pick that forked it in this mode; from-scratch trajectories are unchanged."""
    origin = trajectory["origin"]
    if origin.get("kind") != "branch":
        return trajectory
    pick = next(p for p in picks if (p["parent"], p["step"]) == (origin["parent"], origin["step"]))
    return {
        **trajectory,
        "id": f"{mode[:3]}.{trajectory['id']}",
        "origin": {**origin, "region": pick["region"], "score": pick["score"]},
    }


@dataclass
class _Rollouts:
    """The trajectory sets of one question: ``scratch`` and ``partial_{mode}``, with picks and timings."""

    sets: dict[str, list[Trajectory]]
    picks: dict[str, list[list[Any]]]
    timings: dict[str, float]


def _check_not_all_failed(item: QAItem, what: str, group: Sequence[Trajectory]) -> None:
    """Stop a question when every trajectory of one of its sets failed (the model could not be
    called), as the graph's ``collect`` stops such a run: its scores would be the outage's. A set
    where only some failed goes on with the others, as the graph's run does.

    Args:
        item: The question.
        what: The trajectories of ``group``, as the message names them (``"from-scratch trajectory"``).
        group: The trajectories the set ran itself (a partial mode's, without the samples it reuses).

    Raises:
        RolloutFailedError: Every trajectory of ``group`` failed; the message gives the first's error.
    """
    if group and all(t["status"] == "failed" for t in group):
        first = one_line(group[0].get("error") or "no error recorded", 300)
        raise RolloutFailedError(
            f"every {what} failed ({len(group)} of {len(group)}), the first: {first}",
            result={"id": item.id, "trajectories": list(group)},
        )


# How Stage 2 records a model call that raised, before the error's "Name: message": a report's
# problem (compress.report_attempts) and an aggregation's error (aggregate.aggregate_reports).
_REPORT_CALL_FAILED = "the model call failed: "
_AGGREGATOR_CALL_FAILED = "the aggregator's model call failed: "


def _outage(error: str | None, prefix: str) -> str | None:
    """The ``Name: message`` of a model call that failed because its server was down, else ``None``.

    Down as :func:`~langgraph_parallelmuse.retry.is_transient` judges an exception (a refused or
    dropped connection, a timeout, a 5xx, a 429), after the call's retries. Stage 2 keeps only the
    error's text, so the exception is judged by its class name
    (:func:`~langgraph_parallelmuse.retry.is_transient_name`).
    A reply that was junk records no such error, nor is a request the server refused (a 400, met
    again at every rerun) an outage: both stay the question's result, as in the graph's run.

    Args:
        error: A report's ``problem`` or an aggregation's ``error``.
        prefix: How that stage records a failed call.

    Example:
        >>> _outage("the model call failed: ConnectionError: Connection refused", _REPORT_CALL_FAILED)
        'ConnectionError: Connection refused'
        >>> _outage("the model call failed: BadRequestError: prompt refused", _REPORT_CALL_FAILED) is None
        True
    """
    if not error or not error.startswith(prefix):
        return None
    said = error[len(prefix) :]
    return said if is_transient_name(said.split(":", 1)[0]) else None


def _check_reports_reached(item: QAItem, reports: dict[str, dict]) -> None:
    """Stop a question when every report fell back because its server was down (:func:`_outage`): the
    aggregation methods' scores would be the outage's (answer-only reports, or the majority vote).

    Raises:
        RolloutFailedError: Every report's model call failed with an outage; the message gives the first's.
    """
    down = [
        said
        for r in reports.values()
        if r["status"] == "fallback" and (said := _outage(r.get("problem"), _REPORT_CALL_FAILED))
    ]
    if reports and len(down) == len(reports):
        raise RolloutFailedError(
            f"every report's model call failed ({len(down)} of {len(reports)}), the first: {one_line(down[0], 300)}",
            result={"id": item.id, "reports": list(reports.values())},
        )


async def _rollouts(
    runner: RolloutRunner, item: QAItem, settings: BenchSettings, note: Callable[[str], None]
) -> _Rollouts:
    started = time.perf_counter()
    scratch, _ = await run_schedule(runner, item.question, config=settings.config(), run_id=f"{item.id}/scratch")
    _check_not_all_failed(item, "from-scratch trajectory", scratch)  # before a branch is sent to a server that is down
    sampled = {t["thread_id"] for t in scratch}
    out = _Rollouts({"scratch": scratch}, {}, {"scratch_rollout": time.perf_counter() - started})
    note(f"{settings.n} from-scratch trajectories")
    for mode in settings.modes if settings.needs("partial") else ():
        t0 = time.perf_counter()
        # The graph's own schedule; its from-scratch jobs (initial, fills) are the samples above.
        # One run id for every post-hoc mode: a branch id names its checkpoint and seeds, so a branch an
        # earlier mode already ran is the same sample and the runner returns it finished. Online, a run
        # takes the forks an earlier run of its id took (resume): each mode has its own.
        config = settings.config(mode)
        run_id = f"{item.id}/partial" + (f"-{mode}" if config.branching == "online" else "")
        group, picks = await run_schedule(runner, item.question, config=config, run_id=run_id, reuse=scratch)
        # Only the trajectories the mode ran itself: the from-scratch samples it reuses answered above, so
        # with them counted a server that died after those let every branch fail and the question be recorded.
        ran = [t for t in group if t["thread_id"] not in sampled]
        _check_not_all_failed(item, f"{mode} partial-rollout branch", ran)
        out.timings[f"branches_{mode}"] = time.perf_counter() - t0
        out.picks[mode] = [[p["step"], p["region"], p["score"], p["round"]] for p in picks]
        # Branch ids repeat across modes; this record holds every mode's trajectories, each branch
        # labelled with the region that picked it in this mode.
        out.sets[f"partial_{mode}"] = [_label_branch(t, mode, picks) for t in group]
        note(f"{sum(t['origin'].get('kind') == 'branch' for t in group)} {mode} branches")
    return out


async def _reports(
    model: BaseChatModel, item: QAItem, trajectories: Sequence[Trajectory], *, config: ParallelMuseConfig, guided: bool
) -> dict[str, dict]:
    """One report per trajectory id, each distinct thread compressed once (a branch shared by several
    modes is one trajectory), by the graph's own map step."""
    unique = {t["thread_id"]: t for t in trajectories if t["answer"]}
    # As the graph's compress nodes: at most max_concurrency reports in flight, not every trajectory's at once.
    limit = asyncio.Semaphore(config.max_concurrency)

    async def report(t: Trajectory) -> dict:
        async with limit:
            return await write_report(model, item.question, t, config=config, guided=guided)

    done = await gather_all(*(report(t) for t in unique.values()))
    by_thread = dict(zip(unique, done, strict=True))
    return {
        t["id"]: {**by_thread[t["thread_id"]], "trajectory_id": t["id"]}
        for t in trajectories
        if t["thread_id"] in by_thread
    }


async def _method_record(
    model: BaseChatModel,
    item: QAItem,
    name: str,
    family: Method,
    group: list[Trajectory],
    reports: dict[str, dict],
    *,
    base: ParallelMuseConfig,
    guided: bool,
) -> dict[str, Any]:
    """One method's answer by the graph's own reduce step (``parallelmuse`` or a baseline), scored."""
    ids = [t["id"] for t in group]
    if name == "no_scaling":
        rec: dict[str, Any] = {"answer": None, **_mean_single(group, item.answers)}
    else:
        aggregation = "parallelmuse" if family.reports else "majority" if family.partial else name
        own = [reports[i] for i in ids if i in reports]
        config = make_config(base, aggregation=aggregation)
        choice = await choose_answer(model, item.question, group, own, config=config, guided=guided)
        if said := _outage(choice.error, _AGGREGATOR_CALL_FAILED):
            # Recorded, the outage's majority fallback would stand as this method's score.
            raise RolloutFailedError(
                f"the aggregator's model call failed ({name}): {one_line(said, 300)}", result={"id": item.id}
            )
        rec = {"answer": choice.answer, "source": choice.source, **score_answer(choice.answer, item.answers)}
        if family.reports:
            rec["aggregate_tokens"] = choice.tokens
    return {**rec, "trajectories": ids, "cost": _cost(group, reports if family.reports else None)}


def _trajectory_record(t: Trajectory, item: QAItem) -> dict[str, Any]:
    support = item.supporting_doc_ids
    return {
        "answer": t["answer"],
        "status": t["status"],
        "origin": t["origin"],
        "stats": t["stats"],
        "uncertainty": t["uncertainty"],
        "steps": len(t["steps"]),
        # [step, tool + normalised arguments] of every tool call: sibling diversity is read off these.
        "calls": [[s["index"], call_key(s["action"])] for s in t["steps"] if s["action"].get("type") == "tool_call"],
        "well_formed": well_formed(t),
        "recall_seen": retrieval_recall(documents_seen(t), support) if support else None,
        "recall_opened": retrieval_recall(documents_seen(t, "visit"), support) if support else None,
        **score_answer(t["answer"], item.answers),
    }


async def run_question(
    model: BaseChatModel,
    tools: Sequence,
    item: QAItem,
    settings: BenchSettings,
    *,
    guided: GuidedDriver | None = None,
    judge: BaseChatModel | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Run every method on one question and score it. Returns one JSON-able record.

    With a ``judge`` model every answer also gets a ``judge`` score (1.0 when the judge says it
    matches the gold answer; ``None`` for an unreadable verdict, counted in ``judge_unreadable``).

    Raises:
        RolloutFailedError: Every trajectory of the from-scratch set, or every branch a partial-rollout
            mode ran, failed (the rule of the graph's run); or every report's, or an aggregation's,
            model call failed with its server down (:func:`_outage`); ``result`` holds the question id
            and what failed.
        JudgeError: The ``judge`` model's call failed.
    """

    def note(stage: str) -> None:
        if log is not None:
            log(f"    {item.id}: {stage} ({time.perf_counter() - started:.0f}s)")

    started = time.perf_counter()
    base = settings.config()
    runner = RolloutRunner(model, tools, driver=pick_driver(model, base.driver, guided), checkpointer=InMemorySaver())
    guided_reports = isinstance(runner.driver, GuidedDriver)
    rollouts = await _rollouts(runner, item, settings, note)
    # Each method entry: (its family, the trajectories it reads).
    entries: dict[str, tuple[str, list[Trajectory]]] = {
        f"{family}_{mode}" if mode else family: (family, rollouts.sets[f"partial_{mode}" if mode else "scratch"])
        for family in settings.methods
        for mode in settings._modes(family)
    }
    trajectories = {t["id"]: t for group in rollouts.sets.values() for t in group}
    to_compress = [t for family, group in entries.values() if METHODS[family].reports for t in group]
    reports: dict[str, dict] = {}
    if to_compress:
        t0 = time.perf_counter()
        reports = await _reports(model, item, to_compress, config=base, guided=guided_reports)
        _check_reports_reached(item, reports)  # before the aggregator is sent to a server that is down
        rollouts.timings["compress"] = time.perf_counter() - t0
        note(f"{len({r['text'] for r in reports.values()})} reports")
    methods = {
        name: await _method_record(model, item, name, METHODS[family], group, reports, base=base, guided=guided_reports)
        for name, (family, group) in entries.items()
    }
    for mode in rollouts.picks:  # diagnostics: the average single trajectory of each partial set
        group = rollouts.sets[f"partial_{mode}"]
        methods[f"single_partial_{mode}"] = {
            "answer": None,
            "trajectories": [t["id"] for t in group],
            **_mean_single(group, item.answers),
            "cost": _cost(group),
        }
    if judge is not None:
        await _judge_methods(judge, item, methods, trajectories)
    return {
        "id": item.id,
        "question": item.question,
        "answers": item.answers,
        "dataset": item.dataset,
        "setting": settings.setting,
        "seconds": time.perf_counter() - started,
        "timings": rollouts.timings,
        "picks": rollouts.picks,
        "methods": methods,
        "reports": {
            k: {
                **{f: v[f] for f in ("answer", "tokens", "trajectory_tokens", "status")},
                "text_tokens": len(v["text"]) // 4,
            }
            for k, v in reports.items()
        },
        "trajectories": {t["id"]: _trajectory_record(t, item) for t in trajectories.values()},
    }


# What every summary reads of a record, besides its id; run_question writes each.
_RECORD_FIELDS = ("methods", "trajectories", "reports", "picks", "timings")
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _results_lines(path: Path) -> list[tuple[int, bytes]]:
    """The non-blank lines of a results file with their 1-based numbers; none when it does not exist.

    Split on newline bytes only: records are written with ``ensure_ascii=False``, and a text's
    U+2028 or U+0085 (which ``str.splitlines`` splits at) would cut a record in two.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:  # a directory, unreadable
        raise ConfigError(
            f"cannot read {path} ({exc.strerror}): it is the file a bench run keeps its finished questions in; "
            "move it away, or choose another output directory"
        ) from exc
    return [(number, line) for number, line in enumerate(data.split(b"\n"), 1) if line.strip()]


def _parsed(line: bytes) -> tuple[Any, str | None]:
    """A results line's JSON value, or ``None`` and why it is not UTF-8 JSON (a crash cut it)."""
    try:
        return json.loads(line.decode("utf-8")), None
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except json.JSONDecodeError as exc:
        return None, f"not JSON: {exc.msg}"


def _record_problem(value: Any) -> str | None:
    """Why a results line's JSON value is not a question record, or ``None`` when it is one."""
    if not isinstance(value, dict):
        return f"{_JSON_TYPES.get(type(value), 'null')}, not an object"
    if not isinstance(value.get("id"), str):
        return "its id is not a string" if "id" in value else "it has no id"
    if not isinstance(value.get("settings", {}), dict):  # absent from records older than the field
        return "its settings are not an object"
    if missing := [name for name in _RECORD_FIELDS if not isinstance(value.get(name), dict)]:
        return f"missing or not an object: {', '.join(missing)}"
    return None


def load_done(path: Path) -> dict[str, dict]:
    """Finished question records of an earlier (possibly interrupted) run, by question id.

    A line that starts as a record but is not UTF-8 JSON was cut by a crash: it is left out, and its
    question runs again (versions before 2026-12 went on writing after such a line, so it need not be
    the last).

    Raises:
        ConfigError: ``path`` cannot be read (a directory), or a line is JSON but no question record;
            the message names the line and what to do.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "results.jsonl"
        >>> _ = path.write_bytes(b'[]\\n{"id": "q1", "answ')
        >>> load_done(path)
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: ... line 1 is not a bench question record (an array, ...
    """
    lines = _results_lines(path)
    done: dict[str, dict] = {}
    for number, line in lines:
        value, unreadable = _parsed(line)
        # Cut by a crash: a record's start. Any other text is no bench output, kept from being appended to.
        if unreadable and line.lstrip().startswith(b"{"):
            continue
        if problem := unreadable or _record_problem(value):
            raise ConfigError(
                f"{path} line {number} is not a bench question record ({problem}): if it was damaged, delete "
                "the line and its question runs again; if the file is not a bench run's, choose another "
                "output directory"
            )
        done[value["id"]] = value
    return done


def _drop_cut_line(path: Path) -> str | None:
    """Drop a last line a crash cut, and end the file with a newline: the records appended next
    start on a line of their own, so that only a last line is ever cut.

    Returns:
        What was dropped, to tell the user (``None``: nothing).
    """
    data = path.read_bytes() if path.exists() else b""
    if not (body := data.rstrip()):
        return None
    last = body.rfind(b"\n") + 1
    if _parsed(body[last:])[1] is not None:  # its question runs again
        with path.open("r+b") as fh:
            fh.truncate(last)
        # A record starts with its id: the question is named when the cut left it whole.
        cut = re.match(rb'\{"id": ("(?:[^"\\]|\\.)*")', body[last:])
        try:
            question = f"question {json.loads(cut[1])!r}" if cut else "its question"
        except ValueError:  # a damaged id (not UTF-8, a bad escape) is no reason to stop the resume
            question = "its question"
        number = body.count(b"\n", 0, last) + 1
        return f"line {number} of {path} was cut off by a crash: dropped, {question} runs again"
    if not data.endswith(b"\n"):
        with path.open("ab") as fh:
            fh.write(b"\n")
    return None


def _resumed(path: Path, items: Sequence[QAItem], settings: BenchSettings, log: Any) -> list[dict]:
    """The finished records of ``items`` in the results file ``path``, which is then ready for appending.

    Raises:
        ConfigError: The records were run with other settings (:func:`finished_records`), or ``path``
            cannot be written (its folder read-only, the file read-only): before any question runs,
            not once the first one's rollouts are done.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        records = finished_records(path, items, settings=settings)
        if (dropped := _drop_cut_line(path)) and log is not None:
            log(f"    {dropped}")
        existed = path.exists()
        path.open("ab").close()
        if not existed:  # no file is left by a run refused before its first question (check_doc_ids)
            path.unlink()
    except OSError as exc:
        raise ConfigError(
            f"cannot write the results file {path} ({exc.strerror or exc}): make it and its folder writable, "
            "or choose another output directory"
        ) from exc
    return records


def _metrics(rows: Sequence[dict], name: str) -> tuple[str, ...]:
    """The string metrics, plus ``judge`` when every row of the method was judged."""
    judged = all("judge" in r["methods"][name] for r in rows)
    return (*METRICS, "judge") if judged else METRICS


def summarize(records: Sequence[dict], *, baseline: str = "majority", seed: int = 0) -> dict[str, dict]:
    """Mean and bootstrap 95% interval per method and metric, paired differences vs ``baseline``
    (over two questions or more), and what one answer cost per question (a single-trajectory mean: one
    trajectory of its set; an aggregation: also ``aggregate_tokens``, the aggregator's own).

    A judged run's ``judge`` is bootstrapped over the questions with a readable verdict (``None``
    when none had one), its differences over those judged in both methods; ``judge_unreadable``
    counts the unreadable verdicts (a single-trajectory mean's: of trajectories).
    """
    names = sorted({m for r in records for m in r["methods"]})
    out: dict[str, dict] = {}
    for name in names:
        rows = [r for r in records if name in r["methods"]]
        entry: dict[str, Any] = {"questions": len(rows)}
        for metric in _metrics(rows, name):
            scored = [r for r in rows if r["methods"][name][metric] is not None]  # judge: readable verdicts only
            entry[metric] = bootstrap_ci([r["methods"][name][metric] for r in scored], seed=seed) if scored else None
            paired = [r for r in scored if r["methods"].get(baseline, {}).get(metric) is not None]
            # One question's difference has no spread to resample: its interval was that difference
            # alone, zero wide, so a bench of one question printed any difference as significant.
            if baseline in rows[0]["methods"] and name != baseline and len(paired) > 1:
                diff = paired_bootstrap_diff(
                    [r["methods"][name][metric] for r in paired],
                    [r["methods"][baseline][metric] for r in paired],
                    seed=seed,
                )
                entry[f"{metric}_vs_{baseline}"] = diff + (within_noise(diff[1], diff[2]),)
        if "judge" in entry:  # records written before unreadable verdicts were kept have none
            entry["judge_unreadable"] = sum(r["methods"][name].get("judge_unreadable", 0) for r in rows)
        for key in ("generated_tokens", "prompt_tokens", "reused_prefix_tokens", "report_tokens", "tool_calls"):
            vals = [_answer_cost(name, r["methods"][name], key) for r in rows]
            if all(v is not None for v in vals):
                entry[key] = sum(vals) / len(vals)
        if all("aggregate_tokens" in r["methods"][name] for r in rows):
            entry["aggregate_tokens"] = sum(r["methods"][name]["aggregate_tokens"] for r in rows) / len(rows)
        out[name] = entry
    return out


def _answer_cost(name: str, entry: dict, key: str) -> float | None:
    """What one answer of a method cost: its set's cost, except that a single-trajectory mean
    (``no_scaling``, ``single_partial_*``) answers from one trajectory of the set it records."""
    value = entry["cost"].get(key)
    if value is not None and (name == "no_scaling" or name.startswith("single_partial_")):
        return value / len(entry["trajectories"])
    return value


def _thread_key(record: dict, trajectory_id: str) -> str:
    """The trajectory's thread within its question: a branch's id without the mode prefix
    :func:`_label_branch` gave it (every mode runs a branch at the same checkpoint in one thread)."""
    if record["trajectories"][trajectory_id]["origin"].get("kind") == "branch":
        return trajectory_id.split(".", 1)[1]
    return trajectory_id


def run_facts(records: Sequence[dict]) -> dict[str, float | int]:
    """Agent and compression figures of a bench run (from-scratch trajectories for the agent ones).

    Example:
        >>> run_facts([])["questions"]
        0
    """
    scratch = [t for r in records for t in r["trajectories"].values() if t["origin"].get("kind") in ("initial", "fill")]
    # One per thread: a branch two modes share was compressed once, though each mode's label keys it.
    reports = [rep for r in records for rep in {_thread_key(r, tid): rep for tid, rep in r["reports"].items()}.values()]
    aggregated = [
        m for r in records for m in r["methods"].values() if m.get("source") in ("aggregator", "majority_fallback")
    ]

    def mean(values: Sequence[float | None]) -> float:
        kept = [v for v in values if v is not None]
        return sum(kept) / len(kept) if kept else float("nan")

    report_tokens = sum(rep["tokens"] for rep in reports)
    trajectory_tokens = sum(rep["trajectory_tokens"] for rep in reports)
    text = [rep.get("text_tokens") for rep in reports]  # absent from records of older runs
    text_tokens = None if None in text else sum(text)
    return {
        "questions": len(records),
        "scratch_trajectories": len(scratch),
        "well_formed": mean([float(t["well_formed"]) for t in scratch]),
        "mean_steps": mean([t["steps"] for t in scratch]),
        "recall_seen": mean([t["recall_seen"] for t in scratch]),
        "recall_opened": mean([t["recall_opened"] for t in scratch]),
        "reports": len(reports),
        "fallback_reports": sum(rep["status"] == "fallback" for rep in reports),
        "mean_report_tokens": report_tokens / len(reports) if reports else float("nan"),
        "compression_ratio": report_tokens / trajectory_tokens if trajectory_tokens else float("nan"),
        # The report's whole text (estimated as tool responses are): guided facts are written, not generated.
        "text_ratio": text_tokens / trajectory_tokens
        if trajectory_tokens and text_tokens is not None
        else float("nan"),
        "aggregations": len(aggregated),
        "aggregator_picked": sum(m["source"] == "aggregator" for m in aggregated),
    }


def _scratch_entry(record: dict) -> dict | None:
    """A method entry of ``record`` that reads the from-scratch set (every one holds its cost), if any."""
    return next((record["methods"][m] for m in METHODS if not METHODS[m].per_mode and m in record["methods"]), None)


def rollout_table(records: Sequence[dict]) -> str:
    """Partial rollout vs from-scratch sampling, per mode, as a Markdown table (the paper's Table 3).

    Per question: generated tokens and their ratio to the from-scratch set, the share of prompt
    tokens that were the parent's prefix (reusable by a prefix cache) and that the engine actually
    served from its cache, tool calls, rollout seconds (the branches only, for partial sets: their
    initial and fill trajectories are the from-scratch samples; a branch an earlier mode already
    ran is reused, so later modes' seconds leave it out) and the mean single-trajectory
    F1 / contains-gold. The from-scratch set is read from any method that runs on it alone.
    """
    # Each set: its label, its timing, and per question (record, the method entry of the set).
    sets = [("from scratch", "scratch_rollout", [(r, e) for r in records if (e := _scratch_entry(r))])]
    for name in sorted({m for r in records for m in r["methods"] if m.startswith("single_partial_")}):
        mode = name.removeprefix("single_partial_")
        rows = [(r, r["methods"][name]) for r in records if name in r["methods"]]
        sets.append((f"partial: {mode}", f"branches_{mode}", rows))
    head = (
        "| set | gen. tokens/q | ratio to scratch | prompt: parent's prefix (computed) "
        "| prompt: served by cache (observed) | tool calls/q | rollout s/q | F1 | contains |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    base = sum(e["cost"]["generated_tokens"] for _, e in sets[0][2])

    def single(rows: list[tuple[dict, dict]], metric: str) -> float:
        """The mean single-trajectory score: per question over the set, then over the questions."""
        per = [sum(r["trajectories"][t][metric] for t in e["trajectories"]) / len(e["trajectories"]) for r, e in rows]
        return sum(per) / len(per)

    for label, timing, rows in sets:
        if not rows:
            continue
        cost = {k: sum(e["cost"][k] for _, e in rows) for k in _COST_KEYS}
        prompt = cost["prompt_tokens"] or 1.0
        lines.append(
            f"| {label} | {cost['generated_tokens'] / len(rows):.0f} | "
            f"{cost['generated_tokens'] / base if base else float('nan'):.3f} | "
            f"{cost['reused_prefix_tokens'] / prompt:.0%} | {cost['cached_prompt_tokens'] / prompt:.0%} | "
            f"{cost['tool_calls'] / len(rows):.1f} | "
            f"{sum(r['timings'].get(timing, 0.0) for r, _ in rows) / len(rows):.0f} | "
            f"{single(rows, 'f1'):.3f} | {single(rows, 'contains'):.3f} |"
        )
    return "\n".join(lines)


def fork_table(records: Sequence[dict]) -> str:
    """Where each mode forked, as a Markdown table: per mode and fork step (1-based, as in the
    uncertainty plot), the questions with a pick there, the branches forked there, and what a
    branch generated relative to the mean from-scratch trajectory of its question (1.00: it
    regenerated a whole trajectory; the token saving of partial rollout comes from the rows below 1).

    Example:
        >>> fork_table([]).splitlines()[0]
        '| mode | fork step | questions picked | branches | branch gen. tokens / scratch |'
    """
    lines = [
        "| mode | fork step | questions picked | branches | branch gen. tokens / scratch |",
        "|---|---|---|---|---|",
    ]
    picked: dict[tuple[str, int], int] = defaultdict(int)
    ratios: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in records:
        trajs = r["trajectories"]
        scratch = [t["stats"]["generated_tokens"] for t in trajs.values() if t["origin"].get("kind") != "branch"]
        mean = sum(scratch) / len(scratch) if scratch else 0.0
        for mode, picks in r["picks"].items():
            for step in {p[0] for p in picks}:
                picked[mode, step] += 1
            for tid in r["methods"].get(f"single_partial_{mode}", {}).get("trajectories", []):
                origin = trajs[tid]["origin"]
                if origin.get("kind") == "branch" and mean:
                    ratios[mode, origin["step"]].append(trajs[tid]["stats"]["generated_tokens"] / mean)
    for mode, step in sorted(picked.keys() | ratios.keys()):
        v = ratios[mode, step]
        lines.append(
            f"| {mode} | {step + 1} | {picked[mode, step]} of {len(records)} | {len(v)} | "
            + (f"{sum(v) / len(v):.2f} |" if v else "— |")
        )
    return "\n".join(lines)


def markdown_table(summary: dict[str, dict], *, baseline: str = "majority") -> str:
    """The summary as a Markdown table (mean [95% CI]; Δ vs baseline, '~' = within noise).

    ``judge`` and ``judge unreadable`` columns appear when the run had an LLM judge: its score over the
    readable verdicts ("—" when none was), and how many were not readable (of a single-trajectory
    mean: its trajectories').
    """
    judged = bool(summary) and all("judge" in e for e in summary.values())
    scores = ["em", "f1", "contains"] + (["judge"] if judged else [])
    head = (
        "| method | "
        + " | ".join("EM" if m == "em" else m if m != "f1" else "F1" for m in scores)
        + (" | judge unreadable" if judged else "")
        + f" | ΔF1 vs {baseline} | gen. tokens/q | report tokens/q | tool calls/q |\n|"
        + "---|" * (len(scores) + int(judged) + 5)
    )
    lines = [head]

    def ci(entry: dict, m: str) -> str:
        if entry[m] is None:
            return "—"
        mean, lo, hi = entry[m]
        return f"{mean:.3f} [{lo:.2f}, {hi:.2f}]"

    for name, e in summary.items():
        delta = e.get(f"f1_vs_{baseline}")
        dtxt = "—" if delta is None else format_diff(*delta[:3])
        unreadable = f" | {e.get('judge_unreadable', 0)}" if judged else ""
        lines.append(
            f"| {name} | " + " | ".join(ci(e, m) for m in scores) + f"{unreadable} | {dtxt} | "
            f"{e.get('generated_tokens', 0):.0f} | {e.get('report_tokens', 0) or 0:.0f} | "
            f"{e.get('tool_calls', 0):.1f} |"
        )
    return "\n".join(lines)


# Settings a record written before they were recorded may lack and still be continued: a run has always
# searched its questions' own corpus (check_doc_ids refuses one without their documents), so an older
# record's corpus is taken to be the one given now, as the code of its day took it.
_UNRECORDED_BEFORE = frozenset({"corpus"})
# The ParallelMuseConfig fields (``--set``) that change how many trajectories or reports run at once,
# not which run nor what they say: a run may continue with another value (lowered after a server was
# overloaded), as ``ask --resume`` may, and a summary reads one table from records of both.
_SCHEDULING = frozenset({"max_concurrency"})


def _compared(settings: dict) -> dict:
    """A record's settings as they are compared: without the scheduling fields of ``extra``, and a
    model recorded with ``auto`` precision (before the CLI recorded the precision it resolves to) as
    what ``auto`` is on this machine, where such a file most likely ran: it could not be continued.

    Example:
        >>> from langgraph_parallelmuse.models.hardware import resolve_precision
        >>> _compared({"model": "embedded auto"})["model"] == f"embedded {resolve_precision('auto')}"
        True
    """
    from langgraph_parallelmuse.models.hardware import resolve_precision

    model = settings.get("model")
    if isinstance(model, str) and model.endswith(" auto"):
        settings = {**settings, "model": f"{model.removesuffix(' auto')} {resolve_precision('auto')}"}
    extra = settings.get("extra")
    if not isinstance(extra, dict):
        return settings
    return {**settings, "extra": {k: v for k, v in extra.items() if k not in _SCHEDULING}}


def finished_records(path: Path, items: Sequence[QAItem], *, settings: BenchSettings | None = None) -> list[dict]:
    """The records in ``path`` of the questions ``items`` asks, in the order of ``items``.

    Args:
        path: The ``results.jsonl`` of a run.
        items: The questions asked; records of other questions are left out.
        settings: The settings of the run that continues ``path``; every record must have been
            run with them and record each (but those of :data:`_UNRECORDED_BEFORE`, which records
            older than them lack). ``None`` (summarising alone, as ``bench --report-only``):
            the records must all have been run with one settings, whichever; a field some records
            lack (older than the field) is compared among the records that have it. Either way the
            scheduling fields of ``extra`` (:data:`_SCHEDULING`: ``max_concurrency``) are not compared.

    Raises:
        ConfigError: ``settings`` is given and a record was run with other settings or does not
            record one of them (an older record), or ``settings`` is ``None`` and the records were
            run with more than one; the message names the fields (one table would mix two experiments).

    Example:
        >>> import json, tempfile
        >>> from langgraph_parallelmuse.eval.datasets import QAItem
        >>> path = Path(tempfile.mkdtemp()) / "results.jsonl"
        >>> parts = dict.fromkeys(("methods", "trajectories", "reports", "picks", "timings"), {})
        >>> rows = [{"id": q, "settings": {"seed": s}, **parts} for q, s in (("q0", 0), ("q1", 1))]
        >>> _ = path.write_text("".join(json.dumps(r) + "\\n" for r in rows))
        >>> [r["id"] for r in finished_records(path, [QAItem("q0", "?", ["a"], [], [], "toy")])]
        ['q0']
        >>> finished_records(path, [QAItem(q, "?", ["a"], [], [], "toy") for q in ("q0", "q1")])
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: ... seed 0 (q0), 1 (q1); ...
    """
    done = load_done(path)
    records = [done[i.id] for i in items if i.id in done]
    if settings is None:
        _check_one_settings(path, records)
        return records
    # Through JSON, as stored: tuples become lists.
    wanted = _compared(json.loads(json.dumps(asdict(settings))))
    for rec in records:
        stored = _compared(rec.get("settings") or {})
        # A field the record lacks was added after it ran: what it was run with is unknown, so it
        # is no match (a served-model run must not continue an embedded model's file).
        unknown = [k for k in wanted if k not in stored and k not in _UNRECORDED_BEFORE]
        missing = [f"{k} not recorded (now {wanted[k]!r})" for k in unknown]
        other = [f"{k} {stored[k]!r} (now {wanted[k]!r})" for k in wanted if k in stored and stored[k] != wanted[k]]
        if other or missing:
            # A setting the record lacks cannot be given back to it: only a new directory is a fix.
            fix = "" if missing else "run with those settings to continue it, or "
            raise ConfigError(
                f"{path} holds question {rec['id']!r} run with other settings: {', '.join(other + missing)}; "
                f"{fix}choose another output directory"
            )
    return records


def _check_one_settings(path: Path, records: Sequence[dict]) -> None:
    """Refuse records run with different settings. A field a record lacks (written before the field
    existed) is not compared: a file a run continued across a release that added a field would be
    unreadable otherwise, though the code of the day accepted every line of it."""
    names = sorted({name for rec in records for name in rec.get("settings") or {}})
    values: dict[str, dict[str, list[str]]] = {name: {} for name in names}  # field -> value -> question ids
    for rec in records:
        stored = _compared(rec.get("settings") or {})
        for name in names:
            if name in stored:
                values[name].setdefault(json.dumps(stored[name], sort_keys=True), []).append(rec["id"])

    def shown(ids: list[str]) -> str:
        return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")

    mixed = [
        f"{name} " + ", ".join(f"{value} ({shown(ids)})" for value, ids in seen.items())
        for name, seen in values.items()
        if len(seen) > 1
    ]
    if mixed:
        raise ConfigError(
            f"{path} mixes questions run with different settings: {'; '.join(mixed)}; one table would mix "
            "two experiments: move the lines of each settings to their own output directory and summarise each"
        )


def check_doc_ids(index: Any, items: Sequence[QAItem], *, setting: str = "distractor") -> None:
    """Check that the documents the questions name are in the corpus, in one index query.

    The distractor setting needs every question's ``context_doc_ids`` (the tools see only those),
    and recall its ``supporting_doc_ids``: ids from another corpus would make every search find
    nothing and every recall 0, in tables that look normal. The open setting is not checked: it may
    search another corpus than the one the gold came from.

    Args:
        index: The :class:`~langgraph_parallelmuse.tools.CorpusIndex` the bench searches.
        items: The questions to run.
        setting: ``"distractor"`` (checked) or ``"open"`` (nothing to check).

    Raises:
        CorpusError: A question has no ``context_doc_ids`` in the distractor setting, or names
            documents the index lacks; the message gives those questions, the unknown ids and the corpus.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from langgraph_parallelmuse.tools import CorpusIndex
        >>> tmp = Path(tempfile.mkdtemp())
        >>> _ = (tmp / "docs.jsonl").write_text(json.dumps({"id": "d1", "title": "A", "text": "a"}) + "\\n")
        >>> index = CorpusIndex.from_jsonl(tmp / "docs.jsonl", cache_dir=tmp / "cache")
        >>> check_doc_ids(index, [QAItem("q1", "A?", ["a"], ["d1"], ["d1"], "toy")])
        >>> check_doc_ids(index, [QAItem("q2", "B?", ["b"], ["x7"], ["d1", "x7"], "toy")])
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.CorpusError: question(s) 'q2' name 1 document(s) not in the corpus ...
    """
    from langgraph_parallelmuse.tools.local_tools import describe_ids

    distractor = setting == "distractor"
    if distractor and (bare := [i.id for i in items if not i.context_doc_ids]):
        raise CorpusError(
            f"question(s) {describe_ids(bare)} have no context_doc_ids, which the distractor setting needs "
            "(the tools see only those documents): add them to the questions file, or use --setting open"
        )

    def named(item: QAItem) -> list[str]:
        # The open setting may search another corpus (a full dump) than the one the gold came from.
        return [*item.supporting_doc_ids, *item.context_doc_ids] if distractor else []

    unknown = set(index.missing(d for i in items for d in named(i)))
    if unknown:
        bad = [i.id for i in items if unknown.intersection(named(i))]
        ids = list(dict.fromkeys(d for i in items for d in named(i) if d in unknown))
        raise CorpusError(
            f"question(s) {describe_ids(bad)} name {len(ids)} document(s) not in the corpus "
            f"{getattr(index, 'source', index)}: {describe_ids(ids)}; the questions file and the corpus do not "
            "match: give the corpus its questions come from (e.g. x.questions.jsonl with x.corpus.jsonl)"
        )


async def run_bench(
    model: BaseChatModel,
    index: Any,
    items: Sequence[QAItem],
    settings: BenchSettings,
    out: Path,
    *,
    concurrency: int = 1,
    judge: BaseChatModel | None = None,
    progress: Any = None,
    log: Any = None,
) -> list[dict]:
    """Run (or continue) a benchmark, appending one JSON line per finished question.

    Returns:
        The records of ``items``, earlier runs' included, in the order of ``items``.

    Raises:
        ConfigError: ``concurrency`` (questions in flight at once) is below 1, before anything runs.
        RolloutFailedError: After every other question, when some failed (every trajectory of one of
            their sets did, their reports or aggregator met a server down, or the judge failed:
            :func:`run_question` raises): they are not recorded, so
            a rerun runs them again. ``result["records"]`` holds the finished records, ``result["failed"]``
            the failed questions' ids and reasons.
    """
    from langgraph_parallelmuse.tools import make_corpus_tools

    if concurrency < 1:  # a semaphore of 0 let no question start: the run waited forever
        raise ConfigError(f"concurrency={concurrency}: the questions in flight at once, use 1 or more")
    records = _resumed(out, items, settings, log)
    finished = {r["id"] for r in records}
    todo = [i for i in items if i.id not in finished]
    check_doc_ids(index, todo, setting=settings.setting)  # before any model call
    sem = asyncio.Semaphore(concurrency)
    lock = asyncio.Lock()
    failed: dict[str, str] = {}
    judge_failed: set[str] = set()
    judge_down: list[str] = []  # the questions whose judge could not be reached

    async def one(item: QAItem) -> None:
        async with sem:
            if judge_down:  # each question would run its rollouts only to fail at judging
                failed[item.id] = f"not run: the LLM judge was unreachable on {judge_down[0]}"
                judge_failed.add(item.id)
                return
            subset = item.context_doc_ids if settings.setting == "distractor" else None
            tools = make_corpus_tools(index, doc_ids=subset)
            try:
                rec = await run_question(model, tools, item, settings, judge=judge, log=log)
            except (RolloutFailedError, JudgeError) as exc:
                # Recorded, an outage would be a score of 0 (the judge's: a record without its verdicts,
                # scored incomplete) that no rerun repairs: the others go on.
                failed[item.id] = str(exc)
                if isinstance(exc, JudgeError):
                    judge_failed.add(item.id)
                    if exc.unreachable:  # not a refusal of this question's prompt: the others would fail too
                        judge_down.append(item.id)
                if log is not None:
                    log(f"    {item.id}: failed, not recorded: {exc}")
                return
            rec["settings"] = asdict(settings)
            async with lock:
                _append(out, rec)
                records.append(rec)
                if progress is not None:
                    progress(rec)

    await gather_all(*(one(i) for i in todo))
    order = {i.id: n for n, i in enumerate(items)}
    records.sort(key=lambda r: order.get(r["id"], 0))
    if failed:
        raise _failed_questions(items, len(todo), failed, judge_failed, records)
    return records


def _append(path: Path, record: dict) -> None:
    """Append a question's record to the results file ``path`` as one line.

    Raises:
        ConfigError: The line could not be written (a full disk): the finished records are kept, a
            line the failure cut short is dropped by the rerun, whose question runs again.
    """
    try:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:  # a lone surrogate a server sent: escaped, the record is still kept
        line = (json.dumps(record) + "\n").encode()
    try:
        with path.open("ab") as fh:  # UTF-8, as load_done reads it, whatever the locale
            fh.write(line)
    except OSError as exc:
        raise ConfigError(
            f"cannot append question {record['id']!r} to {path} ({exc.strerror or exc}): free space or make "
            "it writable, then rerun the same command: the finished questions are kept"
        ) from exc


def _failed_questions(
    items: Sequence[QAItem], ran: int, failed: dict[str, str], judge_failed: set[str], records: list[dict]
) -> RolloutFailedError:
    """The error that ends a bench some of whose questions failed: which, why, and which server to check.

    A :class:`RolloutFailedError` whatever failed, the judge included: it is what the CLI catches to
    summarise the finished questions before it exits.

    Args:
        items: The questions asked, in their order.
        ran: How many of them this run ran (the others were finished before).
        failed: The failed questions' ids and reasons.
        judge_failed: Those of ``failed`` whose judge failed (the others: their rollout).
        records: The finished records.
    """
    reasons = [f"{i.id}: {failed[i.id]}" for i in items if i.id in failed]
    more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    servers = []
    if set(failed) - judge_failed:
        servers.append("the model's server is up (--base-url, --model)")
    if judge_failed:
        servers.append("the judge's server is up (--judge-base-url, --judge-model)")
    return RolloutFailedError(
        f"{len(failed)} of {ran} question(s) failed and were not recorded: {'; '.join(reasons[:3])}{more}. "
        f"Check that {' and that '.join(servers)}, then rerun the same command: the failed questions run again, "
        "the finished ones are kept",
        result={"records": records, "failed": failed},
    )


def _fact(name: str, value: float | int) -> str:
    if not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        # Recall is undefined, not 0, when no question lists the documents that hold its answer.
        return "n/a (no question lists supporting_doc_ids)" if name.startswith("recall_") else "n/a"
    return f"{value:.3f}"


def write_outputs(records: Sequence[dict], out_dir: Path, *, seed: int = 0) -> tuple[str, bool]:
    """Write ``summary.md`` (methods table, rollout table, fork table, run facts), ``summary.json``,
    ``profile.json`` and, with matplotlib, the plots of a bench run.

    Returns:
        The Markdown summary, and whether the plots were drawn.
    """
    from langgraph_parallelmuse.eval.plots import uncertainty_profile

    summary = summarize(records, seed=seed)
    facts = "\n".join(f"- {k}: {_fact(k, v)}" for k, v in run_facts(records).items())
    table = f"{markdown_table(summary)}\n\n{rollout_table(records)}\n\n{fork_table(records)}\n\n{facts}"
    profile = uncertainty_profile(records)
    means = {region: {str(step): mean for step, (mean, _) in steps.items()} for region, steps in profile.items()}
    for name, text in (
        ("summary.md", table + "\n"),
        ("summary.json", json.dumps(summary, indent=2)),
        ("profile.json", json.dumps(means, indent=2)),
    ):
        with replacing(out_dir / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    from langgraph_parallelmuse.eval.plots import plot_accuracy_vs_tokens, plot_uncertainty_profile

    try:  # matplotlib is the optional extra "plot"; it is imported when the first plot is drawn
        with replacing(out_dir / "accuracy_vs_tokens.png") as tmp:
            plot_accuracy_vs_tokens(summary, tmp)
        with replacing(out_dir / "uncertainty_profile.png") as tmp:
            plot_uncertainty_profile(profile, tmp)
    except ImportError:
        return table, False
    return table, True
