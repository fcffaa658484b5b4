"""The benchmark scripts' resumable results: a rerun never takes rows measured with other settings
for its own, and paired intervals do not depend on the order a file holds its rows in. Their bad
arguments are refused by the parser, naming the flag, before a model loads or a question is read."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
from pathlib import Path

import pytest

from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.driver import GuidedDriver
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.eval import QAItem
from langgraph_parallelmuse.eval.bench import well_formed
from tests.unit.fakes import OLD_CALIBRATION

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import agent_protocol  # noqa: E402
import bench_rows  # noqa: E402
import bridge_choice  # noqa: E402
import candidate_recall  # noqa: E402
import common  # noqa: E402
import compare_revisions  # noqa: E402
import engine_precision  # noqa: E402
import engine_rollout  # noqa: E402
import infograph  # noqa: E402
import online_rollout  # noqa: E402
import serving_rollout  # noqa: E402
import stage2_reports  # noqa: E402

from langgraph_parallelmuse.models import LocalChatModel  # noqa: E402


def items(n: int) -> list[QAItem]:
    return [QAItem(f"q{i}", f"question {i}?", ["Paris"], [], [f"d{i}"], "toy") for i in range(n)]


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


SERVING = {"dataset": "hotpotqa_train100", "seed": 0, "precision": "float32", "eager": False, "block_size": 32}


def serving_row(chunk: int, **extra) -> dict:
    sums = {"conv_prompt": 10, "conv_cached": 5, "plain_prompt": 4, "plain_cached": 2}
    return {
        "part": "b",
        "backend": "engine",
        "method": "pm",
        "concurrency": 1,
        "chunk": chunk,
        "seconds": 1.0,
        "questions": [f"q{chunk}"],
        "branch": sums,
        "all": sums,
        "generated": {"tokens": 7},
        **extra,
    }


def test_serving_rollout_takes_only_chunks_measured_with_its_own_settings(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    bf16 = {**SERVING, "precision": "bfloat16"}
    # Chunk 0: a row that records no settings (the committed files); chunk 1: measured in bfloat16.
    write_rows(path, [serving_row(0), serving_row(1, settings=bf16)])
    key = {"part": "b", "backend": "engine", "method": "pm", "concurrency": 1}
    chunks = serving_rollout.run_chunks(items(2), [1])
    float32 = serving_rollout.Records(path, SERVING)
    assert not float32.has(**key, questions=["q0"]) and not float32.has(**key, questions=["q1"])
    assert float32.measured(chunks) == []
    assert serving_rollout.Records(path, bf16).has(**key, questions=["q1"])

    float32.add(serving_row(0))
    again = serving_rollout.Records(path, SERVING)
    assert again.has(**key, questions=["q0"]) and [r["chunk"] for r in again.measured(chunks)] == [0]
    # The report over the whole file keeps the three apart: no table mixes two experiments.
    serving_rollout.report(again.rows, 2)
    printed = capsys.readouterr().out
    assert printed.count("settings: ") == 3 and "settings: not recorded" in printed
    assert printed.count("1 of 2 questions measured") == 3


def run_serving(monkeypatch, tmp_path, limit: int) -> list[list[str]]:
    """``serving_rollout.py --parts b --concurrency 5 --limit LIMIT`` with the engine and the
    rollouts stubbed: the chunks it measured, by their question ids."""
    measured = []

    async def measure(model, chunk, index, cfg, tag, reset):
        if tag != "warm-up":
            measured.append([i.id for i in chunk])
        sums = {"conv_prompt": 10, "conv_cached": 5, "plain_prompt": 4, "plain_cached": 2}
        return {
            "seconds": 1.0,
            "questions": [i.id for i in chunk],
            "branch": sums,
            "all": sums,
            "generated": {"tokens": 7},
        }

    engine = type("Engine", (), {"engine": type("Cache", (), {"clear_cache": staticmethod(lambda: None)})()})()
    monkeypatch.setattr(serving_rollout, "dev_set", lambda name, limit: (items(limit), None))
    monkeypatch.setattr(serving_rollout, "measure", measure)
    monkeypatch.setattr(LocalChatModel, "embedded", staticmethod(lambda **options: engine))
    out = ["--out", str(tmp_path / "rows.jsonl")]
    monkeypatch.setattr(
        sys, "argv", ["serving_rollout.py", "--parts", "b", "--concurrency", "5", "--limit", str(limit), *out]
    )
    asyncio.run(serving_rollout.main())
    return measured


def test_serving_rollout_resumed_with_a_larger_limit_measures_the_questions_it_adds(monkeypatch, tmp_path, capsys):
    # Before: chunks were known by their index, so chunk 1 of --limit 7 ([q5, q6]) stood for chunk 1
    # of --limit 10 ([q5 .. q9]): q7-q9 were never measured ("7 of 10 questions measured").
    assert run_serving(monkeypatch, tmp_path, 7) == [[f"q{i}" for i in range(5)]] * 2 + [["q5", "q6"]] * 2
    capsys.readouterr()
    assert run_serving(monkeypatch, tmp_path, 10) == [[f"q{i}" for i in range(5, 10)]] * 2
    printed = capsys.readouterr().out
    # The [q5, q6] chunk of the first run is not this run's: no question counts twice.
    assert "10 of 10 questions measured" in printed and printed.count("| engine | ") == 2
    assert run_serving(monkeypatch, tmp_path, 10) == []  # all there: nothing runs again


ONLINE_CAL = Calibration(
    estimator="nll", quantile=0.8, thresholds={"exploration": 1.0}, samples={"exploration": 3}, confidence_floor=2.0
)


def online_row(qid: str, settings: dict | None) -> dict:
    variant = {
        "seconds": 1.0,
        "generated": 10,
        "trajectories": 8,
        "stopped": 0,
        "cancelled": 0,
        "fork_steps": [0],
        "fork_scores": [2.0],
        "vote": {"em": 1.0, "f1": 1.0, "contains": 1.0},
    }
    row = {"id": qid, **{k: variant for k in online_rollout.VARIANTS}}
    return row if settings is None else {**row, "settings": settings}


def run_online(monkeypatch, tmp_path, argv: list[str], *, fit: bool = True) -> None:
    """Run the script on toy questions; ``fit``: its calibration step writes ONLINE_CAL (else it
    loads the --calibration file already there, as a rerun does)."""

    async def calibrate(model, index, held_out, path, seed, quantile, *, name):
        ONLINE_CAL.save(path)  # the configs check that the file exists
        return ONLINE_CAL

    monkeypatch.setattr(online_rollout, "dev_set", lambda name, limit: (items(limit), None))
    if fit:
        monkeypatch.setattr(online_rollout, "calibrate", calibrate)
    monkeypatch.setattr(online_rollout.LocalChatModel, "embedded", staticmethod(lambda: None))
    files = ["--calibration", str(tmp_path / "cal.json"), "--out", str(tmp_path / "rows.jsonl")]
    monkeypatch.setattr(sys, "argv", ["online_rollout.py", "--limit", "2", "--calibrate-on", "2:4", *files, *argv])
    asyncio.run(online_rollout.main())


@pytest.mark.parametrize("argv", [["--seed", "3"], ["--consensus", "0.9"], ["--calibrate-on", "3:4"]])
def test_online_rollout_refuses_to_continue_rows_measured_with_other_settings(monkeypatch, tmp_path, capsys, argv):
    settings = {"dataset": "hotpotqa_train100", "seed": 0, "consensus": 0.75, "calibrate_on": [2, 4]}
    settings["calibration"] = ONLINE_CAL.to_dict()
    write_rows(tmp_path / "rows.jsonl", [online_row("q0", settings), online_row("q1", settings)])
    run_online(monkeypatch, tmp_path, [])  # the same settings: both questions resume, none runs
    assert "2 questions, one in flight" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="measured with other settings"):
        run_online(monkeypatch, tmp_path, argv)


def test_online_rollout_refuses_rows_that_record_no_settings(monkeypatch, tmp_path):
    write_rows(tmp_path / "rows.jsonl", [online_row("q0", None)])
    with pytest.raises(SystemExit, match="settings not recorded"):
        run_online(monkeypatch, tmp_path, [])


def test_online_rollout_reuses_a_calibration_file_only_if_fitted_with_the_quantile_asked(tmp_path):
    """Before: an existing --calibration file was reused whatever --quantile asked for."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(OLD_CALIBRATION))
    held_out = items(4)[2:]

    def load(quantile: float) -> Calibration:
        return asyncio.run(online_rollout.calibrate(None, None, held_out, path, 0, quantile))

    assert load(0.5).thresholds == OLD_CALIBRATION["thresholds"]  # written before it recorded questions: taken
    with pytest.raises(SystemExit, match=r"cal\.json was fitted with --quantile 0\.5, not 0\.8: pass --quantile 0\.5"):
        load(0.8)


