"""How far bfloat16 moves the engine's logprobs from the float32 reference, on the same tokens.

The float32 engine generates engine_fingerprint's workload (8 sampled branches of a shared
HotpotQA prompt, greedy answers to short questions); every sequence is then scored by teacher
forcing in both precisions (``ModelRunner.score``). Printed per precision: the absolute logprob
difference of the generated tokens and of the float32 top-16 alternatives (mean, 99th percentile,
max), how often the most likely token agrees, and how the per-sequence perplexity moves.

    .venv/bin/python benchmarks/engine_precision.py
"""

from __future__ import annotations

import argparse
import math

import torch
from engine_fingerprint import QUESTIONS, chat_ids, documents

from langgraph_parallelmuse.models import GenerationRequest, InferenceEngine, load_model
from langgraph_parallelmuse.models.runner import ModelRunner


def sequences(loaded) -> list[tuple[list[int], list[int]]]:
    """(prompt, generated) pairs of the float32 engine on the fingerprint workload."""
    tok = loaded.tokenizer
    shared = f"Documents:\n{documents(2500)}\n\nWhich document describes the oldest subject?"
    requests = [
        GenerationRequest(chat_ids(tok, shared, f"Branch {i}: the documents"), max_new_tokens=48, seed=i, top_p=0.95)
        for i in range(8)
    ] + [GenerationRequest(chat_ids(tok, q), max_new_tokens=32, temperature=0.0) for q, _, _ in QUESTIONS]
    engine = InferenceEngine(loaded.model, tok)
    try:
        results = [f.result() for f in [engine.submit(r) for r in requests]]
    finally:
        engine.close()
    return [(list(r.prompt_ids), res.token_ids) for r, res in zip(requests, results, strict=True) if res.token_ids]


def drift(model, pairs, precision: str) -> dict[str, float]:
    reference, other = ModelRunner(model), ModelRunner(model, precision=precision)
    chosen, tops, agree, total, ppl = [], [], 0, 0, []
    for prompt, generated in pairs:
        rows = slice(len(prompt) - 1, len(prompt) - 1 + len(generated))
        a, b = reference.score(prompt + generated)[rows], other.score(prompt + generated)[rows]
        ids = torch.tensor(generated)[:, None]
        chosen.append((a.gather(1, ids) - b.gather(1, ids)).abs().flatten())
        alternatives = a.topk(16, dim=-1).indices
        tops.append((a.gather(1, alternatives) - b.gather(1, alternatives)).abs().flatten())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += len(generated)
        nll_a, nll_b = -a.gather(1, ids).mean().item(), -b.gather(1, ids).mean().item()
        ppl.append(abs(math.exp(nll_b) / math.exp(nll_a) - 1))
    c, t = torch.cat(chosen), torch.cat(tops)
    return {
        "tokens": total,
        "chosen_mean": c.mean().item(),
        "chosen_p99": c.quantile(0.99).item(),
        "chosen_max": c.max().item(),
        "top16_mean": t.mean().item(),
        "top16_max": t.max().item(),
        "argmax_agree": agree / total,
        "ppl_rel_max": max(ppl),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args()
    loaded = load_model()
    pairs = sequences(loaded)
    print(f"{len(pairs)} sequences scored against float32 (teacher forcing, same tokens)")
    print(
        f"{'precision':<10} {'tokens':>6} {'|dlogp| mean':>12} {'p99':>7} {'max':>7} {'top16 mean':>10} "
        f"{'top16 max':>9} {'argmax same':>11} {'PPL moved':>9}"
    )
    for precision in args.precisions:
        d = drift(loaded.model, pairs, precision)
        print(
            f"{precision:<10} {d['tokens']:>6} {d['chosen_mean']:>12.5f} {d['chosen_p99']:>7.4f} "
            f"{d['chosen_max']:>7.4f} {d['top16_mean']:>10.5f} {d['top16_max']:>9.4f} "
            f"{d['argmax_agree']:>11.1%} {d['ppl_rel_max']:>9.2%}"
        )


if __name__ == "__main__":
    main()
