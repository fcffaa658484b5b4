"""The serving layer on inputs it must refuse or read right: malformed replies, "~" in paths, a URL's
password, 0.0.0.0 past a proxy, a port shared with another server."""

from __future__ import annotations

from pathlib import Path

import pytest

from langgraph_parallelmuse.models.server import ServerChatModel, ServerCheckError, check_server
from langgraph_parallelmuse.serving import ServerError, ServerSpec, postgres_spec, serve, vllm_counters, vllm_spec
from tests.unit.http_fakes import fake_http

_MODELS = {"GET /v1/models": lambda _: (200, {"data": [{"id": "m"}]})}


def _chat(choice: object) -> dict:
    return {**_MODELS, "POST /v1/chat/completions": lambda _: (200, {"choices": [choice]})}


@pytest.mark.parametrize(
    ("routes", "said"),
    [
        ({"GET /v1/models": lambda _: (200, {"data": ["m"]})}, r'/models sent a malformed reply.*data is \["m"\]'),
        (_chat("A"), r'/chat/completions sent a malformed reply.*choices\[0\] is "A", not an object'),
        (
            {**_MODELS, "POST /v1/chat/completions": lambda _: (200, {"choices": {"0": {}}})},
            r"/chat/completions sent a malformed reply.*choices is \{",
        ),
        (
            _chat({"message": {"content": "A"}, "logprobs": {"content": ["A"]}}),
            r'/chat/completions sent a malformed reply.*choices\[0\]\.logprobs\.content\[0\] is "A"',
        ),
    ],
)
def test_a_malformed_reply_to_the_check_names_the_server_not_a_bare_traceback(routes: dict, said: str) -> None:
    """Before: AttributeError ('str' object has no attribute 'get') or KeyError 0, naming no server."""
    with fake_http(routes) as fake:
        with pytest.raises(ServerCheckError, match=rf"{fake.url}/v1{said}"):
            check_server(f"{fake.url}/v1", "m", top_logprobs=1, prefill=False)


def test_logprobs_of_another_shape_are_no_logprobs_not_a_traceback() -> None:
    """A list where the logprobs object belongs raised AttributeError ('list' object has no attribute 'get')."""
    with fake_http(_chat({"message": {"content": "A"}, "logprobs": [-0.1]})) as fake:
        with pytest.raises(ServerCheckError, match=rf"{fake.url}/v1 returned no logprobs for model 'm'"):
            check_server(f"{fake.url}/v1", "m", top_logprobs=1, prefill=False)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder of its own, and a working directory apart from it (where "~" must not appear)."""
    (tmp_path / "home").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "home"


def test_a_postgres_data_dir_and_bin_dir_under_tilde_are_the_home_folders(home: Path) -> None:
    """Before: "~/pgdata" was a cluster initialised in ./~/pgdata, and "~/pgbin" had no binaries."""
    (home / "pgdata").mkdir()
    (home / "pgdata" / "PG_VERSION").write_text("15\n")  # an earlier cluster: initdb is not run
    (home / "pgbin").mkdir()
    for name in ("initdb", "postgres"):
        (home / "pgbin" / name).write_text("")
    spec = postgres_spec("~/pgdata", bin_dir="~/pgbin")
    assert spec.command[spec.command.index("-D") + 1] == str(home / "pgdata")
    assert str(home / "pgbin" / "postgres") in spec.command
    assert not Path("~").exists()


def test_a_log_dir_under_tilde_is_the_home_folder(home: Path) -> None:
    spec = ServerSpec("demo", ("sh", "-c", "echo up; exec sleep 30"), 0, "", lambda log: "up" in log)
    with serve([spec], log_dir="~/logs", max_seconds=30, grace=2) as (server,):
        assert server.log_path == home / "logs" / "demo-0.log" and server.log_tail() == "up\n"
    assert not Path("~").exists()


def test_a_vllm_model_dir_under_tilde_is_the_home_folder(home: Path) -> None:
    """Before: "~/smollm2" was "not a transformers checkpoint (no config.json)"."""
    (home / "smollm2").mkdir()
    (home / "smollm2" / "config.json").write_text("{}")
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").write_text("")
    spec = vllm_spec("~/smollm2", venv="~/venv")
    assert spec.command[spec.command.index("--model") + 1] == str(home / "smollm2")


@pytest.mark.parametrize("password", ["pw123", "Sup3rSecretPw"])
def test_a_vllm_urls_password_is_kept_out_of_the_invalid_url_error(password: str) -> None:
    """Without a port, http.client read the password as one ("nonnumeric port: 'PASSWORD@host'")
    and vllm_counters' error printed it."""
    with pytest.raises(ServerError, match=r"is not a valid URL \(nonnumeric port: '\*\*\*@127.0.0.1'\)") as err:
        vllm_counters(f"http://alice:{password}@127.0.0.1")
    assert password not in str(err.value)


