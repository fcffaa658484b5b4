"""How far bfloat16 moves the engine's logprobs from the float32 reference, on the same tokens.

The float32 engine generates engine_fingerprint's workload (8 sampled branches of a shared
HotpotQA prompt, greedy answers to short questions); every sequence is then scored by teacher
forcing in both precisions (``ModelRunner.score``). Printed per precision: the absolute logprob
difference of the generated tokens and of the float32 top-16 alternatives (mean, 99th percentile,
max), how often the most likely token agrees, and how the per-sequence perplexity moves.

``--limit N`` asks the question that matters for ParallelMuse: does bfloat16 change which steps
are forked? For each of the first N dev-set questions the embedded agent (guided driver, seed 0)
runs one trajectory in float32; the same trajectory is then replayed through the library's own
agent twice, in float32 and in the other precision, with every generated text forced (teacher
forcing through ``LocalChatModel(continuation=...)``) and every likelihood choice scored anew, so
the steps' token logprobs are each precision's own on identical text. Printed: how far each region
perplexity moved, and how often the branch picks (``select_branch_steps``, k = 2) are the same,
per mode and estimator. A replay whose choice came out differently (a likelihood choice drawn
differently in bfloat16) leaves the float32 path and is counted, not compared.

    .venv/bin/python benchmarks/engine_precision.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_precision.py --limit 20 --dataset hotpotqa_train100
"""

from __future__ import annotations

import asyncio
import math
import statistics
from typing import Any

import torch
from common import arguments, dev_set
from engine_fingerprint import QUESTIONS, chat_ids, documents
from pydantic import Field

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.models import GenerationRequest, InferenceEngine, LocalChatModel, load_model
from langgraph_parallelmuse.models.runner import ModelRunner
from langgraph_parallelmuse.tools import make_corpus_tools
from langgraph_parallelmuse.uncertainty import score_steps, select_branch_steps

MODES, ESTIMATORS, REGIONS = ("exploration", "reasoning", "mixed"), ("nll", "entropy"), ("exploration", "reasoning")


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


class Replay(LocalChatModel):
    """The local model, recording what it generates or, given a record, scoring that text instead.

    Likelihood choices (``continuation=`` calls) are always scored by this model's own precision.
    """

    record: dict[tuple, tuple[str, str]] = Field(default_factory=dict)
    replay: dict[tuple, tuple[str, str]] | None = None

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs: Any):
        if "continuation" in kwargs:
            return await super()._agenerate(messages, stop, run_manager, **kwargs)
        key = (self.render_prompt(messages), tuple(stop or ()), kwargs.get("seed"))
        if self.replay is None:
            result = await super()._agenerate(messages, stop, run_manager, **kwargs)
            message = result.generations[0].message
            self.record[key] = (message.content, message.response_metadata["finish_reason"])
            return result
        if key not in self.replay:
            raise LookupError("the replay left the recorded path")
        text, finish = self.replay[key]
        forced = {k: kwargs[k] for k in ("logprobs", "top_logprobs") if k in kwargs}
        result = await super()._agenerate(messages, None, run_manager, continuation=text, **forced)
        result.generations[0].message.response_metadata["finish_reason"] = finish  # a cut-off step stays one
        return result


async def trajectory_picks(items, index, precisions: list[str], seed: int) -> list[dict]:
    """Per question: the step uncertainties of the float32 run and of its replay in each precision."""
    cfg = make_config(seed=seed)
    models = {p: Replay.embedded(precision=p) for p in dict.fromkeys(["float32", *precisions])}
    recorder = Replay.embedded(precision="float32")
    rows = []
    for n, item in enumerate(items):
        tools = make_corpus_tools(index, doc_ids=item.context_doc_ids)
        recorder.record = {}
        run = await RolloutRunner(recorder, tools).run(item.question, trajectory_id="t0", thread_id=item.id, config=cfg)
        row: dict[str, Any] = {"id": item.id, "steps": len(run["steps"]), "left_path": []}
        row["u"] = {"run": score_steps(run["steps"])}
        for p, model in models.items():
            model.replay = recorder.record
            try:
                again = await RolloutRunner(model, tools).run(
                    item.question, trajectory_id="t0", thread_id=f"{item.id}-{p}", config=cfg
                )
            except LookupError:
                row["left_path"].append(p)
                continue
            for est in ESTIMATORS:
                row["u"][(p, est)] = score_steps(again["steps"], est)
        rows.append(row)
        left = f", the {' and '.join(row['left_path'])} replay left the path" if row["left_path"] else ""
        print(f"[{n + 1}/{len(items)}] {item.id}: {row['steps']} steps{left}", flush=True)
    return rows


def pick_table(rows: list[dict], precision: str, k: int) -> str:
    """Region perplexity moves and pick agreement, float32 replay vs the other precision."""
    kept = [r for r in rows if not {"float32", precision} & set(r["left_path"])]
    lines = [
        f"{len(kept)} of {len(rows)} trajectories compared ({len(rows) - len(kept)} left the recorded path), "
        f"{sum(r['steps'] for r in kept)} steps",
    ]
    run_vs_replay = [
        abs(a["reasoning"] / b["reasoning"] - 1)
        for r in kept
        for a, b in zip(r["u"]["run"], r["u"][("float32", "nll")], strict=True)
        if a.get("reasoning") and b.get("reasoning")
    ]
    lines.append(
        f"float32 run vs its float32 replay, reasoning PPL: max relative move {max(run_vs_replay, default=0):.2e} "
        "(the replay itself: forced text re-tokenised, scored by prefill)"
    )
    lines += ["", "| estimator | region | steps | PPL moved mean | max |", "|---|---|---|---|---|"]
    for est in ESTIMATORS:
        for region in REGIONS:
            moves = [
                abs(b[region] / a[region] - 1)
                for r in kept
                for a, b in zip(r["u"][("float32", est)], r["u"][(precision, est)], strict=True)
                if a.get(region) and b.get(region)
            ]
            if moves:
                lines.append(f"| {est} | {region} | {len(moves)} | {statistics.fmean(moves):.2%} | {max(moves):.2%} |")
    lines += ["", f"| estimator | mode | same picks (k={k}) | same first pick |", "|---|---|---|---|"]
    for est in ESTIMATORS:
        for mode in MODES:
            same = first = 0
            for r in kept:
                a = [s for s, _, _ in select_branch_steps(r["u"][("float32", est)], mode=mode, k=k)]
                b = [s for s, _, _ in select_branch_steps(r["u"][(precision, est)], mode=mode, k=k)]
                same += set(a) == set(b)
                first += a[:1] == b[:1]
            lines.append(f"| {est} | {mode} | {same} / {len(kept)} | {first} / {len(kept)} |")
    return "\n".join(lines)


def main() -> None:
    def extra(ap):
        ap.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"])
        ap.add_argument("--k", type=int, default=2, help="branch points picked per trajectory")

    # --limit N: also compare the branch picks on the first N questions of --dataset; 0 (the
    # default) compares only the scored sequences, so 0 stays allowed here.
    args = arguments(__doc__, limit=0, extra=extra, limit_minimum=0)
    others = [p for p in args.precisions if p != "float32"]
    if args.limit and others:
        items, index = dev_set(args.dataset, args.limit)
        rows = asyncio.run(trajectory_picks(items, index, others, args.seed))
        for precision in others:
            print(f"\n{args.dataset}, float32 vs {precision}:\n{pick_table(rows, precision, args.k)}")
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
