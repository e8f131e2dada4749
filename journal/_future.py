"""``AppendFuture``: a ``concurrent.futures.Future`` without a Condition until
someone waits on it.

A plain ``Future()`` builds a ``threading.Condition`` (an RLock and its
bookkeeping) up front: measured, about half the cost of an append. Most
append futures are never waited on one by one — callers flush, or resolve a
batch and look at results later — so the Condition is made only when a
method that needs it first runs, and a future resolved before that is
resolved without one.

Everything that reads or waits goes through ``_condition``, exactly as in
``Future``; ``_MAKE`` makes the lazy creation and the Condition-free
resolution atomic with respect to each other, so a waiter either finds the
future already finished or is notified through the Condition it created.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import FINISHED, PENDING, RUNNING
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_MAKE = threading.Lock()


class AppendFuture(Future[T], Generic[T]):
    """A Future whose Condition is created lazily (see the module docstring)."""

    # Class-level defaults until set: an append creates one future per call,
    # and every attribute not stored is time saved on the hot path.
    _cond: threading.Condition | None = None
    _state = PENDING
    _result: Any = None
    _exception: BaseException | None = None

    def __init__(self) -> None:  # no super().__init__(): it would build the Condition
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _MAKE:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    def _resolve_fast(self, result: Any, exc: BaseException | None) -> bool:
        """Resolve without a Condition if none exists yet: True if done so."""
        with _MAKE:
            if self._cond is not None:
                return False
            if self._state not in (PENDING, RUNNING):
                raise InvalidStateError(f"{self._state}: {self!r}")
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
    def start_all(futures: list[Future[Any]]) -> list[bool]:
        """``set_running_or_notify_cancel()`` of each future, taking the
        creation lock once for all those that have no Condition."""
        started: list[bool | None] = []
        with _MAKE:
            for f in futures:
                if type(f) is AppendFuture and f._cond is None and f._state == PENDING:
                    f._state = RUNNING
                    started.append(True)
                else:
                    started.append(None)
        return [
            f.set_running_or_notify_cancel() if s is None else s
            for f, s in zip(futures, started, strict=True)
        ]

    @staticmethod
    def resolve_all(futures: list[Future[Any]], outcomes: list[Any]) -> None:
        """Set each future's result, or its exception if the outcome is one,
        taking the creation lock once for all those that have no Condition."""
        slow = []
        with _MAKE:
            for f, outcome in zip(futures, outcomes, strict=True):
                if type(f) is AppendFuture and f._cond is None and f._state == RUNNING:
                    if isinstance(outcome, BaseException):
                        f._exception = outcome
                    else:
                        f._result = outcome
                    f._state = FINISHED
                else:
                    slow.append((f, outcome))
        for f, outcome in slow:
            if isinstance(outcome, BaseException):
                f.set_exception(outcome)
            else:
                f.set_result(outcome)

    def set_result(self, result: T) -> None:
        if not self._resolve_fast(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._resolve_fast(None, exception):
            super().set_exception(exception)
