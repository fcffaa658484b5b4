"""Benchmark harness: ParallelMuse against its baselines at an equal budget, on the same samples.

Per question, N from-scratch trajectories are sampled once. They serve every method that needs
from-scratch samples (no scaling, majority, DeepConf weighted vote, max #tool calls, aggregation
only), trajectory 0 is the initial trajectory M=1 of partial rollout, and the fill-ins of partial
rollout are from-scratch trajectories 1, 2, … (they are from-scratch samples by definition), so
differences between methods are paired. Each partial-rollout mode then adds only its k·T branches.
Reports are written once per trajectory and shared by every method that aggregates it.

Results are appended to a JSONL file one question at a time; a rerun skips finished questions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_parallelmuse.agent import RolloutRunner, pick_driver
from langgraph_parallelmuse.aggregate import BASELINES, aggregate_reports
from langgraph_parallelmuse.compress import compress_trajectory
from langgraph_parallelmuse.config import ParallelMuseConfig, make_config
from langgraph_parallelmuse.driver import GuidedDriver
from langgraph_parallelmuse.eval.datasets import QAItem
from langgraph_parallelmuse.eval.scoring import retrieval_recall, score_answer
from langgraph_parallelmuse.eval.stats import bootstrap_ci, paired_bootstrap_diff, within_noise
from langgraph_parallelmuse.state import Origin, Trajectory
from langgraph_parallelmuse.uncertainty import select_branch_steps

METRICS = ("em", "f1", "contains")


@dataclass(frozen=True)
class BenchSettings:
    """What to run per question (paper defaults: N=8, M=1, k=2, T=3)."""

    n: int = 8
    k: int = 2
    t: int = 3
    modes: tuple[str, ...] = ("exploration", "reasoning", "mixed")
    estimator: str = "nll"
    seed: int = 0
    setting: str = "distractor"  # or "open": the whole corpus
    aggregate: bool = True  # compress + aggregate (ParallelMuse, aggregation only)
    max_turns: int = 6
    extra: dict[str, Any] = field(default_factory=dict)  # more ParallelMuseConfig fields

    def config(self, mode: str = "exploration") -> ParallelMuseConfig:
        return make_config(
            n=self.n,
            m=1,
            k=self.k,
            t=self.t,
            mode=mode,
            estimator=self.estimator,
            seed=self.seed,
            max_turns=self.max_turns,
            **self.extra,
        )


def _seen(traj: Trajectory, kind: str | None = None) -> list[str]:
    return [d for o in traj["observations"] if kind is None or o["name"] == kind for d in o.get("doc_ids", [])]


def _cost(trajs: Sequence[Trajectory], reports: dict[str, dict] | None = None) -> dict[str, float]:
    keys = ("generated_tokens", "prompt_tokens", "reused_prefix_tokens", "cached_prompt_tokens", "tool_calls")
    out = {k: float(sum(t["stats"][k] for t in trajs)) for k in keys}
    if reports is not None:
        out["report_tokens"] = float(sum(reports[t["id"]]["tokens"] for t in trajs if t["id"] in reports))
    return out


async def run_question(
    model: BaseChatModel,
    tools: Sequence,
    item: QAItem,
    settings: BenchSettings,
    *,
    guided: GuidedDriver | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Run every method on one question and score it. Returns one JSON-able record."""

    def note(stage: str) -> None:
        if log is not None:
            log(f"    {item.id}: {stage} ({time.perf_counter() - started:.0f}s)")

    base = settings.config()
    runner = RolloutRunner(model, tools, driver=pick_driver(model, base.driver, guided), checkpointer=InMemorySaver())
    started = time.perf_counter()
    scratch = await asyncio.gather(
        *(
            runner.run(item.question, trajectory_id=f"t{i}", thread_id=f"{item.id}/t{i}", config=base)
            for i in range(settings.n)
        )
    )
    timings = {"scratch_rollout": time.perf_counter() - started}
    note(f"{settings.n} from-scratch trajectories")
    initial = scratch[0]
    sets: dict[str, list[Trajectory]] = {"scratch": list(scratch)}
    picks_by_mode: dict[str, list] = {}
    for mode in settings.modes:
        cfg = settings.config(mode)
        picks = select_branch_steps(initial["uncertainty"], mode=mode, k=settings.k)
        picks_by_mode[mode] = picks
        t0 = time.perf_counter()
        branches = await asyncio.gather(
            *(
                runner.fork(
                    initial,
                    step,
                    trajectory_id=f"{mode[:3]}.s{step}.b{j}",
                    thread_id=f"{item.id}/{mode}.s{step}.b{j}",
                    config=cfg,
                    origin=Origin(kind="branch", region=region, score=score, round=1),
                )
                for step, region, score in picks
                for j in range(settings.t)
            )
        )
        timings[f"branches_{mode}"] = time.perf_counter() - t0
        note(f"{len(branches)} {mode} branches")
        fills = list(scratch[1 : 1 + settings.n - 1 - len(branches)])
        sets[f"partial_{mode}"] = [initial, *branches, *fills]
    trajectories = {t["id"]: t for group in sets.values() for t in group}

    reports: dict[str, dict] = {}
    answers: dict[str, dict[str, Any]] = {}
    guided_reports = isinstance(runner.driver, GuidedDriver)
    if settings.aggregate:
        t0 = time.perf_counter()
        todo = [t for t in trajectories.values() if t["answer"]]
        done = await asyncio.gather(
            *(
                compress_trajectory(
                    model,
                    item.question,
                    t,
                    guided=guided_reports,
                    max_report_tokens=base.max_report_tokens,
                    seed=settings.seed,
                )
                for t in todo
            )
        )
        reports = {r["trajectory_id"]: dict(r) for r in done}
        timings["compress"] = time.perf_counter() - t0
        note(f"{len(done)} reports")
        for name, group in [("aggregation_only", sets["scratch"])] + [
            (f"parallelmuse_{m}", sets[f"partial_{m}"]) for m in settings.modes
        ]:
            group_reports = [reports[t["id"]] for t in group if t["id"] in reports]
            result = await aggregate_reports(
                model, item.question, group_reports, guided=guided_reports, seed=settings.seed
            )
            answers[name] = {
                "answer": result.answer,
                "source": result.source,
                "aggregate_tokens": result.tokens,
                "trajectories": [t["id"] for t in group],
            }
    for name, fn in BASELINES.items():
        answers[name] = {"answer": fn(sets["scratch"]), "source": name, "trajectories": [t["id"] for t in scratch]}
    for mode in settings.modes:
        group = sets[f"partial_{mode}"]
        answers[f"partial_{mode}"] = {
            "answer": BASELINES["majority"](group),
            "source": "majority",
            "trajectories": [t["id"] for t in group],
        }

    methods: dict[str, dict[str, Any]] = {}
    for name, rec in answers.items():
        group = [trajectories[i] for i in rec["trajectories"]]
        methods[name] = {
            **rec,
            **score_answer(rec["answer"], item.answers),
            "cost": _cost(group, reports if name.startswith(("parallelmuse", "aggregation")) else None),
        }
    for set_name, group in sets.items():  # "no scaling": the average single trajectory
        label = "no_scaling" if set_name == "scratch" else f"single_{set_name}"
        per = [score_answer(t["answer"], item.answers) for t in group]
        methods[label] = {
            "answer": None,
            "trajectories": [t["id"] for t in group],
            **{m: sum(p[m] for p in per) / len(per) for m in METRICS},
            "cost": _cost(group),
        }

    support = item.supporting_doc_ids
    return {
        "id": item.id,
        "question": item.question,
        "answers": item.answers,
        "dataset": item.dataset,
        "setting": settings.setting,
        "seconds": time.perf_counter() - started,
        "timings": timings,
        "picks": {m: [list(p) for p in ps] for m, ps in picks_by_mode.items()},
        "methods": methods,
        "reports": {
            k: {f: v[f] for f in ("answer", "tokens", "trajectory_tokens", "status")} for k, v in reports.items()
        },
        "trajectories": {
            t["id"]: {
                "answer": t["answer"],
                "status": t["status"],
                "origin": t["origin"],
                "stats": t["stats"],
                "uncertainty": t["uncertainty"],
                "steps": len(t["steps"]),
                "well_formed": bool(t["answer"]) and any(o["name"] == "search" for o in t["observations"]),
                "recall_seen": retrieval_recall(_seen(t), support) if support else None,
                "recall_opened": retrieval_recall(_seen(t, "visit"), support) if support else None,
                **score_answer(t["answer"], item.answers),
            }
            for t in trajectories.values()
        },
    }


