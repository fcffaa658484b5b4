"""Fault injected: what a new user types at the command line, and runs resumed in SQLite.

Each reproduction from the failures issue, run through ``cli.main`` in-process with a scripted model
(``cli._model`` and ``cli._tools`` are replaced, so nothing loads): a resumed run must be the same
run or a clear error; a bad ``--db`` is one line before anything loads; bad settings, calibration
files, corpora and tool results name the fix; ``--help`` lists the allowed values; ``make run``
passes the question through the shell untouched.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import re
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from langgraph_parallelmuse import cli
from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.errors import ConfigError, CorpusError, MissingLogprobsError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.tools import CorpusIndex
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    agent_step,
    answer_text,
    call_text,
    make_tools,
    research_responder,
    role_of,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
PARIS, HAMLET = "What is the capital of France?", "Who wrote Hamlet?"


def _agent(index, messages):
    if index == 0:
        return Reply(call_text("search", "Look it up", query="capital"), regions={"tool_call": -2.0})
    return Reply(answer_text("Paris"))


def _cli_on(monkeypatch, agent, **responder) -> ScriptedChatModel:
    """``cli.main`` on a scripted model whose agent steps ``agent`` writes; returns the model (its
    ``calls`` count every request)."""
    model = ScriptedChatModel(responder=research_responder(agent, **responder))
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: model)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    return model


@pytest.fixture
def fake_cli(monkeypatch):
    """``cli.main`` on a scripted model; returns the model."""
    return _cli_on(monkeypatch, _agent)


def _ask(*argv: str) -> int:
    return cli.main(["ask", *argv])


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines at the console width


# ----------------------------------------------------------------------------- resume


def test_resume_must_be_the_same_run(fake_cli, tmp_path, capsys):
    db = str(tmp_path / "x.sqlite")
    assert _ask(PARIS, "--db", db, "--run-id", "run1", "--n", "4", "--k", "1", "--t", "2") == 0
    calls = len(fake_cli.calls)

    # Another question under the same run id: before the fix it showed Hamlet and answered "Paris".
    assert _ask(HAMLET, "--db", db, "--run-id", "run1", "--resume") == 1
    assert f"started with the question {PARIS!r}" in _err(capsys)
    # Other settings on resume: before, the stats' config and budget contradicted each other.
    assert _ask(PARIS, "--db", db, "--run-id", "run1", "--resume", "--n", "8") == 1
    assert "--n 8 (stored: 4)" in _err(capsys)
    # Fewer at once changes no trajectory: lowered after an overload, the run resumes (shows its result).
    assert _ask(PARIS, "--db", db, "--run-id", "run1", "--resume", "--max-concurrency", "2") == 0
    assert "already finished" in _err(capsys)
    # A run id that does not exist, or none at all, is an error, not a new run.
    assert _ask(PARIS, "--db", db, "--run-id", "nope", "--resume") == 1
    assert "no run --run-id 'nope'" in _err(capsys)
    assert _ask(PARIS, "--db", db, "--resume") == 1
    assert "--resume needs --db and --run-id" in _err(capsys)
    # A new run may not silently reuse the id of an existing one.
    assert _ask(PARIS, "--db", db, "--run-id", "run1") == 1
    assert "already holds a run" in _err(capsys)
    assert len(fake_cli.calls) == calls  # none of these called the model

    # Resuming the finished run shows its result and redoes no stage.
    out_json = tmp_path / "again.json"
    assert _ask(PARIS, "--db", db, "--run-id", "run1", "--resume", "--json", str(out_json)) == 0
    assert "already finished" in _err(capsys)
    assert len(fake_cli.calls) == calls
    result = json.loads(out_json.read_text())
    assert result["answer"] == "Paris" and result["stats"]["config"]["n"] == 4


def test_resume_with_another_corpus_or_model_is_refused_naming_both_and_the_flag(fake_cli, tmp_path, capsys):
    # Before: only the question and settings were compared; a resume on other documents or another
    # model continued the run, mixing trajectories of both.
    first, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is the capital of France."}) + "\n")
    other.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is a city of France."}) + "\n")
    db = str(tmp_path / "x.sqlite")
    run = (PARIS, "--db", db, "--run-id", "run1", "--resume")
    assert _ask(*run[:-1], "--corpus", str(first), "--n", "2", "--k", "1", "--t", "1") == 0
    calls = len(fake_cli.calls)
    assert _ask(*run, "--corpus", str(other)) == 1
    said = _err(capsys)
    assert re.search(r"--corpus b\.jsonl \(\d+ bytes, sha256 \w+\) \(stored: a\.jsonl \(\d+ bytes", said), said
    assert "give those flags as stored to resume it, or start a new run with another --run-id" in said
    assert _ask(*run, "--corpus", str(first), "--doc-ids", "d1") == 1
    assert "--doc-ids d1 (stored: not given)" in _err(capsys)
    assert _ask(*run, "--tavily") == 1
    assert re.search(r"--corpus not given \(stored: a\.jsonl .*--tavily given \(stored: not given\)", _err(capsys))
    server = ("--base-url", "http://user:s3cr3t-key@127.0.0.1:9/v1", "--model", "qwen")
    assert _ask(*run, "--corpus", str(first), *server) == 1
    said = _err(capsys)
    assert "--model qwen (stored: not given)" in said and "--base-url" not in said
    assert "--precision not given (stored: float32)" in said
    assert len(fake_cli.calls) == calls  # none of these ran anything
    assert _ask(*run, "--corpus", str(first)) == 0 and "already finished" in _err(capsys)
    # Kept with the run, without the server's credentials.
    assert _ask(PARIS, "--db", db, "--run-id", "run2", "--n", "2", "--k", "1", "--t", "1", *server) == 0
    assert b"s3cr3t" not in Path(db).read_bytes()
    # The same model restarted on another port is the same input: the URL is not compared.
    moved = ("--base-url", "http://localhost:10/v1/", "--model", "qwen")
    assert _ask(PARIS, "--db", db, "--run-id", "run2", "--resume", *moved) == 0 and "already finished" in _err(capsys)


async def test_a_run_stored_before_its_inputs_were_resumes_as_before(fake_cli, tmp_path, capsys):
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    db = str(tmp_path / "x.sqlite")
    async with AsyncSqliteSaver.from_conn_string(db) as saver:  # as the command ran it: no inputs kept
        graph = create_parallelmuse(fake_cli, make_tools()[0], checkpointer=saver, trajectory_checkpointer=saver)
        await graph.ainvoke(
            {"question": PARIS}, {"configurable": {"thread_id": "old"}}, context={"n": 2, "k": 1, "t": 1}
        )
    assert await asyncio.to_thread(_ask, PARIS, "--db", db, "--run-id", "old", "--resume", "--doc-ids", "d1") == 0
    assert "already finished" in _err(capsys)


def test_delete_thread_removes_a_cli_runs_trajectory_threads_so_its_run_id_is_free_again(fake_cli, tmp_path, capsys):
    db = str(tmp_path / "x.sqlite")
    assert _ask(PARIS, "--db", db, "--run-id", "run1", "--n", "4", "--k", "1", "--t", "2") == 0
    calls = len(fake_cli.calls)
    assert cli.main(["delete-thread", "run1", "--db", db]) == 0
    assert "deleted thread 'run1' and 4 trajectory thread(s)" in _err(capsys)
    # The id is free: a new run under it samples anew instead of finding the old trajectories.
    assert _ask(PARIS, "--db", db, "--run-id", "run1", "--n", "4", "--k", "1", "--t", "2") == 0
    assert len(fake_cli.calls) == 2 * calls
    assert cli.main(["delete-thread", "run1", "--db", str(tmp_path / "none.sqlite")]) == 1
    assert "no such SQLite file" in _err(capsys) and not (tmp_path / "none.sqlite").exists()
    assert cli.main(["delete-thread", "run2", "--db", db]) == 1  # a typo is not reported as deleted
    assert "holds no thread 'run2' and no trajectory thread of it" in _err(capsys)


def test_max_concurrency_above_the_default_takes_effect(monkeypatch):
    # The flag went only into the run's context, which may lower the factory's bound (8) but not
    # lift it: --max-concurrency 12 ran 8 trajectories at a time.
    model = ScriptedChatModel(responder=lambda msgs: Reply(answer_text("Paris"), delay=0.1))
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: model)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    argv = (PARIS, "--n", "12", "--mode", "none", "--aggregation", "majority", "--max-concurrency", "12")
    assert _ask(*argv) == 0
    assert model.peak_in_flight == 12


async def test_a_resumed_runs_seconds_do_not_count_the_time_the_process_was_dead(tmp_path):
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    crash = {"armed": True}

    def agent(index, messages):
        if crash["armed"] and index == 1:  # the first trajectory to reach step 2 stops the run
            crash["armed"] = False
            raise MissingLogprobsError("simulated crash")
        return _agent(index, messages)

    model = ScriptedChatModel(responder=research_responder(agent))
    config = {"configurable": {"thread_id": "dead-time"}}
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "run.sqlite")) as saver:
        graph = create_parallelmuse(
            model, make_tools()[0], config={"n": 2, "mode": "none"}, checkpointer=saver, trajectory_checkpointer=saver
        )
        started = time.time()
        with pytest.raises(MissingLogprobsError):
            await graph.ainvoke({"question": PARIS}, config)
        time.sleep(2.0)  # the process is "dead"
        out = await graph.ainvoke(None, config)
    wall = time.time() - started
    assert out["answer"] == "Paris"
    assert out["stats"]["seconds"]["total"] < wall - 1.5, (out["stats"]["seconds"], wall)


# ----------------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing-folder/x.sqlite", "does not exist: create it"),
        (".", "is a directory"),
        ("not-sqlite.txt", "is not a SQLite database"),
    ],
)
def test_a_bad_db_is_one_line_before_anything_loads(target, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "not-sqlite.txt").write_text("hello")
    monkeypatch.chdir(tmp_path)

    def no_model(args, *_, **__):
        raise AssertionError("the model was loaded before --db was checked")

    monkeypatch.setattr(cli, "_model", no_model)
    assert _ask(PARIS, "--db", target) == 1
    raw = capsys.readouterr().err
    assert message in " ".join(raw.split()) and "Traceback" not in raw and len(raw.strip().splitlines()) <= 3


def test_a_runs_consensus_setting_resumes_with_the_same_command(fake_cli, tmp_path, capsys):
    # Before the fix "--consensus 0.8" was read as the text '0.8', which never equals the stored 0.8.
    db = str(tmp_path / "x.sqlite")
    argv = (
        PARIS,
        "--db",
        db,
        "--run-id",
        "c",
        "--n",
        "4",
        "--k",
        "1",
        "--t",
        "2",
        "--branching",
        "online",
        "--consensus",
        "0.8",
    )
    assert _ask(*argv) == 0
    assert _ask(*argv, "--resume") == 0
    assert "already finished" in _err(capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--model", "gpt-4o"), "--model 'gpt-4o' names a model on a server: add --base-url"),
        (("--base-url", "http://127.0.0.1:9/v1", "--model-path", "m"), "--model-path loads a local checkpoint"),
    ],
)
def test_a_model_flag_that_would_be_ignored_is_an_error(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    assert _ask(PARIS, *argv) == 1
    assert message in _err(capsys)


def test_a_model_path_holding_no_checkpoint_is_refused_before_anything_loads(fake_cli, tmp_path, capsys):
    """An empty directory passed the check (a directory was enough): ``ask`` printed the question, then
    the graph's first step died in transformers ("Couldn't instantiate the backend tokenizer")."""
    empty = tmp_path / "emptydir"
    empty.mkdir()
    assert _ask(PARIS, "--model-path", str(empty)) == 1
    said = _err(capsys)
    assert f"--model-path {empty} is a directory without config.json" in said, said
    assert "pass a local transformers checkpoint directory (with its config.json) or a .gguf file" in said
    assert not fake_cli.calls
    # A folder holding a GGUF: the loader opens the file, not the folder (no --gguf-file flag).
    (gguf := empty / "SmolLM2.gguf").write_text("x")
    assert _ask(PARIS, "--model-path", str(empty)) == 1
    flat = "".join(_err(capsys).split())  # rich may wrap inside the path
    assert f"passtheGGUFfileitself({gguf})" in flat and not fake_cli.calls
    # What loads passes: a .gguf file, a checkpoint directory (its config.json).
    (empty / "config.json").write_text("{}")
    for path in (gguf, empty):
        cli._check_model_flags(cli.build_parser().parse_args(["ask", PARIS, "--model-path", str(path)]))


