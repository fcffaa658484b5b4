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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

from langgraph_parallelmuse.candidates import CAPITAL

__all__ = ["Reference", "inner_reference", "reference_depth", "resolve", "resolved_question"]

# A name may hold an apostrophe ("The Girl Who Kicked the Hornets' Nest") and the lower-case words
# of titles and of German, Dutch or Romance names ("Bastien und Bastienne", "Ludwig van Beethoven").
# Its words, their length and its lower-case runs are bounded: unbounded, a search tried from each
# word of a long capitalised run read on to the run's end (quadratic: _POSSESSIVE took 20 s on a
# 20,000-char run, every plan step, on the event loop). No real name comes near the bounds (the
# eval questions' longest word has 18 characters).
_NAME_WORD = r"(?:" + CAPITAL + r"|[0-9])[\w.\-'’]{0,80}"
_NAME = (
    rf"{_NAME_WORD}(?:\s+(?:(?:of|the|and|und|de|del|da|di|du|la|le|von|van|der|den|for|with|a)\s+){{0,4}}"
    rf"{_NAME_WORD}){{0,24}}"
)
# A name a comma continues ("Albert, King of Belgium", "Alexander and the Terrible, Horrible, No Good,
# Very Bad Day"): it is one entity's, not a list's, when a phrase names it after "of".
_NAMES = rf"{_NAME}(?:,\s+{_NAME})*"
# A phrase's determiner; capitalised only where it starts the question ("The state where Henry Worrall
# died has how many congressional districts?"): elsewhere a capital "The" starts a name ("The Hague").
_THE = r"(?:^The|\bthe)"
_DETERMINER = r"(?:^(?:The|An?)|\b(?:the|an?))"
# Prepositions a clause's verb may take ("is based on", "was named for"), besides "in".
_PREPOSITIONS = "on|at|of|for|from|with|by|to|into|about"
_PARTICIPLE = r"(?:located|born|found|formed|founded|held|based|situated|headquartered|set|(?:a\s+)?part\s+of)"
# One step of a relative clause, which ends at a comma, a question mark or a sentence's stop: a word
# and the spaces after it, another character, or a name and its comma. A comma between two names
# stays inside ("the county in which Johnnycake, West Virginia is located"), and so does the stop of
# an initial or a title ("Harris W. Fawell", "Mr. Cool").
# No two steps take the same text, or a clause that ended with no "is located" was tried every way
# its steps could split it: a run of dots that two stops took, 2^n ways (24 dots: 11 s); a word of
# n capitals before a comma, n ways when a name could start at any of them ("McDonald, ": 8 words
# of 7 capitals, 6 s). So a name starts where its word does (a capital outside \w, "Ⓐ", is of the
# word), when the word has a capital; and a word is one step, which also makes a clause fewer steps.
_RUN_CHAR = rf"(?:[\w.\-'’]|{CAPITAL})"
_CLAUSE_STEP = (
    rf"(?:(?<!{_RUN_CHAR})(?={_RUN_CHAR}*+,)(?={_RUN_CHAR}*?{CAPITAL}){_RUN_CHAR}*+,\s+(?={CAPITAL}|[0-9])"
    rf"|\w++\s*+|[^\w,?.]|\.(?!\s+{CAPITAL})|(?<![a-z]{{2}})\.(?=\s+{CAPITAL}))"
)
# "the country where …", "a German musician whose …", "the person under whom …": a head noun (up to
# two words before it) and a relative clause, which runs to the clause's end (_CLAUSE_STEP), or ends
# after a "located"/"born"-like participle ("the area where X is located became a state"); a preposition
# after it is the clause's only at its end ("the country X is located in?", "… is based on?", not "…
# located in the city where …").
_RELATIVE = re.compile(
    rf"{_DETERMINER}\s+((?:[\w-]+\s+){{0,2}}?[a-z][\w-]*)\s+"
    r"(?P<pronoun>which|that|who|whom|where|whose|when|(?:in|under|by|for|from|with|on|at|during)\s+(?:which|whom))\s+"
    rf"(?P<clause>{_CLAUSE_STEP}+?\b(?:is|was|are|were)\s+{_PARTICIPLE}(?:\s+(?:in|{_PREPOSITIONS})(?=\s*(?:[,?.]|$)))?\b"
    rf"|{_CLAUSE_STEP}+)"
)
# Characters of a relative phrase, at most: each determiner's phrase is read to its clause's end, so
# a question of nested phrases was read once per phrase (quadratic: 4 s for each plan step of a
# 4,000-char question). Real phrases are far shorter (the eval questions' longest clause has 171).
_LONGEST_PHRASE = 400
# The shorter clause of a phrase whose long one took the question's own verb ("What time does the
# state where Greenfield-Central High is stop selling booze?"): a named subject and its verb (a name
# after "the" may follow two lower-case words, a verb "be" a modal: "When did the city where the next
# winter Olympics will be held fall?") ...
_MODAL_BE = r"(?:will|would|can|could|may|might|must|shall|should)\s+be"
_OBJECT_CLAUSE = re.compile(
    rf"(?:the\s+(?:[a-z][\w-]*\s+){{0,2}}?)?{_NAME}\s+"
    rf"(?:(?:{_MODAL_BE}|is|was|are|were)\b(?:\s+(?:(?P<participle>{_PARTICIPLE}|[a-z]+ed)|(?:a|an|the)\s+[a-z][\w-]*)\b)?"
    r"|[a-z][\w-]*)"
)
# ... or, after "who"/"that", the verb and its object up to a name the question's verb follows ("the
# actor who starred as Benton Fraser in the series "Due South" have a child with?").
_FUNCTION_WORDS = "in|on|at|of|for|from|with|by|to|into|as|and|or|the|a|an|during|after|before|since|near|under"
_STRANDED = re.compile(rf"\s+(?:{_PREPOSITIONS})\b")
# The question's own verb, before the word that asks (its auxiliaries, an object of one word after
# a/an/the, and a preposition with it): "… | was founded in what year?", "… | has how many …", "… |
# shares a border with which country?", "… | died when?". A phrase that starts the question, its
# subject, ends before it; "where"/"when" ask only at the question's end.
_QUESTION_VERB = re.compile(
    r"(?:\b(?:is|was|are|were|has|had|have|be|been|will|would|can|could|may|might|must|should)\s+){0,3}"
    rf"\b[a-z][\w-]*(?:\s+(?:an?|the)\s+[\w-]+)?(?:\s+(?:in|{_PREPOSITIONS}))?"
    r"\s+(?=(?:what|which|how|who|whom|whose)\b|(?:when|where)\s*\??\s*$)"
)
_SUBJECT_CLAUSE = re.compile(rf"[a-z][^,?]*?\b{_NAME}[\"”’)]?(?=\s+(?!(?:{_FUNCTION_WORDS})\b)[a-z])")
# Before a phrase, a word that needs a verb after it: with nothing after the phrase, its clause took
# the verb ("What amount of TEUs did the location where the 26th Chess Olympiad occur handle in 2010?").
# So does a copula a question word asks with: its participle is the question's ("When was the company
# that Steve Jobs founded established?", "When was the country that produced Fist Power taken by …").
_NEEDS_VERB = re.compile(
    r"\b(?:do|does|did|whom|which|where|(?P<copula>(?:[Ww]hen|[Ww]here|[Hh]ow)\s+(?:is|was|are|were)))\s+$"
)
# A word that may be such a copula's participle ("founded", "taken", "born", "built", "held").
_QUESTION_PARTICIPLE = re.compile(rf"\b(?:{_PARTICIPLE}|[a-z]+(?:ed|en|wn|rn|lt))\b")
# Words a subject clause ("who also played Captain Miller in Saving Private Ryan") starts with when
# it has a subject of its own (an object clause: "that the Tekeze River turns into").
_SUBJECTS = frozenset("the a an this these those his her its their he she it they we one".split())
_COPULAS = frozenset("is was are were".split())
# After these a verb "is"/"was" is a nested clause's ("who was premier when Copley was Minister").
_NESTING = frozenset("when where who whom whose which that while because after before as if since until and or".split())
# "the country Dai Jitao is from", "the company Novair International Airways is part of".
_BARE_RELATIVE = re.compile(
    rf"{_THE}\s+([a-z][\w-]*)\s+{_NAME}\s+(?:is|was|are|were)\s+(?:(?:located|a\s+part|part)\s+)?(?:from|in|of)\b"
)
# "the composer of Aschenbrodel", "the place of birth of David Morse": a noun of a named entity.
_OF_NAME = re.compile(rf"{_THE}\s+((?:[a-z][\w-]*\s+){{0,2}}?[a-z][\w-]*)\s+of\s+{_NAMES}")
# "Hello Love's performer", "Big Eye's main director", "Corey Taylor's city of birth"; "the" before
# the name is the phrase's ("the Deane Waldo Malott's alma mater").
_POSSESSIVE = re.compile(
    rf"(?:\bthe\s+)?\b({_NAME})['’]s\s+((?:(?:main|first|former|current|original|home|birth|record|parent|lead)\s+)?"
    r"(?P<head>alma\s+mater|[a-z][\w-]*)(?:\s+of\s+(?:birth|death|origin))?)"
)
# A clause that holds the asked part ("… in what city?", "… whose godfather is whom?", "… a war that
# Italy entered when?") is the question itself, not a phrase naming an entity; a "when"/"where"
# inside it opens a nested clause ("the country where the city where X was born is located").
_ASKED = re.compile(r"\b(?:what|which|who|whom|how)\b|\b(?:when|where)\s*$")
# "… a second campus in which California city?", "… an appearance by which rapper?", "… the Nile
# ends borders which sea?": the "which" asks, as a relative one has a subject and a verb after it.
_WHICH_ASKS = re.compile(
    rf"{_NAME}\s+(?:country|city|town|state|county|province|island|region|district|village|river)|[a-z][\w-]*"
)
# "What was the profession of Amy Johnson, whom's life …?", "Name the mother of Edward Stafford, …":
# the phrase is what is asked, whatever follows its comma.
_ASKS_FOR = re.compile(r"(?:(?:what|which|who)\s+(?:is|was|are|were)|name)\s+", re.IGNORECASE)
# "The Jump is a British television series that …", "Maryland, a group that …": an indefinite phrase
# after a verb "is" or a comma describes what is named before it; "There is a country where …" names one.
_DESCRIBES = re.compile(r"(?:(?<![Tt]here )\b(?:is|was|are|were)|,)\s+$")
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
# Characters before a phrase that hold the word it follows (_NEEDS_VERB, _DESCRIBES).
_WINDOW = 40
# What is left of a question once a phrase is taken out: if only these words remain, the phrase
# was the question's whole object ("Who is the wife of Kim Jong-chul?"), not a hop on the way.
_BARE = frozenset("what which who whom whose when where how is was are were did does do the a an of".split())
_WORD = re.compile(r"\w+")
# Nothing after a phrase but a comma or question mark: the phrase ends what _ASKS_FOR asks.
_ENDS = re.compile(r"\s*(?:[,?]|$)")


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
    # (how the phrase is asked, where it starts, the phrase, its name, its noun, the noun's head word)
    matches = [
        *(("Which is {span}?", at, span, "", noun, noun) for at, span, noun in _relatives(question)),
        *(
            ("Which is {span}?", m.start(), m.group(0), "", m.group(1), m.group(1))
            for m in _BARE_RELATIVE.finditer(question)
        ),
        *(
            ("What is {span}?", m.start(), m.group(0), "", m.group(1), m.group(1))
            for m in _OF_NAME.finditer(question)
            if _head(m.group(1)) not in _APPOSITIVE
        ),
        *(
            ("What is the {noun} of {name}?", m.start(), m.group(0), m.group(1), m.group(2), m.group("head"))
            for m in _POSSESSIVE.finditer(question)
            if m.group(1).split()[0] not in _NOT_NAMES
        ),
    ]
    # A phrase repeated ("the author of X … the author of X") is taken out of the question once.
    found, others, alone = [], _other_words(question), {}
    for ask, at, span, name, noun, head in matches:
        span = span.rstrip(" ?,")
        head = _head(head)
        if span not in alone:
            alone[span] = _only_bare_without(question, span, others)
        # What stands before and after the phrase is read in place: a slice of each copied the
        # question once per phrase.
        if (
            head in _NOT_NOUNS
            or alone[span]
            or (_ASKS_FOR.fullmatch(question, 0, at) and _ENDS.match(question, at + len(span)))
            or (re.match(r"an?\s", span) and _DESCRIBES.search(question, max(at - _WINDOW, 0), at))
        ):
            continue
        # Asked on its own, a phrase that started the question does not start the sentence.
        asked = span[0].lower() + span[1:] if at == 0 and re.match(_DETERMINER + r"\s", span) else span
        found.append(Reference(span, ask.format(span=asked, noun=noun, name=name), head))
    return found


