"""Answer and retrieval metrics in the SQuAD / HotpotQA style.

Normalisation follows the official HotpotQA evaluation script (lowercase, drop punctuation, drop the
articles a/an/the, collapse whitespace), so numbers are comparable with published results.
Every answer metric takes the gold answer and its aliases and scores the best match among them.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

__all__ = [
    "contains_gold",
    "exact_match",
    "f1_score",
    "normalize_answer",
    "normalize_vote_key",
    "retrieval_recall",
    "score_answer",
]

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
    """
    if not answer:
        return ""
    return normalize_answer(_ANSWER_PREFIX.sub("", answer.strip(), count=1))


def _gold_list(answers: str | Iterable[str]) -> list[str]:
    # A bare string is one answer; iterating it would score against single characters.
    golds = [answers] if isinstance(answers, str) else list(answers)
    if not golds:
        raise ValueError("answers is empty: pass the gold answer and its aliases, e.g. ['Paris']")
    return golds


def _f1_single(prediction: str, gold: str) -> float:
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if pred_norm != gold_norm and (pred_norm in _SPECIAL_ANSWERS or gold_norm in _SPECIAL_ANSWERS):
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str | None, answers: str | Iterable[str]) -> float:
    """Normalised exact match against the best alias.

    Args:
        prediction: The predicted answer; ``None`` or empty scores 0.
        answers: The gold answer and its aliases (a single string is one answer).

    Returns:
        1.0 when the normalised prediction equals some normalised gold answer, else 0.0.

    Raises:
        ValueError: ``answers`` is empty.

    Example:
        >>> exact_match("the Stanley Hall", ["G. Stanley Hall", "Stanley Hall"])
        1.0
        >>> exact_match(None, ["Paris"])
        0.0
    """
    golds = _gold_list(answers)
    pred_norm = normalize_answer(prediction)
    if not pred_norm:
        return 0.0
    return float(any(pred_norm == normalize_answer(gold) for gold in golds))


def f1_score(prediction: str | None, answers: str | Iterable[str]) -> float:
    """Token-level F1 against the best alias, with HotpotQA's yes/no/noanswer rule.

    If either normalised side is ``yes``, ``no`` or ``noanswer`` and the two differ, F1 is 0.

    Args:
        prediction: The predicted answer; ``None`` or empty scores 0.
        answers: The gold answer and its aliases (a single string is one answer).

    Returns:
        The maximum token F1 over ``answers``, in [0, 1].

    Raises:
        ValueError: ``answers`` is empty.

    Example:
        >>> round(f1_score("Stanley Hall the psychologist", ["G. Stanley Hall"]), 3)
        0.667
        >>> f1_score("no it is not", ["no"])
        0.0
    """
    golds = _gold_list(answers)
    if not normalize_answer(prediction):
        return 0.0
    return max(_f1_single(prediction, gold) for gold in golds)


def contains_gold(prediction: str | None, answers: str | Iterable[str]) -> float:
    """Whether some normalised gold answer appears in the normalised prediction as whole words.

    Lenient metric for verbose answers: "He was born in 1990." contains "1990"; "19900" does not.

    Args:
        prediction: The predicted answer; ``None`` or empty scores 0.
        answers: The gold answer and its aliases (a single string is one answer).

    Returns:
        1.0 if any gold answer occurs on word boundaries, else 0.0.

    Raises:
        ValueError: ``answers`` is empty.

    Example:
        >>> contains_gold("He was born in 1990.", ["1990"])
        1.0
        >>> contains_gold("19900 people", ["1990"])
        0.0
    """
    golds = _gold_list(answers)
    pred_norm = normalize_answer(prediction)
    if not pred_norm:
        return 0.0
    # Normalised text has single spaces and no punctuation, so padding with spaces turns a
    # substring test into a whole-word test.
    padded = f" {pred_norm} "
    for gold in golds:
        gold_norm = normalize_answer(gold)
        if gold_norm and f" {gold_norm} " in padded:
            return 1.0
    return 0.0


def retrieval_recall(opened_doc_ids: Iterable[str], supporting_doc_ids: Iterable[str]) -> float:
    """Fraction of the supporting documents among the documents the agent opened.

    Args:
        opened_doc_ids: Ids of the documents the agent read (duplicates and order do not matter).
        supporting_doc_ids: Ids of the documents that hold the answer.

    Returns:
        ``|opened ∩ supporting| / |supporting|``.

    Raises:
        ValueError: ``supporting_doc_ids`` is empty, so recall is undefined.

    Example:
        >>> retrieval_recall(["d1", "d7", "d1"], ["d1", "d2"])
        0.5
    """
    supporting = set(supporting_doc_ids)
    if not supporting:
        raise ValueError("supporting_doc_ids is empty: recall is undefined without gold documents")
    return len(supporting & set(opened_doc_ids)) / len(supporting)


def score_answer(prediction: str | None, answers: str | Iterable[str]) -> dict[str, float]:
    """All answer metrics at once.

    Args:
        prediction: The predicted answer; ``None`` or empty scores 0 everywhere.
        answers: The gold answer and its aliases (a single string is one answer).

    Returns:
        ``{"em": ..., "f1": ..., "contains": ...}``, each in [0, 1].

    Raises:
        ValueError: ``answers`` is empty.

    Example:
        >>> score_answer("Latin.", ["Latin"])
        {'em': 1.0, 'f1': 1.0, 'contains': 1.0}
    """
    golds = _gold_list(answers)
    return {
        "em": exact_match(prediction, golds),
        "f1": f1_score(prediction, golds),
        "contains": contains_gold(prediction, golds),
    }
