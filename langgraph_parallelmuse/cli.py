"""Command line: ``ask`` (full pipeline), ``agent`` (one trajectory), ``bench``, ``calibrate``, ``export-model``,
``delete-thread`` (a thread with its trajectory threads).

Example:
    $ parallelmuse ask "Which country is the Eiffel Tower in?" --n 8 --json result.json
    $ parallelmuse agent "Who painted the Mona Lisa?"
    $ parallelmuse calibrate bench-results/hotpot/results.jsonl --out calibration.json
    $ parallelmuse ask "Who painted the Mona Lisa?" --calibration calibration.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import io
import json
import os
import signal
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from langgraph_parallelmuse.calibration import DEFAULT_QUANTILE
from langgraph_parallelmuse.config import ParallelMuseConfig, make_config
from langgraph_parallelmuse.errors import ConfigError, CorpusError, ParallelMuseError, RolloutFailedError
from langgraph_parallelmuse.eval.bench import METHODS
from langgraph_parallelmuse.files import replacing
from langgraph_parallelmuse.loopback import is_http_url, shown_url
from langgraph_parallelmuse.protocol import one_line
from langgraph_parallelmuse.redact import redact
from langgraph_parallelmuse.uncertainty import REGIONS_OF_MODE

# emoji=False: ":b:" in an answer (an IPv6 or MAC address) would print as an emoji.
console = Console(stderr=True, emoji=False)
out = Console(emoji=False)


def _add_model_args(p: argparse.ArgumentParser, *, bench: bool = False) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--base-url",
        type=_server_url,
        help="OpenAI-compatible server (vLLM, SGLang, llama.cpp); default: embedded SmolLM2",
    )
    g.add_argument("--model", type=_given, help="model name on the server (with --base-url; default: its only model)")
    g.add_argument("--model-path", type=_given, help="local transformers checkpoint dir (default: embedded GGUF)")
    g.add_argument(
        "--precision",
        choices=("auto", "float32", "bfloat16"),
        default=None,
        help="in-process engine: bfloat16 matrix work is ~2x faster on CPUs with AMX/AVX-512-BF16 and many "
        "times slower on others; auto picks it only where the CPU has it; float32 keeps the logprobs exact "
        "(default: float32; refused with --base-url, whose server sets its own)",
    )
    g = p.add_argument_group("knowledge")
    g.add_argument(
        "--corpus",
        action="append",
        default=[],
        type=_given,
        help="{id,title,text} JSONL to search (repeatable); "
        + (
            "the question set's corpus, e.g. ../shared/eval-data/<set>.corpus.jsonl"
            if bench
            else "default: the offline Wikipedia subset"
        ),
    )
    # The files' hashes, once a command has hashed them to record its corpus (_corpus_digests): the index reuses them.
    p.set_defaults(corpus_digests=None)
    if bench:  # the questions' own corpus, and --setting distractor for their documents
        return
    g.add_argument("--doc-ids", type=_given, help="comma-separated doc ids the tools may see (distractor setting)")
    g.add_argument("--tavily", action="store_true", help="search the web with Tavily (needs TAVILY_API_KEY)")


# Settings that shape one trajectory; ``agent`` runs one, so it offers only these.
TRAJECTORY_FIELDS = (
    "temperature",
    "top_p",
    "top_logprobs",
    "seed",
    "max_turns",
    "max_step_tokens",
    "max_context_tokens",
    "max_observation_chars",
    "tool_timeout",
    "driver",
)


def _add_config_args(p: argparse.ArgumentParser, *, only: tuple[str, ...] | None = None) -> None:
    g = p.add_argument_group("ParallelMuse settings (defaults: the paper's)")
    for name, field in ParallelMuseConfig.model_fields.items():
        if only is not None and name not in only:
            continue
        flag = "--" + name.replace("_", "-")
        kind = field.annotation
        if (
            get_origin(kind) in (Union, UnionType)
            and len(given := [a for a in get_args(kind) if a is not type(None)]) == 1
        ):
            kind = given[0]  # "float | None" reads a float: as text, 0.8 never equals the stored 0.8 on resume
        help_text = f"{field.description} (default: {field.default})"
        if kind is bool:
            g.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            continue
        choices = [c for c in get_args(kind) if isinstance(c, str)] if get_origin(kind) is Literal else None
        typ = {int: int, float: float}.get(kind, None)
        if typ is None and "int" in str(kind):
            typ = int
        if choices:
            help_text += f"; one of: {', '.join(choices)}"
        g.add_argument(flag, dest=name, type=typ or str, default=None, choices=choices, help=help_text)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (unset flags keep the defaults, or a resumed run's)."""
    return {k: getattr(args, k) for k in ParallelMuseConfig.model_fields if getattr(args, k, None) is not None}


def _config_from(args: argparse.Namespace, **fixed: Any) -> ParallelMuseConfig:
    return make_config({**_overrides(args), **fixed})


def _model(args: argparse.Namespace, settings: ParallelMuseConfig | None = None, *, logprobs: bool | None = None):
    """The agent model: a checked OpenAI-compatible server (``--base-url``) or the embedded SmolLM2.

    Args:
        args: The command line.
        settings: The settings the run will use, which the server is checked for (its driver,
            ``top_logprobs``, whether it branches); default: the command line's flags.
        logprobs: Whether the server must return logprobs; default: :func:`_needs_logprobs` of ``settings``.
    """
    _check_model_flags(args)
    if args.base_url:
        return _server_model(args, settings or _config_from(args), logprobs=logprobs)
    from langgraph_parallelmuse.models import LocalChatModel

    with console.status("Loading the embedded model (SmolLM2-135M-Instruct)…"):
        if args.model_path:
            return LocalChatModel(model_path=args.model_path, precision=_precision(args))
        return LocalChatModel.embedded(precision=_precision(args))


def _precision(args: argparse.Namespace) -> str:
    """The in-process engine's precision: ``--precision``, float32 when not given."""
    return args.precision or "float32"


def _check_model_flags(args: argparse.Namespace) -> None:
    """Refuse model flags one of which would be ignored, and a ``--model-path`` the loader cannot open
    (it loads lazily: found there, the error came from the graph's first step, after a checkpointed run
    had stored its inputs)."""
    if args.base_url and args.model_path:
        raise ConfigError("--model-path loads a local checkpoint, --base-url uses a server: pass one of them")
    if args.base_url and args.precision is not None:
        raise ConfigError(
            f"--precision {args.precision} sets the in-process engine's precision; the server of --base-url "
            "runs its model at its own: drop --precision"
        )
    if args.model and not args.base_url:
        raise ConfigError(f"--model {args.model!r} names a model on a server: add --base-url (or drop --model)")
    if args.model_path:
        from langgraph_parallelmuse.models.local import check_model_path

        check_model_path(args.model_path, flag="--model-path ")  # the check LocalChatModel makes


def _needs_logprobs(settings: ParallelMuseConfig, *, weighted: bool = False) -> bool:
    """Whether a run reads its trajectories' logprobs: to branch (a partial-rollout mode), to stop a
    trajectory early (``early_stop``, with any mode), or to weigh the votes by confidence
    (``weighted``: a bench method does) — without them the weighted vote falls back to a plain
    majority, and a server's check must say so before the first wave.

    Example:
        >>> _needs_logprobs(ParallelMuseConfig(mode="none", aggregation="weighted"))
        True
    """
    return settings.mode != "none" or settings.early_stop or weighted or settings.aggregation == "weighted"


