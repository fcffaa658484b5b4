"""The information-state graph of a trajectory: entities, the relations between them, and redundancy.

The paper models deep information seeking as entity discovery plus relation construction,
G = (V, R), and measures redundancy as Γ = 1 − |V_eff| / |V_total|, where V_eff holds the entities
that directly or indirectly lead to the answer. This module builds G from a trajectory's own
records, with no model call and no gold data:

**What the tools must return.** A search's output is read as hits, each a line ``[n] Title (id: x)``
with its text below it, and a visit's only when the tool names the document it opened (its
artifact's ``doc_ids``, as ``(text, {"doc_ids": [x]})``), its title on the output's first line: the
format of :func:`~langgraph_parallelmuse.tools.make_corpus_tools` and
:func:`~langgraph_parallelmuse.tools.make_tavily_tools`. Other tools' outputs show no document, so
the graph holds no evidence; :func:`warn_unreadable` says so for a run that relies on it.

**Entities** (keyed by their normalised name, so a query span and a document title that name the
same thing are one entity; Unicode compatibility-normalised and case-folded, so "Beyoncé" is one
entity however its accent is encoded, and without punctuation of any script, so a page's “quoted”
name or "O’Brien" is the name the model typed plainly):

* ``title``: every document a search showed (``[n] Title (id: x)`` hits) or a visit opened
  (``opened``, the first line of a visit's output);
* ``query``: the named spans of every search query (capitalised runs such as "Haymo of Faversham",
  quoted strings, numbers; the whole query when it has none);
* ``bridge``: the bridge entity a hop recorded (optional ``step["bridge"]`` or
  ``observation["bridge"]``, a string or a list of strings);
* ``answer``: the final answer.

**Relations**, each tied to the step (tool call) that established it:

* ``found``: a query span (or the step's bridge) → each title its search returned;
* ``mentions``: a document → an entity the model wrote *later* (a span of a later query, a bridge)
  whose name the document's text contains: the document is where that entity could come from.
  Entities named in the question are given, not discovered, so nothing "mentions" them; the
  results of a search built on a bridge do not mention that bridge (they were found by it);
* ``supports``: a document whose text contains the answer → the answer. A yes/no answer is
  supported by the opened documents and by the hits whose title the question names.

**The effective subgraph** is what leads to the answer: the entities from which a path of relations
reaches it, with the relations' steps non-decreasing along the path (a document re-found after it
was used does not make the later search effective). Its steps are the trajectory's *effective
evidence*, which graph-shaped reports render and crossover merges.
"""

from __future__ import annotations

import re
import unicodedata
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from typing_extensions import TypedDict

from langgraph_parallelmuse.answers import CJK_CHARS, FUNCTION_WORDS, THOUSANDS, is_dash, normalize_answer
from langgraph_parallelmuse.driver import call_key, search_hits
from langgraph_parallelmuse.protocol import NO_HITS
from langgraph_parallelmuse.state import Observation, Step, Trajectory

__all__ = [
    "Entity",
    "InfoGraph",
    "Relation",
    "Segment",
    "bridges_of",
    "build_graph",
    "effective_steps",
    "effective_subgraph",
    "entity_key",
    "graph_stats",
    "merge_context",
    "merged_steps",
    "named_spans",
    "query_of",
    "read_segments",
    "redundancy",
    "redundancy_summary",
    "warn_unreadable",
]

EntityKind = Literal["title", "opened", "query", "bridge", "answer"]
RelationKind = Literal["found", "mentions", "supports"]


class Entity(TypedDict):
    """One entity: its identity (normalised name), how it was first written, and where it came from."""

    key: str
    name: str
    kinds: list[EntityKind]  # sorted
    step: int  # the first step that established it
    doc_ids: list[str]  # documents it is the title of


class Relation(TypedDict):
    """``source`` → ``target`` (entity keys), established by the tool call of step ``step``."""

    source: str
    target: str
    kind: RelationKind
    step: int
    tool: str


class InfoGraph(TypedDict):
    """Entities by key, relations in the order they were established, and the answer's key."""

    entities: dict[str, Entity]
    relations: list[Relation]
    answer: str | None


@dataclass(frozen=True)
class Segment:
    """The part of a tool output about one document: a search hit (title line and snippet) or an
    opened document."""

    step: int
    tool: str
    title: str
    doc_id: str | None
    text: str  # normalised as entity keys are, for mention tests


