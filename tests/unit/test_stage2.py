"""Stage 2 as plain functions: the answer's choice and what it says when there is none."""

from __future__ import annotations

import pytest

from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.stage2 import choose_answer


async def test_trajectories_out_of_context_say_which_setting_to_change():
    """A last turn that made a tool call with its context full records no error: "no trajectory
    answered (2 context_exhausted)" named nothing to change."""
    trajectories = [
        {"id": "t0", "answer": None, "status": "context_exhausted"},
        {"id": "t1", "answer": None, "status": "context_exhausted", "error": "the context is exhausted at step 3"},
    ]
    choice = await choose_answer(None, "Q?", trajectories, [], config=ParallelMuseConfig(), guided=False)
    assert (choice.answer, choice.source) == (None, "none")
    assert choice.error.startswith("no trajectory answered (2 context_exhausted): the context is exhausted at step 3")
    assert "max_context_tokens" in choice.error and "max_observation_chars" in choice.error


async def test_trajectories_that_ran_out_of_turns_are_not_told_about_the_context():
    trajectories = [{"id": "t0", "answer": None, "status": "max_turns"}]
    choice = await choose_answer(None, "Q?", trajectories, [], config=ParallelMuseConfig(), guided=False)
    assert choice.error == "no trajectory answered (1 max_turns)"


@pytest.mark.parametrize("aggregation", ["majority", "parallelmuse"])
async def test_answers_with_nothing_to_vote_on_say_so_not_that_no_trajectory_answered(aggregation: str) -> None:
    # Before: the majority vote's answer None came with no error, and the CLI printed "No answer: no
    # trajectory answered." although every trajectory had; the aggregator's path said only "no report
    # carries an answer".
    trajs = [{"id": f"t{i}", "answer": a, "status": "answered"} for i, a in enumerate(["—", "%", "—"])]
    reports = [{"trajectory_id": t["id"], "answer": None, "text": "", "status": "fallback"} for t in trajs]
    cfg = ParallelMuseConfig(aggregation=aggregation)
    choice = await choose_answer(None, "Capital?", trajs, reports, config=cfg, guided=False)
    assert choice.answer is None and choice.source == "none"
    assert "answers ('—', '%') have no words or numbers to vote on" in choice.error