def test_local_chat_model_refuses_a_model_path_the_loader_cannot_open_when_built():
    """The Python API's check is the CLI's: before, the error came from the first call, in transformers' words
    (``agent`` and ``bench``, which build the model with it, likewise)."""
    import tempfile

    from langgraph_parallelmuse.models import LocalChatModel

    with tempfile.TemporaryDirectory() as folder:
        with pytest.raises(ConfigError, match=r"model_path=\S+ is a directory without config\.json"):
            LocalChatModel(model_path=folder)
        # agent and bench build theirs with the CLI's words (the same check, before the model is built).
        with pytest.raises(ConfigError, match=r"--model-path \S+ is a directory without config\.json"):
            cli._model(cli.build_parser().parse_args(["agent", PARIS, "--model-path", folder]))
        with pytest.raises(ConfigError, match=r"holds no m\.gguf \(gguf_file\)"):
            LocalChatModel(model_path=folder, gguf_file="m.gguf")
        (Path(folder) / "m.gguf").write_text("x")
        assert LocalChatModel(model_path=folder, gguf_file="m.gguf").gguf_file == "m.gguf"  # nothing loads yet
        assert LocalChatModel(model_path=str(Path(folder) / "m.gguf")).model_path.endswith("m.gguf")
    with pytest.raises(ConfigError, match="does not exist"):
        LocalChatModel(model_path=folder)
    assert LocalChatModel.embedded().model_path is None


