"""Files written whole: the old file or the new one, never a cut one."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from langgraph_parallelmuse.files import jsonl_objects, replacing


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


def test_a_redirected_stdout_gets_the_output_after_what_was_printed(tmp_path):
    # `ask --json /dev/stdout >> runs.jsonl`: /dev/stdout resolved to runs.jsonl, which was replaced
    # (the earlier runs' lines and what the process printed were gone); reopened with "w" it would be
    # emptied. The descriptor is written: after what it holds, before what is printed next.
    for opening in (os.O_APPEND, os.O_TRUNC):  # `>>` and `>`
        runs = tmp_path / f"runs-{opening}.jsonl"
        runs.write_text('{"run": 1}\n')
        fd = os.open(runs, os.O_WRONLY | opening)
        try:
            os.write(fd, b"printed before\n")
            with replacing(f"/dev/fd/{fd}") as tmp:
                tmp.write_text('{"run": 2}\n')
            os.write(fd, b"printed after\n")
        finally:
            os.close(fd)
        kept = '{"run": 1}\n' if opening == os.O_APPEND else ""
        assert runs.read_text() == kept + 'printed before\n{"run": 2}\nprinted after\n', opening


def test_a_link_on_the_way_to_a_descriptor_is_followed_and_nothing_is_written_on_failure(tmp_path, monkeypatch):
    # resolve() sees only the end of the walk: a link to /dev/stdout, or through a folder linked
    # to /proc/self/fd, ended at the redirected file, which was replaced.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporaries"))
    (tmp_path / "temporaries").mkdir()
    out = tmp_path / "out.txt"
    out.write_text("earlier\n")
    fd = os.open(out, os.O_WRONLY | os.O_APPEND)
    try:
        (tmp_path / "to-fd").symlink_to(f"/dev/fd/{fd}")
        (tmp_path / "fds").symlink_to("/proc/self/fd")
        for path in (tmp_path / "to-fd", tmp_path / "fds" / str(fd)):
            with replacing(path) as tmp:
                tmp.write_text(f"via {path.name}\n")
        with pytest.raises(RuntimeError, match="disk full"), replacing(tmp_path / "to-fd") as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    finally:
        os.close(fd)
    assert out.read_text() == f"earlier\nvia to-fd\nvia {fd}\n"
    assert list((tmp_path / "temporaries").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fds", "out.txt", "temporaries", "to-fd"]


def test_a_link_to_an_ordinary_file_still_replaces_that_file(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with replacing(link) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


@pytest.mark.skipif(not Path("/dev/shm").is_dir() or not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
def test_a_regular_file_under_dev_shm_is_replaced_whole_as_any_other():
    # Only descriptor paths are special: a corpus cache kept on tmpfs (/dev/shm) was refused with
    # in_place=False, and written in place (not whole) otherwise.
    folder = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        target = folder / "index.sqlite"
        with replacing(target, in_place=False) as tmp:
            assert tmp != target
            tmp.write_text("new")
        assert target.read_text() == "new"
        with replacing(folder / "summary.md") as tmp:
            assert tmp != folder / "summary.md"
            tmp.write_text("| method |")
        assert sorted(p.name for p in folder.iterdir()) == ["index.sqlite", "summary.md"]
    finally:
        shutil.rmtree(folder)


def test_a_device_is_never_replaced_whole():
    with pytest.raises(OSError, match="not a regular file"), replacing("/dev/null", in_place=False):
        pass


@pytest.mark.parametrize("stem", ["n" * 250, "名" * 80], ids=["250 ASCII characters", "240 bytes of UTF-8"])
def test_a_name_near_the_file_systems_limit_is_replaced_whole(tmp_path, stem):
    # The temporary beside it added 14 characters to the name: past 255 bytes, ENAMETOOLONG for a
    # name that an ordinary open() writes.
    path = tmp_path / f"{stem}.png"
    path.write_bytes(b"old")
    with replacing(path) as tmp:
        assert tmp.suffix == ".png"
        tmp.write_bytes(b"new")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_link_to_a_whole_only_file_replaces_that_file_and_keeps_the_link(tmp_path):
    # Before: in_place=False (the corpus index) replaced the link itself with a file of its own, so
    # the index on the disk the link pointed to stayed stale and the next build was on the wrong disk.
    (tmp_path / "disk").mkdir()
    real = tmp_path / "disk" / "index.sqlite"
    real.write_text("old")
    link = tmp_path / "index.sqlite"
    link.symlink_to("disk/index.sqlite")
    with replacing(link, in_place=False) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.parametrize("in_place", [True, False])
def test_a_loop_of_links_is_an_oserror(tmp_path, in_place):
    # Before: pathlib's RuntimeError("Symlink loop"), which `ask --json`'s except OSError let through.
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match="symbolic links"):
        with replacing(tmp_path / "a", in_place=in_place) as tmp:
            tmp.write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


@pytest.mark.parametrize("in_place", [True, False])
def test_a_missing_folder_is_named_by_the_users_path_not_the_temporary(tmp_path, in_place):
    # Before: "No such file or directory: '.../missing/.x-ed729ccdbbc8.txt'", a name never given.
    path = tmp_path / "missing" / "x.txt"
    with pytest.raises(FileNotFoundError) as excinfo:
        with replacing(path, in_place=in_place) as tmp:
            tmp.write_text("x")
    assert excinfo.value.filename == str(path) and excinfo.value.errno == errno.ENOENT
    assert str(excinfo.value).endswith(f": {str(path)!r}")


def test_a_read_only_folder_is_named_by_the_users_path_not_the_temporary(tmp_path, monkeypatch):
    # Root may write in any folder: the refusal a read-only one gives is made here, on the temporary.
    path = tmp_path / "x.txt"
    real_open = Path.open

    def refuse(self, *args, **kwargs):
        if self.name.startswith(".x-"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(PermissionError) as excinfo:
        with replacing(path) as tmp:
            tmp.write_text("x")
    assert excinfo.value.filename == str(path) and ".x-" not in str(excinfo.value)
    assert list(tmp_path.iterdir()) == []


def test_an_error_on_another_file_in_the_block_is_left_as_it_is(tmp_path):
    other = tmp_path / "missing" / "input.txt"
    with pytest.raises(FileNotFoundError) as excinfo:
        with replacing(tmp_path / "x.txt"):
            other.read_text()
    assert excinfo.value.filename == str(other)


_KILLED_WRITER = """
import os, signal, sys
from langgraph_parallelmuse.files import replacing
with replacing(sys.argv[1]) as tmp:
    tmp.write_text("half a summ")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_temporaries_killed_writers_left_are_removed_by_the_next_write(tmp_path):
    # SIGKILL and SIGTERM (a job's time limit, `timeout`) skip the block's clean-up: every write
    # killed left its hidden temporary for good, a corpus index's as large as the index.
    path = tmp_path / "summary.json"
    for _ in range(3):
        killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
        assert killed.returncode == -signal.SIGKILL
    left = sorted(tmp_path.iterdir())
    assert len(left) == 3 and not path.exists()
    hour_ago = time.time() - 3600
    for stale in left[:2]:
        os.utime(stale, (hour_ago, hour_ago))
    with replacing(path) as tmp:
        tmp.write_text('{"answer": "Paris"}')
        os.utime(tmp, (hour_ago, hour_ago))
        with replacing(path) as other:  # another writer's temporary is left alone, however old
            other.write_text("{}")
        assert tmp.exists()
    assert path.read_text() == '{"answer": "Paris"}'
    # A temporary this recent may be one a writer has created and not locked yet: it stays for now.
    assert sorted(tmp_path.iterdir()) == sorted([path, left[2]])


