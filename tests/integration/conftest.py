"""Helpers of the integration tests: offline environment for subprocesses, free loopback ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

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
