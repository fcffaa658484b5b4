"""Answer normalisation: the standard one that scores answers, and the key that groups them in votes.

:func:`normalize_answer` and :func:`token_f1` follow the official HotpotQA evaluation script
(lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace): the benchmarks
score with them, so their numbers are comparable with published results.

:func:`normalize_vote_key` groups the trajectories' answers for the votes, and the aggregator's pick
is snapped to a candidate by it and :func:`vote_overlap`. Deleting punctuation costs nothing when an
answer is scored against its gold, but it merges different answers in a vote ("3.5" and "35", "-5"
and "5"); and ASCII-only rules split one answer written with other characters ("北京" and "北京。",
"Hamlet" and "“Hamlet”"). So the key is Unicode-aware and keeps the punctuation of numbers and the
"#" of names ("C#" is not "C").
(The core never imports ``eval``: the scoring lives here too.)
"""

from __future__ import annotations

import bisect
import re
import string
import unicodedata
from collections import Counter

__all__ = [
    "CJK_CHARS",
    "FUNCTION_WORDS",
    "THOUSANDS",
    "normalize_answer",
    "normalize_vote_key",
    "strip_answer_label",
    "token_f1",
    "vote_overlap",
    "vote_tokens",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
# HotpotQA's script refuses partial credit when either side is one of these: "no" must not earn
# token overlap with "no, it is not".
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})
# Words that name nothing by themselves: a shared "of" does not make two answers one.
FUNCTION_WORDS = frozenset(
    "a an and are as at be but by can could did do does for from had has have he her his how i if in is it its "
    "me my no not of on or our she so than that the their them then there these they this those to us was we "
    "were what when where which while who whom whose why will with would yes you your".split()
)
# Models often prefix their final line ("Answer: Paris", "**Final answer:** Paris"); the prefix
# must not split votes for the same answer.
# The emphasis around a label goes with it: "**Final answer:** Paris" is "Paris". (Matched at a
# position, not anchored by "^": several labels are read off in turn.)
_LABEL_EMPHASIS = " \t\n*_"
_ANSWER_PREFIX = re.compile(rf"\W*(?:final\s+)?answer\W*?:[{re.escape(_LABEL_EMPHASIS)}]*", re.IGNORECASE)
# Punctuation that is part of a number: a decimal point, a ratio, a time, a range, a sign ("3.5",
# "1/2", "9:30", "1914-1918", "-5", ".5", "-.5"), and the mark of an exponent ("10^6", "10^-6"). A
# thousands separator is not: "3,000" is "3000".
_NUMBER_PUNCTUATION = re.compile(r"(?<=\d)[-.,/:](?=\d)|(?<!\w)[-.](?=\d)|(?<!\w)-(?=\.\d)|\^(?=[-+]?\d)")
# A "#" after a letter is part of a name ("C#", "F#", "A# minor"); before a word it is a number sign
# or markup ("#1" is "1", "Room #5" is "Room 5", "# Paris" a Markdown heading). ("+" is a symbol,
# kept anyway: "C++" is not "C". "%" goes: "5%", "5 %" and "5" answer a percentage question alike.)
_ATTACHED_SHARP = re.compile(r"(?<=[^\W\d_])#+")
# A digit-group separator: "1,000" is "1000", and so is an Indian "1,00,000" (groups of two before the
# last three; at most four, as in a lakh crore: unbounded, each comma of a long "12,34,…" read on to its
# end, quadratic). The entity keys of the information-state graph drop it too.
THOUSANDS = re.compile(r"(?<=\d),(?=(?:\d\d,){0,4}\d{3}(?!\d))")
# A range is written with spaces around its dash too ("1914 – 1918"): one answer with "1914–1918",
# whose votes the spaces split (the spaced dash was a separator, "1914 1918"). A dash with a space
# before it and none after is not read so: "5 -3" and "10 -20 °C" may be two numbers, the second
# negative; one followed by a space is no minus sign ("1914- 1918").
_SPACED_RANGE = re.compile(r"(?<=\d)\s*-\s+(?=\d)")
# Periods and apostrophes shorten a word ("U.S.", "Ender’s"): they go. Other punctuation separates
# words ("Paris,France"): it becomes a space.
_WORD_INNER = frozenset(".'\u2019\u02bc")
# A hyphen with a letter on one side and a letter or digit on the other joins one word, written
# either way ("Spider-Man" and "Spiderman", "B-52" and "B52", as the scorer has them): it goes too.
# (NFKC makes a non-breaking hyphen U+2010.) Between digits it is a range: "1914-1918" stays.
_WORD_HYPHEN = re.compile(r"(?<=[^\W_])[-\u2010](?=[^\W\d_])|(?<=[^\W\d_])[-\u2010](?=[^\W_])")
# NFKC makes superscript digits plain, and an exponent another number ("10⁶" would be "106"): they
# are marked as one is typed ("10^6", "10⁻⁶" is "10^-6"). Subscript digits stay plain: "H₂O" is "H2O".
_EXPONENT = re.compile("[⁺⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+")
# Chinese, Japanese and Korean characters (Han, kana, Hangul, their radicals and compatibility
# forms): text in them has no spaces between words, so the vote key, the search index, the visit
# excerpts and the information-state graph each read such text by its characters.
CJK_CHARS = (
    "[\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f]"
)
_CJK = re.compile(CJK_CHARS)