def test_a_key_passed_as_openai_api_key_is_the_one_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """ChatOpenAI's field name: the default put under its alias (api_key="none") won, so the server
    got "none" and answered HTTP 401."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    chat = {"choices": [{"message": {"role": "assistant", "content": "A"}}], "usage": {"prompt_tokens": 3}}
    with fake_http({"POST /v1/chat/completions": lambda _: (200, chat)}) as fake:
        model = ServerChatModel(base_url=f"{fake.url}/v1", model="m", openai_api_key="sk-local-0123456789")
        assert model.invoke("hi").content == "A"
    assert fake.requests[0].headers["authorization"] == "Bearer sk-local-0123456789"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:pw@db?application_name=me@laptop",
        "postgresql://app@db:5432?sslmode=require&application_name=ci@r",
    ],
)
def test_an_at_sign_in_a_query_value_of_a_url_without_database_is_accepted(url: str) -> None:
    """libpq takes these (user info ends at the first "@"); they were refused as a raw "@" in the password."""
    from langgraph_parallelmuse.persistence import check_db

    assert check_db(url) == "postgres"


@pytest.mark.parametrize("url", ["postgresql://app:p@ss@db?sslmode=require", "postgresql://app:p@s?s@db"])
def test_a_raw_at_sign_in_the_password_before_a_query_is_still_refused(url: str) -> None:
    from langgraph_parallelmuse.errors import ConfigError
    from langgraph_parallelmuse.persistence import check_db

    with pytest.raises(ConfigError, match=r"holds a raw '@' or '/'") as err:
        check_db(url)
    assert "p@s" not in str(err.value)


def test_a_servers_log_tail_masks_the_keys_of_its_command_line(tmp_path: Path) -> None:
    """vLLM logs its arguments: log_tail(), which a test prints when it fails, showed the key as it is."""
    script = "echo \"args: {'api_key': ['$2'], 'hf_token': '$4'}\"; echo up; exec sleep 30"
    command = ("sh", "-c", script, "vllm", "--api-key", "sk-live-0123456789abc", "--hf-token", "hf1")
    spec = ServerSpec("vllm", command, 0, "", lambda log: "up" in log)
    with serve([spec], log_dir=tmp_path, max_seconds=30, grace=2) as (server,):
        tail = server.log_tail()
        assert "sk-live" not in tail and "hf1" not in tail and tail.endswith("up\n")
        assert server.log_tail(3) == "up\n" and server.log_tail(0) == ""


async def test_a_sqlite_store_may_be_given_as_a_path(tmp_path: Path) -> None:
    """check_db and open_checkpointer raised TypeError (expected string) for a pathlib.Path."""
    from langgraph_parallelmuse.persistence import check_db, open_checkpointer

    assert check_db(tmp_path / "runs.sqlite") == "sqlite"
    async with open_checkpointer(tmp_path / "runs.sqlite") as saver:
        assert type(saver).__name__ == "AsyncSqliteSaver"
    assert check_db(tmp_path / "runs.sqlite", existing=True) == "sqlite"


_REUSEPORT_SERVER = """
import http.server, socket, sys
name = sys.argv[2].encode()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", str(len(name)))
        self.end_headers()
        self.wfile.write(name)
class Server(http.server.HTTPServer):
    def server_bind(self):  # as vLLM binds its port
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_port_shared_with_another_processs_server_is_named_not_served(tmp_path: Path) -> None:
    """SO_REUSEPORT (vLLM's) let a server bind a port another process's server held: serve() yielded it,
    and the kernel sent some of its clients to the other server."""
    import subprocess
    import sys
    import time

    from langgraph_parallelmuse.serving import free_port
    from langgraph_parallelmuse.serving.process import http_ready

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = (sys.executable, "-c", _REUSEPORT_SERVER, str(port))
    with subprocess.Popen([*command, "other"]) as other:
        try:
            while not http_ready(f"{url}/")(""):  # the other server is up first
                assert other.poll() is None
                time.sleep(0.05)
            spec = ServerSpec("vllm", (*command, "ours"), port, url, http_ready(f"{url}/"))
            with pytest.raises(ServerError, match=rf"port {port} shares its port with a server of another process"):
                with serve([spec], log_dir=tmp_path, startup_timeout=60, grace=2):
                    pass
        finally:
            other.kill()
