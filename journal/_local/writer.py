"""The local store's writer: how one batch of appends becomes durable.

The queue and its thread are ``AppendQueue``'s. For each batch the writer
takes the journal's ``flock`` (so no other process writes in between), writes
the bytes with one ``pwrite`` at the committed end, ``fdatasync``s them,
advances the commit record (with the batch's checksum, journal/_local/sums.py) and
``fdatasync``s it, releases the lock, and then
resolves the futures. Many appends waiting at once thus cost one write and two
syncs, and a future resolves only once its bytes are durable *and* covered by
the commit record that readers go by.

Once its files are open, a batch is two ``run_io`` calls
(journal/_local/iobatch.py): one takes the lock, checks that it is still the
journal's and reads the commit record; the other writes, syncs, writes the
checksum and the record, syncs and (unless the fragment is to be sealed)
releases the lock. Each call gives up the interpreter lock once: while
another thread keeps the interpreter busy, getting it back can take the
switch interval (5 ms), and a dozen separate calls made a batch take
35-45 ms instead of about 11.

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

from .._append_queue import AppendQueue, batch_results
from .._errors import JournalError
from .._spec import AppendResult
from ..durable import fsync_dir
from .files import (
    O_CLOEXEC,
    O_NOFOLLOW,
    JournalDir,
    is_same_file,
    lock_check_ops,
    lock_is_current,
    open_commit,
    open_fragment_path,
    open_lock,
    read_record,
    record_ops,
    recover,
    seal,
    settle_batches,
    truncate_garbage,
)
from .fragment import RECORD_SIZE, CommitRecord, parse_record
from .iobatch import IO_FDATASYNC, IO_FLOCK, IO_FSTAT, IO_PREAD, IO_PWRITE, Op, run_io
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
        self._locked = False  # Whether we hold the journal's flock now.

    def forget_after_fork(self) -> None:
        """In a forked child: close inherited descriptors *without* unlocking,
        since ``flock`` locks are shared with the parent's descriptors."""
        for fd in (self._lock_fd, self._commit_fd, self._open_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _release_resources(self) -> None:
        self._close_files()

    def _write_batch(self, data: list[bytes]) -> tuple[list[AppendResult], BaseException | None]:
        """Write and commit ``data``'s appends in order: the results of those
        committed, and the error that failed the rest (None if none failed)."""
        out: list[AppendResult] = []
        try:
            self._acquire()
            self._locked = True
        except BaseException as err:  # Reported through every future of the batch.
            self._close_files()
            return out, _wrap(self.jd.name, err)
        try:
            room = self._fragment_size - self._committed()
            if room > 0 and sum(map(len, data)) <= room:
                # All of it fits in the open fragment (the common case): the
                # one commit that _commit_in_fragments makes of it, which
                # releases the lock too unless the fragment is to be sealed.
                out = self._commit(data, last=True)
            else:
                self._commit_in_fragments(data, out)
        except BaseException as err:
            # The rest of the batch is not committed; the next batch starts
            # from a full recovery, which cuts whatever was half-written.
            self._close_files()
            return out, _wrap(self.jd.name, err)
        try:
            # Seal eagerly so that a full fragment appears as a sealed file.
            if self._full(self._rec):
                self._seal()
        except OSError as err:
            # The batch is committed; the seal will be retried by the next one.
            LOG.warning("journal %s: sealing a fragment failed: %s", self.jd.name, err)
            self._close_files()
        finally:
            self._release()
        return out, None

    def _commit_in_fragments(self, data: list[bytes], out: list[AppendResult]) -> None:
        """Commit ``data`` in as many fragments as it takes, adding the
        results to ``out`` as each commit lands."""
        ends = list(accumulate(map(len, data)))  # ends[i]: the size of data[: i + 1]
        i, n = 0, len(data)
        while i < n:
            if self._full(self._rec):
                self._seal()
            # Fill the open fragment up to fragment_size, at least one
            # append: up to and including the append that reaches it.
            room = self._fragment_size - self._committed()
            j = min(bisect_left(ends, (ends[i - 1] if i else 0) + room, i) + 1, n)
            out.extend(self._commit(data if i == 0 and j == n else data[i:j]))
            i = j

    def _committed(self) -> int:
        assert self._rec is not None
        return self._rec.end - self._rec.begin

    def _full(self, rec: CommitRecord | None) -> bool:
        """Whether the open fragment of ``rec`` is to be sealed."""
        assert rec is not None
        return rec.end - rec.begin >= self._fragment_size

    def _acquire(self) -> None:
        """Take the lock and make sure our view of the files is current."""
        if self._lock_fd is not None and self._commit_fd is not None and self._rec is not None:
            # The common case, in one run_io (see journal/_local/iobatch.py):
            # lock, check the lock, read the record, size the open fragment.
            ops = [(IO_FLOCK, self._lock_fd, fcntl.LOCK_EX),
                   *lock_check_ops(self.jd, self._lock_fd),
                   (IO_PREAD, self._commit_fd, RECORD_SIZE, 0)]
            if self._open_fd is not None:
                ops.append((IO_FSTAT, self._open_fd))
            got = run_io(ops)
            if not is_same_file(got[1], got[2]):
                self._close_files()  # Deleted (and maybe re-created) meanwhile.
            elif parse_record(got[3]) == self._rec:
                # Nobody committed since our last batch, but a writer that
                # died holding the lock may have left bytes past the end.
                if self._open_fd is not None:
                    truncate_garbage(self._open_fd, self._rec, got[4][2])
                return
            # Else someone else committed: recover below (the lock is held).
        elif self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            if not lock_is_current(self.jd, self._lock_fd):
                self._close_files()  # Deleted (and maybe re-created) meanwhile.
        if self._lock_fd is None:
            self._lock_fd = open_lock(self.jd)
        if self._commit_fd is None:
            self._commit_fd = open_commit(self.jd, write=True)
        rec = read_record(self.jd, self._commit_fd)
        if self._rec is not None and rec == self._rec:
            # As above, for a view kept without its record file open.
            if self._open_fd is not None:
                truncate_garbage(self._open_fd, rec)
            return
        if self._open_fd is not None:
            os.close(self._open_fd)
            self._open_fd = None
        self._rec, self._open_fd = recover(self.jd, self._commit_fd)
        self._settle_log()

    def _release(self) -> None:
        if self._lock_fd is not None and self._locked:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._locked = False

    def _commit(self, chunk: list[bytes], *, last: bool = False) -> list[AppendResult]:
        """Commit ``chunk`` to the open fragment; ``last``: nothing else is
        to be done under the lock but a seal, so release it in the same
        run_io unless the fragment is to be sealed now."""
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
            new = CommitRecord(rec.seq + 1, rec.begin, rec.end + len(data))
            # The batch's checksum, made durable by the record's own sync.
            entry = entry_for(new.end, data)
            # The bytes, synced; then the checksum and the record, synced:
            # in one run_io (see journal/_local/iobatch.py), unless a new
            # file's entry in the directory must be synced in between.
            ops: list[Op] = [(IO_PWRITE, self._open_fd, data, rec.end - rec.begin),
                             (IO_FDATASYNC, self._open_fd)]
            if created:
                run_io(ops)
                fsync_dir(self.jd.path)  # The new file's entry must be durable too.
                ops = []
            if entry:
                assert self._log is not None
                ops += [(IO_PWRITE, self._commit_fd, b, pos) for b, pos in self._log.place(entry)]
            ops += record_ops(self._commit_fd, new)
            unlock = last and self._lock_fd is not None and not self._full(new)
            if unlock:
                ops.append((IO_FLOCK, self._lock_fd, fcntl.LOCK_UN))
            run_io(ops)
            self._rec = new
            if unlock:
                self._locked = False
        return batch_results(self.jd.name, rec.end, chunk)

    def _settle_log(self) -> None:
        assert self._commit_fd is not None and self._rec is not None
        self._log = settle_batches(self._commit_fd, self._rec)

    def _seal(self) -> None:
        assert self._rec is not None and self._commit_fd is not None
        if self._open_fd is None:
            return
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
        self._locked = False  # Closing the lock's descriptor released it.


def _wrap(journal: str, err: BaseException) -> BaseException:
    if isinstance(err, JournalError):
        return err
    wrapped = JournalError(f"append to {journal!r} failed: {err}")
    wrapped.__cause__ = err
    return wrapped
