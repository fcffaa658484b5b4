"""How often the gold answer is among the guided driver's candidates when the evidence is the gold paragraphs.

No model runs: the ceiling the candidate spans put on a chosen answer, per answer kind, at a few
candidate limits, with the evidence the agent reads after opening the two (HotpotQA) or two to four
(MuSiQue) supporting paragraphs: each opened by the corpus ``visit`` tool as the guided driver
calls it (MuSiQue's in the order of the hops), recorded by the agent's own tool step, and shown by
``GuidedDriver.evidence`` (newest first, cut at ``evidence_chars``). For MuSiQue also with the
question as the driver asks it once its hops are resolved, the decomposition's gold bridges in
place of the phrases naming them (``references.py``). Gold answers and bridges are read for
evaluation only::

    .venv/bin/python benchmarks/candidate_recall.py --dataset musique_train100 --limit 100
"""

from __future__ import annotations

import asyncio
from collections import Counter

from common import arguments, dev_set

from langgraph_parallelmuse.agent import observe
from langgraph_parallelmuse.candidates import answer_kind, candidates
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.driver import GuidedDriver, StepContext
from langgraph_parallelmuse.eval import QAItem
from langgraph_parallelmuse.eval.scoring import exact_match
from langgraph_parallelmuse.references import resolved_question
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools

LIMITS = (8, 16, 32)


async def opened_evidence(item: QAItem, index: CorpusIndex) -> tuple[str, list[str]]:
    """The driver's evidence once the supporting paragraphs are opened, and their titles.

    Each is opened as the driver's visit step does (``{"doc": id}``, no goal) and recorded as the
    agent's act node records it, so the evidence holds what a trajectory that opened them holds.
    """
    hops = item.meta.get("question_decomposition")
    opened = [item.context_doc_ids[hop["paragraph_support_idx"]] for hop in hops] if hops else item.supporting_doc_ids
    tools = {t.name: t for t in make_corpus_tools(index, doc_ids=item.context_doc_ids)}
    steps, observations = [], []
    for at, doc in enumerate(opened):
        steps.append(
            {"index": at, "text": "", "action": {"type": "tool_call", "name": "visit", "arguments": {"doc": doc}}}
        )
        observations.append(await observe(tools, steps[-1], trajectory_id=item.id, config=make_config()))
    ctx = StepContext(item.question, steps, observations, len(steps), False, 64, frozenset({"search", "visit"}))
    return GuidedDriver().evidence(ctx), [index.get(doc).title for doc in item.supporting_doc_ids]


async def main() -> None:
    args = arguments(__doc__, limit=100)
    items, index = dev_set(args.dataset, args.limit)
    found: Counter[tuple[int, str]] = Counter()
    kinds = Counter(answer_kind(item.question) for item in items)
    sizes: Counter[int] = Counter()
    resolved: Counter[int] = Counter()
    for item in items:
        kind = answer_kind(item.question)
        evidence, titles = await opened_evidence(item, index)
        hops = item.meta.get("question_decomposition")
        question = resolved_question(item.question, [hop["answer"] for hop in hops[:-1]]) if hops else None
        for limit in LIMITS:
            options = candidates(item.question, evidence, limit=limit, titles=titles)
            sizes[limit] += len(options)
            if any(exact_match(o, item.answers) for o in options):
                found[limit, kind] += 1
            if question is not None:
                options = candidates(question, evidence, limit=limit, titles=titles)
                resolved[limit] += any(exact_match(o, item.answers) for o in options)
    print(f"{args.dataset}, {len(items)} questions: gold answer among the candidates (exact match)\n")
    print("| limit | all | mean candidates | " + " | ".join(f"{k} ({n})" for k, n in kinds.items()) + " |")
    print("|---" * (3 + len(kinds)) + "|")
    for limit in LIMITS:
        per_kind = " | ".join(f"{found[limit, k]}" for k in kinds)
        total = sum(found[limit, k] for k in kinds) / len(items)
        print(f"| {limit} | {total:.2f} | {sizes[limit] / len(items):.1f} | {per_kind} |")
    if resolved:
        print(
            "\nWith the gold bridges in place: " + ", ".join(f"{resolved[n] / len(items):.2f} at {n}" for n in LIMITS)
        )


if __name__ == "__main__":
    asyncio.run(main())
