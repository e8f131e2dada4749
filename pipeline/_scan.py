"""Reading one journal into Arrow record batches, committed or not, in parallel.

The committed set of a journal is a per-(journal, producer) computation: the
Sequencer's decision for an envelope depends only on earlier envelopes of
the same producer in the same journal, and its output does not depend on its
ring size. So a journal is read by ``buckets`` tasks, each owning the
producers whose hashed ID falls in its bucket:

1. **Index.** The task reads the journal up to a fixed end offset and keeps
   only each frame's ``(begin, end, uuid)``: for NDJSON, Arrow's C++ JSON
   reader parses the UUID field of whole windows of lines, and numpy decodes
   the UUID strings; other framings go through ``ReadUncommittedIter``.
2. **Sequence.** Among its producers, those whose frames are all
   OUTSIDE_TXN with increasing clocks commit every frame (the common case,
   decided with numpy); the others are fed, in offset order, to a real
   ``Sequencer``. Frames with clock 0 always commit.
3. **Decode.** Only the task's committed frames are decoded into content
   columns (for NDJSON, the selected lines are parsed by Arrow in bulk).

Every task reads the whole journal's UUIDs, but each frame is sequenced and
decoded by exactly one task. With one bucket, step 1 parses the content too
and step 3 is a ``take``. Whatever goes wrong on the fast NDJSON path (a line
that is not one JSON object, a value Arrow will not convert) sends that window
to the exact per-frame path, which raises the framing's own errors.
"""

from __future__ import annotations

import bisect
import uuid as _uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from framing import CONTENT_TYPE_JSON_LINES
from journal import JournalClient, JournalSpec
from message import Envelope, MustStartReplay, ReadUncommittedIter, Sequencer
from message.columns import format_uuid_strings, parse_uuid_strings
from message.layout import (
    PRODUCER_MASK,
    UUID_EPOCH_OFFSET,
    clocks_of,
    flags_of,
    outside_commits_grouped,
)

from ._content import META_FIELDS, ContentSpec, to_arrow

READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"

#: Bytes of a journal parsed at once by the NDJSON fast path.
WINDOW_BYTES: Final = 16 << 20
_MASK48: Final = np.uint64(PRODUCER_MASK)
_GREGORIAN: Final = UUID_EPOCH_OFFSET


@dataclass(slots=True)
class _Index:
    """Per frame of a journal: offsets and the UUID as two 64-bit halves."""

    begin: np.ndarray
    end: np.ndarray
    hi: np.ndarray
    lo: np.ndarray

    @staticmethod
    def concat(parts: list[_Index]) -> _Index:
        if not parts:
            e = np.zeros(0, dtype=np.int64)
            u = np.zeros(0, dtype=np.uint64)
            return _Index(e, e, u, u)
        return _Index(
            np.concatenate([p.begin for p in parts]),
            np.concatenate([p.end for p in parts]),
            np.concatenate([p.hi for p in parts]),
            np.concatenate([p.lo for p in parts]),
        )


