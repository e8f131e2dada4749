"""A shard's sources: each journal read committed, in the shard's own thread.

Each source keeps one ``Sequencer`` for as long as the shard serves (its
ring, and so its replays, are those of one long read), and reads through a
non-blocking ``ReadCommittedIter`` over it: the native loop decodes and
sequences without a Python call per envelope. When a source has delivered
everything up to its journal's end, its iterator ends; a ``GrowthWatch``
then holds a blocking read at that offset and tells the shard when the
journal grows, and the source opens a new iterator from there, over the same
Sequencer.

Reading in the shard's thread, rather than in one thread per source, keeps
the interpreter's lock with the thread that has the work: measured, the
reader threads cost a third of the throughput of a busy shard.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from journal import OffsetNotYetAvailableError
from message import Checkpoint, ProducerState, ReadCommittedIter, Sequencer

from ._errors import ConsumerError

if TYPE_CHECKING:
    import datetime

    from journal import JournalClient, JournalReader
    from message import NewMessageFunc

log = logging.getLogger("consumer")


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
                self._fail(self.journal, ConsumerError(
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


class Source:
    """One source journal of a shard, read committed from a checkpoint.

    ``it`` is the open iterator, or None once it has read everything up to
    the journal's end (``end``), until ``reopen``.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        new_message: NewMessageFunc,
        offset: int,
        states: list[ProducerState],
        watch: GrowthWatch,
    ) -> None:
        self.journal = journal
        self.watch = watch
        self._client = client
        self._new_message = new_message
        self.sequencer: Sequencer = Sequencer(states)
        self.end = offset
        self.it: ReadCommittedIter | None = None
        self.reopen()

    def reopen(self) -> None:
        """Read on from ``end``, over the same Sequencer.

        A journal that says it ends before ``end`` (a Gazette broker that
        has not caught up with the journal after a failover says so until
        its replication pipeline is synchronised) is waited for, as a
        journal that has not grown: the watch's blocking read at ``end``
        tells when it has."""
        try:
            self.it = ReadCommittedIter(
                self._client, self.journal, self._new_message, self.sequencer, offset=self.end
            )
        except OffsetNotYetAvailableError as exc:
            log.warning(
                "source %s ends at %d, before offset %d where this shard reads on:"
                " waiting until it reaches it", self.journal, exc.head, self.end)
            self.it = None
            self.watch.arm(self.end)

    def ended(self) -> None:
        """The iterator read everything there was: remember where, and watch
        for more."""
        it = self.it
        assert it is not None
        self.end = it.checkpoint().offsets[self.journal]
        it.close()
        self.it = None
        self.watch.arm(self.end)

    def checkpoint(self, prune_horizon: float | datetime.timedelta) -> Checkpoint:
        """Where to resume this source (valid between any two of its envelopes)."""
        if self.it is not None:
            return self.it.checkpoint(prune_horizon)
        return Checkpoint({self.journal: self.end},
                          self.sequencer.producer_states(prune_horizon))

    def close(self) -> None:
        self.watch.stop()
        if self.it is not None:
            self.it.close()
            self.it = None
