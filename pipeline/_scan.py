"""Reading one journal into Arrow record batches, committed or not, in parallel.

The reading is ``message.arrow``'s (``ReadCommittedArrow``,
``ReadUncommittedArrow``): windows of NDJSON parsed by Arrow in bulk, the
commit decided with numpy from the UUID column, rows taken in commit order.

The committed set of a journal is a per-(journal, producer) computation: the
Sequencer's decision for an envelope depends only on earlier envelopes of
the same producer in the same journal, and its output does not depend on its
ring size. So a journal is read by ``buckets`` tasks, each owning the
producers whose hashed ID falls in its bucket: every task reads the journal,
and each frame is sequenced and delivered by exactly one task.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import pyarrow as pa

from journal import JournalClient
from message.arrow import BATCH_BYTES, ArrowContent, ReadCommittedArrow, ReadUncommittedArrow

READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"

#: Bytes of a journal read and decoded at once (a record batch's worth).
WINDOW_BYTES = BATCH_BYTES


def read_journal(
    client: JournalClient,
    journal: str,
    content: ArrowContent,
    *,
    end_offset: int | None = None,
    isolation: str = READ_COMMITTED,
    bucket: int = 0,
    buckets: int = 1,
    include_acks: bool = True,
    skip_corrupt: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Record batches (envelope columns, then ``content``'s) of the rows of
    ``journal`` up to ``end_offset`` (default: its current end) that belong
    to ``bucket`` of ``buckets``: committed ones (with their ACKs if
    ``include_acks``), or every frame with ``read_uncommitted``; corrupt
    frames skipped with ``skip_corrupt``."""
    if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise ValueError(f"isolation must be {READ_COMMITTED} or {READ_UNCOMMITTED}")
    cls = ReadCommittedArrow if isolation == READ_COMMITTED else ReadUncommittedArrow
    with cls(
        client, journal, content=content, end_offset=end_offset, bucket=bucket,
        buckets=buckets, include_acks=include_acks, batch_bytes=WINDOW_BYTES,
        skip_corrupt=skip_corrupt,
    ) as reader:
        yield from reader


__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "read_journal"]