@pytest.mark.parametrize(
    ("recorded", "wanted"),
    [
        (
            {"questions": ["q0", "q1"]},
            r"fitted on other questions \(2: q0, q1\) than those of --calibrate-on \(2: q2, q3",
        ),
        ({"model": "vllm smollm2"}, r"fitted on 'vllm smollm2', not on this run's 'embedded'"),
    ],
)
def test_online_rollout_refuses_a_calibration_file_fitted_on_other_questions_or_engine(tmp_path, recorded, wanted):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({**OLD_CALIBRATION, **recorded}))
    with pytest.raises(SystemExit, match=wanted):
        asyncio.run(online_rollout.calibrate(None, None, items(4)[2:], path, 0, 0.5, name="embedded"))
    fitting = {"questions": ["q3", "q2"], "model": "embedded"}
    path.write_text(json.dumps({**OLD_CALIBRATION, **fitting}))
    assert asyncio.run(online_rollout.calibrate(None, None, items(4)[2:], path, 0, 0.5, name="embedded")).questions


def test_online_rollout_resumes_rows_measured_with_a_calibration_file_that_records_no_origin(
    monkeypatch, tmp_path, capsys
):
    # The rows of the runs in progress store the calibration as the older script wrote it.
    (tmp_path / "cal.json").write_text(json.dumps(OLD_CALIBRATION))
    settings = {"dataset": "hotpotqa_train100", "seed": 0, "consensus": 0.75, "calibrate_on": [2, 4]}
    rows = [online_row(q, {**settings, "calibration": OLD_CALIBRATION}) for q in ("q0", "q1")]
    write_rows(tmp_path / "rows.jsonl", rows)
    run_online(monkeypatch, tmp_path, ["--quantile", "0.5"], fit=False)
    assert "2 questions, one in flight" in capsys.readouterr().out


