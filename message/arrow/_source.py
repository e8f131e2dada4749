"""One journal read in windows: NDJSON in bulk, anything else (and a window
Arrow will not take) frame by frame."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.json as pa_json

from framing import (
    CONTENT_TYPE_JSON_LINES,
    FramingError,
)
from journal import CorruptJournalError, JournalSpec

from .._damage import DamageSkippingReader
from .._reader import ReadUncommittedIter
from ..columns import prefixed_uuids
from ._content import from_base64
from ._windows import _MASK48, _line_bounds, _line_windows, _uuid_halves, _Window, bucket_of

if TYPE_CHECKING:
    from ._readers import _ArrowReader

    Array = np.ndarray[Any, Any]
else:
    Array = Any



class _Source:
    """Reads windows of one journal: NDJSON in bulk, anything else (and an
    NDJSON window Arrow will not take) frame by frame."""

    def __init__(self, owner: _ArrowReader, spec: JournalSpec) -> None:
        self.owner = owner
        self.spec = spec
        self.content = owner.content
        self.content_schema = pa.schema(list(owner.content.fields))
        # Binary columns: Arrow's JSON reader gives their text, base64.
        self.has_binary = any(pa.types.is_binary(t) or pa.types.is_large_binary(t)
                              for _, t in owner.content.fields)
        self.bulk = spec.content_type == CONTENT_TYPE_JSON_LINES
        if self.bulk:
            path = self.content.uuid_path
            uuid_type: pa.DataType = pa.string()
            for key in reversed(path[1:]):
                uuid_type = pa.struct([(key, uuid_type)])
            fields = [(n, t) for n, t in self.content.fields if n != path[0]]
            self.json_schema = pa.schema([*fields, (path[0], uuid_type)])
            # Lines that begin with their UUID as the framing writes it give
            # it from their bytes (message.columns.prefixed_uuids), and Arrow
            # parses their content alone: the UUID's column is a fifth of
            # the parse. Keys that JSON would escape take Arrow's way.
            self.content_json_schema = pa.schema(fields)
            keys = [orjson.dumps(key) for key in path]
            self.uuid_layout = (
                b"{" + b"".join(k + b":{" for k in keys[:-1]) + keys[-1] + b':"',
                b'"' + b"}" * (len(path) - 1), keys[0],
            ) if all(k == b'"' + key.encode() + b'"' for k, key in zip(keys, path, strict=True)) \
                else None
            # A task reading one bucket of many parses every line's UUID,
            # then the content of its own bucket's lines only.
            self.uuid_schema = pa.schema([(path[0], uuid_type)])
        else:
            self.content.new_message(spec)  # fail early on a missing proto_class

    def windows(self, start: int, stop: int, quiet: bool = False) -> Iterator[_Window]:
        """Windows of ``[start, stop)``; after one with an ``error``, none."""
        if not self.bulk:
            yield from self._exact(start, stop, quiet)
            return
        owner = self.owner
        reader: Any = owner.client.read(self.spec.name, start, stop)
        if owner.skip_corrupt:
            reader = DamageSkippingReader(
                owner.client, reader, stop, False,
                (lambda e, b, s: None) if quiet else owner.damaged,
            )
        try:
            # A buffer no larger than the range: a replay's range is small,
            # and a fresh buffer costs a page fault per 4 KiB touched.
            size = min(owner.batch_bytes, max(1, stop - start))
            for at, data in _line_windows(reader, size):
                w = self._parse(at, data)
                if w is not None:
                    yield w
                    continue
                # The exact path decodes frame by frame, and raises (or skips)
                # what a ReadUncommittedIter does for a corrupt frame.
                for w in self._exact(at, at + len(data), quiet):
                    yield w
                    if w.error is not None:
                        return
        except CorruptJournalError as exc:
            yield self._empty(reader.offset, exc)
        finally:
            reader.close()

    def _empty(self, at: int, error: BaseException | None = None) -> _Window:
        e = np.zeros(0, dtype=np.int64)
        u = np.zeros(0, dtype=np.uint64)
        return _Window(at, at, e, e, u, u, self.content_schema.empty_table(), error)

    def _parse(self, at: int, data: memoryview) -> _Window | None:
        """The window of whole lines ``data`` parsed in bulk (for a reader of
        one bucket of several, only that bucket's rows), or None if Arrow
        will not take it as it is (the exact path decides)."""
        begins, ends = _line_bounds(data)
        if len(ends) == 0 or ends[-1] != len(data):
            return None  # a partial line (an empty one shows as a missing row below)
        owner = self.owner
        bucketed = owner.buckets > 1
        try:
            uuids = None
            if not bucketed and self.uuid_layout is not None:
                uuids = prefixed_uuids(data, begins, ends, *self.uuid_layout)
            if uuids is not None:
                hi, lo = uuids
                table = self._read_json(data, self.content_json_schema)
            else:
                table = self._read_json(data, self.uuid_schema if bucketed else self.json_schema)
            if table.num_rows != len(ends):
                return None
            if uuids is None:
                hi, lo = self._uuids(table)
            if bucketed:
                rows = np.flatnonzero(bucket_of(lo & _MASK48, owner.buckets) == owner.bucket)
                # The bucket's lines, laid end to end: a take of the window
                # seen as a binary array whose values are its lines.
                offsets = np.r_[np.int64(0), ends]
                begins, ends, hi, lo = begins[rows], ends[rows], hi[rows], lo[rows]
                lines = pa.LargeBinaryArray.from_buffers(
                    pa.large_binary(), len(offsets) - 1,
                    [None, pa.py_buffer(offsets), pa.py_buffer(data)],
                ).take(pa.array(rows, pa.int64()))
                table = (self._read_json(lines.buffers()[2], self.json_schema) if len(rows)
                         else self.json_schema.empty_table())
                if table.num_rows != len(rows):
                    return None
            content = table.select(self.content.names) if self.content.fields else (
                pa.table({"_": pa.nulls(len(ends))}).select([])
            )
            if self.has_binary:
                content = pa.Table.from_arrays(
                    [from_base64(c) for c in content.columns], schema=content.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError,
                KeyError):
            return None  # (a map column, say: Arrow's JSON reader has no conversion)
        return _Window(at, at + len(data), begins + at, ends + at, hi, lo, content)

    @staticmethod
    def _read_json(data: Any, schema: pa.Schema) -> pa.Table:
        return pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(
                use_threads=False, block_size=max(1 << 20, len(data) + 1)
            ),
            parse_options=pa_json.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )

    def _uuids(self, table: pa.Table) -> tuple[Array, Array]:
        col: Any = table.column(self.content.uuid_path[0]).combine_chunks()
        for key in self.content.uuid_path[1:]:
            col = col.field(key)
        return _uuid_halves(col)

    def _exact(self, start: int, stop: int, quiet: bool) -> Iterator[_Window]:
        """Windows of ``[start, stop)`` decoded frame by frame."""
        owner = self.owner
        values = self.content.values_of(self.spec.content_type)
        it = ReadUncommittedIter(
            owner.client, self.spec.name, self.content.new_message, offset=start,
            end_offset=stop, skip_corrupt=owner.skip_corrupt,
            on_skip=(lambda e: None) if quiet else owner.on_skip,
        )
        rows: list[tuple[int, int, int, list[Any]]] = []
        at = start
        error: BaseException | None = None
        try:
            for env in it:
                rows.append((env.begin, env.end, env.message.get_uuid().int, values(env.message)))
                if env.end - at >= owner.batch_bytes:
                    yield self._window_of(at, env.end, rows)
                    rows, at = [], env.end
        except (FramingError, CorruptJournalError) as exc:
            error = exc
        finally:
            it.close()
            if not quiet:
                owner.skipped_frames += it.skipped - len(it.skipped_ranges)
                owner.skipped_ranges += it.skipped_ranges
        until = stop if error is None else int(getattr(error, "offset", None) or it.offset)
        yield self._window_of(at, max(at, until), rows, error)

    def _window_of(
        self, start: int, stop: int, rows: list[tuple[int, int, int, list[Any]]],
        error: BaseException | None = None,
    ) -> _Window:
        ints = [r[2] for r in rows]
        cols = self.content.columns([r[3] for r in rows], self.spec.content_type)
        content = (
            pa.Table.from_arrays(cols, schema=self.content_schema) if self.content.fields
            else pa.table({"_": pa.nulls(len(rows))}).select([])
        )
        return _Window(
            start, stop,
            np.array([r[0] for r in rows], dtype=np.int64),
            np.array([r[1] for r in rows], dtype=np.int64),
            np.array([i >> 64 for i in ints], dtype=np.uint64),
            np.array([i & 0xFFFFFFFFFFFFFFFF for i in ints], dtype=np.uint64),
            content, error,
        )
