"""The embedded agent (SmolLM2 + guided driver), one trajectory per question, and its report.

One trajectory per question, run one after another so seconds per trajectory are meaningful;
each trajectory is then compressed (guided Stage 2 map step) to count reports that fall back.
Rows go to ``--out`` as they finish, each with the settings it ran with (``--dataset``, ``--seed``,
``--max-turns``, ``--guided``); a rerun with the same settings skips the questions already there,
one with other settings is refused (so is a file whose rows record none). The library is whatever
``langgraph_parallelmuse`` imports, so the same script measures another revision when
``PYTHONPATH`` points at its worktree; ``--pair BASE NEW`` then compares two row files question by
question with paired bootstrap intervals, the pairs in dev-set order whatever order the files hold
them in. ``--start`` skips the first questions (two processes split a set),
``--kinds`` runs only questions of some answer kinds, and ``--trace`` writes each question's last
evidence and options (dev-set text, for replaying the choice offline; never committed)::

    .venv/bin/python benchmarks/agent_protocol.py --limit 100 --out bench-results/agent/hotpotqa-new.jsonl
    PYTHONPATH=<worktree of the old revision> .venv/bin/python benchmarks/agent_protocol.py \\
        --limit 100 --out bench-results/agent/hotpotqa-old.jsonl
    .venv/bin/python benchmarks/agent_protocol.py --pair bench-results/agent/hotpotqa-{old,new}.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from dataclasses import fields
from pathlib import Path

from common import DATASETS, arguments, dev_set, resumable_rows

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.candidates import answer_kind
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.driver import GuidedDriver, StepContext
from langgraph_parallelmuse.eval import eval_data_dir, load_questions, paired_bootstrap_diff, within_noise
from langgraph_parallelmuse.eval.bench import documents_seen, well_formed
from langgraph_parallelmuse.eval.scoring import contains_gold, exact_match, retrieval_recall, score_answer
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.stage2 import write_report
from langgraph_parallelmuse.tools import make_corpus_tools

METRICS = ("em", "f1", "contains", "well_formed", "fallback", "steps", "recall_seen", "recall_opened")


def _hops(item_id: str) -> int | None:
    """MuSiQue ids name the hop count (``2hop__…``, ``3hop1__…``); HotpotQA's do not."""
    m = re.match(r"(\d)hop", item_id)
    return int(m.group(1)) if m else None


def _setting(text: str) -> tuple[str, int | float]:
    """``candidate_limit=32`` → a guided-driver option and its number."""
    key, _, value = text.partition("=")
    if key not in {f.name for f in fields(GuidedDriver)} or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=NUMBER, NAME one of GuidedDriver's fields")
    return key, float(value) if "." in value else int(value)


async def _row(model: LocalChatModel, item, index, cfg, driver: GuidedDriver, trace: Path | None) -> dict:
    runner = RolloutRunner(model, make_corpus_tools(index, doc_ids=item.context_doc_ids), driver=driver)
    t0 = time.perf_counter()
    traj = await runner.run(item.question, trajectory_id="t0", thread_id=item.id, config=cfg)
    seconds = time.perf_counter() - t0
    report = await write_report(model, item.question, traj, config=cfg, guided=True)  # the library's map step
    seen = documents_seen(traj)
    # Where a wrong answer was lost (evaluation only, gold never reaches the agent): the gold
    # answer in what the trajectory read, in the evidence its answer prompt showed, among the
    # options of its last choice.
    final = StepContext(item.question, traj["steps"], traj["observations"], len(traj["steps"]), True, 0)
    read = " ".join(o["content"] for o in traj["observations"] if not o["error"])
    options = driver.options(final, driver.question(final))
    evidence = driver.evidence(final)
    opened = documents_seen(traj, "visit")
    if trace is not None:
        # Dev-set text: for replaying the last choice offline (``candidates``), never committed.
        with trace.open("a") as f:
            f.write(
                json.dumps(
                    {
                        "id": item.id,
                        "question": item.question,
                        "answers": item.answers,
                        "evidence": evidence,
                        "options": options,
                        "answer": traj["answer"],
                    }
                )
                + "\n"
            )
    return {
        "id": item.id,
        "hops": _hops(item.id),
        "answer": traj["answer"],
        "well_formed": well_formed(traj),
        "steps": len(traj["steps"]),
        "searches": sum(o["name"] == "search" for o in traj["observations"]),
        "bridges": sum("bridge" in s for s in traj["steps"]),
        "generated": traj["stats"]["generated_tokens"],
        "recall_seen": retrieval_recall(seen, item.supporting_doc_ids),
        "recall_opened": retrieval_recall(opened, item.supporting_doc_ids),
        "fallback": report["status"] == "fallback",
        "report_ratio": report["tokens"] / max(report["trajectory_tokens"], 1),
        "seconds": seconds,
        "gold_read": contains_gold(read, item.answers),
        "gold_evidence": contains_gold(evidence, item.answers),
        "gold_option": max((exact_match(o, item.answers) for o in options), default=0.0),
        "options": len(options),
        **score_answer(traj["answer"], item.answers),
    }


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(float(r[key]) for r in rows) if rows else float("nan")