def load_done(path: Path) -> dict[str, dict]:
    """Finished question records of an earlier (possibly interrupted) run, by question id."""
    done: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash: that question reruns
                    continue
                done[rec["id"]] = rec
    return done


def summarize(records: Sequence[dict], *, baseline: str = "majority", seed: int = 0) -> dict[str, dict]:
    """Mean and bootstrap 95% interval per method and metric, paired differences vs ``baseline``."""
    names = sorted({m for r in records for m in r["methods"]})
    out: dict[str, dict] = {}
    for name in names:
        rows = [r for r in records if name in r["methods"]]
        entry: dict[str, Any] = {"questions": len(rows)}
        for metric in METRICS:
            values = [r["methods"][name][metric] for r in rows]
            entry[metric] = bootstrap_ci(values, seed=seed)
            if baseline in rows[0]["methods"] and name != baseline:
                paired = [r for r in rows if baseline in r["methods"]]
                diff = paired_bootstrap_diff(
                    [r["methods"][name][metric] for r in paired],
                    [r["methods"][baseline][metric] for r in paired],
                    seed=seed,
                )
                entry[f"{metric}_vs_{baseline}"] = diff + (within_noise(diff[1], diff[2]),)
        for key in ("generated_tokens", "prompt_tokens", "reused_prefix_tokens", "report_tokens", "tool_calls"):
            vals = [r["methods"][name]["cost"].get(key) for r in rows]
            if all(v is not None for v in vals):
                entry[key] = sum(vals) / len(vals)
        out[name] = entry
    return out


