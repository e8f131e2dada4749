"""Committed reads as Arrow: the committed messages of journals as ``pyarrow.RecordBatch``es.

:class:`ReadCommittedArrow` reads what :class:`message.ReadCommittedIter`
reads — duplicates dropped, transactions held until their ACK, roll-backs
dropped — and hands it over as columns, for pyarrow, pandas, polars, DuckDB
or Spark, with no Python object per message::

    >>> import tempfile
    >>> from journal import LocalJournalStore
    >>> from message import JsonDocument, Publisher
    >>> from message.arrow import ReadCommittedArrow
    >>> store = LocalJournalStore(tempfile.mkdtemp())
    >>> spec = store.create("clicks", {"content-type": "application/x-ndjson"})
    >>> pub = Publisher(store)
    >>> to_clicks = lambda doc: (spec.name, spec.content_type)
    >>> for page in ["/", "/cart"]:
    ...     _ = pub.publish_committed(to_clicks, JsonDocument(page=page)).result()
    >>> reader = ReadCommittedArrow(store, "clicks")
    >>> table = reader.read_all()
    >>> table.column("page").to_pylist()
    ['/', '/cart']
    >>> table.column_names[:4]
    ['journal', 'begin', 'end', 'uuid']
    >>> saved = reader.checkpoint()           # resume here: nothing lost or repeated
    >>> store.close()

Each row has the envelope columns (:data:`ENVELOPE_FIELDS`: ``journal``,
``begin``, ``end``, ``uuid``, ``producer``, ``clock``, ``flags``,
``publish_time``, ``commit_offset``) and the message's content as columns:
NDJSON fields by a schema, or inferred from the journal's first MiB; CSV
fields by position after the UUID; fixed protobuf fields by name. ACK_TXN
messages (control records) are left out unless ``include_acks=True``.

How: a journal is read in windows of about ``batch_bytes`` whole frames.
An NDJSON window is parsed by Arrow's C++ JSON reader in one call; the UUIDs
become two uint64 columns, read from the lines' bytes where each begins with
its UUID as the framing writes it (``message.columns.prefixed_uuids``), else
from the parsed column (``message.columns.parse_uuid_strings``); which rows
commit, and in which order, is decided over columns
(``message/_columns_sequencer.py``: the Sequencer's rules, in numpy, or in one native
pass); the committed rows are taken from the parsed table in commit order. Other
framings, and an NDJSON window Arrow will not parse (a corrupt frame, a
value of another type), are decoded frame by frame, with the framing's own
errors. Memory is bounded by ``batch_bytes`` (and by the largest
transaction open across windows), not by the journal's size.

Needs pyarrow and numpy: ``pip install 'exactly[arrow]'``. ``import message``
does not import this module.
"""

from __future__ import annotations

import datetime
import importlib
import io
import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    FramingError,
)
from journal import Closing, CorruptJournalError, JournalClient, JournalSpec, read_all

from ._checkpoint import Checkpoint
from ._columns_sequencer import ProducerColumns, sequence_columns
from ._damage import DamageSkippingReader
from ._envelope import ProducerState
from ._interfaces import Message
from ._reader import ReadUncommittedIter
from ._sequencer import horizon_units
from ._types import CSVRecord, document_type, proto_message_type
from .columns import envelope_fields, line_ends, parse_uuid_strings, prefixed_uuids
from .layout import (
    ACK_TXN,
    PRODUCER_MASK,
    clocks_of,
    flags_of,
)

if TYPE_CHECKING:
    Array = np.ndarray[Any, Any]
else:
    Array = Any

log = logging.getLogger("message")

#: The envelope columns of every row, in order, with their Arrow types.
#: ``producer`` is the ProducerID as 12 hex digits; ``publish_time`` the
#: time in the UUID's clock (null for the nil UUID); ``commit_offset`` the
#: offset of the frame whose arrival committed the row (an OUTSIDE_TXN
#: message commits itself, a transaction's messages are committed by its
#: ACK): ordering one journal's rows by ``(commit_offset, begin)`` is the
#: order a Sequencer emits them in.
ENVELOPE_FIELDS: Final[tuple[tuple[str, pa.DataType], ...]] = (
    ("journal", pa.string()),
    ("begin", pa.int64()),
    ("end", pa.int64()),
    ("uuid", pa.string()),
    ("producer", pa.string()),
    ("clock", pa.int64()),
    ("flags", pa.int32()),
    ("publish_time", pa.timestamp("us", tz="UTC")),
    ("commit_offset", pa.int64()),
)
#: The names of :data:`ENVELOPE_FIELDS`.
ENVELOPE_NAMES: Final = tuple(name for name, _ in ENVELOPE_FIELDS)

