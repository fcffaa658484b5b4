"""Helpers of the integration tests: offline environment for subprocesses, free loopback ports, the
specs of the servers they start."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from langgraph_parallelmuse.serving import ServerSpec

ROOT = Path(__file__).resolve().parents[2]

# Everything that would phone home is switched off: langgraph-cli's analytics (posted on every
# command), langgraph-api's PyPI version check, LangSmith tracing. There is no internet in CI.
OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}
_DROP = ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY", "LANGGRAPH_CLOUD_LICENSE_KEY")


def offline_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update(OFFLINE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline_spec(name: str, command: Sequence[str], port: int, ready: Callable[[str], bool], **env: str) -> ServerSpec:
    """A loopback server run from the repo root in :func:`offline_env`, for the library's ``serve``:
    like the vLLM and PostgreSQL fixtures' servers, it stops by itself after ``serve``'s
    ``max_seconds`` or when the test process dies, however the test ends.

    A spec's variables are set on top of this process's environment, which holds the keys
    offline_env leaves out: ``env -u`` takes them away again.
    """
    from langgraph_parallelmuse.serving import ServerSpec

    unset = [arg for key in _DROP for arg in ("-u", key)]
    argv = ("env", "-C", str(ROOT), *unset, *command)
    return ServerSpec(name, argv, port, f"http://127.0.0.1:{port}", ready, env=offline_env(**env))


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """A three-document {id, title, text} JSONL corpus about the question the tests ask."""
    import json

    docs = [
        {
            "id": "eiffel",
            "title": "Eiffel Tower",
            "text": "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in "
            "Paris, France. "
            "It was designed by Gustave Eiffel's company and completed in 1889.",
        },
        {
            "id": "paris",
            "title": "Paris",
            "text": "Paris is the capital and largest city of France, on the river Seine.",
        },
        {
            "id": "london",
            "title": "London",
            "text": "London is the capital of England and the United Kingdom, on the river Thames.",
        },
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


# --- real serving components (vLLM, routers, PostgreSQL), each started once per test module ---

SERVING_VENV = Path(os.environ.get("PARALLELMUSE_SERVING_VENV", ROOT / ".venv-serving"))
SERVED_MODEL = "smollm2"
VLLM_BLOCK = 32


@pytest.fixture(scope="session")
def serving_venv() -> Path:
    """The vLLM + routers virtualenv (``make setup-serving`` / ``scripts/setup-serving.sh``)."""
    if not (SERVING_VENV / ".serving-installed").is_file():
        pytest.skip(f"no serving venv at {SERVING_VENV}: run scripts/setup-serving.sh {SERVING_VENV} (about 2-5 min)")
    return SERVING_VENV


@pytest.fixture(scope="session")
def exported_model() -> Path:
    """The embedded SmolLM2 as a transformers directory, exported once into .cache/ (gitignored)."""
    from langgraph_parallelmuse.errors import ConfigError
    from langgraph_parallelmuse.models.export import export_model

    try:
        return export_model(ROOT / ".cache" / "smollm2-bf16")
    except ConfigError as exc:
        pytest.skip(str(exc))


def _vllm_spec(exported_model: Path, serving_venv: Path):
    from langgraph_parallelmuse.serving import vllm_spec

    # Eager: first start about 1 min instead of about 5 (torch.compile), which CI's budget needs.
    # 32-token KV blocks (the CPU backend's smallest; default 128): a prefix is served from the
    # cache up to its last whole block, so a branch's hit falls short of its prefix by < 32 tokens.
    return vllm_spec(
        exported_model,
        venv=serving_venv,
        served_model_name=SERVED_MODEL,
        enforce_eager=True,
        kv_cache_gib=1,
        block_size=VLLM_BLOCK,
        dev_mode=True,  # POST /reset_prefix_cache, which the benchmark uses between measurements
    )


@pytest.fixture(scope="module")
def vllm(exported_model: Path, serving_venv: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real vLLM OpenAI-compatible server on loopback (``.url`` is its root; the API is /v1)."""
    from langgraph_parallelmuse.serving import serve

    with serve(
        [_vllm_spec(exported_model, serving_venv)], log_dir=tmp_path_factory.mktemp("vllm"), startup_timeout=900
    ) as (server,):
        yield server


@pytest.fixture(scope="module")
def vllm_pair(exported_model: Path, serving_venv: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two real vLLM replicas of the same weights, started together."""
    from langgraph_parallelmuse.serving import serve

    specs = [_vllm_spec(exported_model, serving_venv) for _ in range(2)]
    with serve(specs, log_dir=tmp_path_factory.mktemp("vllm-pair"), startup_timeout=900) as servers:
        yield servers


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory):
    """A real PostgreSQL (Debian's postgresql-15) in a temporary cluster on a loopback port."""
    from langgraph_parallelmuse.errors import ConfigError
    from langgraph_parallelmuse.serving import postgres_server

    try:
        with postgres_server(log_dir=tmp_path_factory.mktemp("postgres")) as server:
            yield server
    except ConfigError as exc:
        pytest.skip(str(exc))