def markdown_table(summary: dict[str, dict], *, baseline: str = "majority") -> str:
    """The summary as a Markdown table (mean [95% CI]; Δ vs baseline, '~' = within noise)."""
    head = (
        "| method | EM | F1 | contains | ΔF1 vs " + baseline + " | gen. tokens/q | report tokens/q"
        " | tool calls/q |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]

    def ci(entry: dict, m: str) -> str:
        mean, lo, hi = entry[m]
        return f"{mean:.3f} [{lo:.2f}, {hi:.2f}]"

    for name, e in summary.items():
        delta = e.get(f"f1_vs_{baseline}")
        dtxt = (
            "—" if delta is None else f"{delta[0]:+.3f} [{delta[1]:+.2f}, {delta[2]:+.2f}]" + (" ~" if delta[3] else "")
        )
        lines.append(
            f"| {name} | {ci(e, 'em')} | {ci(e, 'f1')} | {ci(e, 'contains')} | {dtxt} | "
            f"{e.get('generated_tokens', 0):.0f} | {e.get('report_tokens', 0) or 0:.0f} | "
            f"{e.get('tool_calls', 0):.1f} |"
        )
    return "\n".join(lines)


async def run_bench(
    model: BaseChatModel,
    index: Any,
    items: Sequence[QAItem],
    settings: BenchSettings,
    out: Path,
    *,
    concurrency: int = 1,
    progress: Any = None,
    log: Any = None,
) -> list[dict]:
    """Run (or continue) a benchmark, appending one JSON line per finished question."""
    from langgraph_parallelmuse.tools import make_corpus_tools

    out.parent.mkdir(parents=True, exist_ok=True)
    done = load_done(out)
    records = [done[i.id] for i in items if i.id in done]
    todo = [i for i in items if i.id not in done]
    sem = asyncio.Semaphore(concurrency)
    lock = asyncio.Lock()

    async def one(item: QAItem) -> None:
        async with sem:
            subset = item.context_doc_ids if settings.setting == "distractor" else None
            rec = await run_question(model, make_corpus_tools(index, doc_ids=subset), item, settings, log=log)
            rec["settings"] = asdict(settings)
            async with lock:
                with out.open("a") as fh:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                records.append(rec)
                if progress is not None:
                    progress(rec)

    await asyncio.gather(*(one(i) for i in todo))
    order = {i.id: n for n, i in enumerate(items)}
    return sorted(records, key=lambda r: order.get(r["id"], 0))
