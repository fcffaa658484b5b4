"""Setup shared by the benchmark scripts: a dev set of ``../shared/eval-data`` and its index, and
the settings every resumable results file records in its rows."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from langgraph_parallelmuse.eval import QAItem, eval_data_dir, load_questions
from langgraph_parallelmuse.tools import CorpusIndex

DATASETS = ("hotpotqa_train100", "musique_train100")


def arguments(
    doc: str, *, limit: int, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """``--dataset``, ``--limit`` and ``--seed``, the options every benchmark script takes.

    ``extra`` adds a script's own options to the parser.
    """
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--dataset", choices=DATASETS, default=DATASETS[0])
    ap.add_argument("--limit", type=int, default=limit)
    ap.add_argument("--seed", type=int, default=0)
    if extra is not None:
        extra(ap)
    return ap.parse_args()


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


def resumable_rows(path: Path | None, settings: dict) -> list[dict]:
    """The rows of a resumable JSON-lines results file, all measured with ``settings``.

    Each row records the settings it was measured with (``"settings"``); a rerun continues a file
    only with the same ones, so one table never mixes two experiments.

    Raises:
        SystemExit: a row was measured with other settings, or records none (written before rows
            carried them).
    """
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    wanted = as_stored(settings)
    for row in rows:
        had = row.get("settings")
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
