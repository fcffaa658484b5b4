"""Answer and retrieval metrics in the SQuAD / HotpotQA style.

Normalisation (:mod:`langgraph_parallelmuse.answers`) follows the official HotpotQA evaluation
script, so numbers are comparable with published results.
Every answer metric takes the gold answer and its aliases and scores the best match among them.
MuSiQue is scored by the same rules: its official script normalises alike and also takes the best
alias, but has no yes/no rule, so there "No, NO" against the alias "no" of Norway earns F1 0.67
where :func:`f1_score` gives 0 (no MuSiQue gold of the dev sets is yes or no otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable

from langgraph_parallelmuse.answers import normalize_answer, normalize_vote_key, token_f1

# Golds that "contains" credits only as the whole answer (see contains_gold).
_YES_NO = frozenset({"yes", "no"})
_SHORT_ALIAS = 2  # characters

__all__ = [
    "contains_gold",
    "exact_match",
    "f1_score",
    "normalize_answer",
    "normalize_vote_key",
    "retrieval_recall",
    "score_answer",
]


def _gold_list(answers: str | Iterable[str]) -> list[str]:
    # A bare string is one answer; iterating it would score against single characters.
    golds = [answers] if isinstance(answers, str) else list(answers)
    if not golds:
        raise ValueError("answers is empty: pass the gold answer and its aliases, e.g. ['Paris']")
    return golds


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
    return max(token_f1(prediction, gold) for gold in golds)


def contains_gold(prediction: str | None, answers: str | Iterable[str]) -> float:
    """Whether some normalised gold answer appears in the normalised prediction as whole words.

    Lenient metric for verbose answers: "He was born in 1990." contains "1990"; "19900" does not.
    Two kinds of gold count only as the whole answer, since as words they occur in any sentence:
    ``yes`` / ``no`` (HotpotQA's yes/no rule: "Yes, there is no doubt" is not "no"), and an alias
    of at most two characters beside a longer form of the same answer (MuSiQue's "it" for Italy,
    "no" for Norway). A short gold that is the only form ("4", "The WB") is still found in a sentence.

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
        >>> contains_gold("It is Greece", ["Italy", "it"]), contains_gold("It", ["Italy", "it"])
        (0.0, 1.0)
    """
    pred_norm = normalize_answer(prediction)
    golds = [g for g in (normalize_answer(gold) for gold in _gold_list(answers)) if g]
    if not pred_norm or not golds:
        return 0.0
    longest = max(len(g) for g in golds)
    # Normalised text has single spaces and no punctuation, so padding with spaces turns a
    # substring test into a whole-word test.
    padded = f" {pred_norm} "
    for gold in golds:
        whole_only = gold in _YES_NO or len(gold) <= _SHORT_ALIAS < longest
        if pred_norm == gold if whole_only else f" {gold} " in padded:
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
