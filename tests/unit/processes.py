"""Process-level test helpers: a Ctrl-C sent to this process, an action run in a forked child."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time


@contextlib.contextmanager
def ctrl_c_after(seconds: float):
    """Send this process SIGINT after ``seconds``, raised as KeyboardInterrupt even where the suite
    was started with SIGINT ignored (a background job: Python then installs no handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


def in_forked_child(action) -> str:
    """``action()``'s result (or error) in a forked child, as text; a child stuck for 20 s is killed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            text = str(action())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            text = f"{type(exc).__name__}: {exc}"
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 20
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "stuck"
        time.sleep(0.05)
    with os.fdopen(read) as f:
        return f.read()
