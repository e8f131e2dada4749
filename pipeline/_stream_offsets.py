"""Micro-batches of committed messages, resumable from a JSON-able offset.

A streaming offset is what a restarted query needs to continue exactly
where it stopped: per journal, the offset read through, and the Sequencer's
producer states at that offset (open transactions included, by where they
began). It is a checkpoint (``message.Checkpoint``) in a form Spark stores
in its offset log::

    {"offsets": {"clicks/part-0": 4096, ...},
     "states": {"clicks/part-0": {"<producer hex>": "<last_ack>:<begin>", ...}, ...}}

Planning a micro-batch (on the driver) sequences the new range once to learn
the states at its end (decoding UUIDs only); the task that reads the range
reads it with ``message.arrow.ReadCommittedArrow`` from the states at its
start, and gets the same answer, replaying the start of a transaction that
began in an earlier range when its ACK arrives in this one.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from framing import TruncatedFrameError, framing_by_content_type
from journal import JournalClient, OffsetTracker
from message import Checkpoint, ProducerState
from message.arrow import ArrowContent, ReadCommittedArrow

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


def checkpoint_of(offset: Offset) -> Checkpoint:
    """The ``message.Checkpoint`` a streaming offset stands for."""
    offsets = {name: int(at) for name, at in offset.get("offsets", {}).items()}
    return Checkpoint(offsets, [s for name in offsets for s in states_of(offset, name)])


def committed_position(location: str | os.PathLike[str]) -> Checkpoint | None:
    """Where a streaming query reading journals has got to, from its
    checkpoint ``location``: the end offsets (and producer states) of its
    last micro-batch that Spark recorded as committed (``commits/<n>``), read
    from Spark's offset log (``offsets/<n>``: a version line, a metadata line,
    then each source's offset); None before any. A query reading several
    journal sources gets them all in one Checkpoint."""
    root = Path(location)
    if not (root / "offsets").is_dir():
        raise FileNotFoundError(f"{root} is not a streaming query's checkpoint location"
                                " (it has no offsets/ directory)")
    done = sorted((int(p.name) for p in (root / "commits").glob("*") if p.name.isdigit()),
                  reverse=True)
    for batch in done:
        path = root / "offsets" / str(batch)
        if not path.is_file():
            continue
        merged: Offset = empty_offset()
        for line in path.read_text().splitlines()[2:]:
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # Another kind of source's offset.
            if isinstance(doc, dict) and isinstance(doc.get("offsets"), dict):
                merged["offsets"].update(doc["offsets"])
                merged["states"].update(doc.get("states", {}))
        return checkpoint_of(merged)
    return None


def _reader(
    client: JournalClient, journal: str, content: ArrowContent, start: int, end: int,
    states: list[ProducerState], include_acks: bool = True, skip_corrupt: bool = False,
) -> ReadCommittedArrow:
    """A committed reader of ``[start, end)`` resuming from ``states``."""
    return ReadCommittedArrow(
        client, journal, content=content, checkpoint=Checkpoint({journal: start}, states),
        end_offset=end, include_acks=include_acks, skip_corrupt=skip_corrupt,
    )


def sequence_range(
    client: JournalClient,
    journal: str,
    content: ArrowContent,
    start: int,
    end: int,
    states: list[ProducerState],
    prune_horizon: float | datetime.timedelta = 0,
    skip_corrupt: bool = False,
) -> list[ProducerState]:
    """Sequence ``[start, end)`` of ``journal`` from ``states``; return the
    producer states at ``end`` (only UUIDs are decoded; corrupt frames
    skipped with ``skip_corrupt``, as the read of the range skips them)."""
    uuids_only = ArrowContent((), content.uuid_path, content.proto_class, content.uuid_field)
    with _reader(client, journal, uuids_only, start, end, states,
                 skip_corrupt=skip_corrupt) as reader:
        for _ in reader:
            pass
        return reader.checkpoint(prune_horizon).states


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
    content: ArrowContent,
    start: int,
    end: int,
    states: list[ProducerState],
    include_acks: bool = True,
    skip_corrupt: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Record batches of the messages committed by ``[start, end)``, resuming
    from ``states`` (ACKs included unless ``include_acks`` is False)."""
    with _reader(client, journal, content, start, end, states, include_acks,
                 skip_corrupt) as reader:
        yield from reader
