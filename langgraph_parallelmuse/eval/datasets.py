"""Loading the multi-hop QA development sets (HotpotQA, MuSiQue) kept outside the repository.

The files live in ``../shared/eval-data`` next to the project root (see its README); each
``*.questions.jsonl`` line is ``{id, question, answers, supporting_doc_ids, context_doc_ids,
dataset, split, meta}``. Only ``id``, ``question`` and ``answers`` are required: without
``supporting_doc_ids`` retrieval recall is not reported, and without ``context_doc_ids`` only the
open setting (the whole corpus) can run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph_parallelmuse.errors import ParallelMuseError
from langgraph_parallelmuse.eval.scoring import normalize_answer
from langgraph_parallelmuse.files import jsonl_objects

__all__ = ["EVAL_DATA_ENV", "EvalDataError", "QAItem", "eval_data_dir", "load_questions"]

EVAL_DATA_ENV = "PARALLELMUSE_EVAL_DATA"

# Gold documents are optional (``[]`` when absent): recall needs supporting_doc_ids, the
# distractor setting context_doc_ids, and each says so when they are missing.
_DOC_LISTS = ("supporting_doc_ids", "context_doc_ids")
# What each line holds, as an error names it.
_FIELDS = '"id", "question", "answers", ...'


class EvalDataError(ParallelMuseError, ValueError):
    """An evaluation file is malformed; the message names the file, the line and the problem."""


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answers and documents.

    Attributes:
        id: Dataset question id.
        question: The question text.
        answers: The gold answer followed by its aliases.
        supporting_doc_ids: Corpus ids of the documents that hold the answer (``[]``: not given,
            so retrieval recall is not reported).
        context_doc_ids: The question's own pool of documents (distractor setting; ``[]``: not
            given, so only the open setting can run).
        dataset: Source dataset, e.g. ``"hotpotqa"`` or ``"musique"``.
        meta: Dataset-specific extras (split, level, MuSiQue's question decomposition, ...).
    """

    id: str
    question: str
    answers: list[str]
    supporting_doc_ids: list[str]
    context_doc_ids: list[str]
    dataset: str
    meta: dict[str, Any] = field(default_factory=dict)


