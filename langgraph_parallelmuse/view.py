"""Human views of a run: the trajectory tree (which branch forked where) and uncertainty plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from langgraph_parallelmuse.protocol import one_line
from langgraph_parallelmuse.state import Trajectory


def _fmt(score: float | None) -> str:
    return "  -  " if score is None else f"{score:5.2f}"


def _step_line(traj: Trajectory, i: int) -> str:
    step = traj["steps"][i]
    act = step["action"]
    if act.get("type") == "tool_call":
        what = f"{act['name']}({', '.join(one_line(v, 40) for v in act.get('arguments', {}).values())})"
    elif act.get("type") == "answer":
        what = f"answer: {one_line(act.get('answer'), 60)}"
    else:
        what = f"invalid: {one_line(act.get('error'), 50)}"
    u = traj["uncertainty"][i] if i < len(traj["uncertainty"]) else {}
    return f"step {i}  R={_fmt(u.get('reasoning'))} E={_fmt(u.get('exploration'))}  {what}"


def render_tree(trajectories: Sequence[Trajectory]) -> str:
    """A text tree: each initial trajectory with its steps, branches hanging where they forked.

    ``R``/``E`` are the reasoning/exploration perplexities of each step; ``⑂`` marks a fork.

    Example:
        >>> result = graph.invoke({"question": "What is the capital of France?"})  # doctest: +SKIP
        >>> print(render_tree(result["trajectories"]))  # doctest: +SKIP
        t0 (initial) answered: 'Paris'
        ├─ step 0  R= 3.10 E= 5.20  search(capital of France)
        │  ⑂ forked here:
        │     t0.s0.b0 (branch, exploration PPL 5.20) answered: 'Paris'
        ...
    """
    children: dict[tuple[str, int], list[Trajectory]] = {}
    for t in trajectories:
        if t["origin"].get("kind") == "branch":
            children.setdefault((t["origin"]["parent"], t["origin"]["step"]), []).append(t)
    lines: list[str] = []
    shown: set[str] = set()

    def walk(traj: Trajectory, start: int, indent: str, note: str = "") -> None:
        shown.add(traj["id"])
        origin = traj["origin"]
        extra = (
            f", {origin.get('region')} PPL {origin['score']:.2f}"
            if origin.get("kind") == "branch" and origin.get("score") is not None
            else f" of {' × '.join(origin['parents'])}"
            if origin.get("kind") == "crossover" and origin.get("parents")
            else ""
        )
        answer, error = traj.get("answer"), traj.get("error")
        outcome = one_line(repr(answer) if answer is not None or not error else error, 160)
        head = f"{indent}{traj['id']} ({origin.get('kind', 'initial')}{extra}{note}) {traj['status']}: {outcome}"
        lines.append(head)
        for i in range(start, len(traj["steps"])):
            lines.append(f"{indent}├─ {_step_line(traj, i)}")
            for child in children.get((traj["id"], i), []):
                lines.append(f"{indent}│  ⑂ forked here:")
                walk(child, i, indent + "│     ")

    for traj in trajectories:
        if traj["origin"].get("kind") != "branch":
            walk(traj, 0, "")
    # A branch whose parent is not in the list (a caller kept only some) is shown, not dropped.
    for traj in trajectories:
        if traj["id"] not in shown:
            origin = traj["origin"]
            walk(traj, origin.get("step") or 0, "", f", of {origin.get('parent')} step {origin.get('step')}")
    return "\n".join(lines)


def plot_step_uncertainty(trajectories: Sequence[Mapping[str, Any]], path: str | Path | None = None):
    """Step-wise reasoning and exploration perplexity of each trajectory (Figure 1 analogue).

    Returns the matplotlib figure (saved to ``path`` when given).
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharex=True)
    for ax, region in zip(axes, ("exploration", "reasoning"), strict=True):
        for traj in trajectories:
            points = [(i + 1, u[region]) for i, u in enumerate(traj["uncertainty"]) if u.get(region) is not None]
            if points:
                style = "-" if traj["origin"].get("kind") != "branch" else ":"
                ax.plot(*zip(*points, strict=True), style, marker="o", alpha=0.7, label=traj["id"])
        ax.set_title(f"{region} uncertainty")
        ax.set_xlabel("step")
        ax.set_ylabel("perplexity")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
