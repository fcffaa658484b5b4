"""The benchmark plots are saved without touching pyplot: a notebook's own plots go on showing."""

import pytest

from langgraph_parallelmuse.eval.plots import plot_accuracy_vs_tokens, plot_uncertainty_profile

PROFILE = {"exploration": {0: (3.0, 4), 1: (2.5, 2)}, "reasoning": {0: (2.0, 4)}}
SUMMARY = {
    "majority": {"f1": (0.5, 0.3, 0.7), "generated_tokens": 900.0, "questions": 20},
    "parallelmuse": {"f1": (0.6, 0.4, 0.8), "generated_tokens": 950.0, "report_tokens": 80.0, "questions": 20},
}


@pytest.mark.parametrize(
    "draw",
    [
        lambda path: plot_uncertainty_profile(PROFILE, path),
        lambda path: plot_accuracy_vs_tokens(SUMMARY, path),
    ],
    ids=["uncertainty profile", "accuracy vs tokens"],
)
def test_saving_a_benchmark_plot_keeps_the_processs_backend(tmp_path, draw):
    # Before: each plot switched the process to Agg, so a notebook's later figures no longer showed.
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    previous = matplotlib.get_backend()
    matplotlib.use("svg")  # not Agg, so a switch to Agg shows
    try:
        open_before = plt.get_fignums()
        path = draw(tmp_path / "plot.png")
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == open_before
        assert path.read_bytes().startswith(b"\x89PNG")
    finally:
        matplotlib.use(previous)


def test_accuracy_plot_leaves_out_a_method_without_the_metric_and_draws_an_empty_summary(tmp_path, recwarn):
    pytest.importorskip("matplotlib")
    # A judged method none of whose verdicts was readable has judge None: it raised a TypeError.
    judged = {name: {**entry, "judge": entry["f1"]} for name, entry in SUMMARY.items()}
    judged["majority"]["judge"] = None
    assert plot_accuracy_vs_tokens(judged, tmp_path / "judge.png", metric="judge").read_bytes().startswith(b"\x89PNG")
    # No method: no legend to draw (matplotlib warned of one without artists).
    assert plot_accuracy_vs_tokens({}, tmp_path / "empty.png").exists()
    assert not [w for w in recwarn if "legend" in str(w.message)]
    with pytest.raises(KeyError):
        plot_accuracy_vs_tokens(SUMMARY, tmp_path / "typo.png", metric="f2")
