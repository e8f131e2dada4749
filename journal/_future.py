"""``AppendFuture``: a ``concurrent.futures.Future`` without a Condition until
someone waits on it.

A plain ``Future()`` builds a ``threading.Condition`` (an RLock and its
bookkeeping) up front: measured, about half the cost of an append. Most
append futures are never waited on one by one — callers flush, or resolve a
batch and look at results later — so the Condition is made only when a
method that needs it first runs, and a future resolved before that is
resolved without one. The lists of waiters and callbacks are made with it:
``Future`` and ``concurrent.futures.wait``/``as_completed`` add to them
only while holding the Condition.

Everything that reads or waits goes through ``_condition``, exactly as in
``Future``; ``_MAKE`` makes the lazy creation and the Condition-free
resolution atomic with respect to each other, so a waiter either finds the
future already finished or is notified through the Condition it created.

Until then, a future holds only its state and its result (an
``AppendResult`` of a string and two integers), which can form no reference
cycle: ``new_future`` makes it outside the cyclic garbage collector, and it
goes back under it as soon as it gets a Condition (waiters, callbacks) or
an exception (whose traceback may refer to it). Appends queued by the
hundred thousand are thus not gone over by every collection: measured, the
collector took half the CPU time of 100-byte appends to a Gazette cluster.
(CPython does the same for its tuples and dicts of atomic values.) Set no
other attribute on an append future: one that refers back to it would not
be collected.

All this reads and writes ``Future``'s private fields. At import,
``LAYOUT_KNOWN`` checks that a ``Future`` keeps them as expected; where it
does not (another Python), append futures are ``PlainAppendFuture``s, which
go through ``Future``'s public methods alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, Final, Generic, TypeVar

from ._pending import NATIVE

T = TypeVar("T")

_MAKE = threading.Lock()

# The states of a Future, as concurrent.futures spells them (it does not
# export them; tests/journal holds these to a Future's own).
PENDING: Final = "PENDING"
RUNNING: Final = "RUNNING"
CANCELLED: Final = "CANCELLED"
CANCELLED_AND_NOTIFIED: Final = "CANCELLED_AND_NOTIFIED"
FINISHED: Final = "FINISHED"


_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})


class AppendFuture(Future[T], Generic[T]):
    """A Future whose Condition is created lazily (see the module docstring)."""

    # Class-level defaults until set: an append creates one future per call,
    # and every attribute not stored is time saved on the hot path. The empty
    # tuples stand for empty lists until the Condition comes with real ones
    # (nothing adds to them without it); objects not made per future also
    # leave the cyclic garbage collector less to do while appends queue up.
    _cond: threading.Condition | None = None
    _state = PENDING
    _result: Any = None
    _exception: BaseException | None = None
    _waiters: list[Any] = ()  # type: ignore[assignment]
    _done_callbacks: list[Any] = ()  # type: ignore[assignment]

    # No super().__init__(), which would build the Condition: object's own
    # __init__ (C, nothing to do) instead of a Python one.
    __init__ = object.__init__

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _MAKE:
                cond = self._cond
                if cond is None:
                    _track(self)  # Waiters and callbacks may refer to the future.
                    self._waiters = []
                    self._done_callbacks = []
                    cond = self._cond = threading.Condition()
        return cond

    def _resolve_fast(self, result: Any, exc: BaseException | None) -> bool:
        """Resolve without a Condition if none exists yet: True if done so."""
        with _MAKE:
            if self._cond is not None:
                return False
            if self._state not in (PENDING, RUNNING):
                raise InvalidStateError(f"{self._state}: {self!r}")
            if exc is not None:
                _track(self)  # An exception's traceback may refer to the future.
            self._result, self._exception = result, exc
            self._state = FINISHED
        # Nobody held the Condition, so no waiter was installed; callbacks
        # can only have been added through it too.
        return True

    def set_running_or_notify_cancel(self) -> bool:
        with _MAKE:
            if self._cond is None and self._state == PENDING:
                # Cancelling goes through the Condition: with none, nobody did.
                self._state = RUNNING
                return True
        return super().set_running_or_notify_cancel()

    @staticmethod
    def start_all(futures: list[AppendFuture[Any]]) -> list[int] | None:
        """``set_running_or_notify_cancel()`` of each future, taking the
        creation lock once for all those that have no Condition. Returns
        None if every future is now running, else the indices of those that
        are (the others were cancelled)."""
        slow: list[int] = []
        with _MAKE:
            for i, f in enumerate(futures):
                if f._cond is None and f._state == PENDING:
                    f._state = RUNNING
                else:
                    slow.append(i)
        if not slow:
            return None
        cancelled = {i for i in slow if not futures[i].set_running_or_notify_cancel()}
        if not cancelled:
            return None
        return [i for i in range(len(futures)) if i not in cancelled]

    @staticmethod
    def resolve_all(
        futures: list[AppendFuture[Any]], results: list[Any], error: BaseException | None
    ) -> None:
        """Set the result of each future to the item of ``results`` at its
        position, and the exception of those past the end of ``results`` to
        ``error``, taking the creation lock once for all those that have no
        Condition."""
        slow = []
        failed: list[AppendFuture[Any]] = []
        with _MAKE:
            for f, result in zip(futures, results, strict=False):
                if f._cond is None and f._state == RUNNING:
                    f._result = result
                    f._state = FINISHED
                else:
                    slow.append((f, result))
            if error is not None:
                for f in futures[len(results) :]:
                    if f._cond is None and f._state == RUNNING:
                        _track(f)
                        f._exception = error
                        f._state = FINISHED
                    else:
                        failed.append(f)
        for f, result in slow:
            f.set_result(result)
        for f in failed:
            f.set_exception(error)

    def done(self) -> bool:
        if self._cond is None:
            # States only move forward, each set in one step: no lock needed
            # to read one, and no Condition to make for it.
            return self._state in _DONE
        return super().done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._cond is None and self._state == FINISHED:
            return self._exception
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

    @staticmethod
    def start_all(futures: list[Any]) -> list[int] | None:
        """As ``AppendFuture.start_all``."""
        live = [i for i, f in enumerate(futures) if f.set_running_or_notify_cancel()]
        return None if len(live) == len(futures) else live

    @staticmethod
    def resolve_all(futures: list[Any], results: list[Any], error: BaseException | None) -> None:
        """As ``AppendFuture.resolve_all``."""
        for f, result in zip(futures, results, strict=False):
            f.set_result(result)
        if error is not None:
            for f in futures[len(results):]:
                f.set_exception(error)


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

#: The class of append futures: its ``start_all`` and ``resolve_all`` start
#: and resolve a batch of them.
FUTURE: Final[type[AppendFuture[Any]] | type[PlainAppendFuture[Any]]] = (
    AppendFuture if LAYOUT_KNOWN else PlainAppendFuture
)


def _track_nothing(_future: object) -> None:
    """Futures made by ``AppendFuture`` itself are never out of the collector."""


#: ``new_future()`` is a new append future; an ``AppendFuture`` where the
#: native core is built, one out of the cyclic garbage collector (see the
#: module docstring), and ``_track`` puts it back under the collector.
new_future: Callable[[], Future[Any]] = (
    PlainAppendFuture if not LAYOUT_KNOWN
    else AppendFuture if NATIVE is None else NATIVE.make_untracked(AppendFuture)
)
_track: Callable[[object], None] = _track_nothing if NATIVE is None else NATIVE.track