def test_online_rollout_records_where_its_calibration_came_from(monkeypatch, tmp_path):
    async def run(runner, question, *, trajectory_id, thread_id, config):
        return {"uncertainty": [{"reasoning": 1.5, "exploration": 2.0, "all": 1.7}], "stats": {"lowest_confidence": 3}}

    monkeypatch.setattr(online_rollout, "RolloutRunner", lambda model, tools: type("R", (), {"run": run})())
    monkeypatch.setattr(online_rollout, "make_corpus_tools", lambda index, doc_ids: [])
    path = tmp_path / "cal.json"
    with pytest.warns(UserWarning, match="few samples"):
        asyncio.run(online_rollout.calibrate(None, None, items(4)[2:], path, 0, 0.5, name="embedded"))
    stored = json.loads(path.read_text())
    assert (stored["questions"], stored["model"], stored["top_logprobs"], stored["trajectories"]) == (
        ["q2", "q3"],
        "embedded",
        16,
        2,
    )


def test_online_rollout_on_vllm_starts_the_server_empties_its_cache_before_each_variant_and_stops_it(
    monkeypatch, tmp_path, capsys
):
    events = []

    @contextlib.contextmanager
    def serve(specs, **options):
        events.append(("start", len(specs)))
        yield [type("Server", (), {"url": "http://127.0.0.1:1"})()]
        events.append(("stop",))

    async def schedule(runner, question, *, config, run_id):
        events.append(("run", run_id))
        return [{"stats": {"generated_tokens": 5}, "status": "answered", "answer": "Lyon", "id": "t0"}] * config.n, []

    monkeypatch.setattr(online_rollout, "vllm_specs", lambda args, count: ["spec"] * count)
    monkeypatch.setattr(online_rollout, "serve", serve)
    monkeypatch.setattr(online_rollout, "reset_prefix_cache", lambda url: events.append(("reset", url)))
    monkeypatch.setattr(online_rollout, "run_schedule", schedule)
    monkeypatch.setattr(online_rollout, "RolloutRunner", lambda model, tools: model)
    monkeypatch.setattr(online_rollout, "make_corpus_tools", lambda index, doc_ids: [])
    run_online(monkeypatch, tmp_path, ["--limit", "1", "--engine", "vllm"])
    runs = [e[1] for e in events if e[0] == "run"]
    assert events[0] == ("start", 1) and events[-1] == ("stop",)
    assert runs == ["warm-up", *(f"q0/{v}" for v in online_rollout.VARIANTS)]
    # every measured variant starts from an empty prefix cache on the server
    for variant in online_rollout.VARIANTS:
        at = events.index(("run", f"q0/{variant}"))
        assert events[at - 1] == ("reset", "http://127.0.0.1:1")
    (row,) = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert row["settings"]["engine"] == {"vllm": "compiled", "block_size": 32}
    assert all("engine" not in row[v] for v in online_rollout.VARIANTS)  # vLLM's rows have no time split
    assert "1 questions, one in flight" in capsys.readouterr().out


def test_online_rollout_from_start_measures_only_later_questions_and_reports_every_row(monkeypatch, tmp_path, capsys):
    settings = {"dataset": "hotpotqa_train100", "seed": 0, "consensus": 0.75, "calibrate_on": [2, 4]}
    settings["calibration"] = ONLINE_CAL.to_dict()
    write_rows(tmp_path / "rows.jsonl", [online_row("q0", settings)])  # an earlier run measured question 1
    runs = []

    @contextlib.asynccontextmanager
    async def backend(args):
        yield online_rollout.Backend(None, lambda: None, None)

    async def schedule(runner, question, *, config, run_id):
        runs.append(run_id)
        return [{"stats": {"generated_tokens": 5}, "status": "answered", "answer": "Lyon", "id": "t0"}] * config.n, []

    monkeypatch.setattr(online_rollout, "backend", backend)
    monkeypatch.setattr(online_rollout, "run_schedule", schedule)
    monkeypatch.setattr(online_rollout, "RolloutRunner", lambda model, tools: model)
    monkeypatch.setattr(online_rollout, "make_corpus_tools", lambda index, doc_ids: [])
    run_online(monkeypatch, tmp_path, ["--start", "1"])
    # question 2 is the second question: its variants run in reversed order, as in a run from the first
    assert runs == ["warm-up", *(f"q1/{v}" for v in reversed(online_rollout.VARIANTS))]
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q0", "q1"]
    # what each variant voted on is kept, so the row can be checked and scored again
    assert rows[1]["online"]["answer"] == "Lyon"
    assert rows[1]["online"]["answers"] == [["t0", "answered", "Lyon"]] * 8
    assert "2 questions, one in flight" in capsys.readouterr().out


