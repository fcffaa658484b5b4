"""Setup shared by the benchmark scripts: a dev set of ``../shared/eval-data`` and its index."""

from __future__ import annotations

import argparse
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
