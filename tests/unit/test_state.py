"""The state's records and the helpers that read them."""

from __future__ import annotations

from langgraph_parallelmuse.state import count_tool_calls


def _step(index: int, action: dict) -> dict:
    return {"index": index, "action": action}


def _observation(step: int, name: str) -> dict:
    return {"step": step, "name": name, "arguments": {}, "content": "Error: …", "error": True, "seconds": 0.0}


def test_a_call_of_a_tool_named_invalid_is_told_from_an_unreadable_turn_by_its_step():
    # Before: both were recorded under the name "invalid" and neither counted, so a user's own tool
    # named "invalid" (or a made-up call of that name) was missing from stats.tool_calls.
    steps = [
        _step(0, {"type": "tool_call", "name": "invalid", "arguments": {}}),
        _step(1, {"type": "invalid", "error": "no <tool_call> or <answer> in the reply"}),
        _step(2, {"type": "tool_call", "name": "search", "arguments": {"query": "q"}}),
    ]
    observations = [_observation(0, "invalid"), _observation(1, "invalid"), _observation(2, "search")]
    assert count_tool_calls(observations, steps=steps) == 2
    # A branch's own steps with its own observations: the indices are the trajectory's, not the slice's.
    assert count_tool_calls(observations[1:], steps=steps[1:]) == 1


def test_observations_without_their_steps_are_counted_by_name_as_before():
    # Records read without their steps (or an observation whose step is not among those given) keep
    # the old reading: the name "invalid" is an unreadable turn's reply.
    observations = [_observation(0, "search"), _observation(1, "invalid"), _observation(2, "visit")]
    assert count_tool_calls(observations) == 2
    assert count_tool_calls(observations, steps=[_step(2, {"type": "tool_call", "name": "visit"})]) == 2


def test_step_records_without_their_index_leave_the_count_to_the_names():
    # A hand-built trajectory (a doctest's, a user's baseline input) may give steps with their action only.
    observations = [_observation(0, "search"), _observation(1, "invalid")]
    assert count_tool_calls(observations, steps=[{"action": {"type": "invalid"}}]) == 1
