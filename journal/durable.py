"""Durable small-file writes: what the embedded store's metadata files,
``IntentLog`` and ``JSONFileStore`` need to survive a crash.

``write_durably`` replaces a file whole or not at all (a temporary file
beside it, fsync, rename, directory fsync); ``fsync_dir`` makes a
directory's entries durable. Temporary files are named ``@tmp-<base>-<random>``:
``@`` is outside the journal-name alphabet, and the embedded store knows
such leftovers of a crash for what they are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from typing import Final

#: The name prefix of temporary files.
TEMP_PREFIX: Final = "@tmp-"

_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CREATE_NEW: Final = os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW

__all__ = ["write_durably", "write_all", "fsync_dir", "overwrite_synced"]


def write_durably(
    path: str | os.PathLike[str], data: bytes | memoryview, *, create_dirs: bool = True
) -> None:
    """Replace the file ``path`` with ``data``, whole or not at all, durably.

    A temporary file beside it (created exclusively, under an unpredictable
    name) is written and fsync'd, renamed over ``path``, and the directory
    fsync'd where the file system can (see ``fsync_dir``). A crash leaves
    the old file or the new one, never a mix; when this returns, the new
    one survives a crash. With ``create_dirs``, missing parent directories
    are made first.
    """
    directory, base = os.path.split(os.path.abspath(os.fspath(path)))
    if create_dirs:
        os.makedirs(directory, exist_ok=True)
    fd, tmp = create_temp_in(directory, base)
    try:
        try:
            write_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(directory, base))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def create_temp_in(directory: str, base: str) -> tuple[int, str]:
    """A new file in ``directory`` for a temporary copy of ``base``: opened
    for writing, created exclusively under an unpredictable name (a file or
    link planted at a guessable name is never followed nor truncated)."""
    while True:
        tmp = os.path.join(directory, f"{TEMP_PREFIX}{base}-{secrets.token_hex(8)}")
        try:
            return os.open(tmp, _O_CREATE_NEW | os.O_WRONLY, 0o644), tmp
        except FileExistsError:
            continue


def write_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    """``pwrite`` all of ``data`` at ``pos`` (a write may be short)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (creations, renames, removals) durable.
    On a file system that cannot fsync a directory (it says EINVAL or
    ENOTSUP), there is nothing more to do and this returns quietly."""
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as err:
        # Some file systems cannot fsync a directory; nothing more to do there.
        if err.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def overwrite_synced(fd: int, path: str | os.PathLike[str], data: bytes) -> bool:
    """Write ``data`` at the start of the open file ``fd`` and ``fdatasync``
    it, if ``fd`` is still the file at ``path``; whether it was (nothing is
    written where it is not: the file was removed or replaced, and the
    caller opens it again).

    For a small file rewritten in place again and again (``IntentLog``):
    it never shrinks, so once it has reached its size an ``fdatasync``
    writes only its bytes, no metadata. The checks, the write and the sync
    are one call that releases the interpreter lock once (see
    ``journal/_local/iobatch.py``): a thread that gives the lock up while
    another keeps the interpreter busy may wait the switch interval to get
    it back, each time.
    """
    # Imported here: iobatch itself uses this module (write_all).
    from ._local.iobatch import IO_FDATASYNC, IO_PWRITE, run_io, same_file_ops

    ops = [*same_file_ops(os.fspath(path), fd, 0), (IO_PWRITE, fd, data, 0), (IO_FDATASYNC, fd)]
    return len(run_io(ops)) == len(ops)
