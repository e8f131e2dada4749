"""Whether a journal of the embedded store is whole: fragments hold every
committed offset, and each holds what its name and checksums say
(``LocalJournalStore.verify``; ``exactly fsck`` checks more, in ``check``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Final

from .._spec import Fragment
from .files import (
    JournalDir,
    Quarantined,
    fragment_sha1,
    open_batches,
    open_commit,
    read_record,
    read_start,
    read_sums,
    scan,
)
from .fragment import open_name
from .sums import bad_batches

#: Sealed fragments whose SHA-1 a store remembers having checked: at most this many.
_VERIFIED_MAX: Final = 4096


class FragmentChecks:
    """A store's checks of sealed fragment files against their names, and
    which files passed (by identity: device, inode, size, mtime; bounded)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verified: dict[tuple[int, int, int, int], None] = {}

    def check(self, jd: JournalDir, frag: Fragment, fd: int, *, sha1: bool,
              cached: bool) -> None:
        """Raise ``CorruptJournalError`` unless the open file ``fd`` has the
        size ``frag``'s name says and, with ``sha1``, its SHA-1: once per
        file with ``cached``, every time without."""
        st = os.fstat(fd)
        base = os.path.basename(frag.path)
        if st.st_size != frag.size:
            raise jd.corrupt(
                base,
                f"fragment holds {st.st_size} bytes, its name says {frag.size}",
                frag.begin,
                frag.end,
            )
        if not sha1:
            return
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if cached and key in self._verified:
            return
        if fragment_sha1(fd, frag.size) != frag.sha1:
            raise jd.corrupt(
                base,
                "fragment content does not match the SHA-1 in its name",
                frag.begin,
                frag.end,
            )
        with self._lock:
            if len(self._verified) >= _VERIFIED_MAX:
                self._verified.pop(next(iter(self._verified)))
            self._verified[key] = None


#: ``verify_fragment(jd, fragment, fd, cached=...)``: the store's check of
#: a sealed fragment's size and SHA-1 (see ``LocalJournalStore``).
VerifyFragment = Callable[..., None]


def verify_journal(jd: JournalDir, list_fragments: Callable[[], list[Fragment]],
                   verify_fragment: VerifyFragment) -> list[Fragment]:
    """See ``LocalJournalStore.verify``: ``list_fragments`` lists the
    journal's fragments, ``verify_fragment`` checks a sealed one."""
    frags = held_fragments(jd, list_fragments)
    for f in frags:
        try:
            fd = os.open(f.path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # Trimmed or sealed since listed.
        try:
            if f.sealed:
                verify_fragment(jd, f, fd, cached=False)
                batches = read_sums(jd, f.begin, f.end)
            elif os.fstat(fd).st_size < f.size:
                raise jd.corrupt(
                    os.path.basename(f.path), "open fragment is shorter than its committed end"
                )
            else:
                commit_fd = open_commit(jd)
                try:
                    batches = open_batches(commit_fd, f.begin, f.end)
                finally:
                    os.close(commit_fd)
            for b in bad_batches(fd, f.begin, batches)[:1]:
                raise jd.corrupt(
                    os.path.basename(f.path),
                    "a batch of appends does not match its checksum (changed in place)",
                    b.begin,
                    b.end,
                )
        finally:
            os.close(fd)
    return frags



def held_fragments(jd: JournalDir, list_fragments: Callable[[], list[Fragment]]) -> list[Fragment]:
    """The journal's fragments, once sure that they hold every committed
    offset from the first one on: a hole seen twice (a seal or a trim
    may race one listing) raises ``CorruptJournalError``."""
    missing = None
    for _ in range(2):
        frags = list_fragments()
        fd = open_commit(jd)
        try:
            rec = read_record(jd, fd)
        finally:
            os.close(fd)
        missing = first_hole(frags, scan(jd).quarantined, read_start(jd), rec.begin,
                              rec.end)
        if missing is None:
            return frags
    assert missing is not None
    begin, end = missing
    start = read_start(jd)
    if start is not None and not any(f.begin < begin for f in frags):
        raise jd.corrupt(f"{begin:016x}-{end:016x}", f"no fragment holds offsets [{begin},"
                         f" {end}), at or above the journal's recorded start ({start}): a"
                         " fragment file is missing, not removed by retention", begin, end)
    if begin >= rec.begin:
        raise jd.corrupt(open_name(rec.begin), f"the open fragment is missing, yet"
                         f" [{rec.begin}, {rec.end}) is committed", begin, end)
    raise jd.corrupt(f"{begin:016x}-{end:016x}", f"no fragment holds offsets [{begin},"
                     f" {end}), but earlier ones are kept (a fragment file is missing)",
                     begin, end)


def first_hole(
    frags: list[Fragment], quarantined: list[Quarantined],
    start: int | None, open_begin: int, committed_end: int,
) -> tuple[int, int] | None:
    """The first offsets ``[begin, end)`` below ``committed_end`` that no
    fragment nor quarantine file holds, from the recorded ``start`` on
    (None: from the first fragment, or the open fragment's begin); None if
    there is none."""
    pieces = sorted([(f.begin, f.end) for f in frags] + [(q.begin, q.end) for q in quarantined])
    at = min(pieces[0][0], open_begin) if pieces else open_begin
    if start is not None:
        at = start
    for begin, end in pieces:
        if begin > at:
            return (at, min(begin, committed_end)) if at < committed_end else None
        at = max(at, end)
    return (at, committed_end) if at < committed_end else None
