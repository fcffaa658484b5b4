"""Resident memory of a long run, sampled every minute: does it stay bounded?

Runs a command (by default ``parallelmuse bench --concurrency 2`` on the first 30 HotpotQA dev
questions, otherwise default settings) and samples its resident set (``VmRSS``; anonymous and file
parts) every ``--every`` seconds until it exits or ``--minutes`` pass. Prints one line per sample,
then the peak, the level after warm-up and the growth per hour after warm-up (a least-squares slope
over the samples after ``--warmup`` minutes).

``--breakdown`` runs the same bench in this process instead and says what the resident memory
holds at each sample: the bytes of every live tensor storage (weights, prefix-cache entries, the
running batch's KV, whatever else Python still references), the prefix cache's own count, the
running batch's buffers, and glibc's heap (bytes in use, bytes freed but kept, bytes in mmapped
chunks). What is resident beyond the live tensors is the interpreter, the libraries, the records
and the allocator's slack.

    python benchmarks/engine_memory.py [--limit 30] [--minutes 120] [--out DIR] [--log FILE] [--env MALLOC_ARENA_MAX=2]
    python benchmarks/engine_memory.py --breakdown [--limit 30] [--minutes 30]
    python benchmarks/engine_memory.py -- <any command>
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from xml.etree import ElementTree

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


def bench_arguments(limit: int, out: str) -> list[str]:
    """The CLI arguments of the default run: ``bench --concurrency 2`` on HotpotQA dev questions."""
    data = eval_data_dir()
    return [
        "bench",
        *("--questions", str(data / "hotpotqa_train100.questions.jsonl")),
        *("--corpus", str(data / "hotpotqa_train100.corpus.jsonl")),
        *("--limit", str(limit), "--concurrency", "2", "--out", out),
    ]


def heap_mib() -> dict[str, float]:
    """glibc's heap over all arenas (``malloc_info``) in MiB: in use, freed but kept, mmapped chunks.

    Empty where the C library is not glibc.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "malloc_info"):
        return {}
    libc.fopen.restype = ctypes.c_void_p
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        root = ElementTree.parse(out.name).getroot()
    # The last <total>/<system> elements are the process-wide sums after the per-arena ones.
    totals = {t.get("type"): int(t.get("size")) for t in root.findall("total")}
    system = {t.get("type"): int(t.get("size")) for t in root.findall("system")}
    free = totals.get("fast", 0) + totals.get("rest", 0)
    current = system.get("current", 0)
    return {"in_use": (current - free) / 2**20, "free": free / 2**20, "mmapped": totals.get("mmap", 0) / 2**20}


def tensor_mib() -> float:
    """MiB of the distinct storages of every tensor Python references (views counted once)."""
    import torch

    storages = {}
    with warnings.catch_warnings():  # isinstance() on torch's deprecated module proxies warns
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for tensor in tensors:
        if tensor.device.type == "cpu":
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()) / 2**20


def engine_mib() -> tuple[float, float, float, float]:
    """MiB of the live engines' weights, what their prefix caches count, their batches' private
    buffers, and the part of those buffers rows use (the rest is room: rows padded to the longest)."""
    from langgraph_parallelmuse.models.engine import InferenceEngine
    from langgraph_parallelmuse.models.kv_batch import BatchKV

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = [o for o in gc.get_objects() if isinstance(o, (InferenceEngine, BatchKV))]
    live = [o for o in found if isinstance(o, InferenceEngine)]
    batches = [o for o in found if isinstance(o, BatchKV)]
    weights = sum(e.runner.weight_bytes for e in live)
    cache = sum(e.cache.nbytes for e in live if e.cache is not None)
    batch = sum(b.keys.untyped_storage().nbytes() + b.values.untyped_storage().nbytes() for b in batches)
    used = sum(2 * sum(b.lengths) * b.num_layers * b.kv_heads * b.head_dim * b.keys.element_size() for b in batches)
    return weights / 2**20, cache / 2**20, batch / 2**20, used / 2**20


def breakdown(args: argparse.Namespace) -> None:
    """Run the bench in this process, sampling what its resident memory holds."""
    from langgraph_parallelmuse.cli import main as cli

    start, done = time.monotonic(), threading.Event()

    def sample() -> None:
        while not done.wait(args.every):
            minutes = (time.monotonic() - start) / 60
            mem = resident_mib(os.getpid())
            weights, cache, batch, used = engine_mib()
            tensors, heap = tensor_mib(), heap_mib()
            print(
                f"{minutes:6.1f} min  RSS {mem['VmRSS']:6.0f} (anon {mem['RssAnon']:6.0f})  tensors {tensors:6.0f}  "
                f"weights {weights:4.0f}  cache {cache:6.0f}  batch {batch:5.0f} (used {used:4.0f})  "
                f"heap in use {heap.get('in_use', 0):6.0f} free {heap.get('free', 0):6.0f} "
                f"mmapped {heap.get('mmapped', 0):6.0f}  MiB",
                file=sys.__stdout__,
                flush=True,
            )
            if minutes >= args.minutes:
                os._exit(0)  # the bench resumes from its records; nothing here needs a clean exit

    print("MiB: resident; live tensor storages, of which weights, prefix cache (its count), batch buffers (used by")
    print("rows); glibc's heap")
    threading.Thread(target=sample, daemon=True).start()
    with tempfile.TemporaryDirectory() as scratch, args.log.open("w") as log:
        sys.stdout = sys.stderr = log  # the bench's own output goes to the log, the samples to the terminal
        try:
            cli(bench_arguments(args.limit, args.out or scratch))
        finally:
            done.set()
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__


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
    ap.add_argument("--breakdown", action="store_true", help="run the bench in this process and break its memory down")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then a command to run instead of the bench")
    args = ap.parse_args()
    if args.breakdown:
        args.log.parent.mkdir(parents=True, exist_ok=True)
        breakdown(args)
        return
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.env))
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, args.log.open("w") as log:
        given = args.command[1:] if args.command[:1] == ["--"] else args.command
        command = given or [
            sys.executable,
            "-m",
            "langgraph_parallelmuse.cli",
            *bench_arguments(args.limit, args.out or scratch),
        ]
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
