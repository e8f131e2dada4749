"""Gazette's sequencer_test.go, ported to the Sequencer of docs/concepts.md.

The cases are those of Gazette's message/sequencer_test.go at the version
whose API ours follows (QueueUncommitted returning a bool, DequeCommitted,
ReplayRange, StartReplay, ProducerStates, HasPending(since)), plus the later
cases that still apply (checkpoints in the middle of a dequeue, duplicates
straddling a restored checkpoint).

This Sequencer is "Gazette's made independent of the ring"; where the two
differ, the rules here (message.rules) win and a comment says so. The differences met here:

- The largest clock of an open span is tracked apart from the ring, so a
  CONTINUE_TXN duplicate is recognised (queue_uncommitted returns True) even
  when its original has been evicted (the older Go code returned False). The
  return values below are those of Gazette's later QueueOutcome, mapped to
  bool (BeginSpan and ExtendSpan are False, every other outcome True).
- Envelopes are always queued in offset order, as a read-uncommitted reader
  delivers them; the Go test queued one Envelope value twice, out of order.
  Where it did, a copy at a new offset is queued instead, and replay ranges
  and replayed envelopes follow from those offsets.
- Replays are fed every envelope of the replay range (the Go test sometimes
  stopped its fake iterator early), since a replay re-reads the whole range.
- The ring holds the last ``buffer`` *kept* envelopes; the Go code evicted one
  slot early on a dropped envelope, which changes no replay range here.
- Errors are exceptions (MustStartReplay, ReplayError, RuntimeError) rather
  than error values and panics; messages are not pinned.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

from journal import JournalSpec
from message import (
    Envelope,
    MessageError,
    MustStartReplay,
    ProducerState,
    ReplayError,
    Sequencer,
)
from tests.sequencer_model import SequencerModel
from tests.strategies import NDJSON, EnvelopeGenerator, key, producer, state_key

CONTINUE, ACK, OUTSIDE = 1, 2, 0
J = "test/journal"

A, B, C = producer(1), producer(2), producer(3)


class Harness:
    """Drives a Sequencer like Gazette's queue / expectDeque / expectReplay helpers,
    and feeds the same envelopes to the reference model to cross-check it."""

    def __init__(self, seq: Sequencer, log: list[Envelope] | None = None) -> None:
        self.seq = seq
        self.queued: list[Envelope] = []
        self.log = log
        self.output: list[Envelope] = []

    def queue(self, *envs: Envelope) -> list[bool]:
        self.queued.extend(envs)
        return [self.seq.queue_uncommitted(e) for e in envs]

    def expect_deque(self, *expect: Envelope) -> None:
        for want in expect:
            got = self.seq.deque_committed()
            assert got is not None, f"expected {key(want)}, got None"
            assert key(got) == key(want)
            self.output.append(got)
        assert self.seq.deque_committed() is None

    def expect_replay(self, begin: int, end: int, *envs: Envelope) -> None:
        with pytest.raises(MustStartReplay):
            self.seq.deque_committed()
        assert self.seq.replay_range() == (begin, end)
        for e in envs:
            assert begin <= e.begin and e.end <= end
        self.seq.start_replay(iter(envs))


def states_of(seq: Sequencer, prune_horizon: Any = 0) -> set[tuple[str, bytes, int, int]]:
    return {state_key(s) for s in seq.producer_states(prune_horizon)}


def model_output(envs: list[Envelope], states: list[ProducerState] = ()) -> list[tuple]:
    model = SequencerModel(envs, states)
    return [key(e) for env in envs for e in model.queue(env)[1]]


OWNERS = "ABAABBBBBBB"  # e1..e11 of Gazette's TestSequencerRingAddAndEvict.


def ring_fixture(k: int) -> tuple[EnvelopeGenerator, list[Envelope]]:
    """e1..ek: CONTINUE_TXNs of A and B with clocks 100, 200, ..."""
    gen = EnvelopeGenerator()
    return gen, [
        gen(A if o == "A" else B, 100 * (i + 1), CONTINUE) for i, o in enumerate(OWNERS[:k])
    ]


@pytest.mark.parametrize("k", range(1, 12))
@pytest.mark.parametrize("acked", ["A", "B"])
def test_ring_add_and_evict(k: int, acked: str) -> None:
    """A ring of 5 keeps the last 5 kept envelopes: an ACK replays exactly the evicted head."""
    gen, envs = ring_fixture(k)
    h = Harness(Sequencer(buffer=5))
    assert h.queue(*envs) == [False] * k
    assert h.seq.deque_committed() is None
    assert h.seq.has_pending({})

    expect_states = {(J, A, 99, envs[0].begin)}
    if k >= 2:
        expect_states.add((J, B, 199, envs[1].begin))
    assert states_of(h.seq) == expect_states
    if acked == "B" and k < 2:
        return  # B is not known yet.

    ack = gen(A if acked == "A" else B, 1200, ACK)
    assert h.queue(ack) == [True]
    mine = [e for e, o in zip(envs, OWNERS, strict=False) if o == acked]
    # The ring after the ACK is the last 5 of e1..ek, ACK; the replay covers
    # the span's envelopes before the first of them still in the ring.
    in_ring = [*envs, ack][-5:]
    first = next(e for e in [*mine, ack] if any(e is r for r in in_ring))
    if first is not mine[0]:
        replayed = [e for e in envs if mine[0].begin <= e.begin and e.end <= first.begin]
        h.expect_replay(mine[0].begin, first.begin, *replayed)
    h.expect_deque(*mine, ack)
    assert h.seq.has_pending({}) == (acked == "B" or k >= 2)
    assert model_output(h.queued) == [key(e) for e in h.output]


def test_ring_replay_ranges_as_in_gazette() -> None:
    """Pins the replay ranges Gazette's ring states imply, at a few points, literally."""
    # After e6 Gazette's ring is [e6 e2 e3 e4 e5]: an ACK of A evicts e2 and
    # finds A's e3 and e4 still in the ring.
    gen, (e1, e2, e3, e4, e5, e6) = ring_fixture(6)
    h = Harness(Sequencer(buffer=5))
    h.queue(e1, e2, e3, e4, e5, e6, ack := gen(A, 1200, ACK))
    h.expect_replay(e1.begin, e3.begin, e1, e2)
    h.expect_deque(e1, e3, e4, ack)

    # After e9 "Evicts final A entry": the ACK itself is all of A in the ring.
    gen, envs = ring_fixture(9)
    h = Harness(Sequencer(buffer=5))
    h.queue(*envs, ack := gen(A, 1200, ACK))
    h.expect_replay(envs[0].begin, ack.begin, *envs)
    h.expect_deque(envs[0], envs[2], envs[3], ack)

    # After e11 the ring is [e11 e7 e8 e9 e10]: an ACK of B evicts e7.
    gen, envs = ring_fixture(11)
    h = Harness(Sequencer(buffer=5))
    h.queue(*envs, ack := gen(B, 1200, ACK))
    h.expect_replay(envs[1].begin, envs[7].begin, *envs[1:7])
    h.expect_deque(envs[1], *envs[4:], ack)


