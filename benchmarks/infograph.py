"""Issue 23: the information-state graph: redundancy, graph-shaped reports, crossover (embedded SmolLM2).

Per question (distractor setting: the tools see only the question's ``context_doc_ids``), with the
library's own code paths, all on the same sampled trajectories:

1. ``schedule.run_schedule``: ParallelMuse's N = 8 trajectories (M=1, k=2, T=3, exploration): t0, six
   branches and a fill f0 (a t0 with one fork step: three branches and four fills).
2. Redundancy per trajectory (``infograph``; gold V_eff from ``eval.redundancy``): entities explored,
   effective (by its own answer, and by the gold supporting documents and answer), Γ.
3. Reports: the three-section text report and the graph-shaped one of every answered trajectory
   (``stage2.write_report``), each aggregated over the 8 (``stage2.choose_answer``).
4. Crossover: the same schedule with ``crossover=1`` (the rollout stage runs 7: the same
   trajectories less the last fill), then ``crossover.crossover_stage`` (the pair, the crossover
   trajectory x0, or that fill again when no pair exists), its report, and the aggregation over the
   8; against the plain aggregation over the same 7 (extra tokens) and over the plain 8 (equal budget).

One JSON line per question in ``--out-dir/{dataset}.jsonl``: ids, counts, scores and the model's
answers, no dev-set text (no question, gold answer or report text), and the settings they ran with
(``--seed``), so the rows are committed and a later session's rerun with the same settings skips the
questions they hold (one with another ``--seed`` is refused). The trajectories are checkpointed in
``--work-dir/{dataset}.sqlite`` (``{dataset}.seed{N}.sqlite`` for another ``--seed``; the library's
SQLite checkpointer, never committed): a question rerun after its line is deleted (or after a crash)
reuses its finished trajectories and redoes only what is missing, e.g. the reports after a change of
their format (its crossover trajectory is always redone: a single step that reads the parents'
effective steps). At the end (or with ``--report-only``) the summary of every dataset file in
``--out-dir`` is written: ``summary.md``, ``summary.json`` and ``redundancy.png`` (beside the paper's
Figure 2).

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/infograph.py --dataset hotpotqa_train100 --limit 100
    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/infograph.py --dataset musique_train100 --limit 100
    .venv/bin/python benchmarks/infograph.py --report-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterable
from pathlib import Path
from statistics import mean

from common import DATASETS, arguments, dev_set, resumable_rows

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.aggregate import majority_vote
from langgraph_parallelmuse.config import ParallelMuseConfig, make_config
from langgraph_parallelmuse.crossover import crossover_stage
from langgraph_parallelmuse.driver import GuidedDriver
from langgraph_parallelmuse.eval import (
    QAItem,
    bootstrap_ci,
    format_diff,
    paired_bootstrap_diff,
    retrieval_recall,
    score_answer,
)
from langgraph_parallelmuse.eval.bench import documents_seen
from langgraph_parallelmuse.eval.redundancy import PAPER_FIGURE_2, redundancy_record
from langgraph_parallelmuse.infograph import graph_stats
from langgraph_parallelmuse.lineage import thread_of
from langgraph_parallelmuse.persistence import open_checkpointer
from langgraph_parallelmuse.schedule import run_schedule
from langgraph_parallelmuse.stage2 import choose_answer, write_report
from langgraph_parallelmuse.tools import make_corpus_tools

FORMS = ("text", "graph")
METHODS = ("majority", "pm_text", "pm_graph", "pm7_text", "pm7_graph", "cross_text", "cross_graph")


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out-dir", default="benchmarks/results/infograph", help="rows per dataset and the summary")
    ap.add_argument("--work-dir", default="bench-results/infograph", help="the trajectories' checkpoints")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the summary from the JSONL files")


def configs(seed: int) -> dict[str, ParallelMuseConfig]:
    text = make_config(n=8, m=1, k=2, t=3, mode="exploration", seed=seed)
    return {
        "text": text,
        "graph": make_config(text, report_form="graph"),
        "crossed": make_config(text, crossover=1),
    }


async def _reports(model, item, trajectories, config, guided) -> dict[str, dict]:
    answered = [t for t in trajectories if t["answer"]]
    done = await asyncio.gather(
        *(write_report(model, item.question, t, config=config, guided=guided) for t in answered)
    )
    return {t["id"]: r for t, r in zip(answered, done, strict=True)}


async def _choice(model, item, trajectories, reports, config, guided) -> dict:
    own = [reports[t["id"]] for t in trajectories if t["id"] in reports]
    choice = await choose_answer(model, item.question, trajectories, own, config=config, guided=guided)
    return {
        "answer": choice.answer,
        "source": choice.source,
        "tokens": choice.tokens,
        **score_answer(choice.answer, item.answers),
    }


def _trajectory_record(item: QAItem, t: dict) -> dict:
    seen = documents_seen(t)
    return {
        "kind": t["origin"].get("kind"),
        "origin": t["origin"],
        "answer": t["answer"],
        "status": t["status"],
        "steps": len(t["steps"]),
        "generated_tokens": t["stats"]["generated_tokens"],
        "recall_seen": retrieval_recall(seen, item.supporting_doc_ids),
        **redundancy_record(item.question, t, supporting_doc_ids=item.supporting_doc_ids, answers=item.answers),
        "effective_steps": graph_stats(item.question, t)["effective_steps"],
        **score_answer(t["answer"], item.answers),
    }


async def run_question(model, index, item: QAItem, seed: int, checkpointer=None) -> dict:
    started = time.perf_counter()
    cfg = configs(seed)
    runner = RolloutRunner(model, make_corpus_tools(index, doc_ids=item.context_doc_ids), checkpointer=checkpointer)
    guided = isinstance(runner.driver, GuidedDriver)
    run_id = f"{item.id}/ig"
    r8, _ = await run_schedule(runner, item.question, config=cfg["text"], run_id=run_id)
    # The same schedule with one slot reserved: the same trajectories (same ids, reused) less the
    # last fill (f0 when t0 gives two fork steps; a short t0 gives fewer branches and more fills).
    r7, _ = await run_schedule(runner, item.question, config=cfg["crossed"], run_id=run_id)
    left_out = [t for t in r8 if t["id"] not in {s["id"] for s in r7}]
    if len(r7) != 7 or [t["origin"]["kind"] for t in left_out] != ["fill"]:
        # The comparisons at equal budget read the 7 as the 8 less one fill: anything else measures other runs.
        raise RuntimeError(
            f"{item.id}: the crossover run's rollout stage must be the plain run's 8 trajectories less one fill; "
            f"it ran {len(r7)}, leaving out {[t['id'] for t in left_out]}"
        )
    if checkpointer is not None:
        # The crossover reads the parents' effective steps, which a change of the graph code moves:
        # a rerun question crosses again (one step) rather than reuse a crossing of other steps.
        await checkpointer.adelete_thread(thread_of(run_id, "x0"))
    xs, pairs = await crossover_stage(runner, item.question, r7, config=cfg["crossed"], run_id=run_id)
    rolled = time.perf_counter() - started
    print(
        f"    {item.id}: {len(r8)} trajectories and {len(xs)} crossover-stage ({len(pairs)} pair) in {rolled:.0f}s",
        flush=True,
    )
    everything = {t["id"]: t for t in [*r8, *xs]}
    trajectories = list(everything.values())
    text, graph = await asyncio.gather(*(_reports(model, item, trajectories, cfg[form], guided) for form in FORMS))
    reports = {"text": text, "graph": graph}
    methods = {"majority": {"answer": majority_vote(r8), **score_answer(majority_vote(r8), item.answers)}}
    for form in FORMS:
        for name, group in ((f"pm_{form}", r8), (f"pm7_{form}", r7), (f"cross_{form}", [*r7, *xs])):
            methods[name] = await _choice(model, item, group, reports[form], cfg[form], guided)

    def report_record(r: dict) -> dict:
        return {
            "status": r["status"],
            "tokens": r["tokens"],
            "text_tokens": len(model.get_token_ids(r["text"])),
            "trajectory_tokens": r["trajectory_tokens"],
        }

    return {
        "id": item.id,
        "dataset": item.dataset,
        "seconds": time.perf_counter() - started,
        "rollout_seconds": rolled,
        "trajectories": {tid: _trajectory_record(item, t) for tid, t in everything.items()},
        "reports": {form: {tid: report_record(r) for tid, r in reports[form].items()} for form in FORMS},
        "methods": methods,
        "crossover": {"pairs": pairs, "ids": [t["id"] for t in xs]},
    }


async def run(args: argparse.Namespace) -> None:
    from langgraph_parallelmuse.models import LocalChatModel

    out = Path(args.out_dir) / f"{args.dataset}.jsonl"
    settings = {"dataset": args.dataset, "seed": args.seed}
    # The committed rows record no settings: they were run with the default seed.
    done = {r["id"] for r in resumable_rows(out, settings, unrecorded={"dataset": args.dataset, "seed": 0})}
    items, index = dev_set(args.dataset, args.limit)
    work = Path(args.work_dir)
    for folder in (out.parent, work):
        folder.mkdir(parents=True, exist_ok=True)
    # A finished thread is reused whatever seed asks for it: each seed has its own checkpoints (the
    # default seed keeps the file it had before seeds were told apart).
    saved = work / (f"{args.dataset}.sqlite" if args.seed == 0 else f"{args.dataset}.seed{args.seed}.sqlite")
    model = LocalChatModel.embedded()
    async with open_checkpointer(str(saved)) as saver:
        for n, item in enumerate(items, 1):
            if item.id in done:
                continue
            rec = {**await run_question(model, index, item, args.seed, saver), "settings": settings}
            with out.open("a") as fh:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            m = rec["methods"]
            print(
                f"[{n}/{len(items)}] {item.id}: {rec['seconds']:.0f}s  F1 text {m['pm_text']['f1']:.2f} graph "
                f"{m['pm_graph']['f1']:.2f} cross {m['cross_text']['f1']:.2f}  pairs {len(rec['crossover']['pairs'])}",
                flush=True,
            )


# ----------------------------------------------------------------------------- summary


def _load(out_dir: Path) -> dict[str, list[dict]]:
    sets = {}
    for name in DATASETS:
        path = out_dir / f"{name}.jsonl"
        if path.exists():
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            sets[name] = [json.loads(line) for line in lines]
    return sets


def _ci(values: list[float]) -> str:
    m, lo, hi = bootstrap_ci(values)
    return f"{m:.3f} [{lo:.2f}, {hi:.2f}]"


def _diff(a: list[float], b: list[float]) -> str:
    return format_diff(*paired_bootstrap_diff(a, b))


def redundancy_rows(records: list[dict]) -> dict[str, dict[str, float | None]]:
    """Mean entities explored / effective (own answer, gold) and Γ per trajectory, by origin."""
    groups = {
        "all": lambda t: t["kind"] != "crossover",
        "from scratch": lambda t: t["kind"] in ("initial", "fill"),
        "branches": lambda t: t["kind"] == "branch",
    }
    out = {}
    for label, keep in groups.items():
        trajs = [t for r in records for t in r["trajectories"].values() if keep(t)]
        if not trajs:
            continue
        out[label] = {
            "trajectories": len(trajs),
            "entities": mean(t["entities"] for t in trajs),
            "effective": mean(t["effective_entities"] for t in trajs),
            "gold_effective": mean(t["gold_effective_entities"] for t in trajs),
            **{key: _mean_of(t[key] for t in trajs) for key in ("redundancy", "gold_redundancy")},
        }
    return out


def _mean_of(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not ``None`` (a trajectory without entities has no Γ); ``None`` if none."""
    known = [v for v in values if v is not None]
    return mean(known) if known else None


