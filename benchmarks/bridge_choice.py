"""How often the guided driver's model chooses the right bridge of a MuSiQue question's first hop.

For every question with a phrase naming an entity it does not give (:mod:`langgraph_parallelmuse.references`),
the trajectory is set up as after its first hop: the real search of the question over its own
document pool (snippets) and the first hop's gold paragraph opened. The driver plans the next
step (the bridge's ``Choose``) and the model picks by its likelihood (argmax). Side by side on the
same questions, the bridge chosen from the opened documents only (the default) and from the
opened documents with the search's snippets. A pick is right when it is an answer of one of the
decomposition's hops before the last (evaluation only: gold never reaches the driver)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bridge_choice.py --limit 100
"""

from __future__ import annotations

import asyncio

from common import arguments, dev_set

from langgraph_parallelmuse.agent import observe
from langgraph_parallelmuse.config import make_config
from langgraph_parallelmuse.driver import GuidedDriver, StepContext
from langgraph_parallelmuse.eval.scoring import exact_match
from langgraph_parallelmuse.models import LocalChatModel
from langgraph_parallelmuse.references import inner_reference
from langgraph_parallelmuse.segments import Choose, Sampling, generate_turn
from langgraph_parallelmuse.state import Observation, Step
from langgraph_parallelmuse.tools import make_corpus_tools

SETTINGS = {"opened documents": True, "opened + snippets": False}


async def _after_first_hop(item, index, cfg) -> tuple[list[Step], list[Observation]]:
    """The steps and observations of a trajectory that searched the question and opened its first hop's paragraph."""
    tools = {t.name: t for t in make_corpus_tools(index, doc_ids=item.context_doc_ids)}
    first = item.meta["question_decomposition"][0]
    calls = [
        ("search", {"query": item.question}),
        ("visit", {"doc": item.context_doc_ids[first["paragraph_support_idx"]]}),
    ]
    steps: list[Step] = []
    observations: list[Observation] = []
    for at, (name, args) in enumerate(calls):
        steps.append({"index": at, "text": "", "action": {"type": "tool_call", "name": name, "arguments": args}})
        # Recorded as the agent's act node records it: the search's snippets cut at the config's
        # max_observation_chars (built here, half the searches showed the driver text no agent sees).
        observations.append(await observe(tools, steps[-1], trajectory_id="bridge", config=cfg))
    return steps, observations


async def main() -> None:
    args = arguments(__doc__, limit=100)
    args.dataset = "musique_train100"  # the hops' answers are MuSiQue's decomposition
    items, index = dev_set(args.dataset, args.limit)
    model = LocalChatModel.embedded()
    cfg = make_config(seed=args.seed)
    counts = {name: [0, 0] for name in SETTINGS}  # [bridge among the options, bridge chosen]
    asked = 0
    for item in items:
        if inner_reference(item.question) is None:
            continue
        asked += 1
        bridges = [hop["answer"] for hop in item.meta["question_decomposition"][:-1]]
        steps, observations = await _after_first_hop(item, index, cfg)
        ctx = StepContext(
            item.question, steps, observations, 2, False, 64, frozenset({"search", "visit"}), scoring=True
        )
        line = []
        for name, opened in SETTINGS.items():
            choose = GuidedDriver(bridge_from_opened=opened).plan(ctx)[-1]
            if not isinstance(choose, Choose):
                line.append(f"{name}: no options")
                continue
            turn = await generate_turn(
                model, [], [Choose(choose.options, choose.messages)], sampling=Sampling(temperature=0)
            )
            counts[name][0] += any(exact_match(o, bridges) for o in choose.options)
            counts[name][1] += exact_match(turn.text, bridges)
            line.append(f"{name}: {turn.text!r}")
        print(f"[{asked:3}] gold {bridges[0]!r:28} " + " | ".join(line), flush=True)
    print(f"\n{args.dataset}: {asked} of {len(items)} questions name their first hop's entity by a phrase\n")
    print("| bridge chosen from | bridge among the options | bridge chosen |")
    print("|---|---|---|")
    for name, (among, chosen) in counts.items():
        print(f"| {name} | {among / max(asked, 1):.3f} | {chosen / max(asked, 1):.3f} |")


if __name__ == "__main__":
    asyncio.run(main())