def _head(noun: str) -> str:
    """The word that says what ``noun`` is: "place" of "place of birth", "director" of "main director"."""
    return noun if noun == "alma mater" else noun.split(" of ")[0].split()[-1]


def _relatives(question: str) -> Iterator[tuple[int, str, str]]:
    """Where each relative phrase of ``question`` starts, the phrase and its noun, its clause cut
    where the question's own words go on; a phrase whose clause asks is left out.
    """
    # A relative clause may hold another ("the state that borders the east of the state where
    # …"), so it is tried from every determiner. What is read around each phrase is a window, not
    # the question's whole head or tail: read whole, a question of nested phrases was read once per
    # phrase (quadratic). The window holds the word before the phrase, as ``question`` has single
    # spaces (inner_reference); what follows the question's last word is only stops.
    last = len(question.rstrip(" ?.!"))
    for determiner in re.finditer(_DETERMINER + r"\s", question):
        window = determiner.start() + _LONGEST_PHRASE
        m = _RELATIVE.match(question, determiner.start(), window)
        # A phrase that reaches the window's end goes on past it: no phrase read, rather than one cut.
        if m is None or m.end() >= window:
            continue
        pronoun, at = m.group("pronoun"), m.start("clause")
        clause = _own_clause(pronoun, m.group("clause"))
        verb = _QUESTION_VERB.search(question, at) if m.start() == 0 else None
        if verb is not None and verb.start() <= at:
            continue
        if verb is not None:  # "The university where Obama studied | was founded in what year?"
            clause = clause[: verb.start() - at]
        end = at + len(clause)
        needs = _NEEDS_VERB.search(question, max(m.start() - _WINDOW, 0), m.start())
        # A phrase that starts the question with no asking word after its verb is its subject still.
        if (needs or (m.start() == 0 and verb is None)) and end >= last:
            clause = _shorter_clause(
                question, clause, at, last, subject=_is_subject(pronoun, clause), copula=needs and needs["copula"]
            )
        clause = clause.rstrip(" ?,")
        # An object clause cut before a preposition ("that James Woods' character is based | on in the
        # film …") goes on: what follows is not the question's. After "where" it is ("the city where
        # Mozart was born | at the time of …"), and so is "in the city where …" after "is located".
        if pronoun in ("that", "which", "who", "whom") and _STRANDED.match(question, at + len(clause)):
            continue
        if _ASKED.search(clause) or (pronoun.endswith("which") and _WHICH_ASKS.fullmatch(clause)):
            continue
        yield m.start(), question[m.start() : at + len(clause)], m.group(1)


