"""Redundancy against the ground truth: gold supporting documents and answers as the roots."""

from __future__ import annotations

import pytest

from langgraph_parallelmuse.eval.redundancy import redundancy_record
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
