"""Run a server process on loopback with a bounded lifetime, wait until it is ready, stop its group.

Every server runs under ``timeout`` (it stops by itself after ``max_seconds``) with a watchdog shell
in its process group that signals the group when the process that started it is gone (even after
a SIGKILL of that process, or while it is an unreaped zombie) and stops what a server whose main
process ended left behind. Each server is a new session, so stopping it signals the whole group
and a server's children (vLLM's engine core and worker) go with it. A readiness wait fails with a
:class:`ServerError` naming the command, the port and the tail of the server's log.
"""

from __future__ import annotations

import collections
import http.client
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph_parallelmuse.errors import ConfigError, ParallelMuseError
from langgraph_parallelmuse.loopback import open_url
from langgraph_parallelmuse.redact import mask_argv, redact, secrets_in_argv, secrets_of

HOST = "127.0.0.1"
_LOG_TAIL = 3000
_TIMED_OUT = 124  # `timeout`'s status when the lifetime ran out
# How much of the log is redacted before the tail is cut from it: a key that the cut would split is
# then found whole (the window starts at a line, far before the tail).
_REDACTED_WINDOW = 1 << 16
# The ports free_ports() handed out lately: several specs made one by one (vllm_spec for each
# replica) must not get one port twice before any of their servers binds it.
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=1024)
_PORTS_LOCK = threading.Lock()

# Run by `sh -c` in the server's process group: a background watchdog, then `exec` of the server
# (so the server keeps the shell's pid and default signal dispositions: a background job of a
# non-interactive shell would start with SIGINT ignored). When the process that started everything
# ($1) is gone or a zombie (`kill -0` succeeds on one), or the lifetime ($3 seconds, past `timeout`'s
# own) is over, the watchdog signals the whole group (itself excepted by its trap) and kills what is
# left after the grace ($4 s). When the server's main process ($$) ends first, what it left in the
# group (the engine core of a vLLM whose API server crashed) is killed at once: `timeout` has exited
# with it, and nothing else would bound them.
_WATCHDOG = """
parent=$1; sig=$2; ticks=$(($3 * 2)); grace=$4; shift 4
alive() {
    [ -r "/proc/$1/stat" ] || { kill -0 "$1" 2>/dev/null; return; }
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$state" ] && [ "$state" != Z ]
}
(
    while alive "$parent" && alive $$ && [ "$ticks" -gt 0 ]; do sleep 0.5; ticks=$((ticks - 1)); done
    trap '' "$sig"
    if alive $$; then kill -s "$sig" 0; sleep "$grace"; fi
    kill -s KILL 0
) &
exec "$@"
"""