def test_bench_refuses_a_concurrency_below_one_and_its_own_fields_in_set(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--questions", "q.jsonl", "--concurrency", "0"])
    assert "'0': pass a whole number >= 1" in _err(capsys)
    assert cli.main(["bench", "--questions", "q.jsonl", "--set", "n=4"]) == 1
    assert "--set n: not taken from --set (n: use --n)" in _err(capsys)


def test_a_postgres_url_is_a_valid_db():
    from langgraph_parallelmuse.persistence import check_db

    assert check_db("postgresql://postgres@127.0.0.1:55432/postgres") == "postgres"


async def test_an_unknown_or_bad_context_value_raises_config_error():
    graph = create_parallelmuse(ScriptedChatModel(responder=research_responder(_agent)), make_tools()[0])
    with pytest.raises(ConfigError, match="bogus: Extra inputs"):
        await graph.ainvoke({"question": PARIS}, context={"bogus": 1})
    with pytest.raises(ConfigError, match="n: Input should be a valid integer"):
        await graph.ainvoke({"question": PARIS}, context={"n": "eight"})
    # Every context field takes None, so pydantic read True as 1: one trajectory, no error.
    with pytest.raises(ConfigError, match="n=True: give a number, not true/false"):
        await graph.ainvoke({"question": PARIS}, context={"n": True})
    # None is "unset", as the schema shows it and as a parent's None is read.
    out = await graph.ainvoke({"question": PARIS}, context={"n": None, "k": 1, "t": 2})
    assert out["stats"]["config"]["n"] == 8 and out["answer"] == "Paris"
    # A context that is not a mapping or an object of settings was read as no settings at all.
    model = ScriptedChatModel(responder=research_responder(_agent))
    graph = create_parallelmuse(model, make_tools()[0])
    for context in ("n=4", ["n", 4]):
        with pytest.raises(ConfigError, match="context must be a mapping"):
            await graph.ainvoke({"question": PARIS}, context=context)
    assert model.calls == []
    # A parent graph's context in slots (a NamedTuple, attrs' @define) is read, not refused.
    from typing import NamedTuple

    from langgraph_parallelmuse.config import context_overrides

    class Parent(NamedTuple):
        user: str
        n: int

    class Slotted:
        __slots__ = ("n", "user")

        def __init__(self) -> None:
            self.n, self.user = 4, "u1"

    assert context_overrides(Parent("u1", 4)) == {"n": 4} == context_overrides(Slotted())


def test_a_calibration_that_is_a_directory_or_holds_nan_or_negative_thresholds_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is not a file"):
        Calibration.load(tmp_path)
    for bad in (math.nan, -1.0, 0.5):
        path = tmp_path / f"cal-{bad}.json"
        # json.dumps writes NaN as the bare token NaN, which json.loads reads back as a float.
        path.write_text(json.dumps({"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": bad}}))
        with pytest.raises(ConfigError, match="finite perplexities >= 1"):
            Calibration.load(path)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"confidence_floor": math.nan}, "confidence_floor nan must be a finite confidence >= 0"),
        ({"confidence_floor": math.inf}, "confidence_floor inf must be a finite confidence >= 0"),
        ({"confidence_floor": -1.0}, "confidence_floor -1.0 must be a finite confidence >= 0"),
        ({"confidence_window": 0}, "confidence_window 0 must be a whole number of tokens >= 1"),
        ({"confidence_window": -4}, "confidence_window -4 must be a whole number of tokens >= 1"),
        ({"confidence_window": 2.7}, "confidence_window 2.7 must be a whole number of tokens >= 1"),
    ],
)
def test_a_calibration_with_an_unusable_confidence_floor_or_window_is_refused(setting, message, tmp_path):
    # Before: a NaN floor stopped every trajectory early, a window of 0 divided by zero mid-rollout.
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"estimator": "nll", "quantile": 0.8, "thresholds": {"exploration": 1.5}, **setting}))
    with pytest.raises(ConfigError) as info:
        Calibration.load(path)
    assert message in str(info.value) and "regenerate it with `parallelmuse calibrate`" in str(info.value)


def test_tool_timeout_nan_is_refused():
    from langgraph_parallelmuse.config import make_config

    with pytest.raises(ConfigError, match="tool_timeout=nan: must be positive"):
        make_config(tool_timeout=math.nan)


def test_an_empty_corpus_is_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CorpusError, match="no documents in"):
        CorpusIndex.from_jsonl(empty, cache_dir=tmp_path / "cache")


async def test_a_tool_that_returns_none_is_an_error_observation():
    from langgraph_parallelmuse.agent import RolloutRunner
    from langgraph_parallelmuse.config import make_config

    tools, _ = make_tools(search=lambda q: None)
    model = ScriptedChatModel(script=[call_text("search", query="x"), answer_text("Paris")])
    traj = await RolloutRunner(model, tools).run(PARIS, trajectory_id="t0", thread_id="none/t0", config=make_config())
    obs = traj["observations"][0]
    assert obs["error"] is True and "returned nothing (None)" in obs["content"]


# ----------------------------------------------------------------------------- the CLI for a newcomer


