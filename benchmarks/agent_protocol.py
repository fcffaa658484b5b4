"""Issue 2 benchmark: the embedded agent (SmolLM2 + guided driver) on HotpotQA, distractor setting.

One trajectory per question, run one after another so seconds per trajectory are meaningful.

    .venv/bin/python benchmarks/agent_protocol.py --limit 30
"""

from __future__ import annotations

import asyncio
import statistics
import time

from common import arguments, dev_set

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.eval.scoring import retrieval_recall, score_answer
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.tools import make_corpus_tools


async def main() -> None:
    args = arguments(__doc__, limit=30)
    items, index = dev_set(args.dataset, args.limit)
    model = LocalChatModel.embedded()
    cfg = make_config(seed=args.seed)
    rows = []
    for n, item in enumerate(items, 1):
        runner = RolloutRunner(model, make_corpus_tools(index, doc_ids=item.context_doc_ids))
        t0 = time.perf_counter()
        traj = await runner.run(item.question, trajectory_id="t0", thread_id=item.id, config=cfg)
        seconds = time.perf_counter() - t0
        seen = [d for o in traj["observations"] for d in o.get("doc_ids", [])]
        opened = [d for o in traj["observations"] if o["name"] == "visit" for d in o.get("doc_ids", [])]
        row = {
            "well_formed": bool(traj["answer"])
            and any(o["name"] == "search" and not o["error"] for o in traj["observations"]),
            "steps": len(traj["steps"]),
            "generated": traj["stats"]["generated_tokens"],
            "recall_seen": retrieval_recall(seen, item.supporting_doc_ids),
            "recall_opened": retrieval_recall(opened, item.supporting_doc_ids),
            "seconds": seconds,
            **score_answer(traj["answer"], item.answers),
        }
        rows.append(row)
        print(
            f"[{n:2}/{len(items)}] {seconds:5.1f}s wf={row['well_formed']!s:5} f1={row['f1']:.2f} "
            f"gold={item.answers[0]!r} answer={traj['answer']!r}",
            flush=True,
        )

    def mean(key: str) -> float:
        return statistics.fmean(float(r[key]) for r in rows)

    print("\n| metric | value | target |\n|---|---|---|")
    print(f"| well-formed trajectories | {mean('well_formed'):.2f} | >= 0.95 |")
    print(f"| mean steps | {mean('steps'):.2f} | |")
    print(f"| mean generated tokens | {mean('generated'):.0f} | |")
    print(f"| supporting-doc recall, docs seen (search hits + opened) | {mean('recall_seen'):.2f} | >= 0.67 |")
    print(f"| supporting-doc recall, docs opened (visit) | {mean('recall_opened'):.2f} | |")
    print(f"| answer EM | {mean('em'):.3f} | |")
    print(f"| answer F1 | {mean('f1'):.3f} | |")
    print(f"| answer contains gold | {mean('contains'):.3f} | >= 0.15 |")
    print(f"| seconds per trajectory | {mean('seconds'):.1f} | |")


if __name__ == "__main__":
    asyncio.run(main())
