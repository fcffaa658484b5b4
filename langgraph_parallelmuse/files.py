"""Files written whole: a crash or a full disk leaves the old file or none, never a cut one.

One mechanism for every file the library writes in one piece: the corpus index, the bench
summaries and plots, ``ask --json`` and ``calibrate --out``. And one reader of the JSONL files it
is given (a corpus, a questions file), whose errors name the line and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

_STD_STREAMS = frozenset({"/dev/stdin", "/dev/stdout", "/dev/stderr"})
# As many links as Linux follows in one lookup before it gives up (ELOOP).
_MAX_LINKS = 40
# The longest file name, in bytes, of Linux's file systems (NAME_MAX).
_NAME_MAX = 255
# Hex digits of the token that makes a temporary's name unique.
_TOKEN = 12
# What flock() fails with where the file system has no locks.
_NO_FLOCK = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL})
# A writer locks its temporary the moment after it creates it: an unlocked one this recent may be a
# live writer's still, not one a killed process left.
_ABANDONED_AFTER = 60.0


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, in_place: bool = True) -> Iterator[Path]:
    """A new file beside ``path`` to write, which replaces ``path`` once the block ends without error.

    A crash or a full disk while writing leaves the old file (or none), never a cut one; the new
    file is removed when the block raises, and one a killed process left (SIGKILL and SIGTERM skip
    the block's clean-up) is removed by a later write of ``path`` (one a minute old or more).

    Args:
        path: The file to write.
        in_place: Write ``path`` in place when it cannot or must not be replaced: a path under
            ``/proc`` or ``/dev/fd`` (or ``/dev/std*``) or reached through a link there, an existing
            path that is no regular file (``/dev/null``), or an existing file in a folder the user
            may not write, is yielded itself. One of this process's descriptors
            (``/dev/stdout``, ``/dev/fd/3``) gets a temporary, written to the descriptor once the
            block ends without error, after what the process printed to it: reopened, the file
            stdout was redirected to would be emptied. With False such a path raises ``OSError``
            instead: a file that only makes sense whole (a database) must not be rewritten over an
            old one.

    Raises:
        OSError: The new file cannot be written or put in place (its folder is missing or
            read-only, the disk is full); the error names ``path``, not the hidden temporary.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "summary.md"
        >>> with replacing(path) as tmp:
        ...     _ = tmp.write_text("| method |")
        >>> path.read_text(), [p.name for p in path.parent.iterdir()]
        ('| method |', ['summary.md'])
    """
    path = Path(path)
    # Checked before a link is followed: /dev/stdout redirected to a file (`ask --json /dev/stdout
    # >> runs.jsonl`) resolves to that file, whose replacement dropped the lines already in it and
    # everything the process printed.
    special, descriptor = _special(path)
    if not in_place:
        # As root a temporary can be made in /dev, and the rename would replace the device or link.
        if special or (path.exists() and not path.is_file()):
            raise OSError(errno.EINVAL, "not a regular file: it cannot be replaced whole", str(path))
        yield from _replaced(_followed(path), shown=path)
        return
    if descriptor is not None:
        yield from _through_descriptor(path, descriptor)
        return
    if special or (path.exists() and not path.is_file()):
        yield path
        return
    target = _followed(path)
    if target.exists() and not os.access(target.parent, os.W_OK):
        yield target
        return
    yield from _replaced(target, shown=path)


def _followed(path: Path) -> Path:
    """The file a link ``path`` leads to (``path`` itself if it is no link): that file is replaced, not
    the link, which would otherwise become a file of its own and leave its target stale.

    Raises:
        OSError: ``ELOOP``, the links loop (Python before 3.13 raised ``RuntimeError``, which callers
            that catch ``OSError`` let through as a traceback).
    """
    if not path.is_symlink():
        return path
    try:
        return path.resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path)) from None


def _special(path: Path) -> tuple[bool, int | None]:
    """Whether ``path`` names a descriptor (under ``/proc``, ``/dev/fd``, ``/dev/std*``, or through a
    link there), and which of this process's it names (``/dev/stdout``: 1), if any. A regular file
    elsewhere under ``/dev`` (a tmpfs at ``/dev/shm``) is replaced as any other."""
    special = False
    own = {"self", str(os.getpid())}
    for step in _lookup(path):
        parts = step.split("/")  # "/proc/self/fd/1": "", "proc", "self", "fd", "1"
        if len(parts) == 5 and parts[1] == "proc" and parts[2] in own and parts[3] == "fd" and parts[4].isdigit():
            return True, int(parts[4])
        special = special or step.startswith(("/proc/", "/dev/fd/")) or step in _STD_STREAMS
    return special, None


def _lookup(path: Path) -> Iterator[str]:
    """Every path a lookup of ``path`` passes, in order: each component and, for each link among
    them, the components of its target.

    ``Path.resolve()`` gives only the end of the walk, and ``/proc/self/fd/1`` ends at whatever file
    stdout was redirected to, which then looked like an ordinary one.
    """
    parts = list(reversed((str(path) if path.is_absolute() else os.path.join(os.getcwd(), path)).split("/")))
    current, links = "/", 0
    while parts:
        part = parts.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        yield step
        target = _link(step) if links < _MAX_LINKS else None
        if target is None:
            current = step
            continue
        links += 1  # a loop of links ends here; resolve() then reports it as it did
        parts.extend(reversed(target.split("/")))
        if target.startswith("/"):
            current = "/"


def _link(path: str) -> str | None:
    """Where the link ``path`` points; None for anything else (a file, a folder, nothing there)."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def _through_descriptor(path: Path, fd: int) -> Iterator[Path]:
    # Written through the descriptor itself, the output lands where the process's own prints do:
    # after them, and before what it prints next. The same suffix: a plot's format is read from it.
    handle, name = tempfile.mkstemp(prefix="parallelmuse-", suffix=path.suffix)
    os.close(handle)
    tmp = Path(name)
    try:
        yield tmp
        data = memoryview(tmp.read_bytes())
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(AttributeError, OSError, ValueError):  # closed, or no descriptor
                if stream.fileno() == fd:
                    stream.flush()  # what it printed first comes first
        while data:
            data = data[os.write(fd, data) :]
    finally:
        tmp.unlink(missing_ok=True)


def _temporary_prefix(path: Path) -> str:
    """The start of the hidden names of ``path``'s temporaries, each ``prefix + token + suffix`` with room
    for the token within the file system's limit on a name."""
    # The same suffix: a plot's format is read from it. The stem gives way: a name near the limit
    # (one that could be written directly) had no room left for the token, and failed ENAMETOOLONG.
    stem = path.stem
    while stem and len(os.fsencode(f".{stem}-{'0' * _TOKEN}{path.suffix}")) > _NAME_MAX:
        stem = stem[:-1]
    return f".{stem}-"


def _locked(tmp: Path) -> int:
    """Create the empty temporary ``tmp``; return a descriptor that holds its lock while it is written.

    The lock, which dies with the process however it ends, tells :func:`_remove_abandoned` which
    temporaries are still being written.
    """
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        # A file system without flock (Lustre mounted without it, some FUSE and network mounts): the
        # file is written unlocked, as before locks, and no later write can lock it to remove it.
        if exc.errno not in _NO_FLOCK:
            os.close(fd)
            raise
    return fd


def _remove_abandoned(path: Path) -> None:
    """Remove the temporaries of ``path`` that killed writers left: no process holds their lock.

    Each was as large as the file (a corpus index's: gigabytes), and every run killed while writing
    (a job's time limit, ``timeout``) left one more, hidden.
    """
    name = re.compile(re.escape(_temporary_prefix(path)) + f"[0-9a-f]{{{_TOKEN}}}" + re.escape(path.suffix))
    try:
        with os.scandir(path.parent) as entries:
            found = [Path(e.path) for e in entries if name.fullmatch(e.name)]
    except OSError:  # a missing or unreadable folder: writing in it says so
        return
    for stale in found:
        # Gone already, or held: a live writer's (BlockingIOError), left as it is.
        with contextlib.suppress(OSError), _opened(stale) as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if time.time() - os.fstat(fh.fileno()).st_mtime > _ABANDONED_AFTER:
                stale.unlink()


def _opened(path: Path) -> BinaryIO:
    """``path`` opened for writing (NFS emulates flock with fcntl locks, whose exclusive lock needs it),
    else for reading: a temporary left read-only (killed after taking a read-only target's mode) can
    still be locked locally, and removing it needs only the folder's permission."""
    try:
        return path.open("rb+")
    except PermissionError:
        return path.open("rb")


def _replaced(path: Path, *, shown: Path) -> Iterator[Path]:
    """Yield a temporary beside ``path`` that replaces it once the block ends without error.

    Args:
        path: The file to replace (a link's target).
        shown: The path the caller gave, which an error names.

    Raises:
        OSError: Writing, syncing or renaming failed (a folder missing or read-only); an error on
            the temporary names ``shown`` instead, a name the user never saw.
    """
    _remove_abandoned(path)
    tmp = path.with_name(f"{_temporary_prefix(path)}{uuid.uuid4().hex[:_TOKEN]}{path.suffix}")
    lock = None
    try:
        lock = _locked(tmp)
        yield tmp
        with tmp.open("rb+") as fh:  # on disk before the rename, which a power loss could otherwise outrun
            os.fsync(fh.fileno())
        if path.exists():  # a private file (0600) stays private
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
        _remove_abandoned(path)  # those too recent to remove before a long write (an index's build)
    except OSError as exc:
        # Only an error about the temporary is renamed: the block's own errors on other files stay.
        # A new one of the same type and errno: the rename's also names path (filename2), which
        # next to the path itself would read as a move of a file onto itself.
        if not isinstance(exc.filename, (str, os.PathLike)) or os.fspath(exc.filename) != str(tmp):
            raise
        raise type(exc)(exc.errno, exc.strerror, str(shown)).with_traceback(exc.__traceback__) from None
    finally:
        tmp.unlink(missing_ok=True)
        if lock is not None:
            os.close(lock)


def jsonl_objects(
    path: Path, *, fields: str, error: Callable[[str], Exception]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON object on each line of the JSONL file ``path`` that is not blank, with its line number.

    A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (a file saved with old Mac line ends was one
    line, reported as json's "Extra data"), never at the U+2028 or U+0085 a JSON string may hold,
    nor at a ``\\r`` inside a line that is JSON whole (whitespace between its values). A UTF-8 byte
    order mark at the start of the file (Notepad, Excel) is skipped.

    Args:
        path: The file; a pipe (a FIFO, ``/dev/stdin``) is read too.
        fields: What each object holds, as an error names it (``'"id", "title" and "text"'``).
        error: Makes the exception raised for a line that is not UTF-8, not JSON or no object from
            its message (``"path:line: problem: fix"``).

    Raises:
        OSError: ``path`` cannot be read.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "rows.jsonl"
        >>> _ = path.write_bytes(b'{"id": 1}\\r\\r{"id": 2}\\r')
        >>> list(jsonl_objects(path, fields='"id"', error=ValueError))
        [(1, {'id': 1}), (3, {'id': 2})]
    """
    # surrogateescape: a byte that is not UTF-8 is reported with its line, not as a bare decode error.
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="\n") as handle:
        for lineno, raw in _lines(handle):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            value = _json_line(raw, where, error)
            if not isinstance(value, dict):
                # A JSON array of the objects is the usual slip (a JSON file given for a JSONL one).
                fix = ": write each object on a line of its own, not in an array" if isinstance(value, list) else ""
                raise error(f"{where}: expected an object of {fields}, got {type(value).__name__}{fix}")
            yield lineno, value


def _lines(handle: Iterable[str]) -> Iterator[tuple[int, str]]:
    """The lines of ``handle`` (split at ``\\n`` only) with their numbers, a lone ``\\r`` ending one too
    unless the line it is in is JSON whole; numbered as an editor shows them, every ``\\r`` a line end."""
    lineno = 0
    for physical in handle:
        line = physical.removesuffix("\n").removesuffix("\r")
        parts = line.split("\r")
        # JSON reads a CR between values as whitespace: split at universal newlines, a valid line
        # ('{"id": "d1",\r "title": ...}', a pretty-printed row with its LFs taken out) was refused.
        if len(parts) > 1 and _is_json(line):
            yield lineno + 1, line
        else:
            yield from enumerate(parts, start=lineno + 1)
        lineno += len(parts)


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _json_line(line: str, where: str, error: Callable[[str], Exception]) -> object:
    """The value of one line of a JSONL file, named ``where`` in the error raised when it has none."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:  # an undecodable byte, read with surrogateescape
        raise error(
            f"{where}: not UTF-8 text (an undecodable byte at column {exc.start + 1}): save the file as UTF-8"
        ) from None
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:  # "Unterminated string starting at" read "... at at column 5"
        # A line of "{" or "[" alone starts JSON written over several lines (pretty-printed).
        fix = ": write each object on a line of its own (JSON Lines)" if line.strip() in ("{", "[") else ""
        raise error(f"{where}: not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno}){fix}") from None
    except (ValueError, RecursionError):  # a number of over 4,300 digits, arrays nested thousands deep
        raise error(
            f"{where}: JSON this reader refuses (a number too long or values nested too deep): "
            "write the number as a string, or flatten the nesting"
        ) from None
