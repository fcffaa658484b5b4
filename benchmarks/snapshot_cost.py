"""What reading a trajectory's fork points costs when every step is snapshotted (online branching).

Online branching hands the scheduler a snapshot of a trajectory after each of its steps, and a
snapshot carries the trajectory's fork points (the checkpoint before each step). Every checkpoint
holds all the steps so far, with their token logprobs, so reading the whole thread history after
each step costs about the cube of the step count. The library reads only the checkpoints after the
points an earlier snapshot had. This script runs one trajectory per length with a scripted model
(steps of about 440 tokens with 4 alternatives each, no model load) through the library's own
``RolloutRunner.run_job(on_step=...)``, twice: the whole history read at each step (as before
session 33) and the library's incremental read, and prints the seconds spent reading fork points.

Run:
    .venv/bin/python benchmarks/snapshot_cost.py [--steps 6 12 20] [--saver memory|sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the scripted model of the unit tests

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from langgraph_parallelmuse.agent import RolloutRunner  # noqa: E402
from langgraph_parallelmuse.config import ParallelMuseConfig  # noqa: E402
from langgraph_parallelmuse.persistence import open_checkpointer  # noqa: E402
from tests.unit.fakes import Reply, ScriptedChatModel, answer_text, call_text, make_tools  # noqa: E402

THINK = " ".join(["reasoning about the evidence and the next query"] * 25)


async def one(steps: int, saver_kind: str, *, whole: bool) -> float:
    """Seconds spent reading fork points over one trajectory of ``steps`` steps."""
    script = [Reply(call_text("search", THINK, query=f"q{i}")) for i in range(steps - 1)]
    script.append(Reply(answer_text("Paris", THINK)))
    with tempfile.TemporaryDirectory() as tmp:
        async with _saver(saver_kind, Path(tmp)) as saver:
            runner = RolloutRunner(ScriptedChatModel(script=script), make_tools()[0], checkpointer=saver)
            read, spent = runner._fork_points, [0.0]

            async def timed(thread_id: str, count: int, known=()):
                started = time.perf_counter()
                points = await read(thread_id, count, () if whole else known)
                spent[0] += time.perf_counter() - started
                return points

            async def on_step(_trajectory) -> None:
                pass

            runner._fork_points = timed
            job = {"id": "t0", "thread_id": "r/t0", "origin": {"kind": "initial", "parent": None, "round": 0}}
            final = await runner.run_job(
                job, question="Q?", config=ParallelMuseConfig(max_turns=steps + 2), on_step=on_step
            )
            assert len(final["steps"]) == steps and None not in final["fork_points"], (final["status"], final["error"])
    return spent[0]


@asynccontextmanager
async def _saver(kind: str, tmp: Path) -> AsyncIterator:
    """The run's checkpointer: LangGraph's in-memory saver, or SQLite through the library's opener."""
    if kind == "memory":
        yield InMemorySaver()
        return
    async with open_checkpointer(str(tmp / "runs.sqlite")) as saver:
        yield saver


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[6, 12, 20])
    parser.add_argument("--saver", choices=["memory", "sqlite"], default="memory")
    args = parser.parse_args()
    print(f"saver: {args.saver}; seconds reading fork points over one trajectory")
    print("| steps | whole history each step | incremental (the library) | ratio |")
    print("|---|---|---|---|")
    for steps in args.steps:
        whole = await one(steps, args.saver, whole=True)
        incremental = await one(steps, args.saver, whole=False)
        print(f"| {steps} | {whole:.2f} s | {incremental:.2f} s | {whole / incremental:.1f}x |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
