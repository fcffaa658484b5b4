"""Where runs are kept: a SQLite file or a PostgreSQL database, checked before anything loads.

``parallelmuse ask --db TARGET`` and :func:`open_checkpointer` accept a SQLite path or a
``postgresql://`` URL; :func:`check_db` says in one line what is wrong with a target before the
model and the index are loaded. :func:`adelete_thread_with_trajectories` deletes a thread together
with the trajectory threads its runs made.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import sqlite3
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from langgraph.checkpoint.base import BaseCheckpointSaver

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.redact import redact, secrets_of

__all__ = ["adelete_runs", "adelete_thread_with_trajectories", "check_db", "open_checkpointer"]

_SQLITE_HEADER = b"SQLite format 3\x00"
_POSTGRES_SCHEMES = ("postgresql", "postgres")  # the two libpq accepts, lower case only
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_PERSIST = "pip install 'langgraph-parallelmuse[persist]'"
_EXAMPLE_URL = "postgresql://USER[:PASSWORD]@HOST:5432/DBNAME"
# libpq's key=value connection strings ("host=db dbname=runs user=app"): a keyword a connection string
# has, then "=", at the start or after a space.
_CONNINFO = re.compile(r"(?:^|.*\s)(?:host|hostaddr|dbname|user|password|port|service|sslmode)\s*=", re.IGNORECASE)


def check_db(target: str | os.PathLike[str], *, existing: bool = False) -> Literal["sqlite", "postgres"]:
    """Which kind of store ``target`` names, or a :class:`ConfigError` saying what to change.

    Nothing is written or connected to: a PostgreSQL URL is parsed (scheme, port, query
    parameters), the server is reached only by :func:`open_checkpointer`; a SQLite file is at most read.

    Args:
        target: A SQLite file's path (a ``str`` or a ``pathlib.Path``) or a ``postgresql://`` URL.
        existing: The store must already hold checkpoints (to resume a run or delete a thread): a
            SQLite file must exist and have the saver's tables. Whatever it is, an existing SQLite file
            that holds tables but not the saver's is refused: it is another program's database, which
            the saver's set-up would change (its tables added, the file switched to WAL). A PostgreSQL
            database is not looked into: one holding other tables is the usual case there, and the
            saver only adds its own tables to it.

    Example:
        >>> check_db("postgresql://user@127.0.0.1:5432/runs")
        'postgres'
        >>> check_db("postgresql://user@127.0.0.1:99999/runs")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: --db 'postgresql://user@127.0.0.1:99999/runs': port '99999' ...
        >>> check_db("/no/such/runs.sqlite")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: --db '/no/such/runs.sqlite': the folder /no/such does not exist: ...
    """
    target = os.fspath(target)  # a pathlib.Path was a TypeError from the URL pattern
    if (url := _URL.match(target)) is not None:
        _check_postgres_url(target, url[1].lower())
        return "postgres"
    # A libpq "host=... dbname=..." string would otherwise name a SQLite file, password and all (a
    # socket folder, host=/var/run/postgresql, holds a "/"; a path such as ./user=1.db does not match).
    if _CONNINFO.match(target):  # not shown: its password may be of any length
        raise ConfigError(f"--db is a libpq key=value string: give the database as a URL, {_EXAMPLE_URL}")
    shown = redact(target)  # a path is no secret, but one mistyped from a URL may hold one
    try:
        import langgraph.checkpoint.sqlite.aio  # noqa: F401
    except ImportError:
        raise ConfigError(f"--db {shown!r} needs the SQLite checkpointer: {_PERSIST}") from None
    try:
        # SQLite writes beside the link's target (its -wal and -shm files too), not beside the link.
        _check_sqlite_file(Path(target).expanduser().resolve(), shown, existing=existing)
    except OSError as exc:  # e.g. a name longer than the file system takes
        raise ConfigError(
            f"--db {shown!r}: cannot use this path ({exc.strerror or exc}): choose another path"
        ) from None
    return "sqlite"


#: The tables langgraph's ``SqliteStore`` keeps (its vector index's included).
_LANGGRAPH_STORE_TABLES = frozenset({"store", "store_migrations", "store_vectors", "vector_migrations"})


def _check_sqlite_file(path: Path, shown: str, *, existing: bool) -> None:
    """Refuse a path the SQLite saver could not create, read and write, another program's SQLite file, or
    (``existing``) a file that holds no checkpoints."""
    if path.is_dir():
        raise ConfigError(f"--db {shown!r} is a directory: give a file in it, e.g. {redact(str(path / 'runs.sqlite'))}")
    if not path.parent.is_dir():
        raise ConfigError(
            f"--db {shown!r}: the folder {redact(str(path.parent))} does not exist: create it or choose another path"
        )
    if not path.exists():
        if existing:  # opening it would create an empty store, and say only that the run is not there
            raise ConfigError(f"--db {shown!r}: no such SQLite file; give the file the runs were checkpointed in")
        if not os.access(path.parent, os.W_OK):
            raise ConfigError(
                f"--db {shown!r}: the folder {redact(str(path.parent))} is not writable: choose another path"
            )
        return
    if not path.is_file():  # a FIFO would block the header's read, a device takes any write
        raise ConfigError(f"--db {shown!r} is not a regular file: give a SQLite file's path")
    with path.open("rb") as fh:
        header = fh.read(len(_SQLITE_HEADER))
    if header and header != _SQLITE_HEADER:
        raise ConfigError(
            f"--db {shown!r} is not a SQLite database: choose a new file name or an earlier run's .sqlite file"
        )
    if not os.access(path, os.R_OK | os.W_OK):
        raise ConfigError(
            f"--db {shown!r}: this user cannot read and write it: make it writable or choose another path"
        )
    if not os.access(path.parent, os.W_OK):  # the saver's WAL mode creates -wal and -shm files beside it
        raise ConfigError(
            f"--db {shown!r}: the folder {redact(str(path.parent))} is not writable, and SQLite keeps -wal and -shm "
            "files beside the database: make the folder writable or choose another path"
        )
    tables = _tables_of(path, shown)
    if "checkpoints" in tables:
        return
    earlier = "the file the runs were checkpointed in"
    # A LangGraph store's tables (SqliteStore, the checkpointer's usual companion) may share the file.
    foreign = [t for t in tables if t not in _LANGGRAPH_STORE_TABLES]
    if foreign:  # for a new run too: the saver's set-up would add its tables and switch the file to WAL
        names = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        fix = f"give {earlier}" if existing else f"give a new file name to start a store, or {earlier}"
        raise ConfigError(
            f"--db {shown!r} holds no checkpoints but other tables ({names}): it is another program's database "
            f"(a corpus index?), left unchanged: {fix}"
        )
    if existing:  # an empty file: opening it would make an empty store, and say only that the run is not there
        raise ConfigError(f"--db {shown!r} holds no checkpoints: give {earlier}")


def _tables_of(path: Path, shown: str) -> list[str]:
    """The tables of the SQLite file (not SQLite's own ``sqlite_*``), read without changing the file.

    Opened read-only: the saver's ``setup()`` would add its tables and switch the file to WAL.
    """
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            found = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' ESCAPE '!' "
                "ORDER BY name"
            )
            return [row[0] for row in found.fetchall()]
    except sqlite3.Error as exc:  # e.g. a -wal beside it that is no file: what the saver would meet opening it
        raise _unopenable(shown, exc) from None


def _unopenable(shown: str, exc: sqlite3.Error) -> ConfigError:
    """The error for a SQLite file SQLite cannot open: when it is checked, and when the saver opens it."""
    return ConfigError(
        f"--db {shown!r}: cannot open it as a SQLite store ({redact(str(exc))}): check that this user may write the "
        "file and its folder (SQLite keeps -wal and -shm files beside it) and that no other program locks it, or "
        "choose another path"
    )


def _check_postgres_url(target: str, scheme: str) -> None:
    """Refuse a ``SCHEME://`` target that libpq would not take, without connecting."""
    shown = repr(_redacted(target, target))
    if scheme in _POSTGRES_SCHEMES and _raw_in_user_info(target):
        # libpq ends the user info at the first "@" or "/": the rest of the password became the host or
        # the port, and no message could show the URL without it.
        raise ConfigError(
            f"--db {scheme}://***: the user or password holds a raw '@' or '/': percent-encode them "
            f"('@' as %40, '/' as %2F), as in {_EXAMPLE_URL}"
        )
    if scheme not in _POSTGRES_SCHEMES:
        base = scheme.partition("+")[0]
        if base in _POSTGRES_SCHEMES:  # SQLAlchemy's dialect+driver form
            raise ConfigError(
                f"--db {shown}: {scheme}:// is SQLAlchemy's form: drop {scheme[len(base) :]!r} and write {base}://..."
            )
        if base == "sqlite":
            raise ConfigError(f"--db {shown}: give the SQLite file's path itself, without {scheme}://")
        raise ConfigError(
            f"--db {shown}: {scheme}:// is not a store this takes: give a SQLite file path or a URL like {_EXAMPLE_URL}"
        )
    try:
        import langgraph.checkpoint.postgres.aio  # noqa: F401
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise ConfigError(f"--db {shown} needs the Postgres checkpointer: {_PERSIST}") from None
    try:
        params = conninfo_to_dict(_postgres_url(target))
    except ProgrammingError as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(
            f"--db {shown} is not a valid PostgreSQL URL ({_redacted(reason, target)}): write {_EXAMPLE_URL}"
        ) from None
    for port in str(params.get("port") or "").split(","):
        port = port.strip()
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError(
                f"--db {shown}: port {port!r} is not a TCP port: use a number from 1 to 65535 "
                "(PostgreSQL's default is 5432)"
            )


def _redacted(text: str, target: str) -> str:
    """``text`` without the known secrets and the password of the URL ``target``, however short it is."""
    return redact(text, secrets_of(), passwords=_password_of(target))


def _password_of(target: str) -> list[str]:
    """The password of a URL's user info, as written (the redaction patterns stop at a space in it).

    Example:
        >>> _password_of("postgresql://app:Sec ret99@db/runs"), _password_of("postgresql://db/runs")
        (['Sec ret99'], [])
    """
    user_info, at, _host = target.partition("://")[2].partition("/")[0].rpartition("@")
    password = user_info.partition(":")[2] if at else ""
    return [password] if password else []


def _raw_in_user_info(target: str) -> bool:
    """Whether a PostgreSQL URL's user info holds a raw "@" or "/" (a database name may hold "@").

    Example:
        >>> _raw_in_user_info("postgresql://app:p@ss@db/runs"), _raw_in_user_info("postgresql://app:pa/ss@db/runs")
        (True, True)
        >>> _raw_in_user_info("postgresql://app:12/34@db/runs")
        True
        >>> _raw_in_user_info("postgresql://app:pw@db/team@runs"), _raw_in_user_info("postgresql://db/team@runs")
        (False, False)
        >>> _raw_in_user_info("postgresql://app:pw@db?application_name=me@laptop")
        False
    """
    rest = target.partition("://")[2]
    authority, _, path = rest.partition("/")
    if authority.count("@") > 1:
        # libpq's user info ends at the first "@": another one in the host is a raw one, but one in a
        # query's value (no database: db?application_name=me@laptop) is the query's.
        host, _, query = authority.partition("@")[2].partition("?")
        return "@" in host or "=" not in query.partition("@")[0]
    after_slash = path.split("?", 1)[0]
    if "@" in authority or "@" not in after_slash:
        return False
    # "app:pa/ss@db": no "@" before the first "/", and either a port that is no number or, as in
    # "app:12/34@db/runs" (libpq: host app, port 12), a "/" after the "@", which a database name has not.
    port = authority.rpartition(":")[2] if ":" in authority and not authority.endswith("]") else ""
    return (bool(port) and not port.isdigit()) or "/" in after_slash.partition("@")[2]


def _postgres_url(target: str) -> str:
    """``target`` with its scheme in lower case (libpq does not take ``POSTGRESQL://``)."""
    scheme, sep, rest = target.partition("://")
    return f"{scheme.lower()}{sep}{rest}"


@asynccontextmanager
async def open_checkpointer(target: str | os.PathLike[str]) -> AsyncIterator[BaseCheckpointSaver]:
    """An async checkpointer on ``target`` (SQLite path, a str or a Path, or ``postgresql://`` URL), set up and closed.

    Example:
        >>> import asyncio, tempfile, os
        >>> async def kind(path):
        ...     async with open_checkpointer(path) as saver:
        ...         return type(saver).__name__
        >>> asyncio.run(kind(os.path.join(tempfile.mkdtemp(), "runs.sqlite")))
        'AsyncSqliteSaver'
    """
    target = os.fspath(target)
    opened = _postgres_saver(target) if check_db(target) == "postgres" else _sqlite_saver(target)
    async with opened as saver:
        yield saver


@asynccontextmanager
async def _sqlite_saver(target: str) -> AsyncIterator[BaseCheckpointSaver]:
    """A SQLite saver with its tables set up, or a :class:`ConfigError` naming the file it cannot write."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with contextlib.AsyncExitStack() as stack:
        try:  # only the opening and the set-up: errors of the run itself pass unchanged
            opening = _with_run_deletes(AsyncSqliteSaver).from_conn_string(str(Path(target).expanduser()))
            saver = await stack.enter_async_context(opening)
            # Now, not at the first read (after the model loaded), so a store it cannot write fails here.
            await saver.setup()
        except sqlite3.Error as exc:
            raise _unopenable(redact(target), exc) from exc
        yield saver


# Connections the saver may hold: it runs one statement at a time (its own lock), so a few cover
# a reconnect while another connection is busy.
_POOL_SIZE = 4


@asynccontextmanager
async def _postgres_saver(target: str) -> AsyncIterator[BaseCheckpointSaver]:
    """A Postgres saver on a connection pool that checks a connection before lending it.

    ``AsyncPostgresSaver.from_conn_string`` holds one connection for the saver's life: once the
    server restarts or drops it, every later call fails. A pool replaces a dropped connection.
    """
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg import AsyncConnection, Error, OperationalError
    from psycopg.errors import UniqueViolation
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool, PoolTimeout

    url = _postgres_url(target)
    connection = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    try:  # only the connection and the table set-up: errors of the run itself pass unchanged
        # One plain connection first: a refused connection or login fails here with libpq's reason.
        async with await AsyncConnection.connect(url, **connection) as conn:
            try:
                await AsyncPostgresSaver(conn).setup()
            except UniqueViolation:  # another process set the tables up at the same moment
                await AsyncPostgresSaver(conn).setup()
        pool = AsyncConnectionPool(
            url,
            kwargs=connection,
            min_size=1,
            max_size=_POOL_SIZE,
            open=False,
            check=AsyncConnectionPool.check_connection,
        )
        try:
            await pool.open(wait=True, timeout=30)
        except BaseException:
            # Cancelled while it waited for its first connection (a PoolTimeout closes it itself), the
            # pool's scheduler and workers went on running on this loop for its whole life.
            await pool.close()
            raise
    except (Error, PoolTimeout) as exc:
        reason = " ".join(str(exc).split())
        opened = isinstance(exc, OperationalError | PoolTimeout)
        what = "cannot open the PostgreSQL database" if opened else "cannot set up the checkpoint tables"
        raise ConfigError(
            f"--db {_redacted(target, target)!r}: {what} ({_redacted(reason, target)}): check that the server runs, "
            "that the URL's host, port, user, password and database name are right, and that the user may create "
            "tables there"
        ) from exc
    try:
        yield _with_run_deletes(AsyncPostgresSaver)(pool)
    finally:
        await pool.close()


@functools.cache
def _with_run_deletes(saver_type: type[BaseCheckpointSaver]) -> type[BaseCheckpointSaver]:
    """``saver_type`` with ``adelete_for_runs`` (:func:`adelete_runs`), under the same ``__name__``.

    LangGraph Server calls it to undo a run that ``multitask_strategy="rollback"`` replaces, and
    LangGraph's SQLite and Postgres savers lack it: the second run's request failed and the server
    ran nothing more until restarted (``langgraph dev --config langgraph.postgres.json``). The server
    looks for the method on the saver's type, so it is a subclass's, not an instance's.
    """

    async def adelete_for_runs(self: BaseCheckpointSaver, run_ids: Sequence[str]) -> None:
        await adelete_runs(self, run_ids)

    # The class's name is the saver's (type(saver).__name__ is what users and this module read); its
    # qualified name says what it is.
    members = {"adelete_for_runs": adelete_for_runs, "__module__": __name__}
    return type(saver_type.__name__, (saver_type,), {**members, "__qualname__": f"{saver_type.__name__}WithRunDeletes"})


async def adelete_runs(saver: BaseCheckpointSaver, run_ids: Sequence[str]) -> None:
    """Delete the checkpoints (and their pending writes) that the runs ``run_ids`` made, on every thread.

    LangGraph Server records each checkpoint's run in its metadata (``run_id``), the trajectory
    threads' too, which carry the caller's configurable keys. A rolled-back run's checkpoints are the
    newest of their threads, so what stays is a thread's history as it was before that run (the
    Postgres saver's channel values, shared between checkpoints, are left until the thread is
    deleted). Works on LangGraph's ``AsyncSqliteSaver`` and ``AsyncPostgresSaver``.

    Raises:
        ConfigError: The saver is of another kind.

    Example:
        >>> import asyncio, os, tempfile
        >>> async def rolled_back(path):
        ...     async with open_checkpointer(path) as saver:
        ...         await adelete_runs(saver, ["run-1"])
        >>> asyncio.run(rolled_back(os.path.join(tempfile.mkdtemp(), "runs.sqlite")))
    """
    ids = [str(run) for run in run_ids]
    saver = unwrapped(saver)
    kinds = {c.__name__ for c in type(saver).__mro__}
    if "AsyncSqliteSaver" in kinds and ids:
        run, marks = "json_extract(CAST(metadata AS TEXT), '$.run_id')", ",".join("?" * len(ids))
        made = f"SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints WHERE {run} IN ({marks})"
        await saver.setup()
        async with saver.lock:
            await saver.conn.execute(
                f"DELETE FROM writes WHERE (thread_id, checkpoint_ns, checkpoint_id) IN ({made})", ids
            )
            await saver.conn.execute(f"DELETE FROM checkpoints WHERE {run} IN ({marks})", ids)
            await saver.conn.commit()
    elif "AsyncPostgresSaver" in kinds and ids:
        # One transaction (the pool's connections autocommit): no checkpoint left without its writes.
        async with saver._cursor() as cursor, cursor.connection.transaction():
            await cursor.execute(
                "DELETE FROM checkpoint_writes w USING checkpoints c WHERE c.metadata->>'run_id' = ANY(%s) AND "
                "w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id",
                (ids,),
            )
            await cursor.execute("DELETE FROM checkpoints WHERE metadata->>'run_id' = ANY(%s)", (ids,))
    elif not {"AsyncSqliteSaver", "AsyncPostgresSaver"} & kinds:
        raise ConfigError(
            f"cannot delete the checkpoints of runs from a {type(saver).__name__}: this works on LangGraph's "
            "AsyncSqliteSaver and AsyncPostgresSaver (open_checkpointer's)"
        )


async def adelete_thread_with_trajectories(saver: BaseCheckpointSaver, thread_id: str) -> list[str]:
    """Delete a thread and the trajectory threads ParallelMuse runs on it made; return the threads deleted.

    A run on thread ``T`` keeps each trajectory in a thread of its own, ``T:<run>/<trajectory>``
    (``<run>``: 10 hex digits; separate threads, because re-running a subgraph node from a checkpoint restarts it:
    langgraph#8458), so a saver's ``adelete_thread(T)`` (what Studio's delete calls) leaves them.
    This finds them by that prefix, which no saver API lists: in the saver's own tables for
    LangGraph's ``AsyncSqliteSaver`` and ``AsyncPostgresSaver``, in its storage for
    ``InMemorySaver`` (also inside langgraph-api's adapter), and LangGraph's sync ``SqliteSaver`` when
    :func:`in_threads` can lend it. Only ``saver`` is searched: a graph
    built with a separate ``trajectory_checkpointer=`` keeps them there (call this on that one too).

    Returns:
        The threads that held checkpoints and were deleted (the thread itself first, if it had any);
        empty when there was nothing of ``thread_id``.

    Raises:
        ConfigError: ``thread_id`` is empty, or the saver is of another kind (the sync Postgres saver, a
            SqliteSaver whose connection only its own thread may use).

    Example:
        >>> import asyncio
        >>> from langgraph.checkpoint.memory import InMemorySaver
        >>> asyncio.run(adelete_thread_with_trajectories(InMemorySaver(), "chat-1"))
        []
    """
    if not isinstance(thread_id, str) or not thread_id:
        raise ConfigError(f"thread_id={thread_id!r}: give the id of the thread to delete")
    # ``<thread>:<10 hex digits of the run's key>/<trajectory>`` (ParallelMuseNodes.prepare), with
    # ``~<10 more>`` for a fork whose question or settings were edited (ParallelMuseNodes.run_id): not a
    # thread of the user's own that only starts with "<thread>:".
    made = re.compile(re.escape(thread_id) + r":[0-9a-f]{10}(?:~[0-9a-f]{10})?/")
    threads = sorted(t for t in await _threads_under(saver, f"{thread_id}:") if made.match(t))
    # A sync SqliteSaver's trajectory threads are there too (RolloutRunner), reached through its lender.
    lent = async_saver(inner) if in_threads(inner := unwrapped(saver)) else saver
    if await lent.aget_tuple({"configurable": {"thread_id": thread_id}}) is not None:
        threads.insert(0, thread_id)
    for thread in threads:
        await lent.adelete_thread(thread)
    return threads


def unwrapped(saver: BaseCheckpointSaver) -> BaseCheckpointSaver:
    """The saver that holds the checkpoints: langgraph-api wraps a checkpointer of the app's own
    (langgraph.json "checkpointer") in an adapter that passes every call on to it.

    Example:
        >>> from langgraph.checkpoint.memory import InMemorySaver
        >>> saver = InMemorySaver()
        >>> unwrapped(saver) is saver
        True
    """
    inner = vars(saver).get("_inner")
    if type(saver).__module__.startswith("langgraph_api.") and isinstance(inner, BaseCheckpointSaver):
        return unwrapped(inner)
    return saver


async def _threads_under(saver: BaseCheckpointSaver, prefix: str) -> set[str]:
    """The saver's thread ids that start with ``prefix``."""
    saver = unwrapped(saver)
    kinds = {c.__name__ for c in type(saver).__mro__}
    # LIKE with the prefix's own wildcards escaped: a thread id may hold "_" or "%". Not with a
    # backslash, which PostgreSQL reads as a string escape under standard_conforming_strings=off.
    pattern = re.sub(r"([!%_])", r"!\1", prefix) + "%"
    query = "SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id LIKE {} ESCAPE '!'"
    if "InMemorySaver" in kinds:
        return {t for t in saver.storage if t.startswith(prefix)}
    if "AsyncSqliteSaver" in kinds:
        await saver.setup()
        async with saver.lock, saver.conn.execute(query.format("?"), (pattern,)) as cursor:
            return {row[0] for row in await cursor.fetchall()}
    if "SqliteSaver" in kinds and in_threads(saver):

        def listed() -> set[str]:
            with saver.cursor(transaction=False) as cursor:
                return {row[0] for row in cursor.execute(query.format("?"), (pattern,)).fetchall()}

        return await asyncio.to_thread(listed)
    if "AsyncPostgresSaver" in kinds:
        async with saver._cursor() as cursor:
            await cursor.execute(query.format("%s"), (pattern,))
            return {row["thread_id"] for row in await cursor.fetchall()}
    raise ConfigError(
        f"cannot list the trajectory threads of a {type(saver).__name__}: this works on LangGraph's "
        "InMemorySaver, AsyncSqliteSaver, AsyncPostgresSaver and a SqliteSaver whose connection other threads may "
        f"use (check_same_thread=False), not the sync Postgres saver (or delete the threads named '{prefix}...' "
        "yourself)"
    )


# LangGraph's sync SQLite saver takes any thread id too, but has none of the async methods the rollout
# subgraph calls: it is lent through _InThreads, or a sync app's run would keep its checkpoints there
# and its trajectories in memory, and after a restart could not fork its branches from them.
_LENDABLE_SYNC = frozenset({("langgraph.checkpoint.sqlite", "SqliteSaver")})
_THREADS_SHARE: weakref.WeakKeyDictionary[BaseCheckpointSaver, bool] = weakref.WeakKeyDictionary()


class _InThreads(BaseCheckpointSaver):
    """A sync-only saver through the async methods as well, each call run in a worker thread."""

    PAGE = 16

    def __init__(self, saver: BaseCheckpointSaver) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver

    def get_tuple(self, config: dict) -> Any:
        return self.saver.get_tuple(config)

    def list(self, config: dict | None, **options: Any) -> Iterator[Any]:
        return self.saver.list(config, **options)

    def put(self, *args: Any) -> dict:
        return self.saver.put(*args)

    # task_path declared: LangGraph passes it only to a put_writes whose signature names it, and without
    # it pending writes were stored unordered (replayed by task id, not by the task's path).
    def put_writes(self, config: dict, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        self.saver.put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.saver.get_next_version(current, channel)

    def with_allowlist(self, extra_allowlist: Any) -> BaseCheckpointSaver:
        inner = self.saver.with_allowlist(extra_allowlist)
        return self if inner is self.saver else _InThreads(inner)

    async def aget_tuple(self, config: dict) -> Any:
        return await asyncio.to_thread(self.saver.get_tuple, config)

    async def aput(self, *args: Any) -> dict:
        return await asyncio.to_thread(self.saver.put, *args)

    async def aput_writes(
        self, config: dict, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await asyncio.to_thread(self.saver.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.saver.delete_thread, thread_id)

    async def alist(
        self, config: dict | None, *, filter: dict | None = None, before: dict | None = None, limit: int | None = None
    ) -> AsyncIterator[Any]:
        # A page at a time, each read whole in one thread: SqliteSaver holds its lock while a list()
        # is open, and a reader that stops early (the walk for fork points) would leave it held; one
        # read of the whole thread would cost the walk what it saves.
        while limit is None or limit > 0:
            size = self.PAGE if limit is None else min(self.PAGE, limit)
            page = await asyncio.to_thread(self._page, config, filter, before, size)
            for item in page:
                yield item
            if len(page) < size:
                return
            before, limit = page[-1].config, None if limit is None else limit - size

    def _page(self, config: dict | None, filter: dict | None, before: dict | None, size: int) -> list[Any]:
        return [*self.saver.list(config, filter=filter, before=before, limit=size)]


def in_threads(saver: BaseCheckpointSaver) -> bool:
    """Whether ``saver`` is a sync-only one that :class:`_InThreads` can lend: its sqlite3 connection
    may be used from a worker thread (opened with ``check_same_thread=False``, as
    ``SqliteSaver.from_conn_string`` opens it); else it stays the app's alone, as before.

    Example:
        >>> from langgraph.checkpoint.memory import InMemorySaver
        >>> in_threads(InMemorySaver())
        False
    """
    if not any((c.__module__, c.__qualname__) in _LENDABLE_SYNC for c in type(saver).__mro__):
        return False
    if saver not in _THREADS_SHARE:

        def probe() -> bool:
            try:
                saver.conn.cursor().close()  # sqlite3 checks the calling thread here (not on every attribute)
            except sqlite3.ProgrammingError:
                return False
            return True

        with ThreadPoolExecutor(1) as pool:
            _THREADS_SHARE[saver] = pool.submit(probe).result()
    return _THREADS_SHARE[saver]


def async_saver(saver: BaseCheckpointSaver) -> BaseCheckpointSaver:
    """``saver`` as the rollout subgraph can use it: a sync SQLite saver through :class:`_InThreads`.

    Example:
        >>> from langgraph.checkpoint.memory import InMemorySaver
        >>> saver = InMemorySaver()
        >>> async_saver(saver) is saver
        True
    """
    return _InThreads(saver) if in_threads(saver) else saver