# ----------------------------------------------------------------------------- named spans

# Capitalised words that open a sentence or a question, not a name: the shared function words.
# Lowercase words allowed inside a name ("Haymo of Faversham", "Ludwig van Beethoven").
_CONNECTORS = frozenset("of the de da del der di du la le van von y".split())
_WORD = re.compile(r"\d[\d,.:/]*\d|[^\W_](?:[\w'’&-]*[^\W_])?\.?")
_QUOTED = re.compile(r"[\"“]([^\"“”]{2,80})[\"”]")
_NAME_BREAK = re.compile(r"[,;:()\[\]?!]")  # between two words, it ends a name
_NUMBER = re.compile(r"\d[\d,.:/]*$")
_POSSESSIVE = re.compile(r"['’]s\b")
# What follows a name, past a short aside ("Brennan's (Scott McGregor) departure"; bounded, as an
# unclosed "(" made every name of a long answer read to its end): a quoted title, an aside that does
# not close within that bound, or a word.
_NEXT_WORD = re.compile(r"\s+(?:\([^()]{0,80}\)\s+)?([\"“]|\((?![^()]{0,80}\))|[^\W_][\w'’-]*)")
# Words after which a closing "'s" is the name's own ("McDonald's in 1961", "That's My Baby"), but
# "then" ("Nick Hexum's then fiancée"); a capitalised "The" starts a title the name owns
# ("Evanescence's The Open Door Tour").
_OWN_S_BEFORE = FUNCTION_WORDS - {"then"}
# After "and"/"or" the next name's "'s" tells: "Stephen Fung's and Daniel Wu's new company" own it,
# "Domino's and Papa John's were" and "Frankie & Benny's and Chiquito" do not.
_NEXT_POSSESSIVE = re.compile(r"\s+(?:[^\W\d_][\w.&-]*\s+){0,4}?[^\W\d_][\w.&-]*['’]s\b")
# The punctuation between two digits that the vote key keeps is part of the number: dropped, "7.0%"
# was "70" (and supported by "70 museums"), "March 2–3" was "march 23", "10:30" was "1030" and "2:1"
# was "21". Every dash is "-" by then. A digit-group separator is not (THOUSANDS, as in the vote key).
_NUMBER_MARK = re.compile(r"(?<=\d)([-.,/:\u066b])(?=\d)")
# Chinese, Japanese and Korean text: no spaces set its words apart, so a name in it is no whole word.
_CJK = re.compile(CJK_CHARS)


def _is_name_word(word: str) -> bool:
    return word[0].isupper() and word.rstrip(".").lower() not in FUNCTION_WORDS


def named_spans(text: str) -> list[str]:
    """The named spans of a short text: quoted strings, capitalised runs (with inner connectors such
    as "of"), and numbers; in order, without duplicates.

    Example:
        >>> named_spans("What language was used in the era of Haymo of Faversham?")
        ['Haymo of Faversham']
        >>> named_spans('Are Christopher Nolan and "Sathish Kalathil" both born in 1970?')
        ['Sathish Kalathil', 'Christopher Nolan', '1970']
        >>> named_spans("g. stanley hall")
        []
        >>> named_spans("born in Kerry, Ireland in the U.S. Army")
        ['Kerry', 'Ireland', 'U.S. Army']
        >>> named_spans("James Garner's role in Ender's Game"), named_spans("Who founded McDonald's?")
        (['James Garner', "Ender's Game"], ["McDonald's"])
    """
    # Composed first: a decomposed accent is no word character, so "Beyonce\u0301" split into two words.
    text = unicodedata.normalize("NFC", text)
    spans = [m.group(1).strip() for m in _QUOTED.finditer(text)]
    rest = _QUOTED.sub(lambda m: " " * len(m.group(0)), text)  # where the text is, for what follows a name
    run: list[re.Match[str]] = []

    def close() -> None:
        while run and run[-1].group(0) in _CONNECTORS:
            run.pop()
        if run:
            # The text as written ("U.S. Army" keys as its title does, "us army", not "u s army"), but
            # for a closing possessive before what it owns: the entity of "Garner's role" is Garner, and a
            # report names it so. At the end of a text or a clause, or before most function words
            # (_OWN_S_BEFORE), the "'s" is the name's own: "McDonald's" was the report's "McDonald".
            span = rest[run[0].start() : run[-1].end()].rstrip(".")
            if _POSSESSIVE.match(span, len(span) - 2) and _owns_what_follows(text, run[0].start() + len(span)):
                span = span[:-2]
            spans.append(" ".join(span.split()))
        run.clear()

    for match in _WORD.finditer(rest):
        word = match.group(0)
        if run and _NAME_BREAK.search(rest, run[-1].end(), match.start()):
            close()  # "Kerry, Ireland" names two places, "the Luftwaffe (German" one
        if _is_name_word(word) or (run and (word in _CONNECTORS or word[0].isdigit())):
            run.append(match)
            continue
        close()
        if _NUMBER.match(word):
            spans.append(word.rstrip(".,"))
    close()
    return list(dict.fromkeys(s for s in spans if entity_key(s)))


