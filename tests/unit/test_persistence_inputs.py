"""``--db`` targets refused up front: nothing here starts or needs a database server.

``check_db`` only parses; ``open_checkpointer`` is tried once against a closed loopback port to see
that a refused connection becomes a ConfigError naming the (redacted) URL.
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, TypedDict

import pytest

from langgraph_parallelmuse import cli
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.persistence import check_db, open_checkpointer
from langgraph_parallelmuse.serving import free_port

pytest.importorskip("langgraph.checkpoint.postgres.aio")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("postgresql://u@127.0.0.1:99999/db", "99999"),
        ("postgresql://u@:abc/db", "abc"),
        ("postgresql://u@127.0.0.1:0/db", "0"),
        ("postgresql://u@h1:5432,h2:70000/db", "70000"),
    ],
)
def test_a_port_outside_1_to_65535_is_named(url: str, port: str) -> None:
    with pytest.raises(ConfigError, match=rf"--db '{url}': port '{port}' is not a TCP port: .*1 to 65535"):
        check_db(url)


@pytest.mark.parametrize("url", ["postgresql://", "postgres://", "postgresql://alice@/"])
def test_a_url_leaving_host_and_database_to_libpqs_defaults_is_accepted(url: str) -> None:
    # libpq takes them from PGHOST / PGDATABASE or the local socket.
    assert check_db(url) == "postgres"


@pytest.mark.parametrize("url", ["POSTGRESQL://u@127.0.0.1:5432/db", "Postgres://u@127.0.0.1/db"])
def test_the_scheme_is_matched_in_any_case_and_in_both_libpq_spellings(url: str) -> None:
    assert check_db(url) == "postgres"


def test_the_sqlalchemy_form_says_to_drop_the_driver_and_hides_the_password() -> None:
    with pytest.raises(ConfigError, match=r"postgresql\+psycopg:// is SQLAlchemy's form: drop '\+psycopg'") as err:
        check_db("postgresql+psycopg://u:hunter22@127.0.0.1/db")
    assert "--db 'postgresql+psycopg://u:***@127.0.0.1/db'" in str(err.value)
    assert "hunter22" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///tmp/runs.sqlite", "give the SQLite file's path itself, without sqlite://"),
        ("mysql://u@127.0.0.1/db", "mysql:// is not a store this takes"),
    ],
)
def test_another_scheme_is_not_taken_for_a_folder(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"--db '{url}': {message}"):
        check_db(url)


def test_a_url_libpq_cannot_parse_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"is not a valid PostgreSQL URL \(invalid URI query parameter: \"bogus\"\)"):
        check_db("postgresql://u@127.0.0.1/db?bogus=1")


def test_a_sqlite_path_without_the_sqlite_saver_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.sqlite.aio", None)  # import raises ImportError
    with pytest.raises(
        ConfigError, match=r"needs the SQLite checkpointer: pip install 'langgraph-parallelmuse\[persist\]'"
    ):
        check_db(str(tmp_path / "runs.sqlite"))


async def test_a_refused_connection_is_a_config_error_naming_the_redacted_url() -> None:
    url = f"postgresql://u:s3cretpw@127.0.0.1:{free_port()}/db?connect_timeout=5"  # nothing listens there
    with pytest.raises(ConfigError, match=r"cannot open the PostgreSQL database \(.*refused") as err:
        async with open_checkpointer(url):
            pass
    assert f"--db '{url.replace('s3cretpw', '***')}'" in str(err.value)
    assert "s3cretpw" not in str(err.value)


@pytest.mark.parametrize(
    "target", ["host=db.internal user=app password=s3cret dbname=runs", "dbname=runs", "  port = 5433 host=db"]
)
def test_a_libpq_key_value_string_is_refused_not_taken_for_a_sqlite_file(target: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # before the fix a file of that name appeared here
    with pytest.raises(ConfigError, match="libpq key=value string: give the database as a URL") as info:
        check_db(target)
    assert "s3cret" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["./user=alice.db", "runs/port=1.sqlite"])
def test_a_sqlite_path_with_a_folder_is_a_file_even_with_an_equals_sign(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert check_db(name) == "sqlite"


@pytest.mark.parametrize(
    "target",
    [
        "postgresql://app:p@ss-hunter2@db.example:5432/runs",  # libpq took "ss-hunter2@db.example" for the host
        "postgresql://app:pa/hunter2@db.example:5432/runs",  # and "hunter2" for the port
        "host=/var/run/postgresql dbname=runs user=app password=hunter2",  # a socket folder: read as a file path
        "postgresql://db.example:99999/runs?user=app&password=hunt2",  # a short password is one too
        "postgresql://app:Se?c@hunt99@db.example:5432/runs",  # libpq does not end the user info at "?"
        "host=/tmp dbname=runs password=hunt",  # a libpq string, its password short
        "postgresql://app:Sec hunt99@db.example:5432/runs",  # libpq's reason quoted it, space and all
    ],
)
def test_a_db_error_never_shows_the_password(target: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_db(target)
    assert "hunt" not in str(err.value)


@pytest.mark.parametrize("url", ["postgresql://app@db.example:5432/team@runs", "postgresql://u:pw@[::1]:5432/db"])
def test_an_at_sign_in_the_database_name_or_an_ipv6_host_is_accepted(url: str) -> None:
    assert check_db(url) == "postgres"


# ----------------------------------------------------------------------------- passwords


@pytest.mark.parametrize(
    "target",
    [
        "postgresql://localhost:5/9hunt@127.0.0.1/runs",  # libpq: host localhost, port 5, database 9hunt@...
        "postgresql://app:12/hunt@db.example/runs",
    ],
)
def test_a_raw_slash_in_the_password_before_a_numeric_part_is_refused_as_raw_user_info(target: str) -> None:
    with pytest.raises(ConfigError, match=r"holds a raw '@' or '/': percent-encode them") as err:
        check_db(target)
    assert "hunt" not in str(err.value)


def test_a_short_password_holding_a_space_is_hidden_too() -> None:
    # libpq's reason quotes it; the known secrets are redacted only from 6 characters on.
    with pytest.raises(ConfigError, match=r"use percent-encoded spaces") as err:
        check_db("postgresql://app:my pw@db.example/runs")
    assert "my pw" not in str(err.value)


async def test_a_connection_error_quoting_a_short_url_password_hides_it(monkeypatch) -> None:
    import psycopg

    async def refuse(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError('connection failed: password "Zq9" rejected')

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refuse)
    with pytest.raises(ConfigError, match=r"cannot open the PostgreSQL database") as err:
        async with open_checkpointer("postgresql://app:Zq9@127.0.0.1:5432/runs"):
            pass
    assert "Zq9" not in str(err.value)


@pytest.mark.parametrize("password", ["1", "runs", "to", "app"])
async def test_a_short_url_password_is_hidden_where_it_stands_not_in_the_host_port_or_database(
    monkeypatch, password: str
) -> None:
    # Replaced as a word, "1" made the host "127.0.0.***" and the port "***", "runs" hid the database.
    import psycopg

    async def refuse(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError(
            f'connection to server at "127.0.0.1", port 1 failed: password "{password}" rejected'
        )

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refuse)
    with pytest.raises(ConfigError) as err:
        async with open_checkpointer(f"postgresql://app:{password}@127.0.0.1:1/runs"):
            pass
    said = str(err.value)
    assert "postgresql://app:***@127.0.0.1:1/runs" in said
    assert 'server at "127.0.0.1", port 1 failed: password "***" rejected' in said


# ----------------------------------------------------------------------------- SQLite files


@pytest.mark.timeout(20)  # before the fix a FIFO blocked the header's read for good
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_path_that_is_no_regular_file_is_refused(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "runs.sqlite"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target = Path(os.devnull)
    with pytest.raises(ConfigError, match=r"is not a regular file: give a SQLite file's path"):
        check_db(str(target))


def test_a_name_longer_than_the_file_system_takes_is_a_config_error(tmp_path: Path) -> None:
    target = tmp_path / ("x" * 300 + ".sqlite")
    with pytest.raises(ConfigError, match=r"cannot use this path \(File name too long\): choose another path"):
        check_db(str(target))


def _unprivileged() -> list[str]:
    """The command prefix that runs a process as a user file permissions apply to (they do not to root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, which writes read-only files, and no setpriv to drop to user 65534")
    prefix = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import langgraph_parallelmuse"], cwd=ROOT, capture_output=True
    )
    if probe.returncode != 0:  # a checkout in a private folder (mktemp -d): the test below covers the logic
        pytest.skip("user 65534 cannot run this checkout's Python (a folder above it is private)")
    return prefix


