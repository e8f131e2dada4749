"""The appends queued for a journal's writer thread, and when to start or
wake it: the part of ``AppendQueue`` every append goes through.

``PyPending`` is the definition; ``journal/_native.c`` implements the same
type natively, and ``Pending`` is bound to it when it is built (unless
``EXACTLY_PURE_PYTHON`` is set). Nothing here waits: the writer thread waits
on ``AppendQueue``'s condition, and ``Pending`` only says whether it may.

- ``submit(data)``: queue ``data``; its future is made by the current group
  (``new_group()``, an ``AppendGroup`` of journal/_future.py: ``add(len(data))``).
  Raises ``closed()`` once stopping. If no writer thread runs, ``start()``
  is called; if it is idle, ``wake()`` (both after the lock is released).
- ``take()``: everything queued, as ``(data, group)``, oldest first, and a
  new group for what comes next; ``([], None)`` if nothing is queued.
- ``begin_idle()``: True (and the thread is idle) if nothing is queued;
  ``end_idle()`` when it wakes up.
- ``exit()``: True if the thread may exit (nothing queued, or stopping):
  it no longer runs, and the next ``submit`` starts another.
- ``stop()``: no more appends; ``running`` says whether a thread runs.

Back-pressure: with ``MAX_QUEUED`` appends queued and a writer thread
running, ``submit`` waits (a tenth of a millisecond at a time, without the
GIL, ``MAX_WAIT`` seconds at most) for the writer to take them. A producer
much faster than the disk thus holds a bounded backlog of futures, which
the cyclic garbage collector would otherwise go over again and again:
measured, that made 100-byte appends 1.6 times faster.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

_START: Final = 1
_WAKE: Final = 2

#: See the module docstring (journal/_native.c has the same numbers).
MAX_QUEUED: Final = 32768
MAX_WAIT: Final = 2.0
_WAIT_STEP: Final = 1e-4


class PyPending:
    """See the module docstring."""

    __slots__ = (
        "_closed", "_data", "_group", "_idle", "_lock", "_new_group", "_start", "_stopping",
        "_taken", "_wake", "running",
    )

    def __init__(
        self,
        new_group: Callable[[], Any],
        closed: Callable[[], BaseException],
        start: Callable[[], None],
        wake: Callable[[], None],
    ) -> None:
        self._new_group = new_group
        self._closed = closed
        self._start = start
        self._wake = wake
        self._lock = threading.Lock()
        # Appends' bytes, and the group that makes and resolves their futures.
        self._data: list[bytes] = []
        self._group = new_group()
        self._taken = 0  # appends taken by the writer thread so far
        self._stopping = False
        self._idle = False
        self.running = False

    def submit(self, data: bytes) -> Any:
        # acquire/release rather than `with`: half the cost, per append.
        lock = self._lock
        lock.acquire()
        try:
            waited = 0.0
            while (len(self._data) >= MAX_QUEUED and self.running and not self._stopping
                   and waited < MAX_WAIT):
                lock.release()
                try:
                    time.sleep(_WAIT_STEP)
                    waited += _WAIT_STEP
                finally:
                    lock.acquire()
            if self._stopping:
                raise self._closed()
            future = self._group.add(len(data))
            self._data.append(data)
            action = 0
            if not self.running:
                self.running = True
                action = _START
            elif self._idle:
                self._idle = False
                action = _WAKE
        finally:
            lock.release()
        if action == _START:
            try:
                self._start()
            except BaseException:
                with lock:
                    self.running = False
                raise
        elif action == _WAKE:
            self._wake()
        return future

    def take(self) -> tuple[list[bytes], Any]:
        with self._lock:
            if not self._data:
                return [], None
        group = self._new_group()  # (made without the lock, as natively)
        with self._lock:
            data, taken = self._data, self._group
            self._data, self._group = [], group
            self._taken += len(data)
            return data, taken

    def issued(self) -> int:
        """Appends queued so far: taken, and waiting."""
        with self._lock:
            return self._taken + len(self._data)

    def begin_idle(self) -> bool:
        with self._lock:
            if self._data or self._stopping:
                return False
            self._idle = True
            return True

    def end_idle(self) -> None:
        with self._lock:
            self._idle = False

    def exit(self) -> bool:
        with self._lock:
            if self._data:
                return False
            self.running = False
            return True

    def stop(self) -> None:
        with self._lock:
            self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping


def _load() -> ModuleType | None:
    """The native module, or None. Where it was not built, the message
    package's one warning says so for the whole native core."""
    if os.environ.get("EXACTLY_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _native
    except ImportError:
        return None
    native: ModuleType = _native
    return native


NATIVE: Any = _load()

#: The implementation in use: the native one when it is built.
Pending: type[PyPending] = PyPending if NATIVE is None else NATIVE.Pending