def _owns_what_follows(text: str, at: int) -> bool:
    """Whether the name whose "'s" ends at ``at`` of ``text`` owns what follows it (see _OWN_S_BEFORE)."""
    follows = _NEXT_WORD.match(text, at)
    if follows is None:
        return False
    word = follows.group(1)
    if word in ("and", "or"):  # one name further, not on down a list
        other = _NEXT_POSSESSIVE.match(text, follows.end())
        follows = _NEXT_WORD.match(text, other.end()) if other else None
        word = follows.group(1) if follows else "and"
    return word == "The" or word.lower() not in _OWN_S_BEFORE


def entity_key(name: str) -> str:
    """An entity's identity: its name normalised as answers are (case, punctuation and articles dropped),
    after Unicode compatibility normalisation (NFKC) and case folding.

    A possessive is dropped first ("Hall's" names Hall), and punctuation of any script with the
    ASCII punctuation ``normalize_answer`` drops, but for a decimal mark, a dash, a colon, a slash or a
    comma between digits ("1.5" is not "15", "2–3" is "2-3", not "23", "10:30" is not "1030"); a
    thousands separator goes ("1,000" is "1000").

    Example:
        >>> entity_key("The G. Stanley Hall's")
        'g stanley hall'
        >>> entity_key("Beyonc\u00e9") == entity_key("Beyonce\u0301"), entity_key("STRASSE") == entity_key("Straße")
        (True, True)
        >>> entity_key("\u201cThinking Out Loud\u201d"), entity_key("O\u2019Brien") == entity_key("O'Brien")
        ('thinking out loud', True)
        >>> entity_key("Mexico (7.0%), 250,000 edits"), entity_key("March 2\u20133, 2012")
        ('mexico 7.0 250000 edits', 'march 2-3 2012')
        >>> entity_key("10:30"), entity_key("1,000") == entity_key("1000"), entity_key("3,14")
        ('10:30', True, '3,14')
    """
    text = _POSSESSIVE.sub("", unicodedata.normalize("NFKC", name)).casefold()
    # Elsewhere a dash goes as the rest of the punctuation does ("Michelson–Morley" is one word).
    parts = _NUMBER_MARK.split(THOUSANDS.sub("", "".join("-" if is_dash(ch) else ch for ch in text)))
    # The marks at odd places: the text between them keyed, the marks kept as one spelling each.
    return "".join(_key_text(part) if i % 2 == 0 else "." if part == "\u066b" else part for i, part in enumerate(parts))


def _key_text(text: str) -> str:
    """``text`` as :func:`normalize_answer` reads it, without punctuation of any script: it drops ASCII
    punctuation only, and a curly quote or an en dash joined to a word ("“Thinking Out Loud”") hid
    the name from every mention test, so a page that names the answer so did not support it."""
    return normalize_answer("".join(ch for ch in text if ch.isascii() or unicodedata.category(ch)[0] != "P"))


def _mentions(text: str, key: str) -> bool:
    """Whether normalised ``text`` names the entity ``key`` as whole words (anywhere, for a key in
    CJK characters: a page never spaced "333メートル" out of "高さは333メートルです")."""
    if _CJK.search(key):
        return key in text
    return f" {key} " in f" {text} "


# ----------------------------------------------------------------------------- reading the records


