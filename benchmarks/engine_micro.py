"""Microbenchmark of the local engine: prefix KV reuse and batching of parallel branches.

Eight branches continue one ~1,500-token shared prompt (real HotpotQA paragraphs read at run time)
and each generates exactly 32 tokens (fixed seeds, EOS ignored). Three engine settings are timed
side by side in one process on the same loaded weights:

1. from scratch: no prefix cache, no batching (every branch prefills the whole prompt);
2. prefix cache only: the prompt is prefilled once, branches decode one after another;
3. prefix cache + batching: the prompt is prefilled once, the branches decode in one batch.

Run:
    .venv/bin/python benchmarks/engine_micro.py [--branches 8] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from common import corpus_file
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langgraph_parallelmuse.models import LocalChatModel


def build_prefix(llm: LocalChatModel, target_tokens: int) -> list:
    """Messages whose rendered prompt is about ``target_tokens`` long (whole paragraphs)."""
    system = SystemMessage("Answer the question using the documents. Think step by step.")
    question = "\n\nQuestion: Which of these documents describes the oldest subject?"
    docs: list[str] = []
    with corpus_file("hotpotqa_train100").open() as handle:
        for line in handle:
            doc = json.loads(line)
            docs.append(f"[{doc['title']}] {doc['text']}")
            user = HumanMessage("Documents:\n" + "\n".join(docs) + question)
            if llm.count_prompt_tokens([system, user]) >= target_tokens:
                break
    return [system, user]


async def run_branches(llm: LocalChatModel, prefix: list, branches: int, new_tokens: int) -> float:
    """Launch all branches concurrently (as a ParallelMuse fan-out does); return wall seconds."""
    calls = [
        llm.ainvoke(
            [*prefix, AIMessage(f"Branch {i}: the documents")],
            max_tokens=new_tokens,
            temperature=0.6,
            top_p=0.95,
            seed=i,
            ignore_eos=True,
        )
        for i in range(branches)
    ]
    start = time.perf_counter()
    replies = await asyncio.gather(*calls)
    elapsed = time.perf_counter() - start
    for reply in replies:
        assert reply.usage_metadata["output_tokens"] == new_tokens, reply.usage_metadata
    return elapsed


SETTINGS = {
    "from scratch": {"prefix_cache": False, "batching": False},
    "prefix cache": {"prefix_cache": True, "batching": False},
    "prefix cache + batching": {"prefix_cache": True, "batching": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--only", choices=list(SETTINGS), help="this setting alone (e.g. with --repeat)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each setting (the cache emptied before each)")
    args = parser.parse_args()

    settings = {args.only: SETTINGS[args.only]} if args.only else SETTINGS
    models = {
        name: LocalChatModel.embedded(max_batch_size=args.branches, top_logprobs=16, **kw)
        for name, kw in settings.items()
    }
    first = next(iter(models.values()))
    start = time.perf_counter()
    prefix = build_prefix(first, args.prefix_tokens)
    print(f"model loaded in {time.perf_counter() - start:.1f} s")
    prompt_tokens = first.count_prompt_tokens([*prefix, AIMessage("Branch 0: the documents")])
    print(
        f"shared prompt: {prompt_tokens} tokens; {args.branches} branches x "
        f"{args.new_tokens} new tokens (top_logprobs=16)"
    )
    # Warm up the kernels and thread pools outside the timed runs.
    asyncio.run(run_branches(first, [HumanMessage("Hello")], 1, 4))

    seconds = {}
    for _ in range(args.repeat):
        for name, llm in models.items():
            llm.engine.clear_cache()
            llm.engine.reset_stats()
            seconds[name] = asyncio.run(run_branches(llm, prefix, args.branches, args.new_tokens))
            stats = llm.engine.stats()
            print(
                f"{name:<26} {seconds[name]:6.2f} s   prefill computed "
                f"{stats['prefill_tokens_computed']:>6}, reused {stats['prefill_tokens_reused']:>6}, "
                f"decode steps {stats['batches']:>4}, mean batch {stats['mean_batch_size']:.2f}"
            )
    if args.only:
        return
    base = seconds["from scratch"]
    print(f"speed-up prefix cache:           {base / seconds['prefix cache']:.2f}x")
    print(f"speed-up prefix cache + batching: {base / seconds['prefix cache + batching']:.2f}x")


if __name__ == "__main__":
    main()
