"""The content of Arrow rows: the envelope columns, content schemas (NDJSON
fields, CSV columns, protobuf fields) and their conversion to Arrow."""

from __future__ import annotations

import base64
import binascii
import decimal
import importlib
import io
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import orjson
import pyarrow as pa

from framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    FrameDecodeError,
    framing_by_content_type,
)
from journal import JournalClient, JournalSpec, read_all

from .._interfaces import Message
from .._types import DEFAULT_UUID_PATH, CSVRecord, document_type, proto_message_type
from ._encode import NON_FINITE, nested_types

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


def content_column_names(names: Sequence[str]) -> list[str]:
    """The column of each content field of ``names``: the field's own name,
    or ``content_<name>`` for a field named like an envelope column
    (``uuid``, ``begin``, ...; one more ``content_`` while that is taken
    too), so that no batch has two columns of one name. Names are compared
    without regard to case (``UUID`` is renamed too), as Spark resolves
    columns by default."""
    envelope = {name.lower() for name in ENVELOPE_NAMES}
    taken = envelope | {name.lower() for name in names}
    out = []
    for name in names:
        column = name
        if name.lower() in envelope:
            column = f"content_{name}"
            while column.lower() in taken:
                column = f"content_{column}"
            taken.add(column.lower())
        out.append(column)
    return out


#: Bytes of a journal read, decoded and sequenced at once (a batch's worth).
BATCH_BYTES: Final = 8 << 20
#: Bytes at the start of each journal that schema inference looks at.
INFER_BYTES: Final = 1 << 20
#: Journals of a read that schema inference looks at, the first ones.
INFER_JOURNALS: Final = 16



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
    as in Spark's JSON reader (for NDJSON, a value of another JSON kind than
    its column's: see ``json_kinds``).
    """

    fields: tuple[tuple[str, pa.DataType], ...] = ()
    uuid_path: tuple[str, ...] = DEFAULT_UUID_PATH
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
        """The schema of the batches: envelope columns, then content columns
        (named as ``content_column_names`` says)."""
        columns = content_column_names(self.names)
        return pa.schema([*ENVELOPE_FIELDS,
                          *((c, typ) for c, (_, typ) in zip(columns, self.fields, strict=True))])

    def message_type(self, content_type: str | None) -> Callable[[], Message]:
        """A factory of empty messages of the journal's framing."""
        cached = self._types.get(content_type or "")
        if cached is not None:
            return cached
        factory: Callable[[], Message]
        if content_type == CONTENT_TYPE_JSON_LINES:
            factory = document_type("/".join(self.uuid_path))
            if any(_has_decimal(typ) for _, typ in self.fields):
                # orjson reads a number as a float: a decimal column takes
                # the number's text exactly, as Spark's JSON reader does.
                factory = type(f"Exact{factory.__name__}", (_ExactNumbers, factory), {})
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

    def columns(self, rows: Sequence[Sequence[Any]], content_type: str | None = None
                ) -> list[pa.Array]:
        """Content columns of ``rows`` (lists of values, as ``values_of``
        makes for ``content_type``)."""
        if content_type == CONTENT_TYPE_JSON_LINES:
            return [from_base64(to_arrow(json_kinds([r[i] for r in rows], typ), typ))
                    for i, (_, typ) in enumerate(self.fields)]
        return [to_arrow([r[i] for r in rows], typ) for i, (_, typ) in enumerate(self.fields)]


#: The texts JSON holds for the floats it has no number for, back to the
#: float (the inverse of what writes put: Spark's reader reads them so).
_NON_FINITE_TEXT: Final = {text: float(value) for value, text in NON_FINITE.items()}


def json_kinds(values: list[Any], typ: pa.DataType) -> list[Any]:
    """JSON ``values`` for a column of ``typ`` as Spark's JSON reader takes
    them (PERMISSIVE): an integer column takes JSON integers, a float column
    JSON numbers (and ``NaN``, ``Infinity``, ``-Infinity`` as text), a
    boolean column ``true`` and ``false``; any other value is null there,
    not converted (2.5 is no long, ``"7"`` no number, ``1`` no boolean).
    Other columns' values are returned as they are."""
    if pa.types.is_integer(typ):
        return [v if type(v) is int else None for v in values]
    if pa.types.is_floating(typ):
        return [v if type(v) in (int, float, decimal.Decimal)
                else _NON_FINITE_TEXT.get(v) if type(v) is str else None for v in values]
    if pa.types.is_boolean(typ):
        return [v if type(v) is bool else None for v in values]
    return values