def bucket_of(producers: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each producer ID: a multiplicative hash, then modulo."""
    mixed = (producers * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return (mixed % np.uint64(buckets)).astype(np.int64)


# -- reading --------------------------------------------------------------------


def _ndjson_windows(
    client: JournalClient, journal: str, end: int
) -> Iterator[tuple[int, bytes]]:
    """``(offset, data)``: windows of whole lines of ``[0, end)``, of about
    ``WINDOW_BYTES`` each. A window never spans a retention gap (where the
    journal's first offsets were removed)."""
    reader = client.read(journal, 0, end)
    carry = b""
    base = -1  # journal offset of carry[0]
    try:
        for start, data in _contiguous_reads(reader, WINDOW_BYTES):
            if base + len(carry) != start:
                # A gap: appends are whole frames, so nothing is carried over one.
                if carry:
                    yield base, carry
                carry, base = b"", start
            buf = carry + data if carry else data
            cut = buf.rfind(b"\n") + 1
            if cut:
                yield base, buf[:cut]
                base += cut
            carry = buf[cut:]
        if carry:
            yield base, carry  # a truncated last line: the exact path reports it
    finally:
        reader.close()


def _contiguous_reads(reader: Any, size: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, data)``: the reader's bytes in pieces of about ``size``,
    each contiguous in the journal. A reader may return less than asked
    (a Gazette broker sends 32 KiB at a time): reads are gathered up to
    ``size``, but never across a jump of the reader's offset."""
    pending: tuple[int, bytes] | None = None
    while True:
        if pending is not None:
            (start, first), pending = pending, None
        else:
            first = reader.read(size)
            if not first:
                return
            start = reader.offset - len(first)
        parts, got = [first], len(first)
        while got < size:
            more = reader.read(size - got)
            if not more:
                break
            at = reader.offset - len(more)
            if at != start + got:
                pending = (at, more)
                break
            parts.append(more)
            got += len(more)
        yield start, parts[0] if len(parts) == 1 else b"".join(parts)
        if pending is None and got < size:
            return


def _line_bounds(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Begin and end (relative) of each line of ``data``."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10).astype(np.int64) + 1
    begins = np.empty_like(ends)
    if len(ends):
        begins[0] = 0
        begins[1:] = ends[:-1]
    return begins, ends


def _json_schema(content: ContentSpec, with_content: bool) -> pa.Schema:
    uuid_type: pa.DataType = pa.string()
    for key in reversed(content.uuid_path[1:]):
        uuid_type = pa.struct([(key, uuid_type)])
    top = content.uuid_path[0]
    fields = [(n, t) for n, t in content.fields if n != top] if with_content else []
    return pa.schema([*fields, (content.uuid_path[0], uuid_type)])


def _parse_json(data: bytes | memoryview, schema: pa.Schema) -> pa.Table:
    return pa_json.read_json(
        pa.BufferReader(data),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
        parse_options=pa_json.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"
        ),
    )


def _uuid_column(table: pa.Table, content: ContentSpec) -> pa.Array:
    col: Any = table.column(content.uuid_path[0]).combine_chunks()
    for key in content.uuid_path[1:]:
        col = col.field(key)
    return col


def _uuid_halves(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """UUID strings to (hi, lo) halves; what is not a UUID is the nil UUID,
    as ``JsonDocument.get_uuid`` has it."""
    n = len(strings)
    if n == 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64)
    strings = strings.cast(pa.string())
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[
        strings.offset : strings.offset + n + 1
    ]
    data = strings.buffers()[2]
    valid = None
    if strings.null_count:
        valid = ~np.asarray(strings.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return parse_uuid_strings(data if data is not None else b"", offsets, valid)


def _exact_index(
    client: JournalClient, journal: str, content: ContentSpec, begin: int, end: int
) -> _Index:
    """The index of ``[begin, end)`` by decoding every frame (any framing)."""
    begins, ends, his, los = [], [], [], []
    with ReadUncommittedIter(
        client, journal, content.new_message, offset=begin, end_offset=end
    ) as it:
        for env in it:
            v = env.message.get_uuid().int
            begins.append(env.begin)
            ends.append(env.end)
            his.append(v >> 64)
            los.append(v & 0xFFFFFFFFFFFFFFFF)
    return _Index(
        np.array(begins, dtype=np.int64), np.array(ends, dtype=np.int64),
        np.array(his, dtype=np.uint64), np.array(los, dtype=np.uint64),
    )


@dataclass(slots=True)
class _Window:
    """A window of an NDJSON journal: its bytes, line bounds and parsed content."""

    offset: int
    data: bytes
    first: int  # index of its first frame in the journal's index
    count: int
    table: pa.Table | None  # content columns, when parsed with the index


def _index_ndjson(
    client: JournalClient, journal: str, content: ContentSpec, end: int, keep_content: bool
) -> tuple[_Index, list[_Window]]:
    parts: list[_Index] = []
    windows: list[_Window] = []
    schema = _json_schema(content, keep_content)
    first = 0
    for offset, data in _ndjson_windows(client, journal, end):
        begins, ends = _line_bounds(data)
        table = None
        try:
            if len(ends) == 0 or ends[-1] != len(data) or (ends - begins <= 1).any():
                raise ValueError("a truncated or empty line")
            table = _parse_json(data, schema)
            if table.num_rows != len(ends):
                raise ValueError("lines and documents do not match")
            hi, lo = _uuid_halves(_uuid_column(table, content))
            part = _Index(begins + offset, ends + offset, hi, lo)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):
            # The exact path decodes frame by frame, and raises what a
            # ReadUncommittedIter would for a corrupt frame.
            part = _exact_index(client, journal, content, offset, offset + len(data))
            table = None
        parts.append(part)
        windows.append(
            _Window(offset, data, first, len(part.begin), table if keep_content else None)
        )
        first += len(part.begin)
    return _Index.concat(parts), windows


# -- sequencing -----------------------------------------------------------------


def _fast_uuid(value: int) -> _uuid.UUID:
    """``uuid.UUID(int=value)`` without its argument checks, which cost more
    than the rest of sequencing a frame (``value`` is known to fit)."""
    u = object.__new__(_uuid.UUID)
    object.__setattr__(u, "int", value)
    object.__setattr__(u, "is_safe", _uuid.SafeUUID.unknown)
    return u


class _IndexedMessage:
    """The least a Sequencer needs of a message: its UUID. ``row`` is its
    position in the index."""

    __slots__ = ("row", "uuid")

    def __init__(self, row: int, u: _uuid.UUID) -> None:
        self.row = row
        self.uuid = u

    def get_uuid(self) -> _uuid.UUID:
        return self.uuid

    def set_uuid(self, u: _uuid.UUID) -> None:
        self.uuid = u

    def new_acknowledgement(self, journal: str) -> _IndexedMessage:
        raise NotImplementedError


def _sequence(
    spec: JournalSpec, index: _Index, rows: np.ndarray, commit: np.ndarray
) -> None:
    """Run a Sequencer over ``rows`` (offset order) of the index; set
    ``commit[row]`` to the offset of the envelope that committed it."""
    begins, ends = index.begin[rows].tolist(), index.end[rows].tolist()
    his, los = index.hi[rows].tolist(), index.lo[rows].tolist()
    envs = [
        Envelope(spec, b, e, _IndexedMessage(r, _fast_uuid((h << 64) | lo)))
        for r, b, e, h, lo in zip(rows.tolist(), begins, ends, his, los, strict=True)
    ]
    starts = [e.begin for e in envs]
    seq = Sequencer(buffer=len(envs) + 1)  # no replays: everything stays in the ring
    queue, deque = seq.queue_uncommitted, seq.deque_committed
    for env in envs:
        queue(env)
        while True:
            try:
                out = deque()
            except MustStartReplay as need:
                # Not expected with this ring, but served from memory all the same.
                lo_i = bisect.bisect_left(starts, need.begin)
                hi_i = bisect.bisect_left(starts, need.end)
                seq.start_replay(iter(envs[lo_i:hi_i]))
                continue
            if out is None:
                break
            msg: Any = out.message
            commit[msg.row] = env.begin


def committed_rows(
    spec: JournalSpec, index: _Index, bucket: int, buckets: int, isolation: str
) -> np.ndarray:
    """Per frame of the index: the offset that committed it, or -1 if it is
    not committed or not in ``bucket``."""
    n = len(index.begin)
    commit = np.full(n, -1, dtype=np.int64)
    producers = index.lo & _MASK48
    mine = bucket_of(producers, buckets) == bucket if buckets > 1 else np.ones(n, dtype=bool)
    if isolation == READ_UNCOMMITTED:
        commit[mine] = index.begin[mine]
        return commit
    clocks = clocks_of(index.hi, index.lo)
    flags = flags_of(index.lo)
    zero = mine & (clocks == 0)
    commit[zero] = index.begin[zero]  # no clock: at-least-once, always committed
    rows = np.flatnonzero(mine & (clocks != 0))
    if not len(rows):
        return commit
    order = np.argsort(producers[rows], kind="stable")  # by producer, then offset
    rows_p = rows[order]
    prod = producers[rows_p]
    clk = clocks[rows_p]
    new_group = np.r_[True, prod[1:] != prod[:-1]]
    starts = np.flatnonzero(new_group)
    group_of = np.cumsum(new_group) - 1
    # A producer with only OUTSIDE_TXN frames (the common case) is decided
    # with numpy: its last_ack is the largest clock seen so far, so a frame
    # commits itself if its clock exceeds every earlier one, and is a
    # duplicate otherwise. Others go through a Sequencer.
    txn_group = np.maximum.reduceat((flags[rows_p] != 0).astype(np.int8), starts).astype(bool)
    simple = ~txn_group[group_of]
    s_rows, s_clk, s_group = rows_p[simple], clk[simple], group_of[simple]
    if len(s_rows):
        keep = outside_commits_grouped(s_clk, s_group)
        commit[s_rows[keep]] = index.begin[s_rows[keep]]
    hard = np.sort(rows_p[~simple])
    if len(hard):
        _sequence(spec, index, hard, commit)
    return commit


# -- output ---------------------------------------------------------------------


def _fixed_width_strings(n: int, width: int, data: bytes) -> pa.Array:
    """A string array of ``n`` strings of ``width`` bytes each, laid end to end in ``data``."""
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def meta_columns(
    journal: str, index: _Index, rows: np.ndarray, commit: np.ndarray
) -> list[pa.Array]:
    """The metadata columns (``META_FIELDS``) of ``rows`` of the index."""
    hi, lo = index.hi[rows], index.lo[rows]
    n = len(rows)
    uuid_text, producer_text = format_uuid_strings(hi, lo)
    uuids = _fixed_width_strings(n, 36, uuid_text)
    producers = _fixed_width_strings(n, 12, producer_text)
    clocks = clocks_of(hi, lo)
    times = ((clocks >> np.uint64(4)).astype(np.int64) - _GREGORIAN) // 10
    name = journal.encode()
    return [
        _fixed_width_strings(n, len(name), name * n),
        pa.array(index.begin[rows], pa.int64()),
        pa.array(index.end[rows], pa.int64()),
        uuids,
        producers,
        pa.array(clocks.astype(np.int64), pa.int64()),
        pa.array(flags_of(lo), pa.int32()),
        pa.array(times, pa.timestamp("us", tz="UTC"), mask=clocks == 0),
        pa.array(commit[rows], pa.int64()),
    ]


def output_schema(content: ContentSpec) -> pa.Schema:
    return pa.schema([*META_FIELDS, *content.fields])


def _exact_content(
    client: JournalClient, spec: JournalSpec, content: ContentSpec, begins: np.ndarray
) -> list[pa.Array]:
    """Content columns of the frames beginning at ``begins`` (sorted), decoded
    one by one by the journal's framing."""
    if not len(begins):
        return [pa.array([], t) for _, t in content.fields]
    values = content.values_of(spec.content_type)
    wanted = set(begins.tolist())
    rows = []
    with ReadUncommittedIter(
        client, spec.name, content.new_message, offset=int(begins[0]),
        end_offset=None,
    ) as it:
        last = int(begins[-1])
        for env in it:
            if env.begin in wanted:
                rows.append(values(env.message))
            if env.begin >= last:
                break
    return content.columns(rows)


def read_journal(
    client: JournalClient,
    journal: str,
    content: ContentSpec,
    *,
    end_offset: int | None = None,
    isolation: str = READ_COMMITTED,
    bucket: int = 0,
    buckets: int = 1,
) -> Iterator[pa.RecordBatch]:
    """Record batches (``output_schema(content)``) of the rows of ``journal``
    up to ``end_offset`` (default: its current end) that belong to ``bucket``
    of ``buckets``: committed ones, or every frame with ``read_uncommitted``."""
    if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise ValueError(f"isolation must be {READ_COMMITTED} or {READ_UNCOMMITTED}")
    spec = client.get(journal)
    if end_offset is None:
        end_offset = _head(client, journal)
    schema = output_schema(content)
    fast = spec.content_type == CONTENT_TYPE_JSON_LINES
    windows: list[_Window] = []
    if fast:
        index, windows = _index_ndjson(client, journal, content, end_offset, buckets == 1)
    else:
        content.new_message(spec)  # fail early on a missing proto_class
        index = _exact_index(client, journal, content, 0, end_offset)
    commit = committed_rows(spec, index, bucket, buckets, isolation)

    if not fast:
        rows = np.flatnonzero(commit >= 0)
        for lo_i in range(0, len(rows), 65536):
            part = rows[lo_i : lo_i + 65536]
            cols = meta_columns(journal, index, part, commit)
            cols += _exact_content(client, spec, content, index.begin[part])
            yield pa.RecordBatch.from_arrays(cols, schema=schema)
        return

    json_schema = _json_schema(content, True)
    for w in windows:
        sel = np.flatnonzero(commit[w.first : w.first + w.count] >= 0)
        if not len(sel):
            continue
        rows = sel + w.first
        cols = meta_columns(journal, index, rows, commit)
        cols += _ndjson_content(client, spec, content, w, sel, index, rows, json_schema)
        yield pa.RecordBatch.from_arrays(cols, schema=schema)


def _ndjson_content(
    client: JournalClient,
    spec: JournalSpec,
    content: ContentSpec,
    w: _Window,
    sel: np.ndarray,
    index: _Index,
    rows: np.ndarray,
    json_schema: pa.Schema,
) -> list[pa.Array]:
    if not content.fields:
        return []
    try:
        if w.table is not None:
            table = w.table if len(sel) == w.count else w.table.take(pa.array(sel))
        else:
            view = memoryview(w.data)
            if len(sel) == w.count:
                data: bytes | memoryview = view
            else:
                b = index.begin[rows] - w.offset
                e = index.end[rows] - w.offset
                data = b"".join([view[i:j] for i, j in zip(b.tolist(), e.tolist(), strict=True)])
            table = _parse_json(data, json_schema)
            if table.num_rows != len(sel):
                raise ValueError("lines and documents do not match")
        return [table.column(n).combine_chunks() for n, _ in content.fields]
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, KeyError):
        return _exact_content(client, spec, content, index.begin[rows])


def _head(client: JournalClient, journal: str) -> int:
    head = getattr(client, "head", None)
    if head is not None:
        return int(head(journal))
    # Any JournalClient: read to the current end.
    with client.read(journal, 0) as r:
        while r.read(1 << 20):
            pass
        return int(r.offset)


__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "read_journal", "to_arrow"]
