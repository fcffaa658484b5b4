"""Fingerprint of the in-process engine: every token and logprob of a fixed, seeded workload.

Runs the embedded SmolLM2 through :class:`~langgraph_parallelmuse.models.InferenceEngine` on waves
of requests submitted together (so batch membership does not depend on timing): sampled branches
of one shared prompt with top-16 logprobs, greedy requests with stop strings and different lengths
(rows retire at different steps), a repeat that hits the prefix cache on prompt + generation, and
the greedy wave again on an engine without prefix cache or batching. It writes every result to
JSON; ``--compare`` reports whether two such files are identical, and otherwise how far apart.

    .venv/bin/python benchmarks/engine_fingerprint.py --out before.json
    .venv/bin/python benchmarks/engine_fingerprint.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import corpus_file

from langgraph_parallelmuse.models import GenerationRequest, InferenceEngine, load_model

QUESTIONS = [
    ("What is the capital of France?", [","], 16),
    ("Count from one to ten, separated by commas.", ["four"], 24),
    ("What do bees make?", [], 5),
    ("Name a primary colour.", ["\n"], 12),
]


def chat_ids(tokenizer, user: str, prefill: str = "") -> list[int]:
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": user}]
    if prefill:
        messages.append({"role": "assistant", "content": prefill})
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=not prefill, continue_final_message=bool(prefill)
    )
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def documents(limit_chars: int) -> str:
    lines = []
    with corpus_file("hotpotqa_train100").open() as handle:
        for line in handle:
            doc = json.loads(line)
            lines.append(f"[{doc['title']}] {doc['text']}")
            if sum(map(len, lines)) >= limit_chars:
                break
    return "\n".join(lines)


def wave(engine: InferenceEngine, requests: list[GenerationRequest]) -> list[dict]:
    futures = [engine.submit(r) for r in requests]
    out = []
    for future in futures:
        r = future.result()
        out.append(
            {
                "text": r.text,
                "token_ids": r.token_ids,
                "finish": r.finish_reason,
                "cached": r.cached_tokens,
                "logprobs": r.logprobs,
            }
        )
    return out


def workload(loaded) -> dict[str, list[dict]]:
    tok = loaded.tokenizer
    shared = f"Documents:\n{documents(2500)}\n\nWhich document describes the oldest subject?"
    branches = [
        GenerationRequest(
            chat_ids(tok, shared, f"Branch {i}: the documents"),
            max_new_tokens=24,
            temperature=0.6,
            top_p=0.95,
            seed=i,
            top_logprobs=16,
            ignore_eos=True,
        )
        for i in range(8)
    ]
    greedy = [
        GenerationRequest(chat_ids(tok, q), max_new_tokens=n, temperature=0.0, stop=tuple(s), top_logprobs=5)
        for q, s, n in QUESTIONS
    ]
    results: dict[str, list[dict]] = {}
    engine = InferenceEngine(loaded.model, tok, max_batch_size=8)
    try:
        results["branches"] = wave(engine, branches)
        results["greedy_batched"] = wave(engine, greedy)
        again = [branches[0], branches[1], greedy[0]]
        results["repeat_cached"] = wave(engine, again)
        results["stats"] = [engine.stats()]
    finally:
        engine.close()
    plain = InferenceEngine(loaded.model, tok, prefix_cache=False, batching=False)
    try:
        results["greedy_plain"] = wave(plain, greedy)
        results["branch_plain"] = wave(plain, branches[:1])
    finally:
        plain.close()
    return results


def logprob_values(entries: list[dict] | None) -> list[float]:
    values = []
    for e in entries or []:
        values.append(e["logprob"])
        values.extend(t["logprob"] for t in e["top_logprobs"])
    return values


def compare(a_path: Path, b_path: Path) -> None:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    identical = True
    for name in a:
        if name == "stats":
            continue
        for i, (x, y) in enumerate(zip(a[name], b[name], strict=True)):
            same_tokens = x["token_ids"] == y["token_ids"] and x["text"] == y["text"]
            va, vb = logprob_values(x["logprobs"]), logprob_values(y["logprobs"])
            diff = max((abs(p - q) for p, q in zip(va, vb, strict=False)), default=0.0)
            same = same_tokens and x == y
            identical &= same
            print(
                f"{name}[{i}]: tokens {'same' if same_tokens else 'DIFFER'}, {len(va)} logprobs, "
                f"max |diff| {diff:.3g}, record {'identical' if same else 'DIFFERS'}"
            )
    print("stats a:", a["stats"][0])
    print("stats b:", b["stats"][0])
    print("IDENTICAL" if identical else "NOT IDENTICAL")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if args.out is None:
        ap.error("pass --out FILE or --compare A B")
    loaded = load_model(dtype=args.dtype)
    start = time.perf_counter()
    results = workload(loaded)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
