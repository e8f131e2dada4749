"""Synthetic traffic shared by the benchmarks: many producers, a mix of
committed messages and transactions of a few messages each."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from uuid import UUID

import orjson

from journal import JournalClient, JournalSpec
from message import Envelope, Flags, build_uuid, new_clock, new_producer_id

NDJSON = "application/x-ndjson"


@dataclass(slots=True)
class Msg:
    """The smallest Message: just a UUID."""

    id: UUID

    def get_uuid(self) -> UUID:
        return self.id

    def set_uuid(self, u: UUID) -> None:
        self.id = u

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg(UUID(int=0))


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


def mixed_frames(
    n: int, producers: int = 100, journals: int = 2, seed: int = 1
) -> tuple[list[list[bytes]], bytes]:
    """``n`` NDJSON frames (about 100 bytes each) over ``journals`` journals:
    ``(frames of each journal, order)``, where ``order`` has one byte per
    frame, the journal it was appended to, in append order.

    ``producers`` producers, each picked at random per step: 90% of the
    messages are OUTSIDE_TXN, 10% in transactions of 1 to 8 messages to one
    journal (interleaved with other producers' messages), each followed by
    its ACK_TXN; and 1% of the steps append again a recent frame of a
    journal (a retried append: a duplicate)."""
    rng = random.Random(seed)
    ids = [new_producer_id() for _ in range(producers)]
    clocks = dict.fromkeys(ids, new_clock(time.time_ns()))
    txn: dict[bytes, tuple[int, int]] = {}  # producer -> (journal, messages left)
    frames: list[list[bytes]] = [[] for _ in range(journals)]
    order = bytearray()
    count = 0

    def append(j: int, line: bytes) -> None:
        frames[j].append(line)
        order.append(j)

    recent: list[list[bytes]] = [[] for _ in range(journals)]  # not ACKs: see below
    while len(order) < n:
        if rng.random() < 0.01 and recent[0]:
            # A retried append of a recent message (an ACK intent re-sent
            # after later commits would be rolled back, and logged).
            j = rng.randrange(journals)
            if recent[j]:
                append(j, recent[j][-rng.randint(1, len(recent[j]))])
                continue
        p = rng.choice(ids)
        clocks[p] += 1
        if p in txn:
            j, left = txn[p]
            if left:
                flags = Flags.CONTINUE_TXN
                txn[p] = (j, left - 1)
            else:
                flags = Flags.ACK_TXN
                del txn[p]
        elif rng.random() < 0.025:
            j = rng.randrange(journals)
            flags = Flags.CONTINUE_TXN
            txn[p] = (j, rng.randint(1, 8) - 1)
        else:
            j, flags = rng.randrange(journals), Flags.OUTSIDE_TXN
        count += 1
        doc = {
            "_meta": {"uuid": str(build_uuid(p, clocks[p], flags))},
            "n": count,
            "page": f"/products/{count % 977:05d}",
            "session": f"s-{count % 5003:06d}",
        }
        line = orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)
        append(j, line)
        if flags != Flags.ACK_TXN:
            recent[j].append(line)
            if len(recent[j]) > 2000:
                del recent[j][:1000]
    return frames, bytes(order)


def publish_mixed(client: JournalClient, journal: str, n: int, seed: int = 1) -> int:
    """Publish about ``n`` NDJSON messages to ``journal`` (which must exist)
    from 10 producers: 90% committed one by one, 10% in transactions of 1 to
    4 messages, and 1% of the appends retried (the frame lands twice).
    Returns the number of frames in the journal (ACKs and duplicates included)."""
    from message import JsonDocument, Publisher

    rng = random.Random(seed)
    spec = client.get(journal)
    pubs = [Publisher(client) for _ in range(10)]
    frames = 0
    i = 0

    def to_journal(_msg: object) -> tuple[str, str]:
        return spec.name, spec.content_type or ""

    while i < n:
        pub = pubs[rng.randrange(10)]
        if rng.random() < 0.1:
            for _ in range(rng.randint(1, 4)):
                pub.publish_uncommitted(to_journal, JsonDocument(n=i, page=f"/p/{i % 97}"))
                i += 1
                frames += 1
            for intent in pub.build_ack_intents():
                client.append(intent.journal, intent.intent)
                frames += 1
        else:
            doc = JsonDocument(n=i, page=f"/p/{i % 97}")
            fut = pub.publish_committed(to_journal, doc)
            i += 1
            frames += 1
            if rng.random() < 0.01:
                fut.result()
                with client.read(journal, fut.result().begin, fut.result().end) as r:
                    client.append(journal, r.read())
                frames += 1
    client.flush()
    return frames


def copy_journal(
    src: JournalClient, dst: JournalClient, journal: str, chunk: int = 4 << 20
) -> None:
    """Append ``journal``'s bytes in ``src`` to the same journal in ``dst``, in
    pieces of about ``chunk`` bytes cut at newlines (NDJSON: whole frames)."""
    with src.read(journal) as r:
        data = r.read()
    start = 0
    while start < len(data):
        end = data.rfind(b"\n", start, start + chunk) + 1
        if end <= start:
            end = data.index(b"\n", start) + 1
        dst.append(journal, data[start:end])
        start = end
    dst.flush()
