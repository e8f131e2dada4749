"""Group commit: one writer thread per journal per process.

``append`` queues the bytes and returns a future. The writer thread takes
everything queued (up to ``MAX_BATCH_BYTES``), and for the whole batch:
takes the journal's ``flock`` (so no other process writes in between), writes
the bytes with one ``pwrite`` at the committed end, ``fdatasync``s them,
advances the commit record and ``fdatasync``s it, releases the lock, and then
resolves the futures. Many appends waiting at once thus cost one write and two
syncs, and a future resolves only once its bytes are durable *and* covered by
the commit record that readers go by.

Batches are cut where the open fragment reaches ``fragment_size``; the
fragment is then sealed before the rest of the batch goes to a new one, so a
sealed fragment always ends on an append boundary.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from itertools import accumulate, islice, repeat
from typing import Final

from ._errors import JournalClosedError, JournalError
from ._files import (
    JournalDir,
    fsync_dir,
    lock_is_current,
    open_commit,
    open_fragment_path,
    open_lock,
    read_record,
    recover,
    seal,
    truncate_garbage,
    write_all,
    write_record,
)
from ._fragment import CommitRecord
from ._future import AppendFuture
from ._spec import AppendResult

LOG: Final = logging.getLogger("journal")

#: A batch holds at most this many bytes (unless one append is larger):
#: beyond a few MiB, larger batches save nothing and hold the lock longer.
MAX_BATCH_BYTES: Final = 8 << 20
#: An idle writer thread exits (closing its files) after this many seconds.
IDLE_EXIT_SECONDS: Final = 5.0
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)

# AppendResult((journal, begin, end)) without the Python-level __new__ of a
# NamedTuple: a batch's results are built by map() with no Python call each.
_new_result: Final[Callable[[tuple[str, int, int]], AppendResult]] = partial(
    tuple.__new__, AppendResult
)


class JournalWriter:
    """The append queue and writer thread of one journal in one store."""

    def __init__(
        self, jd: JournalDir, *, fragment_size: int, on_commit: Callable[[], None]
    ) -> None:
        self.jd = jd
        self._fragment_size = fragment_size
        self._on_commit = on_commit
        # A plain Lock: append() takes it once per call, and a Condition's
        # own `with` is far slower. The conditions share it for waiting.
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)  # The idle writer waits here.
        self._done = threading.Condition(self._lock)  # flush() waits here.
        # The queue: appends' bytes and their futures, in two lists kept in
        # step. (A pair per append would be one more object per queued append
        # for the cyclic garbage collector to go over, again and again.)
        self._data: list[bytes] = []
        self._futures: list[AppendFuture[AppendResult]] = []
        self._thread: threading.Thread | None = None
        self._idle = False
        self._stopping = False
        self._handed = 0  # Appends handed to the writer thread so far.
        self._resolved = 0  # Appends resolved so far, in queue order.
        self._failures: list[tuple[int, BaseException]] = []
        # Touched only by the writer thread (or after it stopped).
        self._taken = 0  # Appends handed to batches so far.
        self._lock_fd: int | None = None
        self._commit_fd: int | None = None
        self._open_fd: int | None = None
        self._rec: CommitRecord | None = None

    # Called by the store ---------------------------------------------------

    def submit(self, data: bytes) -> Future[AppendResult]:
        fut: AppendFuture[AppendResult] = AppendFuture()
        # acquire/release rather than `with`: half the cost, per append.
        lock = self._lock
        lock.acquire()
        try:
            if self._stopping:
                raise JournalClosedError(f"writer of {self.jd.name!r}")
            self._data.append(data)
            self._futures.append(fut)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"journal-writer:{self.jd.name}", daemon=True
                )
                self._thread.start()
            elif self._idle:
                self._wakeup.notify()
        finally:
            lock.release()
        return fut

    @property
    def issued(self) -> int:
        """Appends queued so far (the seq of the last one)."""
        with self._lock:
            return self._handed + len(self._futures)

    def wait(
        self, seq: int, deadline: float | None, clock: Callable[[], float]
    ) -> list[BaseException]:
        """Wait until appends up to ``seq`` are resolved; return (and forget)
        the failures among them. Raises ``TimeoutError`` past ``deadline``."""
        with self._lock:
            while self._resolved < seq:
                remaining = None if deadline is None else deadline - clock()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"flush of {self.jd.name!r} timed out with"
                        f" {seq - self._resolved} append(s) pending"
                    )
                self._done.wait(remaining)
            failed = [e for s, e in self._failures if s <= seq]
            self._failures = [(s, e) for s, e in self._failures if s > seq]
        return failed

    def stop(self) -> None:
        """Finish every queued append, then stop the thread and close files."""
        with self._lock:
            self._stopping = True
            self._wakeup.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            if self._thread is None:
                self._close_files()

    def forget_after_fork(self) -> None:
        """In a forked child: close inherited descriptors *without* unlocking,
        since ``flock`` locks are shared with the parent's descriptors."""
        for fd in (self._lock_fd, self._commit_fd, self._open_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    # The writer thread -----------------------------------------------------

    def _run(self) -> None:
        # Appends taken from the queue, oldest first (their bytes and their
        # futures); handled in batches of at most MAX_BATCH_BYTES so that
        # early futures resolve without waiting for a whole backlog. Taking
        # the queue whole keeps append() cheap.
        data: list[bytes] = []
        futures: list[AppendFuture[AppendResult]] = []
        ends: list[int] = []  # ends[i]: the size of data[: i + 1]
        pos = 0
        while True:
            if pos == len(futures):
                data, futures = [], []  # Keep nothing alive while idle.
                with self._lock:
                    while not self._futures:
                        if self._stopping:
                            self._close_files()
                            self._thread = None
                            return
                        self._idle = True
                        notified = self._wakeup.wait(IDLE_EXIT_SECONDS)
                        self._idle = False
                        if not notified and not self._futures and not self._stopping:
                            self._close_files()
                            self._thread = None
                            return
                    data, self._data = self._data, []
                    futures, self._futures = self._futures, []
                    self._handed += len(futures)
                pos = 0
                ends = list(accumulate(map(len, data)))
            # As many appends as fit in MAX_BATCH_BYTES, and at least one.
            base = ends[pos - 1] if pos else 0
            end = max(bisect_right(ends, base + MAX_BATCH_BYTES, pos), pos + 1)
            if pos == 0 and end == len(futures):
                self._process(data, futures)
            else:
                self._process(data[pos:end], futures[pos:end])
            pos = end

    def _process(self, data: list[bytes], futures: list[AppendFuture[AppendResult]]) -> None:
        count, first_seq = len(futures), self._taken + 1
        self._taken += count
        # An append cancelled before its batch started is not written.
        live = AppendFuture.start_all(futures)
        if live is not None:
            data = [data[i] for i in live]
            futures = [futures[i] for i in live]
        results, error = self._write_batch(data) if futures else ([], None)
        if results:
            self._on_commit()  # Wake following readers first: the bytes are committed.
        AppendFuture.resolve_all(futures, results, error)
        failures: list[tuple[int, BaseException]] = []
        if error is not None:
            failed = range(len(results), len(futures))
            failures = [(first_seq + (i if live is None else live[i]), error) for i in failed]
        with self._lock:
            self._resolved += count
            self._failures.extend(failures)
            self._done.notify_all()

    def _write_batch(self, data: list[bytes]) -> tuple[list[AppendResult], BaseException | None]:
        """Write and commit ``data``'s appends in order: the results of those
        committed, and the error that failed the rest (None if none failed)."""
        out: list[AppendResult] = []
        try:
            self._acquire()
        except BaseException as err:  # Reported through every future of the batch.
            self._close_files()
            return out, _wrap(self.jd.name, err)
        try:
            ends = list(accumulate(map(len, data)))  # ends[i]: the size of data[: i + 1]
            i, n = 0, len(data)
            while i < n:
                if self._committed() >= self._fragment_size:
                    self._seal()
                # Fill the open fragment up to fragment_size, at least one
                # append: up to and including the append that reaches it.
                room = self._fragment_size - self._committed()
                j = min(bisect_left(ends, (ends[i - 1] if i else 0) + room, i) + 1, n)
                out.extend(self._commit(data if i == 0 and j == n else data[i:j]))
                i = j
        except BaseException as err:
            # The rest of the batch is not committed; the next batch starts
            # from a full recovery, which cuts whatever was half-written.
            self._close_files()
            return out, _wrap(self.jd.name, err)
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
        return out, None

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
        rec = read_record(self.jd, self._commit_fd)
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

    def _release(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _commit(self, chunk: list[bytes]) -> list[AppendResult]:
        rec = self._rec
        assert rec is not None and self._commit_fd is not None
        data = b"".join(chunk)
        if data:
            created = self._open_fd is None
            if created:
                self._open_fd = os.open(
                    open_fragment_path(self.jd, rec),
                    os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW,
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
            write_record(self._commit_fd, self._rec)
        # Each append's [begin, end): the sizes summed up from rec.end.
        bounds = list(accumulate(map(len, chunk), initial=rec.end))
        return list(map(_new_result, zip(repeat(self.jd.name), bounds, islice(bounds, 1, None))))

    def _seal(self) -> None:
        assert self._rec is not None and self._commit_fd is not None
        if self._open_fd is None:
            return
        self._rec = seal(self.jd, self._commit_fd, self._open_fd, self._rec)
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


def _wrap(journal: str, err: BaseException) -> BaseException:
    if isinstance(err, JournalError):
        return err
    wrapped = JournalError(f"append to {journal!r} failed: {err}")
    wrapped.__cause__ = err
    return wrapped
