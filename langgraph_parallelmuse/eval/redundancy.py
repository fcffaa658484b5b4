"""Redundancy against the ground truth (evaluation only: the core never sees gold data).

The paper extracted V_eff "from the full trajectory and the ground-truth answer". Here the same
information-state graph (:func:`~langgraph_parallelmuse.infograph.build_graph`) is measured from
gold roots instead of the trajectory's own answer: the entities that are gold supporting documents
(by document id) or a gold answer, and everything with a time-respecting path of relations to them.
A trajectory that read the supporting documents but answered wrongly still has a gold-effective
part; one whose own answer is unsupported has none of its own.

Paper values (Figure 2, mean entities per task, all / effective) are in :data:`PAPER_FIGURE_2`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langgraph_parallelmuse.infograph import (
    InfoGraph,
    build_graph,
    effective_subgraph,
    entity_key,
    redundancy,
)
from langgraph_parallelmuse.state import Trajectory

__all__ = ["PAPER_FIGURE_2", "gold_effective", "redundancy_record"]

PAPER_FIGURE_2: dict[str, tuple[float, float]] = {
    "BrowseComp GPT-OSS-120B": (103.4, 6.8),
    "BrowseComp DeepSeek-V3.1-T": (78.3, 4.7),
    "BrowseComp Tongyi-DR": (98.9, 8.2),
    "GAIA GPT-OSS-120B": (34.1, 6.4),
    "GAIA DeepSeek-V3.1-T": (25.5, 5.3),
    "GAIA Tongyi-DR": (43.1, 7.6),
}
"""The paper's Figure 2: mean entities explored / effective per task (GPT-4.1 extraction)."""


def gold_effective(graph: InfoGraph, *, supporting_doc_ids: Iterable[str], answers: Iterable[str]) -> InfoGraph:
    """The part of a trajectory's graph that leads to the gold supporting documents or a gold answer.

    Example:
        >>> g = {"entities": {"a": {"doc_ids": ["d1"]}, "b": {"doc_ids": []}, "c": {"doc_ids": ["d9"]}},
        ...      "relations": [{"source": "b", "target": "a", "kind": "found", "step": 0, "tool": "search"}],
        ...      "answer": "c"}
        >>> sorted(gold_effective(g, supporting_doc_ids=["d1"], answers=["Nowhere"])["entities"])
        ['a', 'b']
    """
    support = set(supporting_doc_ids)
    gold = {entity_key(a) for a in answers} - {""}
    roots = [k for k, e in graph["entities"].items() if support & set(e["doc_ids"]) or k in gold]
    return effective_subgraph(graph, roots)


def redundancy_record(
    question: str, trajectory: Trajectory, *, supporting_doc_ids: Iterable[str], answers: Iterable[str]
) -> dict[str, Any]:
    """Entities explored, effective by the trajectory's own answer and by the ground truth, and Γ of each.

    Example:
        >>> redundancy_record("Q?", {"steps": [], "observations": [], "answer": None},
        ...                   supporting_doc_ids=["d1"], answers=["x"])["entities"]
        0
    """
    graph = build_graph(question, trajectory)
    own = effective_subgraph(graph)
    gold = gold_effective(graph, supporting_doc_ids=supporting_doc_ids, answers=answers)
    return {
        "entities": len(graph["entities"]),
        "effective_entities": len(own["entities"]),
        "gold_effective_entities": len(gold["entities"]),
        "redundancy": redundancy(graph, own),
        "gold_redundancy": redundancy(graph, gold),
    }
