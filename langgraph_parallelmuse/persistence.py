"""Where runs are kept: a SQLite file or a PostgreSQL database, checked before anything loads.

``parallelmuse ask --db TARGET`` and :func:`open_checkpointer` accept a SQLite path or a
``postgresql://`` URL; :func:`check_db` says in one line what is wrong with a target before the
model and the index are loaded.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from langgraph.checkpoint.base import BaseCheckpointSaver

from langgraph_parallelmuse.errors import ConfigError

__all__ = ["check_db", "open_checkpointer"]

_SQLITE_HEADER = b"SQLite format 3\x00"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def check_db(target: str) -> Literal["sqlite", "postgres"]:
    """Which kind of store ``target`` names, or a :class:`ConfigError` saying what to change.

    Example:
        >>> check_db("postgresql://user@127.0.0.1:5432/runs")
        'postgres'
        >>> check_db("/no/such/runs.sqlite")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: --db '/no/such/runs.sqlite': the folder /no/such does not exist: ...
    """
    if target.startswith(_POSTGRES_SCHEMES):
        try:
            import langgraph.checkpoint.postgres.aio  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"--db {target!r} needs the Postgres checkpointer: pip install 'langgraph-parallelmuse[persist]'"
            ) from None
        return "postgres"
    path = Path(target).expanduser()
    if path.is_dir():
        raise ConfigError(f"--db {target!r} is a directory: give a file in it, e.g. {path / 'runs.sqlite'}")
    if not path.parent.is_dir():
        raise ConfigError(f"--db {target!r}: the folder {path.parent} does not exist: create it or choose another path")
    if path.exists():
        with path.open("rb") as fh:
            header = fh.read(len(_SQLITE_HEADER))
        if header and header != _SQLITE_HEADER:
            raise ConfigError(
                f"--db {target!r} is not a SQLite database: choose a new file name or an earlier run's .sqlite file"
            )
    elif not os.access(path.parent, os.W_OK):
        raise ConfigError(f"--db {target!r}: the folder {path.parent} is not writable: choose another path")
    return "sqlite"


@asynccontextmanager
async def open_checkpointer(target: str) -> AsyncIterator[BaseCheckpointSaver]:
    """An async checkpointer on ``target`` (SQLite path or ``postgresql://`` URL), set up and closed.

    Example:
        >>> import asyncio, tempfile, os
        >>> async def kind(path):
        ...     async with open_checkpointer(path) as saver:
        ...         return type(saver).__name__
        >>> asyncio.run(kind(os.path.join(tempfile.mkdtemp(), "runs.sqlite")))
        'AsyncSqliteSaver'
    """
    if check_db(target) == "postgres":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(target) as saver:
            await saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(str(Path(target).expanduser())) as saver:
            yield saver
