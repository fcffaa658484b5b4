"""Jobs and their origins: what a branch job names."""

from __future__ import annotations

import pytest

from langgraph_parallelmuse.errors import ParallelMuseError
from langgraph_parallelmuse.lineage import Pick, branch_job

_PARENT = {
    "id": "t0",
    "thread_id": "r/t0",
    "fork_points": ["c0", "c1", "c2"],
    "steps": [{"context_tokens": 10}, {"context_tokens": 20}, {"context_tokens": 30}],
}


def _pick(step):
    return Pick(parent="t0", step=step, region=None, score=None, round=1)


def test_a_branch_names_the_checkpoint_before_its_step():
    """A guard: refusing negative steps must keep the fork point of a step inside the parent."""
    job = branch_job(_PARENT, _pick(2), 1, run_id="r")
    assert (job["id"], job["origin"]["checkpoint_id"], job["origin"]["prefix_tokens"]) == ("t0.s2.b1", "c2", 30)


@pytest.mark.parametrize("step", [-1, -3, 3])
def test_a_step_outside_the_parent_has_no_fork_point(step):
    """Before: step -1 made the job ``t0.s-1.b0`` from the checkpoint before the last step."""
    with pytest.raises(ParallelMuseError, match=f"no checkpoint before step {step} "):
        branch_job(_PARENT, _pick(step), 0, run_id="r")
