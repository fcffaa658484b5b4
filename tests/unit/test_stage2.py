"""Stage 2 as plain functions: the answer's choice and what it says when there is none."""

from __future__ import annotations

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