def test_agent_protocol_calls_a_trajectory_well_formed_as_the_bench_does(monkeypatch):
    # Before: a trajectory whose only search failed was well formed in the bench's records and
    # not in this script's rows.
    search = {"type": "tool_call", "name": "search", "arguments": {"query": "France"}}
    traj = {
        "answer": "Paris",
        "steps": [{"index": 0, "text": "", "action": search}, {"index": 1, "text": "", "action": {"type": "answer"}}],
        "observations": [
            {
                "step": 0,
                "name": "search",
                "arguments": {},
                "content": "Error: tool 'search' timed out after 30 s.",
                "error": True,
                "seconds": 30.0,
                "doc_ids": [],
            }
        ],
        "stats": {"generated_tokens": 9},
    }

    class Runner:
        def __init__(self, *args, **kwargs):
            pass

        async def run(self, *args, **kwargs):
            return traj

    reported = []

    async def write_report(*args, **kwargs):
        reported.append(kwargs)
        return {"status": "ok", "tokens": 1, "trajectory_tokens": 9}

    monkeypatch.setattr(agent_protocol, "RolloutRunner", Runner)
    monkeypatch.setattr(agent_protocol, "write_report", write_report)
    monkeypatch.setattr(agent_protocol, "make_corpus_tools", lambda index, doc_ids: [])
    item = QAItem("q0", "Which city is the capital of France?", ["Paris"], ["d0"], ["d0"], "toy")
    cfg = agent_protocol.make_config()
    row = asyncio.run(agent_protocol._row(None, item, None, cfg, GuidedDriver(), None))
    assert row["well_formed"] is well_formed(traj) is True
    # The report is the library's map step with the run's settings (before: compress_trajectory
    # with its own defaults, not the config's).
    assert reported == [{"config": cfg, "guided": True}]


def test_candidate_recall_reads_the_evidence_the_driver_shows_after_opening_the_supporting_paragraphs(
    monkeypatch, tmp_path
):
    # Before: the evidence was "Title: text" of every paragraph, uncut, where the driver shows the
    # opened pages newest first, cut at evidence_chars: a ceiling on answers the agent never sees.
    long = " ".join(["word"] * 170)  # a page the visit tool shows whole; two are more than the evidence holds
    docs = [{"id": f"d{i}", "title": f"Page {i}", "text": f"Page {i} is a page. {long}"} for i in range(3)]
    write_rows(tmp_path / "hotpotqa_train100.corpus.jsonl", docs)
    question = {"id": "q0", "question": "Which page?", "answers": ["Page 1"], "supporting_doc_ids": ["d0", "d1"]}
    write_rows(tmp_path / "hotpotqa_train100.questions.jsonl", [{**question, "context_doc_ids": ["d0", "d1", "d2"]}])
    monkeypatch.setenv("PARALLELMUSE_EVAL_DATA", str(tmp_path))
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    seen = []

    def candidates(question, evidence, **options):
        seen.append(evidence)
        return []

    monkeypatch.setattr(candidate_recall, "candidates", candidates)
    monkeypatch.setattr(sys, "argv", ["candidate_recall.py", "--limit", "1"])
    ran = candidate_recall.main()
    if asyncio.iscoroutine(ran):
        asyncio.run(ran)
    assert len(seen) == len(candidate_recall.LIMITS)
    evidence = seen[0]
    # The page opened last first, then what the budget leaves of the first, cut at a space.
    assert evidence.startswith("Page 1\n\nPage 1 is a page. word") and "\n\nPage 0\n\nPage 0 is a page." in evidence
    assert len(evidence) < 2 * len(docs[0]["text"]) and evidence.endswith(" word")


def test_agent_protocol_refuses_before_loading_the_model(monkeypatch, tmp_path):
    out = tmp_path / "rows.jsonl"
    default = {"dataset": "hotpotqa_train100", "seed": 0, "max_turns": 8, "guided": {}}
    write_rows(out, [{"id": "q0", "f1": 1.0, "settings": default}])

    def no_model():
        raise AssertionError("the model was loaded before the rows were checked")

    monkeypatch.setattr(agent_protocol, "dev_set", lambda name, limit: (items(limit), None))
    monkeypatch.setattr(agent_protocol.LocalChatModel, "embedded", staticmethod(no_model))
    argv = ["agent_protocol.py", "--limit", "1", "--out", str(out), "--guided", "candidate_limit=32"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"guided \{\} \(now \{'candidate_limit': 32\}\)"):
        asyncio.run(agent_protocol.main())


def test_agent_protocol_pairs_in_dev_set_order_whatever_order_the_file_holds(monkeypatch, tmp_path):
    dev = items(40)
    (tmp_path / "hotpotqa_train100.questions.jsonl").write_text(
        "".join(json.dumps({**vars(i), "split": "dev"}) + "\n" for i in dev)
    )
    monkeypatch.setenv("PARALLELMUSE_EVAL_DATA", str(tmp_path))
    rng = random.Random(1)
    metrics = {m: 0.0 for m in agent_protocol.METRICS}

    def rows() -> list[dict]:
        return [{**metrics, "id": i.id, "f1": rng.random(), "steps": rng.randint(3, 9)} for i in dev]

    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_rows(base, rows())
    new_rows = rows()
    write_rows(new, new_rows)
    in_order = agent_protocol.pair(base, new)
    # A resumed file: its first questions were rerun and stand at its end.
    write_rows(new, new_rows[8:] + new_rows[:8])
    assert agent_protocol.pair(base, new) == in_order


# The parts of a bench question record besides its id and trajectories (empty: no method ran).
BENCH_PARTS = dict.fromkeys(("methods", "reports", "picks", "timings"), {})


def dev_sets(path: Path, ids: list[str]) -> None:
    """Both dev sets' questions files in ``path``, each asking ``ids``, as the benchmarks read them."""
    for name in common.DATASETS:
        rows = [{"id": i, "question": f"{i}?", "answers": ["Paris"]} for i in ids]
        write_rows(path / f"{name}.questions.jsonl", rows)