def _per_question_gap(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """Per question, mean Γ of the branches and of the from-scratch trajectories (questions with both)."""
    branch, scratch = [], []
    for r in records:
        b = [t[key] for t in r["trajectories"].values() if t["kind"] == "branch" and t[key] is not None]
        s = [t[key] for t in r["trajectories"].values() if t["kind"] in ("initial", "fill") and t[key] is not None]
        if b and s:
            branch.append(mean(b))
            scratch.append(mean(s))
    return branch, scratch


def _gamma(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _redundancy_lines(records: list[dict], rows: dict) -> list[str]:
    lines = [
        "| trajectories | n | entities explored | effective (own answer) | effective (gold) | Γ own | Γ gold |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, row in rows.items():
        lines.append(
            f"| {label} | {row['trajectories']} | {row['entities']:.1f} | {row['effective']:.1f} | "
            f"{row['gold_effective']:.1f} | {_gamma(row['redundancy'])} | {_gamma(row['gold_redundancy'])} |"
        )
    for key in ("redundancy", "gold_redundancy"):
        b, s = _per_question_gap(records, key)
        if b:
            lines.append(f"\nΓ ({key}) branches − from scratch, paired by question ({len(b)}): {_diff(b, s)}")
    return lines


def _report_lines(records: list[dict]) -> list[str]:
    lines = [
        "| reports | text tokens/report | generated/report | fallback | graph < text (all; text not fallen back) |",
        "|---|---|---|---|---|",
    ]
    pairs = [(r["reports"]["graph"][tid], r["reports"]["text"][tid]) for r in records for tid in r["reports"]["graph"]]
    shorter = [g["text_tokens"] < t["text_tokens"] for g, t in pairs]
    # A fallback text report is the bare answer line: shorter than anything that carries evidence.
    shorter_ok = [g["text_tokens"] < t["text_tokens"] for g, t in pairs if t["status"] == "ok"]
    for form in FORMS:
        reps = [rep for r in records for rep in r["reports"][form].values()]
        if reps:
            lines.append(
                f"| {form} | {mean(x['text_tokens'] for x in reps):.1f} | {mean(x['tokens'] for x in reps):.1f} | "
                f"{sum(x['status'] == 'fallback' for x in reps)}/{len(reps)} | "
                + (
                    f"{sum(shorter) / len(shorter):.0%}; {sum(shorter_ok) / max(len(shorter_ok), 1):.0%} |"
                    if form == "graph" and shorter
                    else "— |"
                )
            )
    return [*lines, "", _longer_line(records)]


def _longer_line(records: list[dict]) -> str:
    """Which graph reports are not shorter than their text report, by the size of the effective subgraph.

    The graph report names every effective entity and relation; the text report's facts are one
    line per tool call whatever the subgraph holds.
    """
    rows = [
        (r["trajectories"][tid]["effective_entities"], g["text_tokens"] - r["reports"]["text"][tid]["text_tokens"])
        for r in records
        for tid, g in r["reports"]["graph"].items()
        if tid in r["reports"]["text"]
    ]
    longer = [e for e, gap in rows if gap >= 0]
    shorter = [e for e, gap in rows if gap < 0]
    if not longer or not shorter:
        return f"Graph reports not shorter than their text report: {len(longer)}/{len(rows)}."
    bands = []
    for lo, hi in ((0, 5), (6, 8), (9, None)):
        band = [gap for e, gap in rows if e >= lo and (hi is None or e <= hi)]
        if band:
            label = f"{lo}–{hi}" if hi is not None else f"{lo}+"
            shorter_in_band = sum(g < 0 for g in band)
            bands.append(f"{label}: {shorter_in_band}/{len(band)} shorter, graph − text {mean(band):+.0f} tokens")
    return (
        f"Graph reports not shorter than their text report: {len(longer)}/{len(rows)}; their effective subgraph "
        f"holds {mean(longer):.1f} entities, the shorter ones' {mean(shorter):.1f}. By effective entities: "
        + "; ".join(bands)
        + "."
    )


def _method_lines(records: list[dict]) -> list[str]:
    lines = ["| method | EM | F1 | contains |", "|---|---|---|---|"]
    for m in METHODS:
        cells = [_ci([r["methods"][m][k] for r in records]) for k in ("em", "f1", "contains")]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "| paired difference | F1 | contains |", "|---|---|---|"]
    for a, b, label in (
        ("pm_graph", "pm_text", "graph-shaped − three-section reports (same 8 trajectories)"),
        ("cross_text", "pm7_text", "crossover − plain aggregation, same 7 trajectories (text reports)"),
        ("cross_text", "pm_text", "crossover − plain aggregation, equal budget N=8 (text reports)"),
        ("cross_graph", "pm7_graph", "crossover − plain aggregation, same 7 trajectories (graph reports)"),
    ):
        cells = [
            _diff([r["methods"][a][k] for r in records], [r["methods"][b][k] for r in records])
            for k in ("f1", "contains")
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _crossover_line(records: list[dict]) -> str:
    crossed = [r for r in records if r["crossover"]["pairs"]]
    extra = [
        r["trajectories"]["x0"]["generated_tokens"] + r["reports"]["text"].get("x0", {}).get("tokens", 0)
        for r in crossed
    ]
    reasons = [p["reason"] for r in crossed for p in r["crossover"]["pairs"]]
    return (
        f"\nCrossover ran on {len(crossed)}/{len(records)} questions ({reasons.count('disagree')} disagreeing "
        f"pairs, {reasons.count('evidence')} with complementary evidence; the others had no pair and filled the "
        "slot with the plain run's last fill); extra generated tokens per crossover (trajectory + text report): "
        + (f"{mean(extra):.1f}" if extra else "—")
        + f"; mean seconds per question {mean(r['seconds'] for r in records):.0f}.\n"
    )


def summarize(sets: dict[str, list[dict]]) -> tuple[str, dict]:
    lines, data = [], {}
    for name, records in sets.items():
        rows = redundancy_rows(records)
        data[name] = {"questions": len(records), "redundancy": rows}
        lines += [f"## {name}: {len(records)} questions", "", *_redundancy_lines(records, rows), ""]
        lines += [*_report_lines(records), "", *_method_lines(records), _crossover_line(records)]
    return "\n".join(lines), data


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(PAPER_FIGURE_2)
    explored = [PAPER_FIGURE_2[k][0] for k in labels]
    effective = [PAPER_FIGURE_2[k][1] for k in labels]
    for name, entry in data.items():
        row = entry["redundancy"].get("all")
        if row:
            for kind, key in (("own", "effective"), ("gold", "gold_effective")):
                labels.append(f"{name.split('_')[0]} SmolLM2-135M ({kind})")
                explored.append(row["entities"])
                effective.append(row[key])
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    x = range(len(labels))
    left.bar([i - 0.2 for i in x], explored, width=0.4, label="explored")
    left.bar([i + 0.2 for i in x], effective, width=0.4, label="effective")
    left.set_yscale("log")
    left.set_ylabel("mean entities per trajectory (log)")
    left.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=8)
    left.legend()
    # A set whose trajectories found no entity has no Γ: no bar, rather than a ZeroDivisionError.
    gammas = [1 - e / a if a else float("nan") for a, e in zip(explored, effective, strict=True)]
    colors = ["tab:gray"] * len(PAPER_FIGURE_2) + ["tab:blue"] * (len(labels) - len(PAPER_FIGURE_2))
    right.bar(list(x), gammas, color=colors)
    right.set_ylim(0, 1)
    right.set_ylabel("Γ = 1 − |V_eff| / |V_total| (of the means)")
    right.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=8)
    right.set_title("grey: the paper's Figure 2 (GPT-4.1 extraction); blue: this library")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(out_dir: Path) -> None:
    sets = _load(out_dir)
    if not sets:
        raise SystemExit(f"no results in {out_dir}: run a dataset first")
    text, data = summarize(sets)
    (out_dir / "summary.md").write_text(text + "\n")
    (out_dir / "summary.json").write_text(json.dumps(data, indent=2))
    plot(data, out_dir / "redundancy.png")
    print(text)


def main() -> None:
    args = arguments(__doc__, limit=10, extra=options)
    if not args.report_only:
        asyncio.run(run(args))
    report(Path(args.out_dir))


if __name__ == "__main__":
    main()
