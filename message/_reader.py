"""Read iterators: every framed message, or only committed ones.

``ReadUncommittedIter`` decodes the frames of a journal into envelopes.
``ReadCommittedIter`` composes one with a :class:`Sequencer`, starts the
replays it asks for, and can checkpoint at any moment: a new iterator made
from that checkpoint yields exactly the committed envelopes not yet yielded.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

from framing import (
    BatchFraming,
    FramingError,
    PlainJsonFraming,
    TruncatedFrameError,
    framing_by_content_type,
)
from journal import Closing, CorruptJournalError, JournalError, OffsetTracker, metrics

from . import _core
from ._checkpoint import Checkpoint
from ._damage import DamageSkippingReader
from ._envelope import TRANSIENT_OFFSET, Envelope, ProducerState
from ._errors import MustStartReplay
from ._interfaces import NewMessageFunc
from ._sequencer import Sequencer
from ._sequencer import Sequencer as PySequencer
from ._spans import report_open_spans
from ._uuid import Flags, clock_to_unix_ns, get_clock, get_flags

if TYPE_CHECKING:
    import datetime

    from journal import JournalClient, JournalReader, JournalSpec, Transient, TransientListener

log = logging.getLogger("message")
#: The flags of an ACK_TXN message (``include_acks=False`` leaves out those that commit).
_ACK = int(Flags.ACK_TXN)


#: The native core (message/_native.c), or None when the Python loops run;
#: read when an iterator is made (the test suite sets it to None to run the
#: Python loops).
NATIVE: Any = _core.NATIVE


def _new_sequencer(states: Iterable[ProducerState] = ()) -> Sequencer:
    """A Sequencer of the implementation in use."""
    if NATIVE is not None:
        return cast(Sequencer, NATIVE.Sequencer(states))
    return PySequencer(states)


def _runs_natively(seq: object) -> bool:
    """True if ``seq`` is a native Sequencer whose methods are its own (a
    subclass that overrides them is driven through them instead)."""
    native = NATIVE.Sequencer
    t = type(seq)
    return isinstance(seq, native) and all(
        getattr(t, name) is getattr(native, name)
        for name in ("queue_uncommitted", "deque_committed", "replay_range", "start_replay")
    )


class _StreamOf(io.RawIOBase):
    """The bytes an OffsetTracker reads, as a raw stream whose position
    counts the bytes returned (for io.BufferedReader)."""

    def __init__(self, tracker: OffsetTracker) -> None:
        super().__init__()
        self._tracker = tracker

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._tracker.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self._tracker.pos


class _Steps(Protocol):
    """What runs an iteration: a generator, or one of the C loops."""

    def __iter__(self) -> Iterator[Envelope]: ...
    def __next__(self) -> Envelope: ...
    def close(self) -> None: ...


class _EnvelopeIter(Closing):
    """What both iterators share: iteration runs ``_gen``, a generator or a
    C loop (``iter()`` returns it, so a ``for`` loop resumes it directly),
    and closing stops it."""

    _gen: _Steps

    def __iter__(self) -> Iterator[Envelope]:
        return self._gen

    def __next__(self) -> Envelope:
        return next(self._gen)

    def close(self) -> None:
        """Stop reading and release the journal reader."""
        self._gen.close()



class ReadUncommittedIter(_EnvelopeIter):
    """Iterates every framed message of ``journal`` as an :class:`Envelope`:
    duplicates, and transactions never committed or rolled back, included.

    ``new_message(spec)`` returns an empty message to decode each frame
    into; the framing is the one of the journal's ``content-type`` label.
    Iteration ends at ``end_offset``, or at the journal's current end unless
    ``block`` is True, in which case it waits for further appends.

    A frame that cannot be decoded raises its framing error, with
    ``.journal`` and ``.offset`` set; with ``skip_corrupt=True`` it is
    skipped, logged and counted in :attr:`skipped` instead. A damaged piece
    of the journal (a fragment that does not match its name, one that is
    missing) raises the client's ``journal.CorruptJournalError`` once the
    frames before it are delivered; with ``skip_corrupt=True`` it is skipped
    as a whole, logged, counted, and listed in :attr:`skipped_ranges`.
    ``on_skip(error)``, if given, is told of each skipped frame or piece
    instead of the log (the error has ``.journal`` and ``.offset``).

    ``transient=True`` (with ``block=True``, on a client that has transient
    messages: ``LocalJournalStore``) also yields the messages emitted to the
    journal while it follows (``Publisher.emit``), as envelopes whose
    ``transient`` is True and whose offsets are ``TRANSIENT_OFFSET``: each
    once it has caught up with the appends that completed before the emit.
    :attr:`transient_lost` counts those it missed by not keeping up.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        new_message: NewMessageFunc,
        *,
        offset: int = 0,
        end_offset: int | None = None,
        block: bool = False,
        skip_corrupt: bool = False,
        on_skip: Callable[[Exception], None] | None = None,
        transient: bool = False,
    ) -> None:
        self.spec: JournalSpec = client.get(journal)
        try:
            self._framing = framing_by_content_type(self.spec.content_type or "")
        except FramingError as exc:
            exc.add_note(f"journal {journal} needs a content-type label with a known framing")
            raise
        self._new_message = new_message
        self._skip_corrupt = skip_corrupt
        self._on_skip = on_skip
        self._quiet = False  # a replay: corrupt frames were reported already
        self.skipped = 0
        #: Offsets ``[begin, end)`` of damaged pieces of the journal skipped
        #: (with ``skip_corrupt``; each also counts in ``skipped``).
        self.skipped_ranges: list[tuple[int, int]] = []
        self._start = offset
        self._last: Envelope | None = None
        self._client = client
        self._end_offset = end_offset
        self._interrupted = False
        self._listener: TransientListener | None = None
        if transient:
            self._listener = _listen(client, journal, block)
            self._reader = self._open_reader(offset)
        else:
            self._reader = client.read(journal, offset, end_offset, block=block)
            if skip_corrupt:
                self._reader = DamageSkippingReader(
                    client, self._reader, end_offset, block, self._damaged
                )
        self._bulk = hasattr(self._framing, "read_frames") and hasattr(
            self._framing, "unmarshal_frame"
        )
        # The C loop, when built: the same steps as _generate.
        self._fast: Any = None
        self._fast_capable = self._bulk and NATIVE is not None
        self._tracker: OffsetTracker | None = None  # made by the bulk loops
        self._gen = self._stored() if self._listener is None else self._with_transient()

    def reread(self, begin: int, end: int) -> ReadUncommittedIter:
        """The frames ``[begin, end)`` of the journal again (a Sequencer's
        replay), skipping what this iterator skips. Corrupt frames among
        them were reported (or skipped and counted) when first read: a
        re-read skips them without a word."""
        it = ReadUncommittedIter(
            self._client, self.spec.name, self._new_message, offset=begin, end_offset=end,
            skip_corrupt=self._skip_corrupt,
        )
        it._quiet = True
        return it

    def native_reader(self) -> Any:
        """The native loop that decodes this iterator's envelopes, for a
        ``ReadCommittedIter`` to drive with a native Sequencer; None where
        the Python loops run (no native core, or a framing without bulk
        frames)."""
        return self._fast_reader() if self._fast_capable else None

    def _stored(self) -> _Steps:
        """The loop over the stored frames of ``self._reader``."""
        if self._fast_capable:
            return cast(_Steps, self._fast_reader())
        return self._generate() if self._bulk else self._generate_per_frame()

    def _open_reader(self, offset: int) -> JournalReader:
        """A reader bound to the transient listener, at ``offset``."""
        listener = self._listener
        assert listener is not None
        reader: JournalReader = listener.read(offset, self._end_offset)
        if self._skip_corrupt:
            reader = DamageSkippingReader(
                cast("JournalClient", _ListenerReads(listener)), reader, self._end_offset, True,
                self._damaged,
            )
        return reader

    def _with_transient(self) -> Generator[Envelope, None, None]:
        """Stored envelopes, and emits between them: a read of the listener's
        reader returns when an emit can be handed out, which ends the loop
        over stored frames (at a frame boundary: the committed end); the
        emits are yielded, and a new loop over the same reader goes on."""
        listener = self._listener
        assert listener is not None
        try:
            while True:
                yield from self._stored()
                at = self._reader.offset
                if self._interrupted or listener.closed:
                    return
                if self._end_offset is not None and at >= self._end_offset:
                    return
                for t in listener.take(at):
                    yield from self._transient_envelopes(t)
                # The same reader reads on, under a new loop.
                self._start, self._last, self._fast, self._tracker = at, None, None, None
        finally:
            self._reader.close()
            listener.close()

    def _release_reader(self) -> None:
        """Close the journal reader once a loop over it ends, unless emits may
        end the loop: then the reader reads on (``_with_transient`` closes it)."""
        if self._listener is None:
            self._reader.close()

    def _transient_envelopes(self, t: Transient) -> Iterator[Envelope]:
        spec, framing = self.spec, self._framing
        if self._bulk:
            for _, _, frame in framing.read_frames(io.BytesIO(t.data)):
                msg = self._new_message(spec)
                try:
                    framing.unmarshal_frame(frame, msg)
                except FramingError as exc:
                    self._corrupt(exc, TRANSIENT_OFFSET)
                    continue
                yield Envelope(spec, TRANSIENT_OFFSET, TRANSIENT_OFFSET, msg)
            return
        unmarshal = framing.new_unmarshal_func(io.BufferedReader(io.BytesIO(t.data)))
        while True:
            msg = self._new_message(spec)
            try:
                unmarshal(msg)
            except EOFError:
                return
            except FramingError as exc:
                self._corrupt(exc, TRANSIENT_OFFSET)
                return
            yield Envelope(spec, TRANSIENT_OFFSET, TRANSIENT_OFFSET, msg)

    @property
    def transient_lost(self) -> int:
        """Transient messages missed by not keeping up (0 without ``transient``)."""
        return self._listener.lost if self._listener is not None else 0

    def _generate_per_frame(self) -> Generator[Envelope, None, None]:
        """For a framing with only the Framing protocol's new_unmarshal_func.
        It reads a continuous stream (positions); the tracker maps them to
        journal offsets, which jump over what retention removed or what was
        skipped as damaged. (The buffered reader's own position could not:
        it is taken before the read that meets a jump.)"""
        spec, new_message = self.spec, self._new_message
        tracker = self._tracker = OffsetTracker(self._reader)
        r = io.BufferedReader(_StreamOf(tracker))
        unmarshal = self._framing.new_unmarshal_func(r)
        try:
            while True:
                pos = r.tell()
                msg = new_message(spec)
                try:
                    unmarshal(msg)
                except EOFError:
                    return
                except TruncatedFrameError as exc:
                    self._corrupt(exc, tracker.base_at(pos) + pos)
                    return
                except FramingError as exc:
                    self._corrupt(exc, tracker.base_at(pos) + pos)
                    continue
                base = tracker.base_at(pos)
                env = self._last = Envelope(spec, base + pos, base + r.tell(), msg)
                yield env
        finally:
            self._release_reader()

    def _generate(self) -> Generator[Envelope, None, None]:
        spec, new_message = self.spec, self._new_message
        unmarshal = self._framing.unmarshal_frame
        tracker = self._tracker = OffsetTracker(self._reader)
        jumps = tracker.jumps
        base = tracker.start
        try:
            try:
                for begin, end, frame in self._framing.read_frames(tracker):
                    if jumps and jumps[0][0] <= begin:
                        base = tracker.base_at(begin)  # offsets continue further on
                    msg = new_message(spec)
                    try:
                        unmarshal(frame, msg)
                    except FramingError as exc:
                        self._corrupt(exc, base + begin)
                        continue
                    env = self._last = Envelope(spec, base + begin, base + end, msg)
                    yield env
            except TruncatedFrameError as exc:
                self._truncated(exc)
        finally:
            self._release_reader()

    def _fast_reader(self) -> Any:
        """The C EnvelopeReader of this iterator (made at the first call):
        its own iterator, or the one a ReadCommittedIter drives."""
        if self._fast is None:
            tracker = self._tracker = OffsetTracker(self._reader)
            framing = self._framing
            plain_json = framing if isinstance(framing, PlainJsonFraming) else None
            loads, plain = plain_json.plain_json() if plain_json else (None, None)
            # Lines split by the native loop itself, from a buffer it reuses,
            # when every frame is a line; else frames by batch when the
            # framing has them (no tuple per frame), or one by one.
            lines = plain_json is not None and plain_json.newline_delimited
            batches = isinstance(framing, BatchFraming)
            if lines:
                frames: Any = tracker
            elif isinstance(framing, BatchFraming):
                frames = framing.read_frame_batches(tracker)
            else:
                frames = framing.read_frames(tracker)
            self._fast = NATIVE.EnvelopeReader(
                frames, self.spec, self._new_message,
                self._framing.unmarshal_frame, tracker.jumps, tracker.base_at,
                self._corrupt, FramingError,
                tracker.start, self._release_reader, TruncatedFrameError, self._truncated,
                loads, plain, batches, lines,
            )
        return self._fast

    def _truncated(self, exc: TruncatedFrameError) -> None:
        """Input ended inside a frame: a journal's appends are whole frames,
        so its bytes are not what the framing says."""
        tracker = self._tracker
        assert tracker is not None
        pos = exc.offset or 0  # where the partial frame began in the stream
        self._corrupt(exc, tracker.base_at(pos) + pos)

    @property
    def offset(self) -> int:
        """Journal offset just past the last envelope yielded (before any:
        the offset reading started at)."""
        last = self._last if self._fast is None else self._fast.last
        return self._start if last is None else cast(int, last.end)

    def close(self) -> None:
        """Stop reading and release the journal reader."""
        self._interrupted = True
        self._gen.close()
        self._reader.close()  # if _gen never started, closing it did nothing
        if self._listener is not None:
            self._listener.close()

    def interrupt(self) -> None:
        """End an iteration running in another thread: the journal reader is
        closed, so that a read blocked in it (``block=True``) returns and the
        iteration stops, by ending or by raising ``ValueError``. The thread
        that iterates still calls :meth:`close`. Safe from any thread."""
        self._interrupted = True
        self._reader.close()

    def _damaged(self, exc: CorruptJournalError, begin: int, end: int) -> None:
        """Told by the reader that the journal's bytes ``[begin, end)`` are
        damaged (a fragment that does not match its name, a missing one) and
        are skipped: count and log it."""
        self.skipped += 1
        self.skipped_ranges.append((begin, end))
        if self._quiet:
            return
        if self._on_skip is not None:
            self._on_skip(exc)
        else:
            log.warning(
                "skipped damaged bytes of %s at offsets [%d, %d): %s",
                self.spec.name, begin, end, exc.reason,
            )

    def _corrupt(self, exc: FramingError, offset: int) -> None:
        exc_any: Any = exc
        exc_any.journal = self.spec.name
        exc_any.offset = offset
        if not self._skip_corrupt:
            exc.add_note(f"in journal {self.spec.name} at offset {offset}")
            raise exc
        self.skipped += 1
        if self._quiet:
            return
        if self._on_skip is not None:
            self._on_skip(exc)
        else:
            log.warning(
                "skipped a corrupt frame of %s at offset %d: %s", self.spec.name, offset, exc
            )