def from_base64(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A binary column of NDJSON content, read as the text JSON holds it
    (base64, as writes and Spark's ``to_json`` put binary data), decoded to
    its bytes, as Spark's JSON reader decodes it; text that is not base64
    is null. Any other column is returned as it is."""
    typ = column.type
    if not (pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
        return column
    out = []
    for value in column.to_pylist():
        try:
            out.append(None if value is None else base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            out.append(None)
    return pa.array(out, type=typ)


def _has_decimal(typ: pa.DataType) -> bool:
    return pa.types.is_decimal(typ) or any(pa.types.is_decimal(t) for t in nested_types(typ))


class _ExactNumbers:
    """A document mixin decoding numbers with a fraction or an exponent as
    ``Decimal`` (the standard library's parser, slower than orjson: only for
    content with decimal columns, on the frame-by-frame path)."""

    def unmarshal_json(self, data: bytes) -> None:
        try:
            doc = json.loads(data, parse_float=decimal.Decimal)
        except ValueError as exc:  # (invalid JSON, or not UTF-8)
            raise FrameDecodeError(f"invalid JSON: {exc}", data=data) from exc
        if not isinstance(doc, dict):
            raise FrameDecodeError(f"expected a JSON object, not {type(doc).__name__}",
                                   data=data)
        target: Any = self
        target.clear()
        target.update(doc)


def to_arrow(values: list[Any], typ: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of ``typ``. Values that do not convert
    (a string where a number is expected, say) become null, as Spark's JSON
    reader does in its default PERMISSIVE mode; a value that is not a
    string, in a string column, is its JSON text (``{"a":1}``, ``true``)."""
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pa.array([v if v is None or isinstance(v, str) else orjson.dumps(v).decode()
                         for v in values], type=typ)
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


def infer_json_fields(
    client: JournalClient, journals: Sequence[JournalSpec],
    uuid_path: Sequence[str] = DEFAULT_UUID_PATH,
) -> list[tuple[str, pa.DataType]]:
    """Content columns inferred, as ``spark.read.json`` would, from the first
    MiB of each NDJSON journal (16 at most): the top-level scalar fields, in
    the order first seen. Nested fields and the UUID's own field are left
    out; a timestamp stays text; integers and floats make a float; a field
    seen with two other types (in one journal or across them) is a string.
    Empty when nothing can be inferred: name the columns with a schema to be
    sure."""
    skip = uuid_path[0] if uuid_path else ""
    columns: dict[str, pa.DataType | None] = {}  # None: nested only, so far
    for data in _first_bytes(client, journals, CONTENT_TYPE_JSON_LINES):
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a corrupt frame: the read reports it
            if not isinstance(doc, dict):
                continue
            for name, value in doc.items():
                if name == skip or value is None:
                    continue
                typ = _json_type(value)
                columns[name] = _unified(columns[name], typ) if name in columns else typ
    return [(name, typ) for name, typ in columns.items() if typ is not None]


def infer_content_fields(
    client: JournalClient, journals: Sequence[JournalSpec],
    uuid_path: Sequence[str] = DEFAULT_UUID_PATH,
) -> list[tuple[str, pa.DataType]]:
    """Content columns inferred from the first MiB of each journal (16 at
    most): NDJSON fields as :func:`infer_json_fields` infers them; where no
    journal is NDJSON, the fields after the UUID of CSV records, by
    position, as strings named ``_c1``, ``_c2``, ... (the field's index in
    the record; Spark's CSV reader names its columns ``_c0``, ...)."""
    if any(spec.content_type == CONTENT_TYPE_JSON_LINES for spec in journals[:INFER_JOURNALS]):
        return infer_json_fields(client, journals, uuid_path)
    framing = framing_by_content_type(CONTENT_TYPE_CSV)
    width = 0
    for data in _first_bytes(client, journals, CONTENT_TYPE_CSV):
        try:
            frames = [frame for _, _, frame in framing.read_frames(io.BytesIO(data))]
        except ValueError:
            continue  # the read reports it
        for frame in frames:
            record = CSVRecord()
            try:
                framing.unmarshal_frame(frame, record)
            except ValueError:
                continue  # a corrupt frame: the read reports it
            width = max(width, len(record) - 1)
    return [(f"_c{i}", pa.string()) for i in range(1, width + 1)]


def _first_bytes(
    client: JournalClient, journals: Sequence[JournalSpec], content_type: str
) -> Iterator[bytes]:
    """The first ``INFER_BYTES`` of each journal of ``content_type`` among the
    first ``INFER_JOURNALS`` (one that cannot be read is passed over:
    inference is a convenience, it never fails a read)."""
    for spec in journals[:INFER_JOURNALS]:
        if spec.content_type != content_type:
            continue
        try:
            with client.read(spec.name, 0, _head(client, spec.name, INFER_BYTES)) as r:
                yield read_all(r)
        except (OSError, ValueError):
            continue


def _json_type(value: Any) -> pa.DataType | None:
    """The column type of a decoded JSON value (None: an object or a list)."""
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64() if -(1 << 63) <= value < (1 << 63) else pa.float64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    return None


def _unified(a: pa.DataType | None, b: pa.DataType | None) -> pa.DataType | None:
    """One column type for values of types ``a`` and ``b``, as Spark's JSON
    inference makes it: a number for integers and floats, else text."""
    if a == b:
        return a
    if {a, b} == {pa.int64(), pa.float64()}:
        return pa.float64()
    return pa.string()


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
