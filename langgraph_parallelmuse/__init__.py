"""ParallelMuse as a prebuilt LangGraph subgraph (arXiv 2510.24698).

Heavy parts (torch, transformers) load only when ``LocalChatModel`` is first used.

Example:
    >>> from langgraph_parallelmuse import ParallelMuseConfig
    >>> ParallelMuseConfig().n
    8
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from langgraph_parallelmuse.config import ParallelMuseConfig, make_config
from langgraph_parallelmuse.errors import (
    ConfigError,
    ContextOverflowError,
    InputError,
    MissingLogprobsError,
    ParallelMuseError,
    ProtocolError,
    RolloutFailedError,
    ThreadBusyError,
)

_LAZY = {
    "create_parallelmuse": "langgraph_parallelmuse.graph",
    "build_parallelmuse_graph": "langgraph_parallelmuse.graph",
    "rollout_runner": "langgraph_parallelmuse.graph",
    "RolloutRunner": "langgraph_parallelmuse.agent",
    "GuidedDriver": "langgraph_parallelmuse.driver",
    "FreeDriver": "langgraph_parallelmuse.driver",
    "LocalChatModel": "langgraph_parallelmuse.models",
    "CorpusIndex": "langgraph_parallelmuse.tools",
    "make_corpus_tools": "langgraph_parallelmuse.tools",
    "make_tavily_tools": "langgraph_parallelmuse.tools",
    "normalize_logprobs": "langgraph_parallelmuse.logprobs",
    "partial_rollout": "langgraph_parallelmuse.schedule",
    "Calibration": "langgraph_parallelmuse.calibration",
}

__all__ = [
    "ConfigError",
    "ContextOverflowError",
    "InputError",
    "MissingLogprobsError",
    "ParallelMuseConfig",
    "ParallelMuseError",
    "ProtocolError",
    "RolloutFailedError",
    "ThreadBusyError",
    "make_config",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'langgraph_parallelmuse' has no attribute {name!r}")
