"""The command line's outputs, interrupts, resumes and model flags, run through ``cli.main`` in-process.

``cli._model`` and ``cli._tools`` are replaced by the scripted fakes (``tests/unit/fakes.py``), so no
model loads and no index is built; a test that must not reach the model replaces it with one that fails.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest
from rich.console import Console

from langgraph_parallelmuse import cli
from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.errors import CorpusError, ParallelMuseError
from tests.unit.fakes import Reply, ScriptedChatModel, answer_text, call_text, make_tools, research_responder

PARIS = "What is the capital of France?"
SMALL = ("--n", "2", "--k", "1", "--t", "1")


def _agent(index, messages):
    if index == 0:
        return Reply(call_text("search", "Look it up", query="capital"), regions={"tool_call": -2.0})
    return Reply(answer_text("Paris"))


def _cli_on(monkeypatch, agent=_agent) -> ScriptedChatModel:
    """``cli.main`` on a scripted model whose agent steps ``agent`` writes; returns the model."""
    model = ScriptedChatModel(responder=research_responder(agent))
    monkeypatch.setattr(cli, "_model", lambda args, *_, **__: model)
    monkeypatch.setattr(cli, "_tools", lambda args: make_tools()[0])
    return model


@pytest.fixture
def fake_cli(monkeypatch) -> ScriptedChatModel:
    return _cli_on(monkeypatch)


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    # Rich breaks a long path at the console's width: the messages are compared whole.
    monkeypatch.setattr(cli.console, "_width", 10_000)


def _ask(*argv: str) -> int:
    return cli.main(["ask", *argv])


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines at the console width


# ----------------------------------------------------------------------------- --json and a closed stdout


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


class _ClosedStdout(Console):
    """Standard output piped to a reader that went away (``| head``)."""

    def __init__(self) -> None:
        super().__init__(file=_ClosedPipe(), emoji=False)

    def on_broken_pipe(self) -> None:
        # Rich's own ends the command the same way, after pointing the process's stdout at /dev/null.
        self.quiet = True
        raise SystemExit(1)


def test_json_is_written_before_the_result_is_printed_to_a_stdout_that_may_be_closed(fake_cli, tmp_path, monkeypatch):
    """``ask … --json r.json | head`` exited 1 and never wrote r.json: the JSON came after the printing."""
    db, first, again = str(tmp_path / "x.sqlite"), tmp_path / "r.json", tmp_path / "again.json"
    monkeypatch.setattr(cli, "out", _ClosedStdout())
    with pytest.raises(SystemExit):
        _ask(PARIS, *SMALL, "--db", db, "--run-id", "run1", "--json", str(first))
    assert json.loads(first.read_text())["answer"] == "Paris"
    # The model as bench results name it: `calibrate` on this output records it (it recorded none).
    assert json.loads(first.read_text())["model"] == "embedded float32"
    monkeypatch.setattr(cli, "out", _ClosedStdout())
    with pytest.raises(SystemExit):  # the stored result of a finished run
        _ask(PARIS, "--db", db, "--run-id", "run1", "--resume", "--json", str(again))
    assert json.loads(again.read_text())["answer"] == "Paris"


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])  # PYTHONIOENCODING=ascii; LC_ALL=C PYTHONUTF8=0
def test_an_answer_stdout_cannot_encode_is_printed_escaped(monkeypatch, tmp_path, errors):
    """Under ``PYTHONIOENCODING=ascii`` the result's first non-ASCII character raised UnicodeEncodeError
    after the whole run: the answer was never shown and the command exited 1 with a traceback."""

    def agent(index, messages):
        return _agent(index, messages) if index == 0 else Reply(answer_text("Zürich 東京"))

    _cli_on(monkeypatch, agent)
    printed = io.BytesIO()
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(printed, encoding="ascii", errors=errors))
    assert _ask("Where is Zürich?", *SMALL, "--json", str(tmp_path / "r.json")) == 0
    sys.stdout.flush()
    assert "Z\\xfcrich \\u6771\\u4eac" in printed.getvalue().decode("ascii")
    assert sys.stdout.errors == errors  # as it was: only the command's own printing escapes
    assert json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["answer"] == "Zürich 東京"


def test_a_closed_stdout_does_not_stop_a_command_that_prints_nothing_there(monkeypatch, tmp_path, capsys):
    """A guard: escaping stdout's unencodable characters reconfigured a closed stdout: ValueError before the
    command ran."""
    closed = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    closed.close()
    monkeypatch.setattr("sys.stdout", closed)
    assert cli.main(["calibrate", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "cal.json")]) == 1
    assert "error: cannot read" in _err(capsys)


def test_the_closing_error_is_one_line_of_a_log_whatever_its_length(tmp_path, monkeypatch, capsys):
    """Wrapped at 80 columns (a log file's width), `grep error:` found part of the message, and a long
    path was cut in two."""
    monkeypatch.setattr(cli.console, "_width", 80)
    missing = tmp_path / ("a-long-folder-name-" * 5) / "results.jsonl"
    assert cli.main(["calibrate", str(missing), "--out", str(tmp_path / "cal.json")]) == 1
    line = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error:"))
    assert (
        line
        == f"error: cannot read {missing} (No such file or directory): pass bench results.jsonl or `ask --json` files"
    )


# ----------------------------------------------------------------------------- Ctrl-C


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler, which ``asyncio.run`` builds its Ctrl-C handling on: a suite
    started as a background job has SIGINT ignored, and the signal these tests raise did nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# LangGraph's executor drops the tasks it had not started when the run is cancelled.
@pytest.mark.filterwarnings("ignore:coroutine 'arun_with_retry' was never awaited:RuntimeWarning")
def test_ctrl_c_writes_the_finished_trajectories_to_json_and_says_a_run_without_db_cannot_resume(
    monkeypatch, tmp_path, capsys, ctrl_c
):
    """Interrupted without ``--db``, the finished trajectories were lost though ``--json`` was given,
    and the message suggested a resume this run could not do."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # asyncio.run's Ctrl-C handling
    calls = {"agent": 0}

    def agent(index, messages):
        calls["agent"] += 1
        if calls["agent"] == 6:  # the third trajectory's answer step: two have finished
            signal.raise_signal(signal.SIGINT)  # what Ctrl-C sends
            return Reply(answer_text("Paris"), delay=30.0)  # cancelled, never waited for
        return _agent(index, messages)

    _cli_on(monkeypatch, agent)
    result = tmp_path / "r.json"
    argv = ("--n", "4", "--mode", "none", "--max-concurrency", "1", "--json", str(result))
    assert _ask(PARIS, *argv) == 130
    kept = json.loads(result.read_text())
    assert kept["partial"] == "interrupted (Ctrl-C) before the run finished" and kept.get("answer") is None
    assert [t["status"] for t in kept["trajectories"]] == ["answered", "answered"]
    said = _err(capsys)
    assert f"Partial result written to {result}" in said and "without --db the run cannot be resumed" in said, said
    checkpointed = argparse.Namespace(db="runs.sqlite", run_id=None)
    assert (
        cli._ask_interrupted(checkpointed)
        == "rerun the same command with --run-id (the run id printed above) --resume to continue it"
    )


@pytest.mark.filterwarnings("ignore:coroutine 'arun_with_retry' was never awaited:RuntimeWarning")
def test_ctrl_c_with_nothing_to_write_says_why_json_was_not_written(monkeypatch, tmp_path, capsys, ctrl_c):
    """Interrupted before any trajectory reached the run's state, ``--json`` was silently not written:
    with online branching that is the whole rollout, one graph node, even after some had finished."""
    calls = {"agent": 0, "stop": 1}

    def agent(index, messages):
        calls["agent"] += 1
        if calls["agent"] == calls["stop"]:
            signal.raise_signal(signal.SIGINT)
            return Reply(answer_text("Paris"), delay=30.0)
        return _agent(index, messages)

    _cli_on(monkeypatch, agent)
    result = tmp_path / "r.json"
    assert _ask(PARIS, "--n", "2", "--mode", "none", "--max-concurrency", "1", "--json", str(result)) == 130
    assert not result.exists()
    assert "--json not written: no trajectory had finished" in _err(capsys)
    calls.update(agent=0, stop=4)  # t0 has answered (two steps) and two more have started
    online = ("--branching", "online", "--n", "4", "--k", "1", "--t", "1", "--max-concurrency", "1")
    assert _ask(PARIS, *online, "--db", str(tmp_path / "x.sqlite"), "--run-id", "r1", "--json", str(result)) == 130
    said = _err(capsys)
    assert not result.exists() and "t0 initial answered" in said, said
    assert (
        "--json not written: with online branching the trajectories reach the run's state only when the whole "
        "rollout has ended; those that finished are checkpointed in --db, and resuming the run reuses them"
    ) in said, said


@pytest.mark.filterwarnings("ignore:coroutine 'arun_with_retry' was never awaited:RuntimeWarning")
@pytest.mark.parametrize("sigint", ["python", "ignored"])
def test_sigterm_takes_ctrl_cs_path_and_keeps_the_finished_trajectories(monkeypatch, tmp_path, capsys, sigint):
    """SIGTERM (a job's time limit, ``timeout``) killed ``ask`` at once: no partial ``--json``, and without
    ``--db`` every finished trajectory lost. Also where SIGINT is ignored (a background job)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler if sigint == "python" else signal.SIG_IGN)
    calls = {"agent": 0}

    def agent(index, messages):
        calls["agent"] += 1
        if calls["agent"] == 6:  # the third trajectory's answer step: two have finished
            signal.raise_signal(signal.SIGTERM)
            return Reply(answer_text("Paris"), delay=30.0)
        return _agent(index, messages)

    _cli_on(monkeypatch, agent)
    result = tmp_path / "r.json"
    try:
        code = _ask(PARIS, "--n", "4", "--mode", "none", "--max-concurrency", "1", "--json", str(result))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 128 + signal.SIGTERM
    kept = json.loads(result.read_text())
    assert [t["status"] for t in kept["trajectories"]] == ["answered", "answered"]
    # The file said "interrupted (Ctrl-C)" while the terminal said SIGTERM.
    assert kept["partial"] == "terminated (SIGTERM) before the run finished"
    assert "terminated (SIGTERM)" in _err(capsys)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler was the run's alone


# ----------------------------------------------------------------------------- an output over an input


def test_an_output_that_is_an_input_is_refused_before_anything_runs(fake_cli, tmp_path, capsys):
    """``calibrate results.jsonl --out results.jsonl`` replaced the results; ``ask --json`` the
    checkpoint store it was given as ``--db``, or a corpus (here through a hard link)."""
    db, run = str(tmp_path / "x.sqlite"), tmp_path / "run.json"
    assert _ask(PARIS, *SMALL, "--db", db, "--run-id", "run1", "--json", str(run)) == 0
    stored, written = Path(db).read_bytes(), run.read_text()
    calls = len(fake_cli.calls)

    assert cli.main(["calibrate", str(run), "--out", str(run)]) == 1
    said = _err(capsys)
    assert f"--out {run} names the same file as the run file {run}:" in said, said
    assert run.read_text() == written
    assert _ask(PARIS, *SMALL, "--db", db, "--run-id", "run2", "--json", db) == 1
    assert f"--json {db} names the same file as --db {db}:" in _err(capsys)
    assert sqlite3.connect(db).execute("select count(*) from checkpoints").fetchone()[0] > 0
    corpus, link = tmp_path / "c.jsonl", tmp_path / "link.json"
    corpus.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is in France."}) + "\n")
    os.link(corpus, link)
    assert _ask(PARIS, *SMALL, "--corpus", str(corpus), "--json", str(link)) == 1
    assert f"--json {link} names the same file as --corpus {corpus}:" in _err(capsys)
    assert len(fake_cli.calls) == calls and Path(db).read_bytes() == stored


def test_ask_refuses_json_over_its_calibration_through_a_symlink(fake_cli, tmp_path, capsys):
    calibration, link = tmp_path / "cal.json", tmp_path / "out.json"
    regions = ("exploration", "reasoning", "all")
    Calibration("nll", 0.8, dict.fromkeys(regions, 2.0), dict.fromkeys(regions, 60)).save(str(calibration))
    link.symlink_to(calibration)
    assert _ask(PARIS, "--calibration", str(calibration), "--json", str(link)) == 1
    assert f"--json {link} names the same file as --calibration {calibration}:" in _err(capsys)
    assert Calibration.load(str(calibration)).thresholds["exploration"] == 2.0 and not fake_cli.calls


# ----------------------------------------------------------------------------- the result


@pytest.mark.parametrize("aggregation", ["majority", "parallelmuse"])
def test_a_run_without_an_answer_says_why_whatever_the_aggregation(aggregation, monkeypatch, capsys):
    """With a baseline aggregation (``--aggregation majority``) the answer panel showed ``None`` and no reason."""

    def never_answers(index, messages):
        return Reply(call_text("search", f"Look {index}", query=f"q{index}"))

    _cli_on(monkeypatch, never_answers)
    assert _ask(PARIS, "--n", "2", "--mode", "none", "--max-turns", "2", "--aggregation", aggregation) == 2
    shown = " ".join(capsys.readouterr().out.split())
    panel = shown.rpartition("Answer (source: none)")[2]
    assert "No answer: no trajectory answered (2 max_turns)." in panel and "None" not in panel, shown
    assert shown.count("no trajectory answered") == 1  # said once, not again as an aggregator's error


# ----------------------------------------------------------------------------- model flags


def test_a_model_path_the_loader_cannot_open_is_refused_naming_the_flag(fake_cli, tmp_path, capsys):
    """A mistyped ``--model-path`` failed in the graph's first step, after a checkpointed run had been
    stored with it (the run id was then blocked), in the Python API's words."""
    db = str(tmp_path / "x.sqlite")
    missing = tmp_path / "smollm2-hf"
    assert _ask(PARIS, *SMALL, "--model-path", str(missing), "--db", db, "--run-id", "run1") == 1
    assert f"--model-path {missing} does not exist" in _err(capsys)
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("x")
    assert _ask(PARIS, *SMALL, "--model-path", str(not_a_model)) == 1
    assert "is not a directory nor a .gguf file" in _err(capsys)
    assert not fake_cli.calls and not Path(db).exists()
    # What the loader takes passes: a checkpoint directory (its config.json), a .gguf file.
    (gguf := tmp_path / "model.gguf").write_text("x")
    (tmp_path / "config.json").write_text("{}")
    for path in (tmp_path, gguf):
        cli._check_model_flags(argparse.Namespace(base_url=None, model=None, model_path=str(path), precision=None))


def test_agent_checks_its_model_flags_before_the_index_opens(tmp_path, monkeypatch, capsys):
    """``agent --model-path`` of no checkpoint (or ``--model`` without a server) was found only after
    the search index had opened, built first when not cached; ``ask`` checked them first."""
    monkeypatch.setattr(cli, "_tools", lambda args: pytest.fail("the index opened"))
    assert cli.main(["agent", PARIS, "--model-path", str(tmp_path)]) == 1
    assert f"--model-path {tmp_path} is a directory without config.json" in _err(capsys)
    assert cli.main(["agent", PARIS, "--model", "gpt-4o"]) == 1
    assert "--model 'gpt-4o' names a model on a server: add --base-url" in _err(capsys)


def test_precision_is_refused_with_a_server_and_means_float32_when_not_given(fake_cli, capsys):
    """``--precision`` with ``--base-url`` was silently ignored (and dropped from the run's inputs)."""
    server = ("--base-url", "http://127.0.0.1:9/v1", "--model", "smollm2")
    assert _ask(PARIS, *SMALL, *server, "--precision", "bfloat16") == 1
    said = _err(capsys)
    assert "--precision bfloat16" in said and "--base-url" in said and not fake_cli.calls
    local = cli.build_parser().parse_args(["ask", PARIS])
    assert local.precision is None and cli._model_identity(local) == "embedded float32"
    assert cli._run_inputs(local)["--precision"] == "float32"  # as runs stored before recorded it


def test_precision_auto_is_recorded_as_the_precision_it_computes_in(fake_cli, tmp_path, monkeypatch, capsys):
    """``--precision auto`` was recorded "embedded auto": a calibration fitted on a bfloat16 machine's
    runs gave no warning when used in float32, nor one fitted in float32 on a bfloat16 machine."""
    from langgraph_parallelmuse.models import hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"amx_bf16"}))  # a CPU with native bfloat16
    result = tmp_path / "r.json"
    assert _ask(PARIS, *SMALL, "--precision", "auto", "--json", str(result)) == 0
    assert json.loads(result.read_text())["model"] == "embedded bfloat16"
    regions = ("exploration", "reasoning", "all")
    calibration = tmp_path / "cal.json"
    auto = cli.build_parser().parse_args(["ask", PARIS, "--precision", "auto"])
    for fitted_on, warned in (("embedded bfloat16", False), ("embedded float32", True), ("embedded auto", True)):
        Calibration("nll", 0.8, dict.fromkeys(regions, 2.0), dict.fromkeys(regions, 60), model=fitted_on).save(
            str(calibration)
        )
        capsys.readouterr()
        cli._warn_other_model(str(calibration), cli._model_identity(auto))
        said = _err(capsys)
        assert ("warning:" in said) == warned, (fitted_on, said)
    # Recorded before auto was resolved: which precision those runs computed in is unknown.
    assert "'embedded auto' (auto, recorded unresolved" in said and "this run uses 'embedded bfloat16'" in said
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))
    assert cli._model_identity(auto) == "embedded float32"


