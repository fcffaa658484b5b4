"""Model forward passes: prefill of one request and a joint decode step of the batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.models import kv_batch

__all__ = ["ModelRunner", "check_transformers"]

_PREFILL_CHUNK = 2048
_TRANSFORMERS_FLOOR = (5, 24)


def check_transformers() -> None:
    """Refuse a transformers release that ignores the ``cache=`` keyword the runner passes.

    Raises:
        ConfigError: transformers is older than 5.24; the message names the upgrade.

    Example:
        >>> check_transformers()
    """
    import transformers
    from packaging.version import Version

    installed = Version(transformers.__version__)
    if installed.release < _TRANSFORMERS_FLOOR:
        floor = ".".join(map(str, _TRANSFORMERS_FLOOR))
        raise ConfigError(
            f"transformers {installed} is installed but the engine needs >= {floor} (it passes the model "
            f"`cache=`, which older releases ignore): pip install 'transformers>={floor},<6'"
        )


class ModelRunner:
    """Runs a transformers causal LM over KV caches built by :mod:`.kv_batch`.

    Args:
        model: A ``transformers`` causal LM (eval mode).

    Example:
        >>> from langgraph_parallelmuse.models.loading import load_model
        >>> runner = ModelRunner(load_model().model)  # doctest: +SKIP
        >>> cache, logits = runner.prefill([1, 2, 3], ())  # doctest: +SKIP
        >>> logits.shape[0], cache.layers[0].keys.shape[-2]  # doctest: +SKIP
        (1, 3)
    """

    def __init__(self, model: Any) -> None:
        check_transformers()
        self.model = model
        self.config = model.config

    def prefill(self, prompt: Sequence[int], cached: Sequence[torch.Tensor], start: int = 0) -> tuple[Any, Any]:
        """Compute the KV of ``prompt[start:]`` after the ``cached`` KV of ``prompt[:start]``.

        Returns:
            The request's batch-1 cache and the logits after its last token (``[1, vocab]``), or
            ``None`` logits when nothing was left to compute.
        """
        cache = kv_batch.new_cache(self.config, cached)
        logits = None
        for begin in range(start, len(prompt), _PREFILL_CHUNK):
            chunk = torch.tensor([list(prompt[begin : begin + _PREFILL_CHUNK])])
            out = self.model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :]
        return cache, logits

    def decode(self, cache: Any, pads: Sequence[int], last_tokens: Sequence[int]) -> torch.Tensor:
        """One decode step of every row; returns the logits of each row's next token (``[rows, vocab]``)."""
        out = self.model(**kv_batch.step_inputs(cache, pads, last_tokens), cache=cache, use_cache=True)
        return out.logits[:, -1, :]