def _served_name(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--model`` set to the server's only model when ``--base-url`` names none: bench
    results and checkpointed runs record the model by name.

    Raises:
        ConfigError: Model flags that contradict (checked first: a server lookup would hide them), or a
            server that serves other than one model.
    """
    _check_model_flags(args)
    if args.base_url and args.model is None:
        return argparse.Namespace(**{**vars(args), "model": _only_served_model(args.base_url)})
    return args


def _local_name(args: argparse.Namespace) -> str:
    """The in-process model a command line loads, as results record it: with the precision it computes
    in, ``auto`` resolved on this machine (recorded as ``auto``, a calibration fitted in bfloat16 gave
    no warning in float32)."""
    from langgraph_parallelmuse.models.hardware import resolve_precision

    return f"{args.model_path or 'embedded'} {resolve_precision(_precision(args))}"


def _model_identity(args: argparse.Namespace) -> str:
    """The model a command line runs, as bench results (and the calibrations fitted on them) record it."""
    return redact(f"{args.base_url} {args.model}" if args.base_url else _local_name(args))


def _warn_other_model(calibration: str | None, model: str) -> None:
    """Warn when ``calibration`` was fitted on the runs of another model than ``model`` (a model's
    perplexities are its own: another's thresholds fork other steps, or none)."""
    if calibration is None:
        return
    from langgraph_parallelmuse.calibration import Calibration

    fitted_on = Calibration.load(calibration).model  # checked loadable with the settings
    if fitted_on is not None and fitted_on != model:
        # Recorded before auto was resolved: float32 or bfloat16, by the machine those runs ran on.
        unknown = (
            " (auto, recorded unresolved: bfloat16 if their machine had it natively, else float32)"
            if fitted_on.endswith(" auto")
            else ""
        )
        console.print(
            f"[yellow]warning:[/] {_shown(calibration)} was fitted on runs of {_shown(repr(fitted_on))}{unknown}, "
            f"this run uses {_shown(repr(model))}: its thresholds are that model's perplexities; calibrate on this "
            "model's runs (`parallelmuse calibrate`)"
        )


def _only_served_model(base_url: str, flag: str = "--model") -> str:
    """The name of the one model a server serves (when ``flag`` names none)."""
    from langgraph_parallelmuse.models.server import served_models

    served = served_models(base_url, api_key=os.environ.get("OPENAI_API_KEY"))
    if len(served) != 1:
        # A hosted API lists a hundred models: name a few.
        shown = served if len(served) <= 10 else [*served[:10], f"... {len(served) - 10} more"]
        raise ConfigError(f"{base_url} serves {shown}: pass {flag} with one of those names")
    return served[0]


def _server_model(args: argparse.Namespace, settings: ParallelMuseConfig, *, logprobs: bool | None = None):
    """Check the server and the model name before the first wave, then build its chat model.

    Without ``--model`` the server's only model is used; the guided driver (``--driver guided``)
    also needs the server to continue a trailing assistant message, which is checked too. A server
    without ``prompt_logprobs`` (anything but vLLM) gets a model that does not score, so the guided
    driver lets it write its answers instead of failing at the first answer step.
    """
    from langgraph_parallelmuse.models.server import ServerChatModel, check_server

    api_key = os.environ.get("OPENAI_API_KEY")
    name = args.model or _only_served_model(args.base_url)
    guided = settings.driver == "guided"
    with console.status(f"Checking model {name!r} at {redact(args.base_url)}…"):
        support = check_server(
            args.base_url,
            name,
            top_logprobs=settings.top_logprobs,
            logprobs=_needs_logprobs(settings) if logprobs is None else logprobs,
            prefill=guided,
            api_key=api_key,
        )
    if guided and not support.scoring:
        console.print(
            f"{redact(args.base_url)} returns no prompt_logprobs (vLLM does): the model writes its answers",
            markup=False,
        )
    return ServerChatModel(
        base_url=args.base_url,
        model=name,
        logprobs=True,
        top_logprobs=settings.top_logprobs,
        **support.model_flags(),
    )


def _judge(args: argparse.Namespace):
    """The LLM judge of ``bench``: a deterministic ChatOpenAI on ``--judge-base-url``, or None.

    The server is reached here, before any question runs: found only at the first grading, a dead
    judge failed after a whole question's rollout, and nothing of it was kept. The name is not
    checked against its model list: Ollama's tags, llama.cpp (any name) and Azure deployments
    take names the list does not show.
    """
    if not args.judge_base_url:
        return None
    from langchain_openai import ChatOpenAI

    from langgraph_parallelmuse.models.server import served_models

    with console.status(f"Checking the judge at {redact(args.judge_base_url)}…"):
        served = served_models(args.judge_base_url, api_key=os.environ.get("OPENAI_API_KEY"))
    if args.judge_model not in served:
        console.print(
            f"note: the judge server lists {served}, not {args.judge_model!r}; it is asked by that name", markup=False
        )
    return ChatOpenAI(
        base_url=args.judge_base_url,
        model=args.judge_model,
        api_key=os.environ.get("OPENAI_API_KEY", "none"),
        temperature=0.0,
    )


def _tools(args: argparse.Namespace):
    """The run's tools (``_refuse_web_with_corpus`` has checked the flags that pick them)."""
    if args.tavily:
        from langgraph_parallelmuse.tools import make_tavily_tools

        return make_tavily_tools()
    from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

    with console.status("Opening the search index (built once, then cached)…"):
        index = (
            CorpusIndex.from_jsonl(*args.corpus, digests=args.corpus_digests)
            if args.corpus
            else CorpusIndex.wikipedia()
        )
    return make_corpus_tools(index, doc_ids=_doc_ids(args))


def _refuse_web_with_corpus(args: argparse.Namespace) -> None:
    """Refuse ``--tavily`` with ``--corpus`` or ``--doc-ids``, which a web search would not read."""
    if args.tavily and (args.corpus or args.doc_ids):
        flags = " and ".join(f for f, v in (("--corpus", args.corpus), ("--doc-ids", args.doc_ids)) if v)
        raise ConfigError(f"--tavily searches the web, not a corpus: drop {flags}, or drop --tavily to search it")


def _doc_ids(args: argparse.Namespace) -> list[str] | None:
    """The ids ``--doc-ids`` lists (``None``: not given, every document)."""
    return [d.strip() for d in args.doc_ids.split(",") if d.strip()] if args.doc_ids else None


def _corpus_digests(paths: Sequence[str]) -> dict[Path, str]:
    """Each corpus file (resolved, as the index reads it) and the SHA-256 of its whole content.

    Hashed once per command: a run's record of its corpus (:func:`_corpus_fingerprint`) and the index's
    cache key (``CorpusIndex.from_jsonl(digests=)``) read the same hashes, each of which reads the whole file.

    Raises:
        CorpusError: A file is missing, is no regular file, or cannot be read.
    """
    from langgraph_parallelmuse.tools.corpus import corpus_files, file_sha256

    digests = {}
    for file in corpus_files(paths):  # a pipe or a folder is named as such, as the index names it
        try:
            digests[file] = file_sha256(file)
        except OSError as exc:
            raise _unreadable_corpus(file, exc) from exc
    return digests


def _unreadable_corpus(file: Path, exc: OSError) -> CorpusError:
    return CorpusError(f"cannot read the corpus {file} ({exc.strerror}): give its JSONL file")


def _corpus_fingerprint(digests: Mapping[Path, str]) -> str:
    """The corpus files as a run records them: each file's name (its link's target), size, and a hash of
    its whole content (:func:`_corpus_digests`, as the index's cache key hashes it).

    A moved or renamed link is the same corpus, other texts another: a hash of the first and last MiB
    alone missed an edit in between that kept the size, and a bench continued its table on the edited corpus.

    Raises:
        CorpusError: A file cannot be read.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "docs.jsonl"
        >>> _ = path.write_text('{"id": "d1", "title": "A", "text": "a"}\\n')
        >>> _corpus_fingerprint(_corpus_digests([str(path)]))
        'docs.jsonl (40 bytes, sha256 b566607a259a934a)'
    """
    shown = []
    for file, digest in digests.items():
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise _unreadable_corpus(file, exc) from exc
        shown.append(f"{file.name} ({size} bytes, sha256 {digest[:16]})")
    return ", ".join(shown)


def _progress(*, eta: bool = False) -> Progress:
    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    ]
    if eta:
        columns += [TextColumn("ETA"), TimeRemainingColumn()]
    # Rich estimates the speed from the steps of the last speed_estimate_period seconds (30 by
    # default): a bench question takes minutes, so its window held one step at most and no ETA.
    return Progress(*columns, console=console, speed_estimate_period=7 * 24 * 3600)


# Control characters but newline and tab: an escape sequence in a page or a model's text would drive
# the terminal (reset it, retitle it, hide what follows).
# C0/C1 controls, and the bidirectional overrides and isolates that reorder what follows them.
def _shown(text: object) -> str:
    r"""Text from a model, a tool or a user, printed as itself: no rich markup, no control characters.

    ``[/b]`` in a page made rich raise (after ``ask`` had run, so ``--json`` was never written), and
    ``[link=...]`` became a live hyperlink.

    Example:
        >>> _shown("see [/citation needed] \x1b[2J")
        'see \\[/citation needed] [2J'
    """
    from langgraph_parallelmuse.view import UNPRINTABLE

    return escape(UNPRINTABLE.sub("", str(text)))


def stats_table(result: dict[str, Any]) -> Table:
    """Tokens per stage, compression ratio, tool calls and seconds of one run."""
    stats = result.get("stats", {})
    roll, comp = stats.get("rollout", {}), stats.get("compress", {})
    table = Table(title="Run statistics", show_header=True)
    table.add_column("stage")
    table.add_column("value", justify="right")
    kinds = roll.get("by_kind", {})
    table.add_row(
        "trajectories (initial / branch / fill)",
        f"{roll.get('trajectories', 0)} ({kinds.get('initial', 0)} / {kinds.get('branch', 0)} / "
        f"{kinds.get('fill', 0)})",
    )
    table.add_row(
        "answered / failed / stopped early / cancelled / out of turns / out of context",
        " / ".join(
            str(roll.get(k, 0))
            for k in ("answered", "failed", "stopped", "cancelled", "max_turns", "context_exhausted")
        ),
    )
    table.add_row("rollout: generated tokens", str(roll.get("generated_tokens", 0)))
    table.add_row("rollout: prompt tokens", str(roll.get("prompt_tokens", 0)))
    table.add_row(
        "rollout: parents' prefixes sent again by branches (computed)", str(roll.get("reused_prefix_tokens", 0))
    )
    for stage, part in (("rollout", roll), ("compress", comp), ("aggregate", stats.get("aggregate") or {})):
        if part.get("prompt_tokens") and roll.get("cache_reported", True):
            table.add_row(
                f"{stage}: prompt tokens served from cache (observed)",
                f"{part.get('cached_prompt_tokens', 0)} of {part['prompt_tokens']} "
                f"({part.get('cached_prompt_tokens', 0) / part['prompt_tokens']:.0%})",
            )
    if not roll.get("cache_reported", True):
        table.add_row("prompt tokens served from cache (observed)", "the backend does not report them")
    table.add_row("rollout: tool calls / failed", f"{roll.get('tool_calls', 0)} / {roll.get('tool_errors', 0)}")
    table.add_row(
        "rollout: unreadable turns / turns kept though rejected",
        f"{roll.get('invalid_turns', 0)} / {roll.get('rejected_turns', 0)}",
    )
    if comp:
        ratio = comp.get("compression_ratio")
        table.add_row(
            "compress: report tokens generated / trajectory tokens",
            f"{comp.get('report_tokens', 0)} / {comp.get('trajectory_tokens', 0)}"
            + (f" = {ratio:.3f}" if ratio is not None else ""),
        )
        if (text_ratio := comp.get("text_ratio")) is not None:  # guided facts are written, not generated
            table.add_row("compress: report text / trajectory tokens (estimated)", f"{text_ratio:.3f}")
    # A crossover's graph is a copy of its parents' evidence, not an exploration: left out, as the benchmark does.
    per = [p for p in (stats.get("infograph") or {}).get("per_trajectory", {}).values() if p["kind"] != "crossover"]
    if per:  # the information-state graph: entities explored / effective, redundancy Γ
        gammas = [p["redundancy"] for p in per if p["redundancy"] is not None]
        explored, effective = (sum(p[k] for p in per) / len(per) for k in ("entities", "effective_entities"))
        table.add_row(
            "entities explored / effective per trajectory (Γ)",
            f"{explored:.1f} / {effective:.1f}" + (f" (Γ = {sum(gammas) / len(gammas):.2f})" if gammas else ""),
        )
    if cross := stats.get("crossover"):
        table.add_row(
            "crossover: trajectories / fills / generated tokens",
            f"{cross['trajectories']} / {cross['fills']} / {cross['generated_tokens']}",
        )
    seconds = stats.get("seconds") or {}
    for key, label in (("rollout", "rollout"), ("stage2", "compress + aggregate"), ("total", "total")):
        if key in seconds:  # time the nodes ran: a resumed run does not count the time it was dead
            table.add_row(f"seconds: {label}", f"{seconds[key]:.1f}")
    engine = stats.get("engine")
    if engine:
        table.add_row(
            "engine: prefill computed / reused",
            f"{engine.get('prefill_tokens_computed', 0)} / {engine.get('prefill_tokens_reused', 0)}"
            f" ({engine.get('cache_token_reuse', 0):.0%} reused)",
        )
    return table


# The checkpoint metadata an ask run's inputs (_run_inputs) are kept under: LangGraph copies a run
# config's text metadata into each checkpoint it writes, beside the question and settings it holds.
_INPUTS = "parallelmuse_inputs"


def _run_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """What makes an ``ask`` run's trajectories besides its question and settings, by the flag that
    gives it: the documents the tools search (the corpus files' fingerprint) and the model (by name, not
    by its server's URL, which may move). ``None``: the flag was not given (Wikipedia, the embedded model).
    """
    ids = _doc_ids(args)
    return {
        "--corpus": _corpus_fingerprint(args.corpus_digests) if args.corpus else None,
        "--doc-ids": ",".join(sorted(set(ids))) if ids else None,
        "--tavily": args.tavily or None,
        # Not the server's URL: a server restarted on another port serves the same model (--model says which).
        "--model": args.model,
        "--model-path": args.model_path,
        "--precision": None if args.base_url else _precision(args),  # a server's model is its own
    }


def _other_inputs(stored: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The flags whose value ``now`` differs from the ``stored`` run's, with both (``None``: none do).

    Example:
        >>> _other_inputs({"--corpus": "a.jsonl (9 bytes)", "--tavily": None}, {"--corpus": None, "--tavily": True})
        '--corpus not given (stored: a.jsonl (9 bytes)), --tavily given (stored: not given)'
    """

    def shown(value: Any) -> str:
        return "not given" if value is None else "given" if value is True else str(value)

    # Only what both record: an input recorded by one version and not the other is unknown, not another.
    flags = [flag for flag in now if flag in stored and stored[flag] != now[flag]]
    return ", ".join(f"{f} {shown(now.get(f))} (stored: {shown(stored.get(f))})" for f in flags) or None


def _run_named(args: argparse.Namespace) -> str:
    """The checkpointed run a command line names, as its errors say."""
    return f"--run-id {args.run_id!r} in {args.db}"


async def _stored_run(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of the run ``--run-id`` in ``--db``, checked to be the run this command describes.

    Read before the index opens or the model loads: a wrong resume was found only after both. A resume's
    flags are then validated on top of the stored settings (on the defaults, ``--n 4`` of a run stored
    with ``--mode none`` was refused for the default mode's budget). A run stored before its inputs were
    is resumed whatever they are.

    Returns:
        The stored settings; ``{}`` for a new run, or a run that stopped before its settings were stored
        (in ``prepare``: it starts with this command's).

    Raises:
        ConfigError: A new run would reuse the id of an existing one; ``--resume`` names no run; or the
            question, an input (:func:`_run_inputs`: the corpus, the model) or a given setting other than
            ``max_concurrency`` differs from the stored one.
    """
    from langgraph_parallelmuse.persistence import open_checkpointer

    async with open_checkpointer(args.db) as saver:
        found = await saver.aget_tuple({"configurable": {"thread_id": args.run_id, "checkpoint_ns": ""}})
    stored = (found.checkpoint.get("channel_values") or {}) if found else {}
    where = _run_named(args)
    if not args.resume:
        if stored.get("question"):
            raise ConfigError(f"{where} already holds a run: add --resume to continue it, or choose another --run-id")
        return {}
    if not stored.get("question"):
        raise ConfigError(f"no run {where}: start it without --resume (same --db and --run-id)")
    if stored["question"] != args.question.strip():
        raise ConfigError(
            f"{where} was started with the question {stored['question']!r}; resume it with that question, "
            "or start a new run with another --run-id"
        )
    inputs = (found.metadata or {}).get(_INPUTS)
    if inputs and (other := _other_inputs(json.loads(inputs), _run_inputs(args))):
        raise ConfigError(
            f"{where} was started with other inputs: {other}; give those flags as stored to resume it, "
            "or start a new run with another --run-id"
        )
    settings = stored.get("settings") or {}
    # How many run at once changes no trajectory: a resume may lower it (after an overload).
    clash = {k: v for k, v in _overrides(args).items() if k in settings and k != "max_concurrency" and settings[k] != v}
    if clash:
        given = ", ".join(f"--{k.replace('_', '-')} {v} (stored: {settings[k]})" for k, v in clash.items())
        raise ConfigError(f"{where} was started with other settings: {given}; drop these flags to resume it")
    return settings


async def _resume_point(graph: Any, run_config: dict) -> dict:
    """The stored state of the run ``run_config`` names and the nodes still to run.

    The run was checked to be the one the command describes by :func:`_stored_run`, before the model loaded.
    """
    snap = await graph.aget_state(run_config)
    return {"state": snap.values, "pending": list(snap.next)}


def _failed(state: dict[str, Any]) -> int:
    """How many trajectories of a stored run failed (a server down): a run where every one did
    stopped there (``RolloutFailedError``); a finished run keeps the others' answers."""
    return sum(t.get("status") == "failed" for t in state.get("trajectories") or [])


def _with_finished(state: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the trajectories and reports of the tasks in one ``updates`` chunk added.

    The graph streams its whole state only when a superstep ends, and every initial trajectory runs
    in one: interrupted in the middle, the last streamed state held none of those already finished.
    """
    from langgraph_parallelmuse.state import merge_reports, merge_trajectories

    merged = dict(state)
    for delta in update.values():
        for key, merge in (("trajectories", merge_trajectories), ("reports", merge_reports)):
            # A list only: prepare's Overwrite([]) starts the run, which the next state shows anyway.
            if isinstance(delta, dict) and isinstance(delta.get(key), list):
                merged[key] = merge(merged.get(key), delta[key])
    return merged


async def _stream(
    graph: Any,
    payload: dict | None,
    run_config: dict,
    context: dict,
    n: int,
    *,
    on_interrupt: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run (or continue) the graph with a live progress display; return the final state.

    ``on_interrupt`` gets the work done so far (the last state streamed, with the trajectories and
    reports finished since; it may hold none) when Ctrl-C stops the run, before the interrupt goes on.
    """
    final: dict[str, Any] = {}
    with _progress() as prog:
        roll = prog.add_task("trajectories", total=n)
        rep = prog.add_task("reports", total=None, visible=False)
        try:
            async for mode, chunk in graph.astream(
                payload, run_config, context=context, stream_mode=["custom", "updates", "values"]
            ):
                if mode == "values":
                    final = chunk
                elif mode == "updates":
                    final = _with_finished(final, chunk)
                else:
                    _show_event(prog, chunk, roll=roll, rep=rep, n=n)
        except ParallelMuseError as exc:
            # A run-ending error of a node that holds only its own job (a report's): the last state
            # streamed before it is the work done (the aggregate node gives its own, with the reports).
            if exc.result is None and final.get("trajectories"):
                exc.result = final
            raise
        except (asyncio.CancelledError, KeyboardInterrupt):
            if on_interrupt is not None:
                on_interrupt(final)
            raise
        # The run is over: fewer than n trajectories when a consensus stopped it, and reports only
        # of the answered ones; a bar left short would look like work still running.
        for task in prog.tasks:
            prog.update(task.id, total=task.completed)
    return final


def _show_event(prog: Progress, event: dict[str, Any], *, roll: Any, rep: Any, n: int) -> None:
    """Show one progress event of a run (a ``custom`` stream chunk) on its bars and above them."""
    ev = event.get("event")
    if ev == "trajectory_finished":
        prog.advance(roll)
        mark = {"answered": "[green]✓[/]", "failed": "[red]✗[/]"}.get(event["status"], "[yellow]·[/]")
        why = f" [dim]({_shown(one_line(event['error'], 100))})[/]" if event.get("error") else ""
        prog.console.print(
            f"  {mark} {event['id']:<12} {event['kind']:<8} {event['status']:<10} "
            f"steps={event['steps']} answer={_shown(repr(one_line(event['answer'] or '', 60)))}{why}"
        )
    elif ev == "branch_picked":
        prog.console.print(
            f"  [yellow]⑂[/] round {event['round']}: branch from {event['parent']} step {event['step']} "
            f"({event['region']} PPL {event['score']:.2f})"
        )
    elif ev == "report_written":
        prog.update(rep, visible=True, total=max(n, 1))
        prog.advance(rep)


def _show_result(final: dict[str, Any], args: argparse.Namespace) -> None:
    from langgraph_parallelmuse.view import render_tree

    # Written first: printed first, it was lost to a closed stdout (`| head`), whose error ends the command.
    # With the model as bench results record it: a calibration fitted on this output then knows it.
    _write_json({**final, "model": _model_identity(args)}, args)
    screen = _screen(args.json)
    screen.print(Panel(_shown(render_tree(final.get("trajectories", []))), title="Trajectory tree"))
    for report in final.get("reports", []):
        screen.print(Panel(_shown(report["text"]), title=f"Report {report['trajectory_id']} ({report['status']})"))
    screen.print(stats_table(final))
    stats = final.get("stats") or {}
    for problem in (stats.get("compress") or {}).get("fallback_problems") or []:
        screen.print(f"[yellow]reports fell back:[/] {_shown(problem)}")
    roll = stats.get("rollout") or {}
    if (calls := roll.get("tool_calls", 0)) and roll.get("tool_errors", 0) * 2 > calls:
        # The trajectories answered from what the model already believed: the evidence never came.
        screen.print(
            f"[bold yellow]warning: {roll['tool_errors']} of {calls} tool calls failed[/] "
            f"({_shown('; '.join(roll.get('tool_error_reasons') or []))}): the answer rests on little or no evidence"
        )
    answer = final.get("answer")
    # Without an answer the panel says why (the same error): no aggregator's pick was there to be used.
    if answer is not None and (error := (stats.get("aggregate") or {}).get("error")):
        screen.print(f"[yellow]the aggregator's pick was not used:[/] {_shown(error)}")
    if note := (stats.get("aggregate") or {}).get("note"):
        screen.print(f"[yellow]note:[/] {_shown(note)}")
    screen.print(
        Panel(
            _shown(answer if answer is not None else _no_answer(final)),
            title=f"Answer (source: {final.get('answer_source')})",
            border_style="bold green" if answer is not None else "bold red",
        )
    )


def _screen(output: str | None) -> Console:
    """Where a command prints its result for the eye: standard output, but standard error when the
    file it writes (``--json``, ``--out``) is standard output (``--json /dev/stdout | jq``): the text
    followed the JSON there, which then no longer parsed."""
    try:
        to_stdout = output is not None and os.path.samestat(os.stat(output), os.fstat(1))
    except OSError:  # no such file yet, or no standard output
        to_stdout = False
    return console if to_stdout else out


def _no_answer(final: dict[str, Any]) -> str:
    """Why a run has no answer, as its aggregate step wrote it in its last message ("No answer: …").

    Whatever the aggregation: a baseline's (``--aggregation majority``) keeps no error in the stats,
    only the ``parallelmuse`` aggregation does.

    Example:
        >>> from langchain_core.messages import AIMessage
        >>> said = AIMessage("No answer: no trajectory answered (2 max_turns).", name="parallelmuse")
        >>> _no_answer({"messages": [said]})
        'No answer: no trajectory answered (2 max_turns).'
        >>> _no_answer({"stats": {"aggregate": {"error": "no report carries an answer"}}})
        'No answer: no report carries an answer.'
    """
    last = (final.get("messages") or [None])[-1]
    if getattr(last, "name", None) == "parallelmuse" and str(getattr(last, "content", "")).startswith("No answer"):
        return str(last.content)
    error = ((final.get("stats") or {}).get("aggregate") or {}).get("error")
    return f"No answer: {error or 'no trajectory answered'}."


def _writable_file(path: str, flag: str) -> None:
    """Refuse an output file that cannot be written, before any work whose result it would hold."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{flag} {path} is a directory: pass a file name")
    folder = target.parent
    if target.exists():  # /dev/stdout too, whose folder a user cannot write
        writable = os.access(target, os.W_OK)
    elif not folder.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist; create it or pick another path")
    else:
        writable = os.access(folder, os.W_OK)
    if not writable:
        raise ConfigError(f"{flag} {path} is not writable: pick another path")


def _write_json(result: dict[str, Any], args: argparse.Namespace) -> None:
    if not args.json:
        return
    result = _jsonable(result)
    try:
        # Encoded before the file is opened: a text UTF-8 cannot encode left it emptied.
        data = (json.dumps(result, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        with replacing(args.json) as tmp:  # a full disk leaves the earlier file, not a cut one
            tmp.write_bytes(data)
    except (OSError, UnicodeEncodeError) as exc:
        # Checked up front, but the disk can still fill or the folder go, and a text can hold a lone
        # surrogate UTF-8 cannot encode: the result is kept anyway, escaped as ASCII JSON.
        fd, kept = tempfile.mkstemp(prefix="parallelmuse-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(result, f, indent=2)
        raise ParallelMuseError(f"could not write --json {args.json} ({exc}); the result is in {kept}") from exc
    console.print(f"{'Partial' if 'partial' in result else 'Full'} result written to {args.json}", markup=False)


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: through symbolic links, ``..`` and hard links.

    Example:
        >>> _same_file("runs/../results.jsonl", "results.jsonl"), _same_file("a.json", "b.json")
        (True, False)
    """
    if os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b)):
        return True
    try:
        return os.path.samefile(os.path.expanduser(a), os.path.expanduser(b))
    except OSError:  # one does not exist (yet): an output still to create is no input
        return False


def _refuse_overwriting(flag: str, path: str, inputs: Sequence[tuple[str, str | None]]) -> None:
    """Refuse an output file that is one of the files the command reads, before it runs.

    Args:
        flag: The output's flag, as the message names it.
        path: The output file.
        inputs: ``(flag, path)`` of each file the command reads (a path ``None``: not given).

    Raises:
        ConfigError: ``path`` names the file of one of ``inputs``; the message names both flags.
    """
    for source, given in inputs:
        if given and _same_file(path, given):
            raise ConfigError(
                f"{flag} {path} names the same file as {source} {given}: writing it would destroy that input; "
                f"give {flag} another path"
            )


def _ask_interrupted(args: argparse.Namespace) -> str:
    """What a Ctrl-C of ``ask`` leaves, as its last line says (after ``interrupted (Ctrl-C); ``)."""
    if not args.db:
        return "without --db the run cannot be resumed (start one with --db FILE --run-id NAME to make it resumable)"
    run = "" if args.run_id else " --run-id (the run id printed above)"
    return f"rerun the same command with{run} --resume to continue it"


# The flags a run's settings leave unread, with the setting that does and the way out: the settings
# cannot tell these given from their defaults (ParallelMuseConfig refuses rounds, a calibration and
# crossover where they would be ignored).
_UNREAD = (
    (
        lambda s: s.mode == "none",
        "mode none samples every trajectory from scratch",
        ("k", "t", "diverse_branches"),
        "choose a branching --mode (e.g. exploration)",
    ),
    (
        lambda s: s.aggregation != "parallelmuse",
        "--aggregation {aggregation} votes on the trajectories' answers, with no report and no aggregator",
        ("max_report_tokens", "max_aggregate_tokens", "report_form"),
        "use --aggregation parallelmuse",
    ),
)


def _refuse_unread(args: argparse.Namespace, settings: ParallelMuseConfig) -> None:
    """Refuse flags given for a run whose settings (given, or a resumed run's) never read them
    (``--mode none --k 3``): the run went as if they had not been given."""
    for applies, why, names, instead in _UNREAD:
        given = [name for name in names if getattr(args, name) not in (None, False)]
        if given and applies(settings):
            flags = " and ".join("--" + name.replace("_", "-") for name in given)
            raise ConfigError(
                f"{why.format(**settings.model_dump())}, so {flags} would change nothing: drop {flags}, or {instead}"
            )


async def _ask_settings(args: argparse.Namespace) -> tuple[argparse.Namespace, ParallelMuseConfig]:
    """The command line (a server's only model named) and the settings ``ask`` runs with, checked with
    its flags before the index opens or the model loads.

    The run ``--run-id`` names is checked against the store (:func:`_stored_run`: a resume's flags are
    validated on top of its stored settings); an output that would replace an input (``--json`` on the
    ``--db`` file, a corpus, the calibration) is refused.
    """
    from langgraph_parallelmuse.persistence import check_db

    if args.resume and not (args.db and args.run_id):
        raise ConfigError("--resume needs --db and --run-id: the store and the name of the interrupted run")
    if args.run_id and not args.db:
        raise ConfigError("--run-id names a run inside --db: add --db FILE (or a postgresql:// URL)")
    # A mistyped path to resume is not made a new store.
    kind = check_db(args.db, existing=args.resume) if args.db else None
    args = _served_name(args)  # a checkpointed run records its model by name: the stored run's is compared
    # A SQLite file still to be created holds no run, and is not created before the index opens (which may fail).
    look = args.run_id and (kind == "postgres" or Path(args.db).expanduser().exists())
    _refuse_web_with_corpus(args)  # before a corpus the run would not read is hashed (or found missing)
    # Before a resume compares them with the stored run's: the run's record and the index read these hashes.
    args = argparse.Namespace(**{**vars(args), "corpus_digests": _corpus_digests(args.corpus)})
    settings = make_config({**(await _stored_run(args) if look else {}), **_overrides(args)})
    _refuse_unread(args, settings)
    if args.json:
        _writable_file(args.json, "--json")
        inputs = [("--db", args.db), ("--calibration", settings.calibration), ("--model-path", args.model_path)]
        _refuse_overwriting("--json", args.json, [*inputs, *(("--corpus", path) for path in args.corpus)])
    return args, settings


async def _ask(args: argparse.Namespace) -> int:
    from langgraph_parallelmuse.graph import create_parallelmuse
    from langgraph_parallelmuse.persistence import open_checkpointer

    # Everything that can be checked without the model is checked first.
    args, settings = await _ask_settings(args)
    tools = _tools(args)  # a missing corpus or search key is found before the model loads
    _warn_other_model(settings.calibration, _model_identity(args))
    # A resumed run's settings are its stored ones: the server is checked for the run's own driver and mode.
    model = _model(args, settings)
    run_id = args.run_id or f"cli-{uuid.uuid4().hex[:8]}"
    async with open_checkpointer(args.db) if args.db else contextlib.nullcontext() as saver:
        # The factory's max_concurrency is the bound a run's context cannot lift: it is the run's (the
        # flag's, else a resumed run's stored one).
        graph = create_parallelmuse(
            model,
            tools=tools,
            config={"max_concurrency": settings.max_concurrency},
            checkpointer=saver,
            trajectory_checkpointer=saver,
        )
        run_config = {
            "configurable": {"thread_id": run_id},
            "max_concurrency": settings.max_concurrency,
            "metadata": {_INPUTS: json.dumps(_run_inputs(args), sort_keys=True)},  # kept with the run
        }
        resumed = await _resume_point(graph, run_config) if args.resume else None
        if resumed is not None and not resumed["state"].get("settings"):
            # Stopped in ``prepare`` (the local model loading): only the question is stored, nothing
            # ran, so the run starts with this command's settings.
            console.print(f"Run {run_id!r} stopped before its trajectories started: starting it", markup=False)
            resumed = None
        console.print(Panel(_shown(args.question), title="Question"))
        console.print(
            f"N={settings.n} M={settings.m} k={settings.k} T={settings.t} mode={settings.mode} "
            f"estimator={settings.estimator}" + (f"  run id: {run_id} (db {redact(args.db)})" if args.db else ""),
            markup=False,
        )
        final = await _ask_run(graph, resumed, run_config, args, n=settings.n)
    _show_result(final, args)
    return 0 if final.get("answer") is not None else 2


async def _ask_run(graph: Any, resumed: dict | None, run_config: dict, args: argparse.Namespace, *, n: int) -> dict:
    """Run, continue or retry the ``ask`` run (``resumed``: its stored state); return its final state.

    Whatever finished is written to ``--json`` when an error or Ctrl-C ends the run, marked partial.
    """
    run_id = run_config["configurable"]["thread_id"]
    failed = _failed(resumed["state"]) if resumed is not None else 0
    if resumed is not None and not resumed["pending"] and not failed:
        console.print(
            f"Run {run_id!r} already finished: its stored result follows (nothing is run again)", markup=False
        )
        return resumed["state"]
    payload, context = None, _overrides(args)
    if resumed is None:
        payload = {"question": args.question}
    elif failed and (not resumed["pending"] or failed == len(resumed["state"]["trajectories"])):
        # A finished run, or one stopped because every trajectory failed (resuming at
        # ``collect`` would only re-raise): ask again with the stored settings; the same run
        # id finds the same threads, finished ones are reused and each failed one continues. A
        # failed parent that goes on is scored anew, so its branches may fork other steps.
        payload, context = {"question": args.question}, resumed["state"]["settings"]
        console.print(
            f"Retrying run {run_id!r}: {failed} of {len(resumed['state']['trajectories'])} trajectories "
            "had failed; each continues from its last step and the finished ones are reused (a branch "
            "is sampled again if its parent, finished now, forks at another step)"
        )
    else:
        console.print(f"Resuming run {run_id!r} at {', '.join(resumed['pending'])}", markup=False)
    try:
        return await _stream(
            graph, payload, run_config, context, n, on_interrupt=functools.partial(_interrupted, args=args)
        )
    except ParallelMuseError as exc:
        if exc.result is not None:  # every trajectory failed, or Stage 2 met a wrong setting
            _write_partial(exc.result, args=args, why=f"stopped by an error: {one_line(str(exc), 300)}")
        raise


def _interrupted(state: dict[str, Any], *, args: argparse.Namespace) -> None:
    """Write the work of a run Ctrl-C (or SIGTERM) stopped to ``--json``, or say why there is none to write.

    With online branching the whole rollout is one graph node, so no trajectory reaches the
    streamed state before every one has ended: a run stopped during it has none to write.
    """
    if not args.json:
        return
    if state.get("trajectories"):
        # main() sets what stopped the run; a caller of args.func of its own has none.
        _write_partial(state, args=args, why=f"{_stopped_by(getattr(args, 'terminated', ()))} before the run finished")
        return
    why = "no trajectory had finished"
    if (state.get("settings") or {}).get("branching") == "online":
        why = "with online branching the trajectories reach the run's state only when the whole rollout has ended"
        if args.db:
            why += "; those that finished are checkpointed in --db, and resuming the run reuses them"
    console.print(f"--json not written: {why}", markup=False)


def _write_partial(result: dict[str, Any], *, args: argparse.Namespace, why: str) -> None:
    """Write the work of a run that did not finish to ``--json`` (nothing finished is lost), its
    ``partial`` field saying why it stopped."""
    _write_json({**result, "partial": why, "model": _model_identity(args)}, args)


def _jsonable(state: dict[str, Any]) -> dict[str, Any]:
    """The result as JSON values, every text redacted (values one by one: redacting the serialized
    text broke JSON escapes and took ``"token": "..."`` for a credential)."""
    from langchain_core.messages import BaseMessage

    from langgraph_parallelmuse.redact import secrets_of

    secrets = secrets_of()

    def conv(v: Any, key: object = None) -> Any:
        if isinstance(v, BaseMessage):
            return {"type": v.type, "content": conv(v.content)}
        if isinstance(v, dict):
            return {k: conv(x, k) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, str) and key != "token":  # one token's text is never a whole credential
            return redact(v, secrets)
        return v

    return conv(state)


async def _agent(args: argparse.Namespace) -> int:
    from langgraph_parallelmuse.agent import RolloutRunner

    settings = _config_from(args, mode="none")  # one trajectory: no budget, no branching
    args = _served_name(args)  # as ask: a wrong model flag or a dead server before the index opens
    _refuse_web_with_corpus(args)
    tools = _tools(args)
    model = _model(args, settings)
    runner = RolloutRunner(model, tools, driver=settings.driver)
    thread = {"configurable": {"thread_id": f"agent-{uuid.uuid4().hex[:8]}"}}
    console.print(Panel(_shown(args.question), title="Question"))
    started = time.perf_counter()
    payload = {"question": args.question, "trajectory_id": "t0", "status": "running", "answer": None}
    final: dict[str, Any] = {}
    with console.status("thinking…") as status:
        async for update in runner.graph.astream(payload, thread, context=settings, stream_mode="updates"):
            for node, delta in update.items():
                for step in (delta or {}).get("steps", []):
                    act = step["action"]
                    thought = step["text"].split("</think>", 1)[0].removeprefix("<think>")
                    what = (
                        f"{act['name']}({json.dumps(act['arguments'], ensure_ascii=False)})"
                        if act["type"] == "tool_call"
                        else f"answer: {act.get('answer')}"
                        if act["type"] == "answer"
                        else f"invalid: {act.get('error')}"
                    )
                    lp = [t["logprob"] for t in step["tokens"]]
                    out.print(
                        f"[bold]step {step['index'] + 1}[/] [dim]({step['generated_tokens']} tokens, "
                        f"mean logprob {sum(lp) / max(len(lp), 1):.2f}, {step['seconds']:.1f}s)[/]"
                    )
                    out.print(f"  [cyan]think[/]  {_shown(one_line(thought or '', 200))}")
                    out.print(f"  [magenta]act[/]    {_shown(what)}")
                for obs in (delta or {}).get("observations", []):
                    out.print(f"  [green]result[/] {_shown(one_line(obs['content'], 160))}")
                    status.update("thinking…")
                if node == "think" and delta and delta.get("status") not in (None, "running"):
                    final = delta
    answered = bool(final.get("answer"))
    out.print(
        Panel(
            _shown(final.get("answer") if answered or not final.get("error") else final["error"]),
            title=f"{final.get('status')} after {time.perf_counter() - started:.1f}s",
            border_style="bold green" if answered else "bold red",
        )
    )
    return 0 if answered else 2


async def _bench(args: argparse.Namespace) -> int:
    from langgraph_parallelmuse.eval.bench import (
        BenchSettings,
        check_doc_ids,
        finished_records,
        run_bench,
        write_outputs,
    )
    from langgraph_parallelmuse.eval.datasets import load_questions
    from langgraph_parallelmuse.tools import CorpusIndex

    if args.judge_model and not args.judge_base_url:
        raise ConfigError(f"--judge-model {args.judge_model!r} names a model on a server: add --judge-base-url")
    if not args.report_only:
        # Results record the models by name, so a server's only model is looked up first.
        args = _served_name(args)
        if args.judge_base_url and args.judge_model is None:
            judge_model = _only_served_model(args.judge_base_url, "--judge-model")
            args = argparse.Namespace(**{**vars(args), "judge_model": judge_model})
    settings = BenchSettings(  # validated here, before any file is read or model loaded
        n=args.n,
        k=args.k,
        t=args.t,
        modes=_names(args.modes, flag="--modes", allowed=tuple(m for m in REGIONS_OF_MODE if m != "none")),
        methods=_names(args.methods, flag="--methods", allowed=tuple(METHODS)),
        estimator=args.estimator,
        seed=0 if args.seed is None else args.seed,
        setting=args.setting,
        max_turns=args.max_turns,
        extra=dict(args.set),
        model=_model_identity(args),
        judge=redact(f"{args.judge_base_url} {args.judge_model}") if args.judge_base_url else None,
    )
    items = load_questions(args.questions, limit=args.limit)
    if not items:
        raise ConfigError(f"--questions {args.questions} holds no questions: one {{id, question, answers}} per line")
    out_dir = Path(args.out)
    results = out_dir / "results.jsonl"
    if not args.report_only:
        _check_bench_inputs(args, settings, items, results)
    # A file on the way to --out made a traceback of the run's mkdir, and an empty report of --report-only.
    if file := next((p for p in (out_dir, *out_dir.parents) if p.exists() and not p.is_dir()), None):
        raise ConfigError(
            f"--out {out_dir}: {file} is a file; bench writes a directory (results.jsonl, summary, plots)"
        )

    def summarise(records: list[dict], *, seed: int) -> None:
        if not records:
            console.print(f"no finished question in {results}: nothing to summarise", markup=False)
            return
        table, plotted = write_outputs(records, out_dir, seed=seed)
        # As written (Markdown): not wrapped at the terminal's width, nor read as markup.
        out.print(table, markup=False, soft_wrap=True)
        if not plotted:
            console.print(
                "matplotlib not installed: no plots (pip install 'langgraph-parallelmuse[plot]')", markup=False
            )

    if args.report_only:
        # Without the run's settings: a report need not repeat its flags, and a served model's name
        # is not looked up without the server. finished_records refuses records run with more than one.
        records = finished_records(results, items)
        if not records:
            raise ConfigError(
                f"--report-only: no finished question of --questions {args.questions} in {results}: "
                "is --out the directory of its run?"
            )
        # The bootstrap seed of the run (its tables' intervals), unless --seed asks for another.
        stored = [r["settings"]["seed"] for r in records if "seed" in r.get("settings", {})]
        summarise(records, seed=args.seed if args.seed is not None or not stored else stored[0])
        return 0
    if not args.corpus:
        sibling = Path(args.questions.replace(".questions.jsonl", ".corpus.jsonl"))
        hint = f" (here: --corpus {sibling})" if sibling.is_file() and sibling != Path(args.questions) else ""
        raise ConfigError("bench needs --corpus: the {id,title,text} JSONL its questions' documents come from" + hint)
    digests = _corpus_digests(args.corpus)  # once: the records' settings and the index's cache key read them
    settings = dataclasses.replace(settings, corpus=_corpus_fingerprint(digests))
    already = len(finished_records(results, items, settings=settings))  # before loading anything
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out_dir}: cannot create it ({exc.strerror}): pick another directory") from exc
    if not os.access(out_dir, os.W_OK):
        raise ConfigError(f"--out {out_dir} is not writable: pick another directory")
    # Else refused by run_bench only once the model had loaded (minutes for a local one).
    if results.exists() and not os.access(results, os.W_OK):
        raise ConfigError(f"--out {out_dir}: {results} is read-only: make it writable, or pick another directory")
    judge = _judge(args)
    index = CorpusIndex.from_jsonl(*args.corpus, digests=digests)
    check_doc_ids(index, items, setting=settings.setting)
    # The server is checked and built for the runs' own settings (--set driver=guided needs the
    # prefilled turn): a partial-rollout mode's when a method runs one, else from-scratch
    # sampling's; its logprobs are checked when a method branches or weighs votes by confidence.
    config = settings.config(settings.modes[0] if settings.needs("partial") else "none")
    model = _model(args, config, logprobs=_needs_logprobs(config, weighted="weighted" in settings.methods))
    started = time.perf_counter()
    failure: RolloutFailedError | None = None
    try:
        with _progress(eta=True) as prog:
            # The resumed questions are done, not speed: the ETA is read from this run's own.
            task = prog.add_task("questions", total=len(items), completed=already)
            prog.advance(task, 0)  # the time the first question's speed is measured from

            def tick(rec: dict) -> None:
                prog.advance(task)
                name = next((m for m in settings.method_names() if rec["methods"][m].get("answer")), None)
                answer = f"{name}={_shown(repr(one_line(rec['methods'][name]['answer'], 50)))}" if name else "no answer"
                prog.console.print(
                    f"  {_shown(rec['id'])}: gold={_shown(repr(rec['answers'][0]))} {answer} ({rec['seconds']:.0f}s)"
                )

            try:
                records = await run_bench(
                    model,
                    index,
                    items,
                    settings,
                    results,
                    concurrency=args.concurrency,
                    judge=judge,
                    progress=tick,
                    log=functools.partial(prog.console.print, markup=False),
                )
            except RolloutFailedError as exc:  # the others finished: summarised, then the failure is the exit
                records, failure = exc.result["records"], exc
    except asyncio.CancelledError:
        # Ctrl-C: the finished questions are on disk; summarise them so the run's tables are
        # current, then let the interrupt end the command.
        records = finished_records(results, items)
        summarise(records, seed=settings.seed)
        console.print(
            f"{len(records)} of {len(items)} questions finished; rerun the same command to continue", markup=False
        )
        raise
    summarise(records, seed=settings.seed)
    console.print(
        f"{len(records)} questions in {time.perf_counter() - started:.0f}s; results in {out_dir}", markup=False
    )
    if failure is not None:
        raise failure
    return 0


