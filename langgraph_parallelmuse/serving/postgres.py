"""PostgreSQL for LangGraph checkpoints: Debian's ``postgresql-15`` in a scratch cluster on loopback.

PostgreSQL refuses to run as root; as root (CI) ``initdb`` and ``postgres`` run as the
``postgres`` user, on a data directory that user owns.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.serving.process import HOST, Server, ServerError, ServerSpec, free_port, serve_one


def postgres_spec(data_dir: str | Path, *, bin_dir: str | Path | None = None) -> ServerSpec:
    """PostgreSQL on a free loopback port over ``data_dir``, initialised there first if empty.

    TCP only (no Unix socket), trust authentication for the ``postgres`` superuser, fsync off (a
    test database). Run as root (CI), ``initdb`` and ``postgres`` run as the ``postgres`` user and
    ``data_dir`` is handed to it.

    Args:
        data_dir: The cluster directory: a new or empty one is initialised, an earlier one reused.
        bin_dir: Where ``initdb`` and ``postgres`` are (default: on PATH, else the newest
            ``/usr/lib/postgresql/*/bin``).

    Raises:
        ConfigError: No PostgreSQL server binaries were found.
        ServerError: ``initdb`` failed or ran past its 120 s (its output is in the message).

    Example:
        >>> from langgraph_parallelmuse.serving import serve
        >>> with serve([postgres_spec("/tmp/parallelmuse-db")]) as (db,):  # doctest: +SKIP
        ...     db.url
        'postgresql://postgres@127.0.0.1:40123/postgres'
    """
    binaries = _postgres_bin(bin_dir)
    data = Path(data_dir).expanduser().resolve()  # unexpanded, "~/pg" was a cluster in ./~/pg
    as_postgres = ("runuser", "-u", "postgres", "--") if os.geteuid() == 0 else ()
    if not (data / "PG_VERSION").is_file():
        data.mkdir(parents=True, exist_ok=True)
        if as_postgres:
            shutil.chown(data, "postgres", "postgres")
        initdb = (
            *as_postgres,
            str(binaries / "initdb"),
            *("--auth=trust", "--username=postgres", "--encoding=UTF8", "--no-locale"),
            *("--no-sync", "--no-instructions", "-D", str(data)),
        )
        try:
            done = subprocess.run(initdb, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:  # a hung initdb (a slow or full disk) is a failed one
            output = "".join(_text(part) for part in (exc.stdout, exc.stderr))
            raise ServerError(
                f"initdb of {data} did not finish within {exc.timeout:g} s (is its disk slow or full? "
                f"pass another data_dir): {shlex.join(initdb)}\n{output}"
            ) from None
        if done.returncode != 0:
            raise ServerError(f"initdb failed ({done.returncode}): {shlex.join(initdb)}\n{done.stdout}{done.stderr}")
    port = free_port()
    argv = (
        *as_postgres,
        str(binaries / "postgres"),
        *("-D", str(data), "-p", str(port)),
        *("-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories=", "-c", "fsync=off"),
    )
    url = f"postgresql://postgres@{HOST}:{port}/postgres"
    ready = re.compile(r"database system is ready to accept connections").search
    return ServerSpec("postgres", argv, port, url, lambda log: ready(log) is not None, stop_signal=signal.SIGINT)


def _text(output: str | bytes | None) -> str:
    """What a timed-out run had printed: ``TimeoutExpired`` may hold bytes even with ``text=True``."""
    if isinstance(output, bytes):
        return output.decode("utf-8", errors="replace")
    return output or ""


def _postgres_bin(bin_dir: str | Path | None) -> Path:
    if bin_dir is not None:
        candidates = [Path(bin_dir).expanduser()]
    else:
        on_path = shutil.which("initdb")
        candidates = [Path(on_path).parent] if on_path else []
        candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for candidate in candidates:
        if (candidate / "initdb").is_file() and (candidate / "postgres").is_file():
            return candidate
    raise ConfigError(
        "PostgreSQL server binaries (initdb, postgres) not found: install Debian's `postgresql-15` "
        "(apt-get install postgresql-15) or pass bin_dir= to their directory"
    )


@contextmanager
def postgres_server(
    data_dir: str | Path | None = None,
    *,
    bin_dir: str | Path | None = None,
    startup_timeout: float = 60.0,
    max_seconds: float = 3600.0,
    log_dir: str | Path | None = None,
) -> Iterator[Server]:
    """Run PostgreSQL on a free loopback port; ``url`` is a ``postgresql://`` connection URL.

    Args:
        data_dir: The cluster directory (see :func:`postgres_spec`); default a new temporary one,
            deleted at the end.
        bin_dir: As in :func:`postgres_spec`.
        startup_timeout, max_seconds, log_dir: As in :func:`serve`.

    Example:
        >>> with postgres_server() as db:  # doctest: +SKIP
        ...     db.url
        'postgresql://postgres@127.0.0.1:40123/postgres'
    """
    scratch = None if data_dir is not None else Path(tempfile.mkdtemp(prefix="parallelmuse-pg-"))
    try:
        if scratch is not None and os.geteuid() == 0:
            shutil.chown(scratch, "postgres", "postgres")  # mkdtemp is 0700: the server must enter it
        spec = postgres_spec(data_dir if scratch is None else scratch / "data", bin_dir=bin_dir)
        yield from serve_one(spec, startup_timeout=startup_timeout, max_seconds=max_seconds, log_dir=log_dir)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
