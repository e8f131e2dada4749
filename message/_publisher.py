"""The Publisher: map, sequence (stamp a UUID), frame and append messages."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from framing import Framing, framing_by_content_type
from journal import JournalError

from ._counts import COUNTS
from ._interfaces import MappingFunc, Message
from ._uuid import Clock, Flags, build_uuid, new_producer_id, uuid_from_int
from .layout import high_bits, low_bits

if TYPE_CHECKING:
    from journal import AppendResult, JournalClient

# Plain ints, not Flags members: an IntEnum hashes through Python code.
_OUTSIDE: Final = int(Flags.OUTSIDE_TXN)
_CONTINUE: Final = int(Flags.CONTINUE_TXN)



@dataclass(slots=True)
class AckIntent:
    """A framed ACK message and the journal it acknowledges a transaction in.

    Make intents durable (see :class:`IntentLog`) *before* appending them:
    a transaction commits when all of its intents are written, and a crash
    half-way must be repaired by writing them again.
    """

    journal: str
    intent: bytes


class Publisher:
    """Maps, sequences and appends messages to journals.

    ``publish_committed`` messages are read-committed at once.
    ``publish_uncommitted`` messages wait for the ACK intents that
    ``build_ack_intents`` returns, and are discarded if a roll-back intent
    (``build_rollback_intents``) comes instead.

    With no ``clock``, the Publisher keeps its own and moves it to the wall
    clock on each publish; a caller-managed clock should be updated by the
    caller now and then, which saves a system call per message.
    """

    __slots__ = (
        "_client", "_clock", "_framings", "_high", "_high_of", "_last_commit", "_lock", "_low",
        "_own_clock", "_pending", "_producer", "_txn_base", "_txn_types",
    )

    def __init__(self, client: JournalClient, clock: Clock | None = None) -> None:
        self._client = client
        self._own_clock = clock is None
        self._clock = Clock() if clock is None else clock
        if self._own_clock:
            self._clock.update()
        self._producer = new_producer_id()
        node = int.from_bytes(self._producer, "big")
        # The low 64 bits of a UUID for each flag value, by the clock's 4-bit
        # counter: variant, counter, flags, node.
        self._low: dict[int, tuple[int, ...]] = {
            int(f): tuple(low_bits(node, c, f) for c in range(16)) for f in Flags
        }
        # Bits 64-95 of a UUID (time_mid, version, time_hi) are those of the
        # clock >> 36, which changes every seven minutes: they are computed
        # when it does (see _publish).
        self._high_of = -1
        self._high = 0
        # One lock orders "tick the clock, stamp, frame, append", so that clocks
        # increase in each journal's append order even with many threads.
        self._lock = threading.Lock()
        self._framings: dict[str, Framing] = {}
        # Journals with uncommitted messages since the last build_*_intents,
        # in first-publish order, with a message to make the ACK from.
        self._pending: dict[str, Message] = {}
        # Per journal: the clock of this producer's last commit there (an
        # ACK intent built, or a committed publish); and, for an open
        # transaction, the clock a roll-back must carry.
        self._last_commit: dict[str, int] = {}
        self._txn_base: dict[str, int] = {}
        # Per journal of the open transaction: the content type its messages
        # were framed in, which its ACK is framed in too (absent where the
        # caller framed them: the journal's spec then says).
        self._txn_types: dict[str, str] = {}

    @property
    def producer_id(self) -> bytes:
        """The 6-byte ProducerID stamped on every message of this Publisher."""
        return self._producer

    @property
    def client(self) -> JournalClient:
        """The journal client appended to."""
        return self._client

    @property
    def clock(self) -> Clock:
        """The caller's Clock, or the Publisher's own."""
        return self._clock

    def _framing(self, content_type: str) -> Framing:
        f = self._framings.get(content_type)
        if f is None:
            f = self._framings[content_type] = framing_by_content_type(content_type)
        return f

    def _publish(self, mapping: MappingFunc, msg: Message, flags: int) -> Future[AppendResult]:
        validate = getattr(msg, "validate", None)
        if validate is not None:
            validate()
        journal, content_type = mapping(msg)
        framing = self._framings.get(content_type) or self._framing(content_type)
        # acquire/release rather than `with`: half the cost, per message.
        lock = self._lock
        lock.acquire()
        try:
            # Our own clock follows the wall clock; a caller's moves as the caller updates it.
            clock = self._clock.update_and_tick() if self._own_clock else self._clock.tick()
            # build_uuid(), inlined: only time_low and the counter change from
            # one message to the next; the other bits are precomputed.
            if clock >> 36 != self._high_of:
                self._high_of = clock >> 36
                self._high = high_bits(clock)
            u = uuid_from_int(
                (((clock >> 4) & 0xFFFFFFFF) << 96) | self._high | self._low[flags][clock & 0xF]
            )
            msg.set_uuid(u)
            frame = framing.marshal(msg)
            future = self._client.append(journal, frame)
            if flags == _CONTINUE:
                self._join_transaction(journal, msg, clock, content_type)
            else:
                self._last_commit[journal] = clock
            COUNTS.published += 1
        finally:
            lock.release()
        return future

    def emit(self, mapping: MappingFunc, msg: Message) -> int:
        """Emit ``msg`` to the live followers of the journal it maps to,
        without storing it (see ``emit_message``, which both Publishers run)."""
        return emit_message(self, mapping, msg)

    def publish_committed(self, mapping: MappingFunc, msg: Message) -> Future[AppendResult]:
        """Publish ``msg`` for immediate read-committed consumption.

        Validates it (``msg.validate()`` if it has one), maps it, then stamps
        it with a fresh OUTSIDE_TXN UUID, frames it and appends it. Safe for
        concurrent use. The future resolves when the append is durable.
        """
        return self._publish(mapping, msg, _OUTSIDE)

    def publish_uncommitted(self, mapping: MappingFunc, msg: Message) -> Future[AppendResult]:
        """Publish ``msg`` as part of this Publisher's open transaction.

        It is read-committed only once the transaction's ACK intents are
        written. The journal is remembered for the next ``build_ack_intents``.
        """
        return self._publish(mapping, msg, _CONTINUE)

    def publish_uncommitted_frames(
        self, journal: str, count: int, frame: Callable[[int], bytes], ack: Message, /
    ) -> Future[AppendResult]:
        """Publish ``count`` messages to ``journal``, as part of the open
        transaction, that the caller has framed itself: a bulk path for
        callers that encode many messages at once (the Spark source encodes
        a batch of rows as NDJSON in a few columnar operations).

        Under the Publisher's lock, ``count`` consecutive clocks are taken
        (as ``count`` publishes would take them), and ``frame(first)`` is
        called with the first of them: it returns the ``count`` frames laid
        end to end, the i-th stamped with the UUID of (``producer_id``,
        ``first + i``, ``Flags.CONTINUE_TXN``) (``message.columns.uuid_strings``
        gives them all). They are appended in one append. ``ack`` is a message
        of the journal's type: the transaction's ACK in ``journal`` is
        ``ack.new_acknowledgement(journal)``.
        """
        if count < 1:
            raise ValueError(f"publish at least one message, not {count}")
        with self._lock:
            if self._own_clock:
                self._clock.update()  # our own clock follows the wall clock, as publishes do
            first = self._clock.advance(count)
            future = self._client.append(journal, frame(first))
            self._join_transaction(journal, ack, first)
            COUNTS.published += count
        return future

    def _join_transaction(
        self, journal: str, msg: Message, clock: int, content_type: str | None = None
    ) -> None:
        """Under the lock: ``journal`` has a message of the open transaction
        with ``clock``, the first of its messages there unless it has one,
        framed in ``content_type`` (None: the caller framed it)."""
        if journal not in self._pending:
            if not self._pending:
                COUNTS.begun += 1
            self._pending[journal] = msg
            if content_type is not None:
                self._txn_types[journal] = content_type
            # A reader that never saw this producer in the journal starts it
            # at (first clock - 1): roll back to that.
            self._txn_base[journal] = self._last_commit.get(journal, clock - 1)

    def _intents(self, rollback: bool) -> list[AckIntent]:
        with self._lock:
            out = []
            for journal, msg in self._pending.items():
                ack = msg.new_acknowledgement(journal)
                if rollback:
                    # Readers' last_ack for this producer becomes this clock.
                    clock = self._last_commit[journal] = self._txn_base[journal]
                else:
                    clock = self._clock.tick()
                    self._last_commit[journal] = clock
                ack.set_uuid(build_uuid(self._producer, clock, Flags.ACK_TXN))
                content_type = self._txn_types.get(journal)
                if content_type is None:
                    content_type = self._client.get(journal).content_type or ""
                out.append(AckIntent(journal, self._framing(content_type).marshal(ack)))
            if self._pending:
                if rollback:
                    COUNTS.rolled_back += 1
                else:
                    COUNTS.committed += 1
            self._pending.clear()
            self._txn_base.clear()
            self._txn_types.clear()
            return out

    def build_ack_intents(self) -> list[AckIntent]:
        """ACK intents committing every journal published to uncommitted since
        the last call, in first-publish order; each is an ACK_TXN message
        from ``msg.new_acknowledgement(journal)`` with a freshly ticked clock.
        """
        return self._intents(rollback=False)

    def build_rollback_intents(self) -> list[AckIntent]:
        """ACK intents that roll back (abort) the open transaction instead.

        Each carries the clock of this producer's last commit in its journal,
        so readers discard the transaction's messages and stop waiting for it.
        """
        return self._intents(rollback=True)

    @property
    def has_open_transaction(self) -> bool:
        """True if messages were published uncommitted since the last intents."""
        return bool(self._pending)


def emit_message(publisher: Publisher, mapping: MappingFunc, msg: Message) -> int:
    """``Publisher.emit``: hand ``msg`` to the live followers of the journal it
    maps to, without storing it: a transient message (presence, progress
    ticks, anything worthless a moment later).

    Validates and maps it as ``publish_committed`` does, stamps it with a UUID
    of the publisher's producer ID, flagged OUTSIDE_TXN, whose clock is the
    wall time (an emit never meets a Sequencer, and takes no clock of the
    publisher's), frames it, and hands the frame to the client's ``emit``:
    only ``LocalJournalStore`` has one (others raise ``JournalError``).
    Followers reading with ``transient=True`` get it once they have caught up
    with the appends that completed before it; nobody else ever does.
    Returns how many followers took it; never waits for one.
    """
    validate = getattr(msg, "validate", None)
    if validate is not None:
        validate()
    journal, content_type = mapping(msg)
    client = publisher.client
    emit = getattr(client, "emit", None)
    if emit is None:
        raise JournalError(f"{type(client).__name__} has no transient messages (no emit)")
    clock = Clock()
    clock.update()
    msg.set_uuid(build_uuid(publisher.producer_id, clock.tick(), Flags.OUTSIDE_TXN))
    return int(emit(journal, framing_by_content_type(content_type).marshal(msg)))
