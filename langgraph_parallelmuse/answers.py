"""Answer normalisation shared by aggregation and evaluation (the core never imports ``eval``).

Normalisation follows the official HotpotQA evaluation script (lowercase, drop punctuation, drop the
articles a/an/the, collapse whitespace): majority voting groups answers by it, the guided
aggregator snaps its pick to a candidate by its token F1, and the benchmarks score with it.
"""

from __future__ import annotations

import re
import string
from collections import Counter

__all__ = ["normalize_answer", "normalize_vote_key", "strip_answer_label", "token_f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
# HotpotQA's script refuses partial credit when either side is one of these: "no" must not earn
# token overlap with "no, it is not".
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})
# Models often prefix their final line ("Answer: Paris", "**Final answer:** Paris"); the prefix
# must not split votes for the same answer.
_ANSWER_PREFIX = re.compile(r"^\W*(?:final\s+)?answer\W*?:", re.IGNORECASE)


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


def normalize_vote_key(answer: str | None) -> str:
    """Key under which majority voting groups equivalent answers.

    Same normalisation as :func:`normalize_answer`, after removing a leading ``answer:`` /
    ``final answer:`` label; a trailing period goes with the rest of the punctuation.

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
    """
    text = strip_answer_label(answer)
    # An answer that is only an article or punctuation after normalising ("A", a multiple-choice
    # letter) is still an answer: it votes under its lowercased words.
    return normalize_answer(text) or " ".join(text.lower().strip(string.punctuation + " ").split())


def strip_answer_label(answer: str | None) -> str:
    """The answer without a leading ``answer:`` / ``final answer:`` label, stripped (``None`` gives ``""``).

    Example:
        >>> strip_answer_label("  Final answer: Paris "), strip_answer_label("**Final answer:** Paris")
        ('Paris', 'Paris')
    """
    if not answer:
        return ""
    text = answer.strip()
    if (label := _ANSWER_PREFIX.match(text)) is None:
        return text
    # The emphasis around a label goes with it: "**Final answer:** Paris" is "Paris".
    return text[label.end() :].strip(" \t\n*_")


def token_f1(prediction: str | None, gold: str | None, *, yes_no_rule: bool = True) -> float:
    """Token-level F1 of two answers after :func:`normalize_answer`, with HotpotQA's yes/no rule.

    If either normalised side is ``yes``, ``no`` or ``noanswer`` and the two differ, F1 is 0
    (scoring; ``yes_no_rule=False`` measures plain overlap, for matching an answer to candidates).

    Example:
        >>> round(token_f1("Stanley Hall the psychologist", "G. Stanley Hall"), 3)
        0.667
        >>> token_f1("no it is not", "no"), token_f1("no it is not", "no", yes_no_rule=False)
        (0.0, 0.4)
    """
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    special = pred_norm in _SPECIAL_ANSWERS or gold_norm in _SPECIAL_ANSWERS
    if yes_no_rule and pred_norm != gold_norm and special:
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)
