"""Step drivers: how one think step of the agent is generated.

Both drivers produce the same protocol text, so trajectories, forks, scoring and reports are
identical downstream. ``FreeDriver`` lets the model write the whole turn (strong models, any
backend). ``GuidedDriver`` is the local path for small models (SmolLM2-135M wrote 0 of 30
well-formed trajectories from few-shot examples alone, 30 of 30 guided): the driver writes the
tags and the fixed JSON, and the model writes the thought, the query or document title, and the
answer; a schedule decides when to answer (a small model's own "search or answer" choice was
all-or-nothing), and the answer is generated from the collected evidence in the plainest prompt
the model handles.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.protocol import quote_untrusted, render_tool_call
from langgraph_parallelmuse.segments import Gen, Lit
from langgraph_parallelmuse.state import Action, Observation, Step

_RESULT_MARKUP = re.compile(r"^\[\d+\] | \(id: [^)]*\)$", re.MULTILINE)
EVIDENCE_SYSTEM = "Answer the question using the context. Reply with a short phrase only."
QUERY_SYSTEM = "Write a short web search query for the question."
# The guided prompts' own lines: a page line that starts like one is quoted, so evidence cannot
# pose as the question or as an instruction after it.
PROMPT_LINES = ("Question:", "Answer", "Already searched:", "Write a new search query")


@dataclass(frozen=True)
class StepContext:
    """What a driver needs to plan step ``index`` of a trajectory."""

    question: str
    steps: Sequence[Step]
    observations: Sequence[Observation]
    index: int
    final: bool  # this step must answer (last turn, or context exhausted)
    max_step_tokens: int
    tool_names: frozenset[str] = field(default_factory=frozenset)
    # Tool calls this step must not repeat: the parent's and siblings' at a fork (diverse_branches).
    avoid: frozenset[str] = field(default_factory=frozenset)


def _ngrams(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def call_key(action: Action) -> str:
    """A tool call's identity: the tool and its whitespace- and case-normalised arguments."""
    args = {k: " ".join(str(v).lower().split()) for k, v in (action.get("arguments") or {}).items()}
    return json.dumps([action.get("name"), args], sort_keys=True)


def repeated_call(action: Action, steps: Sequence[Step]) -> bool:
    """True when a tool call repeats an earlier one (same tool, same normalised arguments)."""
    if action.get("type") != "tool_call":
        return False
    key = call_key(action)
    return any(s["action"].get("type") == "tool_call" and call_key(s["action"]) == key for s in steps)


def repeats_sibling(action: Action, ctx: StepContext) -> bool:
    """True when a branch's regenerated tool call repeats its parent's or a sibling's."""
    return action.get("type") == "tool_call" and call_key(action) in ctx.avoid


@dataclass(frozen=True)
class FreeDriver:
    """The model writes each whole turn; the driver only stops it after the action closes.

    Example:
        >>> FreeDriver().plan(StepContext("q", [], [], 0, False, 128))
        [Gen(stop=('</tool_call>', '</answer>'), max_tokens=128, messages=None, name='turn')]
    """

    retries: int = 1  # resamples of a turn that repeats an earlier tool call

    def plan(self, ctx: StepContext) -> list[Lit | Gen]:
        return [Gen(stop=("</tool_call>", "</answer>"), max_tokens=ctx.max_step_tokens, name="turn")]

    def reject(self, ctx: StepContext, text: str, action: Action) -> str | None:
        if repeated_call(action, ctx.steps):
            return "repeats an earlier tool call"
        if repeats_sibling(action, ctx):
            return "repeats the parent's or a sibling's tool call"
        return None