@pytest.fixture
def read_only_stores():
    """A store in a folder that cannot be written, and a read-only store in one that can.

    Not under ``tmp_path``: its parents are closed to other users, and the check runs as one.
    """
    base = Path(tempfile.mkdtemp(prefix="ro-stores-"))
    stores = [base / "ro-folder" / "runs.sqlite", base / "rw-folder" / "ro.sqlite", base / "ok-folder" / "ok.sqlite"]
    for store in stores:
        store.parent.mkdir()
        sqlite3.connect(store).close()
    # SQLite writes beside a link's target: a link to the first store is as unwritable, one to the third is fine.
    stores[1].with_name("link.sqlite").symlink_to(stores[0])
    stores[0].with_name("link.sqlite").symlink_to(stores[2])
    stores[2].chmod(0o666)
    stores[2].parent.chmod(0o777)
    stores[0].chmod(0o666)
    stores[0].parent.chmod(0o555)
    stores[1].chmod(0o444)
    stores[1].parent.chmod(0o777)
    base.chmod(0o755)
    yield stores
    stores[0].parent.chmod(0o755)
    shutil.rmtree(base)


def test_a_store_this_user_cannot_write_is_refused_before_anything_loads(read_only_stores) -> None:
    # Before the fix both passed, and the run crashed with "attempt to write a readonly database"
    # after the model had loaded (WAL needs -wal and -shm files beside the database).
    script = (
        "import sys\nfrom langgraph_parallelmuse.persistence import check_db\nfor path in sys.argv[1:]:\n"
        "    try:\n        print(check_db(path))\n    except Exception as exc:\n        print(exc)\n"
    )
    unwritable, read_only, _ = read_only_stores
    links = [read_only.with_name("link.sqlite"), unwritable.with_name("link.sqlite")]
    argv = [*_unprivileged(), sys.executable, "-c", script, unwritable, read_only, *links]
    env = {**os.environ, "HOME": str(unwritable.parents[1])}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=True).stdout
    lines = out.strip().splitlines()
    assert len(lines) == 4, out
    assert lines[0].startswith(f"--db '{unwritable}': the folder {unwritable.parent} is not writable")
    assert lines[1].startswith(f"--db '{read_only}': this user cannot read and write it: make it writable")
    assert lines[2].startswith(f"--db '{links[0]}': the folder {unwritable.parent} is not writable"), out
    assert lines[3] == "sqlite", out  # in an unwritable folder, but the store it names can be written


