"""Human views of a run: the trajectory tree (which branch forked where) and uncertainty plots."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from langgraph_parallelmuse.files import replacing
from langgraph_parallelmuse.protocol import one_line
from langgraph_parallelmuse.state import Trajectory

#: C0/C1 controls but tab and line feed (terminal escapes) and the bidi embeddings, overrides,
#: isolates and marks: printed raw, text from a tool could clear or retitle the terminal, or show
#: reordered. Lone surrogates too (a model's JSON escape of half an emoji, "\ud83d"): no encoding
#: has them, so printing the text raised UnicodeEncodeError. The tree shows them escaped; the CLI
#: removes them from what it prints.
UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(char: str) -> str:
    return char.encode("unicode_escape").decode() if UNPRINTABLE.match(char) else char


def _visible(text: object, limit: int | None = None) -> str:
    r"""``text`` on one line, its control and bidi characters shown as escapes.

    A notebook prints the tree as it is (the CLI strips such characters itself): raw, they would
    drive the terminal or reorder the line. Whitespace is collapsed as by ``protocol.one_line``.

    Args:
        text: Text from a model, a tool or a user.
        limit: The most characters to keep ("…" marks a cut), as for ``one_line``.

    Returns:
        The line to print.

    Example:
        >>> print(_visible("a\x1b]0;pwned\x07 b\u202eevil"))
        a\x1b]0;pwned\x07 b\u202eevil
    """
    line = one_line(text)
    shown = UNPRINTABLE.sub(lambda m: _escaped(m.group()), line)
    if limit is None or len(shown) <= limit:
        return shown
    # Cut between characters of the text, not inside an escape: "\u20…" names no character.
    kept, width = [], 0
    for piece in map(_escaped, line):
        if width + len(piece) > limit - 1:
            break
        kept.append(piece)
        width += len(piece)
    return "".join(kept) + "…"


def _fmt(score: float | None) -> str:
    return "  -  " if score is None else f"{score:5.2f}"


def _step_line(traj: Trajectory, i: int) -> str:
    step = traj["steps"][i]
    act = step["action"]
    if act.get("type") == "tool_call":
        arguments = ", ".join(_visible(v, 40) for v in (act.get("arguments") or {}).values())
        what = f"{_visible(act.get('name'), 40)}({arguments})"
    elif act.get("type") == "answer":
        what = f"answer: {_visible(act.get('answer'), 60)}"
    else:
        what = "invalid" + (f": {_visible(act['error'], 50)}" if act.get("error") else "")
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
        # A trajectory cancelled or cut short without a message has no reason to show ("None" read as one).
        outcome = repr(answer) if answer is not None else error
        reason = f": {_visible(outcome, 160)}" if outcome else ""
        head = f"{indent}{traj['id']} ({origin.get('kind', 'initial')}{extra}{note}) {traj['status']}{reason}"
        lines.append(head)
        for i in range(start, len(traj["steps"])):
            lines.append(f"{indent}├─ {_step_line(traj, i)}")
            for child in children.get((traj["id"], i), []):
                if child["id"] in shown:  # already printed (a repeated id, or a loop of parents)
                    continue
                lines.append(f"{indent}│  ⑂ forked here:")
                walk(child, i, indent + "│     ")

    for traj in trajectories:
        if traj["origin"].get("kind") != "branch":
            walk(traj, 0, "")
    # A branch whose parent is not in the list (a caller kept only some) is shown, not dropped. Those
    # whose parent is absent go first: listed child-first, an orphaned chain would print the child on
    # its own and then again under its parent. What is left (a fork step past its parent's steps, a
    # loop of parents) is shown last.
    ids = {t["id"] for t in trajectories}
    orphans = [t for t in trajectories if t["origin"].get("parent") not in ids]
    for traj in orphans + list(trajectories):
        if traj["id"] not in shown:
            origin = traj["origin"]
            walk(traj, origin.get("step") or 0, "", f", of {origin.get('parent')} step {origin.get('step')}")
    return "\n".join(lines)


def plot_step_uncertainty(trajectories: Sequence[Mapping[str, Any]], path: str | Path | None = None):
    """Step-wise reasoning and exploration perplexity of each trajectory (Figure 1 analogue).

    Returns the matplotlib figure. Without ``path`` it is a pyplot figure, so a notebook shows it;
    with ``path`` it is saved there and kept out of pyplot: the process's backend is not switched
    (a notebook's later plots still show) and a loop saving many plots does not pile up open figures.
    The file is written whole (:func:`~langgraph_parallelmuse.files.replacing`): a full disk or a crash
    while saving leaves the previous plot, not a cut one. A path without a suffix gets the default
    format's (``plot`` is saved as ``plot.png``), as matplotlib names it.
    """
    if path is None:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharex=True)
    else:
        import matplotlib
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 3.5))
        axes = fig.subplots(1, 2, sharex=True)
    for ax, region in zip(axes, ("exploration", "reasoning"), strict=True):
        for traj in trajectories:
            points = [(i + 1, u[region]) for i, u in enumerate(traj["uncertainty"]) if u.get(region) is not None]
            if points:
                style = "-" if traj["origin"].get("kind") != "branch" else ":"
                ax.plot(*zip(*points, strict=True), style, marker="o", alpha=0.7, label=traj["id"])
        ax.set_title(f"{region} uncertainty")
        ax.set_xlabel("step")
        ax.set_ylabel("perplexity")
    # A legend over no lines only warns ("No artists with labels"): put it where lines were drawn.
    labelled = [ax for ax in reversed(axes) if ax.get_legend_handles_labels()[0]]
    if labelled:
        labelled[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    if path is not None:
        target = Path(path)
        if not target.suffix:  # matplotlib appends the format's extension, to the temporary's name too
            target = target.with_name(f"{target.name}.{matplotlib.rcParams['savefig.format']}")
        with replacing(target) as tmp:
            fig.savefig(tmp, dpi=120)
    return fig
