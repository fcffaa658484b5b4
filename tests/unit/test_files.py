"""Files written whole: the old file or the new one, never a cut one."""

from __future__ import annotations

import os

import pytest

from langgraph_parallelmuse.files import replacing


def test_a_file_written_whole_keeps_its_mode_and_a_pipe_is_written_in_place(tmp_path):
    # A pipe behind a link (/dev/stdout of `ask --json /dev/stdout | jq`) was followed to its /proc
    # entry, where no file can be made: the write failed. A replaced 0600 file came back 0644.
    private = tmp_path / "result.json"
    private.write_text("old")
    private.chmod(0o600)
    with replacing(private) as tmp:
        tmp.write_text("new")
    assert private.read_text() == "new" and private.stat().st_mode & 0o777 == 0o600
    read, write = os.pipe()
    try:
        with replacing(f"/dev/fd/{write}") as target, open(target, "w") as fh:
            fh.write('{"answer": "Paris"}')
        os.close(write)
        assert os.read(read, 100) == b'{"answer": "Paris"}'
    finally:
        os.close(read)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("old table")
    with pytest.raises(RuntimeError, match="disk full"), replacing(summary) as tmp:
        tmp.write_text("half a ta")
        raise RuntimeError("disk full")
    assert summary.read_text() == "old table"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]


def test_a_whole_only_file_is_never_written_in_place(tmp_path):
    # The corpus index is a database: written into an old file's place it would mix two builds.
    read, write = os.pipe()
    try:
        with pytest.raises(OSError), replacing(f"/dev/fd/{write}", in_place=False) as tmp:
            assert str(tmp) != f"/dev/fd/{write}"  # a temporary beside it, never the pipe itself
            tmp.write_text("index")
    finally:
        os.close(read)
        os.close(write)
