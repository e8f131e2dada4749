"""The local store's writer: how one batch of appends becomes durable.

The queue and its thread are ``AppendQueue``'s. For each batch the writer
takes the journal's ``flock`` (so no other process writes in between), writes
the bytes with one ``pwrite`` at the committed end, ``fdatasync``s them,
advances the commit record (with the batch's checksum, journal/_local/sums.py) and
``fdatasync``s it, releases the lock, and then
resolves the futures. Many appends waiting at once thus cost one write and two
syncs, and a future resolves only once its bytes are durable *and* covered by
the commit record that readers go by.

Once its files are open and its view of them current, a batch that leaves
the open fragment short of ``fragment_size`` is one ``run_io`` call
(journal/_local/iobatch.py): take the lock, check that the lock file, the
commit record and the open fragment are as this writer left them, write,
sync, write the checksum and the record, sync, release the lock. That call
gives up the interpreter lock once: while another thread keeps the
interpreter busy, a thread that gave it up may wait the switch interval
(5 ms) to get it back, and the dozen calls of the general path made a
batch take 34-43 ms (about 6 now). Where a check does not hold (another
process wrote, the journal was deleted), the batch goes the general way,
which opens and recovers the files again.

Batches are cut where the open fragment reaches ``fragment_size``; the
fragment is then sealed before the rest of the batch goes to a new one, so a
sealed fragment always ends on an append boundary.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate
from typing import Final

from .._append_queue import AppendQueue, BatchLanded
from .._errors import JournalError
from ..durable import fsync_dir, write_all
from .files import (
    O_CLOEXEC,
    O_NOFOLLOW,
    JournalDir,
    lock_check_ops,
    lock_is_current,
    open_commit,
    open_fragment_path,
    open_lock,
    read_record_area,
    record_ops,
    recover,
    seal,
    settle_batches,
    truncate_garbage,
    write_record,
)
from .fragment import RECORD_SIZE, CommitRecord, area_with
from .iobatch import (
    IO_EXPECT_BYTES,
    IO_EXPECT_SIZE,
    IO_FDATASYNC,
    IO_FLOCK,
    IO_FSTAT,
    IO_PREAD,
    IO_PWRITE,
    Op,
    run_io,
)
from .sums import OpenLog, entry_for

LOG: Final = logging.getLogger("journal")



class JournalWriter(AppendQueue):
    """The append queue and writer thread of one journal in one store."""

    client_kind = "local"

    def __init__(
        self, jd: JournalDir, *, fragment_size: int, on_commit: Callable[[], None]
    ) -> None:
        super().__init__(jd.name, on_commit=on_commit)
        self.jd = jd
        self._fragment_size = fragment_size
        # Touched only by the writer thread (or after it stopped).
        self._lock_fd: int | None = None
        self._commit_fd: int | None = None
        self._open_fd: int | None = None
        self._rec: CommitRecord | None = None
        # The open fragment's batch checksums, in the commit record file.
        self._log: OpenLog | None = None
        # The commit record file's record area as this writer last left it
        # (None: not known, the next batch goes the general way).
        self._area: bytes | None = None

    def forget_after_fork(self) -> None:
        """In a forked child: close inherited descriptors *without* unlocking,
        since ``flock`` locks are shared with the parent's descriptors."""
        for fd in (self._lock_fd, self._commit_fd, self._open_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _release_resources(self) -> None:
        self._close_files()

    def _write_batch(self, data: list[bytes]) -> BatchLanded:
        """Write and commit ``data``'s appends in order: where the first
        landed, how many were committed, and the error that failed the rest
        (None if none failed)."""
        try:
            begin = self._write_current(data)
        except BaseException as err:  # Reported through every future of the batch.
            self._close_files()
            return 0, 0, _wrap(self.jd.name, err)
        if begin is not None:
            return begin, len(data), None
        try:
            self._acquire()
        except BaseException as err:  # Reported through every future of the batch.
            self._close_files()
            return 0, 0, _wrap(self.jd.name, err)
        out = [0, 0]  # where the first landed, how many did
        try:
            room = self._fragment_size - self._committed()
            if room > 0 and sum(map(len, data)) <= room:
                # All of it fits in the open fragment (the common case): the
                # one commit that _commit_in_fragments makes of it.
                out = [self._commit(data), len(data)]
            else:
                self._commit_in_fragments(data, out)
        except BaseException as err:
            # The rest of the batch is not committed; the next batch starts
            # from a full recovery, which cuts whatever was half-written.
            self._close_files()
            return out[0], out[1], _wrap(self.jd.name, err)
        try:
            # Seal eagerly so that a full fragment appears as a sealed file.
            if self._committed() >= self._fragment_size:
                self._seal()
        except OSError as err:
            # The batch is committed; the seal will be retried by the next one.
            LOG.warning("journal %s: sealing a fragment failed: %s", self.jd.name, err)
            self._close_files()
        finally:
            self._release()
        return out[0], out[1], None

    def _write_current(self, data: list[bytes]) -> int | None:
        """The batch in one run_io (see the module docstring), if this
        writer's view is open and the batch leaves the open fragment short
        of ``fragment_size``: where it landed. None if that does not apply, or
        if a check found the view stale (the files are then closed: the
        general way opens and recovers them)."""
        rec, area, log = self._rec, self._area, self._log
        lock_fd, commit_fd, open_fd = self._lock_fd, self._commit_fd, self._open_fd
        if (rec is None or area is None or log is None or lock_fd is None
                or commit_fd is None or open_fd is None):
            return None
        new = CommitRecord(rec.seq + 1, rec.begin, rec.end + sum(map(len, data)))
        if new.end == rec.end or new.end - new.begin >= self._fragment_size:
            return None  # nothing to write, or a seal to follow
        joined = b"".join(data)
        committed = rec.end - rec.begin
        ops: list[Op] = [(IO_FLOCK, lock_fd, fcntl.LOCK_EX)]
        ops += lock_check_ops(self.jd, lock_fd, len(ops))
        ops.append((IO_PREAD, commit_fd, RECORD_SIZE, 0))
        ops.append((IO_EXPECT_BYTES, len(ops) - 1, area))
        ops.append((IO_FSTAT, open_fd))
        ops.append((IO_EXPECT_SIZE, len(ops) - 1, committed))  # no dead writer's garbage
        ops += [(IO_PWRITE, open_fd, joined, committed), (IO_FDATASYNC, open_fd)]
        # The batch's checksum, made durable by the record's own sync.
        entry = entry_for(new.end, joined)
        if entry:
            ops += [(IO_PWRITE, commit_fd, b, pos) for b, pos in log.place(entry)]
        ops += record_ops(commit_fd, new)
        ops.append((IO_FLOCK, lock_fd, fcntl.LOCK_UN))
        if len(run_io(ops)) < len(ops):
            self._close_files()  # A check did not hold (closing drops the lock).
            return None
        self._rec, self._area = new, area_with(area, new)
        return rec.end

    def _commit_in_fragments(self, data: list[bytes], out: list[int]) -> None:
        """Commit ``data`` in as many fragments as it takes, counting in
        ``out`` (where the first landed, how many did) as each commit lands."""
        ends = list(accumulate(map(len, data)))  # ends[i]: the size of data[: i + 1]
        i, n = 0, len(data)
        while i < n:
            if self._committed() >= self._fragment_size:
                self._seal()
            # Fill the open fragment up to fragment_size, at least one
            # append: up to and including the append that reaches it.
            room = self._fragment_size - self._committed()
            j = min(bisect_left(ends, (ends[i - 1] if i else 0) + room, i) + 1, n)
            begin = self._commit(data if i == 0 and j == n else data[i:j])
            if i == 0:
                out[0] = begin
            out[1] = j
            i = j

    def _committed(self) -> int:
        assert self._rec is not None
        return self._rec.end - self._rec.begin

    def _acquire(self) -> None:
        """Take the lock and make sure our view of the files is current."""
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            if not lock_is_current(self.jd, self._lock_fd):
                self._close_files()  # Deleted (and maybe re-created) meanwhile.
        if self._lock_fd is None:
            self._lock_fd = open_lock(self.jd)
        if self._commit_fd is None:
            self._commit_fd = open_commit(self.jd, write=True)
        rec, self._area = read_record_area(self.jd, self._commit_fd)
        if self._rec is not None and rec == self._rec:
            # Nobody committed since our last batch, but a writer that died
            # holding the lock may have left bytes past the end: cut them.
            if self._open_fd is not None:
                truncate_garbage(self._open_fd, rec)
            return
        if self._open_fd is not None:
            os.close(self._open_fd)
            self._open_fd = None
        self._rec, self._open_fd = recover(self.jd, self._commit_fd)
        self._settle_log()
        rec, area = read_record_area(self.jd, self._commit_fd)  # as recovery left it
        self._area = area if rec == self._rec else None

    def _release(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _commit(self, chunk: list[bytes]) -> int:
        """Commit ``chunk`` in the open fragment: where it landed."""
        rec = self._rec
        assert rec is not None and self._commit_fd is not None
        data = b"".join(chunk)
        if data:
            created = self._open_fd is None
            if created:
                self._open_fd = os.open(
                    open_fragment_path(self.jd, rec),
                    os.O_RDWR | os.O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                    0o644,
                )
                # The file may exist already, holding only the uncommitted
                # bytes of a writer that died: cut them.
                truncate_garbage(self._open_fd, rec)
            assert self._open_fd is not None
            write_all(self._open_fd, data, rec.end - rec.begin)
            os.fdatasync(self._open_fd)
            if created:
                fsync_dir(self.jd.path)  # The new file's entry must be durable too.
            self._rec = CommitRecord(rec.seq + 1, rec.begin, rec.end + len(data))
            # The batch's checksum, made durable by the record's own sync.
            entry = entry_for(self._rec.end, data)
            if entry:
                assert self._log is not None
                self._log.add(entry)
            area, self._area = self._area, None  # (unknown if the write fails)
            write_record(self._commit_fd, self._rec)
            self._area = None if area is None else area_with(area, self._rec)
        return rec.end

    def _settle_log(self) -> None:
        assert self._commit_fd is not None and self._rec is not None
        self._log = settle_batches(self._commit_fd, self._rec)

    def _seal(self) -> None:
        assert self._rec is not None and self._commit_fd is not None
        if self._open_fd is None:
            return
        self._area = None  # (the seal writes a record of its own)
        self._rec, self._log = seal(self.jd, self._commit_fd, self._open_fd, self._rec)
        os.close(self._open_fd)
        self._open_fd = None

    def _close_files(self) -> None:
        """Close our descriptors (dropping the lock if held) and forget our view."""
        for attr in ("_open_fd", "_commit_fd", "_lock_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, attr, None)
        self._rec = None
        self._log = None
        self._area = None


def _wrap(journal: str, err: BaseException) -> BaseException:
    if isinstance(err, JournalError):
        return err
    wrapped = JournalError(f"append to {journal!r} failed: {err}")
    wrapped.__cause__ = err
    return wrapped