@pytest.mark.parametrize(
    ("flag", "values"),
    [
        ("--mode", "exploration, reasoning, mixed, all, none"),
        ("--driver", "auto, free, guided"),
        ("--aggregation", "parallelmuse, majority, weighted, max_tool_calls"),
        ("--estimator", "nll, entropy"),
    ],
)
def test_help_lists_the_allowed_values(flag, values, capsys):
    with pytest.raises(SystemExit):
        cli.main(["ask", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"one of: {values}" in text, flag


def test_agent_offers_only_what_applies_to_one_trajectory(fake_cli, capsys):
    with pytest.raises(SystemExit):
        cli.main(["agent", "--help"])
    text = capsys.readouterr().out
    assert "--max-turns" in text and "--n " not in text and "--k " not in text
    # Before the fix `agent Q --n 2` failed on the budget check of the whole pipeline; a budget does
    # not apply to one trajectory, so the agent no longer takes one.
    assert cli.main(["agent", PARIS, "--max-turns", "3"]) == 0


def test_make_run_passes_the_question_through_the_shell_untouched():
    question = "What is `id` worth, $HOME's $1 and \"quoted\" 'it'?"
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run", f"QUESTION={question}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in dry.stdout.splitlines() if "parallelmuse ask" in x)
    # What the program would receive: the shell runs the line with printf in its place.
    received = subprocess.run(
        ["sh", "-c", line.replace(line.split(" ask ")[0] + " ask", "printf %s", 1)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert received.stdout == question


# ----------------------------------------------------------------------------- a server that cannot serve


def _models(*names):
    return {"GET /v1/models": lambda body: (200, {"object": "list", "data": [{"id": n} for n in names]})}


def _no_model_loaded(monkeypatch):
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])


@pytest.mark.parametrize(
    ("routes", "argv", "message"),
    [
        # Before: three "failed: None", answer None, exit 2 and no reason.
        (None, [], "is unreachable"),
        (_models("smollm2", "qwen"), [], "serves ['smollm2', 'qwen']: pass --model"),
        # A hosted API's hundred models: the first ten and how many more.
        (
            _models(*(f"m{i}" for i in range(100))),
            [],
            "serves ['m0', 'm1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7', 'm8', 'm9', '... 90 more']: pass --model",
        ),
        (_models("smollm2"), ["--model", "default"], "serves no model 'default'; it serves ['smollm2']"),
        (
            {
                **_models("smollm2"),
                "POST /v1/chat/completions": lambda body: (
                    200,
                    {"choices": [{"message": {"role": "assistant", "content": "x"}, "logprobs": None}]},
                ),
            },
            [],
            "returned no logprobs for model 'smollm2'",
        ),
    ],
)
def test_a_server_that_cannot_serve_is_named_before_the_first_wave(routes, argv, message, monkeypatch, capsys):
    from langgraph_parallelmuse.serving import free_port
    from tests.unit.http_fakes import fake_http

    _no_model_loaded(monkeypatch)
    if routes is None:
        url = f"http://127.0.0.1:{free_port()}/v1"
        code = cli.main(["ask", PARIS, "--base-url", url, "--n", "3", "--k", "1", "--t", "1", *argv])
    else:
        with fake_http(routes) as server:
            url = f"{server.url}/v1"
            code = cli.main(["ask", PARIS, "--base-url", url, "--n", "3", "--k", "1", "--t", "1", *argv])
            # Only the checks reached the server: no trajectory was started.
            assert not [r for r in server.requests if "research assistant" in json.dumps(r.body)]
    err = _err(capsys)
    assert code == 1 and message in err and url in err and "Traceback" not in err, err


@pytest.mark.parametrize(("prompt_logprobs", "scoring"), [("returned", True), ("ignored", False)])
def test_a_server_model_scores_only_where_the_server_returns_prompt_logprobs(prompt_logprobs, scoring, capsys):
    from tests.unit.http_fakes import fake_http
    from tests.unit.test_server_model import fake_server

    with fake_http(fake_server(prompt_logprobs=prompt_logprobs)) as server:
        url = f"{server.url}/v1"
        args = cli.build_parser().parse_args(
            ["ask", PARIS, "--base-url", url, "--model", "smollm2", "--driver", "guided"]
        )
        model = cli._server_model(args, cli._config_from(args))
    assert model.supports_scoring is scoring and model.supports_prefill is True
    assert ("returns no prompt_logprobs" in _err(capsys)) is not scoring


def _run(trajectory: dict) -> str:
    """An ``ask --json`` output of one from-scratch trajectory with ``trajectory``'s fields."""
    return json.dumps({"trajectories": [{"origin": {"kind": "initial"}, **trajectory}]})


def _bench_files(tmp_path) -> list[str]:
    """``bench`` over one question and its one-document corpus, written under ``tmp_path``."""
    questions, corpus = tmp_path / "q.jsonl", tmp_path / "c.jsonl"
    item = {
        "id": "q1",
        "question": PARIS,
        "answers": ["Paris"],
        "supporting_doc_ids": ["d1"],
        "context_doc_ids": ["d1"],
    }
    questions.write_text(json.dumps(item) + "\n")
    corpus.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is in France."}) + "\n")
    return ["bench", "--questions", str(questions), "--corpus", str(corpus), "--out", str(tmp_path / "run")]


def _record(settings: dict) -> str:
    """A ``results.jsonl`` line of question q1 run with ``settings``, its results empty."""
    parts = dict.fromkeys(("methods", "trajectories", "reports", "picks", "timings"), {})
    return json.dumps({"id": "q1", "settings": settings, **parts}) + "\n"


def test_a_bench_weighing_votes_by_confidence_checks_the_servers_logprobs(tmp_path, capsys):
    """The weighted vote reads the trajectories' logprobs: a server without them is named up front."""
    from tests.unit.http_fakes import fake_http
    from tests.unit.test_server_model import fake_server

    with fake_http(fake_server(logprobs=None)) as server:
        argv = [*_bench_files(tmp_path), "--base-url", f"{server.url}/v1", "--model", "smollm2"]
        # n=4 has no room for partial rollout, which these methods do not run (it was refused).
        assert cli.main([*argv, "--methods", "majority,weighted", "--n", "4"]) == 1
    assert "returned no logprobs for model 'smollm2'" in _err(capsys)


def test_a_bench_continued_with_another_model_is_refused_before_it_loads(tmp_path, capsys):
    """Only the run's settings were compared, so a rerun on a server continued a table the
    embedded model had begun."""
    from dataclasses import asdict

    from langgraph_parallelmuse.eval.bench import BenchSettings

    argv = _bench_files(tmp_path)
    (tmp_path / "run").mkdir()
    began = asdict(BenchSettings(model="embedded float32"))
    (tmp_path / "run" / "results.jsonl").write_text(_record(began))
    assert cli.main([*argv, "--base-url", "http://127.0.0.1:9/v1", "--model", "smollm2"]) == 1
    assert "model 'embedded float32' (now 'http://127.0.0.1:9/v1 smollm2')" in _err(capsys)


def test_a_bench_records_the_model_a_server_serves_when_no_model_is_named(tmp_path, capsys):
    """Without --model the record said only "its only model": another model on the same URL
    would have continued the table."""
    from dataclasses import asdict

    from langgraph_parallelmuse.eval.bench import BenchSettings
    from tests.unit.http_fakes import fake_http

    argv = _bench_files(tmp_path)
    (tmp_path / "run").mkdir()
    with fake_http(_models("qwen")) as server:
        url = f"{server.url}/v1"
        began = asdict(BenchSettings(model=f"{url} smollm2"))
        (tmp_path / "run" / "results.jsonl").write_text(_record(began))
        assert cli.main([*argv, "--base-url", url]) == 1
    assert f"model '{url} smollm2' (now '{url} qwen')" in _err(capsys)


def test_bench_checks_and_builds_the_server_model_for_its_set_driver(tmp_path, monkeypatch):
    from langgraph_parallelmuse.eval import bench
    from tests.unit.http_fakes import fake_http
    from tests.unit.test_server_model import fake_server

    built = {}

    async def no_run(model, *args, **kwargs):  # the model is what matters; nothing is run
        built["model"] = model
        return []

    monkeypatch.setattr(bench, "run_bench", no_run)
    with fake_http(fake_server(prompt_logprobs="returned")) as server:
        argv = [
            *_bench_files(tmp_path),
            "--base-url",
            f"{server.url}/v1",
            "--model",
            "smollm2",
            "--set",
            "driver=guided",
        ]
        argv += ["--set", "top_logprobs=5", "--n", "3", "--k", "1", "--t", "1", "--modes", "exploration"]
        assert cli.main(argv) == 0
        probes = [r.body for r in server.requests if r.body and "messages" in r.body]
    # Before: --set was ignored, so the guided driver got a model built without prefill (and the
    # server was never checked for it): the first guided step would have been refused.
    assert built["model"].supports_prefill is True and built["model"].top_logprobs == 5
    assert any(body.get("continue_final_message") for body in probes)


def test_the_engine_precision_reaches_the_local_model_and_a_bad_one_is_refused(monkeypatch, capsys):
    import langgraph_parallelmuse.models as models

    built = {}

    def embedded(**kwargs):
        built.update(kwargs)
        raise SystemExit(0)  # stop before anything loads

    monkeypatch.setattr(models.LocalChatModel, "embedded", staticmethod(embedded))
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        cli._model(parser.parse_args(["ask", "Q", "--precision", "bfloat16"]))
    assert built == {"precision": "bfloat16"}
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["ask", "Q", "--precision", "float16"])
    assert exc.value.code == 2 and "invalid choice: 'float16'" in capsys.readouterr().err


def test_resume_after_every_trajectory_failed_continues_each_from_its_last_step(monkeypatch, tmp_path, capsys):
    """Before the fix a run that failed (server down) could never be resumed: ``--resume`` re-raised at
    ``collect`` and asking again found the failed threads "finished"."""
    down = {"now": True}

    def agent(index, messages):
        if down["now"] and index == 1:
            return ValueError("connection refused by http://127.0.0.1:9/v1")
        return _agent(index, messages)

    model = _cli_on(monkeypatch, agent)
    db, out_json = str(tmp_path / "x.sqlite"), tmp_path / "r.json"
    argv = (PARIS, "--db", db, "--run-id", "r", "--n", "2", "--mode", "none", "--aggregation", "majority")
    assert _ask(*argv) == 1
    assert "every trajectory failed (2 of 2)" in _err(capsys)

    down["now"] = False
    assert _ask(*argv, "--resume", "--json", str(out_json)) == 0
    assert "Retrying run 'r'" in _err(capsys)
    result = json.loads(out_json.read_text())
    assert result["answer"] == "Paris"
    assert [len(t["steps"]) for t in result["trajectories"]] == [2, 2]
    agent_calls = [agent_step(c["messages"]) for c in model.calls if role_of(c["messages"]) == "agent"]
    assert agent_calls.count(0) == 2  # each trajectory's finished first step was not run again


