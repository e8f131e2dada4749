"""Appends whose outcome their maker must know: ``PendingAppends``, the
futures of appends not yet settled, and ``TrackingClient``, a client whose
every append goes there.

A writer that commits something because its appends landed (a consumer's
checkpoint, a transaction's ACKs) must wait until they are durable and must
not go on if one failed. ``JournalClient.flush`` waits for every append of
the client, and hands each failure to whichever caller flushes first: two
writers sharing a client would wait for each other and could miss their
own failures. Each keeps a ``PendingAppends`` of its own instead::

    tracked = TrackingClient(client)      # a JournalClient: append, read, ...
    publisher = Publisher(tracked)        # its appends are tracked
    ...
    tracked.pending.settle()              # durable, or the first failure raised

Futures are kept in a list, and those done without failure are dropped now
and then, so memory follows the appends in flight, not those made.
``scan_futures`` (native where built, ``py_scan_futures`` the definition)
reads a list of futures in one pass.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any, Final, Generic, ParamSpec, Protocol

from ._closing import Closing
from ._future import LAYOUT_KNOWN, AppendFuture
from ._pending import NATIVE

if TYPE_CHECKING:
    from ._interfaces import JournalClient, JournalReader
    from ._labels import LabelSelector
    from ._spec import AppendResult, JournalSpec

P = ParamSpec("P")

#: Look over the futures kept when there are this many (at least).
PRUNE_AT: Final = 4096


def py_scan_futures(
    futures: builtins.list[Future[Any]],
) -> tuple[BaseException | None, builtins.list[Future[Any]]]:
    """The first failure among the futures that are done (in list order),
    and those not done yet."""
    error: BaseException | None = None
    pending = []
    for f in futures:
        if not f.done():
            pending.append(f)
            continue
        if error is None:
            try:
                error = f.exception(0)
            except CancelledError as exc:
                error = exc
    return error, pending


#: ``py_scan_futures``, natively where built (append futures read in C).
scan_futures: Callable[
    [builtins.list[Future[Any]]], tuple[BaseException | None, builtins.list[Future[Any]]]
]= (
    NATIVE.ScanFutures(AppendFuture) if NATIVE is not None and LAYOUT_KNOWN else py_scan_futures
)


class Recorder(Protocol[P]):
    """What :meth:`PendingAppends.recorder` makes: ``append`` that keeps each
    future, until :meth:`close`."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Future[AppendResult]: ...

    def close(self, message: str) -> None:
        """Every later call raises ``RuntimeError(message)`` (the first
        message given stays), without calling ``append``."""

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""


class Recording(Generic[P]):
    """The definition of a recorder (``journal._native.RecordingAppend`` is
    the same, without a Python call per append)."""

    def __init__(self, append: Callable[P, Future[AppendResult]], pending: PendingAppends) -> None:
        self._append = append
        self._pending = pending
        self._closed: str | None = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Future[AppendResult]:
        if self._closed is not None:
            raise RuntimeError(self._closed)
        future = self._append(*args, **kwargs)
        self._pending.add(future)
        return future

    def close(self, message: str) -> None:
        if self._closed is None:
            self._closed = message

    @property
    def closed(self) -> bool:
        return self._closed is not None


class PendingAppends:
    """The futures of appends not yet settled (see the module docstring)."""

    def __init__(self) -> None:
        self._futures: builtins.list[Future[AppendResult]] = []
        self._prune_at = PRUNE_AT
        self._error: BaseException | None = None  # found by a prune, not yet raised

    def add(self, future: Future[AppendResult]) -> None:
        """Keep ``future`` until the next :meth:`settle`."""
        futures = self._futures
        futures.append(future)
        if len(futures) >= self._prune_at:
            self.prune()

    def prune(self) -> int:
        """Forget the futures done without failure (keeping the first
        failure); returns when to look again (by the count kept)."""
        error, pending = scan_futures(self._futures)
        if self._error is None:
            self._error = error
        self._futures[:] = pending
        # Amortized: appends far behind do not make every add prune.
        self._prune_at = max(PRUNE_AT, 2 * len(pending))
        return self._prune_at

    def recorder(self, append: Callable[P, Future[AppendResult]]) -> Recorder[P]:
        """``append`` that also keeps each future here, until its ``close``:
        a client's ``append`` made to track its appends, or a Publisher's
        ``publish_uncommitted`` (native where built: no Python call)."""
        if NATIVE is not None:
            recording: Recorder[P] = NATIVE.RecordingAppend(
                append, self._futures, self.prune, PRUNE_AT
            )
            return recording
        return Recording(append, self)

    def __len__(self) -> int:
        """How many futures are kept (done ones are dropped now and then)."""
        return len(self._futures)

    @property
    def outstanding(self) -> bool:
        """True if an append is kept that :meth:`settle` has not reported."""
        return bool(self._futures) or self._error is not None

    def settle(self, timeout: float | None = None) -> None:
        """Wait until every append kept is resolved, forget them all, and
        raise the first that failed. ``TimeoutError`` past ``timeout``
        seconds (the appends are then still kept)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        error, pending = scan_futures(self._futures)
        while pending:
            # Wait on the newest: a journal's appends resolve in order, so
            # once it is done, so are the older ones of its journal, which
            # the scan then drops without a wait of their own.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            with contextlib.suppress(CancelledError):  # scanned as a failure below
                pending[-1].exception(left)
            late, pending = scan_futures(pending)
            error = error or late
        error = self._error or error
        self._futures.clear()
        self._prune_at = PRUNE_AT
        self._error = None
        if error is not None:
            raise error


class TrackingClient(Closing):
    """A ``JournalClient`` that appends through ``client`` and keeps each
    append's future in ``pending`` (a :class:`PendingAppends`); everything
    else is the client's. ``close`` leaves the client open."""

    def __init__(self, client: JournalClient) -> None:
        self.client = client
        self.pending = PendingAppends()
        self.append = self.pending.recorder(client.append)  # type: ignore[method-assign]

    def append(self, name: str, data: bytes) -> Future[AppendResult]:
        """Append through the client; the future is kept in ``pending``
        (an instance's ``append`` is ``pending.recorder(client.append)``)."""
        future = self.client.append(name, data)
        self.pending.add(future)
        return future

    def list(self, selector: str | LabelSelector = "") -> builtins.list[JournalSpec]:
        return self.client.list(selector)

    def get(self, name: str) -> JournalSpec:
        return self.client.get(name)

    def read(
        self, name: str, offset: int = 0, end_offset: int | None = None, *, block: bool = False
    ) -> JournalReader:
        return self.client.read(name, offset, end_offset, block=block)

    def flush(self, timeout: float | None = None) -> None:
        """Settle the appends made through this client."""
        self.pending.settle(timeout)

    def close(self) -> None:
        """Nothing of its own to release: ``client`` stays open."""

