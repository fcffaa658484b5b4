"""Offline ``search`` and ``visit`` tools over a :class:`~.corpus.CorpusIndex`.

Both tools are async LangChain tools with ``response_format="content_and_artifact"``: the agent sees
plain text, and the artifact ``{"doc_ids": [...]}`` records which documents were shown or opened, so
an evaluation can score retrieval recall of the supporting documents.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field, ValidationError, field_validator

from langgraph_parallelmuse.errors import ConfigError, CorpusError, InputError
from langgraph_parallelmuse.protocol import EMPTY_QUERY, NO_HITS, NO_RESULTS, SEARCH_HIT
from langgraph_parallelmuse.tools.corpus import CorpusIndex, Doc, match_words

__all__ = [
    "EMPTY_QUERY",
    "NO_HITS",
    "SearchInput",
    "ToolArgumentError",
    "VisitInput",
    "argument_error",
    "artifact_tool",
    "echo",
    "goal_excerpt",
    "hit_text",
    "make_corpus_tools",
    "no_results",
    "pasted_id",
    "visit_text",
]

ELLIPSIS = "[...]"
SEARCH_DESCRIPTION = (
    "Search the knowledge base. Returns a ranked list of documents, each with its title, id and a "
    "short snippet. Use visit with an id to read a document."
)
VISIT_DESCRIPTION = (
    "Open one document by its id (or title) from the search results and read it. 'goal' says what "
    "you are looking for, so a long document is cut down to the passages about it."
)

# Chinese and Japanese end a sentence with a full-width stop and no space after it.
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+|\n+|(?<=[。！？])\s*")
# Models often paste a whole search line back: "[2] Title (id: abc)"; the id is what they mean. It
# runs to the last ")" before a space or the end: a URL may hold parentheses (".../Mercury_(planet)").
# The run is taken whole and cut at its last ")" in pasted_id: a pattern that backtracked to that
# ")" read each "(id:" of a run to the run's end (quadratic: 11 s for a 50,000-character argument).
_PASTED_ID_RE = re.compile(r"\(id:\s*+(\S++)")

# Index lookups get threads of their own: a sync tool that hangs past tool_timeout keeps its thread
# of the loop's default executor (a timeout cannot stop a thread), and a few of those made every
# corpus search wait behind them and time out too.
_LOOKUPS: ThreadPoolExecutor | None = None
_T = TypeVar("_T")


def _forget_lookups() -> None:
    # A forked child has none of the pool's threads, and the pool would count the parent's idle ones.
    global _LOOKUPS
    _LOOKUPS = None


os.register_at_fork(after_in_child=_forget_lookups)


async def _lookup_thread(func: Callable[..., _T], *args, **kwargs) -> _T:
    global _LOOKUPS
    if _LOOKUPS is None:
        _LOOKUPS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="parallelmuse-corpus")
    return await asyncio.get_running_loop().run_in_executor(_LOOKUPS, functools.partial(func, *args, **kwargs))


def echo(text: str, *, limit: int = 200) -> str:
    """``text`` quoted for a tool's reply, cut at ``limit`` characters: a "no results" or error
    reply repeats the agent's input (sometimes a pasted page) without outgrowing the tool's bound.

    Example:
        >>> echo("Eiffel"), len(echo("x" * 1000))
        ("'Eiffel'", 203)
    """
    return repr(text if len(text) <= limit else text[:limit] + "…")


def no_results(query: str) -> str:
    """The search tools' reply to a query that found nothing (one of :data:`NO_HITS`).

    Example:
        >>> no_results("capital of Atlantis")
        "No results for 'capital of Atlantis'. Try other words."
    """
    return f"{NO_RESULTS}{echo(query)}. Try other words."


def pasted_id(text: str) -> str | None:
    """The id of a search line pasted back as a document name (``None``: not one).

    Example:
        >>> pasted_id("[1] Mercury (planet) - Wikipedia (id: https://en.wikipedia.org/wiki/Mercury_(planet))")
        'https://en.wikipedia.org/wiki/Mercury_(planet)'
    """
    at = 0
    while match := _PASTED_ID_RE.search(text, at):
        run = match.group(1)
        if (end := run.rfind(")")) > 0:
            return run[:end]
        # Another "(id:" inside this run reads a part of it, which has no ")" either; one that ends
        # the run reads the next run.
        at = match.end() - len("(id:")
    return None


def hit_text(text: str) -> str:
    """A search hit's snippet as the one line below its title line.

    Its line breaks become spaces (other whitespace stays what the document holds), and a snippet
    that reads as a hit line gets a backslash: a page reading "[7] Lyon (id: d666)" would
    otherwise be read as a hit the search never returned. Any other snippet is unchanged (a
    footnote's "[1] ..." too).

    Example:
        >>> hit_text("Paris is\\nthe capital."), hit_text("[7] Lyon (id: d666)"), hit_text("[1] Founded in 52 BC.")
        ('Paris is the capital.', '\\\\[7] Lyon (id: d666)', '[1] Founded in 52 BC.')
    """
    line = _line(text)
    return "\\" + line if SEARCH_HIT.match(line) else line


_EXCERPT_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were "
    "what when where which who with".split()
)


class SearchInput(BaseModel):
    """Arguments of the ``search`` tool."""

    query: str = Field(description="What to search for: keywords or a short question.")


class VisitInput(BaseModel):
    """Arguments of the ``visit`` tool."""

    doc: str = Field(description="The id (or title, or URL for web tools) of the document to open.")
    goal: str = Field("", description="What information you want from the document.")

    # Models write "goal": null for "no particular goal"; the schema they are shown stays a string.
    @field_validator("goal", mode="before")
    @classmethod
    def _no_goal_is_empty(cls, value: object) -> object:
        return "" if value is None else value


class ToolArgumentError(InputError):
    """A tool call's arguments do not fit the tool; the message is one line (:func:`argument_error`).

    An :class:`~langgraph_parallelmuse.errors.InputError`, so a :class:`ValueError` too (as it was).
    """


def argument_error(tool: str, schema: type[BaseModel], error: ValidationError) -> str:
    """One line saying what is wrong with a tool call's arguments and which ones the tool takes.

    Pydantic's own text spans several lines and ends in a link to its documentation, which an
    agent would take for a page to visit.

    Example:
        >>> try:
        ...     SearchInput.model_validate({"q": "Paris"})
        ... except ValidationError as exc:
        ...     print(*argument_error("search", SearchInput, exc).split(". "), sep="\\n")
        bad arguments for search (query: field required)
        search takes "query" (text, required): What to search for: keywords or a short question.
    """
    problems = "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {' '.join(e['msg'].split()).lower()}" for e in error.errors()
    )
    # The tools' arguments are all text.
    usage = "; ".join(
        f'"{name}" (text, {"required" if field.is_required() else "optional"}): {(field.description or "").rstrip(".")}'
        for name, field in schema.model_fields.items()
    )
    return f"bad arguments for {tool} ({problems}). {tool} takes {usage}."


class _ArtifactTool(StructuredTool):
    """A structured tool that raises :class:`ToolArgumentError` for arguments its schema refuses.

    Still an exception, so code calling the tool badly learns it at once, and the agent reads it
    as a failed call: one line, where pydantic's error was several and a link.
    """

    def _parse_input(self, tool_input: str | dict[str, Any], tool_call_id: str | None) -> str | dict[str, Any]:
        try:
            return super()._parse_input(tool_input, tool_call_id)
        except ValidationError as exc:
            raise ToolArgumentError(argument_error(self.name, self.args_schema, exc)) from exc


def artifact_tool(
    coroutine: Callable[..., Awaitable[tuple[str, dict[str, Any]]]],
    *,
    name: str,
    description: str,
    schema: type[BaseModel],
) -> BaseTool:
    """An async tool returning ``(text, artifact)``; arguments that do not fit ``schema`` raise
    :class:`ToolArgumentError`, whose message is one line of usage, not pydantic's text.

    Example:
        >>> import asyncio
        >>> async def search(query: str):
        ...     return query, {"doc_ids": []}
        >>> tool = artifact_tool(search, name="search", description="Search.", schema=SearchInput)
        >>> try:
        ...     asyncio.run(tool.ainvoke({"type": "tool_call", "id": "1", "name": "search", "args": {}}))
        ... except ToolArgumentError as exc:
        ...     print(str(exc).split(". ")[0])
        bad arguments for search (query: field required)
    """
    return _ArtifactTool.from_function(
        coroutine=coroutine,
        name=name,
        description=description,
        args_schema=schema,
        response_format="content_and_artifact",
    )


def goal_excerpt(text: str, goal: str = "", *, title: str = "", max_chars: int = 2000) -> str:
    """Cut a long text down to its sentences most relevant to a goal, within ``max_chars``.

    Sentences are ranked by how many goal and title words they contain (the opening sentence gets a
    small bonus, as it usually defines the subject), picked best first while they fit, and returned
    in their original order; ``[...]`` marks every gap. A text that fits is returned unchanged.

    Args:
        text: The full text.
        goal: What the reader is looking for.
        title: The document title; its words count as relevant too.
        max_chars: Upper bound on the length of the result.

    Example:
        >>> text = "Paris is in France. " * 50 + "The tower is 330 m tall. " + "It rains. " * 50
        >>> excerpt = goal_excerpt(text, "how tall is the tower", max_chars=120)
        >>> "330 m" in excerpt and len(excerpt) <= 120
        True
    """
    if len(text) <= max_chars:
        return text
    if max_chars <= len(ELLIPSIS) + 1:
        return text[: max(max_chars, 0)]
    terms = {w for w in match_words(f"{goal} {title}") if w not in _EXCERPT_STOPWORDS}
    sentences = [s.strip() for s in _SENTENCE_SPLIT_RE.split(text) if s.strip()]
    if not sentences:
        return ""
    scores = [len(terms.intersection(match_words(s))) + (0.5 if i == 0 else 0.0) for i, s in enumerate(sentences)]
    # Ties go to sentences nearest a relevant one: neighbours give the context a fact needs.
    gaps = _gaps(scores)
    scored = sorted((-score, gaps[i], i) for i, score in enumerate(scores))
    budget = max_chars - len(ELLIPSIS) - 1
    chosen: set[int] = set()
    used = 0
    for *_, i in scored:
        # Each kept sentence costs its length plus a separator, and possibly one more ellipsis.
        cost = len(sentences[i]) + len(ELLIPSIS) + 2
        if used + cost <= budget:
            chosen.add(i)
            used += cost
    if not chosen:
        best = scored[0][-1]
        return sentences[best][: max_chars - len(ELLIPSIS) - 1].rstrip() + " " + ELLIPSIS
    parts: list[str] = []
    previous = -1
    for i in sorted(chosen):
        if i != previous + 1:
            parts.append(ELLIPSIS)
        parts.append(sentences[i])
        previous = i
    if previous != len(sentences) - 1:
        parts.append(ELLIPSIS)
    return " ".join(parts)


def visit_text(title: str, text: str, goal: str = "", *, max_chars: int) -> str:
    """A visit's reply, within ``max_chars``: the title, a blank line, then the text or its excerpt about ``goal``.

    A title longer than half of ``max_chars`` is cut (ending in "…"), so that it leaves the text room.

    Args:
        title: The document's title.
        text: The document's full text.
        goal: What the reader is looking for (see :func:`goal_excerpt`).
        max_chars: Upper bound on the length of the reply.

    Example:
        >>> visit_text("Paris", "Paris is the capital of France.", max_chars=100)
        'Paris\\n\\nParis is the capital of France.'
        >>> reply = visit_text("Paris " * 100, "Paris is the capital of France.", max_chars=100)
        >>> len(reply) <= 100, reply.split("\\n\\n")[1]
        (True, 'Paris is the capital of France.')
    """
    room = max_chars // 2 - 2
    if room <= 0:
        header = ""
    elif len(title) > room:
        header = title[: room - 1].rstrip() + "…\n\n"
    else:
        header = f"{title}\n\n"
    return header + goal_excerpt(text, goal, title=title, max_chars=max_chars - len(header))


def _gaps(scores: list[float]) -> list[int]:
    """Distance from each position to the nearest positive score (two linear sweeps)."""
    far = len(scores)
    gaps, last = [], -far
    for i, score in enumerate(scores):
        last = i if score > 0 else last
        gaps.append(i - last)
    last = 2 * far
    for i in range(far - 1, -1, -1):
        last = i if scores[i] > 0 else last
        gaps[i] = min(gaps[i], last - i)
    return gaps


def make_corpus_tools(
    index: CorpusIndex,
    *,
    doc_ids: Iterable[str] | None = None,
    k: int = 4,
    max_chars: int = 1000,
) -> list[BaseTool]:
    """Build the offline ``search`` and ``visit`` tools over a local index.

    Args:
        index: The corpus to search.
        doc_ids: If given, both tools only see these documents (the distractor setting); every id
            must be a document of ``index``.
        k: Number of search hits shown.
        max_chars: Longest ``visit`` output; longer documents become a goal-focused excerpt.

    Returns:
        ``[search, visit]``, async tools returning ``(text, {"doc_ids": [...]})`` as content and
        artifact: the ids shown by ``search`` or the id opened by ``visit`` (``[]`` if none). A
        ``visit`` by a title several documents share opens none: it lists their ids to choose from,
        as a failed call (``"error": True``, like an unknown document).

    Raises:
        ConfigError: ``k`` or ``max_chars`` is below 1.
        CorpusError: ``doc_ids`` is given but empty, holds an empty id, or names documents the index
            does not have (the message gives some of them, their count and the index), since such a
            subset would answer every search with "No results".

    Example:
        >>> from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
        >>> search, visit = make_corpus_tools(CorpusIndex.wikipedia(), k=3)
        >>> import asyncio
        >>> msg = asyncio.run(search.ainvoke(
        ...     {"type": "tool_call", "id": "1", "name": "search", "args": {"query": "Eiffel"}}
        ... ))
        >>> msg.artifact["doc_ids"][0]
        'eiffel-tower'
    """
    # k=0 answered every search "No results", and max_chars=0 an empty visit the artifact recorded
    # as read: silent failures the agent could not tell from a corpus without the answer.
    problems = [
        f"{name}={value!r} must be at least 1" for name, value in (("k", k), ("max_chars", max_chars)) if value < 1
    ]
    if problems:
        raise ConfigError("make_corpus_tools: " + "; ".join(problems))
    subset = None if doc_ids is None else tuple(dict.fromkeys(doc_ids))
    if subset is not None:
        _check_subset(index, subset)

    async def search(query: str) -> tuple[str, dict[str, list[str]]]:
        if not query.strip():
            return EMPTY_QUERY, {"doc_ids": []}
        hits = await _lookup_thread(index.search, query, k=k, doc_ids=subset)
        if not hits:
            return no_results(query), {"doc_ids": []}
        # A hit is two lines, whatever the document holds: its newlines could forge hit lines.
        lines = [f"[{n}] {_line(h.title)} (id: {h.id})\n{hit_text(h.snippet)}" for n, h in enumerate(hits, 1)]
        return "\n\n".join(lines), {"doc_ids": [h.id for h in hits]}

    async def visit(doc: str, goal: str = "") -> tuple[str, dict[str, list[str]]]:
        found = await _lookup_thread(_lookup, index, doc, subset)
        if isinstance(found, Doc):
            return visit_text(found.title, found.text, goal, max_chars=max_chars), {"doc_ids": [found.id]}
        if found is None:
            text = f"No document {echo(doc.strip())}: that id or title is unknown. Use an id from the search results."
        else:
            text = await _lookup_thread(_namesakes_text, index, found, subset, max_chars=max_chars)
        # A failed call, as the trajectory records it (its facts say so; nothing was read).
        return text, {"doc_ids": [], "error": True}

    return [
        artifact_tool(search, name="search", description=SEARCH_DESCRIPTION, schema=SearchInput),
        artifact_tool(visit, name="visit", description=VISIT_DESCRIPTION, schema=VisitInput),
    ]


def _check_subset(index: CorpusIndex, subset: tuple[str, ...]) -> None:
    fix = "give the ids of the documents the tools may see (e.g. --doc-ids d1,d2), or none to search the whole corpus"
    if not subset:
        raise CorpusError(f"doc_ids is empty, so every search would find nothing: {fix}")
    if any(not i.strip() for i in subset):
        raise CorpusError(f"doc_ids {list(subset)!r} holds an empty id: {fix}")
    unknown = index.missing(subset)
    if unknown:
        raise CorpusError(
            f"{len(unknown)} of {len(subset)} doc_ids are not in the corpus {index.source}: {describe_ids(unknown)}; "
            "use ids of that corpus's documents, or open the corpus these ids come from"
        )


def _line(text: str) -> str:
    # Line breaks only: other whitespace (a no-break space) stays what the document holds.
    return " ".join(text.splitlines())


def describe_ids(ids: Sequence[str], *, shown: int = 5) -> str:
    """A short, quoted list of ids for an error message: the first ``shown``, then how many more.

    Example:
        >>> describe_ids(["a", "b", "c"], shown=2)
        "'a', 'b' and 1 more"
    """
    head = ", ".join(repr(i) for i in ids[:shown])
    return head if len(ids) <= shown else f"{head} and {len(ids) - shown} more"


def _lookup(index: CorpusIndex, doc: str, subset: tuple[str, ...] | None) -> Doc | list[str] | None:
    """The document ``doc`` names; the ids of the documents sharing the title it gives, if several do; else ``None``."""
    key = doc.strip().strip("\"'`")
    names = [pasted] if (pasted := pasted_id(key)) is not None else []
    for name in [*names, re.sub(r"^\[\d+\]\s*", "", key)]:
        found = index.get(name, doc_ids=subset)
        if found is None:
            continue
        # A title several documents share names none of them: opening the first would read a
        # document the agent may not mean as the one it asked for. An exact id is never ambiguous;
        # a near-miss ("The Antarctica") is as ambiguous as the title it matched.
        if found.id != name.strip():
            namesakes = index.ids_titled(found.title, doc_ids=subset)
            if len(namesakes) > 1:
                return namesakes
        return found
    return None


def _namesakes_text(index: CorpusIndex, ids: Sequence[str], subset: tuple[str, ...] | None, *, max_chars: int) -> str:
    """The visit reply to a title the documents ``ids`` share: their ids and first words, within ``max_chars``.

    As many ids as fit come first; the room left gives each its document's first words (which tell
    namesakes apart), from a few up to a line's worth.
    """
    first = index.get(ids[0], doc_ids=subset)
    listed = sum(len(f"\n- {doc_id}") for doc_id in ids)
    head = _namesakes_head(first.title if first else "", len(ids), room=max_chars - listed)
    shown = _ids_that_fit(ids, room=max_chars - len(head))
    used = len(head) + sum(len(f"\n- {doc_id}") for doc_id in shown)
    tail = f"\n(and {len(ids) - len(shown)} more)" if len(shown) < len(ids) else ""
    room = min((max_chars - used - len(tail)) // max(len(shown), 1) - len(": "), 60)
    lines = [head]
    for doc_id in shown:
        doc = first if doc_id == ids[0] else index.get(doc_id, doc_ids=subset)
        text = " ".join(doc.text.split()) if doc is not None and room >= 12 else ""
        if len(text) > room > 0:
            text = text[: room - 1].rstrip() + "…"
        lines.append(f"- {doc_id}: {text}" if text else f"- {doc_id}")
    # Only a max_chars too small for the head's own words is left to cut here.
    return ("\n".join(lines) + tail)[:max_chars]


def _ids_that_fit(ids: Sequence[str], *, room: int) -> list[str]:
    """The first of ``ids`` whose lines (``\\n- id``) fit in ``room`` characters: all of them, else as
    many as leave room for an ``(and N more)`` line.

    Example:
        >>> ids = ["a1", "a2", "a3", "a4"]
        >>> _ids_that_fit(ids, room=20), _ids_that_fit(ids, room=19)
        (['a1', 'a2', 'a3', 'a4'], ['a1'])
    """
    if sum(len(f"\n- {doc_id}") for doc_id in ids) <= room:
        return list(ids)
    shown: list[str] = []
    used = 0
    for n, doc_id in enumerate(ids):
        if used + len(f"\n- {doc_id}") + len(f"\n(and {len(ids) - n - 1} more)") > room:
            break
        shown.append(doc_id)
        used += len(f"\n- {doc_id}")
    return shown


def _namesakes_head(title: str, count: int, *, room: int) -> str:
    """The namesakes reply's first line, its echoed title cut (down to ``'…'``) to fit in ``room``
    characters: the ids after it are what the agent needs, the title it already gave.

    Example:
        >>> _namesakes_head("Antarctica", 3, room=50)
        "3 documents are titled 'An…': visit one by its id."
    """
    limit = min(len(title), 100)
    while True:
        head = f"{count} documents are titled {echo(title, limit=limit)}: visit one by its id."
        if len(head) <= room or limit == 0:
            return head
        # By the overflow, not one by one: repr may escape a character into several.
        limit = max(0, limit - (len(head) - room))