class ServerError(ParallelMuseError, RuntimeError):
    """A server did not start (or exited), or failed a request: the message names the command, port
    and log tail, or the URL asked."""


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
        """The last ``chars`` characters of the server's log, its secrets masked as in a startup error.

        A test's failure message prints it: vLLM logs its arguments, an ``--api-key`` among them.
        """
        # Redacted before the cut, as in _failure: a key across the cut would lose its head.
        text = _redacted(self.command, _tail_from_a_line(self.log_path, max(chars, _REDACTED_WINDOW)))
        return text[max(0, len(text) - chars) :]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (see :func:`free_ports`).

    Example:
        >>> 1024 <= free_port() <= 65535
        True
    """
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now.

    Each port is held until all are chosen (a port let go at once can come back from the next
    bind), and none is one this process handed out lately and its server may not have bound yet.

    Args:
        count: How many ports (>= 1).

    Raises:
        ConfigError: ``count`` is not a whole number >= 1.

    Example:
        >>> first, second = free_ports(2)
        >>> first != second
        True
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"free_ports(count={count!r}): ask for a whole number of ports >= 1")
    ports: list[int] = []
    with _PORTS_LOCK, ExitStack() as held:
        while len(ports) < count:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
            if port not in _HANDED_OUT:  # a skipped one stays held, so the next bind picks another
                ports.append(port)
        _HANDED_OUT.extend(ports)
    return ports


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
        ConfigError: ``max_seconds`` or ``startup_timeout`` is not a positive finite number, or
            two specs share a port.
        ServerError: A server exited during startup or was not ready in time (every server
            started here is stopped first). An error raised in the block gets a note naming each
            server that had exited by then, with its log's tail.

    Example:
        >>> spec = ServerSpec("demo", ("sh", "-c", "echo up; sleep 60"), 0, "", lambda log: "up" in log)
        >>> with serve([spec], max_seconds=30) as (server,):
        ...     server.log_tail()
        'up\\n'
    """
    if not (math.isfinite(max_seconds) and max_seconds > 0):
        # `timeout` would read 0 or inf as no bound at all: every server here has one.
        raise ConfigError(f"max_seconds={max_seconds}: give a positive number of seconds (default 3600)")
    if not (math.isfinite(startup_timeout) and startup_timeout > 0):
        # NaN never passes the deadline (and inf is none): the wait would only end with the server.
        raise ConfigError(f"startup_timeout={startup_timeout}: give a positive number of seconds (default 600)")
    _check_ports(specs)
    # A "~" left unexpanded made a folder named "~" in the working directory; absolute, so that a
    # Server's log_path still names the log after the process changes directory.
    logs = (
        Path(log_dir).expanduser().absolute()
        if log_dir is not None
        else Path(tempfile.mkdtemp(prefix="parallelmuse-servers-"))
    )
    logs.mkdir(parents=True, exist_ok=True)
    started: list[tuple[Server, subprocess.Popen, ServerSpec]] = []
    try:
        for spec in specs:
            log_path = logs / f"{spec.name}-{spec.port}.log"
            started.append((*_spawn(spec, log_path, max_seconds=max_seconds, grace=grace), spec))
        _wait_ready([(server, proc, spec.ready) for server, proc, spec in started], budget=startup_timeout)
        try:
            yield [server for server, _, _ in started]
        except BaseException as exc:
            # A server that crashed while in use showed only as its clients' "Connection refused".
            for server, proc, _ in started:
                if proc.poll() is not None:
                    exc.add_note(_failure(server, f"{_exit_text(proc.returncode)} while it was in use"))
            raise
    finally:
        _stop_groups([(proc, spec.stop_signal) for _, proc, spec in reversed(started)], grace=grace)


def _check_ports(specs: Sequence[ServerSpec]) -> None:
    """Refuse two specs on one port: a server binding SO_REUSEPORT (vLLM) shares it with the other,
    both look ready, and a client of either URL reaches either server."""
    by_port: dict[int, list[str]] = {}
    for spec in specs:
        if spec.port:  # 0: a spec without a port of its own
            by_port.setdefault(spec.port, []).append(spec.name)
    for port, names in by_port.items():
        if len(names) > 1:
            raise ConfigError(
                f"serve: {len(names)} specs ({', '.join(names)}) use port {port}: give each server its own "
                "port (one vllm_spec()/router_spec() call each, or serving.process.free_ports(n))"
            )


