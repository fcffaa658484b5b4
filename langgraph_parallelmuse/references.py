"""The hops of a multi-hop question: the phrase a hop resolves, and the question once it is resolved.

A composed question names an entity it does not give: "the waterfall in *the country where the
Bubye River is found*", "the state where *Hello Love's performer* lived". Its innermost such
phrase is what the next hop has to find (the bridge); once found, the phrase is replaced by the
bridge and the question is one hop shorter ("the waterfall in Zimbabwe"). Choosing the bridge
among the answer's candidates instead (a waterfall for "which waterfall") made MuSiQue's later
hops search for the answer's kind of thing before its bridge was known: two thirds of its
trajectories never read the last hop's paragraph (BENCHMARKS.md section 11).

Nothing here reads the evidence: the phrases are found in the question's own words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from langgraph_parallelmuse.candidates import CAPITAL

__all__ = ["Reference", "inner_reference", "reference_depth", "resolve", "resolved_question"]

_NAME = rf"(?:{CAPITAL}|[0-9])[\w.\-]*(?:\s+(?:(?:of|the|and|de|for|with|a)\s+)*(?:{CAPITAL}|[0-9])[\w.\-]*)*"
# "the country where …", "a German musician whose …": a head noun (up to two words before it)
# and a relative clause, which runs to a comma or the end of the question, or ends after a
# "located"/"born"-like participle ("the area where X is located became a state").
_RELATIVE = re.compile(
    r"\b(?:the|a|an)\s+((?:[\w-]+\s+){0,2}?[a-z][\w-]*)\s+(?:which|that|who|whom|where|whose|when|in which)\s+"
    r"(?P<clause>[^,?]+?\b(?:is|was|are|were)\s+(?:located|born|found|formed|founded|held|based|situated|headquartered)"
    r"(?:\s+in)?\b|[^,?]+)"
)
# "the country Dai Jitao is from", "the company Novair International Airways is part of".
_BARE_RELATIVE = re.compile(
    rf"\bthe\s+([a-z][\w-]*)\s+{_NAME}\s+(?:is|was|are|were)\s+(?:(?:located|a\s+part|part)\s+)?(?:from|in|of)\b"
)
# "the composer of Aschenbrodel", "the place of birth of David Morse": a noun of a named entity.
_OF_NAME = re.compile(rf"\bthe\s+((?:[a-z][\w-]*\s+){{0,2}}?[a-z][\w-]*)\s+of\s+{_NAME}")
# "Hello Love's performer", "Big Eye's main director", "Corey Taylor's city of birth".
_POSSESSIVE = re.compile(
    rf"\b({_NAME})['’]s\s+((?:(?:main|first|former|current|original|home|birth|record|parent|lead)\s+)?[a-z][\w-]*"
    r"(?:\s+of\s+(?:birth|death|origin))?)"
)
# A clause that holds the asked part ("… in what city?", "… whose godfather is whom?") is the
# question itself, not a phrase naming an entity.
_ASKED = re.compile(r"\b(?:what|which|who|whom|how)\b")
# "the village of Clonbrook" is Clonbrook itself and "the east of Tennessee" a part of it, not
# entities to find.
_APPOSITIVE = frozenset(
    "village town city state county province island isle region district kingdom republic duchy river lake mount "
    "port borough parish commune municipality east west north south northeast northwest southeast southwest part "
    "rest side end middle center centre coast".split()
)
_NOT_NOUNS = frozenset(
    "a an the of and or in on at to is was are were has had have be been first last own most best after before for "
    "by with from into onto located named based called known founded formed name".split()
)
_NOT_NAMES = frozenset("What Which Who Whom Whose When Where How The A An In Of".split())
_DEEPEST = 8  # phrases resolved at most by reference_depth
# What is left of a question once a phrase is taken out: if only these words remain, the phrase
# was the question's whole object ("Who is the wife of Kim Jong-chul?"), not a hop on the way.
_BARE = frozenset("what which who whom whose when where how is was are were did does do the a an of".split())


@dataclass(frozen=True)
class Reference:
    """A phrase of a question that names an entity the question does not give.

    Attributes:
        span: The phrase as the question writes it ("the country where the Bubye River is found").
        question: The phrase asked as a question of its own ("Which is the country where …?").
        noun: What the entity is ("country"): the answer prompt asks for it by name.
    """

    span: str
    question: str
    noun: str


def _phrases(question: str) -> list[Reference]:
    """Every phrase of ``question`` that names an entity it does not give."""
    # A relative clause may hold another ("the state that borders the east of the state where
    # …"), so it is tried from every determiner; the other patterns start at a name or "the".
    relatives = (_RELATIVE.match(question, m.start()) for m in re.finditer(r"\b(?:the|a|an)\s", question))
    matches = [
        *(("Which is {span}?", m) for m in relatives if m is not None),
        *(("Which is {span}?", m) for m in _BARE_RELATIVE.finditer(question)),
        *(("What is {span}?", m) for m in _OF_NAME.finditer(question)),
        *(("What is the {noun} of {name}?", m) for m in _POSSESSIVE.finditer(question)),
    ]
    found = []
    for ask, m in matches:
        span = m.group(0).rstrip(" ?,")
        possessive = m.re is _POSSESSIVE
        name, noun = (m.group(1), m.group(2)) if possessive else ("", m.group(1))
        head = noun.split(" of ")[0].split()[-1]
        clause = m.groupdict().get("clause") or ""
        if (
            head in _NOT_NOUNS
            or (m.re is _OF_NAME and head in _APPOSITIVE)
            or (possessive and name.split()[0] in _NOT_NAMES)
            or _ASKED.search(clause)
            or not _words(question.replace(span, " ")) - _BARE
        ):
            continue
        found.append(Reference(span, ask.format(span=span, noun=noun, name=name), head))
    return found


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def inner_reference(question: str) -> Reference | None:
    """The innermost phrase of ``question`` that names an entity it does not give, if any.

    Example:
        >>> r = inner_reference("What is the name of the waterfall in the country where the Bubye River is found?")
        >>> r.question, r.noun
        ('Which is the country where the Bubye River is found?', 'country')
        >>> inner_reference("How many stores are in the state where Hello Love's performer lived?").span
        "Hello Love's performer"
        >>> inner_reference("Who is older, Sid Haig or Vic Darchinyan?") is None
        True
    """
    q = " ".join(question.split())
    found = _phrases(q)
    # The phrase that starts last is the innermost; of two starting there, the shorter.
    return max(found, key=lambda r: (q.rfind(r.span), -len(r.span))) if found else None


def reference_depth(question: str) -> int:
    """How many entities ``question`` names without giving them, one inside the next: the hops
    its own words ask for before the hop that finds the answer.

    On MuSiQue's 100 dev questions the depth follows the decomposition's hop count (mean 0.79 for
    its 2-hop questions, 1.67 for 3-hop, 2.60 for 4-hop; BENCHMARKS.md section 11), so the guided
    driver gives a deeper question more hops.

    Example:
        >>> reference_depth("What is the name of the waterfall in the country where the Bubye River is found?")
        1
        >>> reference_depth("How many stores are in the state where Hello Love's performer lived?")
        2
        >>> reference_depth("Who is older, Sid Haig or Vic Darchinyan?")
        0
    """
    # Each resolution replaces a phrase by a shorter name; the bound only guards odd phrasing.
    depth = 0
    while depth < _DEEPEST and (reference := inner_reference(question)) is not None:
        question, depth = resolve(question, reference, "Entity"), depth + 1
    return depth


def resolve(question: str, reference: Reference, bridge: str) -> str:
    """``question`` with ``reference`` replaced by the entity a hop found for it.

    Example:
        >>> q = "What is the name of the waterfall in the country where the Bubye River is found?"
        >>> resolve(q, inner_reference(q), "Zimbabwe")
        'What is the name of the waterfall in Zimbabwe?'
    """
    q = " ".join(question.split())
    at = q.rfind(reference.span)
    if at < 0:
        return q
    rest = q[at + len(reference.span) :]
    return q[:at] + bridge + (rest if rest.strip(" ?") else "?")


def resolved_question(question: str, bridges: Iterable[str]) -> str:
    """``question`` with its innermost phrase replaced by each bridge in turn (the hops so far).

    A bridge found while the question had no such phrase left leaves it as it is.

    Example:
        >>> resolved_question("How many stores are in the state where Hello Love's performer lived?",
        ...                   ["Hank Snow", "Tennessee"])
        'How many stores are in Tennessee?'
    """
    for bridge in bridges:
        reference = inner_reference(question)
        if reference is None:
            break
        question = resolve(question, reference, bridge)
    return question
