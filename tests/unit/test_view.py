"""What the trajectory tree and the CLI's stats table show of odd but possible results."""

from __future__ import annotations

import warnings
from collections import defaultdict

import pytest

from langgraph_parallelmuse.cli import stats_table
from langgraph_parallelmuse.nodes import failure_message, rollout_summary
from langgraph_parallelmuse.protocol import parse_action
from langgraph_parallelmuse.view import render_tree


def _traj(tid: str, *, kind: str = "initial", answer=None, status="answered", error=None, **origin) -> dict:
    step = {"action": {"type": "answer", "answer": answer}, "text": "", "tokens": []}
    return {
        "id": tid,
        "origin": {"kind": kind, **origin},
        "answer": answer,
        "status": status,
        "error": error,
        "steps": [step, step],
        "observations": [],
        "uncertainty": [{}, {}],
        "stats": defaultdict(int),  # every count 0
    }


def test_a_multi_line_error_or_answer_stays_on_its_trajectorys_line():
    """A server's HTML error page started lines at column 0 that read as trajectories of their own."""
    page = "<html>\n<body>\nt9 (initial) answered: 'forged'\n</body>" + "x" * 500
    tree = render_tree([_traj("t0", status="failed", error=page), _traj("t1", answer="Par\nis")])
    lines = tree.splitlines()
    assert [line.split(" ")[0] for line in lines if not line.startswith("├")] == ["t0", "t1"]
    assert all(len(line) < 200 for line in lines)


def test_a_branch_without_its_parent_and_a_crossover_are_shown_with_their_origin():
    orphan = _traj("t9.s1.b0", kind="branch", answer="Lyon", parent="t9", step=1, region="exploration", score=3.0)
    cross = _traj("x0", kind="crossover", answer="Nice", parents=["t0", "f0"])
    tree = render_tree([_traj("t0", answer="Paris"), cross, orphan])
    assert "x0 (crossover of t0 × f0) answered: 'Nice'" in tree
    assert "t9.s1.b0 (branch, exploration PPL 3.00, of t9 step 1) answered: 'Lyon'" in tree


def test_the_stats_count_trajectories_that_ran_out_of_turns_or_context():
    trajs = [_traj("t0", answer="Paris"), _traj("t1", status="max_turns"), _traj("t2", status="context_exhausted")]
    stats = rollout_summary(trajs)
    assert (stats["answered"], stats["max_turns"], stats["context_exhausted"]) == (1, 1, 1)
    table = stats_table({"stats": {"rollout": stats}, "trajectories": trajs})
    row = next(r for r, label in enumerate(table.columns[0]._cells) if "out of turns" in label)
    assert table.columns[1]._cells[row] == "1 / 0 / 0 / 0 / 1 / 1"


def test_the_redundancy_row_leaves_out_crossovers_whose_graph_copies_their_parents():
    per = {
        "t0": {"kind": "initial", "entities": 4, "effective_entities": 2, "redundancy": 0.5},
        "f0": {"kind": "fill", "entities": 2, "effective_entities": 2, "redundancy": 0.0},
        "x0": {"kind": "crossover", "entities": 9, "effective_entities": 1, "redundancy": 0.9},
    }
    table = stats_table({"stats": {"infograph": {"per_trajectory": per}}, "trajectories": []})
    row = next(r for r, label in enumerate(table.columns[0]._cells) if "(Γ)" in label)
    assert table.columns[1]._cells[row] == "3.0 / 2.0 (Γ = 0.25)"


def test_the_message_of_a_run_where_every_trajectory_failed_is_one_bounded_line():
    trajs = [_traj(f"t{i}", status="failed", error="<html>\n" + "y" * 5000) for i in range(2)]
    message = failure_message(object(), trajs)
    assert "\n" not in message and len(message) < 1200
    assert "--db and --run-id" in message


async def test_the_progress_bars_end_full_when_a_consensus_stop_ends_the_run_early(monkeypatch):
    """Three of eight trajectories and two reports left the bars at 3/8 and 2/8 once the run had
    ended, as if work were still running."""
    from langgraph_parallelmuse import cli

    bars = []

    def keep(**kwargs):
        bars.append(progress := real(**kwargs))
        return progress

    real = cli._progress
    monkeypatch.setattr(cli, "_progress", keep)

    class Graph:
        async def astream(self, *args, **kwargs):
            done = {"event": "trajectory_finished", "kind": "initial", "status": "answered", "steps": 2, "answer": "P"}
            for i in range(3):
                yield "custom", done | {"id": f"t{i}"}
            for i in range(2):
                yield "custom", {"event": "report_written", "id": f"t{i}"}
            yield "values", {"answer": "Paris"}

    assert await cli._stream(Graph(), {"question": "q"}, {}, {}, 8) == {"answer": "Paris"}
    assert [(t.completed, t.total) for t in bars[0].tasks] == [(3, 3), (2, 2)]


