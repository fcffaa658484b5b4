"""Resident memory of a long run, sampled every minute: does it stay bounded?

Runs a command (by default ``parallelmuse bench --concurrency 2`` on the first 30 HotpotQA dev
questions, otherwise default settings) and samples its resident set (``VmRSS``; anonymous and file
parts) every ``--every`` seconds until it exits or ``--minutes`` pass. Prints one line per sample,
then the peak, the level after warm-up and the growth per hour after warm-up (a least-squares slope
over the samples after ``--warmup`` minutes).

    python benchmarks/engine_memory.py [--limit 30] [--minutes 120] [--out DIR] [--log FILE] [--env MALLOC_ARENA_MAX=2]
    python benchmarks/engine_memory.py -- <any command>
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from langgraph_parallelmuse.eval import eval_data_dir


def resident_mib(pid: int) -> dict[str, float]:
    """``VmRSS``, ``RssAnon`` and ``RssFile`` of a process in MiB (empty once it has exited)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS", "RssAnon", "RssFile")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    except OSError:
        return {}
    return out


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(minutes, MiB)`` samples, in MiB per hour."""
    n = len(samples)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in samples) / n
    my = sum(m for _, m in samples) / n
    var = sum((t - mx) ** 2 for t, _ in samples)
    return 60 * sum((t - mx) * (m - my) for t, m in samples) / var if var else 0.0


def default_command(limit: int, out: str) -> list[str]:
    data = eval_data_dir()
    return [
        *(sys.executable, "-m", "langgraph_parallelmuse.cli", "bench"),
        *("--questions", str(data / "hotpotqa_train100.questions.jsonl")),
        *("--corpus", str(data / "hotpotqa_train100.corpus.jsonl")),
        *("--limit", str(limit), "--concurrency", "2", "--out", out),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--minutes", type=float, default=120.0)
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=10.0, help="minutes excluded from the growth estimate")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the command (repeatable)")
    ap.add_argument("--out", default=None, help="the bench's output directory (default: a temporary one)")
    ap.add_argument(
        "--log", type=Path, default=Path("bench-results/engine_memory.log"), help="the command's own output"
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then a command to run instead of the bench")
    args = ap.parse_args()
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.env))
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, args.log.open("w") as log:
        given = args.command[1:] if args.command[:1] == ["--"] else args.command
        command = given or default_command(args.limit, args.out or scratch)
        print("command:", " ".join(command), "| env:", " ".join(args.env) or "-", "| output:", args.log, flush=True)
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        start, samples = time.monotonic(), []
        try:
            while child.poll() is None and (time.monotonic() - start) / 60 < args.minutes:
                mem = resident_mib(child.pid)
                if mem:
                    minutes = (time.monotonic() - start) / 60
                    samples.append((minutes, mem["VmRSS"]))
                    print(
                        f"{minutes:6.1f} min  RSS {mem['VmRSS']:7.0f} MiB  (anon {mem.get('RssAnon', 0):7.0f}, "
                        f"file {mem.get('RssFile', 0):5.0f})",
                        flush=True,
                    )
                time.sleep(args.every)
        finally:
            stopped = child.poll() is None
            if stopped:
                child.terminate()
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    after = [(t, m) for t, m in samples if t >= args.warmup]
    if samples:
        ending = f"stopped after {args.minutes:g} min" if stopped else f"exit code {child.returncode}"
        print(f"peak {max(m for _, m in samples):.0f} MiB over {samples[-1][0]:.0f} min; {ending}")
    if child.returncode and not stopped:
        print(f"the command failed (exit code {child.returncode}); the end of {args.log}:")
        print("\n".join(args.log.read_text(errors="replace").splitlines()[-15:]))
    if after:
        print(
            f"after {args.warmup:.0f} min warm-up: {after[0][1]:.0f} -> {after[-1][1]:.0f} MiB, "
            f"growth {slope_per_hour(after):+.0f} MiB/hour over {len(after)} samples"
        )


if __name__ == "__main__":
    main()