class ReadCommittedIter(_EnvelopeIter):
    """Iterates the committed messages of ``journal``: a ReadUncommittedIter
    composed with a :class:`Sequencer`, which replays what it needs itself.

    :meth:`checkpoint` may be called between any two yields; an iterator
    made with ``checkpoint=`` that checkpoint yields exactly the committed
    envelopes not yet yielded, none twice and none lost, even in the middle
    of a transaction. Given a checkpoint, a ``sequencer`` passed alongside
    must not have queued anything: its buffer size is kept and its producer
    states become the checkpoint's.

    ACK_TXN messages that commit are yielded, as a Sequencer outputs them,
    unless ``include_acks=False``: then they are read and sequenced but
    not handed out (control records, as the consumer runtime and the Spark
    source treat them); checkpoints are the same either way.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        new_message: NewMessageFunc,
        sequencer: Sequencer | None = None,
        *,
        offset: int = 0,
        end_offset: int | None = None,
        block: bool = False,
        checkpoint: Checkpoint | None = None,
        skip_corrupt: bool = False,
        transient: bool = False,
        include_acks: bool = True,
    ) -> None:
        self._client = client
        self._journal = journal
        self._new_message = new_message
        self._include_acks = include_acks
        self._base_offsets: dict[str, int] = {}
        if checkpoint is not None:
            if sequencer is None:
                sequencer = _new_sequencer(checkpoint.states)
            else:
                sequencer.restore(checkpoint.states)
            offset = checkpoint.offsets.get(journal, offset)
            self._base_offsets = dict(checkpoint.offsets)
        self._own_sequencer = sequencer is None
        self.sequencer = _new_sequencer() if sequencer is None else sequencer
        self._uncommitted = ReadUncommittedIter(
            client, journal, new_message, offset=offset, end_offset=end_offset,
            block=block, skip_corrupt=skip_corrupt, transient=transient,
        )
        self.spec = self._uncommitted.spec
        self.replays = 0
        native = self._uncommitted.native_reader()
        if (
            native is not None
            and _runs_natively(self.sequencer)
            and not transient  # emits pass the Sequencer by, in _generate
        ):
            # The native loop: the envelope reader feeds the native Sequencer.
            self._gen = NATIVE.CommittedReader(
                native, self.sequencer, self._start_replay, include_acks=include_acks)
        else:
            self._gen = self._generate()

    @property
    def skipped(self) -> int:
        """Corrupt frames and damaged pieces skipped (with ``skip_corrupt=True``)."""
        return self._uncommitted.skipped

    @property
    def transient_lost(self) -> int:
        """Transient messages missed by not keeping up (0 without ``transient``)."""
        return self._uncommitted.transient_lost

    def interrupt(self) -> None:
        """End an iteration running in another thread (see
        ``ReadUncommittedIter.interrupt``)."""
        self._uncommitted.interrupt()

    @property
    def skipped_ranges(self) -> list[tuple[int, int]]:
        """Offsets ``[begin, end)`` of the damaged pieces of the journal skipped."""
        return self._uncommitted.skipped_ranges

    def _generate(self) -> Generator[Envelope, None, None]:
        """Queue each envelope and yield what it commits, replaying as needed
        (the committing ACKs left out without ``include_acks``)."""
        committed = sequence_committed(self.sequencer, self._uncommitted, self._start_replay)
        if self._include_acks:
            yield from committed
            return
        committed_by = self.sequencer.committed_by
        for env in committed:
            if env is committed_by() and get_flags(env.message.get_uuid()) == _ACK:
                continue
            yield env

    def _start_replay(self, begin: int, end: int) -> ReadUncommittedIter:
        self.replays += 1
        metrics.record_replay(self._journal, end - begin)
        return self._uncommitted.reread(begin, end)

    @property
    def commit_offset(self) -> int:
        """Offset of the envelope whose reading committed the one last yielded
        (its ACK_TXN, or itself): sorting a journal's committed envelopes by
        ``(commit_offset, begin)`` gives the Sequencer's output order."""
        env = self.sequencer.committed_by()
        if env is None:
            raise RuntimeError("nothing has been committed yet")
        return env.begin

    def checkpoint(self, prune_horizon: float | datetime.timedelta = 0) -> Checkpoint:
        """Where to resume: read offset and producer states, valid between any
        two yields. ``prune_horizon`` forgets producers idle that long (see
        :meth:`Sequencer.producer_states`)."""
        states, inflight = self.sequencer.checkpoint_states(prune_horizon)
        offsets = dict(self._base_offsets)
        # Past the last envelope queued: the uncommitted iterator's position.
        offsets[self._journal] = inflight[1] if inflight is not None else self._uncommitted.offset
        if metrics.enabled():
            report_open_spans(self.sequencer, states, self._published_at)
        return Checkpoint(offsets, states)

    def _published_at(self, journal: str, offset: int) -> int | None:
        return published_at(self._client, journal, self._new_message, offset)

    def close(self) -> None:
        """Stop reading and release the journal reader."""
        super().close()
        self._uncommitted.close()
        if self._own_sequencer:
            metrics.forget_open_spans(self.sequencer)