def _lone_surrogate_at(value: Any, where: str) -> str | None:
    """Find a string in a parsed JSON value that cannot be written as UTF-8.

    Args:
        value: A value ``json.loads`` returned.
        where: How to name ``value`` in a message, e.g. ``"field 'meta'"``.

    Returns:
        ``where`` extended to the first offending string (object keys included), or ``None``.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, list):
        for index, element in enumerate(value):
            if found := _lone_surrogate_at(element, f"{where}[{index}]"):
                return found
    elif isinstance(value, dict):
        for key, element in value.items():
            if found := _lone_surrogate_at(key, f"a key of {where}") or _lone_surrogate_at(
                element, f"{where}[{key!r}]"
            ):
                return found
    return None


def _a_number(value: object) -> bool:
    """A number (not a bool) that was meant as text: ``"id": 7`` for ``"id": "7"``."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _parse_item(obj: dict[str, Any], where: str) -> QAItem:
    """The question a line's object ``obj`` gives; ``where`` (``"file:line"``) names it in errors."""
    # A JSON escape such as \ud83c parses to a lone surrogate the reader's raw-byte check cannot see;
    # the bench would only fail writing its record, after the whole rollout for the question had run.
    for key, value in obj.items():
        if bad := _lone_surrogate_at(key, "a field name") or _lone_surrogate_at(value, f"field {key!r}"):
            raise EvalDataError(
                f"{where}: {bad} must be valid UTF-8 text (no lone surrogate escapes such as "
                "\\ud83c without its pair): write the character itself or its full escape pair"
            )
    for key in ("id", "question"):
        value = obj.get(key)
        if isinstance(value, str) and value.strip():
            continue
        # "missing or empty" misled about an id given as a number (7 where "7" was meant).
        problem = "is missing" if value is None else f"must be a non-empty string, got {value!r:.80}"
        raise EvalDataError(f"{where}: field {key!r} {problem}" + (f': write "{value}"' if _a_number(value) else ""))
    for key in ("answers", *_DOC_LISTS):
        value = obj.get(key)
        if value is None and key in _DOC_LISTS:  # optional: null is read as absent, as meta and dataset are
            value = []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            # One answer written bare ("Paris") is the usual slip: the fix is that answer in a list.
            fix = f": write [{json.dumps(value, ensure_ascii=False)}]" if isinstance(value, str) else ""
            raise EvalDataError(f"{where}: field {key!r} must be a list of strings, got {value!r:.80}{fix}")
        # No corpus document has such an id (the corpus refuses them): the question would be judged
        # on documents that are not there.
        if key in _DOC_LISTS and (bad := next((v for v in value if v != v.strip() or not v), None)) is not None:
            fix = "drop it" if not bad.strip() else f"write {json.dumps(bad.strip(), ensure_ascii=False)}"
            raise EvalDataError(f"{where}: field {key!r} holds the id {bad!r}, blank or with spaces around it: {fix}")
    if not obj["answers"]:
        raise EvalDataError(f"{where}: field 'answers' is empty; each question needs a gold answer")
    # Scoring compares normalised forms: an answer that normalises to nothing matches no prediction,
    # so the question would score 0 for every method and silently lower every mean.
    if not any(normalize_answer(answer) for answer in obj["answers"]):
        raise EvalDataError(
            f"{where}: field 'answers' {obj['answers']!r} has no answer left once punctuation, "
            "articles and spaces are dropped, so none can ever match; give at least one real answer"
        )
    # null is read as absent, as for the other optional fields; any other non-object is a mistake.
    meta = {} if obj.get("meta") is None else obj["meta"]
    if not isinstance(meta, dict):
        raise EvalDataError(
            f"{where}: field 'meta' must be an object, got {type(meta).__name__}: write {{...}} or leave it out"
        )
    # The split is kept in meta so QAItem stays small while nothing from the file is lost.
    if "split" in obj:
        meta = {"split": obj["split"], **meta}
    return QAItem(
        id=obj["id"],
        question=obj["question"],
        answers=list(obj["answers"]),
        supporting_doc_ids=list(obj.get("supporting_doc_ids") or []),
        context_doc_ids=list(obj.get("context_doc_ids") or []),
        # Optional like meta: null is absent, not the name 'None'.
        dataset="" if obj.get("dataset") is None else str(obj["dataset"]),
        meta=meta,
    )