def test_txn_sequence_cases() -> None:
    """Gazette's TestSequencerTxnSequenceCases with a ring of 3."""
    gen = EnvelopeGenerator()
    h = Harness(Sequencer(buffer=3))

    # Case: sequence with internal duplicates served from the ring.
    a1, a2 = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE)
    a1_dup, a2_dup = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE)
    a3_ack = gen(A, 3, ACK)
    assert h.queue(a1, a2, a1_dup, a2_dup, a3_ack) == [False, False, True, True, True]
    h.expect_deque(a1, a2, a3_ack)
    assert not h.seq.has_pending({})

    # Case: ACK without preceding CONTINUE. Unusual but allowed.
    a4_ack = gen(A, 4, ACK)
    assert h.queue(a4_ack) == [True]
    h.expect_deque(a4_ack)

    # Case: partial ACK of preceding messages.
    a5 = gen(A, 5, CONTINUE)
    a7_no_ack = gen(A, 7, CONTINUE)  # Not included in a6_ack.
    a6_ack = gen(A, 6, ACK)  # Served from the ring.
    assert h.queue(a5, a7_no_ack, a6_ack) == [False, False, True]
    h.expect_deque(a5, a6_ack)
    assert not h.seq.has_pending({})

    # Case: roll-back with interleaved producer B. (Gazette queued the
    # a7_rollback value twice, out of offset order; a copy is queued here.)
    a7_rollback = gen(A, 7, CONTINUE)
    b1 = gen(B, 1, CONTINUE)  # Evicted.
    a7_rollback_dup = gen(A, 7, CONTINUE)
    a8_rollback = gen(A, 8, CONTINUE)
    b2 = gen(B, 2, CONTINUE)
    a6_abort = gen(A, 6, ACK)  # Aborts back to clock 6.
    assert h.queue(a7_rollback, b1, a7_rollback_dup, a8_rollback, b2, a6_abort) == [
        False,
        False,
        True,
        False,
        False,
        True,
    ]
    assert h.seq.deque_committed() is None  # No messages deque.
    assert h.seq.has_pending({})  # B is still pending.
    assert states_of(h.seq) == {(J, A, 6, -1), (J, B, 0, b1.begin)}

    # Case: interleaved producer ACKs. A replay is required due to eviction.
    b3_ack = gen(B, 3, ACK)
    assert h.queue(b3_ack) == [True]
    h.expect_replay(b1.begin, b2.begin, b1, a7_rollback_dup, a8_rollback)
    h.expect_deque(b1, b2, b3_ack)
    assert not h.seq.has_pending({})

    # Case: sequence which requires replay, with duplicates internal to the
    # sequence and from before it, met in the ring and also during replay.
    b4 = gen(B, 4, CONTINUE)  # Evicted.
    b1_dup = gen(B, 1, CONTINUE)
    b4_dup = gen(B, 4, CONTINUE)
    b5 = gen(B, 5, CONTINUE)  # Evicted.
    b6 = gen(B, 6, CONTINUE)
    b2_dup = gen(B, 2, CONTINUE)
    b7 = gen(B, 7, CONTINUE)
    b8_ack = gen(B, 8, ACK)
    assert h.queue(b4, b1_dup, b4_dup, b5, b6, b2_dup, b7, b8_ack) == [
        False,
        True,
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    h.expect_replay(b4.begin, b6.begin, b4, b1_dup, b4_dup, b5)
    h.expect_deque(b4, b5, b6, b7, b8_ack)
    assert not h.seq.has_pending({})

    # Case: partial roll-back where all ring entries are skipped.
    b9 = gen(B, 9, CONTINUE)  # Evicted.
    b11_no_ack = gen(B, 11, CONTINUE)  # Evicted.
    b12_no_ack = gen(B, 12, CONTINUE)
    b13_no_ack = gen(B, 13, CONTINUE)
    b10_ack = gen(B, 10, ACK)
    assert h.queue(b9, b11_no_ack, b12_no_ack, b13_no_ack, b10_ack) == [
        False,
        False,
        False,
        False,
        True,
    ]
    h.expect_replay(b9.begin, b12_no_ack.begin, b9, b11_no_ack)
    h.expect_deque(b9, b10_ack)
    assert not h.seq.has_pending({})

    # Case: interleaved ACK'd sequences requiring two replays.
    b11 = gen(B, 11, CONTINUE)  # Evicted.
    a7 = gen(A, 7, CONTINUE)  # Evicted.
    a8 = gen(A, 8, CONTINUE)
    b12 = gen(B, 12, CONTINUE)
    a9_ack = gen(A, 9, ACK)
    b13_ack = gen(B, 13, ACK)
    assert h.queue(b11, a7, a8, b12, a9_ack) == [False, False, False, False, True]
    h.expect_replay(a7.begin, a8.begin, a7)
    h.expect_deque(a7, a8, a9_ack)
    assert h.seq.has_pending({})

    assert h.queue(b13_ack) == [True]
    h.expect_replay(b11.begin, b12.begin, b11, a7, a8)
    h.expect_deque(b11, b12, b13_ack)
    assert not h.seq.has_pending({})

    # Case: reset to an earlier ACK, followed by re-use of clocks.
    b8_ack_reset = gen(B, 8, ACK)
    b9_reuse = gen(B, 9, CONTINUE)
    b10_ack_reuse = gen(B, 10, ACK)
    assert h.queue(b8_ack_reset, b9_reuse, b10_ack_reuse) == [True, False, True]
    h.expect_deque(b9_reuse, b10_ack_reuse)
    assert not h.seq.has_pending({})

    assert model_output(h.queued) == [key(e) for e in h.output]


@pytest.mark.parametrize("buffer", [0, 1, -3])
def test_txn_without_buffer(buffer: int) -> None:
    """Gazette's TestSequencerTxnWithoutBuffer: a buffer below 1 is a ring of 1."""
    gen = EnvelopeGenerator()
    h = Harness(Sequencer(buffer=buffer))
    a1, a2, b1 = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE), gen(B, 1, CONTINUE)
    a1_dup, a2_dup = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE)
    a3_ack, b2, b3_ack = gen(A, 3, ACK), gen(B, 2, CONTINUE), gen(B, 3, ACK)

    # Here the duplicates are recognised though their originals left the
    # ring (the older Go code returned False for them).
    assert h.queue(a1, a2, b1, a1_dup, a2_dup, a3_ack) == [False, False, False, True, True, True]
    h.expect_replay(a1.begin, a3_ack.begin, a1, a2, b1, a1_dup, a2_dup)
    h.expect_deque(a1, a2, a3_ack)
    assert h.seq.has_pending({})  # B still pending.

    assert h.queue(b2, b3_ack) == [False, True]
    h.expect_replay(b1.begin, b3_ack.begin, b1, a1_dup, a2_dup, a3_ack, b2)
    h.expect_deque(b1, b2, b3_ack)
    assert not h.seq.has_pending({})
    assert model_output(h.queued) == [key(e) for e in h.output]


