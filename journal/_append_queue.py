"""Group commit: the append queue and writer thread every journal client uses.

``submit`` queues the bytes of one append and returns a future. One writer
thread per journal takes everything queued (up to ``MAX_BATCH_BYTES``) and
hands the batch to ``_write_batch``, which a client implements: the local
store writes and fsyncs it under the journal's lock; the Gazette client
sends it as one Append RPC. Many appends waiting at once thus cost one write,
and the futures resolve in queue order once ``_write_batch`` says where the
batch landed: the appends taken together form an ``AppendGroup``
(journal/_future.py), which records each batch's outcome once and from
which each future reads its own.

The queue keeps appends in call order, never reorders a batch and never has
two batches of one journal in flight, so appends land in call order.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from functools import partial
from types import FrameType
from typing import Any, Final, TypeVar

from . import metrics
from ._errors import JournalClosedError, JournalError
from ._future import AppendGroup
from ._pending import NATIVE, Pending
from ._spec import AppendResult

#: A batch holds at most this many bytes (unless one append is larger):
#: beyond a few MiB, larger batches save nothing and delay early futures.
MAX_BATCH_BYTES: Final = 8 << 20
#: An idle writer thread exits (releasing its resources) after this many seconds.
IDLE_EXIT_SECONDS: Final = 5.0


#: What ``_write_batch`` says of a batch: the offset where its first append
#: landed, how many of its appends landed (one after the other, in order),
#: and the error that failed the others (None if none failed).
BatchLanded = tuple[int, int, BaseException | None]


#: A client's append(name, data).
Appender = Callable[[str, bytes], Future[AppendResult]]
#: A client's kind of append queue.
Q = TypeVar("Q", bound="AppendQueue")


def append_router(
    client: Any, definition: Callable[..., Future[AppendResult]],
    queues: dict[str, Q], max_size: int,
) -> Appender | None:
    """What a client binds as its instance's ``append``: where the native core
    is built, one that hands bytes of at most ``max_size`` to the journal's
    queue in ``queues`` (a dict the client keeps up to date) with no Python
    code run, and calls the client's own ``append`` for anything else. None
    (``append`` itself stays) where the core is not built, or where the
    client's class overrides ``definition``, the client's ``append``: an
    override sees every append, as it does without the core."""
    if NATIVE is None or getattr(type(client), "append", None) is not definition:
        return None
    router: Appender = NATIVE.AppendRouter(queues, max_size, client.append)
    return router


class AppendQueue:
    """The append queue and writer thread of one journal in one client.

    Subclasses implement ``_write_batch`` and, if they hold resources between
    batches, ``_release_resources``.
    """

    #: The ``client`` label of this queue's metrics (journal.metrics).
    client_kind = "journal"

    def __init__(
        self,
        journal: str,
        *,
        max_batch_bytes: int | None = None,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self.journal = journal
        self._max_batch_bytes = MAX_BATCH_BYTES if max_batch_bytes is None else max_batch_bytes
        self._on_commit = on_commit
        # The writer thread waits on these (the idle writer on _wakeup, a
        # flush on _done); what is queued is _pending's, native when built.
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)
        self._pending = Pending(partial(AppendGroup, journal), self._closed, self._start,
                                self._wake)
        # submit() is _pending's own, without a call in between (per append).
        self.submit = self._pending.submit  # type: ignore[method-assign]
        self._thread: threading.Thread | None = None
        self._resolved = 0  # Appends resolved so far, in queue order.
        # Failed appends not yet reported by a flush: their seqs (a range or
        # an array, in order) and their error, a batch each.
        self._failures: list[tuple[Sequence[int], BaseException]] = []
        self._taken = 0  # Appends handed to batches so far (writer thread only).

    # For the client ------------------------------------------------------

    def submit(self, data: bytes) -> Future[AppendResult]:
        """Queue one append; the future resolves with where it landed."""
        future: Future[AppendResult] = self._pending.submit(data)
        return future

    def _closed(self) -> JournalClosedError:
        return JournalClosedError(f"writer of {self.journal!r}")

    def _start(self) -> None:
        """Start the writer thread (``_pending`` found none running). If it
        cannot start (``RuntimeError: can't start new thread``), what is
        queued fails with that error, as an append that could not be
        written does: through its future and ``flush``. Nothing of it is
        written later; the next append tries to start a thread again."""
        while True:
            thread = self._thread = threading.Thread(
                target=self._run, name=f"journal-writer:{self.journal}", daemon=True
            )
            try:
                thread.start()
                return
            except Exception as exc:
                self._thread = None
                error = JournalError(
                    f"append to {self.journal!r} failed: its writer thread did not start: {exc}")
                error.__cause__ = exc
            # No writer thread runs: this thread stands in for one, to fail
            # what is queued and to say that none runs.
            data, group = self._pending.take()
            if group is not None:
                batch = self._open(group, 0, len(data))
                batch.error = error
                self._resolve(batch)
            if self._pending.exit():
                return
            # (Appends came meanwhile: try again for them.)

    def _wake(self) -> None:
        """Wake the idle writer thread (``_pending`` found it idle). The
        writer holds _lock from before it said it was idle until it waits:
        this notification cannot come in between and be lost."""
        with self._lock:
            self._wakeup.notify()

    @property
    def issued(self) -> int:
        """Appends queued so far (the seq of the last one)."""
        return self._pending.issued()

    def wait(
        self, seq: int, deadline: float | None, clock: Callable[[], float]
    ) -> tuple[int, BaseException | None]:
        """Wait until appends up to ``seq`` are resolved; return (and forget)
        how many of them failed, and the first failure. Raises
        ``TimeoutError`` past ``deadline``."""
        with self._lock:
            while self._resolved < seq:
                remaining = None if deadline is None else deadline - clock()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"flush of {self.journal!r} timed out with"
                        f" {seq - self._resolved} append(s) pending"
                    )
                self._done.wait(remaining)
            count, first = 0, None
            kept: list[tuple[Sequence[int], BaseException]] = []
            for seqs, error in self._failures:
                upto = bisect_right(seqs, seq)  # (the seqs of a batch's failures, in order)
                if upto:
                    count += upto
                    if first is None:
                        first = error
                if upto < len(seqs):
                    kept.append((seqs[upto:], error))
            self._failures = kept
        return count, first

    def stop(self) -> None:
        """Finish every queued append, then stop the thread and release resources."""
        with self._lock:
            self._pending.stop()
            self._wakeup.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if not self._pending.running:
            self._release_resources()

    # For subclasses --------------------------------------------------------

    def _write_batch(self, data: list[bytes]) -> BatchLanded:
        """Append ``data``'s appends in order: where the first landed, how
        many landed, and the error that failed the rest (None if none
        failed). See ``BatchLanded``."""
        raise NotImplementedError

    def _release_resources(self) -> None:
        """Release what is held between batches (the writer is idle or stopping)."""

    # The writer thread -----------------------------------------------------

    def _run(self) -> None:
        # Appends taken from the queue, oldest first (their bytes, and the
        # group of their futures); handled in batches of at most
        # max_batch_bytes so that early futures resolve without waiting for
        # a whole backlog. Taking the queue whole keeps submit() cheap.
        pending = self._pending
        data: list[bytes] = []
        group: AppendGroup | None = None
        pos = 0
        done: _Batch | None = None  # a finished batch whose futures are not resolved yet
        batch: _Batch | None = None
        while True:
            if group is None or pos == len(data):
                if done is not None:
                    self._resolve(done)
                    done = None
                # Hold nothing of a resolved batch while idle.
                batch = None
                data, group = pending.take()
                while group is None:
                    if not pending.stopping:
                        with self._lock:
                            if pending.begin_idle():
                                notified = self._wakeup.wait(IDLE_EXIT_SECONDS)
                                pending.end_idle()
                                if notified:
                                    data, group = pending.take()
                                    continue
                            else:
                                data, group = pending.take()
                                continue
                    # Stopping, or idle for a while: release what is held,
                    # then exit unless appends came meanwhile (the next
                    # batch then opens what it needs again).
                    self._release_resources()
                    if pending.exit():
                        return
                    data, group = pending.take()
                pos = 0
            ends = group.ends  # ends[i]: the size of data[: i + 1]
            base = ends[pos - 1] if pos else 0
            if ends[-1] - base <= self._max_batch_bytes:
                end = len(data)
            else:
                # As many appends as fit in max_batch_bytes, and at least one.
                end = max(bisect_right(ends, base + self._max_batch_bytes, pos), pos + 1)
            batch = self._begin(group, pos, end,
                                data if pos == 0 and end == len(data) else data[pos:end])
            if done is not None:
                # The previous batch's futures are resolved while this one is
                # in flight (when the subclass sends batches asynchronously).
                self._resolve(done)
            self._finish(batch)
            if self._overlap:
                done = batch
            else:
                self._resolve(batch)
            pos = end

    #: Whether ``_start_batch`` only sends a batch (and its outcome comes
    #: later): then a batch's futures are resolved while the next one is in
    #: flight. Batches are still sent one at a time, in order.
    _overlap = False

    def _start_batch(self, data: list[bytes]) -> Callable[[], BatchLanded]:
        """Begin appending ``data``; return what waits for the outcome (that
        of ``_write_batch``). By default the batch is written now."""
        outcome = self._write_batch(data)
        return lambda: outcome

    def _open(self, group: AppendGroup, lo: int, hi: int) -> _Batch:
        """The batch of appends ``lo`` to ``hi - 1`` of ``group``, started
        (those cancelled before are left out: ``live``) and counted taken."""
        batch = _Batch(group, lo, hi, self._taken + 1)
        self._taken += hi - lo
        batch.live = group.start(lo, hi)
        return batch

    def _begin(self, group: AppendGroup, lo: int, hi: int, data: list[bytes]) -> _Batch:
        batch = self._open(group, lo, hi)
        # An append cancelled before its batch started is not written.
        live = batch.live
        if live is not None:
            data = [data[i] for i in live]
        if data:
            if metrics.enabled():
                batch.started = time.perf_counter()
            batch.outcome = self._start_batch(data)
        return batch

    def _finish(self, batch: _Batch) -> None:
        if batch.outcome is not None:
            batch.begin, batch.landed, batch.error = batch.outcome()
            if batch.error is not None:
                _forget_locals(batch.error)
            batch.outcome = None
            if batch.started:  # metrics were on when it was sent
                self._record(batch)
        if batch.landed and self._on_commit is not None:
            self._on_commit()  # Wake following readers first: the bytes are committed.

    def _record(self, batch: _Batch) -> None:
        group, live, lo = batch.group, batch.live, batch.lo
        if live is None:
            landed = group.size(lo, lo + batch.landed)
        else:
            landed = sum(group.size(lo + k, lo + k + 1) for k in live[: batch.landed])
        metrics.record_batch(self.client_kind, self.journal, batch.landed, landed,
                             time.perf_counter() - batch.started, batch.written - batch.landed)

    def _resolve(self, batch: _Batch) -> None:
        live = batch.live
        batch.group.resolve(batch.lo, batch.hi, live, batch.begin, batch.landed, batch.error)
        error, failed = batch.error, None
        if error is not None and batch.landed < batch.written:
            # The seqs of those that failed: one range, or where some were
            # cancelled, an array (one entry a batch, kept until a flush).
            first = batch.first_seq
            failed = (range(first + batch.landed, first + batch.written) if live is None
                      else array("q", (first + k for k in live[batch.landed:])))
        with self._lock:
            self._resolved += batch.hi - batch.lo
            if failed is not None and error is not None:
                self._failures.append((failed, error))
            self._done.notify_all()


def _forget_locals(error: BaseException) -> None:
    """Clear the local variables of the finished frames that ``error``'s
    traceback (and those of its causes) leads to, and of the finished
    frames that called them: the writer's frames there hold the failed
    batch's bytes, and futures and ``flush`` keep the error for as long as
    they like. Where it happened (files, lines) stays."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame: FrameType | None = tb.tb_frame
            while frame is not None and id(frame) not in seen:
                seen.add(id(frame))
                # Not a generator's or coroutine's frame: clearing one would
                # close it, and it may be suspended, not finished.
                if not frame.f_code.co_flags & _SUSPENDABLE:
                    with contextlib.suppress(RuntimeError):  # still running
                        frame.clear()
                frame = frame.f_back
            tb = tb.tb_next
        todo += (exc.__cause__, exc.__context__)


_SUSPENDABLE: Final = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                       | inspect.CO_ITERABLE_COROUTINE)