@pytest.mark.parametrize("error", [errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK])
def test_a_file_system_without_flock_is_written_unlocked(tmp_path, monkeypatch, error):
    """This session's lock on the temporary failed every write (``ask --json``, the bench summaries)
    where the file system has no flock (Lustre mounted without it, some FUSE mounts)."""
    import fcntl

    def no_flock(fd, operation):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    path = tmp_path / "summary.json"
    with replacing(path) as tmp:
        tmp.write_text("{}")
    assert path.read_text() == "{}" and sorted(tmp_path.iterdir()) == [path]


def test_a_read_only_temporary_a_killed_writer_left_is_removed_too(tmp_path, monkeypatch):
    """Opened only for writing, a temporary left read-only (killed after taking a read-only target's mode)
    could not be locked by a user other than root, and stayed for good."""
    from pathlib import Path

    path = tmp_path / "summary.json"
    orphan = tmp_path / ".summary-0123456789ab.json"
    orphan.write_text("{")
    hour_ago = time.time() - 3600
    os.utime(orphan, (hour_ago, hour_ago))
    opened = Path.open

    def as_a_user(self, mode="r", *args, **kwargs):
        if self == orphan and "+" in mode:  # what a user (not root) gets for a 0444 file
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return opened(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", as_a_user)
    with replacing(path) as tmp:
        tmp.write_text("{}")
    assert sorted(tmp_path.iterdir()) == [path]


def test_jsonl_lines_end_at_cr_lf_or_crlf_and_never_inside_a_string(tmp_path: Path) -> None:
    # Before, the corpus reader split at "\n" only: a file with old Mac line ends ("\r") was one line,
    # "not valid JSON (Extra data)". U+2028 and U+0085, which str.splitlines splits at, are text here.
    path = tmp_path / "rows.jsonl"
    path.write_bytes('\ufeff{"a": "x\u2028y\u0085z"}\r{"a": 2}\r\n\r\n{"a": 3}\n{"a": 4}'.encode())
    assert list(jsonl_objects(path, fields='"a"', error=ValueError)) == [
        (1, {"a": "x\u2028y\u0085z"}),
        (2, {"a": 2}),
        (4, {"a": 3}),
        (5, {"a": 4}),
    ]
    path.write_bytes(b'{"a": 1}\r{"a": 2,\r{"a": 3}')
    with pytest.raises(RuntimeError, match=r"rows\.jsonl:2: not valid JSON \(Expecting property name .* at column 9\)"):
        list(jsonl_objects(path, fields='"a"', error=RuntimeError))
    path.write_bytes(b'{"a": 1}\r{"a": "\xff"}')
    with pytest.raises(RuntimeError, match=r"rows\.jsonl:2: not UTF-8 text \(an undecodable byte at column 8\)"):
        list(jsonl_objects(path, fields='"a"', error=RuntimeError))


def test_a_cr_between_the_values_of_a_jsonl_line_is_whitespace_not_a_line_end(tmp_path: Path) -> None:
    # JSON reads a CR between values as whitespace, and the corpus reader (split at "\n") read such a
    # line; split at every CR, the line was refused: "rows.jsonl:1: not valid JSON (Expecting property
    # name ... at column 10)". A CR that ends lines (old Mac) is still a line end, numbered as before.
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1,\r "b": 2}\r\n{"a": 3}\n{"a": 4}\r{"a": 5}\r{"a": 6,\r')
    with pytest.raises(RuntimeError, match=r"rows\.jsonl:6: not valid JSON \(Expecting property name"):
        list(jsonl_objects(path, fields='"a"', error=RuntimeError))
    path.write_bytes(b'{"a": 1,\r "b": 2}\r\n{"a": 3}\n{"a": 4}\r{"a": 5}\r')
    assert list(jsonl_objects(path, fields='"a"', error=ValueError)) == [
        (1, {"a": 1, "b": 2}),
        (3, {"a": 3}),
        (4, {"a": 4}),
        (5, {"a": 5}),
    ]