def test_resume_of_a_run_interrupted_in_prepare_starts_it_with_the_commands_settings(monkeypatch, tmp_path, capsys):
    """Before, ``--resume`` after a Ctrl-C while the local model loaded (only the input checkpoint stored,
    no settings) died with a KeyError traceback."""
    loading = {"interrupt": True}

    class LoadingModel(ScriptedChatModel):
        def engine_stats(self):
            if loading["interrupt"]:
                time.sleep(0.5)  # loading the weights: the input checkpoint is written meanwhile
                raise KeyboardInterrupt  # Ctrl-C while the weights load
            return {}

    model = LoadingModel(responder=research_responder(_agent))
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: model)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    db, out_json = str(tmp_path / "x.sqlite"), tmp_path / "r.json"
    argv = (PARIS, "--db", db, "--run-id", "r", "--n", "2", "--mode", "none", "--aggregation", "majority")
    assert _ask(*argv) == 130
    loading["interrupt"] = False
    assert _ask(*argv, "--resume", "--json", str(out_json)) == 0
    assert "stopped before its trajectories started" in _err(capsys)
    result = json.loads(out_json.read_text())
    assert result["answer"] == "Paris" and result["stats"]["config"]["n"] == 2


def test_resume_of_a_finished_run_with_a_failed_trajectory_retries_that_one_only(monkeypatch, tmp_path, capsys):
    """Before, ``--resume`` of a finished run showed it "already finished": a trajectory that failed
    (a server down for a moment) could be retried from Python but not from the command line."""
    refused = iter([PermissionError("HTTP 401: the key was revoked")])

    def agent(index, messages):
        return next(refused, None) or _agent(index, messages)

    model = _cli_on(monkeypatch, agent)
    db, out_json = str(tmp_path / "x.sqlite"), tmp_path / "r.json"
    argv = (PARIS, "--db", db, "--run-id", "r", "--n", "3", "--mode", "none", "--aggregation", "majority")
    assert _ask(*argv) == 0
    first = [c for c in model.calls if role_of(c["messages"]) == "agent"]
    assert _ask(*argv, "--resume", "--json", str(out_json)) == 0
    assert "Retrying run 'r': 1 of 3 trajectories had failed" in _err(capsys)
    result = json.loads(out_json.read_text())
    assert [t["status"] for t in result["trajectories"]] == ["answered"] * 3
    retried = [c for c in model.calls if role_of(c["messages"]) == "agent"][len(first) :]
    assert [agent_step(c["messages"]) for c in retried] == [0, 1]  # the failed one's two steps, nothing else
    assert _ask(*argv, "--resume") == 0 and "already finished" in _err(capsys)


# ----------------------------------------------------------------------------- checked before anything runs


def _refuse_model(monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before a bad argument was refused")

    monkeypatch.setattr(cli, "_model", no_model)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])


@pytest.mark.parametrize(("target", "message"), [("missing/r.json", "does not exist"), (".", "is a directory")])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(target, message, tmp_path, monkeypatch, capsys):
    # Before: the whole run finished, then a FileNotFoundError traceback, and the result was lost.
    monkeypatch.chdir(tmp_path)
    _refuse_model(monkeypatch)
    assert _ask(PARIS, "--json", target) == 1
    assert message in _err(capsys)


@pytest.mark.parametrize("command", ["ask", "agent"])
def test_a_question_that_is_not_utf8_is_refused_by_the_parser(command, monkeypatch, capsys):
    # A non-UTF-8 byte on the command line arrives as a lone surrogate: before, it was accepted and
    # `--json` failed after the run with a UnicodeEncodeError, leaving an empty file.
    _refuse_model(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "What is the capital of \udcff France?"])
    assert exit_.value.code == 2
    assert "the question is not valid UTF-8" in _err(capsys)


def test_a_json_result_utf8_cannot_encode_keeps_the_old_file_and_the_result(tmp_path, monkeypatch):
    # Before: the file was opened (emptied) before the encoding failed, and the result was lost.
    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path / "kept"))
    (tmp_path / "kept").mkdir()
    target = tmp_path / "r.json"
    target.write_text('{"answer": "earlier"}')
    args = cli.argparse.Namespace(json=str(target))
    with pytest.raises(cli.ParallelMuseError, match=f"could not write --json {target} .*surrogates not allowed"):
        cli._write_json({"answer": "Paris \udcff"}, args)
    assert json.loads(target.read_text()) == {"answer": "earlier"}
    (kept,) = (tmp_path / "kept").glob("parallelmuse-*.json")
    assert json.loads(kept.read_text()) == {"answer": "Paris \udcff"}
    cli._write_json({"answer": "Paris"}, args)
    assert json.loads(target.read_text()) == {"answer": "Paris"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "r.json"]  # no partial file left


@pytest.mark.parametrize(
    "flags", [["--corpus", "c.jsonl"], ["--doc-ids", "d1"], ["--corpus", "c.jsonl", "--doc-ids", "d1"]]
)
def test_tavily_with_a_corpus_or_doc_ids_is_refused(flags, monkeypatch, capsys):
    # Before: --tavily searched the web and the corpus or doc ids were silently ignored.
    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: pytest.fail("the model loaded"))
    assert _ask(PARIS, "--tavily", *flags) == 1
    named = " and ".join(f for f in ("--corpus", "--doc-ids") if f in flags)
    assert f"--tavily searches the web, not a corpus: drop {named}, or drop --tavily" in _err(capsys)


def test_a_result_whose_json_write_fails_at_the_end_is_kept_elsewhere(fake_cli, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_writable_file", lambda path, flag: None)  # the folder went during the run
    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path))
    assert _ask(PARIS, "--n", "2", "--mode", "none", "--aggregation", "majority", "--json", str(tmp_path)) == 1
    err = _err(capsys)
    assert f"could not write --json {tmp_path}" in err
    (kept,) = tmp_path.glob("parallelmuse-*.json")
    assert json.loads(kept.read_text())["answer"] == "Paris" and str(kept) in err.replace(" ", "")


@pytest.mark.parametrize("command", ["ask", "agent"])
@pytest.mark.parametrize("question", ["   ", "x" * 5000])
def test_an_empty_or_oversized_question_is_refused_by_the_parser(command, question, monkeypatch, capsys):
    _refuse_model(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, question])
    assert exit_.value.code == 2
    err = _err(capsys)
    assert "argument question: the question" in err and ("is empty" in err or "the limit is" in err)


def test_ask_shows_why_a_trajectory_failed_and_why_the_reports_fell_back(monkeypatch, capsys, fast_retries):
    """Before, a failed trajectory got a green tick, the tree said "failed: None", and a down
    compressor or aggregator left its reason only in a log line."""
    refused = iter([PermissionError("HTTP 401: invalid key")])

    def agent(index, messages):
        return next(refused, None) or Reply(answer_text("Paris"))

    def down(messages):
        raise ConnectionRefusedError("the report server refused the connection")

    _cli_on(monkeypatch, agent, compress=down, aggregate=down)
    assert _ask(PARIS, "--n", "3", "--mode", "none") == 0
    captured = capsys.readouterr()
    err = " ".join((captured.err + captured.out).split())
    assert "✗" in err and "failed" in err and "PermissionError: HTTP 401: invalid key" in err  # progress and tree
    assert "reports fell back: the model call failed: ConnectionRefusedError" in err
    assert "the aggregator's pick was not used: the aggregator's model call failed: ConnectionRefusedError" in err


