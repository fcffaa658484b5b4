"""Issue 5 (b): wall time of the rollout stage, ParallelMuse vs from-scratch, engine on vs off.

Four configurations are run side by side on each question (same process, same weights, same seeds):
the graph's partial-rollout schedule (N=8, M=1, k=2, T=3, fills) and 8 from-scratch trajectories, each
with the in-process engine's prefix cache + batching on, and with both off (what naive parallel
sampling gets). Only the rollout stage is timed (no compression/aggregation).

    .venv/bin/python benchmarks/engine_rollout.py --limit 10 [--dataset musique_train100]
"""

from __future__ import annotations

import asyncio
import statistics
import time

from common import arguments, dev_set

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.schedule import partial_rollout
from langgraph_parallelmuse.tools import make_corpus_tools


async def rollout_stage(model, tools, item, cfg, tag) -> dict:
    """The graph's rollout schedule for ``cfg`` (mode 'none' = N from-scratch trajectories)."""
    t0 = time.perf_counter()
    trajs, _ = await partial_rollout(RolloutRunner(model, tools), item.question, config=cfg, run_id=tag)
    branches = [t for t in trajs if t["origin"].get("kind") == "branch"]
    return {
        "seconds": time.perf_counter() - t0,
        "generated": sum(t["stats"]["generated_tokens"] for t in trajs),
        "branch_prompt": sum(t["stats"]["prompt_tokens"] for t in branches),
        "branch_cached": sum(t["stats"]["cached_prompt_tokens"] for t in branches),
    }


async def main() -> None:
    args = arguments(__doc__, limit=10)
    items, index = dev_set(args.dataset, args.limit)
    on = LocalChatModel.embedded()
    off = LocalChatModel.embedded(prefix_cache=False, batching=False)
    partial = make_config(n=8, m=1, k=2, t=3, seed=args.seed)
    scratch = make_config(partial, mode="none")
    runs = {
        "pm_engine": (partial, on),
        "pm_naive": (partial, off),
        "scratch_engine": (scratch, on),
        "scratch_naive": (scratch, off),
    }
    results: dict[str, list[dict]] = {k: [] for k in runs}
    for n, item in enumerate(items, 1):
        tools = make_corpus_tools(index, doc_ids=item.context_doc_ids)
        order = list(runs) if n % 2 else list(reversed(runs))  # alternate order against drift
        for name in order:
            cfg, model = runs[name]
            model.engine.clear_cache()  # every configuration starts cold on every question
            results[name].append(await rollout_stage(model, tools, item, cfg, f"{item.id}/{name}"))
        print(f"[{n}/{len(items)}] " + "  ".join(f"{k}={results[k][-1]['seconds']:.1f}s" for k in runs), flush=True)

    tot = {k: sum(r["seconds"] for r in v) for k, v in results.items()}
    print("\n| configuration | total s | s/question | generated tokens/question |\n|---|---|---|---|")
    for k, v in results.items():
        print(f"| {k} | {tot[k]:.0f} | {tot[k] / len(items):.1f} | {statistics.fmean(r['generated'] for r in v):.0f} |")
    print(
        f"\nParallelMuse+engine vs naive from-scratch: {tot['scratch_naive'] / tot['pm_engine']:.2f}x (target >= 2.5)"
    )
    print(
        f"ParallelMuse+engine vs from-scratch+engine: {tot['scratch_engine'] / tot['pm_engine']:.2f}x (target >= 1.3)"
    )
    print(f"engine alone on from-scratch sampling: {tot['scratch_naive'] / tot['scratch_engine']:.2f}x")
    pm = results["pm_engine"]
    bp, bc = sum(r["branch_prompt"] for r in pm), sum(r["branch_cached"] for r in pm)
    print(
        f"branches' prompt tokens prefilled (not served by the prefix cache): {bp - bc}/{bp} = "
        f"{(bp - bc) / max(bp, 1):.3f} (target <= 0.15)"
    )


if __name__ == "__main__":
    asyncio.run(main())