def test_compare_revisions_runs_again_when_a_revision_moved_or_the_settings_changed(monkeypatch, tmp_path):
    dev_sets(tmp_path, ["q"])
    monkeypatch.setenv("PARALLELMUSE_EVAL_DATA", str(tmp_path))
    commits = {"old": "a" * 40, "HEAD": "b" * 40}
    ran = []

    def run(commit, target, args):
        ran.append(commit[0])
        target.mkdir(parents=True, exist_ok=True)
        rec = {"id": "q", "trajectories": {"t0": {"stats": {"generated_tokens": 1, "tool_calls": 1}, "answer": "x"}}}
        (target / "results.jsonl").write_text(json.dumps({**rec, **BENCH_PARTS}) + "\n")
        return 0.0

    def compare(*options: str) -> None:
        argv = ["compare_revisions.py", "old", "HEAD", "--limit", "1", "--out", str(tmp_path), *options]
        monkeypatch.setattr(sys, "argv", argv)
        assert compare_revisions.main() == 0

    monkeypatch.setattr(compare_revisions, "commit_of", commits.__getitem__)
    monkeypatch.setattr(compare_revisions, "_run", run)
    compare()
    compare()  # nothing changed: both cached
    compare("--seed", "7")
    compare("--dataset", "musique_train100")
    commits["HEAD"] = "c" * 40  # a commit since: HEAD names another revision now
    compare()
    assert ran == ["a", "b", "a", "b", "a", "b", "c"]


def test_compare_revisions_compares_only_the_first_limit_questions_of_a_larger_run(monkeypatch, tmp_path, capsys):
    # Before: the folder of "old", left by a run with --limit 5, was read whole, so --limit 4
    # reported "q4: only in before" and exited 1.
    dev_sets(tmp_path, [f"q{i}" for i in range(6)])
    monkeypatch.setenv("PARALLELMUSE_EVAL_DATA", str(tmp_path))
    commits = {"old": "a" * 40, "HEAD": "b" * 40}
    trajectory = {"t0": {"stats": {"generated_tokens": 1, "tool_calls": 1}, "answer": "x"}}
    ran = []

    def run(commit, target, args):
        ran.append((commit[0], args.limit))
        target.mkdir(parents=True, exist_ok=True)
        write_rows(
            target / "results.jsonl",
            [{"id": f"q{i}", "trajectories": trajectory, **BENCH_PARTS} for i in range(args.limit)],
        )
        return 0.0

    monkeypatch.setattr(compare_revisions, "commit_of", commits.__getitem__)
    monkeypatch.setattr(compare_revisions, "_run", run)
    out = ["--out", str(tmp_path / "runs")]
    monkeypatch.setattr(sys, "argv", ["compare_revisions.py", "old", "old", "--limit", "5", *out])
    assert compare_revisions.main() == 0
    monkeypatch.setattr(sys, "argv", ["compare_revisions.py", "old", "HEAD", "--limit", "4", *out])
    assert compare_revisions.main() == 0
    assert ran == [("a", 5), ("b", 4)]  # the larger run of "old" serves the smaller one
    printed = capsys.readouterr().out
    assert "4 questions, 4 trajectories" in printed and "identical" in printed


def test_compare_revisions_runs_a_revision_again_whose_results_a_crash_cut(monkeypatch, tmp_path, capsys):
    # Before: its own reader met the cut line with a JSONDecodeError traceback; the bench's reader
    # takes the cut question as not run, so the revision runs again.
    dev_sets(tmp_path, ["q0", "q1"])
    monkeypatch.setenv("PARALLELMUSE_EVAL_DATA", str(tmp_path))
    commits = {"old": "a" * 40, "HEAD": "b" * 40}
    record = {"trajectories": {"t0": {"stats": {"generated_tokens": 1, "tool_calls": 1}, "answer": "x"}}, **BENCH_PARTS}
    ran = []

    def run(commit, target, args):
        ran.append(commit[0])
        target.mkdir(parents=True, exist_ok=True)
        write_rows(target / "results.jsonl", [{"id": q, **record} for q in ("q0", "q1")])
        return 0.0

    monkeypatch.setattr(compare_revisions, "commit_of", commits.__getitem__)
    monkeypatch.setattr(compare_revisions, "_run", run)
    out = tmp_path / "runs"
    cut = compare_revisions.run_dir(
        out, commits["old"], argparse.Namespace(dataset="hotpotqa_train100", seed=0, modes="exploration")
    )
    cut.mkdir(parents=True)
    (cut / "results.jsonl").write_text(json.dumps({"id": "q0", **record}) + '\n{"id": "q1", "trajec')
    monkeypatch.setattr(sys, "argv", ["compare_revisions.py", "old", "HEAD", "--limit", "2", "--out", str(out)])
    assert compare_revisions.main() == 0
    assert ran == ["a", "b"] and "identical" in capsys.readouterr().out


def test_stage2_reports_reuses_stage1_only_when_made_with_the_same_settings(monkeypatch, tmp_path):
    made = []

    async def schedule(runner, question, *, config, run_id):
        made.append((run_id, config.n, config.seed))
        return [{"id": "t0", "answer": "x"}] * config.n, []

    monkeypatch.setattr(stage2_reports, "run_schedule", schedule)
    monkeypatch.setattr(stage2_reports, "RolloutRunner", lambda model, tools: None)
    monkeypatch.setattr(stage2_reports, "make_corpus_tools", lambda index, doc_ids: [])
    cache = tmp_path / "trajectories.json"

    def stage1(limit: int, n: int = 2, seed: int = 0) -> dict:
        args = type("Args", (), {"trajectories": str(cache), "dataset": "hotpotqa_train100", "n": n, "seed": seed})
        return asyncio.run(stage2_reports.rollouts(None, items(limit), None, args))

    cache.write_text(json.dumps({"q0": []}))  # a cache that records no settings
    assert len(stage1(1)["q0"]) == 2
    assert set(stage1(2)) == {"q0", "q1"}  # a larger --limit runs only the question it adds
    assert made == [("q0/s2", 2, 0), ("q1/s2", 2, 0)]
    made.clear()
    assert len(stage1(2, n=3)["q1"]) == 3 and len(stage1(2, n=3, seed=4)["q0"]) == 3
    assert made == [("q0/s2", 3, 0), ("q1/s2", 3, 0), ("q0/s2", 3, 4), ("q1/s2", 3, 4)]