def test_a_server_without_logprobs_is_refused_for_a_weighted_vote_without_branching():
    """``--mode none --aggregation weighted`` accepted such a server, and the weighted vote silently
    fell back to a majority."""
    from tests.unit.http_fakes import fake_http
    from tests.unit.test_server_model import fake_server

    with fake_http(fake_server(logprobs=None)) as server:
        argv = ["ask", PARIS, "--base-url", f"{server.url}/v1", "--model", "smollm2", "--mode", "none"]
        args = cli.build_parser().parse_args([*argv, "--aggregation", "weighted"])
        with pytest.raises(ParallelMuseError, match="returned no logprobs"):
            cli._server_model(args, cli._config_from(args))
        args = cli.build_parser().parse_args([*argv, "--aggregation", "majority"])
        cli._server_model(args, cli._config_from(args))  # no logprobs read: the server serves


# ----------------------------------------------------------------------------- resume


def test_resume_validates_the_given_flags_on_top_of_the_stored_settings(fake_cli, tmp_path, capsys):
    """``--resume --n 4`` of a run stored with ``--mode none`` was refused for the default mode's
    budget (n=4 < m + m*k*t = 7)."""
    run = (PARIS, "--db", str(tmp_path / "x.sqlite"), "--run-id", "run1")
    assert _ask(*run, "--n", "4", "--mode", "none") == 0
    calls = len(fake_cli.calls)
    assert _ask(*run, "--resume", "--n", "4") == 0
    assert "already finished" in _err(capsys)
    # Another setting is still named as such, not as the budget it would break.
    assert _ask(*run, "--resume", "--mode", "exploration") == 1
    assert "--mode exploration (stored: none)" in _err(capsys)
    assert len(fake_cli.calls) == calls