def _check_bench_inputs(args: argparse.Namespace, settings: Any, items: Sequence[Any], results: Path) -> None:
    """Check what a bench run reads against what it runs and writes, before the model loads: the
    calibration (fitted on this model's runs, and on other questions), and no input as ``results``.

    Raises:
        ConfigError: The calibration was fitted on some of ``items``, or ``results`` is an input file.
    """
    # Only the partial-rollout methods read the calibration: the others' runs have none.
    calibration = settings.extra.get("calibration") if settings.needs("partial") else None
    _warn_other_model(calibration, settings.model)
    _check_calibration_questions(calibration, items)
    inputs = [("--questions", args.questions), ("--set calibration", calibration)]
    _refuse_overwriting("--out", str(results), [*inputs, *(("--corpus", path) for path in args.corpus)])


def _check_calibration_questions(calibration: str | None, items: Sequence[Any]) -> None:
    """Refuse to bench on questions ``calibration`` was fitted on: their thresholds came from these
    very trajectories' perplexities, so the run would be measured on its own calibration.

    Raises:
        ConfigError: Some of ``items`` (by id, or by question for a calibration fitted on ``ask``
            outputs) are among the calibration's questions; the message names them.
    """
    if calibration is None:
        return
    from langgraph_parallelmuse.calibration import Calibration
    from langgraph_parallelmuse.tools.local_tools import describe_ids

    fitted_on = set(Calibration.load(calibration).questions or ())  # None: not recorded, not checked
    overlap = [item.id for item in items if item.id in fitted_on or item.question in fitted_on]
    if overlap:
        raise ConfigError(
            f"--set calibration={calibration} was fitted on {len(overlap)} of these questions "
            f"({describe_ids(overlap)}): a run on them is measured on its own calibration; bench other "
            "questions (--questions, --limit), or calibrate on runs of other questions"
        )


