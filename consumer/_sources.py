"""A shard's source readers: one thread per source journal, reading it
uncommitted and following its appends, into the shard's inbox.

The transaction loop sequences what the readers deliver, as Gazette's
consumer does with its read channel: the readers decode frames (their time
overlaps the commits of the loop, which wait on fsyncs and appends), while
the Sequencer, whose state the checkpoint records, stays the loop's alone.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Final

from message import ReadUncommittedIter

from ._errors import ConsumerError

if TYPE_CHECKING:
    from journal import JournalClient
    from message import Envelope, NewMessageFunc

#: At most this many envelopes wait in a shard's inbox: a reader that is
#: this far ahead pauses (polling every ``_FULL_POLL`` seconds) until the
#: loop has taken a quarter of them.
INBOX_LIMIT: Final = 16384
_FULL_POLL: Final = 0.002


class Inbox:
    """Envelopes delivered by the readers, in arrival order (each journal's
    in its own order), and the wake-up of the loop that waits for them.

    A reader appends, then notifies only if the loop said it is waiting:
    the loop sets ``waiting`` under the condition before it looks at
    ``items`` one last time, so no delivery slips between the two. A reader
    that fails sets ``failure`` (journal, error) after delivering all it
    read; the loop looks at it only once ``items`` is empty.
    """

    def __init__(self) -> None:
        self.items: deque[Envelope] = deque()
        self.cond = threading.Condition()
        self.waiting = False
        self.stopping = False
        self.failure: tuple[str, BaseException] | None = None

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def fail(self, journal: str, error: BaseException) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = (journal, error)
            self.cond.notify_all()

    def wait(self, timeout: float | None) -> None:
        """Block until something is delivered, the inbox is stopped, or
        ``timeout`` seconds pass (called by the loop with nothing to take)."""
        with self.cond:
            self.waiting = True
            try:
                if not self.items and not self.stopping and self.failure is None:
                    self.cond.wait(timeout)
            finally:
                self.waiting = False


class SourceReader:
    """Reads one source journal uncommitted, from ``offset``, following its
    appends, into ``inbox``; ``delivered`` is the offset just past the last
    envelope delivered (set after it is in the inbox)."""

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        new_message: NewMessageFunc,
        offset: int,
        inbox: Inbox,
    ) -> None:
        self.journal = journal
        self.delivered = offset
        self._inbox = inbox
        # Made here, in the loop's thread, so that a missing journal or a
        # bad offset raises where the shard starts.
        self._it = ReadUncommittedIter(client, journal, new_message, offset=offset, block=True)
        self._thread = threading.Thread(
            target=self._run, name=f"exactly read {journal}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        inbox = self._inbox
        items = inbox.items
        append = items.append
        try:
            for env in self._it:
                append(env)
                self.delivered = env.end
                if inbox.waiting:
                    inbox.wake()
                if len(items) >= INBOX_LIMIT:
                    while len(items) > INBOX_LIMIT * 3 // 4 and not inbox.stopping:
                        time.sleep(_FULL_POLL)
            # A following read ends only when its reader or client is closed.
            raise ConsumerError(f"reading {self.journal} ended: was the journal client closed?")
        except Exception as exc:
            if not inbox.stopping:
                inbox.fail(self.journal, exc)
        finally:
            self._it.close()

    def interrupt(self) -> None:
        """Make the reader stop soon: a blocked read returns (any thread)."""
        self._it.interrupt()

    def stop(self) -> None:
        """Interrupt the reader and wait for its thread to end."""
        self._it.interrupt()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
