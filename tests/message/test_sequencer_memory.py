"""The Sequencer's memory is bounded by its ring, whatever the traffic."""

from __future__ import annotations

import gc
import uuid
from dataclasses import dataclass
from typing import Any

from journal import JournalSpec
from message import Envelope, Flags, build_uuid

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


def live_envelopes() -> int:
    """Envelopes alive: after the loop drops its own, those the Sequencer holds."""
    return sum(type(o) is Envelope for o in gc.get_objects())


def test_abandoned_spans_do_not_grow_memory(sequencer_type: type[Any]) -> None:
    """Many producers that open long transactions and never ACK them leave the
    Sequencer holding at most about twice its ring of envelopes."""
    seq = sequencer_type(buffer=64)
    gc.collect()
    before = live_envelopes()
    offset = 0
    for n in range(20_000):
        producer = bytes([1, 0, 0, 0, n % 50 // 256, n % 50])
        env = Envelope(SPEC, offset, offset + 10,
                       Msg(build_uuid(producer, 1000 + n, Flags.CONTINUE_TXN)))
        offset += 10
        assert seq.queue_uncommitted(env) is False
        assert seq.deque_committed() is None
        del env
        if n % 2000 == 1999:
            assert live_envelopes() - before <= 2 * 64
    assert seq.has_pending({})
