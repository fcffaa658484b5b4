"""Issue 5 (b): wall time of the rollout stage, ParallelMuse vs from-scratch, engine on vs off.

Four configurations are run side by side on each chunk of ``--concurrency`` questions (same process,
same weights, same seeds): the graph's partial-rollout schedule (N=8, M=1, k=2, T=3, fills) and 8
from-scratch trajectories, each with the in-process engine's prefix cache + batching on, and with
both off (what naive parallel sampling gets). Only the rollout stage is timed (no
compression/aggregation); the engine's prefill/decode counters are printed per configuration.

    .venv/bin/python benchmarks/engine_rollout.py --limit 10 --concurrency 5 [--dataset musique_train100]
        [--configs pm_engine,scratch_engine]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from common import arguments, dev_set, integer

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.schedule import partial_rollout
from langgraph_parallelmuse.tools import make_corpus_tools

CONFIGS = ("pm_engine", "pm_naive", "scratch_engine", "scratch_naive")
COUNTERS = ("prefill_tokens_computed", "prefill_tokens_reused", "decode_tokens", "batches", "batch_rows")


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {', '.join(CONFIGS)} (ratios are printed for the pairs present)",
    )
    ap.add_argument(
        "--concurrency",
        type=integer(1),
        default=1,
        help="questions in flight per configuration; above 1 the waves of different questions share "
        "the engine's batches, so it measures throughput rather than one question's latency",
    )


async def rollout_stage(model, tools, item, cfg, tag) -> dict:
    """Token counts of the graph's rollout schedule for ``cfg`` (mode 'none' = N from-scratch)."""
    trajs, _ = await partial_rollout(RolloutRunner(model, tools), item.question, config=cfg, run_id=tag)
    branches = [t for t in trajs if t["origin"].get("kind") == "branch"]
    return {
        "generated": sum(t["stats"]["generated_tokens"] for t in trajs),
        "branch_prompt": sum(t["stats"]["prompt_tokens"] for t in branches),
        "branch_cached": sum(t["stats"]["cached_prompt_tokens"] for t in branches),
    }


def ratio(seconds: dict[str, float], slow: str, fast: str, label: str, target: float | None) -> None:
    if slow in seconds and fast in seconds:
        goal = f" (target >= {target})" if target else ""
        print(f"{label}: {seconds[slow] / seconds[fast]:.2f}x{goal}")


async def main() -> None:
    args = arguments(__doc__, limit=10, extra=options)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or not names:
        raise SystemExit(f"--configs: got {args.configs!r}; choose one or more of {', '.join(CONFIGS)}")
    items, index = dev_set(args.dataset, args.limit)
    partial = make_config(n=8, m=1, k=2, t=3, seed=args.seed)
    scratch = make_config(partial, mode="none")
    engines = {kind: LocalChatModel.embedded(prefix_cache=kind, batching=kind) for kind in (True, False)}
    runs = {name: (partial if name.startswith("pm") else scratch, engines[name.endswith("engine")]) for name in names}
    seconds = dict.fromkeys(runs, 0.0)
    engine = {k: dict.fromkeys(COUNTERS, 0) for k in runs}
    results: dict[str, list[dict]] = {k: [] for k in runs}
    chunks = [items[i : i + args.concurrency] for i in range(0, len(items), args.concurrency)]
    for n, chunk in enumerate(chunks, 1):
        order = list(runs) if n % 2 else list(reversed(runs))  # alternate order against drift
        line = []
        for name in order:
            cfg, model = runs[name]
            model.engine.clear_cache()  # every configuration starts cold on every chunk
            model.engine.reset_stats()
            t0 = time.perf_counter()
            done = await asyncio.gather(
                *(
                    rollout_stage(
                        model,
                        make_corpus_tools(index, doc_ids=item.context_doc_ids),
                        item,
                        cfg,
                        f"{item.id}/{name}",
                    )
                    for item in chunk
                )
            )
            took = time.perf_counter() - t0
            seconds[name] += took
            results[name].extend(done)
            stats = model.engine.stats()
            for key in COUNTERS:
                engine[name][key] += stats[key]
            line.append(f"{name}={took:.1f}s")
        print(f"[{n}/{len(chunks)}] {len(chunk)} question(s): " + "  ".join(line), flush=True)

    print(f"\n{len(items)} questions, {args.concurrency} in flight per configuration")
    print("| configuration | total s | s/question | generated tokens/question |\n|---|---|---|---|")
    for k, v in results.items():
        per_q = seconds[k] / len(items)
        print(f"| {k} | {seconds[k]:.0f} | {per_q:.1f} | {statistics.fmean(r['generated'] for r in v):.0f} |")
    print("\n| configuration | prefill computed/q | prefill reused/q | decoded/q | mean batch |\n|---|---|---|---|---|")
    q = len(items)
    for k, e in engine.items():
        print(
            f"| {k} | {e['prefill_tokens_computed'] / q:.0f} | {e['prefill_tokens_reused'] / q:.0f} | "
            f"{e['decode_tokens'] / q:.0f} | {e['batch_rows'] / max(e['batches'], 1):.2f} |"
        )
    print()
    ratio(seconds, "scratch_naive", "pm_engine", "ParallelMuse+engine vs naive from-scratch", 2.5)
    ratio(seconds, "scratch_engine", "pm_engine", "ParallelMuse+engine vs from-scratch+engine", 1.3)
    ratio(seconds, "scratch_naive", "scratch_engine", "engine alone on from-scratch sampling", None)
    if pm := results.get("pm_engine"):
        bp, bc = sum(r["branch_prompt"] for r in pm), sum(r["branch_cached"] for r in pm)
        print(
            f"branches' prompt tokens prefilled (not served by the prefix cache): {bp - bc}/{bp} = "
            f"{(bp - bc) / max(bp, 1):.3f} (target <= 0.15)"
        )


if __name__ == "__main__":
    asyncio.run(main())