class _Batch:
    """One batch of the queue: appends ``lo`` to ``hi - 1`` of ``group``,
    then its outcome."""

    __slots__ = ("begin", "error", "first_seq", "group", "hi", "landed", "live", "lo",
                 "outcome", "started")

    def __init__(self, group: AppendGroup, lo: int, hi: int, first_seq: int) -> None:
        self.group, self.lo, self.hi = group, lo, hi  # cancelled ones included
        self.first_seq = first_seq
        self.live: list[int] | None = None  # places (from lo) of those not cancelled; None: all
        self.outcome: Callable[[], BatchLanded] | None = None
        self.begin = 0  # where the first landed
        self.landed = 0  # how many landed
        self.error: BaseException | None = None
        self.started = 0.0  # perf_counter() when sent, with metrics on

    @property
    def written(self) -> int:
        """How many appends were written (those not cancelled)."""
        return self.hi - self.lo if self.live is None else len(self.live)


def flush_queues(queues: Iterable[AppendQueue], timeout: float | None) -> None:
    """Wait until every append issued so far to ``queues`` is resolved.
    Raises ``TimeoutError`` after ``timeout`` seconds, and ``JournalError``
    (chained to the first failure) if any of those appends failed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    targets = [(q, q.issued) for q in queues]
    count, first = 0, None
    for q, seq in targets:
        failed, error = q.wait(seq, deadline, time.monotonic)
        count += failed
        if first is None:
            first = error
    if first is not None:
        raise JournalError(f"{count} append(s) failed: {first}") from first
