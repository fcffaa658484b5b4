"""Candidate answers from what a trajectory read: the options the guided driver's model chooses among.

A 135M model's free answer is the ceiling of a small embedded agent (F1 0.097 on HotpotQA with
the two gold paragraphs in its prompt), while its retrieval finds the supporting documents most
of the time. So the guided answer step proposes spans of the evidence the trajectory read (names,
titles, dates, numbers; ``yes``/``no`` for a yes/no question; the two options a comparison
question names) and the model picks one by its likelihood (:class:`~.segments.Choose`). Nothing
here reads gold labels: every candidate is a span of the evidence text it is given.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Sequence
from typing import Literal

__all__ = [
    "CAPITAL",
    "AnswerKind",
    "answer_kind",
    "answer_type",
    "candidates",
    "choice_options",
    "compound_parts",
    "follow_up",
]

AnswerKind = Literal["yesno", "choice", "date", "number", "person", "name"]

# A capital letter of any script ("Ōsaka", "Émile Zola"), as a regex class: ``re`` has no Unicode
# property classes, so it lists the capitals of the Basic Multilingual Plane.
CAPITAL = "[" + "".join(c for c in map(chr, range(0x10000)) if c.isupper()) + "]"
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
# Lower-case words inside names ("Bank of America", "Ludwig van Beethoven"); not "in"/"at", which
# would join neighbouring names.
_CONNECT = r"(?:of|the|de|del|da|di|du|la|le|von|van|der|den|and|&|for)"
# "6,960", "6.8" and "1.2.1.6" (a catalogue number) are one number each, not "6" and "960" or "6"
# and "8"; a stop not followed by a digit ends the number ("in 1998. The").
_CAP_WORD = rf"(?:{CAPITAL}[\w'’.\-]*|[0-9]{{1,3}}(?:,[0-9]{{3}})+(?:\.[0-9]+)*|[0-9]+(?:\.[0-9]+)*[A-Za-z]*)"
_NAMED = re.compile(rf"{_CAP_WORD}(?:\s+(?:{_CONNECT}\s+)?{_CAP_WORD})*")
# A bare year is no piece of a grouped or decimal number ("960" of "6,960", "1415" of "3.1415").
_DATE = re.compile(
    rf"\b(?:(?:\d{{1,2}}\s+)?(?:{_MONTHS})(?:\s+\d{{1,2}},?)?\s+\d{{3,4}}|(?<!\d[,.])\d{{3,4}}s?(?![,.]\d))\b"
)
# An ordinal century as the evidence writes it ("the 12th century", "nineteenth century", "5th
# century BC"): a "which century" question's answer, which no year span is (and no year is made into
# one: "1150" is no candidate for "12th century"). A hyphened "19th-century" is an adjective.
_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|"
    "fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty-first"
)
_CENTURY = re.compile(
    rf"\b(?:\d{{1,2}}(?:st|nd|rd|th)|{_ORDINALS})\s+century(?:\s+(?:BCE?|AD|CE)\b)?(?![\w-])", re.IGNORECASE
)
_NUMBER = re.compile(
    r"(?<![\w.])[$£€]?\d[\d,]*(?:\.\d+)?(?:\s*(?:%|percent|million|billion|thousand|km|miles|metres|meters|feet|"
    r"years|people|acres))?(?!\w)"
)
# Sentence-initial and function words that start a capitalised run without being part of a name.
_LEADING = frozenset(
    "The A An In On At He She It His Her Its They This That These Those There As By For From After Before "
    "During When While With However Since Their But And Or If Of To Is Was Also Both All".split()
)
# A span led by a number with a fraction ("29.582799", "29.58278 N", "1,250.5"): a quantity, a
# coordinate or a score, never the name of a thing a question calls by its type (a county, an
# album); a whole number may be ("1989"), and so may a name that ends in a fraction ("Windows 3.1").
_FRACTION = re.compile(r"[$£€]?[0-9][0-9,]*\.[0-9]+(?:\s|$)")
# Nor is a whole calendar date the name of a thing called by its type: "… the signing of what
# treaty?" was answered "October 6, 1913", a date of the page read. A bare number is, for some
# types ("1989" an album, "747" a model, "1992" an election), but never for a place ("… in which
# California city?" was answered "1999"). A type that is a time ("what month", "which season")
# keeps every date; "Treaty of 1818" stays, a name with a year in it.
_CALENDAR_DATE = re.compile(rf"(?:\d{{1,2}}\s+)?(?:{_MONTHS})\b.*\d{{3,4}}")
_PLACES = frozenset(
    "city town village state country county province region district capital nation continent island river "
    "lake mountain mountains range sea ocean territory area borough municipality neighborhood".split()
)
_TIMES = frozenset("time year date month day week season century decade era period age dynasty reign".split())
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how in is it its of on or that the this to was were "
    "what when where which who whom whose with s".split()
)
_WH = re.compile(r"\b(which|what|who|whom|whose|when|where|how)\b", re.IGNORECASE)
_YES_NO = re.compile(r"^\s*(are|is|was|were|do|does|did|can|could|has|have|had|will|would)\b", re.IGNORECASE)
# A sentence ends at a stop that does not close an initial ("G. Stanley Hall" is one name), and at
# a line ending of any convention: lines split by "\r" or U+2028 alone ran into one name ("Paris
# London Rome"). A vertical tab is a space, as inside a span.
_SENTENCE = re.compile(rf"(?<=[.!?])(?<!\b{CAPITAL}\.)\s+|[\n\r\x85\u2028\u2029]+")


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in _STOPWORDS}


def _trim(span: str) -> str:
    # "Norway's major anniversary": the name is "Norway"; "“Thriller”" (typographic quotes) "Thriller".
    words = re.sub(r"['’]s$", "", span.strip(" ,.;:'\"()[]“”‘’")).split()
    # A name of function words only is kept whole ("The Who": "Who" alone was no candidate at all);
    # any other loses its leading function words ("However It" is nothing, "The Beatles" "Beatles").
    # Counted by index: cut one word at a time, a run of them was copied once per word.
    start = 0
    if len(words) < 2 or any(_words(word) for word in words):
        while start < len(words) and words[start] in _LEADING:
            start += 1
    words = words[start:]
    while words and re.fullmatch(_CONNECT, words[-1]):
        words = words[:-1]
    return " ".join(words)


# "the birth of Robert Young" is compared by Robert Young; "the director of Jaws" is not Jaws.
_EVENT_OF = re.compile(
    r"^(?:birth|death|forming|formation|founding|release|establishment|creation|opening|launch)\s+of\s+", re.I
)
_DETERMINER = re.compile(r"^(?:the|a|an)\s+", re.I)


def _option(side: str) -> str:
    """One option of a comparison as the evidence would name it: no determiner, event noun or note.

    "the Pterocarya" is Pterocarya, "the birth of Robert Young" Robert Young and "Sid Haig
    (actor)" Sid Haig; an option the evidence does not hold is dropped by :func:`candidates`.
    """
    # A determiner may stand before the event noun and after it ("the birth of the Beatles").
    side = re.sub(r"\s*\([^()]*\)\s*$", "", side.strip())
    return _trim(_DETERMINER.sub("", _EVENT_OF.sub("", _DETERMINER.sub("", side))))


# Words by which a question compares its two options ("Who is older, X or Y?").
_COMPARES = re.compile(
    r"\b(?:first|last|earlier|earliest|later|latest|older|oldest|younger|youngest|newer|newest|more|most|less|"
    r"least|fewer|fewest|larger|largest|bigger|biggest|smaller|smallest|longer|longest|shorter|shortest|taller|"
    r"tallest|higher|highest|lower|lowest|greater|greatest|wider|widest|deeper|deepest|heavier|heaviest|"
    r"faster|fastest|closer|closest|farther|further|better|best|worse|worst)\b",
    re.IGNORECASE,
)


def _ends_the_question(option: str) -> bool:
    """True when the right option is all that follows the "or": a name ends it ("the director
    of Alien") or it names none ("cats"), where "Lust born" (of "the singer of Love or Lust
    born") goes on after its name."""
    # The last word is read alone: searched for from each capital to the end, a long word was read
    # once per capital (quadratic: 3 s for 20,000 characters).
    named = re.compile(rf"{CAPITAL}|\d")
    return "," not in option and (not named.search(option) or bool(named.search(option.split()[-1])))


def choice_options(question: str) -> list[str]:
    """The two options of a comparison question ("Who is older, X or Y?", "Between X and Y, which …?"), else ``[]``.

    An "or" compares when the question has a word that compares ("first", "older", "more", …) or
    its right option ends the question, and, without a comma before the options, the right option
    ends it in any case: in "When was the singer of Love or Lust born?" the "or" is part of a title.

    Example:
        >>> choice_options("Who is the oldest, Sid Haig or Vic Darchinyan?")
        ['Sid Haig', 'Vic Darchinyan']
        >>> choice_options("Which came first the forming of The Dandy Warhols or the birth of Robert Young?")
        ['Dandy Warhols', 'Robert Young']
        >>> choice_options("Between Iain Banks and Irwin Shaw, which writer has had a more diverse career?")
        ['Iain Banks', 'Irwin Shaw']
        >>> choice_options("When was the singer of Love or Lust born?")
        []
    """
    q = " ".join(question.split()).rstrip("?").strip()
    # The first "and" splits the options, atomically: when nothing after it asks, nothing after a
    # later one does, and trying each "and" in turn read the question once per "and" (quadratic).
    between = re.match(r"^between\s+(?>(.+?)\s+and\s+)(.+?),\s*(?:which|who|what)\b", q, re.IGNORECASE)
    if between:
        sides = list(between.groups())
    elif q.count(" or ") == 1 and _WH.match(q):
        left, right = q.split(" or ")
        if "," in left:
            left = left.rsplit(",", 1)[-1]
            # "When was the singer born, who sang Love or Lust?": what follows the comma asks. A
            # comma of an aside ("When, exactly, was the singer of Love or Lust born?") compares
            # nothing: the question must compare, or its right option end it.
            if _WH.search(left) or not (_COMPARES.search(q) or _ends_the_question(_option(right))):
                return []
        elif _COMPARES.search(q) and _ends_the_question(_option(right)):
            # No comma: the option is the name nearest the "or" ("Which band was formed first The
            # Exies or …"); a side naming nothing ("shot in or around Leland") compares nothing.
            # After a comma the right option may go on ("the Amazon river", "London, England").
            names = [n for m in _NAMED.finditer(left) if (n := _trim(m.group(0))) and not _WH.fullmatch(n)]
            left = names[-1] if names else ""
        else:
            return []
        sides = [left, right]
    else:
        return []
    options = [_option(side) for side in sides]
    # "Between 1939 and 1945, which country …" is a period, not two options.
    return options if all(options) and not any(re.fullmatch(r"[\d\s,.\-–]+", o) for o in options) else []


# Words an asked wh-word follows in a question that starts like a yes/no one ("Do you know who
# wrote Hamlet?", "Can you tell me which …").
_ASKING = _STOPWORDS | {"know", "tell", "me", "us", "say", "remember"}


def _asking_wh(question: str) -> re.Match[str] | None:
    """The first wh-word of ``question`` that asks: one right after a noun starts a relative clause
    ("the director who made Jaws"), one after a function word or first asks ("… born in what city?").
    """
    # The words before each wh-word are read on from the last one's (read from the start for each,
    # a question of many wh-words was read once per wh-word: quadratic). A wh-word starts a word, so
    # no word runs across where the reading resumes.
    last, start = None, 0
    for m in _WH.finditer(question):
        words = re.findall(r"\w+", question[start : m.start()].lower())
        last, start = words[-1] if words else last, m.start()
        if last is None or last in _ASKING:
            return m
    return None


def _asks(question: str) -> bool:
    """True when a wh-word of ``question`` asks (:func:`_asking_wh`)."""
    return _asking_wh(question) is not None


def _is_yes_no(question: str) -> bool:
    """Starts like a yes/no question and asks nothing else. A relative wh-word keeps it yes/no,
    unless it also names two options ("Was Mozart or Beethoven the composer who wrote Fidelio?"
    asks for one of them)."""
    if not _YES_NO.match(question) or _asks(question):
        return False
    return not (" or " in question and _WH.search(question))


def answer_kind(question: str) -> AnswerKind:
    """What a question asks for, which decides the kind of span its candidates are.

    Example:
        >>> [answer_kind(q) for q in ("Are both X and Y bands?", "When was X born?", "Who wrote X?",
        ...                           "X has an OBE. Does Y have one?", "Was the director who made Jaws born in Ohio?",
        ...                           "Was Mozart or Beethoven the composer who wrote Fidelio?",
        ...                           "Chiang Kai-shek, who died on which date?")]
        ['yesno', 'date', 'person', 'yesno', 'yesno', 'person', 'date']
    """
    q = " ".join(question.lower().split())
    # The wh-word that asks decides, not a relative one before it ("…, who died on which date?" asks
    # for a date: read as "who", its candidates left out every span with a digit). A question whose
    # wh-words are all relative ("Name the director who made Jaws") is read at the first.
    wh = _asking_wh(q) or _WH.search(q)
    # "The director X has an OBE. Does the director Y also have one?": the asking sentence is the
    # last, and starts with a capital ("… Harry Connick Jr. was released …" is one sentence).
    asked = _SENTENCE.split(" ".join(question.split()))[-1]
    if _is_yes_no(q) or (asked[:1].isupper() and _is_yes_no(asked)):
        return "yesno"
    if choice_options(question):
        return "choice"
    rest = q[wh.start() :] if wh else q
    if re.match(r"(when|in what year|(?:what|which) (?:year|date|decade|century))\b", rest):
        return "date"
    if re.match(
        r"how (many|much|long|old|tall|far|big|large|high)\b|what (percentage|number|population|amount)\b|"
        r"what (is|was) the (population|number|amount)\b",
        rest,
    ):
        return "number"
    if re.match(r"(who|whom|whose)\b", rest):
        return "person"
    return "name"


# "Which <...> country is …", "What city did …": the noun before the verb names the answer's type.
_TYPED = re.compile(
    r"^(?:in |of |from |at |for )?(?:which|what)\s+((?:[\w-]+\s+){0,3}?)([a-z][\w-]*)\s+"
    r"(?:is|was|are|were|did|does|do|has|had|have|can|could|will|would)\b",
    re.IGNORECASE,
)
# "What is the capital of …": the noun after "the" names it.
_OF_TYPE = re.compile(r"^(?:what|which|who)\s+(?:is|was|are|were)\s+the\s+([a-z][\w-]*)\s+of\b", re.IGNORECASE)
# "… began with the signing of what treaty?", "… based in what state?": the asking wh-word later in
# the question, its noun ending the question or followed by a verb.
_LATE_TYPE = re.compile(
    r"(?:which|what)\s+((?:[\w-]+\s+){0,2}?)([a-z][\w-]*)\b\s*"
    r"(?:[?.!]|$|(?:is|was|are|were|did|does|do|has|had|have|can|could|will|would)\b)",
    re.IGNORECASE,
)
# Nouns that say nothing of a name's type ("What kind of …", "What is the name of …", "What body
# of water …") or ask for a quantity or a time, which is not a name.
_UNTYPED = frozenset(
    "name kind type sort part one ones thing things body amount number percentage population time year date "
    "height length area distance elevation altitude depth width size weight speed score rate ratio average "
    "temperature price cost value budget revenue capacity attendance output debt".split()
)


def answer_type(question: str) -> str | None:
    """The noun a question names its answer by ("Which country …" → ``country``), else ``None``.

    The answer prompt says it ("Answer with the name of the country."): scored so, a 135M
    model prefers "France" to "Paris" for the country of the Eiffel Tower even when the evidence
    talks more of Paris.

    Example:
        >>> [answer_type(q) for q in ("Which country is the Eiffel Tower in?",
        ...                           "what is the capital of France?", "Who wrote Hamlet?",
        ...                           "The ETUC began with the signing of what treaty?")]
        ['country', 'capital', None, 'treaty']
    """
    q = " ".join(question.split())
    m = _TYPED.match(q) or _OF_TYPE.match(q)
    if m is None and (wh := _asking_wh(q)) is not None and wh.start() > 0:
        m = _LATE_TYPE.match(q, wh.start())
        # "… starred in what for seven years?": a function word among them is no noun phrase.
        if m is not None and {w.lower() for w in m.group(1).split()} & _STOPWORDS:
            return None
    if m is None:
        return None
    words = [w.lower() for g in m.groups() for w in g.split()]
    # "What kind of plant …" asks for a kind, not for a plant's name.
    return None if set(words) & _UNTYPED or words[-1] in _STOPWORDS else words[-1]


def compound_parts(question: str) -> tuple[str, str] | None:
    """A question that asks for two things, split in two ("…, and what is the capital of that country?").

    Example:
        >>> compound_parts("Which country is the Eiffel Tower in, and what is the capital of that country?")
        ('Which country is the Eiffel Tower in?', 'what is the capital of that country?')
        >>> compound_parts("When was the singer born who is known for her voice and who's third album is X?") is None
        True
    """
    # "and who's third album …" continues a relative clause: a second question's wh-word stands alone.
    m = re.match(r"^(.+?),?\s+and\s+((?:which|what|who|where|when|how)\s.+)$", " ".join(question.split()), re.I)
    if not m or not _WH.match(m.group(1)):
        return None
    return m.group(1).rstrip(" ,?") + "?", m.group(2)


# A pronoun that refers to the first part's answer; "her" before a noun is possessive ("her
# album"), else an object ("who married her").
_PRONOUN = re.compile(
    rf"\b(?:(its|his|her(?=\s+(?!(?:{'|'.join(sorted(_STOPWORDS))})\b)\w))|it|he|she|him|her)\b", re.IGNORECASE
)


# Nouns a demonstrative names a person by, when the first part asks "who" ("Who directed Jaws,
# and when was that director born?"). Only persons: after "Who sang Jolene", "that song" is the
# first part's subject, not its answer; and a list, not "this + any word" ("did this happen").
_PERSONS = frozenset("person man woman director writer author actor actress singer musician artist player".split())


def follow_up(part: str, first_answer: str, *, first: str) -> str:
    """The second part of a compound question with its reference to the first answer resolved.

    The reference is a phrase naming the first part's answer by its type ("that country" after
    "Which country …?") or, after a "who" question, a demonstrative before a noun that names a
    person ("that director"), else a pronoun ("it", "its capital"); a "that" of a relative clause ("the river
    that flows …") is no reference. A part naming no reference is returned as it is.

    Args:
        part: The second part.
        first_answer: The answer chosen for the first part.
        first: The first part, whose answer type names its answer in ``part``.

    Example:
        >>> first = "Which country is the Eiffel Tower in?"
        >>> follow_up("what is the capital of that country?", "France", first=first)
        'what is the capital of France?'
        >>> follow_up("what is the river that flows through that country?", "France", first=first)
        'what is the river that flows through France?'
        >>> follow_up("what is its capital?", "France", first=first)
        "what is France's capital?"
        >>> follow_up("when was he born?", "Steven Spielberg", first="Who directed Jaws?")
        'when was Steven Spielberg born?'
    """
    nouns = [re.escape(noun)] if (noun := answer_type(first)) else []
    patterns = [rf"\b(?:that|this|the same|the)\s+{n}\b" for n in nouns]
    if re.match(r"\s*(?:who|whom|whose)\b", first, re.IGNORECASE):
        patterns.append(rf"\b(?:that|this|the same)\s+(?:{'|'.join(sorted(_PERSONS))})\b")
    for named in (re.compile(p, re.IGNORECASE) for p in patterns):
        if named.search(part):
            return named.sub(lambda _: first_answer, part, count=1)
    # A function is the replacement: an answer's backslash is no group reference.
    return _PRONOUN.sub(lambda m: f"{first_answer}'s" if m.group(1) else first_answer, part, count=1)


# "What position did he play?", "Lilu is what?": the answer is a description ("striker", "a
# spirit"), which no capitalised run holds.
_DESCRIBED = re.compile(
    r"\b(?:what|which)\s+(?:[\w-]+\s+){0,2}?(?:position|profession|occupation|role|genre|kind|type|sort|job|"
    r"instrument|sport)\b|\bis what\W*$",
    re.IGNORECASE,
)
# A predicate noun phrase: "… plays as a striker", "… was a pioneering English aviator who …".
_PREDICATE = re.compile(
    r"\b(?:is|was|are|were|as|became)\s+(?:a|an|the)\s+([\w-]+(?:\s+[\w-]+){0,3}?)"
    r"(?=\s+(?:of|who|which|that|for|in|from|and|with|by|at|on|to)\b|\s*[,.;:()]|\s*$)"
)


def _described(sentence: str) -> list[str]:
    """The head noun of each predicate noun phrase of ``sentence``, and the phrase when longer."""
    out = []
    for m in _PREDICATE.finditer(sentence):
        words = m.group(1).split()
        if words[-1][0].islower():
            out += [words[-1], *([" ".join(words[-2:])] if len(words) > 1 and words[-2][0].islower() else [])]
    return out


# Typographic quotes too: web pages write “Falling Away from Me”, which only a quote keeps whole.
_QUOTED = re.compile(rf'["“]((?:{CAPITAL}|[0-9])[^"“”]{{0,58}}?)[,.]?["”]')


def _spans(sentence: str, kind: AnswerKind, *, described: bool = False, centuries: bool = False) -> list[str]:
    if kind == "date":
        # A full date and its year: "When was he born?" may want either ("1920s" has no year of its own).
        # Centuries too when the question asks for one, in the order the sentence gives them (asked
        # for a year, a century only took a year's place among the options).
        rules = (_CENTURY, _DATE) if centuries else (_DATE,)
        found = sorted((m.start(), m.group(0)) for rule in rules for m in rule.finditer(sentence))
        dates = [span for _, span in found]
        return list(dict.fromkeys(s for d in dates for s in (d, *re.findall(r"\s(\d{3,4})$", d))))
    if kind == "number":
        return [m.group(0).strip(" ,") for m in _NUMBER.finditer(sentence)]
    # A quoted title is whole even where its words are not capitalised ("Falling Away from Me").
    named = [m.group(1) for m in _QUOTED.finditer(sentence)] if kind == "name" else []
    for m in _NAMED.finditer(sentence):
        # "Boston and Maine" may be one name or two: offer the whole and its parts.
        # Anchored at the start of a space run: unanchored, a run of n spaces is retried from each
        # of its spaces (quadratic: 5 s for 20,000).
        parts = re.split(r"(?<!\s)\s+(?:and|&)\s+", m.group(0))
        named += [_trim(m.group(0)), *(_trim(p) for p in (parts if len(parts) > 1 else []))]
    if kind == "person":
        return [s for s in named if not re.search(r"\d", s) and len(s.split()) <= 5]
    return (_described(sentence) if described else []) + named + [m.group(0) for m in _DATE.finditer(sentence)]


def _not_a_name(span: str, typed: str) -> bool:
    """Whether a whole-date span cannot name a thing of type ``typed`` (see ``_CALENDAR_DATE``)."""
    return bool(_DATE.fullmatch(span)) and (bool(_CALENDAR_DATE.match(span)) or typed in _PLACES)


def _unfit(span: str, typed: str | None, kind: AnswerKind) -> bool:
    """Whether ``span`` can be no candidate: too long, no thing of type ``typed``, or holding a quote,
    backslash or control character, which would break the JSON of a query that starts from the span
    (a bridge)."""
    return (
        len(span) > 60
        or '"' in span
        or "\\" in span
        or any(c < " " for c in span)
        or bool(typed and _FRACTION.match(span))
        or bool(typed and kind == "name" and typed not in _TIMES and _not_a_name(span, typed))
    )


def candidates(
    question: str,
    evidence: str,
    *,
    limit: int = 16,
    titles: Sequence[str] = (),
    exclude: Collection[str] = (),
    within: str = "",
) -> list[str]:
    """Candidate answers to ``question``: spans of ``evidence`` (and ``titles``) of the kind it asks for.

    Spans come from the sentences that share most words with the question first; a span made
    mostly of the question's own words is its subject, not its answer, and is left out. A yes/no
    question gets ``yes``/``no``; a comparison question the two options it names, once the evidence
    mentions either. Text is read composed (NFC): a span of a page that writes "E\u0301mile Zola" with
    a combining accent is "\u00c9mile Zola".

    Args:
        question: The question (or one part of a compound question).
        evidence: The text the trajectory read, as the answer prompt shows it.
        limit: Most candidates returned.
        titles: Titles of the documents read (candidates for a "name" question).
        exclude: Spans that cannot be the answer (the bridges earlier hops went on from).
        within: The whole question when ``question`` is one part of it: its entities are the
            subject of every part ("Eiffel Tower" is not the capital of France).

    Example:
        >>> candidates("Which city was Ellen Marsh born in?",
        ...            "Ellen Marsh (born 1921) is a writer. She was born in Dublin, Ireland.")
        ['Dublin', 'Ireland']
    """
    # A combining accent is no word character: decomposed, "E\u0301mile Zola" gave "E" and "Zola",
    # and a page so written never named an option of the question.
    question, evidence, within = (unicodedata.normalize("NFC", text) for text in (question, evidence, within))
    kind = answer_kind(question)
    if kind == "yesno":
        return ["yes", "no"]
    if kind == "choice":
        # Both options once the evidence names either: a lone option would be answered unread
        # (its share 1.0), while the two scored side by side leave an unsure pick to another hop.
        options = choice_options(question)
        # Whole words: "Ian Jones" is not named by a page on Brian Jones.
        if any(re.search(rf"(?<!\w){re.escape(o)}(?!\w)", evidence, re.IGNORECASE) for o in options):
            return options
        kind = "name"
    asked = _words(question)
    # The noun the answer is named by is not the question's subject ("DuPage County" answers "In
    # what county …?").
    typed = answer_type(question)
    subject = (asked | _words(within)) - {typed}
    sentences = [s for s in _SENTENCE.split(evidence) if s.strip()]
    ranked = sorted(range(len(sentences)), key=lambda i: (-len(_words(sentences[i]) & asked), i))
    described = kind == "name" and bool(_DESCRIBED.search(question))
    centuries = bool(re.search(r"\bcentur(?:y|ies)\b", question, re.IGNORECASE))
    pool = [span for i in ranked for span in _spans(sentences[i], kind, described=described, centuries=centuries)]
    if kind == "name":
        pool += [re.sub(r"\s*\([^)]*\)$", "", unicodedata.normalize("NFC", t)).strip() for t in titles]
    seen = {unicodedata.normalize("NFC", e).lower() for e in exclude}
    out: list[str] = []
    for found in pool:
        if len(out) >= limit:  # tested before a span is taken: limit=0 gave one
            break
        # A tab or a line break inside a span is a space ("12\tMay 1974" is "12 May 1974").
        span = " ".join(found.split())
        words = _words(span)
        if not span or span.lower() in seen or _unfit(span, typed, kind):
            continue
        seen.add(span.lower())
        # Half the words may be the question's ("Astrid Young", the sister of Neil Young). A name of
        # function words only is one of several ("The Who"): a lone "It" opens a sentence.
        if (len(words & subject) / len(words) <= 0.5) if words else len(span.split()) > 1:
            out.append(span)
    return out
