"""``Closing``: ``with obj:`` closes ``obj`` on the way out; ``OpenClients``:
the clients of one kind still open, closed when the interpreter exits."""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from types import TracebackType
from typing import Any, Self


class Closing:
    """The context-manager protocol of everything the library opens:
    ``__enter__`` returns the object, ``__exit__`` calls its ``close()``
    (which a subclass defines), whatever left the block."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class OpenClients:
    """The clients of one kind that are open in this process. Their writer
    threads are daemons, so that a forgotten client cannot hang the
    interpreter: at exit each is closed instead (its queued appends
    finished); in a child after ``fork`` each is told
    (``_after_fork_in_child``)."""

    def __init__(self) -> None:
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()
        atexit.register(self._close_all)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def add(self, client: Any) -> None:
        self._open.add(client)

    def _close_all(self) -> None:
        for client in list(self._open):
            with contextlib.suppress(Exception):
                client.close()

    def _after_fork_in_child(self) -> None:
        for client in list(self._open):
            client._after_fork_in_child()