def test_a_taken_run_id_or_a_resume_of_another_run_is_refused_before_the_index_or_the_model_loads(
    fake_cli, tmp_path, monkeypatch, capsys
):
    """These were found when the graph read the stored run: after the index had opened and the model loaded."""
    db = str(tmp_path / "x.sqlite")
    assert _ask(PARIS, *SMALL, "--db", db, "--run-id", "run1") == 0
    loaded = []
    monkeypatch.setattr(cli, "_model", lambda *a, **k: loaded.append("model") or fake_cli)
    monkeypatch.setattr(cli, "_tools", lambda *a, **k: loaded.append("tools") or make_tools()[0])
    refused = [
        ((PARIS, "--run-id", "run1"), "--run-id 'run1' in {db} already holds a run: add --resume"),
        (("Where is Rome?", "--run-id", "run1", "--resume"), f"was started with the question {PARIS!r}"),
        ((PARIS, "--run-id", "run1", "--resume", "--doc-ids", "d1"), "other inputs: --doc-ids d1 (stored: not given)"),
        ((PARIS, "--run-id", "nope", "--resume"), "no run --run-id 'nope' in {db}: start it without --resume"),
    ]
    for argv, message in refused:
        assert _ask(*argv, "--db", db) == 1
        said = _err(capsys)
        assert message.format(db=db) in said, said
    assert loaded == []
    # The run itself passes the checks, and then loads them, in that order.
    assert _ask(PARIS, "--db", db, "--run-id", "run1", "--resume") == 0 and "already finished" in _err(capsys)
    assert loaded == ["tools", "model"]

    def no_corpus(args):
        raise CorpusError("cannot read the corpus c.jsonl")

    # The checks read no SQLite file still to be created (nothing is stored there): an index that fails
    # to open leaves no new file behind.
    monkeypatch.setattr(cli, "_tools", no_corpus)
    new = tmp_path / "new.sqlite"
    assert _ask(PARIS, "--db", str(new), "--run-id", "run2") == 1
    assert "cannot read the corpus c.jsonl" in _err(capsys) and not new.exists()