async def _export(args: argparse.Namespace) -> int:
    from langgraph_parallelmuse.models.export import export_model_result

    with console.status(f"Exporting the embedded SmolLM2 to {args.dir} ({args.dtype})…"):
        path, outcome = export_model_result(args.dir, dtype=args.dtype)
    done = {
        "written": f"Wrote a transformers checkpoint ({args.dtype}) to {path}",
        "reused": f"{path} already holds this {args.dtype} export; nothing written",
        "replaced": f"Replaced the earlier export in {path} with a {args.dtype} checkpoint",
    }[outcome]
    console.print(f"{done}: serve it with vLLM (--model {path})", markup=False)
    return 0


def _question(text: str) -> str:
    """The question argument, refused as the graph would refuse it (empty, too long) before anything loads."""
    from langgraph_parallelmuse.errors import InputError
    from langgraph_parallelmuse.nodes import question_from_input

    try:
        return question_from_input({"question": text})[0]
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _names(text: str, *, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The names a comma-separated flag lists (spaces, empty and repeated entries dropped), each checked.

    Example:
        >>> _names("exploration, reasoning,", flag="--modes", allowed=("exploration", "reasoning"))
        ('exploration', 'reasoning')
    """
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "names none"
        raise ConfigError(f"{flag} {text!r}: {what}; choose from {', '.join(allowed)}")
    return names


def _path(text: str) -> str:
    """A file or folder flag's path with a leading ``~`` expanded, as ``--db``, ``--corpus`` and
    ``--calibration`` read theirs: a ``~`` the shell leaves (``--json=~/r.json``, a quoted path) was
    refused as a missing folder ``~``, or made one in the working directory (``bench --out``).

    Refused when blank, as :func:`_given` refuses it: ``ask --json ""`` wrote no result, silently,
    and ``bench --out ""`` wrote into the working directory.

    Example:
        >>> _path("~/r.json") == os.path.join(os.path.expanduser("~"), "r.json"), _path("a b/r.json")
        (True, 'a b/r.json')
    """
    return os.path.expanduser(_given(text))


def _given(text: str) -> str:
    """A flag's text, refused when blank (``--base-url "$URL"`` with the variable unset): taken as the
    flag not given, ``--base-url`` ran the embedded model, ``--db`` no store, ``--run-id`` a random id
    and ``--doc-ids`` every document.

    Example:
        >>> _given("runs.sqlite")
        'runs.sqlite'
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is blank (an unset shell variable?): give a value or drop the flag")
    return text


def _server_url(text: str) -> str:
    """A server's base URL flag, refused when blank (:func:`_given`) or without ``http(s)://``: refused
    later by the server check, the error named ``base_url=`` and not the flag.

    Example:
        >>> _server_url("http://127.0.0.1:8000/v1")
        'http://127.0.0.1:8000/v1'
    """
    if not is_http_url(_given(text)):
        raise argparse.ArgumentTypeError(
            # Not "has no http://": a URL with a blank around it or no host has one.
            f"{shown_url(text)!r} is no http:// or https:// URL with a host (and no blanks around it): "
            "pass e.g. http://127.0.0.1:8000/v1"
        )
    return text


def _whole(least: int) -> Callable[[str], int]:
    """The ``type=`` of a flag that takes a whole number of at least ``least``.

    Example:
        >>> _whole(0)("7")
        7
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: pass a whole number >= {least}")
        return value

    return parse


def _setting(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` of ``--set``; the value is read as JSON when it parses (numbers, true/false)."""
    name, sep, value = text.partition("=")
    if not sep or name not in ParallelMuseConfig.model_fields:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use FIELD=VALUE with a ParallelMuseConfig field ({', '.join(ParallelMuseConfig.model_fields)})"
        )
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