def test_ask_warns_when_most_tool_calls_failed_and_counts_them_in_the_stats(monkeypatch, tmp_path, capsys):
    """Before, every search raising HTTP 401 gave an answer, exit 0, and only ``failed 0`` in the stats."""

    def revoked(query):
        raise PermissionError("HTTP 401: invalid API key")

    _cli_on(monkeypatch, _agent)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools(search=revoked)[0])
    out_json = tmp_path / "r.json"
    assert _ask(PARIS, "--n", "3", "--mode", "none", "--json", str(out_json)) == 0
    captured = capsys.readouterr()
    shown = " ".join((captured.err + captured.out).split())
    assert "warning: 3 of 3 tool calls failed (Error: tool 'search' failed: PermissionError: HTTP 401" in shown
    assert "the answer rests on little or no evidence" in shown
    assert re.search(r"rollout: tool calls / failed\W+3 / 3", shown)
    result = json.loads(out_json.read_text())
    roll = result["stats"]["rollout"]
    assert (roll["tool_calls"], roll["tool_errors"], roll["invalid_turns"], roll["rejected_turns"]) == (3, 3, 0, 0)
    assert roll["tool_error_reasons"] == ["Error: tool 'search' failed: PermissionError: HTTP 401: invalid API key"]
    assert [t["stats"]["tool_errors"] for t in result["trajectories"]] == [1, 1, 1]


@pytest.mark.parametrize("stage", ["compress", "aggregate"])
def test_a_stage2_error_that_ends_the_run_writes_the_finished_work_to_json(stage, monkeypatch, tmp_path, capsys):
    """Before, a wrong setting met in Stage 2 (a server without prompt_logprobs told to score) exited
    with the error and nothing written: every trajectory of the run was lost."""
    from langgraph_parallelmuse.models.server import ServerCheckError

    def no_scoring(messages):
        return ServerCheckError("http://127.0.0.1:8001/v1 returned no prompt_logprobs: scoring needs vLLM")

    _cli_on(monkeypatch, _agent, **{stage: no_scoring})
    out_json = tmp_path / "r.json"
    assert _ask(PARIS, "--n", "2", "--mode", "none", "--json", str(out_json)) == 1
    assert "returned no prompt_logprobs" in _err(capsys)
    result = json.loads(out_json.read_text())
    assert [t["answer"] for t in result["trajectories"]] == ["Paris", "Paris"]
    assert result["stats"]["rollout"]["answered"] == 2
    assert len(result["reports"]) == (2 if stage == "aggregate" else 0)


def test_agent_shows_why_its_trajectory_failed(monkeypatch, capsys):
    def dead(messages):
        raise ConnectionError("server went away")

    model = ScriptedChatModel(responder=dead)
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: model)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    assert cli.main(["agent", PARIS]) == 2
    assert "server went away" in " ".join(capsys.readouterr().out.split())  # it printed "None"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--limit", "0"], "argument --limit"),
        (["--judge-model", "j"], "add --judge-base-url"),
        (["--judge-base-url", "http://127.0.0.1:9/v1", "--judge-model", "j"], "http://127.0.0.1:9/v1"),
    ],
)
def test_bench_refuses_a_bad_limit_or_judge_before_the_model_loads(extra, message, tmp_path, monkeypatch, capsys):
    # A dead judge was found at the first grading, after a whole question's rollout, which was lost.
    _refuse_model(monkeypatch)
    try:
        code = cli.main([*_bench_files(tmp_path), *extra])
    except SystemExit as exit_:
        code = exit_.code
    assert code in (1, 2)
    assert message in " ".join(capsys.readouterr().err.split())


def test_bench_refuses_an_empty_questions_file_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Before: "0 questions", exit 0.
    _refuse_model(monkeypatch)
    argv = _bench_files(tmp_path)
    (tmp_path / "q.jsonl").write_text("\n  \n")
    assert cli.main(argv) == 1
    assert f"--questions {tmp_path / 'q.jsonl'} holds no questions" in _err(capsys)


def test_bench_reads_spaced_lists_and_names_an_unknown_mode_or_method(tmp_path, monkeypatch, capsys):
    # Before: " reasoning" was an unknown mode in a pydantic message that offered 'none' (which bench
    # refuses), and "majority," reported the unknown method "".
    seen = {}

    async def run_bench(model, index, items, settings, results, **kwargs):
        seen.update(modes=settings.modes, methods=settings.methods)
        return []

    monkeypatch.setattr("langgraph_parallelmuse.eval.bench.run_bench", run_bench)
    monkeypatch.setattr(cli, "_model", lambda *args, **kwargs: ScriptedChatModel())
    argv = _bench_files(tmp_path)
    assert cli.main([*argv, "--modes", "exploration, reasoning", "--methods", "majority, parallelmuse,"]) == 0
    assert seen == {"modes": ("exploration", "reasoning"), "methods": ("majority", "parallelmuse")}
    _refuse_model(monkeypatch)
    for flags, message in (
        (["--modes", "exploration,none"], "--modes 'exploration,none': unknown 'none'; choose from exploration, "),
        (["--modes", "explore"], "unknown 'explore'; choose from exploration, reasoning, mixed, all"),
        (["--methods", "majority,majorty"], f"unknown 'majorty'; choose from {', '.join(cli.METHODS)}"),
        (["--methods", " , "], "--methods ' , ': names none; choose from"),
    ):
        assert cli.main([*argv, *flags]) == 1
        assert message in _err(capsys)


def test_bench_refuses_an_out_that_is_a_file_before_the_model_loads(tmp_path, monkeypatch, capsys):
    _refuse_model(monkeypatch)
    argv = _bench_files(tmp_path)
    (tmp_path / "run").write_text("not a directory")
    assert cli.main(argv) == 1
    assert "is a file" in _err(capsys)


@pytest.mark.parametrize("flags", [[], ["--report-only"]])
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("a file above --out", "afile is a file; bench writes a directory"),
        ("results.jsonl a directory", "cannot read {results} (Is a directory)"),
        (
            "a record without its methods",
            "{results} line 1 is not a bench question record (missing or not an object: methods",
        ),
    ],
)
def test_a_bench_out_it_cannot_use_is_one_line_before_the_model_loads(
    damage, message, flags, tmp_path, monkeypatch, capsys
):
    # Before: a traceback (NotADirectoryError, IsADirectoryError, KeyError 'methods'), or a run.
    _refuse_model(monkeypatch)
    argv = _bench_files(tmp_path)
    results = tmp_path / "run" / "results.jsonl"
    if damage == "a file above --out":
        (tmp_path / "afile").write_text("")
        argv[-1] = str(tmp_path / "afile" / "sub")
    elif damage == "results.jsonl a directory":
        results.mkdir(parents=True)
    else:
        results.parent.mkdir()
        results.write_text(json.dumps({"id": "q1"}) + "\n")
    assert cli.main([*argv, *flags]) == 1
    # Without spaces: rich breaks a path longer than the console's width.
    assert message.format(results=results).replace(" ", "") in _err(capsys).replace(" ", "")


def test_bench_report_only_without_a_finished_question_is_an_error(tmp_path, monkeypatch, capsys):
    # Before: exit 0 with a note, so a mistyped --out went unnoticed in a script.
    _refuse_model(monkeypatch)
    assert cli.main([*_bench_files(tmp_path), "--report-only"]) == 1
    said = f"--report-only: no finished question of --questions {tmp_path / 'q.jsonl'} in {tmp_path / 'run'}"
    assert said.replace(" ", "") in _err(capsys).replace(" ", "")


