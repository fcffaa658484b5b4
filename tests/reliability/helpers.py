"""Shared fakes of the reliability suite, built on ``tests.unit.fakes``.

* :class:`KwargsModel` is a :class:`~tests.unit.fakes.ScriptedChatModel` whose responder also
  receives the call's kwargs, so a test can tell trajectories apart by their ``seed``.
* :func:`seed_table` maps the per-call seed the library derives back to ``(trajectory id, step)``.
* :class:`FakeTavilyServer` is a loopback HTTP server speaking just enough of the Tavily API.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.messages import BaseMessage

from langgraph_parallelmuse.segments import derive_seed
from tests.unit.fakes import Reply, ScriptedChatModel


class ServerError(Exception):
    """An API error carrying an HTTP status, like openai.APIStatusError."""

    def __init__(self, status_code: int, message: str = "") -> None:
        super().__init__(message or f"HTTP {status_code}")
        self.status_code = status_code


class KwargsModel(ScriptedChatModel):
    """A scripted model whose ``kw_responder(messages, kwargs)`` picks each reply."""

    kw_responder: Callable[[list[BaseMessage], dict[str, Any]], Any] | None = None

    def _next(self, messages, stop, kwargs):  # type: ignore[override]
        if self.kw_responder is None:
            return super()._next(messages, stop, kwargs)
        with self._lock:
            self.calls.append({"messages": list(messages), "stop": stop, "kwargs": dict(kwargs)})
        item = self.kw_responder(list(messages), dict(kwargs))
        if isinstance(item, BaseException):
            raise item
        return item if isinstance(item, Reply) else Reply(str(item))


def seed_table(base_seed: int, trajectory_ids, *, max_turns: int, attempts: int = 2) -> dict:
    """``{seed kwarg of the model call: (trajectory id, step)}`` for a free-driver run."""
    table = {}
    for tid in trajectory_ids:
        for step in range(max_turns):
            for attempt in range(attempts):
                turn_seed = derive_seed(base_seed, tid, step, attempt)
                table[derive_seed(turn_seed, 0)] = (tid, step)
    return table


@dataclass
class TavilyReply:
    status: int = 200
    body: Any = None
    delay: float = 0.0


@dataclass
class FakeTavilyServer:
    """Scripted replies per endpoint (the last one repeats); records every request."""

    script: dict[str, list[TavilyReply]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    base_url: str = ""

    def __enter__(self) -> FakeTavilyServer:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                length = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(length) or b"{}")
                state.requests.append((self.path, dict(self.headers), payload))
                replies = state.script.get(self.path) or [TavilyReply(404, {"detail": {"error": "nf"}})]
                reply = replies.pop(0) if len(replies) > 1 else replies[0]
                time.sleep(reply.delay)
                data = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
