"""ParallelMuse on any OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI) with Tavily search.

Environment: ``PARALLELMUSE_BASE_URL`` (e.g. http://127.0.0.1:8000/v1), ``PARALLELMUSE_MODEL``,
``OPENAI_API_KEY`` (any string for local servers), ``TAVILY_API_KEY``; optional
``PARALLELMUSE_AGGREGATOR_MODEL`` for a separate aggregator on the same server.
"""

import os

from langchain_openai import ChatOpenAI

from langgraph_parallelmuse import create_parallelmuse
from langgraph_parallelmuse.tools import make_tavily_tools


def _chat(model_name: str) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=os.environ.get("PARALLELMUSE_BASE_URL"),
        model=model_name,
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        logprobs=True,
        top_logprobs=16,
    )


_aggregator = os.environ.get("PARALLELMUSE_AGGREGATOR_MODEL")
graph = create_parallelmuse(
    _chat(os.environ.get("PARALLELMUSE_MODEL", "default")),
    make_tavily_tools(),
    aggregator_model=_chat(_aggregator) if _aggregator else None,
    name="parallelmuse-openai-tavily",
)