def _shorter_clause(question: str, clause: str, at: int, last: int, *, subject: bool, copula: str | None) -> str:
    """``clause`` (at ``at`` in ``question``, to its last word at ``last``) without the question's verb.

    After a question's copula ("When was …") the participle the clause's "is" may take is the
    question's when none follows it: "the state where Greenfield-Central High is" in "When was the
    state where Greenfield-Central High is admitted to the union?" (taken, the question lost it).
    """
    shorter = (_SUBJECT_CLAUSE if subject else _OBJECT_CLAUSE).match(question, at, at + len(clause))
    if shorter is None or len(shorter.group(0)) >= len(clause):
        return clause
    if (
        copula
        and not subject
        and shorter["participle"]
        and not _QUESTION_PARTICIPLE.search(question, shorter.end(), last)
    ):
        return question[at : shorter.start("participle")].rstrip()
    return shorter.group(0)


def _is_subject(pronoun: str, clause: str) -> bool:
    """True when ``clause`` has no subject of its own: "who played …", not "that Italy entered"."""
    first = clause.split(" ", 1)[0]
    return pronoun in ("who", "which", "that") and first.islower() and first not in _SUBJECTS


def _own_clause(pronoun: str, clause: str) -> str:
    """``clause`` without the question's own verb: a subject clause has one verb "is"/"was" at most
    ("the actor who played Captain Miller in Saving Private Ryan *is stuck* in The Terminal").
    """
    if not _is_subject(pronoun, clause):
        return clause
    words = clause.split(" ")
    for i, word in enumerate(words[1:], 1):
        if word in _NESTING:
            break
        if word in _COPULAS:
            return " ".join(words[:i])
    return clause