@dataclass(frozen=True)
class GuidedDriver:
    """Prefilled protocol structure for small local models (the embedded default's driver).

    Args:
        schedule: Tool steps before the answer, in order; entries whose tool is missing are
            skipped. The answer comes after the schedule or at the last allowed turn.
        thought_tokens: Bound of a thought (it also stops at a newline).
        argument_tokens: Bound of a query or document title.
        answer_tokens: Bound of the answer phrase.
        evidence_chars: Evidence handed to the answer prompt.
        retries: Resamples of a step whose thought repeats a 4-gram of earlier thoughts, or whose
            query/document repeats an earlier call, or that came out empty.

    Example:
        >>> plan = GuidedDriver().plan(StepContext("q", [], [], 0, False, 128, frozenset({"search"})))
        >>> [type(s).__name__ for s in plan]
        ['Lit', 'Gen', 'Lit', 'Gen', 'Lit']
    """

    schedule: tuple[str, ...] = ("search", "visit", "search")
    thought_tokens: int = 32
    argument_tokens: int = 20
    answer_tokens: int = 40
    evidence_chars: int = 1500
    retries: int = 1

    def next_action(self, ctx: StepContext) -> str:
        plan = [a for a in self.schedule if a in ctx.tool_names]
        if ctx.final or ctx.index >= len(plan):
            return "answer"
        return plan[ctx.index]

    def plan(self, ctx: StepContext) -> list[Lit | Gen]:
        thought = [Lit("<think>"), Gen(stop=("\n", "</think>", "<"), max_tokens=self.thought_tokens, name="thought")]
        action = self.next_action(ctx)
        if action == "answer":
            return thought + [
                Lit("</think>\n<answer>"),
                # A sentence end closes the phrase: the small model tends to go on explaining.
                Gen(
                    stop=("\n", "</answer>", ". "),
                    max_tokens=self.answer_tokens,
                    name="answer",
                    messages=self.evidence_prompt(ctx),
                ),
                Lit("</answer>"),
            ]
        if action == "visit":
            target = self.visit_target(ctx)
            if target is not None:
                return thought + [Lit("</think>\n" + render_tool_call("visit", {"doc": target}))]
            action = "search"  # nothing left to open: search again instead
        head = json.dumps({"name": action, "arguments": {"query": ""}})[:-3]  # up to the opening quote
        return thought + [
            Lit("</think>\n<tool_call>" + head),
            Gen(
                stop=('"', "\n"),
                max_tokens=self.argument_tokens,
                name="argument",
                messages=self.query_prompt(ctx),
            ),
            Lit('"}}</tool_call>'),
        ]

    @staticmethod
    def visit_target(ctx: StepContext) -> str | None:
        """The best-ranked hit of the latest search that is not opened yet.

        A 135M model cannot copy a title or id reliably (it invents them), so the driver opens
        the top unopened hit; the model's exploration decision is its query.
        """
        opened = {d for o in ctx.observations if o["name"] == "visit" for d in o.get("doc_ids", [])}
        for obs in sorted(ctx.observations, key=lambda o: -o["step"]):
            if obs["name"] == "search" and obs.get("doc_ids"):
                return next((d for d in obs["doc_ids"] if d not in opened), None)
        return None

    def evidence(self, ctx: StepContext) -> str:
        """Opened documents first, then search snippets, newest first, up to ``evidence_chars``.

        Only observations that returned documents count: a "No document …" reply is not
        evidence, and a small model would copy it.
        """
        ranked = sorted(ctx.observations, key=lambda o: (o["name"] != "visit", -o["step"]))
        budget, parts = self.evidence_chars, []
        for obs in ranked:
            if obs["error"] or not obs.get("doc_ids") or budget <= 0:
                continue
            # Search-result markup ("[2] Title (id: x)") is for choosing documents; a small model
            # copies it into its answer, so the evidence keeps titles and text only.
            chunk = _RESULT_MARKUP.sub("", obs["content"]).strip()[: max(budget, 0)]
            parts.append(quote_untrusted(chunk, PROMPT_LINES))
            budget -= len(chunk)
        return "\n\n".join(parts)

    def evidence_prompt(self, ctx: StepContext) -> list[BaseMessage]:
        """The plain QA prompt: the evidence, then the question."""
        context = self.evidence(ctx) or "(no evidence found)"
        return [
            SystemMessage(EVIDENCE_SYSTEM),
            HumanMessage(f"{context}\n\nQuestion: {ctx.question}\nAnswer with a short phrase."),
        ]

    def query_prompt(self, ctx: StepContext) -> list[BaseMessage]:
        """The plain search prompt: the question, and from the second search on, what was found.

        Written inside the agent conversation (system prompt, protocol, tool responses), a 135M
        model's queries repeated themselves or drifted off the question: a trajectory saw 0.48 of
        the supporting documents (HotpotQA distractor pool, 4 hits per search); written from
        this prompt, 0.68 (``benchmarks/agent_protocol.py --limit 30``, BENCHMARKS.md).

        Example:
            >>> GuidedDriver().query_prompt(StepContext("Who?", [], [], 0, False, 64))[-1].content
            'Question: Who?'
        """
        context = self.evidence(ctx)
        if not context:
            return [SystemMessage(QUERY_SYSTEM), HumanMessage(f"Question: {ctx.question}")]
        searched = "; ".join(
            str(s["action"]["arguments"].get("query", ""))
            for s in ctx.steps
            if s["action"].get("type") == "tool_call" and s["action"].get("name") == "search"
        )
        return [
            SystemMessage(QUERY_SYSTEM),
            HumanMessage(
                f"{context}\n\nQuestion: {ctx.question}\nAlready searched: {searched}\n"
                "Write a new search query for what is still missing."
            ),
        ]

    def reject(self, ctx: StepContext, text: str, action: Action) -> str | None:
        thought = text.split("</think>", 1)[0].removeprefix("<think>").strip()
        if not thought:
            return "empty thought"
        words = re.findall(r"\w+", thought.lower())
        if len(_ngrams(thought)) < len(words) - 3:
            return "thought repeats itself"
        earlier = set().union(*(_ngrams(s["text"].split("</think>", 1)[0]) for s in ctx.steps)) if ctx.steps else set()
        if _ngrams(thought) & earlier:
            return "thought repeats an earlier thought"
        if action.get("type") == "tool_call" and not any(str(v).strip() for v in action.get("arguments", {}).values()):
            return "empty tool argument"
        if repeated_call(action, ctx.steps):
            return "repeats an earlier tool call"
        # A visit's document is the driver's choice, not the model's: resampling cannot change it.
        if action.get("name") != "visit" and repeats_sibling(action, ctx):
            return "repeats the parent's or a sibling's tool call"
        return None


StepDriver = FreeDriver | GuidedDriver


def pick_driver(model: BaseChatModel, setting: str, guided: GuidedDriver | None = None) -> StepDriver:
    """``auto`` guides models that declare they continue a prefilled turn (``supports_prefill``:
    the in-process model, ``ServerChatModel`` for vLLM/SGLang); ``guided`` requires that.

    Raises:
        ConfigError: ``guided`` for a model that cannot continue a trailing assistant message: it
            would answer the prefilled tags instead of continuing them.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> type(pick_driver(FakeListChatModel(responses=[]), "auto")).__name__
        'FreeDriver'
    """
    prefill = bool(getattr(model, "supports_prefill", False))
    if setting == "guided" and not prefill:
        raise ConfigError(
            f"driver='guided' needs a model that continues a prefilled assistant turn, and {type(model).__name__} "
            "does not declare it: use LocalChatModel, or ServerChatModel for a vLLM/SGLang server (check it with "
            "check_server), or driver='free'"
        )
    if setting == "guided" or (setting == "auto" and prefill):
        return guided or GuidedDriver()
    return FreeDriver()