def test_outside_txn_cases() -> None:
    """Gazette's TestSequencerOutsideTxnCases: OUTSIDE_TXN, unknown flags, nil UUIDs."""
    gen = EnvelopeGenerator()
    h = Harness(Sequencer(buffer=0))

    # Case: OUTSIDE_TXN messages immediately deque.
    a1, a2 = gen(A, 1, OUTSIDE), gen(A, 2, OUTSIDE)
    assert h.queue(a1) == [True]
    h.expect_deque(a1)
    assert h.queue(a2) == [True]
    h.expect_deque(a2)
    assert not h.seq.has_pending({})

    # Case: duplicates are ignored.
    a1_dup, a2_dup = gen(A, 1, OUTSIDE), gen(A, 2, OUTSIDE)
    assert h.queue(a1_dup, a2_dup) == [True, True]
    h.expect_deque()

    # Case: any preceding CONTINUE_TXN messages are aborted.
    a3_discard, a4_discard, a5 = gen(A, 3, CONTINUE), gen(A, 4, CONTINUE), gen(A, 5, OUTSIDE)
    assert h.queue(a3_discard, a4_discard, a5) == [False, False, True]
    h.expect_deque(a5)
    assert not h.seq.has_pending({})

    # Case: messages with unknown flags are treated as OUTSIDE_TXN.
    a6_discard, a7_bad_bits = gen(A, 6, CONTINUE), gen(A, 7, 0x100)
    a7_bad_bits_dup = gen(A, 7, 0x100)
    assert h.queue(a6_discard, a7_bad_bits) == [False, True]
    h.expect_deque(a7_bad_bits)
    assert h.queue(a7_bad_bits_dup) == [True]
    h.expect_deque()
    for flags, clock in ((0x3FF, 8), (3, 9)):
        env = gen(A, clock, flags)
        assert h.queue(env) == [True]
        h.expect_deque(env)

    # Case: messages with a zero UUID always deque, and are not tracked.
    z1, z2 = gen.nil(), gen.nil()
    assert h.queue(z1) == [True]
    h.expect_deque(z1)
    assert h.queue(z2) == [True]
    h.expect_deque(z2)
    assert not h.seq.has_pending({})
    assert states_of(h.seq) == {(J, A, 9, -1)}
    assert model_output(h.queued) == [key(e) for e in h.output]


