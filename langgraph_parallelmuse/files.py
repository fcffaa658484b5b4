"""Files written whole: a crash or a full disk leaves the old file or none, never a cut one.

One mechanism for every file the library writes in one piece: the corpus index, the bench
summaries and plots, ``ask --json`` and ``calibrate --out``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

_STD_STREAMS = frozenset({"/dev/stdin", "/dev/stdout", "/dev/stderr"})
# As many links as Linux follows in one lookup before it gives up (ELOOP).
_MAX_LINKS = 40
# The longest file name, in bytes, of Linux's file systems (NAME_MAX).
_NAME_MAX = 255


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, in_place: bool = True) -> Iterator[Path]:
    """A new file beside ``path`` to write, which replaces ``path`` once the block ends without error.

    A crash or a full disk while writing leaves the old file (or none), never a cut one; the new
    file is removed when the block raises.

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


def _temporary_name(path: Path) -> str:
    """A hidden name beside ``path`` for its new file, within the file system's limit on a name."""
    # The same suffix: a plot's format is read from it. The stem gives way: a name near the limit
    # (one that could be written directly) had no room left for the token, and failed ENAMETOOLONG.
    token, stem = uuid.uuid4().hex[:12], path.stem
    while stem and len(os.fsencode(f".{stem}-{token}{path.suffix}")) > _NAME_MAX:
        stem = stem[:-1]
    return f".{stem}-{token}{path.suffix}"


def _replaced(path: Path, *, shown: Path) -> Iterator[Path]:
    """Yield a temporary beside ``path`` that replaces it once the block ends without error.

    Args:
        path: The file to replace (a link's target).
        shown: The path the caller gave, which an error names.

    Raises:
        OSError: Writing, syncing or renaming failed (a folder missing or read-only); an error on
            the temporary names ``shown`` instead, a name the user never saw.
    """
    tmp = path.with_name(_temporary_name(path))
    try:
        yield tmp
        with tmp.open("rb+") as fh:  # on disk before the rename, which a power loss could otherwise outrun
            os.fsync(fh.fileno())
        if path.exists():  # a private file (0600) stays private
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        # Only an error about the temporary is renamed: the block's own errors on other files stay.
        # A new one of the same type and errno: the rename's also names path (filename2), which
        # next to the path itself would read as a move of a file onto itself.
        if not isinstance(exc.filename, (str, os.PathLike)) or os.fspath(exc.filename) != str(tmp):
            raise
        raise type(exc)(exc.errno, exc.strerror, str(shown)).with_traceback(exc.__traceback__) from None
    finally:
        tmp.unlink(missing_ok=True)
