"""LLM-as-judge answer equivalence, with the grading prompt of BrowseComp (Wei et al., 2025).

String metrics under-count correct answers phrased differently ("the 1990s" vs "1990s decade");
a judge model catches those. The prompt is the one the BrowseComp benchmark uses so judged
accuracy is comparable with the ParallelMuse paper's numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage

from langgraph_parallelmuse.errors import ParallelMuseError
from langgraph_parallelmuse.redact import redact, secrets_of
from langgraph_parallelmuse.retry import is_transient

__all__ = ["JUDGE_PROMPT", "JudgeError", "llm_judge", "parse_judgement"]


class JudgeError(ParallelMuseError):
    """The judge's server failed; the message is redacted (a server may echo the API key).

    Attributes:
        unreachable: The server could not be reached or answered with an outage (a timeout, a
            refused connection, 429, a 5xx), as opposed to refusing this one prompt.
    """

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


JUDGE_PROMPT = """\
Judge whether the following [response] to [question] is correct or not based on the precise and \
unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted \
answer as 'None' if there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on \
[correct_answer], focusing only on if there are meaningful differences between [correct_answer] \
and the extracted_final_answer. Do not comment on any background to the problem, do not attempt \
to solve the problem, do not argue for any answer different than [correct_answer], focus only on \
whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is \
within a small margin of error for numerical problems. Answer 'no' otherwise, i.e. if there is \
any inconsistency, ambiguity, non-equivalency, or if the extracted answer is incorrect.