def read_segments(observations: Sequence[Observation]) -> list[Segment]:
    """The documents a trajectory's tool outputs showed: one segment per search hit, one per opened
    document (the first line of a visit's output is its title). Failed calls, and visits that name
    no document they opened (``doc_ids``), show nothing; so does a search whose output holds no
    ``[n] Title (id: x)`` line (see the module docstring: no other format is guessed at).

    Example:
        >>> obs = [{"step": 0, "name": "search", "error": False, "doc_ids": ["d1"],
        ...         "content": "[1] Paris (id: d1)\\nParis is the capital of France."},
        ...        {"step": 1, "name": "visit", "error": False, "doc_ids": ["d1"],
        ...         "content": "Paris\\n\\nParis is on the Seine."}]
        >>> for s in read_segments(obs):
        ...     print(s.step, s.tool, s.title, s.doc_id, repr(s.text))
        0 search Paris d1 'paris paris is capital of france'
        1 visit Paris d1 'paris is on seine'
    """
    segments: list[Segment] = []
    for obs in observations:
        if obs.get("error"):
            continue
        content, ids = obs["content"], obs.get("doc_ids") or []
        if obs["name"] == "search":
            hits = search_hits(content, ids)  # a page line shaped like a hit is the page's text
            for i, hit in enumerate(hits):
                end = hits[i + 1].start() if i + 1 < len(hits) else len(content)
                title = hit.group(1).strip()
                text = entity_key(title + " " + content[hit.end() : end])
                segments.append(Segment(obs["step"], "search", title, hit.group(2).strip() or None, text))
        elif obs["name"] == "visit" and content.strip() and ids:  # no id: it opened nothing ("No document …")
            title, _, body = content.strip().partition("\n")
            segments.append(Segment(obs["step"], "visit", title.strip(), ids[0], entity_key(body)))
    return segments


def bridges_of(step: Step, observation: Observation | None) -> list[str]:
    """The bridge entities a hop recorded (``bridge`` on its step or its observation: a string or a list).

    Example:
        >>> bridges_of({"bridge": "Stephen King"}, {"bridge": ["Stephen King", "Maine"]})
        ['Stephen King', 'Maine']
    """
    found: list[str] = []
    for record in (step, observation or {}):
        value = record.get("bridge")
        found += [value] if isinstance(value, str) else [v for v in value or [] if isinstance(v, str)]
    return [b for b in dict.fromkeys(found) if entity_key(b)]


# ----------------------------------------------------------------------------- the graph


class _Builder:
    def __init__(self) -> None:
        self.entities: dict[str, Entity] = {}
        self.relations: dict[tuple[str, str, str, int | str], Relation] = {}

    def entity(self, name: str, kind: EntityKind, step: int, doc_id: str | None = None) -> str | None:
        key = entity_key(name)
        if not key:
            return None
        entity = self.entities.setdefault(
            key, Entity(key=key, name=" ".join(name.split()), kinds=[], step=step, doc_ids=[])
        )
        if kind not in entity["kinds"]:
            entity["kinds"] = sorted([*entity["kinds"], kind])
        if doc_id and doc_id not in entity["doc_ids"]:
            entity["doc_ids"].append(doc_id)
        entity["step"] = min(entity["step"], step)
        return key

    def relate(self, source: str | None, target: str | None, kind: RelationKind, step: int, tool: str) -> None:
        if source and target and source != target:
            rel = Relation(source=source, target=target, kind=kind, step=step, tool=tool)
            # A document shown again by a later search establishes nothing new: its relations keep
            # the first step per tool (a visit reads what a hit only previewed), so that search is
            # not made effective by a page the trajectory had already used.
            self.relations.setdefault((source, target, kind, step if kind == "found" else tool), rel)

    def graph(self, answer: str | None) -> InfoGraph:
        ordered = sorted(self.relations.values(), key=lambda r: (r["step"], r["kind"], r["source"], r["target"]))
        return InfoGraph(entities=self.entities, relations=ordered, answer=answer)


def query_of(step: Step) -> str | None:
    """The query of a search step (``None``: not a search, or an empty query).

    Example:
        >>> query_of({"action": {"type": "tool_call", "name": "search", "arguments": {"query": "Lilu"}}})
        'Lilu'
    """
    action = step["action"]
    if action.get("type") == "tool_call" and action.get("name") == "search":
        query = (action.get("arguments") or {}).get("query")
        return query if isinstance(query, str) and query.strip() else None
    return None