def test_a_corpus_given_as_a_pipe_is_named_as_such_before_it_is_read():
    """``bench --corpus <(zcat …)``: the fingerprint resolved /dev/fd/N to "/proc/…/pipe:[…]" and said it
    could not read that; reading the pipe to hash it would have left nothing for the index."""
    read, write = os.pipe()
    try:
        with pytest.raises(CorpusError, match=f"corpus /dev/fd/{read} is not a regular file"):
            cli._corpus_digests([f"/dev/fd/{read}"])
    finally:
        os.close(read)
        os.close(write)


def test_a_resume_on_a_corpus_edited_in_the_middle_is_refused(fake_cli, tmp_path, capsys):
    """Only the first and last MiB of a corpus file were hashed: an edit between them that kept the
    size went unseen, and the run resumed on other texts than its trajectories had read."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i:07}", "title": "T", "text": "born in 1987"}}\n' for i in range(80_000)))
    run = (PARIS, *SMALL, "--db", str(tmp_path / "x.sqlite"), "--run-id", "run1", "--corpus", str(corpus))
    assert _ask(*run) == 0
    data = corpus.read_bytes()
    middle = data.index(b"1987", len(data) // 2)
    corpus.write_bytes(data[:middle] + b"1978" + data[middle + 4 :])  # the same size, 2 MiB from either end
    assert _ask(*run, "--resume") == 1
    assert "was started with other inputs: --corpus docs.jsonl" in _err(capsys)


def test_an_ask_run_hashes_its_corpus_once_for_its_record_and_its_index(tmp_path, monkeypatch):
    """Each hash reads the whole corpus (a second a gigabyte): ask hashed it for the run's record and again
    for the index's cache key, and a resume a third time, to compare it with the stored run's."""
    from langgraph_parallelmuse.tools import corpus as corpus_module

    model = ScriptedChatModel(responder=research_responder(_agent))
    monkeypatch.setattr(cli, "_model", lambda *a, **k: model)
    monkeypatch.setenv("PARALLELMUSE_CACHE_DIR", str(tmp_path / "cache"))
    hashed = []
    real = corpus_module.file_sha256
    monkeypatch.setattr(corpus_module, "file_sha256", lambda path: hashed.append(path) or real(path))
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is the capital of France."}) + "\n")
    run = (PARIS, *SMALL, "--corpus", str(corpus), "--db", str(tmp_path / "x.sqlite"), "--run-id", "run1")
    assert _ask(*run) == 0
    assert hashed == [corpus.resolve()]
    assert _ask(*run, "--resume") == 0
    assert hashed == [corpus.resolve()] * 2


@pytest.mark.parametrize("flag", ["--run-id", "--db", "--base-url", "--model", "--model-path", "--doc-ids", "--corpus"])
def test_a_blank_flag_is_refused_by_the_parser(flag, fake_cli, tmp_path, monkeypatch, capsys):
    """A blank value (``--base-url "$URL"``, the variable unset) was taken as the flag not given: the
    embedded model ran instead of the server, ``--db`` kept nothing, ``--run-id`` got a random id,
    ``--doc-ids`` let the tools see every document."""
    monkeypatch.chdir(tmp_path)  # where a blank path would land
    db = tmp_path / "x.sqlite"
    others = ("--db", str(db)) if flag == "--run-id" else ()
    with pytest.raises(SystemExit) as exited:
        _ask(PARIS, *SMALL, *others, flag, " ")
    assert exited.value.code == 2 and not db.exists() and not fake_cli.calls
    assert f"argument {flag}: ' ' is blank (an unset shell variable?): give a value or drop the flag" in _err(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["ask", "Who?", "--json", ""],
        ["ask", "Who?", "--out="],
        ["bench", "--questions", "q.jsonl", "--out", " "],
        ["bench", "--questions", ""],
        ["calibrate", "r.jsonl", "--out", ""],
        ["calibrate", "", "--out", "c.json"],
    ],
)
def test_a_blank_path_flag_is_refused_by_the_parser(argv, capsys):
    """``ask --json "$OUT"`` with the variable unset wrote no result, silently (a blank path read as
    no --json), and ``bench --out ""`` wrote its results into the working directory."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "is blank (an unset shell variable?): give a value or drop the flag" in _err(capsys)


