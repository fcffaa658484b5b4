"""``parallelmuse ask`` end to end on the embedded model, and ``--resume`` after a SIGKILL.

Each test runs the CLI as a subprocess (``python -m langgraph_parallelmuse.cli ask``) on a tiny
JSONL corpus written into ``tmp_path``, checkpointing to ``--db``: a SQLite file, or a real
PostgreSQL (Debian's postgresql-15, started by the ``postgres`` fixture) by ``postgresql://`` URL.
The resume test kills the first process with SIGKILL once the database holds a finished
trajectory thread, reruns the command with ``--resume`` and checks that the finished trajectories
come back unchanged and got no new checkpoint. Real model (SmolLM2 on CPU): minutes per store;
select with ``pytest -m integration``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, offline_env

try:
    import psycopg

    DB_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, psycopg.Error)
except ImportError:  # the persist extra without Postgres: the SQLite case still runs
    DB_ERRORS = (sqlite3.Error,)

pytestmark = pytest.mark.integration

QUESTION = "Which city is the Eiffel Tower in?"
# Short steps and reports keep the real model's runtime down on a loaded CPU.
SMALL = ["--max-step-tokens", "64", "--max-report-tokens", "96", "--seed", "0"]


def _ask(corpus: Path, db: str, out: Path, *config: str, resume: bool = False) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "langgraph_parallelmuse.cli",
        "ask",
        QUESTION,
        "--corpus",
        str(corpus),
        "--db",
        db,
        "--run-id",
        "r1",
        "--json",
        str(out),
        *config,
        *SMALL,
    ]
    return cmd + (["--resume"] if resume else [])


def _run(cmd: list[str], tmp_path: Path, name: str, timeout: float) -> subprocess.CompletedProcess:
    env = offline_env(PARALLELMUSE_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="160")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    (tmp_path / f"{name}.log").write_text(proc.stdout + proc.stderr)
    return proc


def _check_result(result: dict, n: int) -> None:
    assert {"answer", "answer_source", "trajectories", "reports", "stats"} <= set(result)
    assert result["answer"] is None or (isinstance(result["answer"], str) and result["answer"].strip())
    assert len(result["trajectories"]) == n
    assert result["stats"]["rollout"]["trajectories"] == n
    assert result["stats"]["config"]["n"] == n


def _query(db: str, sql: str, params: Sequence = ()) -> list[tuple]:
    """Rows of ``sql`` (``?`` placeholders) on the SQLite file or PostgreSQL URL ``db``, read-only."""
    if db.startswith("postgresql://"):
        with psycopg.connect(db, autocommit=True) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def _trajectory_threads(db: str) -> list[str]:
    """Trajectory thread ids in the db (``<run thread>:<question digest>/<trajectory id>``)."""
    try:
        rows = _query(db, "SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id LIKE ?", ["r1:%/%"])
    except DB_ERRORS:  # not created yet, or locked by the writer for a moment
        return []
    return [r[0] for r in rows]


def _checkpoints(db: str, thread_id: str) -> int:
    return _query(db, "SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", [thread_id])[0][0]


async def _finished(db: str) -> dict[str, dict]:
    """Finished trajectories in the db, by id: what a resumed run must not regenerate."""
    from langgraph_parallelmuse.agent import RolloutRunner
    from langgraph_parallelmuse.persistence import open_checkpointer
    from tests.unit.fakes import ScriptedChatModel, make_tools

    out = {}
    async with open_checkpointer(db) as saver:
        runner = RolloutRunner(ScriptedChatModel(), make_tools()[0], checkpointer=saver)
        for thread in _trajectory_threads(db):
            if (traj := await runner.existing(thread)) is not None:  # the db holds one question's run
                out[traj["id"]] = traj
    return out


def _finished_or_empty(db: str) -> dict[str, dict]:
    try:
        return asyncio.run(_finished(db))
    except DB_ERRORS:
        return {}


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the run is checkpointed: a new SQLite file, or a fresh database on the real PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "run.sqlite")
    server = request.getfixturevalue("postgres")
    name = f"resume_{os.getpid()}_{int(time.time() * 1000)}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.timeout(1500)
def test_sigkill_then_resume_keeps_finished_trajectories(tmp_path, small_corpus, db):
    out1, out2 = tmp_path / "out1.json", tmp_path / "out2.json"
    config = ["--n", "3", "--k", "1", "--t", "1", "--max-turns", "3"]
    env = offline_env(PARALLELMUSE_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="160")
    log1 = tmp_path / "first.log"
    started = time.monotonic()
    with log1.open("w") as log:
        first = subprocess.Popen(
            _ask(small_corpus, db, out1, *config),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        deadline = time.monotonic() + 900
        finished: dict[str, dict] = {}
        while time.monotonic() < deadline and first.poll() is None:
            if _trajectory_threads(db) and (finished := _finished_or_empty(db)):
                break
            time.sleep(1)
        assert first.poll() is None, f"first run ended before the kill:\n{log1.read_text()[-3000:]}"
        assert finished, f"no trajectory finished in time:\n{log1.read_text()[-3000:]}"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert first.returncode == -signal.SIGKILL
    assert not out1.exists()
    killed_at = time.monotonic() - started
    # Read again after the kill: anything that finished between the poll and the kill counts too.
    finished = asyncio.run(_finished(db))
    assert finished
    counts = {t["thread_id"]: _checkpoints(db, t["thread_id"]) for t in finished.values()}

    proc = _run(_ask(small_corpus, db, out2, *config, resume=True), tmp_path, "resume", timeout=1000)
    assert proc.returncode in (0, 2), proc.stdout[-3000:] + proc.stderr[-3000:]
    if "already finished" in proc.stderr:
        # The race this test cannot win every time: the graph reached its end between the poll that
        # saw a finished trajectory and the kill (the process was still writing its output), so
        # there is nothing to resume. Seen once in ~20 runs of the suite, on a loaded machine.
        pytest.skip(f"the first run finished its graph before the kill ({killed_at:.0f}s in): nothing to resume")
    assert "Resuming run 'r1'" in proc.stderr
    assert "Run statistics" in proc.stdout and "Trajectory tree" in proc.stdout
    result = json.loads(out2.read_text())
    _check_result(result, 3)
    assert (proc.returncode == 0) == (result["answer"] is not None)
    by_id = {t["id"]: t for t in result["trajectories"]}
    for tid, before in finished.items():
        after = by_id[tid]
        assert after["thread_id"] == before["thread_id"]
        assert after["answer"] == before["answer"] and after["status"] == before["status"]
        assert [s["text"] for s in after["steps"]] == [s["text"] for s in before["steps"]]
        assert [o["content"] for o in after["observations"]] == [o["content"] for o in before["observations"]]
    # Not regenerated: a finished trajectory's thread got no new checkpoint in the resumed run.
    assert {t["thread_id"]: _checkpoints(db, t["thread_id"]) for t in finished.values()} == counts
    print(f"killed after {killed_at:.0f}s with {sorted(finished)} finished; total {time.monotonic() - started:.0f}s")
