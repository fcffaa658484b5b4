"""Plots of benchmark results (matplotlib, optional extra ``plot``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def uncertainty_profile(
    records: Sequence[dict], *, kinds: tuple[str, ...] = ("initial",)
) -> dict[str, dict[int, list[float]]]:
    """Per region, step index → perplexities of the from-scratch trajectories' steps."""
    profile: dict[str, dict[int, list[float]]] = {"reasoning": defaultdict(list), "exploration": defaultdict(list)}
    for rec in records:
        for traj in rec["trajectories"].values():
            if traj["origin"].get("kind", "initial") not in kinds:
                continue
            for i, scores in enumerate(traj["uncertainty"]):
                for region in profile:
                    if scores.get(region) is not None:
                        profile[region][i].append(scores[region])
    return profile


def plot_uncertainty_profile(records: Sequence[dict], path: str | Path) -> Path:
    """Mean step-wise perplexity per functional region (the paper's Figure 1 analogue).

    Example:
        >>> plot_uncertainty_profile(records, "profile.png")  # doctest: +SKIP
    """
    plt = _plt()
    profile = uncertainty_profile(records, kinds=("initial", "fill"))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for region, marker in (("exploration", "o"), ("reasoning", "s")):
        steps = sorted(profile[region])
        means = [sum(profile[region][s]) / len(profile[region][s]) for s in steps]
        counts = [len(profile[region][s]) for s in steps]
        ax.plot([s + 1 for s in steps], means, marker=marker, label=f"{region} (n={sum(counts)})")
    ax.set_xlabel("step")
    ax.set_ylabel("mean perplexity")
    ax.set_title("Step-wise uncertainty per functional region")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_accuracy_vs_tokens(summary: dict[str, dict], path: str | Path, *, metric: str = "f1") -> Path:
    """Accuracy (with 95% interval) against generated tokens per question, one point per method."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, entry in summary.items():
        if "generated_tokens" not in entry:
            continue
        mean, lo, hi = entry[metric]
        x = entry["generated_tokens"] + (entry.get("report_tokens") or 0)
        ax.errorbar([x], [mean], yerr=[[mean - lo], [hi - mean]], fmt="o", capsize=3)
        ax.annotate(name, (x, mean), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("generated tokens per question (rollout + reports)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs cost")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
