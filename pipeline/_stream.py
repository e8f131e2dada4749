"""Micro-batches of committed messages, resumable from a JSON-able offset.

A streaming offset is what a restarted query needs to continue exactly
where it stopped: per journal, the offset read through, and the Sequencer's
producer states at that offset (open transactions included, by where they
began). It is a checkpoint (``message.Checkpoint``) in a form Spark stores
in its offset log::

    {"offsets": {"clicks/part-0": 4096, ...},
     "states": {"clicks/part-0": {"<producer hex>": "<last_ack>:<begin>", ...}, ...}}

Planning a micro-batch (on the driver) sequences the new range once to learn
the states at its end; the task that reads the range sequences it again from
the states at its start, and gets the same answer, replaying the start of a
transaction that began in an earlier range when its ACK arrives in this one.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from framing import TruncatedFrameError, framing_by_content_type
from journal import JournalClient, OffsetTracker
from message import (
    Envelope,
    ProducerState,
    ReadCommittedIter,
    Sequencer,
    get_clock,
    get_flags,
    get_producer_id,
)
from message.layout import UUID_EPOCH_OFFSET

from ._content import META_FIELDS, ContentSpec

Offset = dict[str, Any]


def empty_offset() -> Offset:
    return {"offsets": {}, "states": {}}


def states_of(offset: Offset, journal: str) -> list[ProducerState]:
    out = []
    for producer, value in offset.get("states", {}).get(journal, {}).items():
        last_ack, begin = value.split(":")
        out.append(ProducerState(journal, bytes.fromhex(producer), int(last_ack), int(begin)))
    return out


def encode_states(states: list[ProducerState]) -> dict[str, str]:
    return {s.producer.hex(): f"{s.last_ack}:{s.begin}" for s in states}


def sequence_range(
    client: JournalClient,
    journal: str,
    content: ContentSpec,
    start: int,
    end: int,
    states: list[ProducerState],
    on_commit: Callable[[Envelope, int], None] | None = None,
    prune_horizon: float | datetime.timedelta = 0,
) -> list[ProducerState]:
    """Sequence ``[start, end)`` of ``journal`` from ``states``; call
    ``on_commit(envelope, commit_offset)`` for each committed envelope, in
    order; return the producer states at ``end``."""
    seq = Sequencer(states)
    with ReadCommittedIter(
        client, journal, content.new_message, seq, offset=start, end_offset=end
    ) as it:
        for out in it:
            if on_commit is not None:
                on_commit(out, it.commit_offset)
    return seq.producer_states(prune_horizon)


def frame_boundary(client: JournalClient, journal: str, begin: int, end: int, budget: int) -> int:
    """Where a micro-batch of at most ``budget`` bytes from ``begin`` ends:
    the end of the last whole frame within it (of the first frame, if that
    alone is larger), at most ``end``. Only frames are found, nothing decoded."""
    framing = framing_by_content_type(client.get(journal).content_type or "")
    read_frames = getattr(framing, "read_frames", None)
    if read_frames is None or end - begin <= budget:
        return end
    limit = begin + budget
    cut = None
    with client.read(journal, begin, end) as r:
        tracker = OffsetTracker(r)
        try:
            for first, stop, _ in read_frames(tracker, chunk_size=min(1 << 20, budget + 1)):
                base = int(tracker.base_at(first))  # retention may have removed what was asked for
                if cut is not None and base + stop > limit:
                    return cut
                cut = base + int(stop)
        except TruncatedFrameError:
            pass  # a corrupt tail: the reader reports it
    return end if cut is None else cut


def read_range(
    client: JournalClient,
    journal: str,
    content: ContentSpec,
    start: int,
    end: int,
    states: list[ProducerState],
    batch_rows: int = 8192,
) -> Iterator[pa.RecordBatch]:
    """Record batches of the messages committed by ``[start, end)``, each
    yielded once it holds ``batch_rows`` rows (the last one, fewer)."""
    spec = client.get(journal)
    values = content.values_of(spec.content_type)
    schema = pa.schema([*META_FIELDS, *content.fields])
    rows: list[tuple[Envelope, int, list[Any]]] = []
    with ReadCommittedIter(
        client, journal, content.new_message, Sequencer(states), offset=start, end_offset=end
    ) as it:
        for env in it:
            rows.append((env, it.commit_offset, values(env.message)))
            if len(rows) >= batch_rows:
                yield _to_batch(journal, rows, content, schema)
                rows = []
    if rows:
        yield _to_batch(journal, rows, content, schema)


def _to_batch(
    journal: str, rows: list[tuple[Envelope, int, list[Any]]], content: ContentSpec,
    schema: pa.Schema,
) -> pa.RecordBatch:
    uuids = [env.message.get_uuid() for env, _, _ in rows]
    clocks = [get_clock(u) for u in uuids]
    times = [
        None if c == 0
        else datetime.datetime.fromtimestamp(0, datetime.UTC)
        + datetime.timedelta(microseconds=((c >> 4) - UUID_EPOCH_OFFSET) // 10)
        for c in clocks
    ]
    cols = [
        pa.array([journal] * len(rows), pa.string()),
        pa.array([env.begin for env, _, _ in rows], pa.int64()),
        pa.array([env.end for env, _, _ in rows], pa.int64()),
        pa.array([str(u) for u in uuids], pa.string()),
        pa.array([get_producer_id(u).hex() for u in uuids], pa.string()),
        pa.array(clocks, pa.int64()),
        pa.array([get_flags(u) for u in uuids], pa.int32()),
        pa.array(times, pa.timestamp("us", tz="UTC")),
        pa.array([c for _, c, _ in rows], pa.int64()),
        *content.columns([v for _, _, v in rows]),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=schema)