def normalize_answer(text: str | None) -> str:
    """Normalise an answer the way the SQuAD and HotpotQA scripts do.

    Args:
        text: Raw answer text; ``None`` counts as empty.

    Returns:
        Lowercased text without punctuation, without the articles a/an/the, with single spaces.

    Example:
        >>> normalize_answer("The  Eiffel-Tower!")
        'eiffeltower'
        >>> normalize_answer("An Apple a day")
        'apple day'
    """
    if not text:
        return ""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def is_dash(ch: str) -> bool:
    """Whether ``ch`` is a dash: a hyphen, an en or em dash, a wave dash, a minus sign (any of them is
    one character in a key: "1914–1918" is "1914-1918").

    Example:
        >>> [is_dash(ch) for ch in "-\u2013\u301c\u2212a"]
        [True, True, True, True, False]
    """
    return ch == "\u2212" or unicodedata.category(ch) == "Pd"


def _dropped(ch: str) -> bool:
    # Unicode punctuation, and modifier symbols such as the backticks of "`Paris`"; other symbols carry
    # meaning ("C++", "$5").
    return (category := unicodedata.category(ch))[0] == "P" or category == "Sk"


def _folded(text: str) -> str:
    """NFKC-normalised, casefolded text without format characters, superscript digits marked as an
    exponent (``^6``)."""
    # Format characters (category Cf: a zero-width space, a soft hyphen, a direction mark) are
    # invisible: "Paris" and "Paris\u200b" are one answer.
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    marked = _EXPONENT.sub(lambda m: "^" + m[0], visible)
    # NFKC unifies full-width and composed forms ("ＡＢＣ" is "ABC"; "u" + diaeresis is "ü").
    return unicodedata.normalize("NFKC", marked).casefold()


def _without_latin_accents(text: str) -> str:
    """``text`` without the combining marks on Latin letters ("zürich" is "zurich")."""
    # Trajectories write one name with and without its accents ("Zürich", "Zurich"), which split its
    # votes (the corpus search folds them too). Marks on other scripts stay: a Devanagari vowel sign
    # or a kana's voicing mark makes another word ("が" is not "か").
    if text.isascii():  # most answers: nothing to fold, and no character's name to look up
        return text
    kept, latin = [], False
    for ch in unicodedata.normalize("NFD", text):
        if unicodedata.category(ch) != "Mn":
            latin = unicodedata.name(ch, "").startswith("LATIN ")
        elif latin:
            continue
        kept.append(ch)
    return unicodedata.normalize("NFC", "".join(kept))


def _is_article(word: str) -> bool:
    # An article is a word between spaces, whatever punctuation surrounds it ("“The"); one joined to
    # another word is part of a name ("A-ha", "A&M", "The A-Team"), and so is "A#" (a key, not "a").
    if _ATTACHED_SHARP.search(word):
        return False
    return _ARTICLES.fullmatch(word.strip("".join(ch for ch in word if _dropped(ch)))) is not None


def _vote_text(text: str) -> str:
    """Folded text without its punctuation except inside numbers and a "#" after a letter, single-spaced."""
    text = _WORD_HYPHEN.sub("", text)
    text = THOUSANDS.sub("", _SPACED_RANGE.sub("-", "".join("-" if is_dash(ch) else ch for ch in text)))
    kept = {i for rule in (_NUMBER_PUNCTUATION, _ATTACHED_SHARP) for m in rule.finditer(text) for i in range(*m.span())}
    chars = (("" if ch in _WORD_INNER else " ") if i not in kept and _dropped(ch) else ch for i, ch in enumerate(text))
    return " ".join("".join(chars).split())


