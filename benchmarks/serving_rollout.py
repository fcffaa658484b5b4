"""Issue 19 (a), (b), (c): the rollout stage on vLLM, on the in-process engine, and behind a router.

Every measurement runs the library's own schedule (``schedule.partial_rollout``, guided driver)
on the first ``--limit`` questions of the dev set in the distractor setting (each question's own
paragraphs), ``--concurrency`` questions in flight at a time, and starts cold (prefix caches
emptied before each one):

(a) one compiled vLLM server (``ServerChatModel``): ParallelMuse (N=8, M=1, k=2, T=3, exploration)
    vs 8 from-scratch trajectories: wall time, generated tokens, and the share of prompt tokens
    vLLM reported cached, for the calls on the branches' conversations (which continue the
    parent's prompt) and apart from them the guided plain query/answer prompts, beside the same
    shares of the from-scratch trajectories;
(b) the same two methods on the in-process engine (``LocalChatModel``, prefix cache + batching),
    run chunk by chunk beside (a), with the vLLM server paused (SIGSTOP: an idle vLLM polls a
    core), as ratios;
(c) two compiled vLLM replicas behind vllm-router: ParallelMuse with the per-question routing key
    (``consistent_hash`` + ``routing_header``) vs the router's ``round_robin``, at the largest
    concurrency.

Each chunk's figures are appended to ``--out`` (JSON lines) as soon as they are measured, with the
settings they were measured with (``--dataset``, ``--seed``, ``--precision``, ``--eager``,
``--block-size``) and the ids of its questions; a rerun with the same ``--out`` skips the chunks
there under its own settings (the same questions at the same concurrency: a larger ``--limit``
measures the chunks it adds) and prints the tables over its own chunks. Rows that record no
settings (written before rows carried them, as the committed
``benchmarks/results/serving_rollout*.jsonl``) are never taken for a run's own; ``report`` shows
them apart. Needs the serving venv (``make setup-serving``); hours on a loaded 2-core machine.

    python benchmarks/serving_rollout.py [--limit 10] [--concurrency 1,5] [--parts a,b,c (in this order)]
        [--out bench-results/serving_rollout.jsonl] [--venv .venv-serving] [--eager] [--precision float32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import ROOT, arguments, as_stored, dev_set, integers, server_model, vllm_options, vllm_specs

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import ParallelMuseConfig, make_config
from langgraph_parallelmuse.schedule import partial_rollout
from langgraph_parallelmuse.serving import (
    Server,
    group_members,
    reset_prefix_cache,
    router_server,
    serve,
    vllm_counters,
)
from langgraph_parallelmuse.tools import make_corpus_tools

PARTS = ("a", "b", "c")


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--concurrency", type=integers(1), default="1,5", help="questions in flight, comma-separated (default 1,5)"
    )
    ap.add_argument("--parts", default=",".join(PARTS), help="which of a,b,c to run (default all)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "serving_rollout.jsonl")
    vllm_options(ap)
    ap.add_argument(
        "--precision", default="float32", choices=("float32", "bfloat16", "auto"), help="the in-process engine's (b)"
    )


def token_sums(trajectories: list[dict]) -> dict[str, dict[str, int]]:
    """Prompt and cached tokens of the branches' own steps and of all trajectories, split by call kind.

    ``conv``: the calls on the trajectory's conversation (a branch's continue its parent's prompt);
    ``plain``: the guided driver's plain query/answer prompts, which do not start with it.
    """
    out = {}
    for group, members in (
        ("branch", [t for t in trajectories if t["origin"].get("kind") == "branch"]),
        ("all", trajectories),
    ):
        conv_prompt = sum(t["stats"]["conversation_prompt_tokens"] for t in members)
        conv_cached = sum(t["stats"]["conversation_cached_tokens"] for t in members)
        out[group] = {
            "conv_prompt": conv_prompt,
            "conv_cached": conv_cached,
            "plain_prompt": sum(t["stats"]["prompt_tokens"] for t in members) - conv_prompt,
            "plain_cached": sum(t["stats"]["cached_prompt_tokens"] for t in members) - conv_cached,
        }
    out["generated"] = {"tokens": sum(t["stats"]["generated_tokens"] for t in trajectories)}
    return out


def add(total: dict, part: dict) -> dict:
    for group, values in part.items():
        into = total.setdefault(group, {})
        for key, value in values.items():
            into[key] = into.get(key, 0) + value
    return total


async def measure(model, chunk, index, cfg: ParallelMuseConfig, tag: str, reset: Callable[[], None]) -> dict:
    """One configuration on one chunk of questions, from a cold cache: seconds and token sums."""
    reset()
    start = time.perf_counter()
    results = await asyncio.gather(
        *(
            partial_rollout(
                RolloutRunner(model, make_corpus_tools(index, doc_ids=item.context_doc_ids)),
                item.question,
                config=cfg,
                run_id=f"{tag}/{item.id}",
            )
            for item in chunk
        )
    )
    seconds = time.perf_counter() - start
    sums: dict = {}
    for trajectories, _ in results:
        add(sums, token_sums(trajectories))
    return {"seconds": seconds, "questions": [item.id for item in chunk], **sums}


def run_settings(args: argparse.Namespace) -> dict:
    """What a row's figures depend on besides its key: the dev set, the seed, both backends' settings."""
    return {
        "dataset": args.dataset,
        "seed": args.seed,
        "precision": args.precision,
        "eager": args.eager,
        "block_size": args.block_size,
    }


class Records:
    """The JSON lines of ``--out``: what is measured, keyed by (settings, part, backend, method,
    concurrency, the chunk's question ids); ``settings`` are this run's, which every row it adds records."""

    def __init__(self, path: Path, settings: dict) -> None:
        self.path = path
        self.settings = as_stored(settings)
        self.rows = (
            [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        )

    @staticmethod
    def key(row: dict) -> tuple:
        # A row without settings (written before rows recorded them) matches no run's. The question
        # ids, not the chunk's index: the last chunk of a run with a smaller --limit has the index
        # of a longer chunk of a larger one.
        return row.get("settings"), row["part"], row["backend"], row["method"], row["concurrency"], questions(row)

    def has(self, **key: Any) -> bool:
        wanted = self.key({**key, "settings": self.settings})
        return any(self.key(r) == wanted for r in self.rows)

    def measured(self, chunks: set[tuple]) -> list[dict]:
        """The rows of ``chunks`` ((concurrency, question ids) pairs, as ``run_chunks`` gives them)
        measured with this run's settings: a chunk left by a run with another ``--limit`` is not this run's."""
        return [
            r for r in self.rows if r.get("settings") == self.settings and (r["concurrency"], questions(r)) in chunks
        ]

    def add(self, row: dict) -> None:
        row = {**row, "settings": self.settings}
        self.rows.append(row)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


@contextlib.contextmanager
def paused(server: Server | None) -> Iterator[None]:
    """Stop a server's processes (no CPU at all) for the block, then let them go on.

    The lifetime wrappers (``timeout`` and the watchdog shell) keep running, so a server paused by
    a benchmark that dies is still stopped by them.
    """
    if server is None:
        yield
        return
    wrappers = {"timeout", "sh", "sleep"}
    members = [p for p in group_members(server.pid) if Path(f"/proc/{p}/comm").read_text().strip() not in wrappers]
    for pid in members:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def chunks_of(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def questions(row: dict) -> tuple[str, ...]:
    """The ids of the questions a row measured: the chunk it is of."""
    return tuple(row["questions"])


def run_chunks(items: list, sizes: list[int]) -> set[tuple]:
    """(concurrency, question ids) of every chunk a run over ``items`` at ``sizes`` measures."""
    return {(c, tuple(item.id for item in chunk)) for c in sizes for chunk in chunks_of(items, c)}


async def warm_up(model, items, index, reset: Callable[[], None]) -> None:
    """A short untimed run: the first requests after a start pay one-off costs."""
    cfg = make_config(n=2, mode="none", max_turns=2, driver="guided", seed=12345)
    await measure(model, items[:1], index, cfg, "warm-up", reset)


async def run_ab(args, items, index, methods: dict, records: Records, parts: set[str]) -> None:
    """(a) and (b), chunk by chunk side by side: every (backend, method) on a chunk before the next chunk."""
    backends = [b for b, p in (("vllm", "a"), ("engine", "b")) if p in parts]
    todo = [
        (c, n, b, m)
        for c in args.sizes
        for n, chunk in enumerate(chunks_of(items, c))
        for b in backends
        for m in methods
        if not records.has(
            part="a" if b == "vllm" else "b", backend=b, method=m, concurrency=c, questions=[i.id for i in chunk]
        )
    ]
    if not todo:
        return
    with contextlib.ExitStack() as stack:
        server, ready = None, {}
        if any(b == "vllm" for _, _, b, _ in todo):
            logs = ROOT / ".cache" / "serving-rollout-logs"
            (server,) = stack.enter_context(
                serve(vllm_specs(args, 1), startup_timeout=3600, max_seconds=12 * 3600, log_dir=logs)
            )
            url = server.url
            ready["vllm"] = (server_model(url), lambda: reset_prefix_cache(url), contextlib.nullcontext)
        if any(b == "engine" for _, _, b, _ in todo):
            from langgraph_parallelmuse.models import LocalChatModel

            engine = LocalChatModel.embedded(prefix_cache=True, batching=True, precision=args.precision)
            ready["engine"] = (engine, engine.engine.clear_cache, lambda: paused(server))
        for model, reset, context in ready.values():
            with context():
                await warm_up(model, items, index, reset)
        for c, n, backend, method in ordered(todo):
            model, reset, context = ready[backend]
            chunk = chunks_of(items, c)[n]
            with context():
                row = await measure(model, chunk, index, methods[method], f"{backend}-{method}-c{c}", reset)
            part = "a" if backend == "vllm" else "b"
            records.add({"part": part, "backend": backend, "method": method, "concurrency": c, "chunk": n, **row})
            print(f"[{part}] c={c} chunk {n}: {backend} {method} {row['seconds']:.1f}s", flush=True)


def ordered(todo: list[tuple]) -> list[tuple]:
    """Within each chunk, the configurations in alternating order (against drift of the machine's load)."""
    out, by_chunk = [], {}
    for c, n, *rest in todo:
        by_chunk.setdefault((c, n), []).append((c, n, *rest))
    for (_, n), runs in by_chunk.items():
        out += runs if n % 2 == 0 else runs[::-1]
    return out


async def run_c(args, items, index, pm: ParallelMuseConfig, records: Records) -> None:
    """(c): two replicas, one router per policy in front of both; ParallelMuse through each."""
    c = max(args.sizes)
    chunks = chunks_of(items, c)
    todo = [
        (c, n, route)
        for n, chunk in enumerate(chunks)
        for route in ("key", "round_robin")
        if not records.has(part="c", backend=route, method="pm", concurrency=c, questions=[i.id for i in chunk])
    ]
    if not todo:
        return
    logs = ROOT / ".cache" / "serving-rollout-logs"
    with serve(vllm_specs(args, 2), startup_timeout=3600, max_seconds=12 * 3600, log_dir=logs) as workers:
        urls = [w.url for w in workers]
        with (
            router_server(urls, venv=args.venv, log_dir=logs, max_seconds=12 * 3600) as keyed,
            router_server(urls, venv=args.venv, policy="round_robin", log_dir=logs, max_seconds=12 * 3600) as rr,
        ):
            models = {"key": server_model(keyed.url, keyed.routing_header), "round_robin": server_model(rr.url)}

            def reset() -> None:
                for url in urls:
                    reset_prefix_cache(url)

            await warm_up(models["round_robin"], items, index, reset)  # round-robin warms both replicas
            for _, n, route in ordered(todo):
                before = [vllm_counters(u)["vllm:request_success_total"] for u in urls]
                row = await measure(models[route], chunks[n], index, pm, f"router-{route}-c{c}", reset)
                after = [vllm_counters(u)["vllm:request_success_total"] for u in urls]
                row["replica_requests"] = [a - b for a, b in zip(after, before, strict=True)]
                records.add({"part": "c", "backend": route, "method": "pm", "concurrency": c, "chunk": n, **row})
                print(f"[c] c={c} chunk {n}: {route} {row['seconds']:.1f}s {row['replica_requests']}", flush=True)


def share(sums: dict, group: str, kind: str) -> str:
    prompt, cached = sums.get(group, {}).get(f"{kind}_prompt", 0), sums.get(group, {}).get(f"{kind}_cached", 0)
    return f"{cached / prompt:.3f} ({cached}/{prompt})" if prompt else "-"


def totals(rows: list[dict], chunks: set[tuple[str, ...]]) -> dict:
    out: dict = {"seconds": 0.0, "chunks": 0}
    for row in rows:
        if questions(row) in chunks:
            out["seconds"] += row["seconds"]
            out["chunks"] += 1
            add(out, {g: row[g] for g in ("branch", "all", "generated")})
    return out


def report(rows: list[dict], n_questions: int) -> None:
    """The tables: per settings, part and concurrency, over the chunks every configuration compared has measured."""
    groups: dict[tuple, dict[tuple, list[dict]]] = {}
    for row in rows:
        settings = json.dumps(row["settings"], sort_keys=True) if "settings" in row else "not recorded"
        part = row["part"] if row["part"] == "c" else "ab"
        groups.setdefault((settings, part, row["concurrency"]), {}).setdefault(
            (row["backend"], row["method"]), []
        ).append(row)
    for (settings, part, c), configs in sorted(groups.items()):
        common = set.intersection(*({questions(r) for r in rows} for rows in configs.values()))
        measured = sum(len(chunk) for chunk in common)
        title = "(a) vLLM and (b) in-process engine" if part == "ab" else "(c) two vLLM replicas behind vllm-router"
        print(f"\n## {title}: {c} question(s) in flight, {measured} of {n_questions} questions measured\n")
        print(f"settings: {settings}\n")
        print(
            "| backend | method | rollout s | s/question | generated tok/question | branch conversation cached "
            "| branch plain prompts cached | all conversation cached | all plain prompts cached |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        sums = {cfg: totals(rows, common) for cfg, rows in configs.items()}
        for (backend, method), t in sorted(sums.items()):
            q = max(measured, 1)
            print(
                f"| {backend} | {method} | {t['seconds']:.0f} | {t['seconds'] / q:.1f} | "
                f"{t.get('generated', {}).get('tokens', 0) / q:.0f} | {share(t, 'branch', 'conv')} | "
                f"{share(t, 'branch', 'plain')} | {share(t, 'all', 'conv')} | {share(t, 'all', 'plain')} |"
            )
        ratios(sums, part, configs, common)


def ratios(sums: dict, part: str, configs: dict, common: set[tuple[str, ...]]) -> None:
    def sec(backend: str, method: str) -> float | None:
        return sums[(backend, method)]["seconds"] if (backend, method) in sums else None

    def line(label: str, num: float | None, den: float | None) -> None:
        if num and den:
            print(f"- {label}: {num / den:.2f}x")

    print()
    if part == "ab":
        line(
            "ParallelMuse vs 8 from-scratch on vLLM (scratch s / ParallelMuse s)",
            sec("vllm", "scratch"),
            sec("vllm", "pm"),
        )
        line("ParallelMuse vs 8 from-scratch on the engine", sec("engine", "scratch"), sec("engine", "pm"))
        line("(b) ParallelMuse: engine s / vLLM s", sec("engine", "pm"), sec("vllm", "pm"))
        line("(b) from-scratch: engine s / vLLM s", sec("engine", "scratch"), sec("vllm", "scratch"))
        if ("vllm", "pm") in sums:
            print(
                f"- vLLM ParallelMuse branch conversation cached share: {share(sums[('vllm', 'pm')], 'branch', 'conv')}"
                " (target >= 0.85)"
            )
    else:
        for route in ("key", "round_robin"):
            if (route, "pm") in configs:
                split = [
                    sum(r["replica_requests"][i] for r in configs[(route, "pm")] if questions(r) in common)
                    for i in range(2)
                ]
                print(
                    f"- {route}: requests per replica {split}, branch conversation cached "
                    f"{share(sums[(route, 'pm')], 'branch', 'conv')}"
                )


async def main() -> None:
    args = arguments(__doc__, limit=10, extra=options)
    args.sizes = args.concurrency  # sorted, each once
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - set(PARTS):
        raise SystemExit(f"--parts: choose from {', '.join(PARTS)} (got {args.parts!r})")
    items, index = dev_set(args.dataset, args.limit)
    pm = make_config(n=8, m=1, k=2, t=3, mode="exploration", driver="guided", seed=args.seed)
    methods = {"pm": pm, "scratch": make_config(pm, mode="none")}
    records = Records(args.out, run_settings(args))
    print(
        f"{len(items)} questions of {args.dataset}, concurrency {args.sizes}, parts {sorted(parts)}, "
        f"vLLM {'eager' if args.eager else 'compiled'} block {args.block_size}; records in {args.out}",
        flush=True,
    )
    steps = {
        "ab": lambda: run_ab(args, items, index, methods, records, parts),
        "c": lambda: run_c(args, items, index, pm, records),
    }
    # In the order --parts names them: (c) measures only cache shares, so it can go first on a
    # machine that is busy for a while.
    for step in dict.fromkeys("c" if p == "c" else "ab" for p in args.parts.split(",") if p.strip()):
        await steps[step]()
    report(records.measured(run_chunks(items, args.sizes)), len(items))


if __name__ == "__main__":
    asyncio.run(main())
