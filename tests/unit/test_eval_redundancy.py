"""Redundancy against the ground truth: gold supporting documents and answers as the roots."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langgraph_parallelmuse.eval.redundancy import gold_effective, redundancy_record
from langgraph_parallelmuse.infograph import build_graph, entity_key
from tests.unit.test_facts import names, trajectories
from tests.unit.test_infograph import QUESTION, two_hop


def test_a_wrong_answer_has_no_effective_part_of_its_own_but_the_gold_documents_still_have_one():
    traj = {**two_hop(dead_end=True), "answer": "Carl Jung"}
    rec = redundancy_record(QUESTION, traj, supporting_doc_ids=["d6", "d10"], answers=["G. Stanley Hall"])
    assert (rec["entities"], rec["effective_entities"], rec["gold_effective_entities"]) == (8, 1, 4)
    assert rec["gold_redundancy"] == pytest.approx(0.5)


def test_a_right_answer_on_the_gold_documents_is_effective_both_ways():
    rec = redundancy_record(
        QUESTION, two_hop(), supporting_doc_ids=["d6", "d10"], answers=["Stanley Hall", "G. Stanley Hall"]
    )
    assert rec["effective_entities"] == rec["gold_effective_entities"] == 5


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names,
    trajectories(),
    st.lists(st.sampled_from(["d0_0", "d1_1", "v2", "d9"]), max_size=2),
    st.lists(names, max_size=2),
)
def test_redundancy_is_a_share_of_the_entities_explored(question, traj, docs, answers):
    """A guard (property test). Whatever the records and the gold data: the effective parts are parts
    of the graph, and Γ a share (``None`` with no entity at all); a gold answer the trajectory read is effective."""
    rec = redundancy_record(question, traj, supporting_doc_ids=docs, answers=answers)
    total = rec["entities"]
    assert 0 <= rec["effective_entities"] <= total and 0 <= rec["gold_effective_entities"] <= total
    for key in ("redundancy", "gold_redundancy"):
        assert (rec[key] is None) if total == 0 else 0 <= rec[key] <= 1
    graph = build_graph(question, traj)
    gold = gold_effective(graph, supporting_doc_ids=docs, answers=answers)
    assert set(gold["entities"]) <= set(graph["entities"])
    assert all(entity_key(a) in gold["entities"] for a in answers if entity_key(a) in graph["entities"])
