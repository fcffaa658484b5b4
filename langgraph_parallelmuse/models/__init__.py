"""Local models: the in-process transformers chat model, its engine and prefix KV cache.

Names are imported lazily, so ``import langgraph_parallelmuse.models`` does not pull in torch.

Example:
    >>> from langgraph_parallelmuse.models import LocalChatModel
    >>> llm = LocalChatModel.embedded(max_tokens=32)
    >>> llm.max_tokens
    32
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_parallelmuse.models.engine import InferenceEngine, shared_engine
    from langgraph_parallelmuse.models.loading import (
        LoadedModel,
        load_embedded_model_path,
        load_model,
    )
    from langgraph_parallelmuse.models.local import LocalChatModel
    from langgraph_parallelmuse.models.prefix_cache import PrefixCache
    from langgraph_parallelmuse.models.requests import GenerationRequest, GenerationResult
    from langgraph_parallelmuse.models.routing import routing_scope
    from langgraph_parallelmuse.models.server import ServerChatModel, ServerCheckError, ServerSupport, check_server

_EXPORTS = {
    "GenerationRequest": "requests",
    "GenerationResult": "requests",
    "InferenceEngine": "engine",
    "shared_engine": "engine",
    "LoadedModel": "loading",
    "load_embedded_model_path": "loading",
    "load_model": "loading",
    "LocalChatModel": "local",
    "PrefixCache": "prefix_cache",
    "routing_scope": "routing",
    "ServerChatModel": "server",
    "ServerCheckError": "server",
    "ServerSupport": "server",
    "check_server": "server",
}

__all__ = [
    "GenerationRequest",
    "GenerationResult",
    "InferenceEngine",
    "LoadedModel",
    "LocalChatModel",
    "PrefixCache",
    "ServerChatModel",
    "ServerCheckError",
    "ServerSupport",
    "check_server",
    "routing_scope",
    "load_embedded_model_path",
    "load_model",
    "shared_engine",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
