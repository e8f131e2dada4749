"""The Sequencer: read-uncommitted envelopes in, committed envelopes out.

Per (journal, producer) the Sequencer keeps a ``_Partial``: the clock of the
producer's last commit (``last_ack``), the largest clock of its open
transaction (``max_clock``), and the offset where that transaction began
(``begin``). For each envelope, :meth:`Sequencer.queue_uncommitted` first
decides what it is from those numbers (``message.rules.decide``: a
duplicate, a roll-back, an extension of the open transaction, or a commit of
itself or of the transaction), then applies that outcome.

The ring holds the last ``buffer`` kept envelopes (duplicates and
roll-backs take no slot), so that a committed span can usually be emitted
straight from memory. It is virtual: kept envelopes are numbered, an
envelope is in the ring while its number is among the last ``buffer``, and
only open spans' envelopes are stored, in their partial — nothing else is
ever read back. When part of a span has left the ring (or it began before a
restored checkpoint) the caller replays ``[begin, first-in-ring)`` from the
journal.

Emission applies one rule whatever the source, ring or replay: a span
message is emitted only if its clock exceeds every clock of the producer
seen so far in the span (starting from ``last_ack``) and is not larger than
the ACK's; then the ACK itself, unless a span message with the ACK's own
clock was just emitted (a producer that reused a clock: Gazette's
``Sequencer.Step`` drops that ACK too). A replay re-reads duplicates that
queueing had dropped, and the rule drops them again — so the output does
not depend on the ring's size, nor on where a checkpoint was taken.

This module is the definition of the behaviour. ``message/_native.c`` holds
a native Sequencer with the same methods and the same results, which
``message.Sequencer`` is bound to when it is built (see ``message/_core.py``).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Iterator, Mapping

from ._counts import COUNTS
from ._envelope import Envelope, ProducerState
from ._errors import MustStartReplay, ReplayError
from ._uuid import UUID_INT_OF as _UUID_INT
from .layout import (
    ACK_TXN,
    CLOCK_UNITS_PER_SECOND,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    clock_of_int,
    flags_of_int,
    producer_of_int,
)
from .layout import PRODUCER_MASK as _MASK48
from .rules import QueueOutcome, ack_emits, decide, span_emits

_KNOWN_FLAGS = frozenset({OUTSIDE_TXN, CONTINUE_TXN, ACK_TXN})

log = logging.getLogger("message")


class _Partial:
    """A producer's state within a journal (see the module docstring)."""

    __slots__ = ("begin", "entries", "journal", "last_ack", "max_clock", "producer")

    def __init__(self, journal: str, producer: int, last_ack: int, begin: int) -> None:
        self.journal = journal
        self.producer = producer  # the ProducerID as an int: cheaper to hash and compare
        self.last_ack = last_ack
        self.max_clock = last_ack
        self.begin = begin
        # The open span's kept envelopes, in order, as (ring sequence number,
        # clock, envelope); those that have left the ring are dropped lazily.
        self.entries: list[tuple[int, int, Envelope]] = []


class _Replay:
    """A committed span that must be (partly) re-read before it is emitted."""

    __slots__ = ("ack", "begin", "emitted", "end", "it", "journal", "producer", "running", "tail")

    def __init__(
        self, p: _Partial, ack: int, end: int, tail: list[tuple[int, Envelope]]
    ) -> None:
        self.journal = p.journal
        self.producer = p.producer
        self.begin = p.begin  # advances as replayed envelopes are consumed
        self.end = end  # begin of the span's first envelope still in the ring
        self.running = p.last_ack  # the largest clock of the span seen so far
        self.emitted = p.last_ack  # the largest clock of the span emitted so far
        self.ack = ack
        self.tail = tail  # (clock, envelope) of the span's part still in the ring
        self.it: Iterator[Envelope] | None = None