def load_questions(path: str | os.PathLike[str], *, limit: int | None = None) -> list[QAItem]:
    """Read a ``*.questions.jsonl`` file.

    Args:
        path: The questions file; a pipe (a FIFO, ``/dev/stdin``, a shell's ``<(...)``) is read too.
        limit: Keep only the first ``limit`` questions (``None`` reads all).

    Returns:
        The questions in file order. Blank lines are skipped. ``supporting_doc_ids`` and
        ``context_doc_ids`` a line lacks (or gives as ``null``) are ``[]``.

    Raises:
        EvalDataError: ``path`` is not a readable file (missing, a directory, no read permission),
            or a line is not UTF-8 (raw bytes, or a lone surrogate escape such as ``\\ud83c`` in
            any string) or not valid JSON, lacks a required field (``id``, ``question``, ``answers``
            with at least one answer that is not empty once normalised), has one of the wrong type
            (``meta`` not an object) or repeats an earlier line's ``id``; the message gives
            ``file:line`` (the file alone when it cannot be read) and the problem. A UTF-8 byte
            order mark at the start of the file is skipped.

    Example:
        >>> import json, os, tempfile
        >>> row = {"id": "q1", "question": "Capital of France?", "answers": ["Paris"],
        ...        "supporting_doc_ids": ["d1"], "context_doc_ids": ["d1", "d2"],
        ...        "dataset": "toy", "split": "dev", "meta": {}}
        >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        ...     _ = f.write(json.dumps(row) + "\\n")
        >>> [item.answers for item in load_questions(f.name)]
        [['Paris']]
        >>> os.remove(f.name)
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    path = Path(path)
    try:  # a stat (a folder on the way without search permission), the open or a read may fail
        if path.is_dir():
            raise EvalDataError(
                f"{path}: a directory, not a questions file (a JSONL of {{id, question, answers, ...}})"
            )
        # exists(), not is_file(): a pipe (`--questions <(head -20 f.jsonl)`, /dev/stdin, a FIFO) is
        # read as a file is; it can be read once only, and is (no other pass over it follows).
        if not path.exists():
            raise EvalDataError(f"{path}: no such questions file (a JSONL of {{id, question, answers, ...}})")
        with contextlib.closing(jsonl_objects(path, fields=_FIELDS, error=EvalDataError)) as values:
            return _read_items(values, path, limit)
    except OSError as exc:  # no read permission, a disk error: named with the file, not a traceback
        raise EvalDataError(
            f"{path}: cannot read the questions file ({exc.strerror or exc}): check its permissions, "
            "or give a copy that can be read"
        ) from exc


def _read_items(values: Iterable[tuple[int, dict[str, Any]]], path: Path, limit: int | None) -> list[QAItem]:
    """The questions of a questions file's ``values`` (each with its line), at most ``limit``, each
    checked by :func:`_parse_item`.

    Raises:
        EvalDataError: A line is malformed or repeats an earlier line's ``id``.
    """
    items: list[QAItem] = []
    line_of: dict[str, int] = {}
    # islice reads no line past the limit: one there is never parsed, so cannot fail the load.
    for lineno, obj in itertools.islice(values, limit):
        item = _parse_item(obj, f"{path}:{lineno}")
        if item.id in line_of:
            # Results are kept by id: a resumed bench would report one of the two twice.
            raise EvalDataError(
                f"{path}:{lineno}: duplicate id {item.id!r} (also on line {line_of[item.id]}): "
                "give each question its own id"
            )
        line_of[item.id] = lineno
        items.append(item)
    return items


def eval_data_dir() -> Path:
    """Locate the shared evaluation data directory.

    The environment variable ``PARALLELMUSE_EVAL_DATA`` wins when set; otherwise, in a checkout
    of the project (the folder holding the package has a ``pyproject.toml``), the directory is
    ``../shared/eval-data`` next to it. An installed package has no such folder: set the variable.

    Returns:
        The directory holding the ``*.questions.jsonl`` and ``*.corpus.jsonl`` files.

    Raises:
        FileNotFoundError: The directory does not exist; the message says where it looked and how
            to point to it.

    Example:
        >>> import os, tempfile
        >>> os.environ["PARALLELMUSE_EVAL_DATA"] = tempfile.gettempdir()
        >>> eval_data_dir() == Path(tempfile.gettempdir())
        True
        >>> del os.environ["PARALLELMUSE_EVAL_DATA"]
    """
    override = os.environ.get(EVAL_DATA_ENV)
    if override:
        candidate = Path(override).expanduser()
        if not candidate.is_dir():
            raise FileNotFoundError(
                f"{EVAL_DATA_ENV}={override!r} is not a directory: point it at the folder holding "
                "the *.questions.jsonl files, or unset it to use ../shared/eval-data"
            )
        return candidate
    repo_root = Path(__file__).resolve().parents[2]
    fix = f"set {EVAL_DATA_ENV} to the folder holding the *.questions.jsonl files"
    if not (repo_root / "pyproject.toml").is_file():
        raise FileNotFoundError(f"no evaluation data folder given: {fix}")
    candidate = (repo_root / ".." / "shared" / "eval-data").resolve()
    if not candidate.is_dir():
        raise FileNotFoundError(
            f"evaluation data not found at {candidate} (../shared/eval-data next to the project "
            f"root {repo_root}); {fix}"
        )
    return candidate
