"""The Sequencer's memory is bounded by its ring, whatever the traffic."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from journal import JournalSpec
from message import Envelope, Flags, Sequencer, build_uuid

SPEC = JournalSpec("mem/j", {"content-type": "application/x-ndjson"})


@dataclass
class Msg:
    u: uuid.UUID

    def get_uuid(self) -> uuid.UUID:
        return self.u

    def set_uuid(self, u: uuid.UUID) -> None:
        self.u = u

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg(uuid.UUID(int=0))


def held(seq: Sequencer) -> int:
    """Envelopes the Sequencer still references for open spans."""
    return sum(len(p.entries) for p in seq._partials.values())


def test_abandoned_spans_do_not_grow_memory() -> None:
    """Many producers that open long transactions and never ACK them leave the
    Sequencer holding at most about twice its ring of envelopes."""
    seq = Sequencer(buffer=64)
    offset = 0
    for n in range(20_000):
        producer = bytes([1, 0, 0, 0, n % 50 // 256, n % 50])
        env = Envelope(SPEC, offset, offset + 10,
                       Msg(build_uuid(producer, 1000 + n, Flags.CONTINUE_TXN)))
        offset += 10
        assert seq.queue_uncommitted(env) is False
        assert seq.deque_committed() is None
        assert held(seq) <= 2 * 64
    assert seq.has_pending({})
