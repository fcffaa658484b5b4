"""Offline evaluation: dev-set loading, answer and retrieval metrics, bootstrap CIs, LLM judge.

Example:
    >>> from langgraph_parallelmuse.eval import score_answer, bootstrap_ci
    >>> score_answer("Latin", ["Latin"])["em"]
    1.0
"""

from langgraph_parallelmuse.eval.datasets import (
    EVAL_DATA_ENV,
    EvalDataError,
    QAItem,
    eval_data_dir,
    load_questions,
)
from langgraph_parallelmuse.eval.judge import JUDGE_PROMPT, JudgeError, llm_judge, parse_judgement
from langgraph_parallelmuse.eval.scoring import (
    contains_gold,
    exact_match,
    f1_score,
    normalize_answer,
    normalize_vote_key,
    retrieval_recall,
    score_answer,
)
from langgraph_parallelmuse.eval.stats import (
    bootstrap_ci,
    bootstrap_ratio,
    format_diff,
    paired_bootstrap_diff,
    within_noise,
)

__all__ = [
    "EVAL_DATA_ENV",
    "JUDGE_PROMPT",
    "EvalDataError",
    "JudgeError",
    "QAItem",
    "bootstrap_ci",
    "bootstrap_ratio",
    "contains_gold",
    "eval_data_dir",
    "exact_match",
    "f1_score",
    "format_diff",
    "llm_judge",
    "load_questions",
    "normalize_answer",
    "normalize_vote_key",
    "paired_bootstrap_diff",
    "parse_judgement",
    "retrieval_recall",
    "score_answer",
    "within_noise",
]