def test_online_rollout_splits_time_only_over_rows_that_record_the_engine(capsys):
    # Rows measured before the engine's time split have no "engine" figures: averaging them in
    # as zeros would understate where the time went.
    engine = {f: 0 for f in online_rollout.SPLIT_FIGURES} | {
        "prefill_seconds": 6.0,
        "decode_seconds": 3.0,
        "batches": 30,
        "batch_rows": 120,
    }
    timed = {"id": "b", **{k: {"seconds": 10.0, "engine": engine} for k in online_rollout.VARIANTS}}
    online_rollout.split([online_row("a", None), timed])
    lines = capsys.readouterr().out.splitlines()
    assert "1 questions with engine figures" in lines[1]
    # wall 10 s = prefill 6 + decode 3 + 1 other; 4 rows per step, 100 ms a step
    assert "| scratch | 10.0 | 6.0 | 3.0 | 1.0 | 0 | 0 | 30 | 4.00 | 100 |" in lines
    online_rollout.split([online_row("a", None)])
    assert capsys.readouterr().out == ""


def test_online_rollout_reports_a_stopped_run_without_loading_a_model(monkeypatch, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(online_row(q, {"seed": 0})) + "\n" for q in ("a", "b")))
    monkeypatch.setattr(online_rollout, "dev_set", lambda *a: pytest.fail("no dev set is read"))
    monkeypatch.setattr(online_rollout.LocalChatModel, "embedded", staticmethod(lambda: pytest.fail("no model")))
    monkeypatch.setattr(sys, "argv", ["online_rollout.py", "--out", str(rows), "--report-only"])
    asyncio.run(online_rollout.main())
    assert "2 questions, one in flight" in capsys.readouterr().out
    with rows.open("a") as fh:
        fh.write(json.dumps(online_row("c", {"seed": 1})) + "\n")
    with pytest.raises(SystemExit, match="mixes rows measured with different settings"):
        asyncio.run(online_rollout.main())
    rows.write_text("")  # a run stopped before its first question
    with pytest.raises(SystemExit, match="holds no rows yet"):
        asyncio.run(online_rollout.main())


@pytest.fixture
def nothing_loads(monkeypatch):
    """Every way the scripts load a model or read the dev set fails the test: a bad argument is
    refused before either."""

    def loaded(*args, **kwargs):
        pytest.fail("the model was loaded or the dev set read before the arguments were checked")

    monkeypatch.setattr(LocalChatModel, "embedded", staticmethod(loaded))
    for script in (online_rollout, serving_rollout, infograph, engine_rollout, engine_precision):
        monkeypatch.setattr(script, "dev_set", loaded)
    monkeypatch.setattr(common, "export_model", loaded)
    monkeypatch.setattr(engine_precision, "load_model", loaded)


def refused(monkeypatch, capsys, script, argv: list[str]) -> str:
    """What the parser of ``script`` says refusing ``argv``, after checking it exited as argparse does."""
    monkeypatch.setattr(sys, "argv", [f"{script.__name__}.py", *argv])
    with pytest.raises(SystemExit) as stop:
        ran = script.main()
        if asyncio.iscoroutine(ran):
            asyncio.run(ran)
    assert stop.value.code == 2  # parser.error's exit, not a message from a later check
    err = capsys.readouterr().err
    assert err.startswith("usage: ")
    return err


@pytest.mark.parametrize(
    "flag, value, wanted",
    [("--quantile", "1.5", "(0, 1)"), ("--quantile", "0", "(0, 1)"), ("--consensus", "0.3", "(0.5, 1]")],
)
def test_online_rollout_refuses_a_share_out_of_range(monkeypatch, capsys, nothing_loads, flag, value, wanted):
    # Before: --quantile was refused by Calibration.fit after every calibration trajectory ran,
    # --consensus by the config check after the calibration.
    err = refused(monkeypatch, capsys, online_rollout, [flag, value, "--calibration", "missing.json"])
    assert f"argument {flag}: {float(value):g}: give a number in {wanted}" in err


@pytest.mark.parametrize("value", ["a:b", "20", "35:20", "20:20"])
def test_online_rollout_refuses_a_calibration_range_that_is_not_start_end(monkeypatch, capsys, nothing_loads, value):
    err = refused(monkeypatch, capsys, online_rollout, ["--calibrate-on", value])
    assert f"argument --calibrate-on: {value!r}: give " in err and "START" in err


@pytest.mark.parametrize("argv", [["--limit", "30"], ["--limit", "25", "--calibrate-on", "10:20"]])
def test_online_rollout_refuses_calibrating_on_the_measured_questions(monkeypatch, capsys, nothing_loads, argv):
    err = refused(monkeypatch, capsys, online_rollout, argv)
    assert "--calibrate-on" in err and "overlaps the measured questions (the first --limit" in err


