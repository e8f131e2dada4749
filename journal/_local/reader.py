"""``LocalJournalReader``: reads a journal of a ``LocalJournalStore`` from its files.

The reader never takes the journal's lock: it goes by the commit record,
which only ever covers bytes already on disk. It keeps one fragment file open
and reads it with ``preadv`` straight into the caller's buffer. An open file
stays readable after the writer renames it (sealing) or retention removes it,
so the only races to handle are at the moment of opening, and they are
retried against a fresh record and listing.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

from .._errors import JournalError, JournalNotFoundError
from .._reader import JUMPED, ReaderBase, warn_jump, warn_quarantined
from .._spec import Fragment
from .._util import check_read_args
from .files import (
    O_CLOEXEC,
    JournalDir,
    Scan,
    open_batches,
    open_commit,
    open_fragment_path,
    quarantined_through,
    read_record,
    read_start,
    read_sums,
    scan,
)
from .fragment import RECORD_SIZE, CommitRecord, damaged_slot, open_name
from .sums import Batch, batch_matches

if TYPE_CHECKING:
    from .transient import TransientListener
    from .watch import Watch, Watcher

# Each retry follows a concurrent seal or removal; more than a few in a row
# would mean the directory keeps changing under us faster than we can look.
_MAX_ATTEMPTS: Final = 100


@dataclass(frozen=True, slots=True)
class StoreServices:
    """What readers need of their store, handed to them by it: its change
    watcher, the check of a fragment file against its name, whether it is
    closed, where to report a damaged commit record, and whether to check
    each batch against its checksum before handing out its bytes."""

    watcher: Watcher
    verify_fragment: Callable[[JournalDir, Fragment, int], None]
    is_closed: Callable[[], bool]
    warn_damaged_record: Callable[[JournalDir, CommitRecord], None]
    verify_checksums: bool = False


@final
class LocalJournalReader(ReaderBase):
    """A reader of one journal of a ``LocalJournalStore``."""

    def __init__(
        self,
        store: StoreServices,
        jd: JournalDir,
        offset: int,
        end_offset: int | None,
        block: bool,
        commit_fd: int,
        watch: Watch | None,
        listing: Scan,
        listener: TransientListener | None = None,
    ) -> None:
        super().__init__(jd.name, offset, end_offset, block)
        self._store = store
        self._jd = jd
        self._commit_fd: int | None = commit_fd
        st = os.fstat(commit_fd)
        self._commit_id = (st.st_dev, st.st_ino)
        self._watch = watch
        self._sealed = listing.sealed
        self._sealed_begins = [f.begin for f in self._sealed]
        self._quarantined = listing.quarantined
        # The fragment file being read: bytes [_fbegin, _flimit) are readable.
        self._fd: int | None = None
        self._fbegin = 0
        self._flimit = 0
        self._fsealed = False
        # With verify_checksums: the batch checksums of that file (None: not
        # read yet), and how many of them were checked.
        self._batches: list[Batch] | None = None
        self._checked = 0
        self._listener = listener

    @property
    def listener(self) -> TransientListener | None:
        """The transient listener this reader yields to (see ``TransientListener.read``)."""
        return self._listener

    def _record(self) -> CommitRecord:
        if self._commit_fd is None:
            raise ValueError(f"I/O operation on a closed reader of {self._journal!r}")
        return read_record(self._jd, self._commit_fd)

    def _fill(self, buf: memoryview) -> int:
        off = self._offset
        hole = -1  # An offset found in no fragment although one before it is kept.
        gone = -1  # The begin of an open fragment whose file was missing.
        for _ in range(_MAX_ATTEMPTS):
            if self._fd is not None and self._fbegin <= off < self._flimit:
                view = buf[: self._flimit - off]
                if self._store.verify_checksums:
                    view = view[: self._verified_end(off, off + len(view)) - off]
                return self._pread(view, off - self._fbegin)
            if self._fd is not None and not self._fsealed and off >= self._fbegin:
                # Reading the open fragment: has its committed end moved?
                rec = self._record()
                if rec.begin == self._fbegin and rec.end > self._flimit:
                    self._flimit = rec.end
                    continue
                if rec.begin == self._fbegin and off >= rec.end:
                    return self._at_end()
            self._close_file()
            rec = self._record()
            if off >= rec.end:
                return self._at_end()
            if off >= rec.begin:
                try:
                    self._open(open_fragment_path(self._jd, rec), rec.begin, rec.end, False)
                    continue
                except FileNotFoundError:
                    # Sealed meanwhile (read below), or about to be recorded
                    # as sealed; if a second look finds the same record and
                    # still no sealed fragment, the file is gone.
                    if self._find_sealed(off) is None:
                        if gone == rec.begin:
                            raise self._jd.corrupt(
                                open_name(rec.begin),
                                f"the open fragment is missing, yet [{rec.begin}, {rec.end})"
                                " is committed",
                                off,
                                rec.end,
                            ) from None
                        gone = rec.begin
                        continue
            frag = self._find_sealed(off)
            if frag is None:
                frag_after = self._next_sealed(off)
                nxt = frag_after.begin if frag_after is not None else rec.begin
                if nxt <= off:
                    continue  # The directory changed under us: look again.
                through = quarantined_through(self._quarantined, off)
                if through > off:
                    # Damaged bytes moved to quarantine (by a repair, or by
                    # a writer that found a damaged commit record).
                    self._offset = min(through, nxt)
                    warn_quarantined(self._journal, off, self._offset, self._quarantined)
                    return JUMPED
                if self._sealed_begins and self._sealed_begins[0] < off:
                    # Retention removes fragments from the start only, so a
                    # gap after a kept fragment is damage (a fragment file
                    # removed by hand), unless this listing raced a trim:
                    # only a second, later listing showing it too is proof.
                    if hole == off:
                        raise self._jd.corrupt(
                            f"{off:016x}-{nxt:016x}",
                            f"no fragment holds offsets [{off}, {nxt}), but earlier ones"
                            " are kept (a fragment file is missing)",
                            off,
                            nxt,
                        )
                    hole = off
                    continue
                # Nothing kept before: retention, up to the recorded start
                # (read after the listing: trim records it before removing).
                start = read_start(self._jd)
                if start is not None and nxt > max(off, start):
                    if off < start:
                        warn_jump(self._journal, off, start)
                        self._offset = start
                        return JUMPED
                    raise self._jd.corrupt(
                        f"{off:016x}-{nxt:016x}",
                        f"no fragment holds offsets [{off}, {nxt}), at or above the journal's"
                        f" recorded start ({start}): a fragment file is missing, not removed"
                        " by retention",
                        off,
                        nxt,
                    )
                warn_jump(self._journal, off, nxt)
                self._offset = nxt
                return JUMPED
            try:
                self._open(frag.path, frag.begin, frag.end, True)
            except FileNotFoundError:
                self._rescan()  # Removed by retention meanwhile.
                continue
            assert self._fd is not None
            self._store.verify_fragment(self._jd, frag, self._fd)
        raise JournalError(
            f"journal {self._journal!r}: offset {off} could not be located"
            f" after {_MAX_ATTEMPTS} attempts (directory changing too fast)"
        )

    def _at_end(self) -> int:
        """No byte is committed at the offset: fine, unless the journal is gone
        (our commit record file is no longer the one at its path)."""
        try:
            st = os.stat(self._jd.commit_path)
            current = (st.st_dev, st.st_ino) == self._commit_id
        except (FileNotFoundError, NotADirectoryError):
            current = False
        if not current:
            raise JournalNotFoundError(self._journal)
        return 0

    def _pread(self, buf: memoryview, pos: int) -> int:
        assert self._fd is not None
        n = os.preadv(self._fd, [buf], pos) if _HAVE_PREADV else _pread_copy(self._fd, buf, pos)
        if n <= 0:
            raise self._jd.corrupt(
                open_name(self._fbegin) if not self._fsealed else f"fragment at {self._fbegin}",
                f"file ends before committed offset {self._fbegin + pos}",
                self._fbegin + pos,
                self._flimit,
            )
        return n

    def _open(self, path: str, begin: int, limit: int, sealed: bool) -> None:
        self._fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
        self._fbegin, self._flimit, self._fsealed = begin, limit, sealed
        self._batches, self._checked = None, 0

    def _verified_end(self, off: int, upto: int) -> int:
        """Check the batches of the file being read that hold bytes of
        ``[off, upto)`` against their checksums (bytes no checksum covers
        pass); the end up to which those bytes may be read: ``upto``, or the
        begin of a damaged batch after ``off``, so that the bytes before the
        damage are read first. Reading inside a damaged batch raises
        ``CorruptJournalError`` with its offsets (``skip_corrupt`` goes on at
        its end, where batches are checked afresh). Batches are checked once
        per opening of the file: reading only moves forward in it."""
        assert self._fd is not None
        batches = self._batches
        if batches is None or (
            not self._fsealed and (not batches or batches[-1].end < upto)
        ):
            # The open fragment's checksums grow with it, in the commit record file.
            batches = self._batches = (
                read_sums(self._jd, self._fbegin, self._flimit)
                if self._fsealed
                else open_batches(self._open_commit(), self._fbegin, self._flimit)
            )
        while self._checked < len(batches) and batches[self._checked].begin < upto:
            b = batches[self._checked]
            if b.end > off and not batch_matches(self._fd, self._fbegin, b):
                if b.begin > off:
                    return b.begin
                raise self._jd.corrupt(
                    open_name(self._fbegin) if not self._fsealed else f"fragment at {self._fbegin}",
                    "a batch of appends does not match its checksum (changed in place;"
                    " exactly fsck --repair moves it to quarantine and keeps the rest)",
                    b.begin,
                    b.end,
                )
            self._checked += 1
        return upto

    def _open_commit(self) -> int:
        if self._commit_fd is None:
            raise ValueError(f"I/O operation on a closed reader of {self._journal!r}")
        return self._commit_fd

    def _find_sealed(self, off: int) -> Fragment | None:
        for rescan in (False, True):
            if rescan:
                self._rescan()
            i = bisect.bisect_right(self._sealed_begins, off) - 1
            if i >= 0 and off < self._sealed[i].end:
                return self._sealed[i]
        return None

    def _next_sealed(self, off: int) -> Fragment | None:
        i = bisect.bisect_right(self._sealed_begins, off)
        return self._sealed[i] if i < len(self._sealed) else None

    def _rescan(self) -> None:
        listing = scan(self._jd)
        self._sealed, self._quarantined = listing.sealed, listing.quarantined
        self._sealed_begins = [f.begin for f in self._sealed]

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _token(self) -> int:
        return self._watch.token() if self._watch is not None else 0

    def _wait(self, token: int) -> bool:
        if self._watch is None or self._store.is_closed():
            return False
        watcher = self._store.watcher
        if self._watch.wd is None:
            watcher.refresh(self._watch)
        return self._watch.wait(token, watcher.interval)

    def _head(self) -> int:
        return self._record().end

    def _yield_to_transient(self) -> bool:
        return self._listener is not None and self._listener.ready(self._offset)

    def _reposition(self) -> None:
        self._close_file()

    def _wake(self) -> None:
        if self._watch is not None:
            self._watch.notify()

    def _release(self) -> None:
        self._close_file()
        if self._commit_fd is not None:
            os.close(self._commit_fd)
            self._commit_fd = None
        if self._watch is not None:
            self._store.watcher.unsubscribe(self._watch)
            self._watch = None


_HAVE_PREADV: Final = hasattr(os, "preadv")


def _pread_copy(fd: int, buf: memoryview, pos: int) -> int:
    data = os.pread(fd, len(buf), pos)
    buf[: len(data)] = data
    return len(data)


def open_reader(
    store: StoreServices,
    jd: JournalDir,
    offset: int,
    end_offset: int | None,
    block: bool,
    listener: TransientListener | None = None,
) -> LocalJournalReader:
    """Check the journal and the arguments, then build a reader.

    A following reader subscribes to change notifications *before* reading
    the record, so that no commit can slip between the two unnoticed."""
    commit_fd = open_commit(jd)
    watch = store.watcher.subscribe(jd.path) if block else None
    try:
        raw = os.pread(commit_fd, RECORD_SIZE, 0)
        rec = read_record(jd, commit_fd)
        offset = check_read_args(jd.name, offset, end_offset, block, rec.end)
        listing = scan(jd)  # Also checks the directory for foreign files.
        if damaged_slot(raw, rec):
            store.warn_damaged_record(jd, rec)
    except BaseException:
        os.close(commit_fd)
        if watch is not None:
            store.watcher.unsubscribe(watch)
        raise
    return LocalJournalReader(
        store, jd, offset, end_offset, block, commit_fd, watch, listing, listener
    )
