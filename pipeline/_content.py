"""What the rows of a journal hold: the metadata columns every row has, and
the content columns decoded from each message, per framing.

- NDJSON: a column per top-level field of the document (absent: null). The
  message is a ``JsonDocument`` whose UUID lives at ``uuid_path``.
- CSV: a ``CSVRecord``; its first field is the UUID, the next ones are the
  content columns, by position ("" is null).
- Fixed protobuf: a message of ``proto_class`` (``"package.module.Class"``);
  its UUID is in ``uuid_field``, the content columns are fields by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import pyarrow as pa

from framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_PROTO_FIXED
from journal import JournalSpec
from message import (
    CSVRecord,
    JsonDocument,
    Message,
    ProtoMessage,
    document_type,
    proto_message_type,
)

#: The metadata columns of every row, in order, with their Arrow types.
#: ``commit_offset`` is the offset of the envelope whose arrival committed the
#: row's sequence (an OUTSIDE_TXN message commits itself; a transaction is
#: committed by its ACK). Ordering one journal's rows by
#: ``(commit_offset, begin)`` reproduces the order a Sequencer emits them in.
META_FIELDS: Final[tuple[tuple[str, pa.DataType], ...]] = (
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
META_NAMES: Final = frozenset(name for name, _ in META_FIELDS)
META_DDL: Final = (
    "journal string, begin long, end long, uuid string, producer string, clock long, "
    "flags int, publish_time timestamp, commit_offset long"
)

# Protobuf scalar field types (FieldDescriptor.TYPE_*) as Spark DDL types.
_PROTO_DDL: Final = {
    1: "double", 2: "float", 3: "long", 4: "long", 5: "int", 6: "long", 7: "int",
    8: "boolean", 9: "string", 12: "binary", 13: "long", 14: "int", 15: "int",
    16: "long", 17: "int", 18: "long",
}


def load_proto_class(path: str) -> Any:
    """The protobuf message class named ``package.module.Class`` (or ``module:Class``)."""
    module, sep, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not sep or not module:
        raise ValueError(f"proto_class must be 'package.module.Class', not {path!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import protobuf class {path!r}: {exc}") from exc


def proto_content_ddl(path: str, uuid_field: str) -> str:
    """DDL of the scalar fields of a protobuf class, except its UUID field."""
    cls = load_proto_class(path)
    parts = []
    for f in cls.DESCRIPTOR.fields:
        repeated = getattr(f, "is_repeated", f.label == 3)
        if f.name == uuid_field or repeated or f.type not in _PROTO_DDL:
            continue
        parts.append(f"`{f.name}` {_PROTO_DDL[f.type]}")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class ContentSpec:
    """How to turn messages into content columns (and columns into messages)."""

    fields: tuple[tuple[str, pa.DataType], ...] = ()
    uuid_path: tuple[str, ...] = ("_meta", "uuid")
    proto_class: str | None = None
    uuid_field: str = "uuid"
    _types: dict[str, Callable[[], Message]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.fields]

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
            factory = proto_message_type(load_proto_class(self.proto_class), self.uuid_field)
        else:
            raise ValueError(f"no message type for content type {content_type!r}")
        self._types[content_type or ""] = factory
        return factory

    def new_message(self, spec: JournalSpec) -> Message:
        return self.message_type(spec.content_type)()

    # -- messages -> columns --------------------------------------------------

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
        return [
            to_arrow([r[i] for r in rows], typ) for i, (_, typ) in enumerate(self.fields)
        ]

    # -- columns -> messages --------------------------------------------------

    def message_from_row(self, content_type: str | None, row: dict[str, Any]) -> Message:
        """A message holding ``row`` (a column -> value dict), for publishing."""
        factory = self.message_type(content_type)
        msg = factory()
        if content_type == CONTENT_TYPE_JSON_LINES:
            cast(JsonDocument, msg).update(row)
            return msg
        if content_type == CONTENT_TYPE_CSV:
            return CSVRecord(["", *("" if v is None else _csv_text(v) for v in row.values())])
        pb = cast(ProtoMessage, msg).pb
        for k, v in row.items():
            if v is not None:
                setattr(pb, k, v)
        return msg


def _csv_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.hex()
    if hasattr(v, "isoformat"):
        return str(v.isoformat())
    return str(v)


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