def test_clock_zero_of_a_known_producer_commits_untracked() -> None:
    """Any envelope with clock 0 commits at once, whatever its flags, and is never tracked."""
    gen = EnvelopeGenerator()
    h = Harness(Sequencer(buffer=1))
    a5 = gen(A, 5, CONTINUE)
    assert h.queue(a5) == [False]
    h.expect_deque()
    for flags in (CONTINUE, ACK, OUTSIDE):
        z = gen(A, 0, flags)
        assert h.queue(z) == [True]
        h.expect_deque(z)
        assert states_of(h.seq) == {(J, A, 4, a5.begin)}
    a6_ack = gen(A, 6, ACK)
    assert h.queue(a6_ack) == [True]
    h.expect_replay(a5.begin, a6_ack.begin, *h.queued[:-1])
    # The clock-0 envelopes of A within the span are not emitted again.
    h.expect_deque(a5, a6_ack)
    assert model_output(h.queued) == [key(e) for e in h.output]


def test_dropped_envelopes_take_no_ring_slot() -> None:
    """The ring holds the last ``buffer`` envelopes that were kept; dropped
    duplicates and roll-backs take no slot, so they evict nothing and the ACK
    below is served from a ring of 3 without a replay."""
    gen = EnvelopeGenerator()
    h = Harness(Sequencer(buffer=3))
    a10 = gen(A, 10, CONTINUE)
    dups = [gen(A, 10, CONTINUE) for _ in range(5)]
    b5 = gen(B, 5, OUTSIDE)
    rollbacks = [gen(B, 4, ACK) for _ in range(5)]
    a11_ack = gen(A, 11, ACK)
    assert h.queue(a10, *dups) == [False] + [True] * 5
    h.expect_deque()
    assert h.queue(b5) == [True]
    h.expect_deque(b5)
    assert h.queue(*rollbacks) == [True] * 5
    h.expect_deque()
    assert h.queue(a11_ack) == [True]
    h.expect_deque(a10, a11_ack)  # No MustStartReplay.
    assert model_output(h.queued) == [key(e) for e in h.output]