confidence: The extracted answer between 0% and 100% from [response]. Put 100 if there is no \
confidence score available."""

# Reasoning models put their scratchpad first; a "correct: no" drafted there is not the verdict. R1-style
# chat templates put the opening tag in the prompt, so a reply may hold only the closing one.
_THINK_END = re.compile(r"<\s*/\s*think\s*>", re.IGNORECASE)
_THINK_START = re.compile(r"<\s*think\s*>", re.IGNORECASE)
# The line form is anchored to a line start so "the answer is correct, no doubt" inside the reasoning
# is ignored; \W* absorbs markdown such as "**correct:** yes" or "- Correct: Yes.", and the separator
# may be a full-width colon ("correct：yes") or, when the verdict ends the line or a clause, a dash
# ("Correct - yes", "Correct — Yes, both name Paris"; "Correct — no meaningful difference" is a
# comment). A quoted key is a JSON reply ({"correct": "yes"} or true), read wherever it stands.
# The line form's leading marks stop at the line's end: read on across lines (newlines are \W), from
# each line start they ran to the reply's end, and a reply of 100,000 blank lines took 169 s. The marks
# between "correct" and its separator hold no separator: a lazy \W*? there tried every separator of a
# run as the one, and "correct" before 20,000 dashes or colons (a looping reply) took 8 s.
_VERDICT = re.compile(
    r"""^[^\w\n]*correct(?:[^\S\n]*\(yes/no\))?[^\w:：=]*[:：=]\W*(yes|no|true|false)\b"""
    r"""|^[^\w\n]*correct[^\w\-–—]*[-–—]\W*(yes|no|true|false)\b(?=\W*$|\s*[,.;:!(])"""
    r"""|["']correct["']\s*:\W*(yes|no|true|false)\b""",
    re.IGNORECASE | re.MULTILINE,
)
# Failing a verdict line, a reply that opens with its verdict: yes/no, or the grader words correct /
# incorrect ("INCORRECT", "Incorrect, because the years differ"), which went unreadable and left the
# judged accuracy to the other questions. Only as a clause of their own: "Correct answer: Rome", the
# key "Correct: Paris", a looping "correct-------" and "correct" over a "no" line are no verdict. Its
# markdown emphasis ("**Correct**") is taken whole: tried piece by piece, a run of it took quadratic time.
# A yes/no right after the word ("Correct, no", "Correct.\nno") or after the line's first colon
# leaves the reply unread: taken as the word, a "no" scored as correct. (The template's field echoed,
# "Correct (yes/no): no", is a verdict line: _VERDICT reads it.) Nor is a run of dashes to the end
# (a looping reply cut at its token limit).
_BARE_VERDICT = re.compile(
    r"^\W*(?:(yes|no)\b|(correct|incorrect)"
    r"(?=[*_]*+(?!\W*(?:yes|no)\b|[^\n:]*+:[^\S\n]*+(?:yes|no)\b)"
    r"(?:[^\w:\-–—]*\Z|\s*[,.;!(]|\s*[-–—](?![-–—])|\s+because\b|[^\S\n]*\n(?!\W*(?:yes|no)\b))))",
    re.IGNORECASE,
)


def parse_judgement(text: str) -> bool | None:
    """Read the verdict out of a judge reply.

    Only the text after the last ``</think>`` counts (a reasoning model's draft verdicts come before
    it); a reply that opens a ``<think>`` it never closes was cut off mid-reasoning and holds no
    verdict (a ``<think>`` the reply only mentions after its verdict does not count). Of the
    rest, the last ``correct: yes|no`` line (or ``"correct": "yes"`` JSON field) is the verdict;
    failing that, a reply that starts with yes or no, or with correct or incorrect as a clause of its own.

    Args:
        text: The judge model's reply.

    Returns:
        ``True`` for yes, ``False`` for no, ``None`` when no verdict can be found.

    Example:
        >>> parse_judgement("reasoning: both name the same city\\n**correct:** Yes")
        True
        >>> parse_judgement('{"extracted_final_answer": "Paris", "correct": "no"}')
        False
        >>> parse_judgement("correct: no, wait, they match\\n</think>\\ncorrect - yes")
        True
        >>> parse_judgement("No, they differ.")
        False
        >>> parse_judgement("INCORRECT, because the years differ"), parse_judgement("Correct answer: Rome") is None
        (False, True)
        >>> parse_judgement("<think>correct: no... but then") is None
        True
        >>> parse_judgement("correct: yes\\n\\nCorrect - no caveats.")
        True
        >>> parse_judgement("I cannot tell.") is None
        True
    """
    text = _THINK_END.split(text)[-1]
    if _THINK_START.match(text.lstrip()):
        return None
    verdicts = [next(word for word in found if word) for found in _VERDICT.findall(text)]
    if verdicts:
        return verdicts[-1].lower() in ("yes", "true")
    bare = _BARE_VERDICT.match(text)
    if bare:
        return (bare.group(1) or bare.group(2)).lower() in ("yes", "correct")
    return None


def _format_gold(gold: str | Sequence[str]) -> str:
    golds = [gold] if isinstance(gold, str) else list(gold)
    if wrong := [g for g in golds if not isinstance(g, str)]:
        raise ValueError(f"gold holds {wrong[0]!r}: pass the gold answer (and its aliases) as strings")
    # A blank gold was sent: the judge compared the response with nothing and its verdict was scored.
    kept = [g for g in golds if g.strip()]
    if not kept:
        raise ValueError("gold is empty or blank: pass the gold answer (and optionally its aliases)")
    first, *aliases = kept
    return f"{first} (also accepted: {'; '.join(aliases)})" if aliases else first


async def llm_judge(
    model: BaseChatModel,
    question: str,
    prediction: str | None,
    gold: str | Sequence[str],
) -> bool | None:
    """Ask a chat model whether ``prediction`` is equivalent to the gold answer.

    Args:
        model: Any LangChain chat model; a deterministic (temperature 0) judge is advisable.
        question: The question that was asked.
        prediction: The system's answer; ``None`` or blank is judged incorrect without a model call.
        gold: The gold answer, or the gold answer followed by its aliases.

    Returns:
        ``True`` if the judge says the answers match, ``False`` if not, ``None`` when its reply
        holds no readable verdict.

    Raises:
        ValueError: ``gold`` is empty or blank, or holds something other than strings.
        JudgeError: The judge model's call failed (after its client's own retries).

    Example:
        >>> import asyncio
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> judge = FakeListChatModel(responses=["reasoning: same city\\ncorrect: yes"])
        >>> asyncio.run(llm_judge(judge, "Capital of France?", "It is Paris.", ["Paris"]))
        True
    """
    correct_answer = _format_gold(gold)
    if prediction is None or not prediction.strip():
        return False
    prompt = JUDGE_PROMPT.format(question=question, response=prediction, correct_answer=correct_answer)
    try:
        reply = await model.ainvoke([HumanMessage(content=prompt)])
    except Exception as exc:  # noqa: BLE001 - its message may hold the key a server echoed
        said = redact(f"the LLM judge failed: {type(exc).__name__}: {exc}", secrets_of(model))
        raise JudgeError(said, unreachable=is_transient(exc)) from None
    return parse_judgement(reply.text)