def build_graph(question: str, trajectory: Trajectory) -> InfoGraph:
    """The entity/relation graph of one trajectory, from its own records (see the module docstring).

    Example:
        >>> traj = {"steps": [
        ...     {"index": 0, "action": {"type": "tool_call", "name": "search", "arguments": {"query": "Lilu"}}},
        ...     {"index": 1, "action": {"type": "answer", "answer": "a spirit"}}],
        ...     "observations": [{"step": 0, "name": "search", "error": False, "doc_ids": ["d5", "d7"],
        ...         "content": "[1] Lilu (id: d5)\\nA lilu is a spirit.\\n\\n[2] Gallu (id: d7)\\nA demon."}],
        ...     "answer": "a spirit"}
        >>> g = build_graph("If Gallu is a demon, Lilu is what?", traj)
        >>> sorted(g["entities"]), [(r["source"], r["target"], r["kind"], r["step"]) for r in g["relations"]]
        (['gallu', 'lilu', 'spirit'], [('lilu', 'gallu', 'found', 0), ('lilu', 'spirit', 'supports', 0)])
    """
    b = _Builder()
    steps, observations = trajectory.get("steps", []), trajectory.get("observations", [])
    segments = read_segments(observations)
    docs = [b.entity(s.title, "title", s.step, s.doc_id) for s in segments]
    for s in segments:
        if s.tool == "visit":
            b.entity(s.title, "opened", s.step, s.doc_id)
    obs_of = {o["step"]: o for o in observations}
    first: dict[str, int] = {}  # model-written entity -> the first step that wrote it
    for step in steps:
        at, query = step["index"], query_of(step)
        spans = [b.entity(span, "query", at) for span in ((named_spans(query) or [query]) if query else [])]
        bridges = [b.entity(x, "bridge", at) for x in bridges_of(step, obs_of.get(at))]
        for key in filter(None, [*spans, *bridges]):
            first.setdefault(key, at)
        hits = [doc for s, doc in zip(segments, docs, strict=True) if s.step == at and s.tool == "search"]
        for source in [*spans, *(bridges if query else [])]:
            for hit in hits:
                b.relate(source, hit, "found", at, "search")
    given = {entity_key(span) for span in named_spans(question)}
    for key, at in first.items():
        if key in given:
            continue
        bridge = "bridge" in b.entities[key]["kinds"]
        for s, doc in zip(segments, docs, strict=True):
            # A bridge may come from the document its own step opened, never from the results of
            # the search built on it.
            readable = s.step < at or (bridge and s.step == at and s.tool == "visit")
            if readable and _mentions(s.text, key):
                b.relate(doc, key, "mentions", s.step, s.tool)
    return b.graph(_answer(b, question, trajectory, segments, docs))


def _answer(
    b: _Builder, question: str, trajectory: Trajectory, segments: list[Segment], docs: list[str | None]
) -> str | None:
    """Add the answer entity and the documents that support it; its key (``None``: no answer)."""
    steps = trajectory.get("steps", [])
    text = (trajectory.get("answer") or "").strip()
    key = b.entity(text, "answer", steps[-1]["index"] if steps else 0) if text else None
    if key is None:
        return None
    given = {entity_key(span) for span in named_spans(question)}
    if key in ("yes", "no"):
        support = [s.tool == "visit" or entity_key(s.title) in given for s in segments]
    else:
        support = [_mentions(s.text, key) for s in segments]
        if not any(support):  # the whole answer is nowhere: the documents naming one of its own spans
            parts = [p for p in map(entity_key, named_spans(text)) if p and p not in given]
            support = [any(_mentions(s.text, p) for p in parts) for s in segments]
    for s, doc, ok in zip(segments, docs, support, strict=True):
        if ok:
            b.relate(doc, key, "supports", s.step, s.tool)
    return key