# What the runs of one calibration must share, as the mixed values' message calls it: the estimator it
# is checked against when used, and the model and top logprobs the scores and confidences depend on.
_ONE_OF = {
    "estimator": ("estimators", "one estimator's runs"),
    "model": ("models", "one model's runs"),
    "top_logprobs": ("top_logprobs", "runs with one top_logprobs"),
}


@dataclasses.dataclass
class _ScoredRuns:
    """The from-scratch trajectories ``calibrate`` fits on, the questions they answered, and what they
    were scored with."""

    uncertainties: list[list[dict]] = dataclasses.field(default_factory=list)
    confidences: list[float | None] = dataclasses.field(default_factory=list)
    questions: list[str | None] = dataclasses.field(default_factory=list)  # None: a record names none
    # Per field of _ONE_OF: each value the runs hold, and the files that hold it.
    seen: dict[str, dict[Any, list[str]]] = dataclasses.field(default_factory=lambda: {k: {} for k in _ONE_OF})

    def add(self, path: str, record: dict, scratch: list[dict], **scored: Any) -> None:
        """Add ``scratch``, the from-scratch trajectories of ``record`` in ``path``, scored as ``scored`` says."""
        self.uncertainties += [t["uncertainty"] for t in scratch]
        self.confidences += [(t.get("stats") or {}).get("lowest_confidence") for t in scratch]
        # An ``ask --json`` output has no id: its question names it.
        self.questions.append(record.get("id") or record.get("question"))
        for name, value in scored.items():
            files = self.seen[name].setdefault(value, [])
            files += [] if path in files else [path]

    def only(self, name: str) -> Any:
        """The one value of the field ``name`` of :data:`_ONE_OF` (``None``: not recorded by some run, or no run).

        A run that does not record it (an ``ask --json`` output names no model, an older bench file
        neither) may be any: it is no conflict, and the calibration records none.

        Raises:
            ConfigError: The runs record more than one; the message names the files of each.
        """
        seen = self.seen[name]
        if len([value for value in seen if value is not None]) > 1:
            plural, fix = _ONE_OF[name]
            mixed = "; ".join(
                f"{'not recorded' if value is None else repr(value)} ({', '.join(files)})"
                for value, files in seen.items()
            )
            raise ConfigError(f"the runs mix {plural}: {mixed}; calibrate from {fix}")
        return None if None in seen else next(iter(seen), None)


