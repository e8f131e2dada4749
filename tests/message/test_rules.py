"""The commit rules (message.rules): ``decide`` against the table written
out here from docs/concepts.md, each Sequencer (native and Python) against
``decide``, envelope by envelope, and each column form (numpy, native)
against the reference Sequencer, which decides by the rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import JournalSpec
from message import Envelope, Flags, JsonDocument, build_uuid
from message.rules import QueueOutcome, ack_emits, decide, outside_commits, span_emits

OUT, C, A = int(Flags.OUTSIDE_TXN), int(Flags.CONTINUE_TXN), int(Flags.ACK_TXN)
SPEC = JournalSpec("j", {"content-type": "application/x-ndjson"})
PRODUCER = bytes.fromhex("0a0b0c0d0e0f")


def expected(flags: int, clock: int, last_ack: int, max_clock: int, span_open: bool
             ) -> QueueOutcome:
    """docs/concepts.md's rules, spelled out as a table."""
    if clock == 0:
        return QueueOutcome.COMMIT_UNTRACKED
    if flags == C:
        return QueueOutcome.DUPLICATE if clock <= max_clock else QueueOutcome.EXTEND_SPAN
    if flags == A:
        if clock <= last_ack:
            return QueueOutcome.ROLLBACK
        return QueueOutcome.COMMIT_SPAN if span_open else QueueOutcome.COMMIT_ACK
    return QueueOutcome.DUPLICATE if clock <= last_ack else QueueOutcome.COMMIT_OUTSIDE


def test_decide_is_the_table() -> None:
    for flags in (OUT, C, A, 0x3):  # 0x3: unknown flags, read as OUTSIDE_TXN
        for last_ack in range(4):
            for max_clock in range(last_ack, 6):
                for span_open in (False, True):
                    for clock in range(8):
                        got = decide(flags, clock, last_ack, max_clock, span_open)
                        want = expected(flags, clock, last_ack, max_clock, span_open)
                        assert got is want, (flags, clock, last_ack, max_clock, span_open)


def test_emission_rules() -> None:
    assert outside_commits(5, 4) and not outside_commits(4, 4)
    assert span_emits(5, 4, 5) and not span_emits(4, 4, 5) and not span_emits(6, 4, 5)
    assert ack_emits(5, 4) and not ack_emits(5, 5)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # a type, not state
@given(st.lists(st.tuples(st.sampled_from([OUT, C, A]), st.integers(0, 12)), max_size=60))
def test_each_sequencer_does_what_decide_says(sequencer_type: Any,
                                              steps: list[tuple[int, int]]) -> None:
    """Fed one producer's envelopes, a Sequencer (with a ring that holds
    them all) drops what ``decide`` calls a duplicate or a roll-back, holds
    what extends the open transaction, and commits the rest: the envelope
    alone, or the open transaction ending with it."""
    seq = sequencer_type(buffer=1024)
    last_ack = max_clock = -1  # the producer is not known yet
    span_open = False
    for offset, (flags, clock) in enumerate(steps):
        doc = JsonDocument(i=offset)
        doc.set_uuid(build_uuid(PRODUCER, clock, Flags(flags)))
        env = Envelope(SPEC, offset, offset + 1, doc)
        if clock and last_ack < 0:
            last_ack = max_clock = clock - 1  # first seen: starts just below
        outcome = decide(flags, clock, last_ack, max_clock, span_open)
        done = seq.queue_uncommitted(env)
        out = []
        while (e := seq.deque_committed()) is not None:
            out.append(e)
        assert done is (outcome is not QueueOutcome.EXTEND_SPAN), outcome
        if outcome in (QueueOutcome.DUPLICATE, QueueOutcome.ROLLBACK, QueueOutcome.EXTEND_SPAN):
            assert out == [], outcome
        elif outcome is QueueOutcome.COMMIT_SPAN:
            assert out and all(e.begin <= offset for e in out), outcome
        else:
            assert out == [env], outcome
        # What each outcome does to the producer's state.
        if outcome is QueueOutcome.EXTEND_SPAN:
            max_clock, span_open = clock, True
        elif outcome is not QueueOutcome.DUPLICATE and outcome is not (
                QueueOutcome.COMMIT_UNTRACKED):
            last_ack = max_clock = clock
            span_open = False


@st.composite
def _frames(draw: Any) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """One journal's frames as (producer, clock, flags): duplicates,
    roll-backs, reused clocks, unknown flags and clock 0 among them; and
    the (producer, last_ack) of some producers known before them."""
    n = draw(st.integers(0, 60))
    frames = [(draw(st.integers(1, 5)), draw(st.integers(0, 12)),
               draw(st.sampled_from([OUT, OUT, C, C, C, A, A, 3]))) for _ in range(n)]
    known = draw(st.lists(st.tuples(st.integers(1, 7), st.integers(0, 12)), max_size=6,
                          unique_by=lambda k: k[0]))
    return frames, known


def _sequencer_commits(frames: list[tuple[int, int, int]], known: list[tuple[int, int]]
                       ) -> list[int]:
    """Per frame, the offset of the frame that commits it (itself or its
    ACK), or -1: what the reference Sequencer, which decides by
    ``message.rules``, emits."""
    from message import ProducerState
    from message._sequencer import Sequencer

    seq = Sequencer([ProducerState("j", p.to_bytes(6, "big"), a, -1) for p, a in known],
                    buffer=1024)
    commit = dict.fromkeys(range(len(frames)), -1)
    for i, (p, clock, flags) in enumerate(frames):
        doc = JsonDocument()
        doc.set_uuid(build_uuid(p.to_bytes(6, "big"), clock, flags))
        seq.queue_uncommitted(Envelope(SPEC, i * 10, i * 10 + 10, doc))
        while (e := seq.deque_committed()) is not None:
            by = seq.committed_by()
            assert by is not None
            commit[e.begin // 10] = by.begin
    return [commit[i] for i in range(len(frames))]


@settings(max_examples=300, deadline=None)
@given(_frames())
def test_each_column_form_commits_what_the_rules_commit(
        case: tuple[list[tuple[int, int, int]], list[tuple[int, int]]]) -> None:
    """The column forms of the rules (numpy, and native where built) commit
    each frame by the frame the reference Sequencer commits it by."""
    import logging

    np = pytest.importorskip("numpy")
    from message import _core
    from message._columns_sequencer import ProducerColumns, numpy_sequence_columns

    frames, known = case
    logging.getLogger("message").disabled = True  # unknown flags are logged: not the point
    try:
        want = _sequencer_commits(frames, known)
    finally:
        logging.getLogger("message").disabled = False
    begin = np.arange(len(frames), dtype=np.int64) * 10
    producers = np.array([p for p, _, _ in frames], dtype=np.uint64)
    clocks = np.array([c for _, c, _ in frames], dtype=np.uint64)
    flags = np.array([f for _, _, f in frames], dtype=np.int32)
    states = ProducerColumns.of([(p, a, -1) for p, a in known])
    got, _ = numpy_sequence_columns(begin, producers, clocks, flags, states)
    assert got.tolist() == want
    if _core.NATIVE is not None:
        from message._columns_sequencer import sequence_columns

        got, _ = sequence_columns(begin, producers, clocks, flags, states)
        assert got.tolist() == want
