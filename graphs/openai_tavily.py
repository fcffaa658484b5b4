"""ParallelMuse on an OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI) with Tavily.

Environment: ``PARALLELMUSE_BASE_URL`` (default http://127.0.0.1:8000/v1), ``PARALLELMUSE_MODEL``,
``OPENAI_API_KEY`` (any string for local servers), ``TAVILY_API_KEY``; optional
``PARALLELMUSE_AGGREGATOR_MODEL`` for a separate aggregator on the same server.

``graph`` is a zero-argument graph factory (LangGraph server calls it when the graph is used):
building at import would raise ``MissingTavilyKeyError`` while ``langgraph dev`` loads its
graphs and take the whole server down, the embedded graph included. Without a key, a run of
this graph fails with that error naming ``TAVILY_API_KEY``.
"""

import functools
import os

from langchain_openai import ChatOpenAI
from langgraph.graph.state import CompiledStateGraph

from langgraph_parallelmuse import create_parallelmuse
from langgraph_parallelmuse.tools import make_tavily_tools


def _chat(model_name: str) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=os.environ.get("PARALLELMUSE_BASE_URL", "http://127.0.0.1:8000/v1"),
        model=model_name,
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        logprobs=True,
        top_logprobs=16,
    )


@functools.cache
def _build() -> CompiledStateGraph:
    aggregator = os.environ.get("PARALLELMUSE_AGGREGATOR_MODEL")
    return create_parallelmuse(
        _chat(os.environ.get("PARALLELMUSE_MODEL", "default")),
        make_tavily_tools(),
        aggregator_model=_chat(aggregator) if aggregator else None,
        name="parallelmuse-openai-tavily",
    )


def graph() -> CompiledStateGraph:
    """The compiled graph, built once on first use (a missing key raises on every use)."""
    return _build()