def _run_records(path: str) -> list[dict]:
    """The records of one ``calibrate`` input: an ``ask --json`` output, or a bench results.jsonl."""
    hint = "pass bench results.jsonl or `ask --json` files"
    try:
        # UTF-8, as both are written, whatever the locale's encoding.
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror}): {hint}") from exc
    except UnicodeDecodeError as exc:  # a binary file given by mistake (a --db store) was a traceback
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): {hint}") from exc
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:  # JSONL of bench records
        records = []
        # At newlines only: bench writes its records with ensure_ascii=False, and splitlines() also
        # splits at a text's U+2028 or U+0085, which cut a record of a valid file in two.
        lines = [(line_no, line) for line_no, line in enumerate(text.split("\n"), 1) if line.strip()]
        for line_no, line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                # A bench killed while writing leaves its last record cut (bench runs that question again).
                if records and line_no == lines[-1][0] and line.lstrip().startswith("{"):
                    console.print(f"{path} line {line_no}: a record cut by a crash, left out", markup=False)
                    break
                raise ConfigError(f"{path} line {line_no} is not JSON ({exc.msg}): is it a run's output?") from exc
        return records


def _scored_runs(paths: list[str]) -> _ScoredRuns:
    """The from-scratch trajectories of bench or ``ask --json`` outputs, with what they were scored with.

    A bench record gives its model and top logprobs (``--set top_logprobs``, else the default); an
    ``ask --json`` output its config's top logprobs and its model (none in an output written before
    ``ask`` recorded it).
    """
    runs = _ScoredRuns()
    default_top = ParallelMuseConfig.model_fields["top_logprobs"].default
    for path in paths:
        for rec in _run_records(path):
            try:
                trajs = rec.get("trajectories") or []
                trajs = trajs.values() if isinstance(trajs, dict) else trajs
                # From-scratch trajectories only: branches over-represent the uncertain steps.
                scratch = [t for t in trajs if (t.get("origin") or {}).get("kind") in ("initial", "fill")]
                if not scratch:
                    continue
                config = rec.get("settings") or (rec.get("stats") or {}).get("config") or {}
                if "id" in rec:  # a bench record (an ask output has no id): its settings are the bench's
                    model, top = config.get("model"), (config.get("extra") or {}).get("top_logprobs", default_top)
                else:
                    model, top = rec.get("model"), config.get("top_logprobs")
                runs.add(path, rec, scratch, estimator=config.get("estimator", "nll"), model=model, top_logprobs=top)
            except (AttributeError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{path} holds a record without per-step uncertainty ({exc!r}): pass bench results.jsonl "
                    "or `ask --json` outputs"
                ) from exc
    return runs


