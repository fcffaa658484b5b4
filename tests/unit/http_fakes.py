"""A tiny loopback HTTP server for unit tests: canned JSON/text answers per path, requests recorded."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A route answers (status, body): a dict/list is sent as JSON, a str as text.
Route = Callable[[dict[str, Any]], tuple[int, Any]]


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeHTTP:
    url: str
    routes: dict[str, Route]
    requests: list[Recorded] = field(default_factory=list)


@contextmanager
def fake_http(routes: dict[str, Route], *, port: int = 0) -> Iterator[FakeHTTP]:
    """Serve ``routes`` (``"GET /v1/models"`` -> handler) on 127.0.0.1 (``port``, 0: any) until the block ends."""
    fake = FakeHTTP("", dict(routes))

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            fake.requests.append(
                Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            route = fake.routes.get(f"{self.command} {self.path}")
            status, answer = route(body) if route else (404, {"error": {"message": f"no route {self.path}"}})
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "text/plain" if isinstance(answer, str) else "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

    with _served(fake, Handler, port=port):
        yield fake


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (a timeout under test) breaks the answer's pipe: expected, not a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def _served(fake: FakeHTTP, handler: type[BaseHTTPRequestHandler], *, port: int) -> Iterator[None]:
    """Serve ``handler`` on 127.0.0.1 (``port``, 0: any) while the block runs; ``fake.url`` names it."""
    server = _QuietServer(("127.0.0.1", port), handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def redirecting_http(location: str, *, status: int = 302) -> Iterator[FakeHTTP]:
    """Answer every GET and POST on 127.0.0.1 with a redirect (``status``) to ``location``, requests recorded."""
    fake = FakeHTTP("", {})

    class Handler(BaseHTTPRequestHandler):
        def _redirect(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            fake.requests.append(Recorded(self.command, self.path, headers, json.loads(raw) if raw else {}))
            self.send_response(status)
            self.send_header("location", location)
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_POST = _redirect

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

    with _served(fake, Handler, port=0):
        yield fake
