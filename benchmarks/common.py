"""Setup shared by the benchmark scripts: a dev set of ``../shared/eval-data`` and its index, the
settings every resumable results file records in its rows, and the vLLM server the serving
benchmarks start (the library's own ``serving`` helpers, with the settings they share)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

from langgraph_parallelmuse.eval import QAItem, eval_data_dir, load_questions
from langgraph_parallelmuse.models.export import export_model
from langgraph_parallelmuse.models.server import ServerChatModel
from langgraph_parallelmuse.serving import ServerSpec, vllm_spec
from langgraph_parallelmuse.tools import CorpusIndex

DATASETS = ("hotpotqa_train100", "musique_train100")
ROOT = Path(__file__).resolve().parents[1]
SERVED_MODEL = "smollm2"


def integer(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``; argparse names the flag in its refusal."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give one >= {minimum}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: give an integer >= {minimum}")
        return value

    return parse


def integers(minimum: int) -> Callable[[str], list[int]]:
    """An argparse ``type``: comma-separated integers >= ``minimum`` (``"1,5"``), sorted, each once."""
    one = integer(minimum)

    def parse(text: str) -> list[int]:
        parts = [x.strip() for x in text.split(",") if x.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"{text!r}: give integers >= {minimum}, comma-separated, e.g. 1,5")
        return sorted({one(x) for x in parts})

    return parse


def share(low: float, high: float, *, high_included: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a number in (``low``, ``high``), or (``low``, ``high``] with ``high_included``."""
    span = f"({low:g}, {high:g}{']' if high_included else ')'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give one in {span}") from None
        if not (low < value < high or (high_included and value == high)):
            raise argparse.ArgumentTypeError(f"{value:g}: give a number in {span}")
        return value

    return parse


def question_range(text: str) -> tuple[int, int]:
    """An argparse ``type``: ``START:END``, a non-empty slice of a dev set's questions (0 <= START < END)."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        first, last = int(start), int(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give START:END, two integers, e.g. 20:50") from None
    if not 0 <= first < last:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 <= START < END, e.g. 20:50 (questions 21..50)")
    return first, last


def arguments(
    doc: str,
    *,
    limit: int,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
    check: Callable[[argparse.Namespace], str | None] | None = None,
    limit_minimum: int = 1,
) -> argparse.Namespace:
    """``--dataset``, ``--limit`` and ``--seed``, the options every benchmark script takes.

    ``extra`` adds a script's own options to the parser; ``check`` looks at the parsed options
    together and returns what to change, if anything, which the parser refuses like a bad option.
    ``--limit`` is refused below ``limit_minimum``: 1 unless a script gives 0 a meaning.
    """
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--dataset", choices=DATASETS, default=DATASETS[0])
    ap.add_argument("--limit", type=integer(limit_minimum), default=limit, help="the first LIMIT dev-set questions")
    ap.add_argument("--seed", type=int, default=0)
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    problem = check(args) if check is not None else None
    if problem:
        ap.error(problem)
    return args


def corpus_file(name: str) -> Path:
    """The corpus JSONL (one ``{"title", "text", ...}`` paragraph a line) of dev set ``name``."""
    return eval_data_dir() / f"{name}.corpus.jsonl"


def dev_set(name: str, limit: int) -> tuple[list[QAItem], CorpusIndex]:
    """The first ``limit`` questions of a dev set and the full-text index of its corpus."""
    items = load_questions(eval_data_dir() / f"{name}.questions.jsonl", limit=limit)
    return items, CorpusIndex.from_jsonl(corpus_file(name))


def as_stored(settings: dict) -> dict:
    """``settings`` as a JSON row holds them (tuples become lists), to compare with a stored row's."""
    return json.loads(json.dumps(settings))


def resumable_rows(path: Path | None, settings: dict, *, unrecorded: dict | None = None) -> list[dict]:
    """The rows of a resumable JSON-lines results file, all measured with ``settings``.

    Each row records the settings it was measured with (``"settings"``); a rerun continues a file
    only with the same ones, so one table never mixes two experiments. ``unrecorded``: the settings
    a row that records none was measured with (a file written before rows carried them), if known.

    Raises:
        SystemExit: a row was measured with other settings, or records none and ``unrecorded`` is
            not given.
    """
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    wanted = as_stored(settings)
    for row in rows:
        had = row.get("settings", None if unrecorded is None else as_stored(unrecorded))
        if had != wanted:
            clash = (
                ", ".join(
                    f"{k} {had.get(k)!r} (now {wanted.get(k)!r})"
                    for k in sorted(wanted.keys() | had.keys())
                    if had.get(k) != wanted.get(k)
                )
                if had is not None
                else "settings not recorded"
            )
            raise SystemExit(
                f"{path} holds {row.get('id', 'a row')} measured with other settings: {clash}; "
                "rerun with those settings to continue it, or choose another --out"
            )
    return rows


def vllm_options(ap: argparse.ArgumentParser) -> None:
    """``--venv``, ``--eager`` and ``--block-size``: how a benchmark starts its vLLM servers."""
    ap.add_argument(
        "--venv", type=Path, default=Path(os.environ.get("PARALLELMUSE_SERVING_VENV", ROOT / ".venv-serving"))
    )
    ap.add_argument(
        "--eager", action="store_true", help="vLLM with --enforce-eager (default: compiled, as users run it)"
    )
    ap.add_argument("--block-size", type=integer(32), default=32, help="vLLM KV block size (CPU: multiples of 32)")


def vllm_specs(args: argparse.Namespace, count: int) -> list[ServerSpec]:
    """``count`` vLLM servers of the embedded model's weights (exported once, bfloat16), as
    ``vllm_options`` set them, with a 2 GiB KV cache each."""
    model_dir = export_model(ROOT / ".cache" / "smollm2-bf16")
    specs = []
    for _ in range(count):  # one spec each: each picks its own port
        spec = vllm_spec(
            model_dir,
            venv=args.venv,
            served_model_name=SERVED_MODEL,
            enforce_eager=args.eager,
            block_size=args.block_size,
            dev_mode=True,
            kv_cache_gib=2,
        )
        # A model step in flight when the server is paused (SIGSTOP, while the in-process engine
        # runs) outlives vLLM's 300 s step timeout by the length of the pause, and its engine core
        # dies: it did after a pause of 464 s on this 2-core machine.
        specs.append(dataclasses.replace(spec, env={**spec.env, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "43200"}))
    return specs


def server_model(url: str, routing_header: str | None = None) -> ServerChatModel:
    """The library's chat model for a server started from ``vllm_specs`` (logprobs on, no retries)."""
    return ServerChatModel(
        base_url=f"{url}/v1",
        model=SERVED_MODEL,
        logprobs=True,
        top_logprobs=16,
        timeout=1800,
        max_retries=0,
        routing_header=routing_header,
    )