#: Bytes of a journal read, decoded and sequenced at once (a batch's worth).
BATCH_BYTES: Final = 8 << 20
#: Bytes at the start of each journal that NDJSON schema inference looks at.
INFER_BYTES: Final = 1 << 20

_MASK48: Final = np.uint64(PRODUCER_MASK)


def load_proto_class(path: str) -> Any:
    """The protobuf message class named ``package.module.Class`` (or ``module:Class``)."""
    module, sep, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not sep or not module:
        raise ValueError(f"proto_class must be 'package.module.Class', not {path!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import protobuf class {path!r}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ArrowContent:
    """Which content columns a journal's messages are decoded into.

    ``fields``: ``(name, Arrow type)`` of each content column. NDJSON: a
    top-level field of the document (absent: null), whose UUID is at
    ``uuid_path``. CSV: a ``CSVRecord``, whose first field is the UUID and
    the next ones the content columns by position (``""`` is null). Fixed
    protobuf: a message of ``proto_class`` (a class, or its
    ``"package.module.Class"``) whose UUID is in ``uuid_field``; columns are
    fields by name. Values that do not convert to a column's type are null,
    as in Spark's JSON reader.
    """

    fields: tuple[tuple[str, pa.DataType], ...] = ()
    uuid_path: tuple[str, ...] = ("_meta", "uuid")
    proto_class: Any = None
    uuid_field: str = "uuid"
    _types: dict[str, Callable[[], Message]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def names(self) -> list[str]:
        """The content columns' names."""
        return [name for name, _ in self.fields]

    def schema(self) -> pa.Schema:
        """The schema of the batches: envelope columns, then content columns."""
        return pa.schema([*ENVELOPE_FIELDS, *self.fields])

    def message_type(self, content_type: str | None) -> Callable[[], Message]:
        """A factory of empty messages of the journal's framing."""
        cached = self._types.get(content_type or "")
        if cached is not None:
            return cached
        factory: Callable[[], Message]
        if content_type == CONTENT_TYPE_JSON_LINES:
            factory = document_type("/".join(self.uuid_path))
        elif content_type == CONTENT_TYPE_CSV:
            factory = CSVRecord
        elif content_type == CONTENT_TYPE_PROTO_FIXED:
            if self.proto_class is None:
                raise ValueError(
                    "a fixed-protobuf journal needs the option proto_class=package.module.Class"
                )
            cls = self.proto_class
            pb_class = load_proto_class(cls) if isinstance(cls, str) else cls
            factory = proto_message_type(pb_class, self.uuid_field)
        else:
            raise ValueError(f"no message type for content type {content_type!r}")
        self._types[content_type or ""] = factory
        return factory

    def new_message(self, spec: JournalSpec) -> Message:
        """An empty message of the journal's framing (a ``NewMessageFunc``)."""
        return self.message_type(spec.content_type)()

    def values_of(self, content_type: str | None) -> Callable[[Any], list[Any]]:
        """A function from a decoded message to its content values, in order."""
        names = self.names
        if content_type == CONTENT_TYPE_JSON_LINES:
            return lambda doc: [doc.get(n) for n in names]
        if content_type == CONTENT_TYPE_CSV:
            width = len(names)

            def csv_values(rec: Any) -> list[Any]:
                vals: list[Any] = [v if v != "" else None for v in rec[1 : 1 + width]]
                return vals + [None] * (width - len(vals))

            return csv_values
        return lambda msg: [getattr(msg.pb, n, None) for n in names]

    def columns(self, rows: Sequence[Sequence[Any]]) -> list[pa.Array]:
        """Content columns of ``rows`` (lists of values, as ``values_of`` makes)."""
        return [to_arrow([r[i] for r in rows], typ) for i, (_, typ) in enumerate(self.fields)]


def to_arrow(values: list[Any], typ: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of ``typ``. Values that do not convert
    (a string where a number is expected, say) become null, as Spark's JSON
    reader does in its default PERMISSIVE mode."""
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    if all(v is None or isinstance(v, str) for v in values):
        try:  # CSV text: Arrow's own casts parse numbers, booleans and times.
            return pa.array(values, type=pa.string()).cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    out = []
    for v in values:
        try:
            out.append(pa.array([v], type=typ)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            try:
                out.append(pa.array([str(v)], type=pa.string()).cast(typ)[0].as_py())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                out.append(None)
    return pa.array(out, type=typ)


_INFERRED: Final = (pa.int64(), pa.float64(), pa.bool_(), pa.string())


def infer_json_fields(
    client: JournalClient, journals: Sequence[JournalSpec], uuid_path: Sequence[str] = ("_meta",),
) -> list[tuple[str, pa.DataType]]:
    """Content columns inferred, as ``spark.read.json`` would, from the first
    MiB of each NDJSON journal (16 at most): the top-level scalar fields.
    Nested fields and the UUID's own field are left out; a timestamp stays
    text; a field seen with two types is a string. Empty when nothing can be
    inferred: name the columns with a schema to be sure."""
    skip = uuid_path[0] if uuid_path else ""
    columns: dict[str, pa.DataType] = {}
    try:
        for spec in list(journals)[:16]:
            if spec.content_type != CONTENT_TYPE_JSON_LINES:
                continue
            with client.read(spec.name, 0, _head(client, spec.name, INFER_BYTES)) as r:
                data = read_all(r)
            data = data[: data.rfind(b"\n") + 1]
            if not data:
                continue
            table = pa_json.read_json(io.BytesIO(data))
            for f in table.schema:
                typ = pa.string() if pa.types.is_timestamp(f.type) else f.type
                if f.name == skip or typ not in _INFERRED:
                    continue
                columns[f.name] = typ if columns.get(f.name, typ) == typ else pa.string()
    except (pa.ArrowInvalid, OSError, ValueError):
        return []  # inference is a convenience: it never fails a read
    return list(columns.items())


def _head(client: JournalClient, journal: str, at_most: int | None = None) -> int:
    """The journal's current end (``at_most`` bytes in, if smaller)."""
    head = getattr(client, "head", None)
    if head is not None:
        end = int(head(journal))
        return end if at_most is None else min(end, at_most)
    with client.read(journal, 0) as r:  # any JournalClient: read to the end
        while r.read(1 << 20):
            if at_most is not None and r.offset >= at_most:
                return at_most
        return int(r.offset)


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
            cut = buf.rfind(b"\n", 0, fill) + 1
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
            cut = buf.rfind(b"\n", 0, fill) + 1
            if cut:
                yield base, view[:cut]
            if fill > cut:
                yield base + cut, view[cut:fill]
            buf[:n] = view[fill : fill + n]
            base, fill = at, n
            continue
        fill += n
    cut = buf.rfind(b"\n", 0, fill) + 1
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


def ndjson_frames(
    batch: pa.RecordBatch, uuids: bytes, uuid_path: Sequence[str] = ("_meta", "uuid")
) -> bytes | None:
    """The rows of ``batch`` framed as NDJSON documents, laid end to end:
    each row a JSON object of its columns in order (null for a null), then
    ``uuid_path`` holding the row's UUID from ``uuids`` (canonical strings,
    36 bytes each, laid end to end; see ``message.columns.uuid_strings``).

    The bytes are those of ``JsonDocument(row)`` stamped and framed one by
    one (orjson's encoding of each value), built a column at a time:
    integers, booleans and strings that need no escaping are written by
    Arrow's compute kernels, every other value by ``orjson.dumps``. None
    when a column has the name of ``uuid_path``'s first key (the document
    would nest its UUID in that column's value: frame those rows one by
    one).
    """
    n = batch.num_rows
    if not uuid_path or uuid_path[0] in batch.schema.names:
        return None
    if n == 0:
        return b""
    if len(uuids) != 36 * n:
        raise ValueError(f"{n} rows need {36 * n} bytes of UUIDs, not {len(uuids)}")
    parts: list[Any] = []
    for i, (name, column) in enumerate(zip(batch.schema.names, batch.columns, strict=True)):
        parts.append(("{" if i == 0 else ",") + orjson.dumps(name).decode() + ":")
        parts.append(_json_texts(column))
    opening = "".join(f"{orjson.dumps(key).decode()}:{{" for key in uuid_path[:-1])
    parts.append(("," if parts else "{") + opening + orjson.dumps(uuid_path[-1]).decode() + ':"')
    parts.append(_fixed_width_strings(n, 36, uuids))
    parts.append('"' + "}" * len(uuid_path) + "\n")
    lines = pc.binary_join_element_wise(*parts, "")
    _, offsets_buffer, data = lines.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32, count=n + 1, offset=lines.offset * 4)
    framed: bytes = data[int(offsets[0]):int(offsets[-1])].to_pybytes()
    return framed


def _json_texts(column: pa.Array) -> pa.Array:
    """Each value of ``column`` as JSON text (as ``orjson.dumps`` writes it)."""
    typ = column.type
    if pa.types.is_integer(typ) or pa.types.is_boolean(typ):
        texts = pc.cast(column, pa.string())
    elif pa.types.is_string(typ) or pa.types.is_large_string(typ):
        column = column.cast(pa.string())
        texts = pc.binary_join_element_wise('"', column, '"', "")
        # Quotes, backslashes and control characters are escaped by orjson.
        escape = pc.match_substring_regex(column, r'["\\\x00-\x1f]')
        if pc.any(escape).as_py():
            where = pc.fill_null(escape, False)
            escaped = [orjson.dumps(v).decode() for v in column.filter(where).to_pylist()]
            texts = pc.replace_with_mask(texts, where, pa.array(escaped, pa.string()))
    else:
        return pa.array([orjson.dumps(v).decode() for v in column.to_pylist()], pa.string())
    return pc.fill_null(texts, "null") if texts.null_count else texts


class _Source:
    """Reads windows of one journal: NDJSON in bulk, anything else (and an
    NDJSON window Arrow will not take) frame by frame."""

    def __init__(self, owner: _ArrowReader, spec: JournalSpec) -> None:
        self.owner = owner
        self.spec = spec
        self.content = owner.content
        self.content_schema = pa.schema(list(owner.content.fields))
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
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, KeyError):
            return None
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
        cols = self.content.columns([r[3] for r in rows])
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


# -- the readers ------------------------------------------------------------------


class _ArrowReader(Closing):
    """What both readers share: the journals, the content, the windows."""

    committed = True

    def __init__(
        self,
        client: JournalClient,
        journal: str | Sequence[str] | None = None,
        *,
        selector: str | None = None,
        schema: pa.Schema | Sequence[tuple[str, pa.DataType]] | None = None,
        content: ArrowContent | None = None,
        uuid_path: str = "_meta/uuid",
        proto_class: Any = None,
        uuid_field: str = "uuid",
        offset: int = 0,
        end_offset: int | Mapping[str, int] | None = None,
        checkpoint: Checkpoint | None = None,
        include_acks: bool = False,
        skip_corrupt: bool = False,
        on_skip: Callable[[Exception], None] | None = None,
        batch_bytes: int = BATCH_BYTES,
        bucket: int = 0,
        buckets: int = 1,
    ) -> None:
        if (journal is None) == (selector is None):
            raise ValueError("name a journal (or journals) or give a selector, not both")
        if buckets < 1 or not 0 <= bucket < buckets:
            raise ValueError(f"bucket must be in [0, {buckets})")
        self.client = client
        if selector is not None:
            self.specs = sorted(client.list(selector), key=lambda s: s.name)
        else:
            names = [journal] if isinstance(journal, str) else list(journal or ())
            self.specs = [client.get(n) for n in names]
        if content is None:
            path = tuple(p for p in uuid_path.split("/") if p)
            if not path:
                raise ValueError("uuid_path must name at least one key")
            if schema is None:
                if proto_class is not None:
                    fields = _proto_fields(proto_class, uuid_field)
                else:
                    fields = infer_json_fields(client, self.specs, path)
            else:
                fields = [(f.name, f.type) if isinstance(f, pa.Field) else (f[0], f[1])
                          for f in schema]
            content = ArrowContent(tuple(fields), path, proto_class, uuid_field)
        self.content = content
        #: The schema of every batch: the envelope columns, then the content's.
        self.schema: pa.Schema = content.schema()
        self.include_acks = include_acks or not self.committed
        self.skip_corrupt = skip_corrupt
        self.on_skip = on_skip
        self.batch_bytes = max(1, batch_bytes)
        self.bucket, self.buckets = bucket, buckets
        #: Corrupt frames skipped (with ``skip_corrupt=True``).
        self.skipped_frames = 0
        #: Offsets ``[begin, end)`` of damaged pieces of journals skipped.
        self.skipped_ranges: list[tuple[int, int]] = []
        # Where each journal starts and ends, and its producers' states.
        self._offsets: dict[str, int] = {}
        self._states: dict[str, ProducerColumns] = {}
        self._base_offsets: dict[str, int] = {}
        by_journal: dict[str, list[tuple[int, int, int]]] = {}
        if checkpoint is not None:
            self._base_offsets = dict(checkpoint.offsets)
            for s in checkpoint.states:
                by_journal.setdefault(s.journal, []).append(
                    (int.from_bytes(s.producer, "big"), s.last_ack, s.begin)
                )
        self._ends: dict[str, int] = {}
        for spec in self.specs:
            name = spec.name
            self._offsets[name] = (
                checkpoint.offsets.get(name, offset) if checkpoint is not None else offset
            )
            self._states[name] = ProducerColumns.of(by_journal.get(name, []))
            if isinstance(end_offset, Mapping):
                self._ends[name] = int(end_offset.get(name, _head(client, name)))
            elif end_offset is not None:
                self._ends[name] = int(end_offset)
            else:
                self._ends[name] = _head(client, name)
        # Per journal, the frames read so far of the spans open in its
        # states that began at or after an offset (see _keep_open): a replay
        # of those spans is taken from memory, not read and parsed again.
        self._open: dict[str, tuple[int, _Window | None]] = {}
        self._gen = self._generate()

    @property
    def skipped(self) -> int:
        """Corrupt frames and damaged pieces skipped (with ``skip_corrupt=True``)."""
        return self.skipped_frames + len(self.skipped_ranges)

    def damaged(self, exc: CorruptJournalError, begin: int, end: int) -> None:
        """Told that a journal's bytes ``[begin, end)`` are damaged and skipped."""
        self.skipped_ranges.append((begin, end))
        if self.on_skip is not None:
            self.on_skip(exc)
        else:
            log.warning("skipped damaged bytes of %s at offsets [%d, %d): %s",
                        exc.journal, begin, end, exc.reason)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self._gen

    def __next__(self) -> pa.RecordBatch:
        return next(self._gen)

    def read_all(self) -> pa.Table:
        """Every remaining batch, as one table."""
        return pa.Table.from_batches(list(self._gen), schema=self.schema)

    def close(self) -> None:
        """Stop reading."""
        self._gen.close()


    def _generate(self) -> Generator[pa.RecordBatch, None, None]:
        for spec in self.specs:
            name = spec.name
            source = _Source(self, spec)
            start, stop = self._offsets[name], self._ends[name]
            if start >= stop:
                continue
            # Spans open in the states from before `start` are not in memory
            # (a span's begin is below the offset its checkpoint resumes at).
            _, open_b = self._states[name].open_spans()
            self._open[name] = (max(start, int(open_b.max()) + 1 if len(open_b) else 0), None)
            for w in source.windows(start, stop):
                batch = self._batch(source, w)
                self._offsets[name] = w.stop
                if batch is not None and batch.num_rows:
                    yield batch
                if w.error is not None:
                    raise w.error
            self._offsets[name] = max(self._offsets[name], stop)

    def _batch(self, source: _Source, w: _Window) -> pa.RecordBatch | None:
        name = source.spec.name
        if self.buckets > 1 and len(w):
            mine = bucket_of(w.lo & _MASK48, self.buckets) == self.bucket
            if not mine.all():  # (a window parsed in bulk holds only the bucket's rows)
                w = w.take(np.flatnonzero(mine))
        if not len(w):
            return None
        producers = w.lo & _MASK48
        clocks = clocks_of(w.hi, w.lo)
        flags = flags_of(w.lo)
        if not self.committed:
            commit = w.begin
            rows = np.arange(len(w))
        else:
            replay = self._replay(source, w, producers, clocks, flags)
            replayed = None
            window = w
            if replay is not None and len(replay):
                w = _Window.concat([replay, w], source.content_schema)
                producers = np.concatenate([replay.lo & _MASK48, producers])
                clocks = np.concatenate([clocks_of(replay.hi, replay.lo), clocks])
                flags = np.concatenate([flags_of(replay.lo), flags])
                replayed = np.zeros(len(w), dtype=bool)
                replayed[: len(replay)] = True
            commit, self._states[name] = sequence_columns(
                w.begin, producers, clocks, flags, self._states[name], replayed
            )
            self._keep_open(source, window)
            keep = commit >= 0
            if not self.include_acks:
                keep &= flags != ACK_TXN
            rows = np.flatnonzero(keep)
            # Commit order: rows are in offset order, and mostly commit themselves.
            rows = rows[np.argsort(commit[rows], kind="stable")]
        if not len(rows):
            return None
        cols = envelope_columns(name, _take(w.begin, rows), _take(w.end, rows), w.hi[rows],
                                w.lo[rows], _take(commit, rows))
        if self.content.fields:
            all_rows = len(rows) == len(w) and bool((rows[1:] > rows[:-1]).all())
            table = w.content if all_rows else w.content.take(pa.array(rows, pa.int64()))
            cols += [_one_chunk(table.column(i)) for i in range(table.num_columns)]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)

    def _replay(
        self, source: _Source, w: _Window, producers: Array, clocks: Array, flags: Array
    ) -> _Window | None:
        """The frames, before the window, of the spans open in the states that
        an ACK in the window may commit (what a Sequencer would replay)."""
        open_p, open_b = self._states[source.spec.name].open_spans()
        if not len(open_p):
            return None
        early = open_b < w.start
        # The open spans' producers (sorted) that have an ACK in the window.
        ack_p = producers[(flags == ACK_TXN) & (clocks != 0)]
        at = np.minimum(np.searchsorted(open_p, ack_p), len(open_p) - 1)
        acked = np.zeros(len(open_p), dtype=bool)
        acked[at[open_p[at] == ack_p]] = True
        want = early & acked
        if not want.any():
            return None
        want_p, want_b = open_p[want], open_b[want]
        kept_from, kept = self._open.get(source.spec.name, (0, None))
        if kept is not None and int(want_b.min()) >= kept_from:
            return kept.take(_span_rows(kept, want_p, want_b))
        parts = []
        for part in source.windows(int(want_b.min()), w.start, quiet=True):
            if part.error is not None:
                raise part.error
            rows = _span_rows(part, want_p, want_b)
            if len(rows):
                parts.append(part.take(rows))
        return _Window.concat(parts, source.content_schema)

    def _keep_open(self, source: _Source, w: _Window) -> None:
        """After window ``w``: keep the frames of the spans now open that
        began at or after the offset kept from (those kept before ``w`` and
        those of ``w``), as long as they are at most ``batch_bytes`` long;
        beyond that, forget them and keep from the end of ``w`` on (their
        replay reads the journal again)."""
        name = source.spec.name
        kept_from, kept = self._open.get(name, (w.start, None))
        open_p, open_b = self._states[name].open_spans()
        mine = open_b >= kept_from
        open_p, open_b = open_p[mine], open_b[mine]
        parts = []
        if len(open_p):
            for part in (kept, w):
                if part is not None and len(part):
                    rows = _span_rows(part, open_p, open_b)
                    if len(rows):
                        parts.append(part.take(rows))
        now = _Window.concat(parts, source.content_schema)
        if int((now.end - now.begin).sum()) > self.batch_bytes:
            self._open[name] = (w.stop, None)
        else:
            self._open[name] = (kept_from, now)

    def checkpoint(self, prune_horizon: float | datetime.timedelta = 0) -> Checkpoint:
        """Where to resume: per journal, the offset read through and its
        producers' states; valid between any two batches, and interchangeable
        with :meth:`message.ReadCommittedIter.checkpoint`'s. ``prune_horizon``
        forgets producers idle that long, relative to their journal's newest
        (as :meth:`Sequencer.producer_states`)."""
        units = horizon_units(prune_horizon)
        offsets = dict(self._base_offsets)
        states: list[ProducerState] = []
        for spec in self.specs:
            name = spec.name
            offsets[name] = self._offsets[name]
            cols = self._states[name]
            if units is not None:
                cols = self._states[name] = cols.pruned(units)
            states += [
                ProducerState(name, int(p).to_bytes(6, "big"), int(a), int(b))
                for p, a, b in zip(
                    cols.producers.tolist(), cols.last_ack.tolist(), cols.begin.tolist(),
                    strict=True,
                )
            ]
        return Checkpoint(offsets, states)


