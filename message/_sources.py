"""``CommittedSource``: one journal read committed in its caller's thread,
and followed as it grows.

A source keeps one ``Sequencer`` for as long as it is read (its ring, and so
its replays, are those of one long read), and reads through a non-blocking
``ReadCommittedIter`` over it: the native loop decodes and sequences without
a Python call per envelope. When the iterator has delivered everything up to
the journal's end, it ends; a ``GrowthWatch`` then holds a blocking read at
that offset and tells when the journal grows, and the source opens a new
iterator from there, over the same Sequencer.

Reading in the caller's thread, rather than in one thread per journal, keeps
the interpreter's lock with the thread that has the work: measured with the
consumer runtime, reader threads cost a third of a busy shard's throughput.
The consumer's shards and ``ReadCommittedSelectorIter`` read their journals
this way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from journal import JournalError, OffsetNotYetAvailableError, metrics

from ._checkpoint import Checkpoint
from ._reader import ReadCommittedIter

if TYPE_CHECKING:
    import datetime

    from journal import JournalClient, JournalReader

    from ._envelope import ProducerState
    from ._interfaces import NewMessageFunc
    from ._sequencer import Sequencer
else:
    from ._core import Sequencer

log = logging.getLogger("message")


def _nothing() -> None:
    pass


class GrowthWatch:
    """Tells when ``journal`` grows past an offset: a thread that, each time
    it is armed, holds a blocking read at the offset until a byte arrives,
    then sets ``grown`` and calls ``notify``. A read that fails calls
    ``fail(journal, error)`` instead."""

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        notify: Callable[[], None],
        fail: Callable[[str, BaseException], None],
    ) -> None:
        self.journal = journal
        self.grown = False
        self._client = client
        self._notify = notify
        self._fail = fail
        self._cond = threading.Condition()
        self._armed: int | None = None
        self._reader: JournalReader | None = None
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"exactly watch {journal}", daemon=True
        )
        self._thread.start()

    def arm(self, offset: int) -> None:
        """Watch for bytes at ``offset`` (``grown`` is False until they come)."""
        with self._cond:
            self.grown = False
            self._armed = offset
            self._cond.notify_all()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._armed is None and not self._stopping:
                    cond.wait()
                if self._stopping:
                    return
                offset, self._armed = self._armed, None
                assert offset is not None
                try:
                    reader = self._reader = self._client.read(self.journal, offset, block=True)
                except Exception as exc:
                    self._fail(self.journal, exc)
                    return
            try:
                data = reader.read(1)
            except Exception as exc:
                if not self._stopping:
                    self._fail(self.journal, exc)
                return
            finally:
                with cond:
                    self._reader = None
                reader.close()
            if self._stopping:
                return
            if not data:
                # A following read ends only when its reader or client is closed.
                self._fail(self.journal, JournalError(
                    f"reading {self.journal} ended: was the journal client closed?"))
                return
            self.grown = True
            self._notify()

    def stop(self) -> None:
        """End the thread (a blocked read returns) and wait for it."""
        with self._cond:
            self._stopping = True
            reader = self._reader
            self._cond.notify_all()
        if reader is not None:
            reader.close()
        if self._thread is not threading.current_thread():
            self._thread.join()


class CommittedSource:
    """One journal read committed from ``offset`` with producer ``states``,
    in the caller's thread: a non-blocking ``ReadCommittedIter`` over one
    Sequencer kept for as long as the source is read.

    ``it`` is the open iterator, or None once it has read everything up to
    the journal's end (``end``, after ``ended()``). With ``follow``, a thread
    then waits for the journal to grow: ``grown`` says it did, and
    ``reopen()`` reads on; ``notify()`` is called when it grows,
    ``fail(journal, error)`` if waiting fails (without ``fail``, ``reopen()``
    raises the error). Without ``follow``, a source
    that ended stays ended. ``checkpoint()`` is valid between any two of
    its envelopes. ``include_acks=False`` leaves out the ACK_TXN messages
    that commit (see ``ReadCommittedIter``). The building block of the
    consumer runtime's shards and of ``ReadCommittedSelectorIter``.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        new_message: NewMessageFunc,
        *,
        offset: int = 0,
        states: Iterable[ProducerState] = (),
        follow: bool = True,
        notify: Callable[[], None] | None = None,
        fail: Callable[[str, BaseException], None] | None = None,
        include_acks: bool = True,
    ) -> None:
        self.journal = journal
        self._include_acks = include_acks
        self._error: BaseException | None = None  # the watch's, without ``fail``
        self.watch: GrowthWatch | None = (
            GrowthWatch(client, journal, notify or _nothing, fail or self._watch_failed)
            if follow else None
        )
        self._client = client
        self._new_message = new_message
        self.sequencer: Sequencer = Sequencer(list(states))
        self.end = offset
        self.it: ReadCommittedIter | None = None
        try:
            self.reopen()
        except BaseException:
            self.close()
            raise

    @property
    def grown(self) -> bool:
        """The source ended, and its journal has grown since (or, without
        ``fail``, waiting failed: ``reopen()`` raises the error)."""
        return self.it is None and self.watch is not None and (
            self.watch.grown or self._error is not None)

    def _watch_failed(self, journal: str, error: BaseException) -> None:
        self._error = error

    def reopen(self) -> None:
        """Read on from ``end``, over the same Sequencer.

        A journal that says it ends before ``end`` (a Gazette broker that
        has not caught up with the journal after a failover says so until
        its replication pipeline is synchronised) is waited for, as a
        journal that has not grown: the watch's blocking read at ``end``
        tells when it has. Without ``follow`` the error is raised."""
        if self._error is not None:
            raise self._error
        try:
            self.it = ReadCommittedIter(
                self._client, self.journal, self._new_message, self.sequencer, offset=self.end,
                include_acks=self._include_acks,
            )
        except OffsetNotYetAvailableError as exc:
            if self.watch is None:
                raise
            log.warning(
                "journal %s ends at %d, before offset %d where its reading resumes:"
                " waiting until it reaches it", self.journal, exc.head, self.end)
            self.it = None
            self.watch.arm(self.end)

    def ended(self) -> None:
        """The iterator read everything there was: remember where, and
        watch for more (with ``follow``)."""
        it = self.it
        assert it is not None
        self.end = it.checkpoint().offsets[self.journal]
        it.close()
        self.it = None
        if self.watch is not None:
            self.watch.arm(self.end)

    def checkpoint(self, prune_horizon: float | datetime.timedelta = 0) -> Checkpoint:
        """Where to resume this source (valid between any two of its envelopes)."""
        if self.it is not None:
            return self.it.checkpoint(prune_horizon)
        return Checkpoint({self.journal: self.end},
                          self.sequencer.producer_states(prune_horizon))

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.it is not None:
            self.it.close()
            self.it = None
        metrics.forget_open_spans(self.sequencer)
