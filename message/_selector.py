"""``ReadCommittedSelectorIter``: the committed messages of every journal a
label selector matches, as journals come and go.

Each journal is a ``CommittedSource`` (read committed over a Sequencer of
its own, in the iterating thread); the journals take turns, a few hundred
envelopes at a time, so that a busy one does not starve the others. A
``journal.WatchedList`` keeps the selector's listing current (a watching
List RPC on a Gazette cluster): a journal that appears is read from its
beginning (or from the checkpoint's offset), one that goes away is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Final

from journal import Closing, JournalNotFoundError, WatchedList

from ._checkpoint import Checkpoint
from ._sources import CommittedSource

if TYPE_CHECKING:
    import datetime

    from journal import JournalClient, LabelSelector

    from ._envelope import Envelope
    from ._interfaces import NewMessageFunc

#: A journal hands over at most this many envelopes before the next one
#: with envelopes ready takes its turn.
TURN: Final = 256


class ReadCommittedSelectorIter(Closing):
    """Iterates the committed messages of the journals matching ``selector``
    (label selector syntax, as ``JournalClient.list``), each journal's in its
    own order, the journals taking turns.

    With ``block=True`` (the default) it follows: it waits for journals to
    grow and picks up journals that appear, until ``close()``; with
    ``block=False`` it ends once every journal of the listing has been read
    to the end it had when it was reached.

    :meth:`checkpoint` may be called between any two yields: the read
    offsets and producer states of every journal, as one ``Checkpoint``. An
    iterator made with ``checkpoint=`` resumes each journal from it (and a
    journal it does not name from its beginning), with nothing lost and
    nothing repeated. A journal that leaves the listing is no longer read
    and leaves the checkpoint.

    ``interval``: how often a client that cannot watch a listing (any but a
    Gazette cluster's) lists the selector again. ``include_acks=False``
    leaves out the ACK_TXN messages that commit (see ``ReadCommittedIter``).
    """

    def __init__(
        self,
        client: JournalClient,
        selector: str | LabelSelector,
        new_message: NewMessageFunc,
        *,
        block: bool = True,
        checkpoint: Checkpoint | None = None,
        interval: float = 1.0,
        include_acks: bool = True,
    ) -> None:
        self._client = client
        self._new_message = new_message
        self._include_acks = include_acks
        self._block = block
        self._start = checkpoint or Checkpoint({}, [])
        self._cond = threading.Condition()
        self._failures: dict[str, BaseException] = {}
        # Journals listed but found deleted: not read until the listing drops them.
        self._gone: set[str] = set()
        self._closed = False
        self._sources: dict[str, CommittedSource] = {}
        self._order: list[CommittedSource] = []
        self._listed = WatchedList(client, selector, interval=interval)
        self._version = -1
        try:
            self._sync()
        except BaseException:
            self.close()
            raise
        self._gen = self._generate()

    @property
    def journals(self) -> list[str]:
        """The journals being read, in the order they take turns."""
        return [s.journal for s in self._order]

    def __iter__(self) -> Iterator[Envelope]:
        return self._gen

    def __next__(self) -> Envelope:
        return next(self._gen)

    def _sync(self) -> None:
        """Open a source for each journal newly listed; drop the gone ones."""
        version = self._listed.version
        if version == self._version:
            return
        self._version = version
        names = [spec.name for spec in self._listed()]
        listed = set(names)
        for name in [n for n in self._sources if n not in listed]:
            self._drop(name)
        self._gone &= listed
        for name in names:
            if name not in self._sources and name not in self._gone:
                self._open(name)
        self._order = [self._sources[n] for n in names if n in self._sources]

    def _open(self, name: str) -> None:
        start = self._start
        try:
            self._sources[name] = CommittedSource(
                self._client, name, self._new_message,
                offset=start.offsets.get(name, 0),
                states=[s for s in start.states if s.journal == name],
                follow=self._block, notify=self._wake, fail=self._fail,
                include_acks=self._include_acks,
            )
        except JournalNotFoundError:
            self._gone.add(name)  # deleted since it was listed

    def _drop(self, name: str) -> None:
        """Read ``name`` no more (it left the listing, or was deleted). Should
        it come back, it is a new journal: read from its beginning."""
        src = self._sources.pop(name, None)
        if src is not None:
            src.close()
        self._order = [s for s in self._order if s.journal != name]
        self._failures.pop(name, None)
        self._start = Checkpoint(
            {j: o for j, o in self._start.offsets.items() if j != name},
            [st for st in self._start.states if st.journal != name],
        )

    def _deleted(self, name: str) -> None:
        """``name`` was deleted: read it no more, until the listing drops it."""
        self._drop(name)
        self._gone.add(name)

    def _generate(self) -> Generator[Envelope, None, None]:
        try:
            yield from self._envelopes()
        finally:
            if self._closed:
                self._release()  # close() came while this was running

    def _envelopes(self) -> Generator[Envelope, None, None]:
        turn = 0
        while not self._closed:
            self._sync()
            sources = self._order
            count = len(sources)
            src = None
            for k in range(count):
                candidate = sources[(turn + k) % count]
                if candidate.grown:
                    try:
                        candidate.reopen()  # the journal grew: read on
                    except JournalNotFoundError:
                        self._deleted(candidate.journal)
                        break
                if candidate.it is not None:
                    src, turn = candidate, (turn + k + 1) % count
                    break
            if src is not None:
                it = src.it
                assert it is not None
                left = TURN
                try:
                    for env in it:
                        yield env
                        left -= 1
                        if not left or self._closed:
                            break
                    else:
                        src.ended()
                except JournalNotFoundError:
                    self._deleted(src.journal)
                continue
            # Every journal has handed over all there was.
            for journal, error in list(self._failures.items()):
                if isinstance(error, JournalNotFoundError):
                    self._deleted(journal)
                    continue
                error.add_note(f"following journal {journal}")
                raise error
            if not self._block:
                return
            self._wait()

    def _wait(self) -> None:
        """Wait until a journal grows or fails, the listing changes, or close()."""
        listed, version = self._listed, self._version
        with self._cond:
            while not (self._closed or self._failures
                       or any(s.grown for s in self._order)
                       or listed.version != version):
                # The listing has its own condition: look at it now and then.
                self._cond.wait(0.2)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _fail(self, journal: str, error: BaseException) -> None:
        with self._cond:
            self._failures.setdefault(journal, error)
            self._cond.notify_all()

    def checkpoint(self, prune_horizon: float | datetime.timedelta = 0) -> Checkpoint:
        """Where to resume every journal being read (see the class docstring)."""
        offsets: dict[str, int] = {}
        states = []
        for src in self._order:
            part = src.checkpoint(prune_horizon)
            offsets.update(part.offsets)
            states.extend(part.states)
        return Checkpoint(offsets, states)

    def close(self) -> None:
        """Stop reading: an iteration waiting in another thread ends, and the
        journals' readers and watches are released (by that thread, if it
        is reading at that moment)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        gen = getattr(self, "_gen", None)
        if gen is None or not gen.gi_running:
            self._release()

    def _release(self) -> None:
        with self._cond:
            sources, self._sources, self._order = list(self._sources.values()), {}, []
        self._listed.close()
        for src in sources:
            src.close()