@pytest.mark.parametrize("seed", ["-1", "--seed=-1"])
def test_a_negative_bench_seed_is_refused_by_the_parser(seed, capsys):
    """numpy's bootstrap generator takes no negative seed: ``bench --seed -1`` ran every question and
    then failed writing the summary with a bare "ValueError: expected non-negative integer"."""
    flag = ["--seed", seed] if seed == "-1" else [seed]
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["bench", "--questions", "q.jsonl", *flag])
    assert exited.value.code == 2
    assert "argument --seed: '-1': pass a whole number >= 0" in _err(capsys)
    assert cli.build_parser().parse_args(["bench", "--questions", "q.jsonl", "--seed", "0"]).seed == 0


def test_flags_the_runs_settings_never_read_are_refused_before_the_model_loads(fake_cli, tmp_path, capsys):
    """``--mode none --k 3`` ran from scratch as if ``--k`` had not been given (k, T and diverse
    branches shape the branches mode none never makes), and a voting aggregation wrote no report
    with ``--max-report-tokens``."""
    assert _ask(PARIS, "--n", "2", "--mode", "none", "--k", "3", "--diverse-branches") == 1
    said = _err(capsys)
    assert "mode none samples every trajectory from scratch, so --k and --diverse-branches would change nothing" in said
    assert "drop --k and --diverse-branches, or choose a branching --mode" in said and not fake_cli.calls
    assert _ask(PARIS, *SMALL, "--aggregation", "majority", "--max-report-tokens", "64") == 1
    assert (
        "--aggregation majority votes on the trajectories' answers, with no report and no aggregator, so "
        "--max-report-tokens would change nothing: drop --max-report-tokens, or use --aggregation parallelmuse"
    ) in _err(capsys)
    assert not fake_cli.calls
    db = str(tmp_path / "x.sqlite")
    assert _ask(PARIS, "--n", "2", "--mode", "none", "--no-diverse-branches", "--db", db, "--run-id", "r1") == 0
    assert _ask(PARIS, "--t", "3", "--db", db, "--run-id", "r1", "--resume") == 1  # the stored run's mode
    assert "so --t would change nothing" in _err(capsys)