async def _calibrate(args: argparse.Namespace) -> int:
    from langgraph_parallelmuse.calibration import Calibration

    _writable_file(args.out, "--out")
    _refuse_overwriting("--out", args.out, [("the run file", path) for path in args.runs])
    runs = _scored_runs(args.runs)
    scored = {name: runs.only(name) for name in _ONE_OF}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # each fit's own, though this process warned of another before
        cal = Calibration.fit(
            runs.uncertainties,
            quantile=args.quantile,
            estimator=scored["estimator"] or "nll",
            confidences=runs.confidences,
            stop_quantile=args.stop_quantile,
            model=scored["model"],
            top_logprobs=scored["top_logprobs"],
            questions=None if None in runs.questions else runs.questions,
        )
    for warning in caught:  # a line of the command's output, not Python's "file:line: UserWarning"
        console.print(f"[yellow]warning:[/] {_shown(warning.message)}")
    try:
        cal.save(args.out)
    except OSError as exc:  # checked writable up front, but a disk fills and a reader of --out /dev/stdout goes away
        raise ParallelMuseError(f"could not write --out {args.out} ({exc.strerror or exc})") from exc
    table = Table("threshold", "value", "from")
    for region, threshold in cal.thresholds.items():
        table.add_row(f"{region} perplexity (branch above)", f"{threshold:.3f}", f"{cal.samples[region]} steps")
    if cal.confidence_floor is not None:
        table.add_row(
            "lowest group confidence (stop below)",
            f"{cal.confidence_floor:.3f}",
            f"{cal.confidence_samples} trajectories",
        )
    _screen(args.out).print(table)
    console.print(
        f"{len(runs.uncertainties)} trajectories; wrote {args.out} (use it with --calibration {args.out})",
        markup=False,
    )
    return 0