def test_failed_tool_calls_and_unreadable_or_rejected_turns_are_counted_once_with_their_reasons():
    """Before, a run whose every search raised HTTP 401 answered with only ``failed 0`` in its stats."""

    def obs(step: int, name: str, content: str, *, error: bool = True) -> dict:
        return {"step": step, "name": name, "content": content, "error": error}

    call = {"action": {"type": "tool_call"}}
    parent = _traj("t0", answer="Lyon")
    parent["steps"] = [call, {"action": {"type": "invalid"}}, call, {**call, "rejected": "a repeated call"}]
    parent["observations"] = [
        obs(0, "search", "Error: tool 'search' failed: HTTP 401\n  Authorization: Bearer sk-live-0123456789"),
        obs(1, "invalid", "Error: no tool call"),  # the reply to an unreadable turn answers no call
        obs(2, "search", "Error: tool 'search' timed out after 30 s."),
        obs(3, "search", "Paris is the capital.", error=False),
    ]
    branch = _traj("t0.s2.b0", kind="branch", answer="Paris", parent="t0", step=2)
    branch["steps"] = [*parent["steps"][:2], call, call, call]
    branch["observations"] = [
        *parent["observations"][:2],  # the prefix: the parent's, not counted again
        *(obs(i, "visit", f"Error: unknown tool {i}") for i in (2, 3, 4)),
    ]
    stats = rollout_summary([parent, branch])
    assert (stats["tool_errors"], stats["invalid_turns"], stats["rejected_turns"]) == (5, 1, 1)
    assert stats["tool_error_reasons"] == [
        "Error: tool 'search' failed: HTTP 401 Authorization: Bearer ***",
        "Error: tool 'search' timed out after 30 s.",
        "Error: unknown tool 2",
    ]
    table = stats_table({"stats": {"rollout": stats}, "trajectories": [parent, branch]})
    rows = dict(zip(table.columns[0]._cells, table.columns[1]._cells, strict=True))
    assert rows["rollout: tool calls / failed"] == "0 / 5"  # tool_calls is the runner's count (0 in these stubs)
    assert rows["rollout: unreadable turns / turns kept though rejected"] == "1 / 1"


def test_control_and_bidi_characters_from_tools_and_models_are_shown_escaped():
    """A notebook prints the tree directly: a tool argument's escape sequence retitled the terminal
    and a right-to-left override reversed the line."""
    call = {"action": {"type": "tool_call", "name": "search", "arguments": {"query": "a\x1b]0;pwned\x07b"}}}
    traj = _traj("t0", status="failed", error="server said \u202eevil\u202c")
    traj["steps"] = [call, {"action": {"type": "answer", "answer": "\x1b[2JParis"}}]
    tree = render_tree([traj])
    assert not [ch for ch in tree if ch in "\x1b\x07\u202e\u202c"]
    assert "search(a\\x1b]0;pwned\\x07b)" in tree
    assert "failed: server said \\u202eevil\\u202c" in tree
    assert "answer: \\x1b[2JParis" in tree


def test_half_a_surrogate_pair_from_a_models_tool_call_is_shown_escaped_and_the_tree_prints():
    """A model's JSON escape of half an emoji parses to a lone surrogate, which no encoding has:
    printing the tree raised UnicodeEncodeError (in a notebook, and in the CLI after the run)."""
    action = parse_action('<think>x</think><tool_call>{"name": "search", "arguments": {"q": "a \\ud83d"}}</tool_call>')
    traj = _traj("t0", status="failed", error="stopped")
    traj["steps"] = [{"action": action}]
    tree = render_tree([traj])
    assert "search(a \\ud83d)" in tree
    tree.encode("utf-8")  # what print does


def test_a_cut_line_never_ends_inside_an_escape():
    # The escape was cut like any text: "\\u20…" names no character.
    traj = _traj("t0", status="failed", error="e" * 157 + "\u202e" + "x" * 9)
    head = render_tree([traj]).splitlines()[0]
    assert head.endswith("e…"), head
    traj = _traj("t0", status="failed", error="e" * 150 + "\u202e" + "x" * 9)
    assert render_tree([traj]).splitlines()[0].endswith("e\\u202exxx…")