def test_bench_refuses_questions_whose_documents_are_not_in_the_corpus_before_the_model_loads(
    tmp_path, monkeypatch, capsys
):
    _refuse_model(monkeypatch)
    argv = _bench_files(tmp_path)
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "x1", "title": "Other", "text": "Unrelated."}) + "\n")
    assert cli.main(argv) == 1
    assert "d1" in _err(capsys)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ('{"trajectories": [\n', "line 1 is not JSON"),
        ('{"trajectories": [{"origin": {"kind": "initial"}}]}\n', "without per-step uncertainty"),
        (
            json.dumps({"trajectories": [{"origin": {"kind": "initial"}, "uncertainty": [{"all": float("nan")}]}]}),
            "not finite perplexities",
        ),
        # Before: a raw ValueError or AttributeError traceback.
        (_run({"uncertainty": [{"all": "x"}]}), "the runs are damaged; calibrate from other runs"),
        (_run({"uncertainty": [["all", 1.5]]}), "the runs are damaged; calibrate from other runs"),
        (
            _run({"uncertainty": [{"all": 1.5}], "stats": {"lowest_confidence": "x"}}),
            "the runs are damaged; calibrate from other runs",
        ),
    ],
)
def test_calibrate_names_a_bad_runs_file_in_one_line(content, message, tmp_path, capsys):
    runs = tmp_path / "runs.json"
    if content is not None:
        runs.write_text(content)
    assert cli.main(["calibrate", str(runs), "--out", str(tmp_path / "cal.json")]) == 1
    assert message in _err(capsys)
    assert not (tmp_path / "cal.json").exists()


def test_a_calibration_or_result_whose_write_fails_leaves_the_earlier_file_whole(tmp_path, monkeypatch, capsys):
    # Before: both were written in place, and a full disk left the earlier file cut.
    def full_disk(write):
        def cut(self, data, *args, **kwargs):
            write(self, data[: len(data) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")

        return cut

    runs, cal = tmp_path / "runs.json", tmp_path / "cal.json"
    runs.write_text(_run({"uncertainty": [{"exploration": 1.5, "reasoning": 2.0}]}))
    assert cli.main(["calibrate", str(runs), "--out", str(cal)]) == 0
    earlier = cal.read_bytes()
    monkeypatch.setattr(Path, "write_text", full_disk(Path.write_text))
    # Named as the command's error (exit 1), not a traceback.
    assert cli.main(["calibrate", str(runs), "--out", str(cal), "--quantile", "0.5"]) == 1
    assert "could not write --out" in capsys.readouterr().err
    assert cal.read_bytes() == earlier
    monkeypatch.undo()
    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path / "kept"))
    (tmp_path / "kept").mkdir()
    target = tmp_path / "r.json"
    target.write_text('{"answer": "earlier"}')
    monkeypatch.setattr(Path, "write_bytes", full_disk(Path.write_bytes))
    with pytest.raises(cli.ParallelMuseError, match="could not write --json .*No space left"):
        cli._write_json({"answer": "Paris"}, cli.argparse.Namespace(json=str(target)))
    assert json.loads(target.read_text()) == {"answer": "earlier"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json", "kept", "r.json", "runs.json"]
    monkeypatch.undo()
    cli._write_json({"answer": "Paris"}, cli.argparse.Namespace(json="/dev/null"))  # written in place


def test_calibrate_refuses_an_out_it_cannot_write_before_reading_the_runs(tmp_path, capsys):
    assert cli.main(["calibrate", str(tmp_path / "never-read.json"), "--out", str(tmp_path)]) == 1
    assert "is a directory" in _err(capsys)


def _bench_record(qid: str, *, model: str = "embedded float32", extra: dict | None = None, steps: int = 3) -> str:
    """A bench results line of question ``qid``: one from-scratch trajectory of ``steps`` scored steps."""
    trajectory = {"origin": {"kind": "initial"}, "uncertainty": [{"all": 1.5, "reasoning": 2.0}] * steps}
    settings = {"estimator": "nll", "model": model, "extra": extra or {}}
    return json.dumps({"id": qid, "settings": settings, "methods": {}, "trajectories": {"t0": trajectory}}) + "\n"


def test_calibrate_records_the_model_top_logprobs_and_questions_of_its_runs(tmp_path, capsys):
    # Before: the calibration file recorded none of them, so a run on another model could not refuse it.
    bench, ask, cal = tmp_path / "results.jsonl", tmp_path / "ask.json", tmp_path / "cal.json"
    bench.write_text(_bench_record("q1", extra={"top_logprobs": 5}) + _bench_record("q2", extra={"top_logprobs": 5}))
    assert cli.main(["calibrate", str(bench), "--out", str(cal)]) == 0
    fitted = json.loads(cal.read_text())
    assert (fitted["model"], fitted["top_logprobs"], fitted["questions"]) == ("embedded float32", 5, ["q1", "q2"])
    bench.write_text(_bench_record("q1"))  # no --set top_logprobs: the default
    assert cli.main(["calibrate", str(bench), "--out", str(cal)]) == 0
    assert json.loads(cal.read_text())["top_logprobs"] == ParallelMuseConfig.model_fields["top_logprobs"].default
    output = json.loads(_run({"uncertainty": [{"all": 1.5}]}))
    ask.write_text(json.dumps({**output, "question": PARIS, "stats": {"config": {"top_logprobs": 8}}}))
    assert cli.main(["calibrate", str(ask), "--out", str(cal)]) == 0
    fitted = json.loads(cal.read_text())  # an ask output of before it recorded its model; no id: its question names it
    assert "model" not in fitted and (fitted["top_logprobs"], fitted["questions"]) == (8, [PARIS])
    ask.write_text(json.dumps({**output, "question": PARIS, "model": "embedded bfloat16"}))
    assert cli.main(["calibrate", str(ask), "--out", str(cal)]) == 0
    assert json.loads(cal.read_text())["model"] == "embedded bfloat16"


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        ({"model": "http://a/v1 qwen"}, {}, "mix models: 'http://a/v1 qwen' ({a}); 'embedded float32' ({b})"),
        ({"extra": {"top_logprobs": 5}}, {}, "mix top_logprobs: 5 ({a}); 16 ({b}); calibrate from runs with one"),
    ],
)
def test_calibrate_refuses_runs_of_two_models_or_top_logprobs_naming_the_files(
    first, second, message, tmp_path, capsys
):
    # Before: thresholds fitted on two models' perplexities at once, for neither.
    a, b, cal = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "cal.json"
    a.write_text(_bench_record("q1", **first))
    b.write_text(_bench_record("q2", **second) + _bench_record("q3", **second))
    assert cli.main(["calibrate", str(a), str(b), "--out", str(cal)]) == 1
    assert message.format(a=a, b=b) in _err(capsys)
    assert not cal.exists()


def test_calibrate_takes_runs_that_do_not_record_the_model_beside_one_that_does(tmp_path, capsys):
    # An ask output records no model: it is no conflict (it was refused as "not recorded" against a
    # bench file's model), and the calibration records none, since it cannot vouch for one.
    bench, ask, cal = tmp_path / "results.jsonl", tmp_path / "ask.json", tmp_path / "cal.json"
    bench.write_text(_bench_record("q1"))
    output = json.loads(_run({"uncertainty": [{"all": 1.5}]}))
    ask.write_text(json.dumps({**output, "question": PARIS, "stats": {"config": {"top_logprobs": 16}}}))
    assert cli.main(["calibrate", str(bench), str(ask), "--out", str(cal)]) == 0
    assert "model" not in json.loads(cal.read_text())


