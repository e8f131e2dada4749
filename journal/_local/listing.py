"""What a journal's directory holds, as ``exactly fsck`` sees it: its
sealed fragments, open fragments, quarantine files, batch-checksum files
and files that do not belong (``list_files``), the commit record file's
bytes (``read_commit_file``) and the quarantine files (``quarantine_files``).
Read only: ``check.py`` decides what is wrong and repairs it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from .._errors import JournalNotFoundError
from ..durable import TEMP_PREFIX
from .files import O_CLOEXEC, O_NOFOLLOW, JournalDir, Quarantined, dir_entries
from .fragment import (
    JOURNAL_FILES,
    QUARANTINE_PREFIX,
    RECORD_SIZE,
    parse_open_name,
    parse_quarantine_name,
    parse_sealed_name,
    parse_sums_name,
)


@dataclass(slots=True)
class Piece:
    """A sealed fragment file as found, before and after repairs."""

    begin: int
    end: int
    base: str
    sha1: bytes
    size: int
    good: bool = True


@dataclass(slots=True)
class Listing:
    sealed: list[Piece] = field(default_factory=list)
    opens: dict[int, str] = field(default_factory=dict)  # begin -> base
    quarantined: list[Quarantined] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    sums: dict[tuple[int, int], str] = field(default_factory=dict)  # (begin, end) -> base


def list_files(jd: JournalDir) -> Listing:
    out = Listing()
    for entry in dir_entries(jd):
        base = entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        parsed = parse_sealed_name(base)
        if parsed is not None and parsed[0] < parsed[1] and entry.is_file(follow_symlinks=False):
            out.sealed.append(Piece(parsed[0], parsed[1], base, parsed[2], st.st_size))
        elif (at := parse_open_name(base)) is not None and entry.is_file(follow_symlinks=False):
            out.opens[at] = base
        elif base.startswith(QUARANTINE_PREFIX):
            q = parse_quarantine_name(base)
            if q is not None and q[0] < q[1]:
                out.quarantined.append(Quarantined(q[0], q[1], entry.path))
        elif (at_end := parse_sums_name(base)) is not None:
            out.sums[at_end] = base
        elif base in JOURNAL_FILES or base.startswith(TEMP_PREFIX):
            pass
        else:
            out.foreign.append(base)
    out.sealed.sort(key=lambda p: (p.begin, p.end))
    out.quarantined.sort(key=lambda q: (q.begin, q.end))
    return out


def read_commit_file(jd: JournalDir) -> bytes | None:
    """The commit record file's bytes (the record, then the open fragment's
    batch checksums), None if there is none."""
    try:
        fd = os.open(jd.commit_path, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, max(RECORD_SIZE, os.fstat(fd).st_size), 0)
    finally:
        os.close(fd)


def quarantine_files(jd: JournalDir) -> Iterator[str]:
    """Paths of the journal's quarantine files, sorted."""
    try:
        names = sorted(e.name for e in os.scandir(jd.path))
    except (FileNotFoundError, NotADirectoryError):
        raise JournalNotFoundError(jd.name) from None
    for name in names:
        if name.startswith(QUARANTINE_PREFIX):
            yield jd.file(name)