def test_online_rollout_with_start_refuses_only_a_calibration_inside_the_measured_range(
    monkeypatch, capsys, nothing_loads
):
    err = refused(monkeypatch, capsys, online_rollout, ["--start", "30", "--limit", "100", "--calibrate-on", "20:35"])
    assert "overlaps the measured questions (31..100)" in err
    err = refused(monkeypatch, capsys, online_rollout, ["--start", "20", "--limit", "20"])
    assert "--start 20 leaves no question to measure" in err
    assert (
        online_rollout.overlap(argparse.Namespace(report_only=False, start=35, limit=100, calibrate_on=(20, 35)))
        is None
    )  # calibrated on questions 21..35, measuring 36..100


@pytest.mark.parametrize(
    "script, limit",
    [
        *((s, v) for s in (online_rollout, serving_rollout, infograph, engine_rollout) for v in ("-1", "0")),
        (engine_precision, "-1"),  # its --limit 0 means: no branch-pick comparison
    ],
)
def test_scripts_refuse_a_limit_below_1(monkeypatch, capsys, nothing_loads, script, limit):
    # Before: a negative --limit failed in load_questions without naming --limit; 0 loaded the model.
    err = refused(monkeypatch, capsys, script, ["--limit", limit])
    assert "argument --limit: " in err and "give an integer >= " in err


def test_engine_precision_keeps_limit_0_for_the_sequences_alone(monkeypatch):
    class Loaded(Exception):
        pass

    def load_model():
        raise Loaded

    monkeypatch.setattr(engine_precision, "dev_set", lambda *a: pytest.fail("--limit 0 reads no questions"))
    monkeypatch.setattr(engine_precision, "load_model", load_model)
    monkeypatch.setattr(sys, "argv", ["engine_precision.py", "--limit", "0"])
    with pytest.raises(Loaded):
        engine_precision.main()


@pytest.mark.parametrize(
    "script, value",
    [(serving_rollout, "a"), (serving_rollout, "1,0"), (serving_rollout, ","), (engine_rollout, "0")],
)
def test_scripts_refuse_a_concurrency_that_is_not_positive(monkeypatch, capsys, nothing_loads, script, value):
    err = refused(monkeypatch, capsys, script, ["--concurrency", value])
    assert "argument --concurrency: " in err and "give " in err


def test_agent_protocol_pairs_one_question_as_noise_and_refuses_files_without_a_common_one(monkeypatch, tmp_path):
    monkeypatch.setenv("PARALLELMUSE_EVAL_DATA", str(tmp_path))
    metrics = {m: 0.0 for m in agent_protocol.METRICS}
    base, new, other = tmp_path / "base.jsonl", tmp_path / "new.jsonl", tmp_path / "other.jsonl"
    write_rows(base, [{**metrics, "id": "q0"}])
    write_rows(new, [{**metrics, "id": "q0", "f1": 1.0}])
    write_rows(other, [{**metrics, "id": "q9"}])
    # One question's difference has no spread: it was printed "beyond noise".
    f1 = next(line for line in agent_protocol.pair(base, new).splitlines() if line.startswith("| f1 "))
    assert f1.endswith("| noise |")
    with pytest.raises(SystemExit, match="no question in common"):
        agent_protocol.pair(base, other)