def test_what_this_user_may_not_write_is_refused_at_the_store_a_link_names(tmp_path: Path, monkeypatch) -> None:
    """The check as another user sees it, whoever runs the tests (root may write anything): the
    permissions are what ``os.access`` answers, and a link is judged by its target, beside which
    SQLite writes the -wal and -shm files."""
    folders = {name: tmp_path.resolve() / name for name in ("ro-folder", "rw-folder", "ok-folder")}
    for folder in folders.values():
        folder.mkdir()
    stores = [
        folders["ro-folder"] / "runs.sqlite",
        folders["rw-folder"] / "ro.sqlite",
        folders["ok-folder"] / "ok.sqlite",
    ]
    for store in stores:
        sqlite3.connect(store).close()
    to_unwritable, to_writable = folders["rw-folder"] / "link.sqlite", folders["ro-folder"] / "link.sqlite"
    to_unwritable.symlink_to(stores[0])
    to_writable.symlink_to(stores[2])
    denied = {folders["ro-folder"], stores[1]}
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode, **kw: not (mode & os.W_OK and Path(path) in denied) and real(path, mode, **kw)
    )
    with pytest.raises(ConfigError, match=rf"the folder {re.escape(str(folders['ro-folder']))} is not writable"):
        check_db(str(stores[0]))
    with pytest.raises(ConfigError, match=r"this user cannot read and write it: make it writable"):
        check_db(str(stores[1]))
    with pytest.raises(ConfigError, match=rf"the folder {re.escape(str(folders['ro-folder']))} is not writable"):
        check_db(str(to_unwritable))  # in a writable folder, but the store it names is not
    assert check_db(str(to_writable)) == "sqlite"  # in an unwritable folder, but the store it names can be written


