"""The journal client a shard's Publisher appends through: the runner's own
client, which also keeps the future of every append made through it.

A commit must wait until the transaction's messages (and the previous
transaction's ACKs) are durable, and must not commit if one of them failed.
The client's ``flush`` waits for every append of every shard that shares
it, and hands each failure to whichever caller flushes first; this view
keeps the shard's own futures instead, so that a commit waits for its own
appends and sees its own failures.
"""

from __future__ import annotations

import builtins
import time
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self

if TYPE_CHECKING:
    from journal import AppendResult, JournalClient, JournalReader, JournalSpec, LabelSelector

#: Look over the futures kept when there are this many, forgetting those
#: that are done (a failure is kept until it is reported).
_PRUNE_AT: Final = 4096


class RecordingClient:
    """A ``JournalClient`` that appends through ``client`` and keeps every
    append's future until :meth:`settle` (see the module docstring)."""

    __slots__ = ("_append", "_client", "_error", "_futures", "_prune_at")

    def __init__(self, client: JournalClient) -> None:
        self._client = client
        self._append = client.append
        self._futures: list[Future[AppendResult]] = []
        self._prune_at = _PRUNE_AT
        self._error: BaseException | None = None  # the first failure not yet reported

    def append(self, name: str, data: bytes) -> Future[AppendResult]:
        future = self._append(name, data)
        futures = self._futures
        futures.append(future)
        if len(futures) >= self._prune_at:
            self._prune()
        return future

    def _prune(self) -> None:
        pending = []
        for f in self._futures:
            if not f.done():
                pending.append(f)
            elif self._error is None:
                self._error = f.exception()
        self._futures = pending
        # Amortized: an append queue far behind does not make every append prune.
        self._prune_at = max(_PRUNE_AT, 2 * len(pending))

    @property
    def outstanding(self) -> bool:
        """True if an append is kept that :meth:`settle` has not reported."""
        return bool(self._futures) or self._error is not None

    def settle(self, timeout: float | None = None) -> None:
        """Wait until every append made so far is resolved, forget them, and
        raise the first that failed. ``TimeoutError`` past ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        futures, self._futures = self._futures, []
        self._prune_at = _PRUNE_AT
        pruned, self._error = self._error, None
        error: BaseException | None = None
        # Newest first: a journal's appends resolve in order, so waiting on
        # its newest leaves the older ones done, read without waiting.
        for f in reversed(futures):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                exc = f.exception(left)
            except TimeoutError:
                self._futures = futures  # still owed: a later settle waits again
                self._error = pruned
                raise
            if exc is not None:
                error = exc  # the oldest failure is the last one met
        error = pruned or error
        if error is not None:
            raise error

    # The rest of JournalClient, as the client does it.

    def list(self, selector: str | LabelSelector = "") -> builtins.list[JournalSpec]:
        return self._client.list(selector)

    def get(self, name: str) -> JournalSpec:
        return self._client.get(name)

    def read(
        self, name: str, offset: int = 0, end_offset: int | None = None, *, block: bool = False
    ) -> JournalReader:
        return self._client.read(name, offset, end_offset, block=block)

    def flush(self, timeout: float | None = None) -> None:
        self.settle(timeout)

    def close(self) -> None:
        """Nothing of its own to release: the runner's client is not closed."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