def test_producer_states_round_trip() -> None:
    """Gazette's TestSequencerProducerStatesRoundTrip: a restored Sequencer, same output."""
    gen = EnvelopeGenerator()
    a1, a2 = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE)
    b1, b2 = gen(B, 1, CONTINUE), gen(B, 2, CONTINUE)
    c1_ack = gen(C, 1, ACK)
    z1 = gen.nil()  # From Gazette's later version of this test.
    b3_ack = gen(B, 3, ACK)
    c2, c1_rollback = gen(C, 2, CONTINUE), gen(C, 1, ACK)
    a3_ack = gen(A, 3, ACK)

    h1 = Harness(Sequencer(buffer=12))
    assert h1.queue(a1, a2, b1, b2, c1_ack) == [False, False, False, False, True]
    h1.expect_deque(c1_ack)
    assert h1.queue(z1) == [True]
    h1.expect_deque(z1)

    states = h1.seq.producer_states()
    assert {state_key(s) for s in states} == {
        (J, A, 0, a1.begin),
        (J, B, 0, b1.begin),
        (J, C, 1, -1),
    }
    assert isinstance(states, list) and all(isinstance(s, ProducerState) for s in states)

    # Recover a Sequencer from the persisted states. Both produce the same
    # output from here, though h2 requires replays while h1 does not.
    h2 = Harness(Sequencer(states, buffer=12))
    assert states_of(h2.seq) == states_of(h1.seq)

    assert h1.queue(b3_ack) == [True]
    assert h2.queue(b3_ack) == [True]
    h2.expect_replay(b1.begin, b3_ack.begin, b1, b2, c1_ack, z1)
    h1.expect_deque(b1, b2, b3_ack)
    h2.expect_deque(b1, b2, b3_ack)

    assert h1.queue(c2, c1_rollback) == [False, True]
    assert h2.queue(c2, c1_rollback) == [False, True]
    h1.expect_deque()
    h2.expect_deque()

    assert h1.queue(a3_ack) == [True]
    assert h2.queue(a3_ack) == [True]
    h2.expect_replay(a1.begin, a3_ack.begin, a1, a2, b1, b2, c1_ack, z1, b3_ack, c2, c1_rollback)
    h1.expect_deque(a1, a2, a3_ack)
    h2.expect_deque(a1, a2, a3_ack)
    assert states_of(h1.seq) == states_of(h2.seq) == {(J, A, 3, -1), (J, B, 3, -1), (J, C, 1, -1)}


def test_producer_states_round_trip_during_dequeue() -> None:
    """Gazette's ...RoundTripDuringDequeue, as the resume procedure a reader must follow.

    producer_states() refuses to run while messages remain to dequeue
    (Gazette's later Checkpoint tightened its internal state instead). A
    reader checkpointing in the middle of a committed sequence resumes at the
    committing envelope with the states from before it, the committing
    producer's replaced by last_ack = clock of the next envelope to yield - 1
    and begin = that envelope's offset (or -1 if it is the committing one).
    """
    gen = EnvelopeGenerator()
    a1, a2, a3_ack = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE), gen(A, 3, ACK)
    a4, a5, a6_ack = gen(A, 4, CONTINUE), gen(A, 5, CONTINUE), gen(A, 6, ACK)

    h1 = Harness(Sequencer(buffer=12))
    assert h1.queue(a1, a2) == [False, False]
    h1.expect_deque()
    before = h1.seq.producer_states()
    assert {state_key(s) for s in before} == {(J, A, 0, a1.begin)}
    assert h1.queue(a3_ack) == [True]
    assert key(h1.seq.deque_committed()) == key(a1)
    with pytest.raises(RuntimeError):
        h1.seq.producer_states()

    # "Crash" after a1 was handled: restore with a2 as the next to yield.
    h2 = Harness(Sequencer([ProducerState(J, A, 1, a2.begin)], buffer=12))
    assert h2.queue(a3_ack) == [True]
    h2.expect_replay(a2.begin, a3_ack.begin, a2)
    h2.expect_deque(a2, a3_ack)

    assert key(h1.seq.deque_committed()) == key(a2)
    assert key(h1.seq.deque_committed()) == key(a3_ack)
    assert h1.seq.deque_committed() is None

    # A checkpoint partway through the next sequence: a4 handled, a5 next.
    assert h1.queue(a4, a5, a6_ack) == [False, False, True]
    assert key(h1.seq.deque_committed()) == key(a4)
    h2 = Harness(Sequencer([ProducerState(J, A, 4, a5.begin)], buffer=12))
    assert h2.queue(a6_ack) == [True]
    h2.expect_replay(a5.begin, a6_ack.begin, a5)
    h2.expect_deque(a5, a6_ack)

    # And with everything but the ACK handled.
    assert key(h1.seq.deque_committed()) == key(a5)
    h2 = Harness(Sequencer([ProducerState(J, A, 5, -1)], buffer=12))
    assert h2.queue(a6_ack) == [True]
    h2.expect_deque(a6_ack)

    assert key(h1.seq.deque_committed()) == key(a6_ack)
    assert h1.seq.deque_committed() is None
    assert states_of(h1.seq) == {(J, A, 6, -1)}


