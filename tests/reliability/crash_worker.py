"""Subprocess body of the crash/resume test (run as ``python -m tests.reliability.crash_worker``).

``python -m tests.reliability.crash_worker DB SIDE_FILE PHASE RESULT_FILE``

Runs the full ParallelMuse graph (n=4: t0 and one fill, then two branches of t0 at step 1) with a slow
scripted model and one SQLite checkpointer used for both the outer graph and the trajectory
threads, under the fixed thread id ``crash-1``. Every agent model call appends
``PHASE trajectory_id step`` to SIDE_FILE (flushed and fsynced) before it answers. If the thread
already has pending work, the run is resumed with ``ainvoke(None, config)``. The result is
written to RESULT_FILE as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langgraph_parallelmuse.graph import create_parallelmuse
from tests.reliability.helpers import KwargsModel, seed_table
from tests.unit.fakes import (
    Reply,
    agent_step,
    answer_text,
    call_text,
    majority_from_prompt,
    make_tools,
    report_from_prompt,
    role_of,
)

QUESTION = "What is the capital of France?"
THREAD = {"configurable": {"thread_id": "crash-1"}}
CONFIG = {"n": 4, "m": 1, "k": 1, "t": 2, "mode": "exploration", "seed": 7, "max_turns": 3}
IDS = ["t0", "t0.s1.b0", "t0.s1.b1", "f0"]
# One branch is slow, so the run is still going when the other branch has finished (the fill
# runs alongside t0, before any branch).
DELAY = {"t0": 0.2, "t0.s1.b0": 0.2, "t0.s1.b1": 1.5, "f0": 0.2}
STEPS = [
    Reply(
        call_text("search", "Find the country first", query="capital of France"),
        regions={"tool_call": -0.2},
    ),
    Reply(call_text("visit", "Open the page", doc="Paris"), regions={"tool_call": -2.5}),
    Reply(answer_text("Paris", "It says Paris")),
]


def main(db: str, side: str, phase: str, result_path: str) -> None:
    table = seed_table(CONFIG["seed"], IDS, max_turns=CONFIG["max_turns"])

    def respond(messages, kwargs):
        role = role_of(messages)
        if role == "compress":
            return Reply(report_from_prompt(messages), delay=0.05)
        if role == "aggregate":
            return Reply(majority_from_prompt(messages), delay=0.05)
        tid, step = table[kwargs["seed"]]
        with open(side, "a") as f:
            f.write(f"{phase} {tid} {step}\n")
            f.flush()
            os.fsync(f.fileno())
        reply = STEPS[min(agent_step(messages), len(STEPS) - 1)]
        return Reply(reply.text, regions=reply.regions, delay=DELAY[tid])

    async def run() -> dict:
        async with AsyncSqliteSaver.from_conn_string(db) as saver:
            tools, _ = make_tools()
            graph = create_parallelmuse(
                KwargsModel(kw_responder=respond),
                tools,
                config=CONFIG,
                checkpointer=saver,
                trajectory_checkpointer=saver,
            )
            snap = await graph.aget_state(THREAD)
            if snap.next:
                resumed = True
                out = await graph.ainvoke(None, THREAD)
            else:
                resumed = False
                out = await graph.ainvoke({"question": QUESTION}, THREAD)
            return {
                "resumed": resumed,
                "pending_before": list(snap.next),
                "answer": out["answer"],
                "answer_source": out["answer_source"],
                "trajectories": {t["id"]: t["status"] for t in out["trajectories"]},
                "reports": sorted(r["trajectory_id"] for r in out["reports"]),
            }

    result = asyncio.run(run())
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