def test_a_trajectory_that_ended_without_a_reason_shows_no_reason():
    tree = render_tree([_traj("t0", status="cancelled"), _traj("t1", status="failed"), _traj("t2", status="max_turns")])
    assert [line for line in tree.splitlines() if not line.startswith("├")] == [
        "t0 (initial) cancelled",
        "t1 (initial) failed",
        "t2 (initial) max_turns",
    ]


def test_a_tool_call_without_arguments_is_shown():
    traj = _traj("t0", answer="ok")
    traj["steps"][0] = {"action": {"type": "tool_call", "name": "visit", "arguments": None}}
    assert "visit()" in render_tree([traj])


def test_an_orphaned_chain_listed_child_first_shows_each_branch_once_under_its_parent():
    """The child was printed on its own, then again under its parent when that orphan was shown."""
    child = _traj("t0.s1.b0.s2.b0", kind="branch", answer="x", parent="t0.s1.b0", step=1)
    parent = _traj("t0.s1.b0", kind="branch", answer="x", parent="t0", step=0)
    tree = render_tree([child, parent])
    heads = [line.strip(" │") for line in tree.splitlines() if "(branch" in line]
    assert heads == [
        "t0.s1.b0 (branch, of t0 step 0) answered: 'x'",
        "t0.s1.b0.s2.b0 (branch) answered: 'x'",
    ]
    assert tree.index("t0.s1.b0 (") < tree.index("⑂ forked here") < tree.index("t0.s1.b0.s2.b0 (")


def test_a_loop_of_parents_shows_each_trajectory_once():
    first = _traj("a", kind="branch", answer="x", parent="b", step=0)
    second = _traj("b", kind="branch", answer="x", parent="a", step=0)
    tree = render_tree([first, second])
    assert tree.count("a (branch") == 1 and tree.count("b (branch") == 1


def _scored(tid: str, **origin) -> dict:
    return {"id": tid, "origin": origin or {"kind": "initial"}, "uncertainty": [{"exploration": 2.0}, {}]}


@pytest.mark.parametrize(
    "trajectories",
    [
        [],
        [{"id": "t0", "origin": {"kind": "initial"}, "uncertainty": []}],
        [_scored("t0"), _scored("t0.s0.b0", kind="branch")],
    ],
)
def test_saving_a_plot_leaves_pyplot_as_it_was_and_warns_of_no_empty_legend(tmp_path, trajectories):
    """Saving switched the whole process to Agg (a notebook's later plots stopped showing), left each
    figure open in pyplot, and a run with no scored step warned of a legend with no labels."""
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from langgraph_parallelmuse.view import plot_step_uncertainty

    previous = matplotlib.get_backend()
    matplotlib.use("svg")  # not Agg, so a switch to Agg shows
    try:
        open_before = plt.get_fignums()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig = plot_step_uncertainty(trajectories, tmp_path / "plot.png")
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == open_before
        assert not [w for w in caught if "legend" in str(w.message)]
        assert (tmp_path / "plot.png").stat().st_size > 0
        assert bool(fig.axes[0].get_legend() or fig.axes[1].get_legend()) == any(
            u for t in trajectories for u in t["uncertainty"]
        )
    finally:
        matplotlib.use(previous)


def test_a_plot_not_saved_is_a_pyplot_figure_a_notebook_shows():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from langgraph_parallelmuse.view import plot_step_uncertainty

    fig = plot_step_uncertainty([_scored("t0")])
    try:
        assert fig.number in plt.get_fignums()
        assert fig.axes[1].get_legend() is None and fig.axes[0].get_legend() is not None
    finally:
        plt.close(fig)


def test_a_plot_that_fails_while_saving_leaves_the_previous_one_whole(tmp_path):
    """Saved in place, a full disk mid-save replaced the last plot with a cut file."""
    pytest.importorskip("matplotlib")
    import errno
    from unittest import mock

    import matplotlib.backends.backend_svg as backend_svg

    from langgraph_parallelmuse.view import plot_step_uncertainty

    path = tmp_path / "plot.svg"
    plot_step_uncertainty([_scored("t0")], path)
    previous = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with mock.patch.object(backend_svg.RendererSVG, "draw_text", disk_full), pytest.raises(OSError):
        plot_step_uncertainty([_scored("t0")], path)
    assert path.read_bytes() == previous
    assert [p.name for p in tmp_path.iterdir()] == ["plot.svg"]  # no temporary left behind


def test_a_plot_path_without_a_suffix_is_saved_as_matplotlib_names_it(tmp_path):
    pytest.importorskip("matplotlib")
    from langgraph_parallelmuse.view import plot_step_uncertainty

    plot_step_uncertainty([_scored("t0")], tmp_path / "plot")
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