# ----------------------------------------------------------------------------- paths


def test_path_flags_read_a_leading_tilde_as_the_home_folder(fake_cli, tmp_path, monkeypatch, capsys):
    """A ``~`` the shell leaves as written (``--json=~/r.json``, a quoted path) was refused as a missing
    folder ``~`` by ``ask --json`` and ``calibrate``, whose ``--calibration`` reads it as home."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _ask(PARIS, *SMALL, "--json", "~/r.json") == 0, _err(capsys)
    assert json.loads((tmp_path / "r.json").read_text())["answer"] == "Paris"
    (tmp_path / "results.jsonl").write_text(_bench_line("q1", "Paris"), encoding="utf-8")
    assert cli.main(["calibrate", "~/results.jsonl", "--out", "~/my cal.json"]) == 0, _err(capsys)
    assert Calibration.load(str(tmp_path / "my cal.json")).questions == ("q1",)
    args = cli.build_parser().parse_args(["bench", "--questions", "~/q.jsonl", "--out", "~/run"])
    assert (args.questions, args.out) == (str(tmp_path / "q.jsonl"), str(tmp_path / "run"))


def test_a_json_output_on_stdout_is_all_that_stdout_holds(fake_cli, tmp_path, capfd):
    """``ask --json /dev/stdout | jq`` read the JSON followed by the result's panels (and ``calibrate
    --out /dev/stdout`` its table): no longer JSON. The text goes to standard error then."""
    assert _ask(PARIS, *SMALL, "--json", "/dev/stdout") == 0
    printed, said = capfd.readouterr()
    assert json.loads(printed)["answer"] == "Paris" and "Trajectory tree" in said
    (tmp_path / "results.jsonl").write_text(_bench_line("q1", "Paris"), encoding="utf-8")
    assert cli.main(["calibrate", str(tmp_path / "results.jsonl"), "--out", "/dev/stdout"]) == 0
    printed, said = capfd.readouterr()
    assert json.loads(printed)["questions"] == ["q1"] and "perplexity (branch above)" in said


# ----------------------------------------------------------------------------- calibrate


def _bench_line(qid: str, answer: str) -> str:
    """A bench results line, written as bench writes it (``ensure_ascii=False``), of one scored trajectory."""
    trajectory = {"origin": {"kind": "initial"}, "uncertainty": [{"all": 1.5, "reasoning": 2.0}] * 3, "answer": answer}
    record = {
        "id": qid,
        "settings": {"estimator": "nll", "model": "embedded float32"},
        "trajectories": {"t0": trajectory},
    }
    return json.dumps(record, ensure_ascii=False) + "\n"


def test_calibrate_reads_bench_records_whose_texts_hold_unicode_line_separators(tmp_path, capsys):
    """The records were split with ``str.splitlines``, which also splits at U+2028 and U+0085: a page's
    text holding one made a valid results file "not JSON"."""
    results, cal = tmp_path / "results.jsonl", tmp_path / "cal.json"
    results.write_text(_bench_line("q1", "Paris\u2028France") + _bench_line("q2", "Rome\x85Italy"), encoding="utf-8")
    assert cli.main(["calibrate", str(results), "--out", str(cal)]) == 0, _err(capsys)
    assert Calibration.load(str(cal)).questions == ("q1", "q2")


def test_calibrate_leaves_out_the_last_record_a_crashed_bench_cut(tmp_path, capsys):
    """A bench killed mid-write leaves its last line cut (bench itself runs that question again):
    calibrate refused the whole file, so a crashed run's finished records could not be used."""
    results, cal = tmp_path / "results.jsonl", tmp_path / "cal.json"
    results.write_text(_bench_line("q1", "Paris") + _bench_line("q2", "Rome")[:40], encoding="utf-8")
    assert cli.main(["calibrate", str(results), "--out", str(cal)]) == 0, _err(capsys)
    assert Calibration.load(str(cal)).questions == ("q1",)
    assert "line 2: a record cut by a crash, left out" in _err(capsys)
    results.write_text(_bench_line("q1", "Paris")[:40] + "\n" + _bench_line("q2", "Rome"), encoding="utf-8")
    assert cli.main(["calibrate", str(results), "--out", str(cal)]) == 1  # not the last line: damage, not a crash
    assert "line 1 is not JSON" in _err(capsys)


