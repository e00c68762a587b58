"""A file replaced whole or not at all: written beside its target, flushed to the disk, renamed
over it, and the directory entry flushed too. A reader, or a process started after a crash at
any instant, sees the old file or the new one, never a torn one."""

from __future__ import annotations

import os
import tempfile


def fsync_directory(path: str) -> None:
    """Flush ``path``'s directory entries (the rename) to the disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` by ``data``, whole or not at all.

    Write a temporary file beside it, fsync, rename over ``path``, fsync the directory: a
    reader (or a process started after a crash) sees the old file or the new one, never half.

    Parameters
    ----------
    path : str or os.PathLike
        The file to replace.
    data : bytes
        Its new content.

    Raises
    ------
    OSError
        The folder cannot be written (the temporary file is removed).

    Examples
    --------
    >>> import os, tempfile
    >>> from mixle_nb.checkpoint import write_atomically
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = os.path.join(folder, "state.bin")
    ...     write_atomically(path, b"first")
    ...     write_atomically(path, b"second")
    ...     print(open(path, "rb").read(), os.listdir(folder))
    b'second' ['state.bin']
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, partial = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        try:
            os.remove(partial)
        except OSError:
            pass
        raise
    fsync_directory(directory)