def test_producer_states_straddle_duplicate() -> None:
    """Gazette's TestSequencerProducerStatesStraddleDuplicate: duplicates across a restore."""
    gen = EnvelopeGenerator()
    a1, a2, a3 = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE), gen(A, 3, CONTINUE)
    a1_dup, a2_dup, a3_dup = gen(A, 1, CONTINUE), gen(A, 2, CONTINUE), gen(A, 3, CONTINUE)
    a4_ack = gen(A, 4, ACK)
    log = [a1, a2, a3, a1_dup, a2_dup, a3_dup, a4_ack]

    h1 = Harness(Sequencer(buffer=12))
    assert h1.queue(a1, a2, a3) == [False, False, False]
    h1.expect_deque()
    states = h1.seq.producer_states()
    h2 = Harness(Sequencer(states, buffer=12))

    assert h1.queue(a1_dup, a2_dup, a3_dup, a4_ack) == [True, True, True, True]
    h1.expect_deque(a1, a2, a3, a4_ack)

    # The rules leave open whether the restored Sequencer, which never saw a1..a3,
    # reports the copies as duplicates (Gazette reports them as extending the
    # span); only its output is pinned.
    h2.queue(a1_dup, a2_dup, a3_dup)
    h2.expect_deque()
    assert h2.queue(a4_ack) == [True]
    with pytest.raises(MustStartReplay):
        h2.seq.deque_committed()
    begin, end = h2.seq.replay_range()
    assert begin == a1.begin
    assert end <= a4_ack.begin
    h2.seq.start_replay(e for e in log if begin <= e.begin and e.end <= end)
    h2.expect_deque(a1, a2, a3, a4_ack)


def test_producer_pruning() -> None:
    """Gazette's TestSequencerProducerPruning: horizons in seconds or timedelta, per journal."""
    gen = EnvelopeGenerator()
    a_cont = gen(A, 10 << 4, CONTINUE)  # Clock units are 100 ns, with 4 bits of counter.
    b_cont = gen(B, 19 << 4, CONTINUE)
    b_ack = gen(B, 20 << 4, ACK)
    c_cont = gen(C, 30 << 4, CONTINUE)
    d_old = gen(C, 1 << 4, OUTSIDE, journal="other/journal")  # Alone in its journal.

    h = Harness(Sequencer(buffer=12))
    assert h.queue(a_cont, b_cont, b_ack) == [False, False, True]
    h.expect_deque(b_cont, b_ack)
    assert h.queue(c_cont) == [False]
    h.expect_deque()
    assert h.queue(d_old) == [True]
    h.expect_deque(d_old)

    a = (J, A, (10 << 4) - 1, a_cont.begin)
    b = (J, B, 20 << 4, -1)
    c = (J, C, (30 << 4) - 1, c_cont.begin)
    d = ("other/journal", C, 1 << 4, -1)

    # No horizon, or none > 0: no pruning.
    for horizon in (0, 0.0, -1.0, datetime.timedelta(0), datetime.timedelta(seconds=-5)):
        assert states_of(h.seq, horizon) == {a, b, c, d}
    # A horizon of 20 units (2 us) prunes nothing: A is exactly that much older.
    assert states_of(h.seq, 2e-6) == {a, b, c, d}
    assert states_of(h.seq, datetime.timedelta(microseconds=2)) == {a, b, c, d}
    # 1.9 us prunes A.
    assert states_of(h.seq, 1.9e-6) == {b, c, d}
    assert states_of(h.seq) == {b, c, d}
    # 1 us (160 Clock units) keeps B, which is 159 units older than C.
    assert states_of(h.seq, datetime.timedelta(microseconds=1)) == {b, c, d}
    # 1 ns is > 0 but rounds to no Clock unit: all but the newest of each journal go.
    assert states_of(h.seq, 1e-9) == {c, d}
    assert states_of(h.seq) == {c, d}

    # A pruned producer is a stranger again: its ACK commits alone.
    a_ack = gen(A, 11 << 4, ACK)
    assert h.queue(a_ack) == [True]
    h.expect_deque(a_ack)


