"""ParallelMuse on an OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI) with Tavily.

Environment: ``PARALLELMUSE_BASE_URL`` (default http://127.0.0.1:8000/v1), ``PARALLELMUSE_MODEL``,
``OPENAI_API_KEY`` (any string for local servers), ``TAVILY_API_KEY``; optional
``PARALLELMUSE_AGGREGATOR_MODEL`` for a separate aggregator on the same server, and
``PARALLELMUSE_ROUTING_HEADER`` behind a router (``x-session-id`` for vllm-router ``--policy
consistent_hash``): every call of one question then carries one key, so it reaches the replica
that holds that question's prefix cache.

``graph`` is a zero-argument graph factory (LangGraph server calls it when the graph is used):
building at import would raise ``MissingTavilyKeyError`` while ``langgraph dev`` loads its
graphs and take the whole server down, the embedded graph included. Without a key, a run of
this graph fails with that error naming ``TAVILY_API_KEY``.
"""

import functools
import os

from langgraph.graph.state import CompiledStateGraph

from langgraph_parallelmuse import ConfigError, create_parallelmuse
from langgraph_parallelmuse.loopback import is_http_url, shown_url
from langgraph_parallelmuse.models.server import ServerChatModel
from langgraph_parallelmuse.redact import redact
from langgraph_parallelmuse.tools import make_tavily_tools


def _env(name: str, default: str) -> str:
    # A variable set empty (a .env file's placeholder line "OPENAI_API_KEY=") is unset: taken as it
    # is, an empty key failed every run ("Missing credentials") and an empty base URL sent the
    # questions to api.openai.com instead of the local server.
    return os.environ.get(name) or default


def _base_url() -> str:
    url = _env("PARALLELMUSE_BASE_URL", "http://127.0.0.1:8000/v1")
    if not is_http_url(url):
        # Taken as it was ("127.0.0.1:8000/v1"), every run failed after its retries with the model call's
        # "Connection error.", which names neither the variable nor the missing scheme.
        raise ConfigError(
            f"PARALLELMUSE_BASE_URL={redact(shown_url(url))!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1"
        )
    return url


def _api_key() -> str:
    # A key read from a file ends in a line break, which no header carries; any other character none
    # carries (a curly quote pasted with it) ServerChatModel refuses, naming OPENAI_API_KEY.
    return _env("OPENAI_API_KEY", "not-needed").strip() or "not-needed"


def _chat(model_name: str) -> ServerChatModel:
    # New turns only (the free driver): OpenAI and many servers cannot continue an assistant turn.
    return ServerChatModel(
        base_url=_base_url(),
        model=model_name,
        api_key=_api_key(),
        logprobs=True,
        top_logprobs=16,
        supports_prefill=False,
        supports_scoring=False,
        routing_header=os.environ.get("PARALLELMUSE_ROUTING_HEADER") or None,
    )


@functools.cache
def _build() -> CompiledStateGraph:
    aggregator = os.environ.get("PARALLELMUSE_AGGREGATOR_MODEL")
    return create_parallelmuse(
        _chat(_env("PARALLELMUSE_MODEL", "default")),
        make_tavily_tools(),
        aggregator_model=_chat(aggregator) if aggregator else None,
        name="parallelmuse-openai-tavily",
    )


def graph() -> CompiledStateGraph:
    """The compiled graph, built once on first use (a missing key raises on every use)."""
    return _build()
