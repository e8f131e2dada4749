"""Synthetic traffic shared by the benchmarks: many producers, a mix of
committed messages and transactions of a few messages each."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

from journal import JournalSpec
from message import Envelope, Flags, build_uuid, new_clock, new_producer_id

NDJSON = "application/x-ndjson"


@dataclass(slots=True)
class Msg:
    """The smallest Message: just a UUID."""

    uuid: uuid.UUID

    def get_uuid(self) -> uuid.UUID:
        return self.uuid

    def set_uuid(self, u: uuid.UUID) -> None:
        self.uuid = u

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg(uuid.UUID(int=0))


def envelopes(n: int, producers: int = 100, seed: int = 1, frame: int = 100) -> list[Envelope]:
    """``n`` envelopes of one journal from ``producers`` producers: half of
    what a producer starts is a committed message, half a transaction of 1 to
    8 messages followed by its ACK."""
    rng = random.Random(seed)
    spec = JournalSpec("bench/sequencer", {"content-type": NDJSON})
    ids = [new_producer_id() for _ in range(producers)]
    now = new_clock(time.time_ns())
    clocks = dict.fromkeys(ids, now)
    open_txn = dict.fromkeys(ids, 0)
    out: list[Envelope] = []
    offset = 0
    while len(out) < n:
        p = rng.choice(ids)
        clocks[p] += 1
        if open_txn[p]:
            if open_txn[p] >= rng.randint(1, 8):
                flags, open_txn[p] = Flags.ACK_TXN, 0
            else:
                flags, open_txn[p] = Flags.CONTINUE_TXN, open_txn[p] + 1
        elif rng.random() < 0.5:
            flags = Flags.OUTSIDE_TXN
        else:
            flags, open_txn[p] = Flags.CONTINUE_TXN, 1
        out.append(Envelope(spec, offset, offset + frame, Msg(build_uuid(p, clocks[p], flags))))
        offset += frame
    return out
