"""Issue 5 (b): wall time of the rollout stage, ParallelMuse vs from-scratch, engine on vs off.

Four configurations are run side by side on each question (same process, same weights, same seeds):
ParallelMuse partial rollout (N=8, M=1, k=2, T=3, fills) and 8 from-scratch trajectories, each
with the in-process engine's prefix cache + batching on, and with both off (what naive parallel
sampling gets). Only the rollout stage is timed (no compression/aggregation).

    .venv/bin/python benchmarks/engine_rollout.py --limit 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.eval import eval_data_dir, load_questions
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.state import Origin
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
from langgraph_parallelmuse.uncertainty import select_branch_steps


async def parallelmuse_rollout(model, tools, item, cfg, tag) -> dict:
    runner = RolloutRunner(model, tools)
    engine = model.engine
    t0 = time.perf_counter()
    # As in the graph: fill-ins run beside the initial trajectory; branches follow its scoring.
    fills = [
        runner.run(
            item.question,
            trajectory_id=f"f{i}",
            thread_id=f"{tag}/f{i}",
            config=cfg,
            origin=Origin(kind="fill", parent=None, round=0),
        )
        for i in range(cfg.fill_budget)
    ]
    initial, *early = await asyncio.gather(
        runner.run(item.question, trajectory_id="t0", thread_id=f"{tag}/t0", config=cfg), *fills
    )
    picks = select_branch_steps(initial["uncertainty"], mode=cfg.mode, k=cfg.k)
    before = engine.stats()
    jobs = [
        runner.fork(
            initial,
            step,
            trajectory_id=f"s{step}.b{j}",
            thread_id=f"{tag}/s{step}.b{j}",
            config=cfg,
            origin=Origin(kind="branch", region=region, score=score, round=1),
        )
        for step, region, score in picks
        for j in range(cfg.t)
    ]
    n_branches = len(jobs)
    jobs += [
        runner.run(
            item.question,
            trajectory_id=f"f{cfg.fill_budget + i}",
            thread_id=f"{tag}/f{cfg.fill_budget + i}",
            config=cfg,
            origin=Origin(kind="fill", parent=None, round=1),
        )
        for i in range(cfg.n - 1 - len(early) - n_branches)
    ]
    trajs = [initial, *await asyncio.gather(*jobs), *early]
    after = engine.stats()
    branches = trajs[1 : 1 + n_branches]
    return {
        "seconds": time.perf_counter() - t0,
        "generated": sum(t["stats"]["generated_tokens"] for t in trajs),
        "branch_prompt": sum(t["stats"]["prompt_tokens"] for t in branches),
        "branch_cached": sum(t["stats"]["cached_prompt_tokens"] for t in branches),
        "stage_prefill_computed": after["prefill_tokens_computed"] - before["prefill_tokens_computed"],
        "stage_prefill_reused": after["prefill_tokens_reused"] - before["prefill_tokens_reused"],
    }


async def scratch_rollout(model, tools, item, cfg, tag) -> dict:
    runner = RolloutRunner(model, tools)
    t0 = time.perf_counter()
    trajs = await asyncio.gather(
        *(runner.run(item.question, trajectory_id=f"t{i}", thread_id=f"{tag}/t{i}", config=cfg) for i in range(cfg.n))
    )
    return {"seconds": time.perf_counter() - t0, "generated": sum(t["stats"]["generated_tokens"] for t in trajs)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = eval_data_dir()
    items = load_questions(data / "hotpotqa_train100.questions.jsonl", limit=args.limit)
    index = CorpusIndex.from_jsonl(data / "hotpotqa_train100.corpus.jsonl")
    on = LocalChatModel.embedded()
    off = LocalChatModel.embedded(prefix_cache=False, batching=False)
    cfg = make_config(n=8, m=1, k=2, t=3, seed=args.seed)
    runs = {
        "pm_engine": (parallelmuse_rollout, on),
        "pm_naive": (parallelmuse_rollout, off),
        "scratch_engine": (scratch_rollout, on),
        "scratch_naive": (scratch_rollout, off),
    }
    results: dict[str, list[dict]] = {k: [] for k in runs}
    for n, item in enumerate(items, 1):
        tools = make_corpus_tools(index, doc_ids=item.context_doc_ids)
        order = list(runs) if n % 2 else list(reversed(runs))  # alternate order against drift
        for name in order:
            fn, model = runs[name]
            model.engine.clear_cache()  # every configuration starts cold on every question
            results[name].append(await fn(model, tools, item, cfg, f"{item.id}/{name}"))
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
    computed = sum(r["stage_prefill_computed"] for r in pm)
    reused = sum(r["stage_prefill_reused"] for r in pm)
    print(f"branch stage prefill computed / prompt tokens: {computed / max(computed + reused, 1):.3f} (target <= 0.15)")
    bp, bc = sum(r["branch_prompt"] for r in pm), sum(r["branch_cached"] for r in pm)
    print(f"branch trajectories' prompt tokens served from cache: {bc}/{bp} = {bc / max(bp, 1):.3f}")


if __name__ == "__main__":
    asyncio.run(main())