def normalize_vote_key(answer: str | None) -> str:
    """Key under which majority voting groups equivalent answers.

    Unlike :func:`normalize_answer` (scoring), the key keeps the punctuation that makes a number ("3.5"
    is not "35", "-5" is not "5", every dash is ``-``, "1914 – 1918" is "1914-1918") and treats all of
    Unicode alike: the text is NFKC-normalised and casefolded (superscript digits are an exponent: "10⁶"
    is ``10^6``, not "106"), Latin letters lose their accents ("Zürich" is "zurich"; other scripts keep
    their marks), and its punctuation (any category ``P*``, and modifier symbols such as a backtick)
    goes: periods, apostrophes and the hyphens inside a word are deleted ("U.S." is "US", "Spider-Man"
    is "Spiderman", "B-52" is "B52"), the rest become spaces ("Paris,France" is "Paris France"), except
    a "#" after a letter ("C#" is not "C"; "#1" is "1"). Format characters such as a zero-width space
    are deleted. A leading ``answer:`` / ``final answer:`` label goes too, and so do the articles
    a/an/the that stand as words of their own ("The A-Team" is "ateam", not "team").

    Args:
        answer: A trajectory's final answer; ``None`` gives ``""``.

    Returns:
        The normalised key; equal keys mean the same vote.

    Example:
        >>> normalize_vote_key("Answer: Paris.")
        'paris'
        >>> normalize_vote_key("**Final answer:** the Paris") == normalize_vote_key("paris")
        True
        >>> normalize_vote_key("A."), normalize_vote_key("...")
        ('a', '')
        >>> normalize_vote_key("3.5"), normalize_vote_key("−5"), normalize_vote_key("1914 – 1918")
        ('3.5', '-5', '1914-1918')
        >>> normalize_vote_key("“Ender’s Game”") == normalize_vote_key("Enders game"), normalize_vote_key("北京。")
        (True, '北京')
        >>> normalize_vote_key("Spider-Man"), normalize_vote_key("The A-Team"), normalize_vote_key("10⁶")
        ('spiderman', 'ateam', '10^6')
        >>> normalize_vote_key("C#"), normalize_vote_key("-.5"), normalize_vote_key("Paris\\u200b")
        ('c#', '-.5', 'paris')
        >>> normalize_vote_key("Zürich"), normalize_vote_key("が") == normalize_vote_key("か")
        ('zurich', False)
    """
    text = _folded(strip_answer_label(answer))
    # The articles go before punctuation becomes spaces, which would free the "a" of "A&M". An answer
    # that is only an article ("A", a multiple-choice letter) is still an answer: it votes under its
    # own words.
    # The accents go after the articles are read: gone before, "à" and "Å" were the article "a"
    # ("Å, Lofoten" voted as "Lofoten", "The Å" apart from "Å").
    kept = " ".join(w for w in text.split() if not _is_article(w))
    return _vote_text(_without_latin_accents(kept)) or _vote_text(_without_latin_accents(text))


def vote_tokens(answer: str | None) -> list[str]:
    """The words of an answer's :func:`normalize_vote_key`; in CJK text every character is a word.

    Example:
        >>> vote_tokens("The Eiffel Tower"), vote_tokens("北京市")
        (['eiffel', 'tower'], ['北', '京', '市'])
    """
    return _CJK.sub(r" \g<0> ", normalize_vote_key(answer)).split()


def _nfkc_by_character(text: str) -> tuple[str, list[int]]:
    """The text NFKC-normalised character by character, and where each character's form ends in it.

    The key is NFKC-folded, so a label is found as NFKC writes it ("Answer：" with a full-width colon
    is "Answer:"); the shown answer keeps its own characters ("10⁶" is not "106"), so a label's end
    must map back to the original text. (Character by character differs from whole-string NFKC only
    where marks combine, which no label holds.)
    """
    ends, forms, length = [], [], 0
    for ch in text:
        forms.append(form := unicodedata.normalize("NFKC", ch))
        length += len(form)
        ends.append(length)
    return "".join(forms), ends


def strip_answer_label(answer: str | None) -> str:
    """The answer without leading ``answer:`` / ``final answer:`` labels, stripped (``None`` gives ``""``).

    Labels are found as NFKC reads them (a full-width colon is a colon), however many there are: the
    vote key is made of what is left, so the shown answer and its key must agree.

    Example:
        >>> strip_answer_label("  Final answer: Paris "), strip_answer_label("**Final answer:** Paris")
        ('Paris', 'Paris')
        >>> strip_answer_label("Answer： Paris"), strip_answer_label("Answer: Answer: 10⁶")
        ('Paris', '10⁶')
    """
    text = (answer or "").strip()
    folded, ends = _nfkc_by_character(text)
    end = 0
    # Labels are read off the folded text in one pass: a pass over the whole answer per label would
    # be quadratic in an answer of many labels.
    while label := _ANSWER_PREFIX.match(folded, end):
        end = label.end()
    if not end:
        return text
    # The first character whose form reaches the labels' end is the last one they take.
    return text[bisect.bisect_left(ends, end) + 1 :].strip(_LABEL_EMPHASIS)


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str | None, gold: str | None) -> float:
    """Token-level F1 of two answers after :func:`normalize_answer`, with HotpotQA's yes/no rule.

    If either normalised side is ``yes``, ``no`` or ``noanswer`` and the two differ, F1 is 0.

    Example:
        >>> round(token_f1("Stanley Hall the psychologist", "G. Stanley Hall"), 3)
        0.667
        >>> token_f1("no it is not", "no")
        0.0
    """
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if pred_norm != gold_norm and (pred_norm in _SPECIAL_ANSWERS or gold_norm in _SPECIAL_ANSWERS):
        return 0.0
    return _f1(pred_norm.split(), gold_norm.split())


def vote_overlap(answer: str | None, candidate: str | None) -> float:
    """Token F1 of two answers' :func:`vote_tokens`, without the yes/no rule: how closely they match.

    Example:
        >>> round(vote_overlap("北京市", "北京"), 2), vote_overlap("no it is not", "no")
        (0.8, 0.4)
    """
    return _f1(vote_tokens(answer), vote_tokens(candidate))