def test_calibrate_names_a_file_that_is_not_text_in_one_line(tmp_path, capsys):
    """A binary file (the --db store, given by mistake) ended in a UnicodeDecodeError traceback."""
    store = tmp_path / "runs.sqlite"
    store.write_bytes(b"SQLite format 3\x00\xd6\xff" * 10)
    assert cli.main(["calibrate", str(store), "--out", str(tmp_path / "cal.json")]) == 1
    assert f"{store} is not UTF-8 text" in _err(capsys) and not (tmp_path / "cal.json").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device that is always full")
def test_calibrate_names_an_output_it_could_not_write(tmp_path, capsys):
    """A full disk (or ``--out /dev/stdout | head -c1``, a reader gone: BrokenPipeError) ended in an
    OSError traceback."""
    (tmp_path / "results.jsonl").write_text(_bench_line("q1", "Paris"), encoding="utf-8")
    assert cli.main(["calibrate", str(tmp_path / "results.jsonl"), "--out", "/dev/full"]) == 1
    assert "error: could not write --out /dev/full (No space left on device)" in _err(capsys)


# ----------------------------------------------------------------------------- bench


def test_bench_refuses_a_read_only_results_file_before_loading_the_model(tmp_path, monkeypatch, capsys):
    """Only the folder was checked: run_bench refused the file once the model had loaded."""
    monkeypatch.setattr(cli, "_model", lambda *a, **k: pytest.fail("the model was loaded"))
    questions, corpus, out = tmp_path / "q.jsonl", tmp_path / "c.jsonl", tmp_path / "run"
    item = {"id": "q1", "question": PARIS, "answers": ["Paris"], "context_doc_ids": ["d1"]}
    questions.write_text(json.dumps(item) + "\n")
    corpus.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is in France."}) + "\n")
    out.mkdir()
    (out / "results.jsonl").write_text("")
    access = os.access  # root writes a read-only file: the check is what is tested
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path).name != "results.jsonl" and access(path, mode))
    argv = ["bench", "--questions", str(questions), "--corpus", str(corpus), "--out", str(out), "--methods", "majority"]
    assert cli.main(argv) == 1
    assert f"{out / 'results.jsonl'} is read-only" in _err(capsys)