def _replay_error_fixture() -> tuple[Harness, Envelope, Envelope]:
    gen = EnvelopeGenerator()
    h = Harness(Sequencer(buffer=0))
    b1, a2, a3_ack = gen(B, 1, CONTINUE), gen(A, 2, CONTINUE), gen(A, 3, ACK)
    assert h.queue(b1, a2, a3_ack) == [False, False, True]
    with pytest.raises(MustStartReplay):
        h.seq.deque_committed()
    assert h.seq.replay_range() == (102, 204) == (a2.begin, a3_ack.begin)
    return h, a2, a3_ack


def _drain(seq: Sequencer) -> list[Envelope]:
    out = []
    while (env := seq.deque_committed()) is not None:
        out.append(env)
    return out


def test_replay_reader_no_error() -> None:
    """Gazette's TestSequencerReplayReaderErrors, case 'no error'."""
    h, a2, a3_ack = _replay_error_fixture()
    h.seq.start_replay(iter([a2]))
    assert [key(e) for e in _drain(h.seq)] == [key(a2), key(a3_ack)]


def test_replay_reader_exception_is_chained() -> None:
    """An exception from the replay iterator is raised as ReplayError chained to it."""
    h, _, _ = _replay_error_fixture()
    boom = OSError("unexpected EOF")

    def failing() -> Iterator[Envelope]:
        raise boom
        yield  # pragma: no cover

    with pytest.raises(ReplayError) as info:
        h.seq.start_replay(failing())
        _drain(h.seq)
    assert info.value.__cause__ is boom
    assert isinstance(info.value, MessageError)


@pytest.mark.parametrize(
    "case",
    ["wrong journal", "begin before range", "end after range"],
)
def test_replay_reader_bad_envelopes(case: str) -> None:
    """A replayed envelope of another journal or outside the range raises ReplayError."""
    h, a2, _ = _replay_error_fixture()
    if case == "wrong journal":
        bad = Envelope(JournalSpec("wrong/journal", {"content-type": NDJSON}), 102, 202, a2.message)
    elif case == "begin before range":
        bad = Envelope(a2.journal, 101, 202, a2.message)  # Gazette: "wrong Begin (101; ...)"
    else:
        bad = Envelope(a2.journal, 102, 302, a2.message)  # Gazette: "wrong End (302; ...)"
    with pytest.raises(ReplayError):
        h.seq.start_replay(iter([bad]))
        _drain(h.seq)


def test_errors_derive_from_message_error() -> None:
    """MustStartReplay and ReplayError are MessageErrors."""
    assert issubclass(MustStartReplay, MessageError)
    assert issubclass(ReplayError, MessageError)


def test_misuse_raises_runtime_error() -> None:
    """Queueing or snapshotting while messages remain to dequeue raises RuntimeError."""
    gen = EnvelopeGenerator()
    seq = Sequencer()
    assert seq.deque_committed() is None
    a1, a2 = gen(A, 1, OUTSIDE), gen(A, 2, OUTSIDE)
    assert seq.queue_uncommitted(a1)
    with pytest.raises(RuntimeError):
        seq.queue_uncommitted(a2)
    with pytest.raises(RuntimeError):
        seq.producer_states()
    assert key(seq.deque_committed()) == key(a1)
    assert seq.deque_committed() is None
    assert seq.deque_committed() is None
    assert seq.queue_uncommitted(a2)

    # Still pending while a replay has not been served.
    seq = Sequencer(buffer=1)
    a3, a4_ack = gen(A, 3, CONTINUE), gen(A, 4, ACK)
    seq.queue_uncommitted(a3)
    seq.queue_uncommitted(a4_ack)
    with pytest.raises(MustStartReplay):
        seq.deque_committed()
    with pytest.raises(RuntimeError):
        seq.queue_uncommitted(gen(A, 5, OUTSIDE))
    with pytest.raises(RuntimeError):
        seq.producer_states()


