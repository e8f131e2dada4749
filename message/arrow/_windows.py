"""Windows of a journal's frames as columns: line bounds, UUID halves,
envelope columns, and which rows a span's producers own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa

from framing import whole_lines_end

from ..columns import envelope_fields, line_ends, parse_uuid_strings
from ..layout import (
    PRODUCER_MASK,
    clocks_of,
)

if TYPE_CHECKING:
    Array = np.ndarray[Any, Any]
else:
    Array = Any



_MASK48: Final = np.uint64(PRODUCER_MASK)


# -- windows: frames as columns ---------------------------------------------------


@dataclass(slots=True)
class _Window:
    """Frames of ``[start, stop)`` of a journal as columns: offsets, the UUID
    as two uint64 halves, and the content columns (a table of as many rows).
    ``error`` is raised once the frames before it are delivered."""

    start: int
    stop: int
    begin: Array
    end: Array
    hi: Array
    lo: Array
    content: pa.Table
    error: BaseException | None = None

    def __len__(self) -> int:
        return len(self.begin)

    def take(self, rows: Array) -> _Window:
        return _Window(
            self.start, self.stop, self.begin[rows], self.end[rows], self.hi[rows],
            self.lo[rows], self.content.take(pa.array(rows, pa.int64())),
        )

    @staticmethod
    def concat(parts: list[_Window], schema: pa.Schema) -> _Window:
        if not parts:
            e = np.zeros(0, dtype=np.int64)
            u = np.zeros(0, dtype=np.uint64)
            return _Window(0, 0, e, e, u, u, schema.empty_table())
        if len(parts) == 1:
            return parts[0]
        return _Window(
            parts[0].start, parts[-1].stop,
            np.concatenate([p.begin for p in parts]), np.concatenate([p.end for p in parts]),
            np.concatenate([p.hi for p in parts]), np.concatenate([p.lo for p in parts]),
            pa.concat_tables([p.content for p in parts]),
        )


def _line_windows(reader: Any, size: int) -> Iterator[tuple[int, memoryview]]:
    """``(offset, data)``: windows of whole lines of about ``size`` bytes,
    read into one buffer that is reused (``data`` is valid until the next
    window is asked for). A window never spans a jump of the reader's
    offset (what retention removed, a damaged piece skipped): appends are
    whole frames, so nothing is carried over one. A partial line before a
    jump or at the end is a window of its own (the exact path reports it).
    A reader may return less than asked (a Gazette broker sends 32 KiB at
    a time): reads fill the buffer."""
    buf = bytearray(size)
    view = memoryview(buf)
    fill = 0  # bytes held
    base = int(reader.offset)  # journal offset of buf[0]
    while True:
        if fill == len(buf):
            cut = whole_lines_end(buf, fill)
            if cut:
                yield base, view[:cut]
                buf[: fill - cut] = view[cut:fill]
                base, fill = base + cut, fill - cut
                continue
            # One line longer than the buffer: a larger one.
            bigger = bytearray(2 * len(buf))
            bigger[:fill] = view[:fill]
            view.release()
            buf, view = bigger, memoryview(bigger)
        n = reader.readinto(view[fill:])
        if not n:
            break
        at = int(reader.offset) - n
        if at != base + fill:  # a jump: what is held ends here
            cut = whole_lines_end(buf, fill)
            if cut:
                yield base, view[:cut]
            if fill > cut:
                yield base + cut, view[cut:fill]
            buf[:n] = view[fill : fill + n]
            base, fill = at, n
            continue
        fill += n
    cut = whole_lines_end(buf, fill)
    if cut:
        yield base, view[:cut]
    if fill > cut:
        yield base + cut, view[cut:fill]


def _line_bounds(data: bytes | memoryview) -> tuple[Array, Array]:
    """Begin and end (relative) of each line of ``data``."""
    ends = line_ends(data)
    begins = np.empty_like(ends)
    if len(ends):
        begins[0] = 0
        begins[1:] = ends[:-1]
    return begins, ends


def _uuid_halves(strings: pa.Array) -> tuple[Array, Array]:
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


def _pooled(n: int, dtype: Any) -> tuple[pa.Buffer, Array]:
    """A buffer for ``n`` values of ``dtype`` in Arrow's memory pool, and a
    numpy view of it. Columns of batches go there: the pool reuses the pages
    of batches freed, where memory fresh from the system costs a page fault
    per 4 KiB written."""
    buf = pa.allocate_buffer(n * np.dtype(dtype).itemsize)
    return buf, np.frombuffer(buf, dtype=dtype, count=n)


def _take(values: Array, rows: Array) -> Array:
    """``values[rows]``, in Arrow's memory pool (see :func:`_pooled`)."""
    _, out = _pooled(len(rows), values.dtype)
    np.take(values, rows, out=out)
    return out


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (its only chunk as it is: no copy)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _fixed_width_strings(n: int, width: int, data: Any) -> pa.Array:
    """``n`` strings of ``width`` bytes each, laid end to end in ``data``."""
    buf, offsets = _pooled(n + 1, np.int32)
    np.multiply(np.arange(n + 1, dtype=np.int32), np.int32(width), out=offsets)
    values = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    return pa.StringArray.from_buffers(n, buf, values)


def envelope_columns(
    journal: str, begin: Array, end: Array, hi: Array, lo: Array, commit: Array
) -> list[pa.Array]:
    """The envelope columns (:data:`ENVELOPE_FIELDS`) of frames given as
    columns: offsets, UUIDs as uint64 halves, and commit offsets."""
    n = len(begin)
    uuid_text, producer_text, clocks, flags, times = envelope_fields(
        hi, lo, pa.allocate_buffer
    )
    name = journal.encode()
    names, chars = _pooled(n * len(name), np.uint8)
    chars[:] = np.frombuffer(name * n, dtype=np.uint8)
    return [
        _fixed_width_strings(n, len(name), names),
        pa.array(begin, pa.int64()),
        pa.array(end, pa.int64()),
        _fixed_width_strings(n, 36, uuid_text),
        _fixed_width_strings(n, 12, producer_text),
        pa.array(clocks, pa.int64()),
        pa.array(flags, pa.int32()),
        pa.array(times, pa.timestamp("us", tz="UTC"), mask=clocks == 0),
        pa.array(commit, pa.int64()),
    ]


def _span_rows(w: _Window, producers: Array, begins: Array) -> Array:
    """The rows of ``w`` that belong to the spans of ``producers`` (sorted)
    that began at ``begins``: the producer's frames from there on, but those
    with clock 0 (never part of a span). Rows are in offset order: only
    those from the earliest begin on are looked at."""
    first = int(np.searchsorted(w.begin, begins.min()))
    hi, lo = w.hi[first:], w.lo[first:]
    p = lo & _MASK48
    at = np.minimum(np.searchsorted(producers, p), len(producers) - 1)
    mine = (producers[at] == p) & (w.begin[first:] >= begins[at]) & (clocks_of(hi, lo) != 0)
    rows: Array = np.flatnonzero(mine) + first
    return rows


def bucket_of(producers: Array, buckets: int) -> Array:
    """The bucket of each ProducerID (uint64): a multiplicative hash, then modulo."""
    mixed = (producers * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    out: Array = (mixed % np.uint64(buckets)).astype(np.int64)
    return out