def test_bench_refuses_a_calibration_fitted_on_its_questions(tmp_path, monkeypatch, capsys):
    """The calibration records the questions it was fitted on, but bench never looked: a run on them
    is measured on its own calibration."""
    monkeypatch.setattr(cli, "_model", lambda *a, **k: pytest.fail("the model was loaded"))
    questions, corpus = tmp_path / "q.jsonl", tmp_path / "c.jsonl"
    item = {"question": PARIS, "answers": ["Paris"], "context_doc_ids": ["d1"]}
    questions.write_text("".join(json.dumps({"id": i, **item}) + "\n" for i in ("q1", "q2")))
    corpus.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is in France."}) + "\n")
    regions = ("exploration", "reasoning", "all")
    calibration = tmp_path / "cal.json"
    fitted = Calibration("nll", 0.8, dict.fromkeys(regions, 2.0), dict.fromkeys(regions, 60), questions=("q2", "q9"))
    fitted.save(str(calibration))
    argv = ["bench", "--questions", str(questions), "--corpus", str(corpus), "--out", str(tmp_path / "run")]
    assert cli.main([*argv, "--set", f"calibration={calibration}", "--methods", "partial"]) == 1
    said = _err(capsys)
    assert f"--set calibration={calibration} was fitted on 1 of these questions ('q2')" in said, said
    assert "bench other questions" in said
    items = [argparse.Namespace(id="q1", question=PARIS)]
    cli._check_calibration_questions(str(calibration), items)  # other questions: measured fairly


def test_reports_cut_for_the_aggregator_are_a_note_not_a_pick_unused(monkeypatch) -> None:
    # Before: the cut was the aggregate's "error", and a pick made from cut reports was shown as "not used".
    screen = Console(file=io.StringIO(), width=400, emoji=False)
    monkeypatch.setattr(cli, "out", screen)
    monkeypatch.setattr(cli, "_write_json", lambda *args: None)
    monkeypatch.setattr(cli, "_model_identity", lambda args: "m")
    cut = "the reports did not fit the aggregator's context window: it read each cut to 880 characters"
    final = {"answer": "Lyon", "answer_source": "aggregator", "stats": {"aggregate": {"error": None, "note": cut}}}
    cli._show_result(final, argparse.Namespace(json=None))
    shown = screen.file.getvalue()
    assert f"note: {cut}" in shown and "not used" not in shown


@pytest.mark.parametrize(
    "argv", [["ask", "Who?", "--base-url"], ["bench", "--questions", "q.jsonl", "--judge-base-url"]]
)
def test_a_server_url_without_scheme_is_refused_naming_the_flag(argv, capsys):
    # Before: refused by the server check as "check_server: base_url='…' must be …", naming no flag.
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*argv, "admin:pw1234@localhost:8000/v1"])
    said = _err(capsys)
    assert exited.value.code == 2 and f"argument {argv[-1]}: '***@localhost:8000/v1' is no http://" in said
    assert "pw1234" not in said


@pytest.mark.parametrize(
    "url", ["http://localhost:8000/v1 ", " http://localhost:8000/v1", "http://localhost:8000/v1\t"]
)
def test_a_server_url_with_blanks_around_it_is_refused(url, capsys):
    # urlsplit strips them, so the check passed; the client then asked for /v1%20/chat/completions.
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["ask", "Who?", "--base-url", url])
    assert exited.value.code == 2 and f"argument --base-url: {url!r} is no http:// or https:// URL" in _err(capsys)
