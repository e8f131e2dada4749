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
from collections.abc import Callable
from concurrent.futures import Future
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


# One queued append: its bytes and its future.
_Pending = tuple[bytes, "Future[AppendResult]"]


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
        self._queue: list[_Pending] = []
        self._thread: threading.Thread | None = None
        self._idle = False
        self._stopping = False
        self._issued = 0  # Appends queued so far (the seq of the last one).
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
        fut: Future[AppendResult] = AppendFuture()
        with self._lock:
            if self._stopping:
                raise JournalClosedError(f"writer of {self.jd.name!r}")
            self._issued += 1
            self._queue.append((data, fut))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"journal-writer:{self.jd.name}", daemon=True
                )
                self._thread.start()
            elif self._idle:
                self._wakeup.notify()
        return fut

    @property
    def issued(self) -> int:
        with self._lock:
            return self._issued

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
        # Appends taken from the queue, oldest first; handled in batches of at
        # most MAX_BATCH_BYTES so that early futures resolve without waiting
        # for a whole backlog. Taking the queue whole keeps append() cheap.
        backlog: list[_Pending] = []
        pos = 0
        while True:
            if pos == len(backlog):
                with self._lock:
                    while not self._queue:
                        if self._stopping:
                            self._close_files()
                            self._thread = None
                            return
                        self._idle = True
                        notified = self._wakeup.wait(IDLE_EXIT_SECONDS)
                        self._idle = False
                        if not notified and not self._queue and not self._stopping:
                            self._close_files()
                            self._thread = None
                            return
                    backlog, self._queue = self._queue, []
                pos = 0
            end, size = pos, 0
            while end < len(backlog) and (
                end == pos or size + len(backlog[end][0]) <= MAX_BATCH_BYTES
            ):
                size += len(backlog[end][0])
                end += 1
            self._process(backlog[pos:end])
            pos = end

    def _process(self, batch: list[_Pending]) -> None:
        first_seq = self._taken + 1
        self._taken += len(batch)
        # An append cancelled before its batch started is not written.
        started = AppendFuture.start_all([fut for _, fut in batch])
        live = [(i, p) for (i, p), ok in zip(enumerate(batch), started, strict=True) if ok]
        outcomes = self._write_batch([p for _, p in live]) if live else []
        if any(not isinstance(o, BaseException) for o in outcomes):
            self._on_commit()  # Wake following readers first: the bytes are committed.
        failures = [
            (first_seq + i, outcome)
            for (i, _), outcome in zip(live, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        AppendFuture.resolve_all([fut for _, (_, fut) in live], outcomes)
        with self._lock:
            self._resolved += len(batch)
            self._failures.extend(failures)
            self._done.notify_all()

    def _write_batch(self, batch: list[_Pending]) -> list[AppendResult | BaseException]:
        out: list[AppendResult | BaseException] = []
        try:
            self._acquire()
        except BaseException as err:  # Reported through every future of the batch.
            self._close_files()
            return [_wrap(self.jd.name, err)] * len(batch)
        try:
            i = 0
            while i < len(batch):
                if self._committed() >= self._fragment_size:
                    self._seal()
                # Fill the open fragment up to fragment_size, at least one append.
                room = self._fragment_size - self._committed()
                j, size = i, 0
                while j < len(batch) and (j == i or size < room):
                    size += len(batch[j][0])
                    j += 1
                out.extend(self._commit(batch[i:j]))
                i = j
        except BaseException as err:
            # The rest of the batch is not committed; the next batch starts
            # from a full recovery, which cuts whatever was half-written.
            self._close_files()
            wrapped = _wrap(self.jd.name, err)
            out.extend([wrapped] * (len(batch) - len(out)))
            return out
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
        return out

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

    def _commit(self, chunk: list[_Pending]) -> list[AppendResult | BaseException]:
        rec = self._rec
        assert rec is not None and self._commit_fd is not None
        data = b"".join([p[0] for p in chunk])
        if data:
            created = self._open_fd is None
            if created:
                self._open_fd = os.open(
                    open_fragment_path(self.jd, rec), os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644
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
        out: list[AppendResult | BaseException] = []
        pos = rec.end
        name = self.jd.name
        for p in chunk:
            n = len(p[0])
            out.append(AppendResult(name, pos, pos + n))
            pos += n
        return out

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