async def _delete_thread(args: argparse.Namespace) -> int:
    from langgraph_parallelmuse.persistence import adelete_thread_with_trajectories, check_db, open_checkpointer

    check_db(args.db, existing=True)  # not a new store, nor another program's file given the saver's tables
    async with open_checkpointer(args.db) as saver:
        deleted = await adelete_thread_with_trajectories(saver, args.thread)
    if not deleted:
        raise ConfigError(f"--db {redact(args.db)} holds no thread {args.thread!r} and no trajectory thread of it")
    trajectories = f"{len([t for t in deleted if t != args.thread])} trajectory thread(s) of its runs"
    if args.thread in deleted:
        console.print(f"deleted thread {_shown(repr(args.thread))} and {trajectories}")
    else:  # deleted before by a plain thread delete (Studio's)
        console.print(f"thread {_shown(repr(args.thread))} held no checkpoint; deleted {trajectories}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parallelmuse", description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer a question with the full ParallelMuse pipeline")
    ask.add_argument("question", type=_question)
    _add_model_args(ask)
    _add_config_args(ask)
    ask.add_argument(
        "--json", "--out", dest="json", type=_path, help="write the full result (trajectories, reports) here"
    )
    ask.add_argument(
        "--db", type=_given, help="SQLite file or postgresql:// URL that checkpoints the run (enables --resume)"
    )
    ask.add_argument("--run-id", type=_given, help="name of the run inside --db")
    ask.add_argument(
        "--resume",
        action="store_true",
        help="continue the run --run-id from --db: same question; its stored settings apply",
    )
    ask.set_defaults(func=_ask, on_interrupt=_ask_interrupted)
    agent = sub.add_parser("agent", help="run one agent trajectory and show every step")
    agent.add_argument("question", type=_question)
    _add_model_args(agent)
    _add_config_args(agent, only=TRAJECTORY_FIELDS)
    agent.set_defaults(func=_agent)
    bench = sub.add_parser("bench", help="compare ParallelMuse with the baselines on a QA set")
    bench.add_argument("--questions", required=True, type=_path, help="{id, question, answers, ...} JSONL")
    bench.add_argument(
        "--setting",
        choices=["distractor", "open"],
        default="distractor",
        help="distractor: tools see only each question's context_doc_ids",
    )
    bench.add_argument("--limit", type=_whole(1), default=None, help="first N questions only (>= 1)")
    bench.add_argument("--n", type=int, default=8)
    bench.add_argument("--k", type=int, default=2)
    bench.add_argument("--t", type=int, default=3)
    bench.add_argument(
        "--modes",
        default="exploration,reasoning,mixed",
        help="comma-separated partial-rollout modes, from: exploration, reasoning, mixed, all",
    )
    bench.add_argument("--estimator", default="nll", choices=["nll", "entropy"])
    bench.add_argument("--max-turns", type=int, default=ParallelMuseConfig.model_fields["max_turns"].default)
    bench.add_argument(
        "--seed",
        # numpy's bootstrap generator takes no negative seed: -1 ran every question, then failed the summary.
        type=_whole(0),
        default=None,
        help="sampling and bootstrap seed, >= 0 (default: 0; with --report-only: the one the records were run with)",
    )
    bench.add_argument("--concurrency", type=_whole(1), default=1, help="questions in flight at once (>= 1)")
    bench.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, from: {', '.join(METHODS)} (partial/parallelmuse run once per mode)",
    )
    bench.add_argument(
        "--set",
        action="append",
        default=[],
        type=_setting,
        metavar="FIELD=VALUE",
        help="any other ParallelMuseConfig field, for every method's runs, e.g. --set rounds=2 "
        "--set diverse_branches=true --set max_concurrency=2 (repeatable; refused: the fields with a flag "
        "of their own, and m, crossover, early_stop, consensus, aggregation)",
    )
    bench.add_argument("--out", default="bench-results/run", type=_path, help="output directory (resumable)")
    bench.add_argument(
        "--report-only",
        action="store_true",
        help="load no model: write summary.md/json and the plots from the questions already in --out",
    )
    bench.add_argument(
        "--judge-base-url",
        type=_server_url,
        help="OpenAI-compatible server of an LLM judge (BrowseComp grading prompt); adds a 'judge' score",
    )
    bench.add_argument(
        "--judge-model", type=_given, help="judge model name on that server (default: the one it serves)"
    )
    _add_model_args(bench, bench=True)
    bench.set_defaults(func=_bench, on_interrupt="rerun the same command to continue; finished questions are kept")
    cal = sub.add_parser(
        "calibrate", help="learn branching thresholds (for --calibration) from earlier runs' trajectories"
    )
    cal.add_argument("runs", nargs="+", type=_path, help="bench results.jsonl files or `ask --json` outputs")
    cal.add_argument("--out", required=True, type=_path, help="calibration file to write")
    cal.add_argument("--quantile", type=float, default=DEFAULT_QUANTILE, help="share of steps that will not branch")
    cal.add_argument(
        "--stop-quantile", type=float, default=0.1, help="share of trajectories early_stop would have stopped"
    )
    cal.set_defaults(func=_calibrate)
    export = sub.add_parser(
        "export-model", help="write the embedded SmolLM2 as a transformers checkpoint directory (for vLLM/SGLang)"
    )
    export.add_argument("dir", help="directory to write (reused if it already holds this export)")
    export.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    export.set_defaults(func=_export)
    delete = sub.add_parser(
        "delete-thread",
        help="delete a thread and the trajectory threads its runs made (a plain thread delete leaves them)",
    )
    delete.add_argument("thread", help="the thread id (a CLI run's --run-id, a Studio thread's id)")
    delete.add_argument("--db", required=True, type=_given, help="the SQLite file or postgresql:// URL holding it")
    delete.set_defaults(func=_delete_thread)
    return parser


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM (a job's time limit, ``timeout``, ``docker stop``) takes Ctrl-C's path while the block runs.

    It killed the process at once: ``ask`` wrote no partial ``--json`` and, without ``--db``, lost every
    finished trajectory, which Ctrl-C would have kept. The handler runs SIGINT's (``asyncio.run``'s:
    the main task is cancelled, then KeyboardInterrupt), or raises KeyboardInterrupt where SIGINT is
    ignored (a background job). A handler already set (an app's) is left alone, as outside the main
    thread, where no handler can be set. Yields a list that gets the signal's number once it came.
    """
    came: list[int] = []

    def interrupt(signum: int, frame: Any) -> None:
        came.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    own = False
    with contextlib.suppress(ValueError):  # not the main thread
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, interrupt)
            own = True
    try:
        yield came
    finally:
        if own:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stopped_by(terminated: Sequence[int]) -> str:
    """What stopped a run (``terminated``: the SIGTERMs :func:`_terminate_as_interrupt` took), as its
    last line and a partial ``--json`` say: the file named Ctrl-C for a job's time limit too."""
    return "terminated (SIGTERM)" if terminated else "interrupted (Ctrl-C)"


@contextlib.contextmanager
def _escaping_unencodable() -> Iterator[None]:
    """Standard output escapes the characters its encoding cannot hold while the block runs, as standard
    error does ("Zürich" as ``Z\\xfcrich`` under ``PYTHONIOENCODING=ascii``).

    The first such character of an answer, a page or a table raised UnicodeEncodeError, after the whole
    run: its answer was never shown, and the command exited 1 with a traceback.
    """
    stream = sys.stdout
    # Closed, reconfigure raised ValueError before the command ran (one printing nothing there ran before).
    errors = stream.errors if isinstance(stream, io.TextIOWrapper) and not stream.closed else None
    # surrogateescape raises on all but its own surrogates: a C locale without UTF-8 mode (PYTHONUTF8=0)
    # writes ASCII with it.
    escaping = errors in ("strict", "surrogateescape")
    if escaping:
        stream.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        # Reconfiguring flushes: a reader gone (`| head`) must not replace the block's own exception.
        with contextlib.suppress(OSError, ValueError):
            if escaping:
                stream.reconfigure(errors=errors)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    terminated: list[int] = []
    try:
        with _terminate_as_interrupt() as terminated, _escaping_unencodable():
            args.terminated = terminated  # filled when SIGTERM comes: what the interrupted run writes reads it
            return asyncio.run(args.func(args))
    except ParallelMuseError as exc:
        text = redact(str(exc))
        # Bounded: a message may carry a server's whole error page. Not wrapped (soft_wrap): in a log,
        # wrapped at 80 columns, `grep error:` found a part of it and a long path was cut in two.
        shown = _shown(text if len(text) <= 2000 else text[:1999] + "…")
        console.print(f"[bold red]error:[/] {shown}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        hint = getattr(args, "on_interrupt", "rerun the command")
        stopped = f"{_stopped_by(terminated)}; {hint(args) if callable(hint) else hint}"
        console.print(stopped, markup=False, soft_wrap=True)
        return 128 + signal.SIGTERM if terminated else 130


if __name__ == "__main__":
    sys.exit(main())
