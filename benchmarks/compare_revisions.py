"""Run ``parallelmuse bench`` at two git revisions and compare what they produced, question by question.

A refactoring that keeps behaviour must give the same trajectories (same generated tokens, same
answers) and the same method answers on the same seed. Each revision runs from its own worktree
(``git worktree add --detach``) with the project's virtualenv, one after the other::

    .venv/bin/python benchmarks/compare_revisions.py f617f1c HEAD --limit 4

Output: ``OUT/<commit>-<dataset>-seed<seed>-<modes>/results.jsonl`` per revision (the revision
resolved to its commit, so a moved ``HEAD`` or branch runs again, and another dataset, seed or modes
never reuses a run) and a report of every difference (none: identical).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from langgraph_parallelmuse.eval import eval_data_dir, load_questions
from langgraph_parallelmuse.eval.bench import load_done

ROOT = Path(__file__).resolve().parents[1]


def _run(rev: str, out: Path, args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory(prefix="pm-rev-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True)
        try:
            command = [
                sys.executable,
                "-m",
                "langgraph_parallelmuse.cli",
                "bench",
                "--questions",
                str(eval_data_dir() / f"{args.dataset}.questions.jsonl"),
                "--corpus",
                str(eval_data_dir() / f"{args.dataset}.corpus.jsonl"),
                "--limit",
                str(args.limit),
                "--seed",
                str(args.seed),
                "--concurrency",
                "1",
                "--modes",
                args.modes,
                "--out",
                str(out),
            ]
            env = {**os.environ, "PYTHONPATH": str(tree)}
            started = time.perf_counter()
            subprocess.run(command, check=True, cwd=tree, env=env)
            return time.perf_counter() - started
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def commit_of(rev: str) -> str:
    """The commit a revision name (``HEAD``, a branch, a tag, a short hash) stands for now."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{rev!r} is no commit of {ROOT}: {done.stderr.strip()}")
    return done.stdout.strip()


def run_dir(out: Path, commit: str, args: argparse.Namespace) -> Path:
    """Where the bench of ``commit`` with these arguments writes its results (``--limit`` aside: a
    larger one continues the same run)."""
    return out / f"{commit}-{args.dataset}-seed{args.seed}-{args.modes.replace(',', '+')}"


def question_ids(args: argparse.Namespace) -> set[str]:
    """The ids of the first ``--limit`` questions of ``--dataset``: the ones the bench runs."""
    return {item.id for item in load_questions(eval_data_dir() / f"{args.dataset}.questions.jsonl", limit=args.limit)}


def _records(path: Path, ids: set[str]) -> dict[str, dict]:
    # Read as the bench reads it (a line cut by a crash is a question to run again); only the questions
    # compared: a folder a larger --limit left holds more, which the other revision's need not.
    return {qid: r for qid, r in load_done(path).items() if qid in ids}


def differences(before: dict[str, dict], after: dict[str, dict]) -> list[str]:
    """Every per-question difference in trajectories (generated tokens, answer) and method answers."""
    out = []
    for qid in sorted(before.keys() | after.keys()):
        a, b = before.get(qid), after.get(qid)
        if a is None or b is None:
            out.append(f"{qid}: only in {'after' if a is None else 'before'}")
            continue
        for tid in sorted(a["trajectories"].keys() | b["trajectories"].keys()):
            ta, tb = a["trajectories"].get(tid), b["trajectories"].get(tid)
            if ta is None or tb is None:
                out.append(f"{qid} {tid}: trajectory only in {'after' if ta is None else 'before'}")
                continue
            for key in ("generated_tokens", "tool_calls"):
                if ta["stats"][key] != tb["stats"][key]:
                    out.append(f"{qid} {tid}: {key} {ta['stats'][key]} -> {tb['stats'][key]}")
            if ta["answer"] != tb["answer"]:
                out.append(f"{qid} {tid}: answer {ta['answer']!r} -> {tb['answer']!r}")
        for name in sorted(a["methods"].keys() | b["methods"].keys()):
            ma, mb = a["methods"].get(name, {}), b["methods"].get(name, {})
            was, now = (ma.get("answer"), ma.get("source")), (mb.get("answer"), mb.get("source"))
            if was != now:
                out.append(f"{qid} {name}: {was[0]!r} ({was[1]}) -> {now[0]!r} ({now[1]})")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", default="hotpotqa_train100")
    parser.add_argument("--modes", default="exploration", help="partial-rollout modes to run (bench --modes)")
    parser.add_argument("--out", default="bench-results/compare")
    args = parser.parse_args()
    commits = {rev: commit_of(rev) for rev in (args.before, args.after)}
    dirs = {rev: run_dir(Path(args.out), commit, args) for rev, commit in commits.items()}
    ids = question_ids(args)
    seconds = {}
    for rev, target in dirs.items():
        if not (target / "results.jsonl").exists() or len(_records(target / "results.jsonl", ids)) < len(ids):
            # The commit, not the name: the worktree must hold what its folder is named after.
            seconds[rev] = _run(commits[rev], target.resolve(), args)
    before, after = (_records(dirs[rev] / "results.jsonl", ids) for rev in (args.before, args.after))
    diffs = differences(before, after)
    trajectories = sum(len(r["trajectories"]) for r in before.values())
    names = " vs ".join(f"{rev} ({commits[rev][:10]})" for rev in (args.before, args.after))
    print(f"\n{names}: {len(before)} questions, {trajectories} trajectories, seed {args.seed}")
    for rev, s in seconds.items():
        print(f"  {rev}: {s:.0f} s")
    tokens = [sum(t["stats"]["generated_tokens"] for t in r["trajectories"].values()) for r in before.values()]
    print(f"  generated tokens per question ({args.before}): {tokens}")
    print(
        "\n".join(diffs)
        if diffs
        else "identical: every trajectory's generated tokens and answer, every method's answer"
    )
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
