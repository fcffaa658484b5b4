"""Plots of benchmark results (matplotlib, optional extra ``plot``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path


def _figure(figsize: tuple[float, float]):
    """A figure outside pyplot, to save and drop.

    Saved through pyplot, the process's backend was switched to Agg: a notebook's or a GUI
    session's later plots no longer showed. A bare ``Figure`` needs no backend and no closing.

    Raises:
        ImportError: matplotlib (the ``plot`` extra) is not installed.
    """
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def uncertainty_profile(records: Sequence[dict]) -> dict[str, dict[int, tuple[float, int]]]:
    """Per region, step index → (mean perplexity, steps measured) over the from-scratch trajectories.

    From-scratch means the initial trajectory and the budget fills, not the branches: a branch
    regenerates from its fork, so its early steps are its parent's.

    Example:
        >>> from pathlib import Path
        >>> from langgraph_parallelmuse.eval.bench import load_done
        >>> records = list(load_done(Path("bench-results/hotpot/results.jsonl")).values())  # a bench's rows
        >>> mean, count = uncertainty_profile(records)["reasoning"][0]  # doctest: +SKIP
    """
    values: dict[str, dict[int, list[float]]] = {"reasoning": defaultdict(list), "exploration": defaultdict(list)}
    for rec in records:
        for traj in rec["trajectories"].values():
            if traj["origin"].get("kind", "initial") not in ("initial", "fill"):
                continue
            for i, scores in enumerate(traj["uncertainty"]):
                for region in values:
                    if scores.get(region) is not None:
                        values[region][i].append(scores[region])
    return {
        region: {step: (sum(v) / len(v), len(v)) for step, v in sorted(steps.items())}
        for region, steps in values.items()
    }


def plot_uncertainty_profile(profile: dict[str, dict[int, tuple[float, int]]], path: str | Path) -> Path:
    """Mean step-wise perplexity per functional region (the paper's Figure 1 analogue).

    Example:
        >>> records = []  # ``parallelmuse bench`` rows, as in :func:`uncertainty_profile`
        >>> plot_uncertainty_profile(uncertainty_profile(records), "profile.png")  # doctest: +SKIP
    """
    fig = _figure((6, 3.5))
    ax = fig.subplots()
    for region, marker in (("exploration", "o"), ("reasoning", "s")):
        points = sorted(profile[region].items())
        ax.plot([s + 1 for s, _ in points], [mean for _, (mean, _) in points], marker=marker, label=region)
        # A step that few trajectories reach can dominate the curve: each point shows its count.
        for step, (mean, count) in points:
            ax.annotate(
                str(count), (step + 1, mean), textcoords="offset points", xytext=(0, 6), fontsize=6, ha="center"
            )
    ax.set_xlabel("step")
    ax.set_ylabel("mean perplexity")
    ax.set_title("Step-wise uncertainty per functional region (numbers: steps measured)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def plot_accuracy_vs_tokens(summary: dict[str, dict], path: str | Path, *, metric: str = "f1") -> Path:
    """Accuracy (with 95% interval) against generated tokens per question, one point per method.

    Methods are told apart by colour and marker in a legend beside the axes: several of them share
    the same cost (every vote reads the same trajectories), where labels on the points overlap. A
    method without ``metric`` (``None``: a judged method none of whose verdicts was readable) is left out.

    Example:
        >>> from langgraph_parallelmuse.eval.bench import summarize
        >>> records = []  # ``parallelmuse bench`` rows, as in :func:`uncertainty_profile`
        >>> plot_accuracy_vs_tokens(summarize(records), "accuracy_vs_tokens.png")  # doctest: +SKIP
    """
    fig = _figure((9, 4.5))
    ax = fig.subplots()
    markers = "osD^vPX<>"
    # A metric a method lacks stays a KeyError: skipped, a misspelt one would draw an empty plot.
    entries = [(name, e) for name, e in summary.items() if "generated_tokens" in e and e[metric] is not None]
    for i, (name, entry) in enumerate(entries):
        mean, lo, hi = entry[metric]
        x = entry["generated_tokens"] + (entry.get("report_tokens") or 0) + entry.get("aggregate_tokens", 0)
        ax.errorbar([x], [mean], yerr=[[mean - lo], [hi - mean]], fmt=markers[i % len(markers)], capsize=3, label=name)
    questions = max((e.get("questions", 0) for _, e in entries), default=0)
    ax.set_xlabel("generated tokens per answer (rollout + reports + aggregation)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs cost ({questions} questions, 95% intervals)")
    if entries:  # an empty legend warns "No artists with labels found"
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