def summary(rows: list[dict]) -> str:
    """The table of one run (and steps per hop count when the ids carry it)."""
    lines = ["| metric | value |", "|---|---|", f"| questions | {len(rows)} |"]
    for key in ("well_formed", "em", "f1", "contains", "fallback", "report_ratio", "steps", "searches", "bridges"):
        lines.append(f"| {key} | {_mean(rows, key):.3f} |")
    for key in ("gold_read", "gold_evidence", "gold_option", "options"):
        if any(key in r for r in rows):
            lines.append(f"| {key} | {_mean([r for r in rows if key in r], key):.3f} |")
    for key in ("recall_seen", "recall_opened", "generated", "seconds"):
        lines.append(f"| {key} | {_mean(rows, key):.2f} |")
    for hops in sorted({r["hops"] for r in rows if r.get("hops")}):
        group = [r for r in rows if r.get("hops") == hops]
        lines.append(f"| steps, {hops}-hop ({len(group)} q) | {_mean(group, 'steps'):.2f} |")
    return "\n".join(lines)


def dev_order(ids: list[str]) -> list[str]:
    """``ids`` in the order of the dev set that holds them all (sorted when none does)."""
    for name in DATASETS:
        path = eval_data_dir() / f"{name}.questions.jsonl"
        position = {item.id: n for n, item in enumerate(load_questions(path))} if path.exists() else {}
        if all(i in position for i in ids):
            return sorted(ids, key=position.__getitem__)
    return sorted(ids)


def pair(base_file: Path, new_file: Path) -> str:
    """New minus base on the questions both files hold, with 95 % paired bootstrap intervals.

    The bootstrap resamples positions, so the pairs stand in one fixed order (the dev set's): a
    resumed or partly rerun file, whose late rows stand at its end, gives the same intervals.
    """
    base = {r["id"]: r for r in map(json.loads, base_file.read_text().splitlines())}
    new = {r["id"]: r for r in map(json.loads, new_file.read_text().splitlines())}
    ids = dev_order([i for i in new if i in base])
    if not ids:
        raise SystemExit(f"{base_file} and {new_file} hold no question in common: nothing to pair")
    lines = [
        f"paired on {len(ids)} questions: {new_file.name} - {base_file.name}",
        "",
        "| metric | base | new | diff [95% CI] | |",
    ]
    lines.append("|---|---|---|---|---|")
    for key in METRICS:
        a, b = [float(new[i][key]) for i in ids], [float(base[i][key]) for i in ids]
        diff, low, high = paired_bootstrap_diff(a, b)
        verdict = "noise" if within_noise(low, high) else "beyond noise"
        means = f"{statistics.fmean(b):.3f} | {statistics.fmean(a):.3f}"
        lines.append(f"| {key} | {means} | {diff:+.3f} [{low:+.3f}, {high:+.3f}] | {verdict} |")
    return "\n".join(lines)


async def main() -> None:
    def extra(ap):
        ap.add_argument(
            "--out", type=Path, help="JSONL of rows (appended; a rerun with the same settings skips questions there)"
        )
        ap.add_argument("--pair", nargs=2, type=Path, metavar=("BASE", "NEW"), help="compare two row files")
        ap.add_argument(
            "--guided",
            type=_setting,
            action="append",
            default=[],
            metavar="NAME=NUMBER",
            help="a guided-driver setting other than its default (repeatable), e.g. candidate_limit=32",
        )
        ap.add_argument("--max-turns", type=int, help="think steps per trajectory (default: the config's)")
        ap.add_argument("--start", type=int, default=0, help="skip the first START questions (to split a set)")
        ap.add_argument("--kinds", nargs="+", help="only questions of these answer kinds (e.g. yesno choice)")
        ap.add_argument("--trace", type=Path, help="JSONL of each question's last evidence and options (dev-set text)")

    args = arguments(__doc__, limit=30, extra=extra)
    if args.pair:
        print(pair(*args.pair))
        return
    items, index = dev_set(args.dataset, args.limit)
    cfg = make_config(seed=args.seed, **({"max_turns": args.max_turns} if args.max_turns else {}))
    driver = GuidedDriver(**dict(args.guided))
    settings = {"dataset": args.dataset, "seed": args.seed, "max_turns": cfg.max_turns, "guided": dict(args.guided)}
    rows = resumable_rows(args.out, settings)
    done = {r["id"] for r in rows}
    model = LocalChatModel.embedded()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    for n, item in enumerate(items, 1):
        if item.id in done or n <= args.start or (args.kinds and answer_kind(item.question) not in args.kinds):
            continue
        row = {**await _row(model, item, index, cfg, driver, args.trace), "settings": settings}
        rows.append(row)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
        print(
            f"[{n:3}/{len(items)}] {row['seconds']:5.1f}s steps={row['steps']} f1={row['f1']:.2f} "
            f"fallback={row['fallback']!s:5} gold={item.answers[0]!r}",
            flush=True,
        )
    print("\n" + summary(rows))


if __name__ == "__main__":
    asyncio.run(main())
