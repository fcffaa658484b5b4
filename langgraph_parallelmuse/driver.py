"""Step drivers: how one think step of the agent is generated.

Both drivers produce the same protocol text, so trajectories, forks, scoring and reports are
identical downstream. ``FreeDriver`` lets the model write the whole turn (strong models, any
backend). ``GuidedDriver`` is the local path for small models (SmolLM2-135M wrote 0 of 30
well-formed trajectories from few-shot examples alone, 30 of 30 guided): the driver writes the
tags and the fixed JSON, and the model writes the thoughts and queries and chooses the answer
among the spans of what it read by its own likelihood; how sure that choice is decides whether
it answers or takes another hop from the chosen span (a small model's own "search or answer"
choice, written out, was all-or-nothing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from langgraph_parallelmuse.candidates import answer_kind, answer_type, candidates, compound_parts, follow_up
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.protocol import NO_HITS, SEARCH_HIT, quote_untrusted, render_tool_call
from langgraph_parallelmuse.references import Reference, inner_reference, reference_depth, resolve, resolved_question
from langgraph_parallelmuse.segments import Choose, Gen, Lit, Pick, Segment
from langgraph_parallelmuse.state import Action, Observation, Step

EVIDENCE_SYSTEM = "Answer the question using the context. Reply with a short phrase only."
QUERY_SYSTEM = "Write a short web search query for the question."
# The guided prompts' own lines: a page line that starts like one is quoted, so evidence cannot
# pose as the question or as an instruction after it.
PROMPT_LINES = ("Question:", "Answer", "Already searched:", "Write a new search query")
# Answered among their own options whatever their hops: yes/no and either-or questions.
DIRECT_KINDS = frozenset({"yesno", "choice"})
# Kinds whose answer is no entity a next hop could start from: an unsure pick of one leads no query
# (it is no bridge), so it stays among the last choice's options. A date as a bridge opened a query
# ("19th century ...") and was then left out of the options as a bridge, the gold with it ("… dog
# breeds developed during which century?").
_NOT_ENTITIES = DIRECT_KINDS | {"date", "number"}
# How far back from the evidence budget a cut looks for a space: longer than a word.
_WORD_BACKOFF = 40


def search_hits(content: str, doc_ids: Sequence[str] = ()) -> list[re.Match[str]]:
    """The hit lines (:data:`SEARCH_HIT`) of a search's output that name a document it returned.

    A page's text may hold a line shaped like a hit: when the search's artifact lists the
    ``doc_ids`` it returned, a line naming another id is the page's text, not a hit (without
    ``doc_ids``, every such line counts).

    Example:
        >>> content = "[1] Paris (id: d1)\\n[7] Lyon (id: d666)"
        >>> [m.group(2) for m in search_hits(content, ["d1"])], len(search_hits(content))
        (['d1'], 2)
    """
    hits = SEARCH_HIT.finditer(content)
    return [m for m in hits if not doc_ids or m.group(2).strip() in doc_ids]


def _read(obs: Observation, *, listing: bool) -> bool:
    """Whether a tool call read something (evidence), ``listing`` when the trajectory's tools list
    the documents they return (``doc_ids``: the corpus and Tavily tools).

    Such tools read what they list: a reply of theirs that lists nothing found nothing. A tool of
    the user's own (a plain ``@tool`` that returns text) lists nothing ever: its text is what the
    trajectory read, unless it is an error or a no-hits reply; read by the listing rule, the
    guided driver answered from no evidence at all.
    """
    if obs["error"]:
        return False
    return bool(obs.get("doc_ids")) if listing else not obs["content"].startswith(NO_HITS)


def _without_hit_markup(content: str, hits: Sequence[re.Match[str]]) -> str:
    """``content`` with each of its hit lines reduced to the hit's title."""
    parts, at = [], 0
    for hit in hits:
        parts += [content[at : hit.start()], hit.group(1)]
        at = hit.end()
    return "".join(parts) + content[at:]


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
    scoring: bool = False  # the model scores given continuations: answers can be chosen by likelihood