def _spawn(spec: ServerSpec, log_path: Path, *, max_seconds: float, grace: float) -> tuple[Server, subprocess.Popen]:
    if shutil.which(spec.command[0]) is None:
        raise ServerError(
            _redacted(
                spec.command,
                f"{spec.name}: {spec.command[0]!r} is not an executable (command: {_shown(spec.command)})",
            )
        )
    sig = signal.Signals(spec.stop_signal).name.removeprefix("SIG")
    wrapped = [
        *("timeout", "-s", sig, "-k", f"{grace:g}", f"{max_seconds:g}"),
        *("sh", "-c", _WATCHDOG, "watchdog", str(os.getpid()), sig, str(math.ceil(max_seconds + grace)), f"{grace:g}"),
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


def _wait_ready(waiting: Sequence[tuple[Server, subprocess.Popen, Callable[[str], bool]]], *, budget: float) -> None:
    """Wait until every server is ready; raise naming the first that exits or is not ready in time.

    All are watched on every round: one waited for after another, a replica that died at once (its
    port taken, no memory) was named only once the servers before it were ready, minutes later.
    """
    deadline = time.monotonic() + budget
    while True:
        for server, proc, _ in waiting:
            if proc.poll() is not None:
                raise ServerError(_failure(server, f"{_exit_text(proc.returncode)} before it was ready"))
        waiting = [entry for entry in waiting if not _ready_now(*entry)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ServerError(_failure(waiting[0][0], f"was not ready within {budget:g} s"))
        time.sleep(0.2)


def _exit_text(status: int) -> str:
    """How the server ended, from the status of ``timeout`` (its lifetime wrapper).

    The bare status hid the two endings its log does not tell: 124 is ``timeout``'s own (the lifetime
    was over); 128 + N, or -N (the group killed meanwhile), is signal N, SIGKILL the kernel's when
    memory runs out.

    Example:
        >>> _exit_text(3), _exit_text(124)
        ('exited with status 3', 'was stopped at the end of its max_seconds lifetime (status 124)')
        >>> _exit_text(137), _exit_text(-15)
        ('was killed by SIGKILL (status 137; out of memory?)', 'was killed by SIGTERM (status -15)')
    """
    if status == _TIMED_OUT:
        return f"was stopped at the end of its max_seconds lifetime (status {status})"
    number = -status if status < 0 else status - 128
    if not 0 < number < signal.NSIG:
        return f"exited with status {status}"
    name = {sig.value: sig.name for sig in signal.Signals}.get(number, f"signal {number}")
    hint = "; out of memory?" if number == signal.SIGKILL else ""
    return f"was killed by {name} (status {status}{hint})"


def _ready_now(server: Server, proc: subprocess.Popen, ready: Callable[[str], bool]) -> bool:
    # free_port() let the port go before the server bound it: a process that took it meanwhile
    # answers the probe while ours dies with "Address already in use" (then _wait_ready names it),
    # so a probe answered from outside the server's group does not count; nor one answered by a
    # server that died while it was probed.
    return ready(_tail(server.log_path, 1 << 20)) and not _held_by_another(server) and proc.poll() is None


def _held_by_another(server: Server) -> bool:
    """Whether a process outside the server's group listens on its port and the server does not
    (no listener: not another's).

    Raises:
        ServerError: Both listen on one address: SO_REUSEPORT (which vLLM sets) lets a second server
            bind a port another process's server holds, and the kernel then hands either of them the
            clients of the URL (the server looked ready and answered for the other).
    """
    listening = _listening_sockets(server.port)
    if not listening:
        return False
    ours = _group_sockets(server.pid)
    if ours is None:  # run as another user (PostgreSQL as postgres): whose the socket is is unknown
        return False
    our_addresses = {address for link, address in listening.items() if link in ours}
    if not our_addresses:
        return True
    if any(address in our_addresses for link, address in listening.items() if link not in ours):
        raise ServerError(
            _failure(
                server,
                "shares its port with a server of another process (both bound it with SO_REUSEPORT), which "
                "would answer some of its requests: stop that server, or start this one again on a new port",
            )
        )
    return False


def _group_sockets(pgid: int) -> set[str] | None:
    """The ``/proc/PID/fd`` links of the open files of process group ``pgid``, or ``None`` when they are
    another user's (unreadable)."""
    links = set()
    for pid in group_members(pgid):
        try:
            fds = list(os.scandir(f"/proc/{pid}/fd"))
        except FileNotFoundError:  # exited meanwhile
            continue
        except OSError:
            return None
        for fd in fds:
            try:
                links.add(os.readlink(fd.path))
            except OSError:  # closed meanwhile
                continue
    return links


def _listening_sockets(port: int) -> dict[str, str]:
    """The TCP sockets listening on ``port`` (any address): their ``/proc/PID/fd`` link -> local address."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6
            continue
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode
            address, _, hex_port = fields[1].rpartition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                found[f"socket:[{fields[9]}]"] = address
    return found


def _failure(server: Server, what: str) -> str:
    # Redacted before the cut: cut first, a key across the cut lost its head and was not found.
    tail = _redacted(server.command, _tail_from_a_line(server.log_path, _REDACTED_WINDOW))[-_LOG_TAIL:]
    return _redacted(
        server.command,
        f"{server.name} on 127.0.0.1 port {server.port} {what}.\n"
        f"command: {_shown(server.command)}\n"
        f"log {server.log_path}, last {_LOG_TAIL} characters:\n{tail}",
    )


def _shown(command: Sequence[str]) -> str:
    """The command line for a message, its secret options' values masked however short."""
    # A masked argument is shown unquoted: shlex would quote the "***" that stands for the value.
    return " ".join(
        shown if shown != arg else shlex.quote(arg) for arg, shown in zip(command, mask_argv(command), strict=True)
    )


def _redacted(command: Sequence[str], text: str) -> str:
    # The command line (extra_args) and the log (a server prints its arguments) may hold a key,
    # and vLLM's --api-key takes several: each one is a secret wherever it shows. One given on the
    # command line is a secret however short (a placeholder length does not make it one).
    return redact(text, secrets_of(), passwords=secrets_in_argv(command))


def stop_group(proc: subprocess.Popen, *, stop_signal: int = signal.SIGTERM, grace: float = 15.0) -> None:
    """Signal the process group led by ``proc``; SIGKILL it if it is still there after ``grace`` s.

    Example:
        >>> import subprocess, sys
        >>> proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        >>> stop_group(proc, grace=5.0)
        >>> proc.returncode == -signal.SIGTERM
        True
    """
    _stop_groups([(proc, stop_signal)], grace=grace)


def _stop_groups(groups: Sequence[tuple[subprocess.Popen, int]], *, grace: float) -> None:
    """Send every group its stop signal, then wait for all at once; SIGKILL what is left after ``grace`` s.

    One server's slow shutdown then neither delays another's signal nor adds its grace to theirs,
    and an interrupted wait (a second Ctrl-C) still SIGKILLs every group that is left.
    """
    try:
        for proc, stop_signal in groups:
            _signal_group(proc, stop_signal)
        _wait_gone([proc for proc, _ in groups], grace)
    finally:
        left = [proc for proc, _ in groups if not _gone(proc)]
        for proc in left:
            _signal_group(proc, signal.SIGKILL)
        _wait_gone(left, 10.0)
        for proc, _ in groups:
            proc.wait(timeout=5)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(procs: Sequence[subprocess.Popen], seconds: float) -> None:
    end = time.monotonic() + seconds
    while not all(_gone(proc) for proc in procs) and time.monotonic() < end:
        time.sleep(0.1)


def _gone(proc: subprocess.Popen) -> bool:
    # The leader can exit before a member that ignored the signal: the whole group must be gone.
    return proc.poll() is not None and not group_members(proc.pid)


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


def _tail_from_a_line(path: Path, chars: int) -> str:
    """The last ``chars`` bytes of ``path`` from the first line that starts in them (all of a shorter file).

    A line cut at its start could lose what makes a secret in it recognisable (``api_key=``).
    """
    try:
        with open(path, "rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - chars)
            f.seek(start)
            data = f.read()
    except OSError:
        return ""
    if start > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]
    return data.decode(errors="replace")


def http_ready(
    url: str, accept: Callable[[str], bool] = lambda body: True, *, headers: Mapping[str, str] | None = None
) -> Callable[[str], bool]:
    """A readiness probe: ``GET url`` (sending ``headers``) answers 200 with a body that ``accept`` takes.

    Anything else, a reply that is not HTTP (a server still starting, another program on the port)
    included, is "not ready yet".
    """

    def ready(_log: str) -> bool:
        try:
            with open_url(urllib.request.Request(url, headers=dict(headers or {})), timeout=2) as resp:
                return resp.status == 200 and accept(resp.read().decode(errors="replace"))
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
            return False

    return ready


#: Why ``extra_args`` may not set where a server listens.
LOOPBACK_ONLY = f"every server here listens on {HOST} and a free port, where its readiness is probed"


def refuse_own_flags(name: str, extra_args: Sequence[str], owned: Mapping[str, str]) -> None:
    """Refuse a flag in ``extra_args`` that the spec sets itself.

    The server's argparse takes the last one, the extra one: ``--port`` made it listen where no probe
    asked (the wait ran to its timeout), ``--host 0.0.0.0`` on every interface.

    Args:
        name: The server, for the message.
        extra_args: The user's arguments, added after the spec's own.
        owned: Each flag the spec sets (``--port``, or ``--port=...``) -> what to do instead.

    Raises:
        ConfigError: Naming the flag and what to do instead.

    Example:
        >>> refuse_own_flags("vllm", ["--port", "9000"], {"--port": "drop it"})
        Traceback (most recent call last):
        ...
        langgraph_parallelmuse.errors.ConfigError: vllm extra_args sets --port, which is set here: drop it
    """
    for arg in extra_args:
        flag = str(arg).partition("=")[0]
        if flag in owned:
            raise ConfigError(f"{name} extra_args sets {flag}, which is set here: {owned[flag]}")


def venv_bin(venv: str | Path, name: str) -> str:
    """The executable ``name`` of the serving virtualenv, or a ConfigError naming the setup script."""
    path = Path(venv).expanduser() / "bin" / name
    if not path.exists():
        raise ConfigError(
            f"{path} does not exist: build the serving virtualenv with `scripts/setup-serving.sh {venv}` "
            "(vLLM and the routers live there, apart from the library's venv)"
        )
    return str(path)


def serve_one(spec: ServerSpec, **options: Any) -> Iterator[Server]:
    """The body of a one-server context manager: ``yield from serve_one(spec, ...)``."""
    with serve([spec], **options) as (server,):
        yield server
