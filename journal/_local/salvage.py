"""The files a repair of ``exactly fsck`` writes (``check.py`` decides
which): an empty marker of offsets lost for good, a sealed fragment
rebuilt from the intact bytes of a damaged one, a durable copy of a
range of bytes; and how a fragment's range splits around damaged runs."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from .._spec import sealed_name
from ..durable import fsync_dir, write_all
from .files import (
    O_CLOEXEC,
    O_NOFOLLOW,
    JournalDir,
    create_temp,
    unused_name,
    write_atomically,
    write_sums,
)
from .fragment import quarantine_name
from .sums import Batch


def marker(jd: JournalDir, begin: int, end: int) -> str:
    """An empty quarantine file that records that ``[begin, end)`` is lost."""
    path = unused_name(jd, quarantine_name(begin, end, "missing"))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o644)
    os.close(fd)
    fsync_dir(jd.path)
    return os.path.basename(path)


def write_sealed(
    jd: JournalDir, begin: int, data: bytes, batches: list[Batch] | None = None
) -> str:
    """A new sealed fragment ``[begin, begin + len(data))`` holding ``data``,
    with the checksums of its ``batches``; its name."""
    end = begin + len(data)
    write_sums(jd, begin, end, batches or [])
    name = sealed_name(begin, end, hashlib.sha1(data, usedforsecurity=False).digest())
    write_atomically(jd, name, data)
    return name


def pieces(begin: int, end: int, bad: list[tuple[int, int]]) -> Iterator[tuple[int, int, bool]]:
    """``[begin, end)`` cut into runs, each damaged (in ``bad``, sorted and
    disjoint) or not."""
    at = begin
    for b, e in bad:
        if b > at:
            yield at, b, False
        yield b, e, True
        at = e
    if at < end:
        yield at, end, False


def copy_to(jd: JournalDir, fd: int, start: int, stop: int, path: str) -> None:
    """Copy bytes ``[start, stop)`` of ``fd`` to a new file at ``path``, durably."""
    out, tmp = create_temp(jd, os.path.basename(path))
    try:
        write_all(out, os.pread(fd, stop - start, start), 0)
        os.fsync(out)
    finally:
        os.close(out)
    os.rename(tmp, path)
    fsync_dir(jd.path)