def _proto_fields(proto_class: Any, uuid_field: str) -> list[tuple[str, pa.DataType]]:
    """The scalar fields of a protobuf class, but its UUID field, as columns."""
    cls = load_proto_class(proto_class) if isinstance(proto_class, str) else proto_class
    out = []
    for f in cls.DESCRIPTOR.fields:
        repeated = getattr(f, "is_repeated", f.label == 3)
        if f.name == uuid_field or repeated or f.type not in PROTO_TYPES:
            continue
        out.append((f.name, PROTO_TYPES[f.type]))
    return out


#: Protobuf scalar field types (``FieldDescriptor.TYPE_*``) as Arrow types.
PROTO_TYPES: Final[dict[int, pa.DataType]] = {
    1: pa.float64(), 2: pa.float32(), 3: pa.int64(), 4: pa.int64(), 5: pa.int32(),
    6: pa.int64(), 7: pa.int32(), 8: pa.bool_(), 9: pa.string(), 12: pa.binary(),
    13: pa.int64(), 14: pa.int32(), 15: pa.int32(), 16: pa.int64(), 17: pa.int32(),
    18: pa.int64(),
}


class ReadCommittedArrow(_ArrowReader):
    """Iterates the committed messages of a journal (or of several: a list
    of names, or ``selector``) as ``pyarrow.RecordBatch``es of
    :attr:`schema`: the rows :class:`message.ReadCommittedIter` would yield,
    journal after journal, each journal's in the same order, with its
    ACK_TXN messages left out unless ``include_acks``.

    Content: ``schema`` (a ``pyarrow.Schema`` or ``(name, type)`` pairs)
    names the content columns; without one, NDJSON fields are inferred
    (:func:`infer_json_fields`) and a fixed-protobuf ``proto_class`` gives
    all its scalar fields. ``uuid_path`` says where an NDJSON document keeps
    its UUID; ``content`` (an :class:`ArrowContent`) says all of it at once.

    Reading starts at ``offset`` (or where ``checkpoint`` says, from its
    producer states) and ends at ``end_offset`` (an offset, or one per
    journal), by default at each journal's end when the reader is made.
    :meth:`checkpoint` may be called between any two batches: a reader, or
    a ``ReadCommittedIter``, made with it yields exactly the committed
    messages not yet yielded. A corrupt frame raises its framing error with
    ``.journal`` and ``.offset`` once the batch before it is yielded; with
    ``skip_corrupt=True`` it is skipped and counted in :attr:`skipped`
    (``on_skip`` is told of each instead of the log). ``bucket`` of
    ``buckets`` reads only the producers whose hashed ProducerID falls in
    that bucket (the rest is another reader's: parallel reads of a journal);
    it parses every line's UUID, and the content of its own lines only.
    """


class ReadUncommittedArrow(_ArrowReader):
    """Iterates every frame of a journal (or journals) as
    ``pyarrow.RecordBatch``es, duplicates, transactions never committed and
    ACKs included, in offset order (``commit_offset`` is each row's own
    ``begin``). Takes the options of :class:`ReadCommittedArrow`."""

    committed = False


__all__ = [
    "ReadCommittedArrow", "ReadUncommittedArrow", "ArrowContent", "ENVELOPE_FIELDS",
    "ENVELOPE_NAMES", "BATCH_BYTES", "PROTO_TYPES", "envelope_columns", "infer_json_fields",
    "load_proto_class", "to_arrow", "bucket_of", "ndjson_frames",
]