def test_replay_calls_without_a_pending_replay_raise_runtime_error() -> None:
    """replay_range and start_replay with nothing to dequeue are misuse (Gazette panics)."""
    seq = Sequencer()
    with pytest.raises(RuntimeError):
        seq.replay_range()
    with pytest.raises(RuntimeError):
        seq.start_replay(iter(()))


def test_has_pending_since() -> None:
    """has_pending: a partial sequence begins at or after the offset given for its journal."""
    gen = EnvelopeGenerator()
    seq = Sequencer()
    assert not seq.has_pending({})
    gen(A, 1, OUTSIDE)  # Offsets 0..100 are taken by an envelope not queued.
    a2 = gen(A, 2, CONTINUE)
    seq.queue_uncommitted(a2)
    assert seq.deque_committed() is None
    assert a2.begin == 102
    assert seq.has_pending({})  # A missing journal counts as offset 0.
    assert seq.has_pending({"other/journal": 10**9})
    assert seq.has_pending({J: 102})
    assert not seq.has_pending({J: 103})
    b = gen(B, 7, CONTINUE, journal="other/journal")
    seq.queue_uncommitted(b)
    assert seq.has_pending({J: 103})
    assert not seq.has_pending({J: 103, "other/journal": 1})
    a3_ack = gen(A, 3, ACK)
    seq.queue_uncommitted(a3_ack)
    assert [key(e) for e in _drain(seq)] == [key(a2), key(a3_ack)]
    assert seq.has_pending({})
    assert not seq.has_pending({"other/journal": 1})


def test_journals_are_sequenced_apart() -> None:
    """The same producer in two journals has two independent states and spans."""
    gen = EnvelopeGenerator()
    h = Harness(Sequencer(buffer=2))
    x1 = gen(A, 1, CONTINUE, journal="j/x")
    y5 = gen(A, 5, CONTINUE, journal="j/y")
    y6_ack = gen(A, 6, ACK, journal="j/y")
    x2 = gen(A, 2, CONTINUE, journal="j/x")
    x3_ack = gen(A, 3, ACK, journal="j/x")
    assert h.queue(x1, y5, y6_ack) == [False, False, True]
    h.expect_deque(y5, y6_ack)
    # Clock 2 < 6 is no duplicate in j/x, where A's last ACK is still 0.
    assert states_of(h.seq) == {("j/x", A, 0, x1.begin), ("j/y", A, 6, -1)}
    assert h.queue(x2, x3_ack) == [False, True]
    h.expect_replay(x1.begin, x2.begin, x1)
    h.expect_deque(x1, x2, x3_ack)
    assert model_output(h.queued) == [key(e) for e in h.output]


@pytest.mark.parametrize("buffer", [1, 2, 4096])
def test_ack_with_the_clock_of_an_emitted_span_message_is_dropped(
    sequencer_type: type[Any], buffer: int
) -> None:
    """A producer that reused a clock: CONTINUE_TXN 7 then ACK_TXN 7. Go's
    Sequencer.Step emits the span message and drops the ACK (its clock is
    not above the last one dequeued); so do we, from the ring or a replay.
    An ACK above every emitted clock is emitted as usual."""
    gen = EnvelopeGenerator()
    envs = [gen(A, 5, CONTINUE), gen(B, 1, OUTSIDE), gen(A, 7, CONTINUE), gen(B, 2, OUTSIDE),
            gen(A, 7, ACK), gen(A, 9, CONTINUE), gen(A, 10, ACK)]
    out: list[Envelope] = []
    seq = sequencer_type(buffer=buffer)
    for env in envs:
        seq.queue_uncommitted(env)
        while True:
            try:
                got = seq.deque_committed()
            except MustStartReplay:
                b, e = seq.replay_range()
                seq.start_replay(x for x in envs if b <= x.begin and x.end <= e)
                continue
            if got is None:
                break
            out.append(got)
    assert [key(e) for e in out] == [key(envs[i]) for i in (1, 3, 0, 2, 5, 6)]
    assert states_of(seq) == {(J, A, 10, -1), (J, B, 2, -1)}
    assert [key(e) for e in out] == model_output(envs)