def _other_words(question: str) -> tuple[int, int]:
    """Where the first word of ``question`` other than the bare ones (_BARE) ends and the last starts.

    A word is lower-cased alone, which gives the words of the lower-cased question: no character
    outside a word becomes a word's when lower-cased.
    """
    others = [m.span() for m in _WORD.finditer(question) if set(_WORD.findall(m.group(0).lower())) - _BARE]
    return (others[0][1], others[-1][0]) if others else (len(question) + 1, -1)


def _only_bare_without(question: str, span: str, others: tuple[int, int]) -> bool:
    """True when only bare words (_BARE) are left of ``question`` with ``span`` taken out wherever it
    stands: the phrase is the question's whole object, not a hop on the way.

    A word other than the bare ones (``others``: :func:`_other_words`) before the span's first
    place or after its last is left: this settles it without taking the span out, which read the
    question once per phrase (quadratic in a question of nested phrases).
    """
    if others[0] <= question.find(span) or others[1] >= question.rfind(span) + len(span):
        return False
    return not set(_WORD.findall(question.replace(span, " ").lower())) - _BARE


# Memoised: a plan step asks again for each question it asked before (GuidedDriver.budget runs
# reference_depth on every step), and both are pure functions of the question's text.
@lru_cache(maxsize=1024)
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


@lru_cache(maxsize=1024)
def reference_depth(question: str) -> int:
    """How many entities ``question`` names without giving them, one inside the next: the hops
    its own words ask for before the hop that finds the answer.

    On MuSiQue's 100 dev questions the depth follows the decomposition's hop count (mean 0.88 for
    its 2-hop questions, 1.70 for 3-hop, 2.40 for 4-hop, since a phrase that starts the question is
    read; 0.85 before, since a question's own verb after "When was" or "will be" no longer hides a
    phrase; 0.82 for 2-hop since session 40; 0.79, 1.67 and 2.60 in BENCHMARKS.md section 11), so
    the guided driver gives a deeper question more hops.

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