def effective_subgraph(graph: InfoGraph, roots: Iterable[str] | None = None) -> InfoGraph:
    """What leads to ``roots`` (default: the answer): the entities with a path of relations to a
    root whose steps never decrease, and the relations on such paths.

    Example:
        >>> rel = lambda s, t, step: {"source": s, "target": t, "kind": "found", "step": step, "tool": "search"}
        >>> ents = {k: {"key": k} for k in "abcx"}
        >>> g = {"entities": ents, "relations": [rel("a", "b", 0), rel("b", "c", 1), rel("x", "b", 2)], "answer": "c"}
        >>> sorted(effective_subgraph(g)["entities"])  # x reached b only after b was used
        ['a', 'b', 'c']
    """
    targets = [graph["answer"]] if roots is None and graph["answer"] else list(roots or [])
    bound: dict[str, float] = {r: float("inf") for r in targets if r in graph["entities"]}
    into: dict[str, list[Relation]] = {}
    for rel in graph["relations"]:
        into.setdefault(rel["target"], []).append(rel)
    todo = list(bound)
    while todo:  # label-correcting search: each node keeps the latest step a path may leave it at
        node = todo.pop()
        for rel in into.get(node, []):
            if rel["step"] <= bound[node] and rel["step"] > bound.get(rel["source"], float("-inf")):
                bound[rel["source"]] = rel["step"]
                todo.append(rel["source"])
    relations = [r for r in graph["relations"] if r["target"] in bound and r["step"] <= bound[r["target"]]]
    entities = {k: e for k, e in graph["entities"].items() if k in bound}
    return InfoGraph(
        entities=entities, relations=relations, answer=graph["answer"] if graph["answer"] in bound else None
    )


def effective_steps(graph: InfoGraph) -> list[int]:
    """The steps (tool calls) whose relations an (effective) graph holds, in order.

    Example:
        >>> effective_steps({"relations": [{"step": 2}, {"step": 0}, {"step": 2}]})
        [0, 2]
    """
    return sorted({r["step"] for r in graph["relations"]})


def redundancy(graph: InfoGraph, effective: InfoGraph) -> float | None:
    """Γ = 1 − |V_eff| / |V_total| (``None`` for a graph without entities).

    Example:
        >>> redundancy({"entities": dict.fromkeys("abcd")}, {"entities": dict.fromkeys("a")})
        0.75
    """
    total = len(graph["entities"])
    return 1.0 - len(effective["entities"]) / total if total else None


def graph_stats(question: str, trajectory: Trajectory) -> dict[str, Any]:
    """Entities explored and effective, Γ and the effective steps of one trajectory.

    Example:
        >>> graph_stats("Q?", {"steps": [], "observations": [], "answer": None})
        {'entities': 0, 'effective_entities': 0, 'redundancy': None, 'effective_steps': []}
    """
    graph = build_graph(question, trajectory)
    effective = effective_subgraph(graph)
    return {
        "entities": len(graph["entities"]),
        "effective_entities": len(effective["entities"]),
        "redundancy": redundancy(graph, effective),
        "effective_steps": effective_steps(effective),
    }


