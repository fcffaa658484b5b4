"""How often the gold answer is among the guided driver's candidates when the evidence is the gold paragraphs.

No model runs: the ceiling the candidate spans put on a chosen answer, per answer kind, with the
two (HotpotQA) or two to four (MuSiQue) supporting paragraphs as the evidence, at a few candidate
limits. For MuSiQue also with the question as the driver asks it once its hops are resolved, the
decomposition's gold bridges in place of the phrases naming them (``references.py``). Gold
answers and bridges are read for evaluation only::

    .venv/bin/python benchmarks/candidate_recall.py --dataset musique_train100 --limit 100
"""

from __future__ import annotations

import json
from collections import Counter

from common import arguments, corpus_file

from langgraph_parallelmuse.candidates import answer_kind, candidates
from langgraph_parallelmuse.eval import eval_data_dir, load_questions
from langgraph_parallelmuse.eval.scoring import exact_match
from langgraph_parallelmuse.references import resolved_question

LIMITS = (8, 16, 32)


def main() -> None:
    args = arguments(__doc__, limit=100)
    items = load_questions(eval_data_dir() / f"{args.dataset}.questions.jsonl", limit=args.limit)
    docs = {d["id"]: d for d in map(json.loads, corpus_file(args.dataset).read_text().splitlines())}
    found: Counter[tuple[int, str]] = Counter()
    kinds = Counter(answer_kind(item.question) for item in items)
    sizes: Counter[int] = Counter()
    resolved: Counter[int] = Counter()
    for item in items:
        kind = answer_kind(item.question)
        support = [docs[i] for i in item.supporting_doc_ids]
        evidence = "\n".join(f"{d['title']}: {d['text']}" for d in support)
        titles = [d["title"] for d in support]
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
    main()
