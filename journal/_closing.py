"""``Closing``: ``with obj:`` closes ``obj`` on the way out; ``CloseAtExit``:
the objects of one kind still open, closed when the interpreter exits."""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Self


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


class CloseAtExit:
    """The objects of one kind still open in this process, closed when the
    interpreter exits (each by its ``close()``, or all at once by
    ``close_all(objects)`` if given; an error there is ignored). In a child
    made by ``fork``, each is told (``after_fork_in_child(obj)``, if given),
    then forgotten if ``forget_in_child`` (objects whose threads are the
    parent's: closing them is the parent's business). Background threads are daemons, so that
    a forgotten object cannot hang the interpreter: closing it at exit
    finishes its work instead.

    Registries close in the reverse order of their making. The clients'
    registry (``CLIENTS``) is made when the journal package is imported, so
    the registry of anything that writes through clients, made by a package
    that imports journal, is closed before the clients are.
    """

    def __init__(
        self,
        after_fork_in_child: Callable[[Any], None] | None = None,
        *,
        close_all: Callable[[list[Any]], None] | None = None,
        forget_in_child: bool = False,
    ) -> None:
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()
        self._after_fork = after_fork_in_child
        self._close_all_of = close_all
        self._forget_in_child = forget_in_child
        atexit.register(self._close_all)
        if (after_fork_in_child is not None or forget_in_child) and \
                hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def add(self, obj: Any) -> None:
        """Close ``obj`` at exit (unless it is gone by then)."""
        self._open.add(obj)

    def discard(self, obj: Any) -> None:
        """``obj`` was closed: nothing to do at exit."""
        self._open.discard(obj)

    def _close_all(self) -> None:
        objects = list(self._open)
        if self._close_all_of is not None:
            with contextlib.suppress(Exception):
                self._close_all_of(objects)
            return
        for obj in objects:
            with contextlib.suppress(Exception):
                obj.close()

    def _after_fork_in_child(self) -> None:
        if self._after_fork is not None:
            for obj in list(self._open):
                self._after_fork(obj)
        if self._forget_in_child:
            self._open = weakref.WeakSet()


def _client_after_fork(client: Any) -> None:
    client._after_fork_in_child()  # (the hook of this package's clients)


#: The journal clients open in this process (``LocalJournalStore``,
#: ``GazetteClient``): closed at exit, their queued appends finished.
CLIENTS: Final = CloseAtExit(_client_after_fork)
