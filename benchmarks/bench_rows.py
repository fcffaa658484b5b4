r"""Keep a ``parallelmuse bench`` run's finished questions in the repo, without dev-set text, so that
a later session continues it: ``make bench-full``'s 100 + 100 questions take about 16 core-hours,
more than a session has, and a run directory (``bench-results/``, ignored by git) does not outlive it.

    .venv/bin/python benchmarks/bench_rows.py store bench-results/s50/hotpot100 --dataset hotpotqa_train100 \
        --revision fce1263
    .venv/bin/python benchmarks/bench_rows.py restore bench-results/s51/hotpot100 --dataset hotpotqa_train100

``store`` merges the finished records of the run directory's ``results.jsonl`` into
``benchmarks/results/bench/{dataset}.jsonl`` (a question in both: the run's record), in dev-set order.
A stored record is the run's less its question and gold answers, and with each tool call's
arguments replaced by a digest: queries quote the question and visits name the corpus's titles, and
nothing reads a call but for equality (sibling diversity), which the digest keeps. What is left is
ids, settings, counts, timings, scores and the model's own answers, and ``revision``: the commit
whose code ran the questions (``--revision``; the bench records its settings, not its code).

``restore`` appends the stored records that the run directory's ``results.jsonl`` lacks (creating
it), each with its question and gold answers taken again from the dev set by id. The bench command
that made them, run with that ``--out``, then runs only the questions left (it refuses records run
with other settings, naming them), and ``--report-only`` summarises every finished question. When
the library's code differs from a restored record's revision, it says so: one table must come from
one agent, so check first that the change leaves trajectories as they were
(``benchmarks/compare_revisions.py REV HEAD --limit 4``), or start the run again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from common import DATASETS, ROOT
from compare_revisions import commit_of

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.eval import QAItem, eval_data_dir, load_questions
from langgraph_parallelmuse.eval.bench import load_done

STORE = ROOT / "benchmarks" / "results" / "bench"
# The fields of a record that hold dev-set text, put back by ``restore``.
_DEV_TEXT = ("question", "answers")


def stripped(record: dict) -> dict:
    """A bench record without dev-set text: no question or gold answers, its tool calls as digests.

    Example:
        >>> call = [0, '["search", {"query": "where is the eiffel tower"}]']
        >>> record = {"id": "q1", "question": "Where?", "answers": ["Paris"], "trajectories": {"t0": {"calls": [call]}}}
        >>> row = stripped(record)
        >>> sorted(row), row["trajectories"]["t0"]["calls"][0][0], len(row["trajectories"]["t0"]["calls"][0][1])
        (['id', 'trajectories'], 0, 16)
    """
    row = {k: v for k, v in record.items() if k not in _DEV_TEXT}
    row["trajectories"] = {
        tid: {**t, "calls": [[step, _digest(key)] for step, key in t.get("calls", [])]}
        for tid, t in record.get("trajectories", {}).items()
    }
    return row


def _digest(call_key: str) -> str:
    return hashlib.sha256(call_key.encode()).hexdigest()[:16]


def restored(row: dict, item: QAItem) -> dict:
    """A stored row with its question and gold answers again, in a bench record's field order."""
    return {"id": row["id"], "question": item.question, "answers": item.answers, **row}


def _write(path: Path, records: Sequence[dict], *, append: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def store(run_dir: Path, items: Sequence[QAItem], target: Path, *, revision: str) -> tuple[int, int]:
    """Merge the finished records of ``run_dir``, run by the code of commit ``revision`` (but those
    ``restore`` put there), into ``target``; returns (records the run added, rows now stored).

    Raises:
        ConfigError: ``run_dir`` holds no finished question of ``items``.
    """
    run = load_done(run_dir / "results.jsonl")
    if not any(i.id in run for i in items):
        raise ConfigError(
            f"{run_dir / 'results.jsonl'} holds no finished question of this dev set: is it the run's --out?"
        )
    kept = load_done(target)
    rows = [_row(run[i.id], revision) if i.id in run else kept[i.id] for i in items if i.id in run or i.id in kept]
    _write(target, rows)
    return sum(i.id in run and "revision" not in run[i.id] for i in items), len(rows)


def _row(record: dict, revision: str) -> dict:
    """A run's record as stored: one ``restore`` put back (it has its ``revision``) is stored already,
    and keeps the revision that ran it and its digests (digested again, its calls would change)."""
    if "revision" in record:
        return {k: v for k, v in record.items() if k not in _DEV_TEXT}
    return {**stripped(record), "revision": revision}


def restore(run_dir: Path, items: Sequence[QAItem], source: Path) -> tuple[int, list[str]]:
    """Append to ``run_dir``'s ``results.jsonl`` the stored records it lacks; returns how many, and
    the revisions of those records whose library code differs from the working tree's.

    Raises:
        ConfigError: Nothing is stored at ``source``.
    """
    if not source.is_file():
        raise ConfigError(f"{source}: nothing stored for this dev set yet (run `store` after a bench run)")
    stored, results = load_done(source), run_dir / "results.jsonl"
    have = load_done(results)
    added = [restored(stored[i.id], i) for i in items if i.id in stored and i.id not in have]
    if added:
        _write(results, added, append=True)
    return len(added), [rev for rev in sorted({r.get("revision") or "unrecorded" for r in added}) if _changed(rev)]


def _changed(revision: str) -> bool:
    """Whether the library's code in the working tree differs from ``revision``'s (unrecorded: unknown, so yes)."""
    if revision == "unrecorded":
        return True
    diff = ["git", "-C", str(ROOT), "diff", "--quiet", revision, "--", "langgraph_parallelmuse"]
    return subprocess.run(diff, capture_output=True).returncode != 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("action", choices=("store", "restore"))
    ap.add_argument("run_dir", type=Path, help="the bench run's --out directory")
    ap.add_argument("--dataset", choices=DATASETS, required=True)
    ap.add_argument("--revision", help="store: the commit whose code ran the bench (a snapshot's, or HEAD)")
    args = ap.parse_args(argv)
    if args.action == "store" and not args.revision:
        ap.error("store needs --revision: the commit whose code ran the bench")
    items = load_questions(eval_data_dir() / f"{args.dataset}.questions.jsonl")
    target = STORE / f"{args.dataset}.jsonl"
    try:
        if args.action == "store":
            ran, total = store(args.run_dir, items, target, revision=commit_of(args.revision))
            print(f"{ran} records of {args.run_dir} stored; {total} questions in {target.relative_to(ROOT)}")
        else:
            added, changed = restore(args.run_dir, items, target)
            print(f"{added} stored records added to {args.run_dir / 'results.jsonl'}")
            for rev in changed:
                print(
                    f"warning: records of {rev} were restored and the library's code differs from it: check that "
                    f"the change leaves trajectories as they were (benchmarks/compare_revisions.py {rev} HEAD "
                    "--limit 4) before continuing the run, or start it again",
                    file=sys.stderr,
                )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
