"""The facts of a trajectory, read from its own records: what each tool call searched or opened and
what it found.

A small model asked to summarise a research log leaves sections empty or writes about its
instructions; what was searched, shown and opened is already in the trajectory's steps and
observations. One fact per tool call, in order::

    s1 search "Leland film": Maximum Overdrive, Leland (film) -> Stephen King
    s2 visit Maximum Overdrive -> the answer
    s3 search "Stephen King born" (bridge Stephen King): nothing
    s4 visit d9 failed

``search "q": titles`` lists the hits that lead to the answer (the trajectory's effective subgraph,
:mod:`~langgraph_parallelmuse.infograph`), all of them, then the best other hits up to
``max_titles``; a query longer than ``max_query_words`` is cut, and the names of its cut part that
lead to the answer follow it (``"where was the man …" (Stephen King)``), unless it names nothing
and leads to the answer as a whole (then it is quoted whole); a search that repeats an earlier one
(same query, same hits) says so (``s3 search as s1``); ``-> x`` names what the
call's documents gave on the way: an entity written later (a sub-answer, a bridge) or ``the
answer`` (named once, on the report's last line). Every entity of the effective subgraph appears
in the facts or in the answer line, so a report built on them keeps everything the answer rests
on. The facts are untrusted data (titles and queries come from pages and the model): callers
neutralise or quote them as for any tool output.
"""

from __future__ import annotations

from langgraph_parallelmuse.infograph import (
    bridges_of,
    build_graph,
    effective_subgraph,
    entity_key,
    named_spans,
    query_of,
    read_segments,
)
from langgraph_parallelmuse.protocol import one_line
from langgraph_parallelmuse.state import Trajectory

__all__ = ["step_facts"]


def step_facts(question: str, trajectory: Trajectory, *, max_titles: int = 1, max_query_words: int = 8) -> list[str]:
    """One fact per tool call of ``trajectory``, from its records (see the module docstring).

    Args:
        question: The question (entities it names are given, not found).
        trajectory: A trajectory (its ``steps``, ``observations`` and ``answer``).
        max_titles: Hits listed per search besides the ones that lead to the answer.
        max_query_words: A longer query is cut to this many words (a small model writes whole
            sentences as queries); the names in the cut part that lead to the answer follow it. A
            query that names nothing and leads to the answer as a whole is not cut.

    Example:
        >>> traj = {"answer": "a spirit", "steps": [
        ...     {"index": 0, "action": {"type": "tool_call", "name": "search", "arguments": {"query": "Lilu"}}},
        ...     {"index": 1, "action": {"type": "tool_call", "name": "visit", "arguments": {"doc": "d9"}}},
        ...     {"index": 2, "action": {"type": "answer", "answer": "a spirit"}}],
        ...     "observations": [{"step": 0, "name": "search", "error": False, "doc_ids": ["d5", "d7"],
        ...         "content": "[1] Gallu (id: d7)\\nA demon.\\n\\n[2] Lilu (id: d5)\\nA lilu is a spirit."},
        ...         {"step": 1, "name": "visit", "error": True, "content": "No document 'd9'"}]}
        >>> step_facts("If Gallu is a demon, Lilu is what?", traj, max_titles=0)
        ['s1 search "Lilu": Lilu -> the answer', 's2 visit d9 failed']
    """
    graph = build_graph(question, trajectory)
    effective = effective_subgraph(graph)
    found: dict[int, list[str]] = {}  # step -> what its documents gave on the way to the answer
    for rel in effective["relations"]:
        if rel["kind"] in ("mentions", "supports"):
            name = "the answer" if rel["target"] == effective["answer"] else graph["entities"][rel["target"]]["name"]
            found.setdefault(rel["step"], []).append(name)
    segments = read_segments(trajectory.get("observations", []))
    obs_of = {o["step"]: o for o in trajectory.get("observations", [])}
    facts = []
    searched: dict[tuple[str, tuple[str, ...]], int] = {}  # (query, hits) -> the step that first got them
    for step in trajectory.get("steps", []):
        action, at = step["action"], step["index"]
        if action.get("type") != "tool_call":
            continue
        tool, obs, query = action.get("name", "tool"), obs_of.get(at), query_of(step)
        mine = [s for s in segments if s.step == at]
        if query is not None:
            what = _query(query, effective["entities"], max_query_words)
        elif tool == "visit" and mine:  # the document it opened, by title (its argument may be an id)
            what = one_line(mine[0].title)
        else:
            what = one_line(" ".join(map(str, (action.get("arguments") or {}).values())))
        # A hit shown without a title (a corpus document with none) is named by its id: as a blank
        # title it was an empty item ("Paris, ").
        hits = tuple(one_line(s.title) or s.doc_id or "" for s in mine)
        if query is not None and not (obs or {}).get("error"):
            # A small model often repeats a search word for word: the same hits are named once.
            first = searched.setdefault((entity_key(query), hits), at)
            what = what if first == at else f"as s{first + 1}"
        bridges = ", ".join(map(one_line, bridges_of(step, obs)))
        head = f"s{at + 1} {tool} {what}".rstrip() + (f" (bridge {bridges})" if bridges else "")
        if obs is None or obs.get("error"):
            facts.append(f"{head} failed")
            continue
        if tool == "search" and not what.startswith("as s"):
            head += ": " + (", ".join(_titles(list(hits), effective["entities"], max_titles)) or "nothing")
        gave = ", ".join(one_line(x) for x in dict.fromkeys(found.get(at, [])))
        facts.append(head + (f" -> {gave}" if gave else ""))
    return facts


def _query(query: str, effective: dict, max_words: int) -> str:
    """The query quoted, cut to ``max_words`` words, then the names the cut dropped that lead to the answer.

    A query that names no span is an entity as a whole (see ``build_graph``): when it leads to the
    answer it is quoted uncut, since no part of it could stand for it after a cut.
    """
    words, spans = query.split(), named_spans(query)
    if len(words) <= max_words or (not spans and entity_key(query) in effective):
        return f'"{" ".join(words)}"'
    shown = " ".join(words[:max_words])
    kept = f" {entity_key(shown)} "
    # Named as the graph names them (a title's spelling: the query's "McDonald's office" gave "McDonald").
    keys = [entity_key(s) for s in spans]
    dropped = [one_line(effective[k]["name"]) for k in dict.fromkeys(keys) if k in effective and f" {k} " not in kept]
    return f'"{shown} …"' + (f" ({', '.join(dropped)})" if dropped else "")


def _titles(titles: list[str], effective: dict, extra: int) -> list[str]:
    """Every title that leads to the answer, then up to ``extra`` others, in the tool's order."""
    shown = [t for t in dict.fromkeys(titles) if t]
    keep = {t for t in shown if entity_key(t) in effective}
    others = [t for t in shown if t not in keep][:extra]
    return [t for t in shown if t in keep or t in others]