def _ngrams(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _bridges(ctx: StepContext) -> list[str]:
    """The bridge entities of the trajectory's hops so far, in order."""
    return [s["bridge"] for s in ctx.steps if "bridge" in s]


def _queries(ctx: StepContext) -> list[str]:
    """The search queries of the trajectory so far, in order."""
    return [
        str(s["action"]["arguments"].get("query", ""))
        for s in ctx.steps
        if s["action"].get("type") == "tool_call" and s["action"].get("name") == "search"
    ]


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


def _check_retries(driver: str, retries: int) -> None:
    """Refuse a negative ``retries``: a step would make no attempt at all, and fail with no turn.

    Raises:
        ConfigError: ``retries`` is below 0.
    """
    if retries < 0:
        raise ConfigError(f"{driver}(retries={retries}): a step needs its first attempt; pass 0 for no resamples")


@dataclass(frozen=True)
class FreeDriver:
    """The model writes each whole turn; the driver only stops it after the action closes.

    Example:
        >>> FreeDriver().plan(StepContext("q", [], [], 0, False, 128))
        [Gen(stop=('</tool_call>', '</answer>'), max_tokens=128, messages=None, name='turn')]
    """

    retries: int = 1  # resamples of a turn that repeats an earlier tool call

    def __post_init__(self) -> None:
        _check_retries("FreeDriver", self.retries)

    def plan(self, ctx: StepContext) -> list[Segment]:
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

    A hop is a search and a visit of its best unopened hit. After each hop the model chooses,
    by its likelihood (:class:`~.segments.Choose`), the best candidate answer among the spans of
    what it read (:mod:`~.candidates`): if the choice holds at least ``answer_confidence`` of the
    probability mass of the candidates, or no hop is left, it answers with it; otherwise the
    chosen span is the hop's bridge entity (recorded as ``step["bridge"]``) and the next query
    starts from it, as retrieval-interleaved reasoning (IRCoT) builds each query on the last hop.
    An unsure pick of a yes/no or either-or question (``yes``, or one of the options it names) is
    no entity to go on from: the next search is a plain one, and no bridge is recorded.
    A question that still names an entity it does not give ("the waterfall in *the country where
    the Bubye River is found*", :mod:`~.references`) is not answered before its hops run out: the
    model chooses that entity (the bridge) as the answer to the phrase naming it, and the next
    query is written for the question with the phrase resolved ("the waterfall in Zimbabwe").
    A model that cannot score (no ``supports_scoring``) searches until ``hops`` and then writes the
    answer itself from the evidence.

    A question whose words name entities one inside another ("the state that borders *the state
    where Hello Love's performer lived*") gets a hop more, a search and its visit, for each such
    entity beyond the first (:func:`~.references.reference_depth`), so that its last hop's
    document is opened before it answers; the config's ``max_turns`` still bounds every trajectory.

    Args:
        hops: Most searches before the answer of a question naming at most one entity it does not
            give (the last allowed turn answers in any case).
        turns: Think steps of such a question, its last one answering (default: two per hop).
        answer_confidence: Share of the candidates' probability mass the chosen one needs to
            answer before the hops run out.
        candidate_limit: Most candidates scored per choice.
        thought_tokens: Bound of a thought (it also stops at a newline).
        argument_tokens: Bound of a query.
        answer_tokens: Bound of a written answer phrase (models that cannot score).
        evidence_chars: Evidence handed to the answer and query prompts.
        bridge_from_opened: A phrase's bridge is chosen from the opened documents only (their
            search snippets beside them distract a small model: ``benchmarks/bridge_choice.py``).
        retries: Resamples of a step whose thought repeats a 4-gram of earlier thoughts, or whose
            query/document repeats an earlier call, or that came out empty or unreadable (a query
            whose JSON a tab broke, an answer cut off by its bound).

    Example:
        >>> plan = GuidedDriver().plan(StepContext("q", [], [], 0, False, 128, frozenset({"search"})))
        >>> [type(s).__name__ for s in plan]
        ['Lit', 'Gen', 'Lit', 'Gen', 'Lit']
    """

    hops: int = 3
    turns: int | None = None
    answer_confidence: float = 0.95
    candidate_limit: int = 16
    thought_tokens: int = 32
    argument_tokens: int = 20
    answer_tokens: int = 40
    evidence_chars: int = 1500
    bridge_from_opened: bool = True
    retries: int = 1

    def __post_init__(self) -> None:
        if self.hops < 1:
            raise ConfigError(f"GuidedDriver(hops={self.hops}): a trajectory needs at least one search")
        if self.turns is not None and self.turns < 2:
            raise ConfigError(f"GuidedDriver(turns={self.turns}): a trajectory needs a search and an answer")
        if not 0.0 <= self.answer_confidence <= 1.0:
            raise ConfigError(f"GuidedDriver(answer_confidence={self.answer_confidence}): pass a share in [0, 1]")
        _check_retries("GuidedDriver", self.retries)

    def budget(self, question: str) -> tuple[int, int]:
        """Most searches and think steps for ``question``: a hop more per nested entity beyond the first.

        A question asking for two things, yes/no or one of two options is answered directly
        (:meth:`plan`), so its phrases add no hop.

        Example:
            >>> GuidedDriver().budget("Who is older, Sid Haig or Vic Darchinyan?")
            (3, 6)
            >>> GuidedDriver().budget("How many stores are in the state where Hello Love's performer lived?")
            (4, 8)
        """
        direct = bool(compound_parts(question)) or answer_kind(question) in DIRECT_KINDS
        extra = 0 if direct else max(reference_depth(question) - 1, 0)
        return self.hops + extra, (self.turns or 2 * self.hops) + 2 * extra

    def next_action(self, ctx: StepContext) -> str:
        """``search``, ``visit``, ``answer`` or ``choose`` (answer or search on, by the model's confidence)."""
        searches = sum(s["action"].get("name") == "search" for s in ctx.steps)
        last = ctx.steps[-1]["action"].get("name") if ctx.steps else None
        most_searches, turns = self.budget(ctx.question)
        if ctx.final or ctx.index >= turns - 1 or "search" not in ctx.tool_names:
            return "answer"
        if not ctx.steps:
            return "search"
        if last == "search" and "visit" in ctx.tool_names and self.visit_target(ctx) is not None:
            return "visit"
        if searches >= most_searches:
            return "answer"
        return "choose" if ctx.scoring else "search"

    def plan(self, ctx: StepContext) -> list[Segment]:
        thought = [Lit("<think>"), Gen(stop=("\n", "</think>", "<"), max_tokens=self.thought_tokens, name="thought")]
        action = self.next_action(ctx)
        if action == "visit":
            return thought + [Lit("</think>\n" + render_tool_call("visit", {"doc": self.visit_target(ctx)}))]
        if action == "search":
            return thought + self.search(ctx, bridge=None)
        # A question asking for two things is answered part by part: the first choice is the first part's.
        parts = compound_parts(ctx.question)
        first = parts[0] if parts else self.question(ctx)
        # A yes/no or either-or question is answered among its own options, whatever its hops.
        kind = answer_kind(first)
        own_options = kind in DIRECT_KINDS
        direct = bool(parts) or action == "answer" or not ctx.scoring or own_options
        reference = None if direct else inner_reference(first)
        if reference is not None:
            return thought + self.hop(ctx, first, reference)
        options = self.options(ctx, first) if ctx.scoring else []
        if not options:
            return thought + (self.written_answer(ctx) if action == "answer" else self.search(ctx, bridge=None))
        sure = action == "answer"
        return thought + [
            Choose(
                tuple(options),
                self.evidence_prompt(ctx, question=first),
                then=lambda pick: (
                    self.answer(ctx, pick, settled=sure)
                    if sure or pick.share >= self.answer_confidence
                    # "yes", one of the question's own options or a date is no entity to go on from:
                    # as a bridge it would open the query and replace a phrase of the question.
                    else self.search(ctx, bridge=None if kind in _NOT_ENTITIES else pick)
                ),
            )
        ]

    def question(self, ctx: StepContext) -> str:
        """The question as the hops so far leave it: each bridge in place of the phrase it resolved.

        A question answered part by part or among its own options (yes/no, either-or) takes no
        hops of its phrases, so it is asked as it is.

        Example:
            >>> q = "What is the name of the waterfall in the country where the Bubye River is found?"
            >>> GuidedDriver().question(StepContext(q, [{"bridge": "Zimbabwe"}], [], 1, False, 64))
            'What is the name of the waterfall in Zimbabwe?'
        """
        if compound_parts(ctx.question) or answer_kind(ctx.question) in DIRECT_KINDS:
            return ctx.question
        return resolved_question(ctx.question, _bridges(ctx))

    def hop(self, ctx: StepContext, question: str, reference: Reference) -> list[Segment]:
        """The next hop of a question that still names an entity it does not give.

        The model chooses the entity (the bridge) among the evidence's spans by its likelihood as
        the answer to the phrase naming it, and the next query starts from it, written for the
        question with the phrase resolved; nothing is answered before (the answer's candidates
        are of the wrong kind while the bridge is unknown).
        """
        opened = self.bridge_from_opened
        options = candidates(
            reference.question,
            self.evidence(ctx, opened=opened),
            limit=self.candidate_limit,
            exclude=_bridges(ctx),
            within=question,
        )
        if not options:
            return self.search(ctx, bridge=None)
        return [
            Choose(
                tuple(options),
                self.evidence_prompt(ctx, question=reference.question, kind=reference.noun, opened=opened),
                then=lambda pick: self.search(ctx, bridge=pick, question=resolve(question, reference, pick.text)),
            )
        ]

    def options(
        self, ctx: StepContext, question: str, *, answered: Sequence[str] = (), opened: bool = False
    ) -> list[str]:
        """Candidates from the evidence for ``question`` (the whole question or one part of it).

        An earlier hop's bridge was a way to the answer, not the answer, except in a question
        that asks for two things: its first part is asked directly, so an unsure pick there is a
        guess at that part's answer, which the next hop's evidence may confirm (left out, the
        right but unsure "France" of the Eiffel Tower's country was lost to "Notre-Dame de
        Paris"). An unsure pick of a plain question stays out of the last choice too: let back
        in, it put the gold answer among the options more often but lost as many answers as it
        gained (BENCHMARKS.md section 11, session 22). A part answered already (``answered``) and
        the whole question's own entities are not the answer of the next part. ``opened``: from
        the opened documents only (:meth:`evidence`).
        """
        bridges = [] if compound_parts(ctx.question) else _bridges(ctx)
        return candidates(
            question,
            self.evidence(ctx, opened=opened),
            limit=self.candidate_limit,
            exclude=[*bridges, *answered],
            within=ctx.question,
        )

    def answer(self, ctx: StepContext, first: Pick, *, settled: bool = True) -> list[Segment]:
        """The answer: the chosen span; a question asking for two things gets a second choice after it.

        ``settled=False`` (the first part was answered before the hops ran out): the second part is
        a question of its own, so unless a search has asked it already, the next search asks it as
        the question words it ("what is the capital of France?"), instead of answering it from what
        was read for the first part (the 135M model took "Sorbonne University" for France's capital
        from the Eiffel Tower's search hits, and a query it wrote from "France" described France).
        The first pick is that search's bridge.
        """
        head = [Lit("</think>\n<answer>"), replace(first, name="answer")]
        parts = compound_parts(ctx.question)
        second = follow_up(parts[1], first.text, first=parts[0]) if parts else None
        if not second:
            return [*head, Lit("</answer>")]
        # From the opened pages only: with the search snippets after France's capital's own page,
        # the 135M model chose "Bordeaux" ("the capital of the Nouvelle-Aquitaine region": -1.6
        # nats against Paris's -3.3; -7.7 against -1.9 from the pages alone). The options come
        # from the evidence the prompt shows, so the model is not scored on a span it was not shown.
        options = self.options(ctx, second, answered=[first.text], opened=True)
        opened = bool(options)
        options = options or self.options(ctx, second, answered=[first.text])
        if not options:
            return [*head, Lit("</answer>")]
        if not settled and second not in _queries(ctx):
            return self.asked(second, bridge=first)
        prompt = self.evidence_prompt(ctx, question=second, opened=opened)
        return [*head, Lit("; "), Choose(tuple(options), prompt, then=lambda pick: [pick, Lit("</answer>")])]

    @staticmethod
    def asked(query: str, *, bridge: Pick) -> list[Segment]:
        """A search for ``query`` as it is, with ``bridge`` (a span of it) recorded as the hop's bridge.

        Example:
            >>> pick = Pick(0, "France", (), (0.0,), (1.0,))
            >>> [type(s).__name__ for s in GuidedDriver.asked("capital of France?", bridge=pick)]
            ['Lit', 'Pick', 'Lit']
        """
        call = render_tool_call("search", {"query": query})
        value = call.index('"query": "') + len('"query": "')
        at = call.find(bridge.text, value) if bridge.text else -1
        # Not verbatim in the rendered call (an angle bracket is written as its JSON escape): no
        # bridge segment, the call as rendered.
        if at < 0:
            return [Lit("</think>\n" + call)]
        end = at + len(bridge.text)
        return [Lit("</think>\n" + call[:at]), replace(bridge, name="bridge"), Lit(call[end:])]

    def written_answer(self, ctx: StepContext) -> list[Segment]:
        """The answer the model writes itself from the evidence (no candidates, or it cannot score)."""
        return [
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

    def search(self, ctx: StepContext, *, bridge: Pick | None, question: str | None = None) -> list[Segment]:
        """A search whose query the model writes; with a bridge, the query starts from it.

        ``question`` is the question the bridge resolved a phrase of, when it did.
        """
        head = json.dumps({"name": "search", "arguments": {"query": ""}})[:-3]  # up to the opening quote
        start: list[Segment] = [Lit("</think>\n<tool_call>" + head)]
        if bridge is not None:
            start.append(replace(bridge, name="bridge"))
        return start + [
            # A quote, backslash or line break would end or break the query's JSON string, and a tag
            # ("</tool_call>") the call: a model that wrote one kept writing it, and every turn was invalid.
            Gen(
                stop=('"', "\\", "\n", "<"),
                max_tokens=self.argument_tokens,
                name="argument",
                messages=self.query_prompt(ctx, bridge=bridge.text if bridge else None, question=question),
            ),
            Lit('"}}</tool_call>'),
        ]

    @staticmethod
    def visit_target(ctx: StepContext) -> str | None:
        """The best-ranked hit of the latest search that no visit has opened or tried yet.

        A 135M model cannot copy a title or id reliably (it invents them), so the driver opens
        the top unopened hit; the model's exploration decision is its query. A hit whose visit
        failed (HTTP 403, a page that cannot be read) is not tried again: a later search that ranks
        it first again would spend a hop on the same failure, which reject() cannot resample away.
        """
        opened = {
            str(d)
            for o in ctx.observations
            if o["name"] == "visit"
            for d in [*o.get("doc_ids", []), (o.get("arguments") or {}).get("doc")]
            if d is not None
        }
        for obs in sorted(ctx.observations, key=lambda o: -o["step"]):
            if obs["name"] == "search" and obs.get("doc_ids"):
                return next((d for d in obs["doc_ids"] if d not in opened), None)
        return None

    def evidence(self, ctx: StepContext, *, opened: bool = False) -> str:
        """Opened documents first, then search snippets, newest first, up to ``evidence_chars``.

        Only observations that read something count (:func:`_read`): an error ("No document …")
        or a search that found nothing is not evidence, and a small model would copy it. ``opened``
        keeps the opened documents only (when a visit read one: after failed visits only, the
        search snippets are all there is).
        """
        ranked = sorted(ctx.observations, key=lambda o: (o["name"] != "visit", -o["step"]))
        listing = any(o.get("doc_ids") for o in ranked)
        if opened and any(o["name"] == "visit" and _read(o, listing=listing) for o in ranked):
            ranked = [o for o in ranked if o["name"] == "visit"]
        budget, parts = self.evidence_chars, []
        for obs in ranked:
            if not _read(obs, listing=listing) or budget <= 0:
                continue
            # Search-result markup ("[2] Title (id: x)") is for choosing documents; a small model
            # copies it into its answer, so the evidence keeps titles and text only.
            text = _without_hit_markup(obs["content"], search_hits(obs["content"], obs.get("doc_ids", ()))).strip()
            if len(text) > budget:
                # A word cut in two would be a candidate of its own ("Journ" of "Journal"). Text
                # with no space near the budget (Japanese after a spaced title, a long URL) is cut at
                # the budget: backing off to the title's space would drop the page.
                cut = text.rfind(" ", max(budget - _WORD_BACKOFF, 0), budget + 1)
                text, budget = text[: cut if cut > 0 else budget], 0
            if text:
                parts.append(quote_untrusted(text, PROMPT_LINES))
            budget -= len(text)
        return "\n\n".join(parts)

    def evidence_prompt(
        self, ctx: StepContext, *, question: str | None = None, kind: str | None = None, opened: bool = False
    ) -> list[BaseMessage]:
        """The plain QA prompt: the evidence, then the question (or one part of it).

        The reply is asked for by the answer's type (``kind``, else the noun the question names it
        by: "Answer with the name of the country."), so the options are scored as what the
        question asks for.

        Example:
            >>> ctx = StepContext("Which country is X in?", [], [], 0, False, 64)
            >>> GuidedDriver().evidence_prompt(ctx)[-1].content.splitlines()[-1]
            'Answer with the name of the country.'
        """
        context = self.evidence(ctx, opened=opened) or "(no evidence found)"
        question = question or ctx.question
        kind = kind or answer_type(question)
        ask = f"Answer with the name of the {kind}." if kind else "Answer with a short phrase."
        return [SystemMessage(EVIDENCE_SYSTEM), HumanMessage(f"{context}\n\nQuestion: {question}\n{ask}")]

    def query_prompt(
        self, ctx: StepContext, *, bridge: str | None = None, question: str | None = None
    ) -> list[BaseMessage]:
        """The plain search prompt: the question, and from the second search on, what was found
        and the queries so far, or, while nothing was, the queries that found nothing.

        With a ``bridge`` (the last hop's best entity) the reply is prefilled with it, so the
        model's query continues from the entity the next hop is about. With the ``question`` that
        bridge resolved ("… the waterfall in Zimbabwe?"), the prompt is that question alone, as
        for the first search: the evidence of the hop done is about the bridge, not the next hop.

        Written inside the agent conversation (system prompt, protocol, tool responses), a 135M
        model's queries repeated themselves or drifted off the question: a trajectory saw 0.48 of
        the supporting documents (HotpotQA distractor pool, 4 hits per search); written from
        this prompt, 0.68 (``benchmarks/agent_protocol.py --limit 30``, BENCHMARKS.md).

        Example:
            >>> GuidedDriver().query_prompt(StepContext("Who?", [], [], 0, False, 64))[-1].content
            'Question: Who?'
            >>> step = {"index": 0, "action": {"type": "tool_call", "name": "search", "arguments": {"query": "who"}}}
            >>> GuidedDriver().query_prompt(StepContext("Who?", [step], [], 1, False, 64))[-1].content.splitlines()[1]
            'Already searched (nothing found): who'
        """
        context = self.evidence(ctx)
        prefill: list[BaseMessage] = [AIMessage(bridge)] if bridge else []
        queries = _queries(ctx)
        if question is not None or not (context or queries):
            return [SystemMessage(QUERY_SYSTEM), HumanMessage(f"Question: {question or ctx.question}"), *prefill]
        # With no evidence yet, every search so far found nothing, and the prompt says so. Without
        # them it was the first search's prompt again, and a model at temperature 0 wrote the same
        # query until the hops ran out (reject() flags the repeat, but a resample repeats it too).
        searched = "Already searched: " if context else "Already searched (nothing found): "
        prompt: list[BaseMessage] = [
            SystemMessage(QUERY_SYSTEM),
            HumanMessage(
                (f"{context}\n\n" if context else "") + f"Question: {ctx.question}\n{searched}{'; '.join(queries)}\n"
                "Write a new search query for what is still missing."
            ),
        ]
        return prompt + prefill

    def reject(self, ctx: StepContext, text: str, action: Action) -> str | None:
        # A query with a character that breaks its JSON (a tab), or an answer cut off: resampled.
        if action.get("type") == "invalid":
            return f"invalid action: {action.get('error', 'unreadable')}"
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
