"""Files written whole: a crash or a full disk leaves the old file or none, never a cut one.

One mechanism for every file the library writes in one piece: the corpus index, the bench
summaries and plots, ``ask --json`` and ``calibrate --out``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, in_place: bool = True) -> Iterator[Path]:
    """A new file beside ``path`` to write, which replaces ``path`` once the block ends without error.

    A crash or a full disk while writing leaves the old file (or none), never a cut one; the new
    file is removed when the block raises.

    Args:
        path: The file to write.
        in_place: Yield ``path`` itself, to be written in place, when it cannot be replaced
            (``/dev/stdout``, an existing file in a folder the user may not write). With False
            such a path raises ``OSError`` instead: a file that only makes sense whole (a
            database) must not be rewritten over an old one.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "summary.md"
        >>> with replacing(path) as tmp:
        ...     _ = tmp.write_text("| method |")
        >>> path.read_text(), [p.name for p in path.parent.iterdir()]
        ('| method |', ['summary.md'])
    """
    path = Path(path)
    if not in_place:
        yield from _replaced(path)
        return
    # Checked before a link is followed: /dev/stdout links to a pipe's /proc entry, not a file.
    if path.exists() and not path.is_file():
        yield path
        return
    path = path.resolve() if path.is_symlink() else path  # a link's file is replaced, not the link
    if path.exists() and not os.access(path.parent, os.W_OK):
        yield path
        return
    yield from _replaced(path)


def _replaced(path: Path) -> Iterator[Path]:
    # The same suffix: a plot's format is read from it.
    tmp = path.with_name(f".{path.stem}-{uuid.uuid4().hex[:12]}{path.suffix}")
    try:
        yield tmp
        with tmp.open("rb+") as fh:  # on disk before the rename, which a power loss could otherwise outrun
            os.fsync(fh.fileno())
        if path.exists():  # a private file (0600) stays private
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