def horizon_units(horizon: float | datetime.timedelta) -> int | None:
    """A prune horizon as Clock units (100 ns, shifted past the 4 counter
    bits), or None if it is not above 0 (no pruning). Shared by the native
    Sequencer."""
    if isinstance(horizon, datetime.timedelta):
        if horizon <= datetime.timedelta(0):
            return None
        seconds = horizon.days * 86400 + horizon.seconds
        hundred_ns = seconds * 10_000_000 + horizon.microseconds * 10
    else:
        if not horizon > 0:
            return None
        hundred_ns = round(horizon * 10_000_000)
    return hundred_ns * (CLOCK_UNITS_PER_SECOND // 10_000_000)


def warn_unknown_flags(flags: int, journal: str, offset: int) -> None:
    """Logged for a message whose flags are none of Flags (shared by the native Sequencer)."""
    log.warning(
        "unknown UUID flags %#x in %s at offset %d: handled as OUTSIDE_TXN",
        flags, journal, offset,
    )


def warn_old_ack(producer: int, journal: str, offset: int) -> None:
    """Logged for an ACK_TXN older than the last commit (shared by the native Sequencer)."""
    log.warning(
        "ACK_TXN of %s in %s at offset %d is older than the last acknowledged "
        "clock: rolled back (an upstream checkpoint was restored; exactly-once "
        "falls back to at-least-once)",
        producer.to_bytes(6, "big").hex(), journal, offset,
    )


class Sequencer:
    """Sequences read-uncommitted envelopes of one or more journals into
    deduplicated, committed ones.

    Feed each envelope, in journal order, to :meth:`queue_uncommitted`, then
    call :meth:`deque_committed` until it returns None. If it raises
    :class:`MustStartReplay`, pass a read-uncommitted iterator over
    :meth:`replay_range` to :meth:`start_replay` and dequeue again.
    """

    __slots__ = ("_inflight", "_out", "_out_pos", "_partials", "_replay", "_seq", "_size",
                 "_sweep_at")

    def __init__(self, states: Iterable[ProducerState] = (), buffer: int = 4096) -> None:
        size = max(1, buffer)
        self._size = size
        # The ring is virtual: kept envelopes are numbered 1, 2, ... and the
        # ring holds the last `size` of them, (seq - size, seq]. Only a span's
        # envelopes are ever read back, so only they are stored, with their
        # partial; an envelope committed alone is just counted.
        self._seq = 0
        self._sweep_at = size  # when to drop entries that left the ring
        self._partials: dict[tuple[str, int], _Partial] = {}
        for s in states:
            pid = int.from_bytes(s.producer, "big")
            self._partials[(s.journal, pid)] = _Partial(s.journal, pid, s.last_ack, s.begin)
        # Committed envelopes ready to dequeue: self._out[self._out_pos:].
        self._out: list[Envelope] = []
        self._out_pos = 0
        self._replay: _Replay | None = None
        # The sequence being dequeued: (partial, committing envelope, and the
        # partial's last_ack and begin before the commit). See checkpoint_states.
        self._inflight: tuple[_Partial | None, Envelope] | None = None

    @property
    def buffer(self) -> int:
        """The number of envelopes the ring holds."""
        return self._size

    # -- queueing ---------------------------------------------------------

    def queue_uncommitted(self, env: Envelope) -> bool:
        """Apply the next read-uncommitted envelope.

        Returns True if it completes a sequence (commits, or is a duplicate or
        a roll-back), False if it extends a transaction still pending.
        """
        if self._out_pos < len(self._out) or self._replay is not None:
            raise RuntimeError("committed messages remain to dequeue")
        msg = env.message
        t = type(msg)
        i = _UUID_INT[t](msg) if t in _UUID_INT else msg.get_uuid().int
        clock, flags = clock_of_int(i), flags_of_int(i)
        if not clock:
            return self._apply(QueueOutcome.COMMIT_UNTRACKED, env, None, clock)
        journal = env.journal.name
        p = self._partial(journal, producer_of_int(i), clock)
        if flags not in _KNOWN_FLAGS:
            warn_unknown_flags(flags, journal, env.begin)
        outcome = decide(flags, clock, p.last_ack, p.max_clock, p.begin != -1)
        return self._apply(outcome, env, p, clock)

    def _partial(self, journal: str, producer: int, clock: int) -> _Partial:
        """The producer's state in ``journal``; one first seen with ``clock``
        starts just below it (its first message commits)."""
        p = self._partials.get((journal, producer))
        if p is None:
            p = self._partials[(journal, producer)] = _Partial(journal, producer, clock - 1, -1)
        return p

    def _apply(self, outcome: QueueOutcome, env: Envelope, p: _Partial | None,
               clock: int) -> bool:
        """Apply what :func:`decide` said of ``env`` (``p``: its producer's
        state, None for a clock-less envelope). Duplicates and roll-backs
        take no slot of the ring."""
        match outcome:
            case QueueOutcome.DUPLICATE:
                COUNTS.duplicates += 1
                return True
            case QueueOutcome.ROLLBACK:
                assert p is not None
                if clock < p.last_ack:
                    warn_old_ack(p.producer, p.journal, env.begin)
                if p.begin != -1:
                    COUNTS.rollbacks += 1  # an open transaction discarded
                else:
                    COUNTS.duplicates += 1  # an ACK read again
                p.last_ack = p.max_clock = clock
                p.begin = -1
                p.entries = []
                return True
            case QueueOutcome.EXTEND_SPAN:
                assert p is not None
                self._seq += 1
                if p.begin == -1:
                    p.begin = env.begin
                p.entries.append((self._seq, clock, env))
                p.max_clock = clock
                if self._seq >= self._sweep_at:
                    self._sweep()
                return False
            case QueueOutcome.COMMIT_UNTRACKED:
                # No clock: at-least-once. Commits at once, and is never tracked.
                self._seq += 1
                self._out, self._out_pos = [env], 0
                self._inflight = (None, env)
                return True
            case QueueOutcome.COMMIT_SPAN:
                assert p is not None
                self._seq += 1
                self._commit_span(p, clock, env, self._seq)
            case QueueOutcome.COMMIT_OUTSIDE | QueueOutcome.COMMIT_ACK:
                # Commits itself. After an OUTSIDE_TXN message, an open
                # transaction (mixed committed and transactional publishing
                # by one producer) is discarded.
                assert p is not None
                self._seq += 1
                self._out = [env]
        assert p is not None
        self._out_pos = 0
        self._inflight = (p, env)
        p.last_ack = p.max_clock = clock
        if p.begin != -1:
            p.begin = -1
            p.entries = []
        return True

    def _sweep(self) -> None:
        """Drop the entries that have left the ring, so that memory stays
        bounded by it even for spans that never end (abandoned producers)."""
        cutoff = self._seq - self._size
        for p in self._partials.values():
            entries = p.entries
            if entries and entries[0][0] <= cutoff:
                n = 0
                while n < len(entries) and entries[n][0] <= cutoff:
                    n += 1
                del entries[:n]
        self._sweep_at = self._seq + self._size

    def _commit_span(self, p: _Partial, ack: int, ack_env: Envelope, seq: int) -> None:
        """Emit ``p``'s span, committed by ``ack_env`` (ring number ``seq``)."""
        entries = p.entries
        cutoff = seq - self._size  # entries numbered up to this have left the ring
        if entries and entries[0][0] > cutoff and entries[0][2].begin == p.begin:
            # Wholly in the ring, where clocks strictly increase (duplicates
            # were never kept): emit all but those beyond the ACK's clock,
            # then the ACK unless the last emitted had its clock.
            out = []
            emitted = p.last_ack
            for _, clock, e in entries:
                if clock <= ack:
                    out.append(e)
                    emitted = clock
            if ack_emits(ack, emitted):
                out.append(ack_env)
            self._out = out
            return
        tail = [(clock, e) for n, clock, e in entries if n > cutoff]
        tail.append((ack, ack_env))
        self._out = []
        self._replay = _Replay(p, ack, tail[0][1].begin, tail)

    # -- dequeuing --------------------------------------------------------

    def deque_committed(self) -> Envelope | None:
        """The next committed envelope, or None when none remain.

        Raises :class:`MustStartReplay` when the rest of the sequence must be
        re-read from the journal first.
        """
        pos = self._out_pos
        if pos < len(self._out):
            self._out_pos = pos + 1
            return self._out[pos]
        r = self._replay
        if r is None:
            return None
        if r.it is None:
            raise MustStartReplay(r.journal, r.begin, r.end)
        env = self._next_replayed(r)
        if env is not None:
            return env
        # The replay is done: the rest of the span is in the ring.
        self._replay = None
        running, emitted, ack = r.running, r.emitted, r.ack
        out = []
        *span, (_, ack_env) = r.tail
        for clock, e in span:
            if span_emits(clock, running, ack):
                out.append(e)
                emitted = clock
            running = max(running, clock)
        if ack_emits(ack, emitted):
            out.append(ack_env)
        self._out = out
        self._out_pos = 0
        return self.deque_committed()

    def _next_replayed(self, r: _Replay) -> Envelope | None:
        """The next envelope of the replay to emit, or None at its end."""
        assert r.it is not None
        while True:
            try:
                env = next(r.it)
            except StopIteration:
                return None
            except Exception as exc:
                r.it = None
                raise ReplayError(
                    f"the replay iterator failed: {exc!r}",
                    journal=r.journal, begin=r.begin, end=r.end,
                ) from exc
            if env.journal.name != r.journal:
                problem = f"it read journal {env.journal.name}"
            elif env.begin < r.begin:
                problem = f"an envelope begins at {env.begin}, before {r.begin}"
            elif env.end > r.end:
                problem = f"an envelope ends at {env.end}, after {r.end}"
            else:
                r.begin = env.end
                i = env.message.get_uuid().int
                if i & _MASK48 != r.producer:
                    continue  # another producer's message in the same range
                clock = clock_of_int(i)
                if clock <= r.running:
                    continue  # a duplicate, or a clock-less message emitted before
                emits = span_emits(clock, r.running, r.ack)
                r.running = clock
                if not emits:
                    continue  # written after the ACK was decided: not committed
                r.emitted = clock
                return env
            r.it = None
            raise ReplayError(problem, journal=r.journal, begin=r.begin, end=r.end)

    def replay_range(self) -> tuple[int, int]:
        """``[begin, end)`` offsets of the journal to replay (the journal is
        the ``journal`` of the :class:`MustStartReplay` raised)."""
        if self._replay is None:
            raise RuntimeError("no replay is needed")
        return self._replay.begin, self._replay.end

    def start_replay(self, it: Iterable[Envelope]) -> None:
        """Read the envelopes of :meth:`replay_range` from ``it`` (read-uncommitted)."""
        if self._replay is None:
            raise RuntimeError("no replay is needed")
        self._replay.it = iter(it)

    # -- state ------------------------------------------------------------

    def committed_by(self) -> Envelope | None:
        """The envelope whose queueing committed the sequence being (or last)
        dequeued: its ACK_TXN, or the envelope itself; None before any."""
        return None if self._inflight is None else self._inflight[1]

    def has_pending(self, since: Mapping[str, int]) -> bool:
        """True if a transaction still open began at or after the offset given
        for its journal (0 for a journal not in ``since``)."""
        get = since.get
        return any(p.begin != -1 and p.begin >= get(p.journal, 0) for p in self._partials.values())

    def producer_states(
        self, prune_horizon: float | datetime.timedelta = 0
    ) -> list[ProducerState]:
        """A snapshot of every producer's state, for a checkpoint.

        With a horizon (seconds or a timedelta) above 0, producers whose
        ``last_ack`` is more than that older than the newest ``last_ack`` of
        their journal are first forgotten.
        """
        if self._out_pos < len(self._out) or self._replay is not None:
            raise RuntimeError("committed messages remain to dequeue")
        self._prune(prune_horizon, None)
        return [
            ProducerState(p.journal, p.producer.to_bytes(6, "big"), p.last_ack, p.begin)
            for p in self._partials.values()
        ]

    def _prune(self, horizon: float | datetime.timedelta, keep: _Partial | None) -> None:
        units = horizon_units(horizon)
        if units is None:
            return
        newest: dict[str, int] = {}
        for p in self._partials.values():
            if p.last_ack > newest.get(p.journal, -1):
                newest[p.journal] = p.last_ack
        stale = [
            key
            for key, p in self._partials.items()
            if p.last_ack < newest[p.journal] - units and p is not keep
        ]
        for key in stale:
            self._partials.pop(key)

    def restore(self, states: Iterable[ProducerState]) -> None:
        """Replace the producer states of a Sequencer that has queued nothing."""
        if self._seq or self._out or self._replay is not None:
            raise ValueError("cannot restore producer states into a Sequencer that has queued")
        self._partials.clear()
        for s in states:
            pid = int.from_bytes(s.producer, "big")
            self._partials[(s.journal, pid)] = _Partial(s.journal, pid, s.last_ack, s.begin)

    def checkpoint_states(
        self, prune_horizon: float | datetime.timedelta = 0
    ) -> tuple[list[ProducerState], tuple[str, int] | None]:
        """Producer states that are valid at any moment, even while a committed
        sequence is partly dequeued; with, in that case, ``(journal, offset)``
        where reading must resume: the offset of the envelope that committed
        the sequence.

        The states then describe the sequence as not yet committed: its
        producer's ``last_ack`` is just below the next message to dequeue and
        ``begin`` is that message's offset (mid-replay: the largest clock seen
        and the replay's position), so that re-reading the committing
        envelope replays exactly the part not yet dequeued.
        """
        drained = self._out_pos >= len(self._out) and self._replay is None
        inflight = self._inflight
        if drained or inflight is None:
            return self.producer_states(prune_horizon), None
        p, commit = inflight
        self._prune(prune_horizon, p)
        states = [
            ProducerState(q.journal, q.producer.to_bytes(6, "big"), q.last_ack, q.begin)
            for q in self._partials.values()
            if q is not p
        ]
        if p is not None:
            ack = p.last_ack  # the committing envelope's clock
            r = self._replay
            if r is not None and not ack_emits(ack, r.emitted):
                # Replaying, and the span message with the ACK's clock is
                # out: nothing is left to emit, not even the ACK.
                last_ack, begin = ack, -1
            elif r is not None and r.running < ack:
                # Replaying: everything of the span up to r.begin is consumed,
                # and r.running is the largest clock seen in it.
                last_ack, begin = r.running, r.begin
            elif r is not None:
                # Nothing of the span is left to emit, only the committing
                # envelope: keep its clock above last_ack so it commits again.
                last_ack, begin = ack - 1, -1
            else:
                # The rest is self._out[pos:]: resume just before its first.
                nxt = self._out[self._out_pos]
                last_ack, begin = clock_of_int(nxt.message.get_uuid().int) - 1, nxt.begin
                if nxt is commit:
                    begin = -1
            states.append(ProducerState(p.journal, p.producer.to_bytes(6, "big"), last_ack, begin))
        return states, (commit.journal.name, commit.begin)
