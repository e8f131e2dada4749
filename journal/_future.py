"""Append futures: ``concurrent.futures.Future``s that cost next to nothing
until someone looks at them, and ``AppendGroup``, which resolves them.

Every append returns a future, and most are never looked at one by one:
callers flush, or keep them to look at later. Two things keep them off the
hot path.

**No Condition until someone waits.** A plain ``Future()`` builds a
``threading.Condition`` (an RLock and its bookkeeping) up front: measured,
about half the cost of an append. An ``AppendFuture`` makes it only when a
method that needs it first runs. The lists of waiters and callbacks come
with it: ``Future`` and ``concurrent.futures.wait``/``as_completed`` add to
them only while holding the Condition.

**Resolved by their group, not one by one.** The appends that a journal's
writer thread takes from its queue at once form an ``AppendGroup``, which
knows where each of them ends (their sizes, given as they are queued) and
records what became of each batch written: started, landed from an offset,
or failed. An append future knows its group and its place in it, and reads
its state, result and exception from there. The writer thread thus records
one outcome per batch and touches none of the batch's futures: measured,
starting and resolving each future and making each ``AppendResult`` took
the writer threads about 1 µs of CPU time per append, holding the
interpreter lock that the publishing thread then waited for.

A future that gets its Condition (someone waits on it, adds a callback,
cancels it) first *pins* what its group says of it into fields of its own;
from then on it is a plain ``Future`` resolved through ``Future``'s own
methods, and its group, which keeps such futures, starts and resolves it
when its batch is written. ``_MAKE`` makes pinning atomic with respect to
the group's records: a future is pinned either before its batch starts (or
lands), and is then started (or resolved) through its Condition, or after,
and then takes the outcome as it is.

Until pinned, a future holds only its group and its place, which can form
no reference cycle: the native core makes it outside the cyclic garbage
collector, and it goes back under it when pinned (waiters, callbacks and
exceptions may refer to it), or when anything is stored in its
``__dict__``. Appends queued by the hundred thousand are thus not gone
over by every collection: measured, the collector took half the CPU time
of 100-byte appends to a Gazette cluster. (CPython does the same for its
tuples and dicts of atomic values.)

A future whose append failed is pinned as soon as its outcome is read,
with its *own copy* of the batch's error (``own_error``): raising an error
adds the raiser's frames to its traceback, and frames hold lists of
futures. Were the group's error raised, it could then lead back to futures
of the same group that nobody looked at, which the collector does not see,
and the cycle through them would never be collected (a failed batch's
group and bytes kept for as long as the process lives). A future's own
copy leads back to that future alone, which is then under the collector.

All this reads and writes ``Future``'s private fields. At import,
``LAYOUT_KNOWN`` checks that a ``Future`` keeps them as expected; where it
does not (another Python), append futures are ``PlainAppendFuture``s, which
go through ``Future``'s public methods alone: their group keeps each of them
and resolves it one by one.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, Final, Generic, TypeVar

from ._pending import NATIVE
from ._spec import AppendResult

T = TypeVar("T")

LOG: Final = logging.getLogger("journal")

_MAKE = threading.Lock()


def _make_lock_after_fork() -> None:
    # A thread of the parent may have held it at the fork; the child has
    # none of the parent's threads (its stores start afresh too).
    global _MAKE
    _MAKE = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_make_lock_after_fork)

# The states of a Future, as concurrent.futures spells them (it does not
# export them; tests/journal holds these to a Future's own).
PENDING: Final = "PENDING"
RUNNING: Final = "RUNNING"
CANCELLED: Final = "CANCELLED"
CANCELLED_AND_NOTIFIED: Final = "CANCELLED_AND_NOTIFIED"
FINISHED: Final = "FINISHED"


_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})

#: What a group says of one of its appends: state, result, exception.
Outcome = tuple[str, Any, BaseException | None]


class AppendFuture(Future[T], Generic[T]):
    """A Future whose Condition is made lazily, and whose outcome is its
    group's until then (see the module docstring)."""

    # _group and _index: the group that resolves it and its place there
    # (None and 0: a future of no group). _st, _res and _exc: its own state,
    # result and exception once pinned (_st None: not pinned, ask the group).
    # The native core (journal/_native.c) makes a group's futures with these
    # set, and reads them, where Python code would call the properties below.
    __slots__ = ("_exc", "_group", "_index", "_res", "_st")

    # Class-level defaults until set: every attribute not stored per future
    # is time saved on the hot path. The empty tuples stand for empty lists
    # until the Condition comes with real ones (nothing adds to them without
    # it).
    _cond: threading.Condition | None = None
    _waiters: list[Any] = ()  # type: ignore[assignment]
    _done_callbacks: list[Any] = ()  # type: ignore[assignment]

    _group: AppendGroup | None
    _index: int
    _st: str | None
    _res: Any
    _exc: BaseException | None

    def __init__(self) -> None:
        # A future of no group: its own fields from the start. (No
        # super().__init__(), which would build the Condition.)
        self._group, self._index = None, 0
        self._st, self._res, self._exc = PENDING, None, None

    def _outcome(self) -> Outcome:
        st = self._st
        if st is not None:
            return st, self._res, self._exc
        group = self._group
        assert group is not None
        outcome = group.outcome_of(self._index)
        if outcome[2] is None:
            return outcome
        # Failed: pinned with its own copy of the error (module docstring).
        with _MAKE:
            self._pin()
        return self._st, self._res, self._exc  # type: ignore[return-value]

    # Future's own fields, as Future's methods read and write them.

    @property
    def _state(self) -> str:
        st = self._st
        return st if st is not None else self._outcome()[0]

    @_state.setter
    def _state(self, value: str) -> None:
        self._st = value

    @property
    def _result(self) -> Any:
        return self._res if self._st is not None else self._outcome()[1]

    @_result.setter
    def _result(self, value: Any) -> None:
        self._res = value

    @property
    def _exception(self) -> BaseException | None:
        return self._exc if self._st is not None else self._outcome()[2]

    @_exception.setter
    def _exception(self, value: BaseException | None) -> None:
        self._exc = value

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _MAKE:
                cond = self._cond
                if cond is None:
                    self._pin()  # (under the collector: waiters, callbacks)
                    self._waiters = []
                    self._done_callbacks = []
                    cond = self._cond = threading.Condition()
        return cond

    def _pin(self) -> None:
        """(Holding ``_MAKE``.) Take over what the group says of this
        future; if it is not done yet, the group resolves it later through
        ``Future``'s methods. A pinned future is under the cyclic garbage
        collector: what it holds now (an exception, waiters, callbacks) may
        refer back to it."""
        _track(self)
        if self._st is not None:
            return
        group = self._group
        assert group is not None
        st, res, exc = group.outcome_of(self._index)
        if exc is not None:
            exc = own_error(exc)
        self._st, self._res, self._exc = st, res, exc
        if st not in _DONE:
            group.keep(self._index, self)
        self._group = None  # its own from now on: it no longer keeps the group

    def _resolve_fast(self, result: Any, exc: BaseException | None) -> bool:
        """Resolve without a Condition if none exists yet: True if done so."""
        with _MAKE:
            if self._cond is not None:
                return False
            state = self._state
            if state not in (PENDING, RUNNING):
                raise InvalidStateError(f"{state}: {self!r}")
            if exc is not None:
                _track(self)  # An exception's traceback may refer to the future.
            self._st, self._res, self._exc = FINISHED, result, exc
        # Nobody held the Condition, so no waiter was installed; callbacks
        # can only have been added through it too.
        return True

    def set_running_or_notify_cancel(self) -> bool:
        with _MAKE:
            if self._cond is None and self._group is None and self._st == PENDING:
                # Cancelling goes through the Condition: with none, nobody did.
                self._st = RUNNING
                return True
        return super().set_running_or_notify_cancel()

    def done(self) -> bool:
        if self._cond is None:
            # States only move forward, each set in one step: no lock needed
            # to read one, and no Condition to make for it.
            return self._state in _DONE
        return super().done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._cond is None:
            state, _, exc = self._outcome()
            if state == FINISHED:
                # (A failed one is tracked: pinned by _outcome, or resolved
                # by _resolve_fast.)
                return exc
        return super().exception(timeout)

    def set_result(self, result: T) -> None:
        if not self._resolve_fast(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._resolve_fast(None, exception):
            super().set_exception(exception)


class PlainAppendFuture(Future[T], Generic[T]):
    """The plain way, through ``Future``'s public methods alone: what append
    futures are where ``Future``'s private layout is not the one
    ``AppendFuture`` was written for (see ``LAYOUT_KNOWN``)."""


class AppendGroup:
    """The appends a journal's writer thread takes from its queue at once,
    and what became of each (see the module docstring).

    ``add(size)``, as an append is queued, makes its future. The writer
    thread writes the group in batches, in order: ``start(lo, hi)`` before
    writing appends ``lo`` to ``hi - 1``, ``resolve(...)`` once they landed
    or failed. ``outcome_of(i)`` is what append ``i``'s future reads.
    """

    __slots__ = ("_firsts", "_kept", "_outcomes", "_started", "ends", "failed_from", "journal",
                 "resolved")

    def __init__(self, journal: str) -> None:
        self.journal = journal
        #: ends[i]: the size of appends 0 to i together, 8 bytes each (a
        #: future kept for long keeps its group). The native Pending keeps
        #: them itself while the group is queued, and adds them at take().
        self.ends = array("q")
        #: Appends before this one are done; the first that failed
        #: (sys.maxsize while none has). The native ScanFutures reads both.
        self.resolved = 0
        self.failed_from = sys.maxsize
        # Futures resolved through their Condition (pinned ones, and every
        # future where they are PlainAppendFutures), by index.
        self._kept: dict[int, Future[Any]] = {}
        self._started = 0  # appends before this one are (or were) running
        self._outcomes: list[_BatchOutcome] = []  # one per batch, in order
        self._firsts: list[int] = []  # the first append of each batch

    def __len__(self) -> int:
        return len(self.ends)

    def add(self, size: int) -> Future[AppendResult]:
        """The future of a new append of ``size`` bytes, queued in this
        group (the queue's lock held). journal/_native.c's Pending makes
        ``AppendFuture``s natively the same way (and keeps their ends
        until the group is taken)."""
        ends = self.ends
        index = len(ends)
        ends.append(ends[-1] + size if ends else size)
        if FUTURE is AppendFuture:
            future: AppendFuture[AppendResult] = AppendFuture.__new__(AppendFuture)
            future._group, future._index = self, index
            future._st = future._res = future._exc = None
            return future
        plain: Future[AppendResult] = PlainAppendFuture()
        self._kept[index] = plain
        return plain

    def keep(self, index: int, future: Future[Any]) -> None:
        """(Holding ``_MAKE``.) Resolve ``future`` through its Condition."""
        self._kept[index] = future

    def size(self, lo: int, hi: int) -> int:
        """The bytes of appends ``lo`` to ``hi - 1``."""
        ends = self.ends
        return (ends[hi - 1] if hi else 0) - (ends[lo - 1] if lo else 0)

    def outcome_of(self, index: int) -> Outcome:
        """What is known of append ``index``: state, result, exception."""
        # resolved is set after the outcome is recorded: one read of it
        # tells whether the outcome can be looked up.
        if index < self.resolved:
            batch = self._outcomes[bisect_right(self._firsts, index) - 1]
            return batch.of(index, self)
        return (RUNNING if index < self._started else PENDING), None, None

    def start(self, lo: int, hi: int) -> list[int] | None:
        """Appends ``lo`` to ``hi - 1`` are about to be written: running
        from now on, except those cancelled before. Returns None if none
        was, else the places (from ``lo``) of those to write."""
        with _MAKE:
            self._started = hi
            kept = [(i, f) for i, f in self._kept.items() if lo <= i < hi]
        cancelled = {i for i, f in kept if not _set_running(f)}
        if not cancelled:
            return None
        return [i - lo for i in range(lo, hi) if i not in cancelled]

    def resolve(self, lo: int, hi: int, live: list[int] | None, begin: int, landed: int,
                error: BaseException | None) -> None:
        """Appends ``lo`` to ``hi - 1`` were written (those at the places
        ``live``, all if None): the first ``landed`` of them landed one after
        the other from offset ``begin``, and the others failed with
        ``error``."""
        batch = _BatchOutcome(lo, live, begin, landed, error, self)
        written = hi - lo if live is None else len(live)  # (as _Batch.written)
        with _MAKE:
            self._outcomes.append(batch)
            self._firsts.append(lo)
            if landed < written and self.failed_from == sys.maxsize:
                self.failed_from = lo + (landed if live is None else live[landed])
            self.resolved = hi
            due = sorted(i for i in self._kept if i < hi)
            kept = [(i, self._kept.pop(i)) for i in due]
        for i, f in kept:
            if f.cancelled():
                continue
            _, result, exc = batch.of(i, self)
            try:
                if exc is None:
                    f.set_result(result)
                else:
                    f.set_exception(own_error(exc))
            except InvalidStateError:
                pass  # resolved by someone else meanwhile: theirs stands
            except BaseException:
                # A done-callback raised what Future lets through (it logs an
                # Exception and goes on): SystemExit, say. Resolved already;
                # the writer thread goes on with the others, and the journal.
                LOG.exception("a done-callback of an append to %r raised; ignored",
                              self.journal)


def own_error(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for one future of a failed batch: the same type,
    arguments and attributes, sharing its traceback, cause and context (see
    the module docstring). ``exc`` itself where it cannot be copied."""
    cls = type(exc)
    try:
        copy = cls.__new__(cls, *exc.args)  # (no __init__: the arguments may be another's)
        attrs = getattr(exc, "__dict__", None)
        if attrs:
            copy.__dict__.update(attrs)
            if isinstance(attrs.get("__notes__"), list):
                copy.__notes__ = list(attrs["__notes__"])
    except Exception:
        return exc
    copy.__traceback__ = exc.__traceback__
    copy.__cause__ = exc.__cause__
    copy.__context__ = exc.__context__
    copy.__suppress_context__ = exc.__suppress_context__
    return copy


def _set_running(future: Future[Any]) -> bool:
    """``set_running_or_notify_cancel()``, for a future that may run already
    (someone called it): False if it was cancelled."""
    try:
        return future.set_running_or_notify_cancel()
    except RuntimeError:  # running (or done) already
        return not future.cancelled()


class _BatchOutcome:
    """What became of one batch of a group: its first append (``lo``), the
    places of those written (``live``, None for all), where the first
    landed (``begin``), how many landed, and the error of the others."""

    __slots__ = ("begin", "error", "landed", "live", "lo", "offsets")

    def __init__(self, lo: int, live: list[int] | None, begin: int, landed: int,
                 error: BaseException | None, group: AppendGroup) -> None:
        self.lo, self.live, self.begin, self.landed, self.error = lo, live, begin, landed, error
        # Where each written append begins from begin, where some were not
        # written (cancelled): the others follow each other.
        self.offsets: list[int] | None = None
        if live is not None:
            offsets, at = [], 0
            for k in live:
                offsets.append(at)
                at += group.size(lo + k, lo + k + 1)
            self.offsets = offsets

    def of(self, index: int, group: AppendGroup) -> Outcome:
        k = index - self.lo
        if self.live is None:
            place = k
        else:
            place = bisect_left(self.live, k)
            if place == len(self.live) or self.live[place] != k:
                return CANCELLED, None, None  # not written: it was cancelled
        if place >= self.landed:
            return FINISHED, None, self.error
        if self.offsets is None:
            start = self.begin + group.size(self.lo, index)
        else:
            start = self.begin + self.offsets[place]
        end = start + group.size(index, index + 1)
        return FINISHED, AppendResult(group.journal, start, end), None


def _layout_is_known() -> bool:
    """Whether a ``Future`` keeps what ``AppendFuture`` reads and writes
    where it expects it: the attributes ``Future.__init__`` sets, and the
    states it moves through, as Python 3.11 to 3.14 have them."""
    f: Future[int] = Future()
    if set(vars(f)) != {"_condition", "_state", "_result", "_exception", "_waiters",
                        "_done_callbacks"}:
        return False
    states = [getattr(f, "_state", None)]
    f.set_running_or_notify_cancel()
    states.append(getattr(f, "_state", None))
    f.set_result(1)
    states.append(getattr(f, "_state", None))
    return states == [PENDING, RUNNING, FINISHED] and getattr(f, "_result", None) == 1


#: True where ``AppendFuture``'s shortcuts apply (checked once, at import);
#: elsewhere append futures are ``PlainAppendFuture``s.
LAYOUT_KNOWN: Final = _layout_is_known()

#: The class of append futures.
FUTURE: Final[type[AppendFuture[Any]] | type[PlainAppendFuture[Any]]] = (
    AppendFuture if LAYOUT_KNOWN else PlainAppendFuture
)


def _track_nothing(_future: object) -> None:
    """Futures made in Python are never out of the collector."""


#: What ``AppendFuture`` and ``Future`` store on an append future themselves
#: (anything else stored on one puts it back under the collector).
_OWN: Final = frozenset({"_exc", "_group", "_index", "_res", "_st", "_cond", "_waiters",
                         "_done_callbacks", "_state", "_result", "_exception", "_condition"})

#: ``_track(future)`` puts a future made out of the cyclic garbage collector
#: (natively, see the module docstring) back under it.
_track: Callable[[object], None] = _track_nothing if NATIVE is None else NATIVE.track


def _setattr_tracking(self: AppendFuture[Any], name: str, value: Any) -> None:
    """``AppendFuture.__setattr__`` where futures are made out of the
    collector: anything a caller stores on one may refer back to it."""
    object.__setattr__(self, name, value)
    if name not in _OWN:
        _track(self)


if NATIVE is not None and LAYOUT_KNOWN:
    # The native Pending makes a group's futures as AppendGroup.add does.
    NATIVE.configure_futures(AppendFuture)
    AppendFuture.__setattr__ = _setattr_tracking  # type: ignore[assignment]