def test_a_run_with_a_calibration_of_another_models_runs_is_warned(tmp_path, monkeypatch, capsys):
    # Before: a calibration recorded its model but nothing read it; thresholds fitted on one model's
    # perplexities forked another model's steps without a word.
    runs, cal = tmp_path / "results.jsonl", tmp_path / "cal.json"
    runs.write_text(_bench_record("q1", model="http://a/v1 qwen"))
    assert cli.main(["calibrate", str(runs), "--out", str(cal)]) == 0

    def stop(*args, **kwargs):
        raise ConfigError("stopped before the model loaded")

    monkeypatch.setattr(cli, "_model", stop)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    capsys.readouterr()
    assert _ask(PARIS, "--mode", "reasoning", "--calibration", str(cal)) == 1
    said = _err(capsys)
    assert f"warning: {cal} was fitted on runs of 'http://a/v1 qwen', this run uses 'embedded float32'" in said
    runs.write_text(_bench_record("q1", model="embedded float32"))
    assert cli.main(["calibrate", str(runs), "--out", str(cal)]) == 0
    assert _ask(PARIS, "--mode", "reasoning", "--calibration", str(cal)) == 1
    assert "was fitted on runs of" not in _err(capsys)


def test_calibrate_shows_a_few_samples_warning_as_a_line_of_its_output(tmp_path, capsys):
    # Before: Python printed it as "cli.py:868: UserWarning: ..." with the line of code under it.
    runs, cal = tmp_path / "results.jsonl", tmp_path / "cal.json"
    runs.write_text(_bench_record("q1") + _bench_record("q2"))
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        assert cli.main(["calibrate", str(runs), "--out", str(cal)]) == 0
    said = _err(capsys)
    assert "warning: calibration thresholds from few samples (reasoning: 6 steps; all: 6 steps; 2 trajectories)" in said
    assert not escaped and "UserWarning" not in said and cal.exists()


@pytest.mark.parametrize("command", ["ask", "agent"])
def test_markup_and_escape_sequences_in_model_and_tool_text_print_as_text(command, tmp_path, monkeypatch, capsys):
    # "[/b]" in an answer made rich raise after the run (no --json written); "[/citation needed]" in
    # a page ended `agent` the same way; an escape sequence reached the terminal.
    # ":b:" became an emoji inside an IPv6 address; a right-to-left override reordered the line.
    hostile = "[/b] [link=http://evil.example]x[/link] \x1b]0;owned\x07 fe80::a:b:c:d \u202eevil"

    def agent(index, messages):
        if index == 0:
            return Reply(call_text("search", "Look it up", query="capital [/i]"))
        return Reply(answer_text(f"Paris {hostile}"))

    model = ScriptedChatModel(responder=research_responder(agent))
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: model)
    page = f"Paris [/citation needed] {hostile}"
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools(search=lambda q: page)[0])
    out_json = tmp_path / "r.json"
    argv = [PARIS, "--n", "2", "--mode", "none", "--aggregation", "majority", "--json", str(out_json)]
    assert cli.main([command, *(argv if command == "ask" else argv[:1])]) == 0
    printed = capsys.readouterr().out
    assert "[/b]" in printed and "\x1b" not in printed and "\x07" not in printed
    assert "fe80::a:b:c:d" in printed and "\u202e" not in printed
    if command == "ask":
        assert json.loads(out_json.read_text())["answer"].startswith("Paris [/b]")
    else:
        assert "[/citation needed]" in printed


def test_paths_and_run_ids_with_brackets_print_as_given(fake_cli, tmp_path, capsys):
    """Rich read "[v2]" in a path as markup: "wrote res.json" named a file that does not exist, and a
    run id with "[/]" ended the run with a MarkupError."""
    out_json = tmp_path / "res[v2].json"
    db = tmp_path / "runs.sqlite"
    argv = ["ask", PARIS, "--n", "2", "--mode", "none", "--aggregation", "majority", "--json", str(out_json)]
    assert cli.main([*argv, "--db", str(db), "--run-id", "exp[/]1"]) == 0
    err = _err(capsys)
    assert f"Full result written to {out_json}" in err and out_json.is_file()
    assert "run id: exp[/]1" in err


def test_bench_offers_no_knowledge_flag_it_would_ignore(capsys):
    """bench searches its questions' corpus: --tavily and --doc-ids were accepted and never read."""
    for flag in (["--tavily"], ["--doc-ids", "d1"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["bench", "--questions", "q.jsonl", *flag])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_the_json_result_is_redacted_value_by_value_and_stays_valid_json(tmp_path, monkeypatch):
    # The serialized text was redacted: a backslash-escaped quote after a credential broke the JSON,
    # and every '"token": "ationally"' of the logprob records became '"token": "***"'.
    def agent(index, messages):
        return Reply(answer_text('Paris (config: api_key=abcdef123"; done) rationally'))

    model = ScriptedChatModel(responder=research_responder(agent))
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: model)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    out_json = tmp_path / "r.json"
    argv = [PARIS, "--n", "2", "--mode", "none", "--aggregation", "majority", "--json", str(out_json)]
    assert cli.main(["ask", *argv]) == 0
    result = json.loads(out_json.read_text())
    step = result["trajectories"][0]["steps"][0]
    assert "api_key=***" in step["text"] and "abcdef123" not in step["text"]
    # Token records are the model's own tokens, as checkpointed (a credential a model writes spans
    # several tokens; redaction is for the texts of errors, pages and steps).
    tokens = [t["token"] for t in step["tokens"]]
    assert "rationally" in [t.strip() for t in tokens] and "***" not in tokens


def test_an_existing_output_file_in_a_folder_the_user_cannot_write_is_accepted(monkeypatch):
    # /dev/stdout: a user may write it but not /dev; the check refused `--json /dev/stdout`.
    real = cli.os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if cli.Path(p).is_dir() else real(p, mode))
    cli._writable_file("/dev/stdout", "--json")
    with pytest.raises(ConfigError, match="is not writable"):
        cli._writable_file("/dev/new-file.json", "--json")


def test_doc_ids_with_a_trailing_comma_keep_the_named_ids(tmp_path, monkeypatch):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is in France."}) + "\n")
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    args = cli.build_parser().parse_args(["ask", PARIS, "--corpus", str(corpus), "--doc-ids", "d1,"])
    assert [t.name for t in cli._tools(args)] == ["search", "visit"]


def test_a_judge_named_otherwise_than_its_servers_model_list_is_asked_by_that_name(tmp_path, monkeypatch, capsys):
    # Ollama's tags, llama.cpp (any name) and Azure deployments take names /models does not list.
    from langgraph_parallelmuse.eval import bench
    from tests.unit.http_fakes import fake_http

    seen = {}

    async def no_run(model, *args, judge=None, **kwargs):
        seen["judge"] = judge
        return []

    monkeypatch.setattr(bench, "run_bench", no_run)
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: ScriptedChatModel(script=[]))
    with fake_http(_models("llama3:latest")) as server:
        argv = [*_bench_files(tmp_path), "--judge-base-url", f"{server.url}/v1", "--judge-model", "llama3"]
        assert cli.main(argv) == 0
    assert seen["judge"].model_name == "llama3"
    assert "lists ['llama3:latest'], not 'llama3'" in _err(capsys)
