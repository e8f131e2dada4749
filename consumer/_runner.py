"""``Runner``: serves the shards of an application, each on its own thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self, final

from journal import JournalError

from ._interfaces import check_application
from ._shard import ShardSpec
from ._txn import ShardLoop

if TYPE_CHECKING:
    from journal import JournalClient

    from ._interfaces import Application

log = logging.getLogger("consumer")

#: run_until_idle looks again at least this often (seconds).
_IDLE_POLL = 0.05


@final
class Runner:
    """Runs ``shards`` of ``app``, reading and publishing through ``client``.

    Each shard runs on a thread of its own (and one more per source
    journal, reading ahead). :meth:`run_until_idle` processes until every
    shard has read its sources to their write heads and committed and
    acknowledged everything; :meth:`start` serves in the background until
    :meth:`stop`. A shard that fails (an exception of the application, a
    ``FencedError``, a store or journal error) stops without committing its
    transaction; its exception is raised, as it is, by ``run_until_idle``
    (by every later call too: the shard stays stopped) or, if no call
    raised it, by ``stop``. After ``stop``, ``start`` or ``run_until_idle``
    starts every shard afresh from its store. Leaving a ``with`` block
    stops the runner.
    """

    def __init__(
        self, client: JournalClient, app: Application, shards: Sequence[ShardSpec]
    ) -> None:
        specs = tuple(shards)
        for spec in specs:
            if not isinstance(spec, ShardSpec):
                raise TypeError(f"shards must be ShardSpecs, not {type(spec).__name__}")
        ids = [s.id for s in specs]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"shard ids must be unique: {', '.join(dup)} given twice")
        check_application(app)
        self._client = client
        self._app = app
        self._specs = specs
        self._loops: list[ShardLoop] = []
        self._cond = threading.Condition()
        self._progress = 0
        # The errors raised already, by id(), with the traceback each came with.
        self._reported: dict[int, TracebackType | None] = {}

    @property
    def shards(self) -> tuple[ShardSpec, ...]:
        return self._specs

    def start(self) -> None:
        """Serve the shards in the background (if not serving already)."""
        if self._loops:
            return
        self._loops = [
            ShardLoop(self._client, self._app, spec, self._progressed) for spec in self._specs
        ]
        for loop in self._loops:
            loop.start()

    def _progressed(self) -> None:
        with self._cond:
            self._progress += 1
            self._cond.notify_all()

    def run_until_idle(self, timeout: float | None = None) -> None:
        """Process until every shard is idle: each source read to its write
        head (taken again after each commit, so that a chain of shards in
        this runner drains), every transaction committed and acknowledged.
        It first waits for the appends issued through the client so far,
        so that what the caller wrote before the call is read. Starts the
        shards if they are not running; they keep serving after it
        returns. Raises ``TimeoutError`` past ``timeout`` seconds, and
        the exception of a shard that failed (again on each call, until
        ``stop``)."""
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_for_appends(timeout, deadline)
        while True:
            self._raise_failure(again=True)
            with self._cond:
                seen = self._progress
            if self._all_idle():
                with self._cond:
                    if self._progress == seen:
                        return
                continue
            with self._cond:
                wait = _IDLE_POLL
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                if self._progress == seen and wait > 0:
                    self._cond.wait(wait)
            if deadline is not None and time.monotonic() >= deadline:
                self._raise_failure(again=True)
                raise TimeoutError(
                    f"the shards were not idle after {timeout} s: {self._describe_busy()}"
                )

    def _wait_for_appends(self, timeout: float | None, deadline: float | None) -> None:
        """Wait until the appends issued through the client so far are
        durable (their failures are their futures' to report)."""
        flush = getattr(self._client, "flush", None)
        if flush is None:
            return
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            flush(left)
        except TimeoutError:
            raise TimeoutError(
                f"the appends issued before were not durable after {timeout} s"
            ) from None
        except JournalError as err:
            log.debug("waiting for the appends issued before: %s", err)

    def _all_idle(self) -> bool:
        return all(loop.caught_up(self._head) for loop in self._loops)

    def _head(self, journal: str) -> int:
        try:
            head = getattr(self._client, "head", None)
            if head is not None:
                return int(head(journal))
            with self._client.read(journal, -1) as r:
                return r.offset
        except JournalError:
            return 1 << 62  # not known now: not idle

    def _describe_busy(self) -> str:
        busy = []
        for loop in self._loops:
            if loop.finished:
                continue
            if not loop.quiescent:
                busy.append(f"{loop.spec.id} (in a transaction)")
        return ", ".join(busy) or "their sources grew while they read"

    def _raise_failure(self, *, again: bool = False) -> None:
        """Raise the first shard's failure not raised yet, else, ``again``,
        the first failure (with the traceback it first came with)."""
        failed = [loop.error for loop in self._loops if loop.error is not None]
        for err in failed:
            if id(err) not in self._reported:
                self._reported[id(err)] = err.__traceback__
                raise err
        if again and failed:
            err = failed[0]
            raise err.with_traceback(self._reported[id(err)])

    def stop(self) -> None:
        """Commit each shard's open transaction (a fenced shard abandons its
        own), stop the shards and wait for them; raise the first failure not
        raised before."""
        loops = self._loops
        for loop in loops:
            loop.request_stop()
        for loop in loops:
            loop.join()
        try:
            self._raise_failure()
        finally:
            self._loops = []
            self._reported.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
            return
        try:
            self.stop()
        except Exception as err:  # the exception leaving the block says more
            log.warning("while stopping after %s: a shard failed: %s", type(exc).__name__, err)
