"""Fault injected: a server whose error body echoes the request headers, with ``OPENAI_API_KEY`` set.

Before the fix the key landed unredacted in ``trajectories[].error``, in ``--json`` output and in the
checkpoints (25 copies in the SQLite file). Now no stored or printed text holds it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langgraph_parallelmuse.errors import RolloutFailedError
from langgraph_parallelmuse.graph import create_parallelmuse
from tests.unit.fakes import make_tools

SECRET = "sk-proj-SECRET0123456789abcdefSECRET"


class _EchoHeaders(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps({"error": {"message": f"internal error; request headers: {dict(self.headers)}"}})
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHeaders)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


async def test_an_echoed_api_key_is_never_stored_or_printed(echo_server, tmp_path, monkeypatch, caplog, fast_retries):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    model = ChatOpenAI(base_url=echo_server, model="smollm2", logprobs=True, top_logprobs=4, max_retries=0)
    db = tmp_path / "run.sqlite"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = create_parallelmuse(
            model, make_tools()[0], config={"n": 2, "mode": "none"}, checkpointer=saver, trajectory_checkpointer=saver
        )
        with pytest.raises(RolloutFailedError) as err:
            await graph.ainvoke({"question": "Capital of France?"}, {"configurable": {"thread_id": "leak"}})
    errors = [t["error"] for t in err.value.result["trajectories"]]
    assert all("request headers" in e and "Bearer ***" in e for e in errors), errors  # the body did come back
    assert SECRET not in str(err.value)
    assert SECRET not in json.dumps(err.value.result)
    assert SECRET not in caplog.text
    assert SECRET.encode() not in db.read_bytes()