async def test_a_store_sqlite_cannot_open_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    sqlite3.connect(db).close()
    (tmp_path / "runs.sqlite-wal").mkdir()  # fails for root too, as a read-only store fails for others
    with pytest.raises(ConfigError, match=rf"--db '{re.escape(str(db))}': cannot open it as a SQLite store \("):
        async with open_checkpointer(str(db)) as saver:
            await saver.aget_tuple({"configurable": {"thread_id": "t"}})


@pytest.fixture
def no_loading(monkeypatch):
    """``cli.main`` with a model and tools that fail the test if they load."""

    def loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model or the tools loaded before --db was checked")

    monkeypatch.setattr(cli, "_model", loaded)
    monkeypatch.setattr(cli, "_tools", loaded)


def test_resuming_from_a_sqlite_file_that_does_not_exist_creates_none(no_loading, tmp_path: Path, capsys) -> None:
    typo = tmp_path / "rusn.sqlite"
    assert cli.main(["ask", "Which city?", "--db", str(typo), "--run-id", "run1", "--resume"]) == 1
    assert "no such SQLite file; give the file the runs were checkpointed in" in " ".join(
        capsys.readouterr().err.split()
    )
    assert not typo.exists()


def _tables_and_journal(path: Path) -> tuple[list[str], str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return tables, conn.execute("PRAGMA journal_mode").fetchone()[0]


def _corpus_index(tmp_path: Path) -> Path:
    """Another program's SQLite file: a table of its own, the default rollback journal."""
    index = tmp_path / "corpus-index.sqlite"
    with contextlib.closing(sqlite3.connect(index)) as conn:
        conn.execute("CREATE TABLE docs (title TEXT, text TEXT)")
        conn.commit()
    return index


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["delete-thread", "run1"], "give the file the runs were checkpointed in"),
        (["ask", "Which city?", "--run-id", "run1", "--resume"], "give the file the runs were checkpointed in"),
        # A new run: before, its saver added its tables to the file and switched it to WAL.
        (["ask", "Which city?", "--run-id", "run1"], "give a new file name to start a store, or the file"),
        (["ask", "Which city?"], "give a new file name to start a store, or the file"),
    ],
    ids=["delete", "resume", "new-run", "new-run-without-id"],
)
def test_another_programs_sqlite_file_is_refused_unchanged(
    argv, fix, no_loading, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(cli.console, "_width", 10_000)  # rich breaks a long path at the console's width
    index = _corpus_index(tmp_path)
    before = _tables_and_journal(index)
    assert cli.main([*argv, "--db", str(index)]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert f"--db '{index}' holds no checkpoints but other tables (docs): it is another program's database" in said
    assert fix in said, said
    # Before the fix the saver's tables were added and the file switched to WAL.
    assert _tables_and_journal(index) == before == (["docs"], "delete")


async def test_open_checkpointer_refuses_another_programs_file_and_sets_up_an_empty_one(tmp_path: Path) -> None:
    index = _corpus_index(tmp_path)
    with pytest.raises(ConfigError, match=r"holds no checkpoints but other tables \(docs\)"):
        async with open_checkpointer(str(index)):
            pass
    assert _tables_and_journal(index) == (["docs"], "delete")
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()  # a file with no table yet (an earlier store's, before its set-up)
    with pytest.raises(ConfigError, match=r"holds no checkpoints: give the file the runs were checkpointed in"):
        check_db(str(empty), existing=True)
    assert check_db(str(empty)) == "sqlite"
    async with open_checkpointer(str(empty)):
        pass
    assert check_db(str(empty), existing=True) == "sqlite"


async def test_a_file_a_langgraph_store_set_up_takes_the_checkpoints_beside_it(tmp_path: Path) -> None:
    """SqliteStore's tables are LangGraph's, not another program's: the checkpointer's usual companion."""
    from langgraph.store.sqlite import SqliteStore

    app = tmp_path / "app.sqlite"
    with contextlib.closing(sqlite3.connect(app, check_same_thread=False, isolation_level=None)) as conn:
        SqliteStore(conn).setup()
    with pytest.raises(ConfigError, match=r"holds no checkpoints: give the file the runs were checkpointed in"):
        check_db(str(app), existing=True)
    async with open_checkpointer(str(app)):
        pass
    assert check_db(str(app), existing=True) == "sqlite"


async def test_a_store_the_saver_set_up_is_an_existing_one(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.sqlite")
    async with open_checkpointer(db):
        pass
    assert check_db(db, existing=True) == "sqlite"


async def test_an_open_cancelled_while_the_pool_waits_for_its_first_connection_leaves_no_task_running(
    monkeypatch,
) -> None:
    # The pool's scheduler and workers went on running on the loop: two tasks per cancelled open,
    # for the life of a long-lived loop (a server whose client went away while the pool connected).
    import asyncio

    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    calls = []

    class Plain:
        async def __aenter__(self) -> Plain:
            return self

        async def __aexit__(self, *exc: object) -> None:
            pass

    async def connect(*args: object, **kwargs: object) -> Plain:
        calls.append(args)
        if len(calls) == 1:  # the set-up's plain connection; the pool's own are refused, and it retries
            return Plain()
        raise psycopg.OperationalError("connection refused")

    async def setup(self: object) -> None:
        pass

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect)
    monkeypatch.setattr(AsyncPostgresSaver, "setup", setup)

    async def use() -> None:
        async with open_checkpointer("postgresql://app@127.0.0.1:5432/runs"):
            pass

    task = asyncio.create_task(use())
    for _ in range(500):  # until the pool has tried its first connection
        if len(calls) > 1:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) > 1
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


class _Tally(TypedDict):
    seen: Annotated[list[str], operator.add]


async def test_a_run_rolled_back_by_langgraph_server_leaves_the_thread_as_it_was_before_it(tmp_path: Path) -> None:
    """LangGraph Server undoes a run multitask_strategy="rollback" replaces with the saver's adelete_for_runs,
    which LangGraph's SQLite and Postgres savers lack: the second run's request failed and the server ran
    nothing more until restarted (langgraph dev --config langgraph.postgres.json)."""
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph import START, StateGraph

    builder = StateGraph(_Tally)
    builder.add_node("note", lambda state: {"seen": [f"call {len(state['seen'])}"]})
    builder.add_edge(START, "note")
    async with open_checkpointer(tmp_path / "runs.sqlite") as saver:
        assert type(saver).adelete_for_runs is not BaseCheckpointSaver.adelete_for_runs  # the server looks there
        graph = builder.compile(checkpointer=saver)
        for run in ("run-a", "run-b"):  # the server records each checkpoint's run in its metadata
            await graph.ainvoke({"seen": []}, {"configurable": {"thread_id": "t", "run_id": run}})
        history = [s async for s in graph.aget_state_history({"configurable": {"thread_id": "t"}})]
        await saver.adelete_for_runs(["run-b"])
        state = await graph.aget_state({"configurable": {"thread_id": "t"}})
        left = [s async for s in graph.aget_state_history({"configurable": {"thread_id": "t"}})]
    assert state.values == {"seen": ["call 0"]}
    assert {s.metadata.get("run_id") for s in left} == {"run-a"} and len(left) < len(history)