def redundancy_summary(question: str, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Run stats: :func:`graph_stats` per trajectory, and per origin kind the mean entities explored,
    effective, and the mean Γ.

    Example:
        >>> redundancy_summary("Q?", [])["by_kind"]
        {}
    """
    per = {t["id"]: {"kind": t["origin"].get("kind"), **graph_stats(question, t)} for t in trajectories}
    by_kind: dict[str, dict[str, float | int]] = {}
    for kind in dict.fromkeys(p["kind"] for p in per.values()):
        rows = [p for p in per.values() if p["kind"] == kind]
        gammas = [p["redundancy"] for p in rows if p["redundancy"] is not None]
        by_kind[kind] = {
            "trajectories": len(rows),
            "entities": sum(p["entities"] for p in rows) / len(rows),
            "effective_entities": sum(p["effective_entities"] for p in rows) / len(rows),
            "redundancy": sum(gammas) / len(gammas) if gammas else None,
        }
    return {"per_trajectory": per, "by_kind": by_kind}


def merged_steps(parents: Sequence[tuple[Sequence[Step], Sequence[Observation], Sequence[int]]]) -> list[list[int]]:
    """Per parent, the chosen steps a merged context takes: those with a tool response whose call (same
    tool, same normalised arguments) no earlier step taken made.

    Example:
        >>> def call(i, q): return {"index": i, "action": {"type": "tool_call", "name": "search",
        ...                                                 "arguments": {"query": q}}}
        >>> a = ([call(0, "x"), call(1, "y")], [{"step": 0}, {"step": 1}], [0, 1])
        >>> b = ([call(0, "y")], [{"step": 0}], [0])
        >>> merged_steps([a, b])  # b's one call is a's step 1: b gives nothing
        [[0, 1], []]
    """
    taken: set[str] = set()
    out: list[list[int]] = []
    for parent_steps, parent_observations, chosen in parents:
        answered = {o["step"] for o in parent_observations}
        out.append([])
        for i in chosen:
            key = call_key(parent_steps[i]["action"])
            if key not in taken and i in answered:
                taken.add(key)
                out[-1].append(i)
    return out


def merge_context(
    parents: Sequence[tuple[Sequence[Step], Sequence[Observation], Sequence[int]]],
) -> tuple[list[Step], list[Observation]]:
    """The merged context of a crossover: each parent's chosen steps with their tool responses, in
    order, renumbered; a tool call an earlier parent already made (same tool, same normalised
    arguments) is taken once (:func:`merged_steps`).

    Example:
        >>> def call(i, q): return {"index": i, "text": q, "action": {"type": "tool_call", "name": "search",
        ...                                                          "arguments": {"query": q}}}
        >>> a = ([call(0, "x"), call(1, "y")], [{"step": 0, "content": "X"}, {"step": 1, "content": "Y"}], [1])
        >>> b = ([call(0, "y"), call(1, "z")], [{"step": 0, "content": "Y"}, {"step": 1, "content": "Z"}], [0, 1])
        >>> steps, obs = merge_context([a, b])
        >>> [s["text"] for s in steps], [(o["step"], o["content"]) for o in obs]
        (['y', 'z'], [(0, 'Y'), (1, 'Z')])
    """
    steps: list[Step] = []
    observations: list[Observation] = []
    takes = merged_steps(parents)
    # A step's bridge is a hop of its own parent's chain (the guided driver puts each bridge in
    # place of the next phrase of the question, and never offers a bridge as the answer): two chains
    # read as one put one parent's bridge in place of the other's next phrase ("How many stores are
    # in Hank Snow?"). The merged context keeps the chain of the parent with the most hops taken.
    hops = [sum("bridge" in p[0][i] for i in taken) for p, taken in zip(parents, takes, strict=True)]
    chain = max(range(len(hops)), key=hops.__getitem__, default=0)  # the first of the most
    for n, ((parent_steps, parent_observations, _), taken) in enumerate(zip(parents, takes, strict=True)):
        response = {o["step"]: o for o in parent_observations}
        for i in taken:
            step = {**parent_steps[i], "index": len(steps)}
            if n != chain:
                step.pop("bridge", None)
            steps.append(step)
            observations.append({**response[i], "step": len(steps) - 1})
    return steps, observations


def warn_unreadable(trajectories: Sequence[Trajectory], *, uses: str) -> bool:
    """Warn (``UserWarning``) when the tools gave the graph nothing to read: some trajectory made a
    search or visit that did not fail, and no trajectory's tool output shows a document
    (:func:`read_segments`; the format is in the module docstring).

    Args:
        trajectories: The run's trajectories.
        uses: What relies on the graph, named in the warning (``"report_form='graph'"``, ``"crossover=1"``).

    Returns:
        Whether it warned.

    Example:
        >>> plain = {"steps": [], "observations": [{"step": 0, "name": "search", "error": False,
        ...                                         "content": "Paris: the capital of France."}]}
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_unreadable([plain], uses="crossover=1")
        True
        >>> print(caught[0].message)  # doctest: +ELLIPSIS
        crossover=1 found no document in any trajectory's tool output: ...
    """
    outputs = [t.get("observations", []) for t in trajectories]
    # A search that found nothing shows no document in any format: no sign of an unreadable tool.
    called = any(
        o["name"] in ("search", "visit") and not o.get("error") and not str(o.get("content", "")).startswith(NO_HITS)
        for obs in outputs
        for o in obs
    )
    if not called or any(read_segments(obs) for obs in outputs):
        return False
    warnings.warn(
        f"{uses} found no document in any trajectory's tool output: the information-state graph reads a "
        "search's output only as '[n] Title (id: x)' lines, each hit's text below its line, and a visit's only "
        "when the tool returns (text, {'doc_ids': [x]}) with the document's title on the text's first line "
        "(make_corpus_tools and make_tavily_tools do). Graph reports hold no evidence and crossover finds no "
        "pair until the search and visit tools return that format.",
        UserWarning,
        stacklevel=2,
    )
    return True