def sequence_committed(
    seq: Sequencer, envelopes: Iterable[Envelope],
    replay: Callable[[int, int], Iterable[Envelope]],
) -> Generator[Envelope, None, None]:
    """Queue each of ``envelopes`` (read uncommitted, in journal order) into
    ``seq`` and yield the committed envelopes it releases, in order. When the
    Sequencer must replay, ``replay(begin, end)`` reads that range of the
    journal again (as ``ReadUncommittedIter.reread`` does). Transient
    envelopes pass through unsequenced. ``ReadCommittedIter`` is this loop
    over a journal, with checkpoints."""
    queue_uncommitted, deque_committed = seq.queue_uncommitted, seq.deque_committed
    for env in envelopes:
        if env.begin < 0:
            yield env  # Transient: never sequenced, never checkpointed.
            continue
        queue_uncommitted(env)
        while True:
            try:
                committed = deque_committed()
            except MustStartReplay:
                begin, end = seq.replay_range()
                seq.start_replay(replay(begin, end))
                continue
            if committed is None:
                break
            yield committed


def published_at(client: JournalClient, journal: str, new_message: NewMessageFunc,
                 offset: int) -> int | None:
    """When the message at ``offset`` of ``journal`` was published (ns since
    the epoch, from its UUID's clock); None if it has no clock or cannot be
    read. What an open transaction's age is measured from."""
    try:
        with ReadUncommittedIter(client, journal, new_message, offset=offset,
                                 skip_corrupt=True) as it:
            for env in it:
                clock = get_clock(env.message.get_uuid())
                return clock_to_unix_ns(clock) if clock else None
    except JournalError:
        return None
    return None


def _listen(client: JournalClient, journal: str, block: bool) -> TransientListener:
    """A transient listener of ``journal``: only a following read has emits
    to hand out, and only a client that has them (``LocalJournalStore``)."""
    if not block:
        raise ValueError("transient=True needs block=True: emits go to following readers only")
    listen = getattr(client, "listen", None)
    if listen is None:
        raise JournalError(f"{type(client).__name__} has no transient messages (no emit)")
    return cast("TransientListener", listen(journal))


class _ListenerReads:
    """What ``DamageSkippingReader`` needs of a client (``read``), for readers
    bound to a transient listener."""

    def __init__(self, listener: TransientListener) -> None:
        self._listener = listener

    def read(
        self, journal: str, offset: int = 0, end_offset: int | None = None, *, block: bool = False
    ) -> JournalReader:
        return self._listener.read(offset, end_offset)
