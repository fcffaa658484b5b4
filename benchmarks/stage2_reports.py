"""Issue 21 item 3: the guided reports on fixed trajectories: fallbacks, length, entities kept (embedded SmolLM2).

Stage 1 runs once: ``--n`` from-scratch trajectories per question (``mode="none"``, the guided
driver, distractor setting), stored as JSON in ``--trajectories`` with the dataset, ``--n`` and
``--seed`` they were made with; a rerun with the same three reads them back (running only the
questions a larger ``--limit`` adds), one with others runs Stage 1 again over the file. Stage 2
is the library's own map step (``stage2.write_report``, guided) over those same trajectories, so
two revisions of the library compare on identical input when the script runs under each::

    OMP_NUM_THREADS=1 nice -n 15 .venv/bin/python benchmarks/stage2_reports.py --limit 5
    PYTHONPATH=<other checkout> OMP_NUM_THREADS=1 nice -n 15 .venv/bin/python benchmarks/stage2_reports.py --limit 5

Per report it prints the status, the tokens the model generated, the report's own length (the
model's tokenizer on its text), the trajectory's tokens, and the share of the entities the answer
rests on (the trajectory's effective subgraph, ``infograph``) whose names the report contains.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from common import arguments, dev_set

from langgraph_parallelmuse.agent import RolloutRunner
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.driver import GuidedDriver
from langgraph_parallelmuse.infograph import build_graph, effective_subgraph, entity_key
from langgraph_parallelmuse.schedule import run_schedule
from langgraph_parallelmuse.stage2 import write_report
from langgraph_parallelmuse.tools import make_corpus_tools


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--n", type=int, default=4, help="from-scratch trajectories per question")
    ap.add_argument("--trajectories", default="bench-results/stage2/trajectories.json", help="Stage 1 cache")
    ap.add_argument("--out", default=None, help="write the reports (JSON) here")


def entity_share(question: str, trajectory: dict, text: str) -> float | None:
    """Share of the effective subgraph's entities whose (normalised) name the report text contains."""
    keys = list(effective_subgraph(build_graph(question, trajectory))["entities"])
    if not keys:
        return None
    body = f" {entity_key(text)} "
    return sum(f" {k} " in body for k in keys) / len(keys)


def stored_rollouts(path: Path, settings: dict) -> dict[str, list[dict]]:
    """The Stage 1 trajectories in ``path`` per question id, if they were made with ``settings``
    (none otherwise, as from a file written before the cache recorded its settings)."""
    if not path.exists():
        return {}
    cache = json.loads(path.read_text())
    return cache["trajectories"] if cache.get("settings") == settings else {}


async def rollouts(model, items, index, args) -> dict[str, list[dict]]:
    """Stage 1 of ``items``: the cache's where it holds them, run (and added to it) otherwise."""
    path = Path(args.trajectories)
    settings = {"dataset": args.dataset, "n": args.n, "seed": args.seed}
    out = stored_rollouts(path, settings)
    todo = [item for item in items if item.id not in out]
    if not todo:
        return out
    config = make_config(n=args.n, m=args.n, mode="none", seed=args.seed)
    for item in todo:
        runner = RolloutRunner(model, make_corpus_tools(index, doc_ids=item.context_doc_ids))
        trajectories, _ = await run_schedule(runner, item.question, config=config, run_id=f"{item.id}/s2")
        out[item.id] = trajectories
        print(f"  {item.id}: {len(trajectories)} trajectories", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "trajectories": out}, ensure_ascii=False))
    return out


async def run(args: argparse.Namespace) -> None:
    from langgraph_parallelmuse.models import LocalChatModel

    items, index = dev_set(args.dataset, args.limit)
    model = LocalChatModel.embedded()
    guided = isinstance(RolloutRunner(model, []).driver, GuidedDriver)
    stored = await rollouts(model, items, index, args)
    config = make_config(seed=args.seed)
    rows = []
    for item in items:
        for t in (t for t in stored[item.id] if t["answer"]):
            r = await write_report(model, item.question, t, config=config, guided=guided)
            text_tokens = len(model.get_token_ids(r["text"]))
            share = entity_share(item.question, t, r["text"])
            rows.append({**r, "text_tokens": text_tokens, "entity_share": share, "question": item.question})
            print(
                f"--- {item.id} {t['id']}: {r['status']}, generated {r['tokens']}, text {text_tokens}, "
                f"trajectory {r['trajectory_tokens']}, entities kept {share}\n{r['text']}",
                flush=True,
            )
    traj_tokens = sum(r["trajectory_tokens"] for r in rows)
    shares = [r["entity_share"] for r in rows if r["entity_share"] is not None]
    summary = {
        "reports": len(rows),
        "fallback": sum(r["status"] == "fallback" for r in rows),
        "generated_ratio": sum(r["tokens"] for r in rows) / traj_tokens,
        "text_ratio": sum(r["text_tokens"] for r in rows) / traj_tokens,
        "max_text_ratio": max(r["text_tokens"] / r["trajectory_tokens"] for r in rows),
        "entities_kept": sum(shares) / len(shares) if shares else None,
        "all_entities_kept": sum(s == 1.0 for s in shares),
        "with_entities": len(shares),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "reports": rows}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    asyncio.run(run(arguments(__doc__, limit=5, extra=options)))