def test_infograph_resumes_only_rows_of_its_own_seed_and_keeps_each_seeds_checkpoints(monkeypatch, tmp_path):
    """Before: a rerun with another --seed skipped the questions run with the first seed, and reused
    their checkpointed trajectories, so one table mixed two seeds."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    # The committed rows record no settings: run with the default seed.
    write_rows(out / "hotpotqa_train100.jsonl", [{"id": "q0", "dataset": "toy"}])
    ran, saved = [], []
    monkeypatch.setattr(infograph, "dev_set", lambda name, limit: (items(2), None))
    monkeypatch.setattr(LocalChatModel, "embedded", staticmethod(lambda: None))

    @contextlib.asynccontextmanager
    async def checkpointer(path):
        saved.append(Path(path).name)
        yield None

    async def run_question(model, index, item, seed, saver):
        ran.append((item.id, seed))
        method = {"f1": 0.0}
        return {
            "id": item.id,
            "seconds": 0.0,
            "methods": dict.fromkeys(infograph.METHODS, method),
            "crossover": {"pairs": []},
        }

    monkeypatch.setattr(infograph, "open_checkpointer", checkpointer)
    monkeypatch.setattr(infograph, "run_question", run_question)

    def run(seed: int) -> None:
        args = argparse.Namespace(dataset="hotpotqa_train100", limit=2, seed=seed, out_dir=out, work_dir=work)
        asyncio.run(infograph.run(args))

    with pytest.raises(SystemExit, match=r"seed 0 \(now 1\)"):
        run(1)
    assert ran == []
    run(0)
    assert ran == [("q1", 0)] and saved == ["hotpotqa_train100.sqlite"]
    (out / "hotpotqa_train100.jsonl").unlink()
    run(1)
    assert ran[1:] == [("q0", 1), ("q1", 1)] and saved[1:] == ["hotpotqa_train100.seed1.sqlite"]


def test_infograph_summarizes_trajectories_without_entities(tmp_path):
    """Before: a group whose trajectories all had no entity (Γ None) stopped the summary with a
    StatisticsError, and a set without any entity stopped the plot with a ZeroDivisionError."""
    pytest.importorskip("matplotlib")
    counts = dict.fromkeys(("entities", "effective_entities", "gold_effective_entities"), 0)
    empty = {**counts, "redundancy": None, "gold_redundancy": None}
    records = [{"trajectories": {"t0": {**empty, "kind": "initial"}, "t0.b0": {**empty, "kind": "branch"}}}]
    rows = infograph.redundancy_rows(records)
    assert rows["branches"]["redundancy"] is None
    assert "| branches | 1 | 0.0 | 0.0 | 0.0 | — | — |" in infograph._redundancy_lines(records, rows)
    infograph.plot({"toy": {"redundancy": rows}}, tmp_path / "redundancy.png")
    assert (tmp_path / "redundancy.png").exists()


def test_bridge_choice_records_its_tool_responses_as_the_agent_does(tmp_path):
    """Before: the script built the observations itself, without the agent's cut at
    max_observation_chars, so the driver chose from snippets no trajectory shows."""
    from langgraph_parallelmuse.config import make_config
    from langgraph_parallelmuse.tools import CorpusIndex

    docs = [{"id": f"d{i}", "title": f"Harbour {i}", "text": "harbour lighthouse keeper " * 60} for i in range(6)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    index = CorpusIndex.from_jsonl(tmp_path / "corpus.jsonl")
    item = QAItem(
        "2hop__1_2",
        "Who kept the harbour lighthouse?",
        ["Ann"],
        ["d0"],
        [d["id"] for d in docs],
        "musique",
        {"question_decomposition": [{"paragraph_support_idx": 0, "answer": "Harbour 0"}]},
    )
    cfg = make_config(max_observation_chars=200)
    steps, observations = asyncio.run(bridge_choice._after_first_hop(item, index, cfg))
    assert [o["name"] for o in observations] == ["search", "visit"]
    assert all(len(o["content"]) <= 200 + len(" …[truncated]") for o in observations)
    assert observations[0]["content"].endswith("…[truncated]")


async def test_bench_rows_store_no_dev_text_and_restore_records_a_rerun_takes_as_finished(monkeypatch, tmp_path):
    from langgraph_parallelmuse.eval.bench import BenchSettings, finished_records, run_bench
    from langgraph_parallelmuse.tools import CorpusIndex
    from tests.unit import test_bench

    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.jsonl"
    write_rows(corpus, test_bench.DOCS)
    index, dev = CorpusIndex.from_jsonl(corpus), test_bench.ITEMS
    settings = BenchSettings(**{**test_bench.SMALL, "methods": ("majority", "parallelmuse")})
    run = tmp_path / "run"
    original = await run_bench(test_bench._model(), index, dev[:2], settings, run / "results.jsonl")
    target = tmp_path / "store" / "toy.jsonl"
    head = bench_rows.commit_of("HEAD")
    assert bench_rows.store(run, dev, target, revision=head) == (2, 2)
    text = target.read_text()
    assert not any(item.question in text for item in dev) and '"answers"' not in text and "capital" not in text
    # A later session's run directory holds the first question; the stored second is added to it.
    later = tmp_path / "later"
    later.mkdir()
    write_rows(later / "results.jsonl", original[:1])
    monkeypatch.setattr(bench_rows, "_changed", lambda rev: rev != head)
    assert bench_rows.restore(later, dev, target) == (1, [])
    resumed = finished_records(later / "results.jsonl", dev, settings=settings)
    assert [r["id"] for r in resumed] == ["q1", "q2"]
    kept = {k: v for k, v in resumed[1].items() if k not in ("question", "answers")}
    assert kept == {**json.loads(json.dumps(bench_rows.stripped(original[1]))), "revision": head}
    assert resumed[1]["question"] == dev[1].question and resumed[1]["answers"] == dev[1].answers

    model = test_bench._model()
    assert [r["id"] for r in await run_bench(model, index, dev[:2], settings, later / "results.jsonl")] == ["q1", "q2"]
    assert model.calls == []  # both finished: neither question ran again
    # Stored again with a third question: merged in dev-set order, the earlier rows kept.
    (run / "results.jsonl").unlink()
    (third,) = await run_bench(test_bench._model(), index, dev[2:], settings, run / "results.jsonl")
    assert bench_rows.store(run, dev, target, revision="abc") == (1, 3)
    stored = [json.loads(line) for line in target.read_text().splitlines()]
    assert [(r["id"], r["revision"]) for r in stored] == [("q1", head), ("q2", head), ("q3", "abc")]
    # Restoring a record of other code says so: one table must come from one agent.
    (later / "results.jsonl").unlink()
    assert bench_rows.restore(later, dev, target) == (3, ["abc"])
    # Stored from a run directory restore filled: each record keeps the revision that ran it, and its calls.
    before = target.read_text()
    assert bench_rows.store(later, dev, target, revision="later") == (0, 3)
    assert target.read_text() == before


def test_bench_rows_restore_says_when_nothing_is_stored(tmp_path):
    with pytest.raises(ConfigError, match="nothing stored"):
        bench_rows.restore(tmp_path, items(1), tmp_path / "none.jsonl")


def test_bench_rows_calls_the_working_trees_library_changed_from_a_revision_that_edited_it():
    # HEAD's library is the working tree's unless uncommitted edits differ; the first commit has none.
    first = bench_rows.subprocess.run(
        ["git", "-C", str(common.ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True, text=True
    ).stdout.split()[0]
    assert bench_rows._changed(first) and bench_rows._changed("unrecorded")
