"""What the rows of a journal hold: the metadata columns every row has, and
the content columns decoded from each message, per framing. Decoding is
``message.arrow``'s (``ArrowContent``); this module adds what the Spark
source needs beside it: DDL, and rows back into messages for writes.

- NDJSON: a column per top-level field of the document (absent: null). The
  message is a ``JsonDocument`` whose UUID lives at ``uuid_path``.
- CSV: a ``CSVRecord``; its first field is the UUID, the next ones are the
  content columns, by position ("" is null).
- Fixed protobuf: a message of ``proto_class`` (``"package.module.Class"``);
  its UUID is in ``uuid_field``, the content columns are fields by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, cast

import pyarrow as pa

from framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES
from message import CSVRecord, JsonDocument, Message, ProtoMessage
from message.arrow import (
    ENVELOPE_FIELDS,
    PROTO_TYPES,
    ArrowContent,
    load_proto_class,
)

# Arrow types (of protobuf scalar fields, and of the envelope columns) as
# Spark DDL types.
_ARROW_DDL: Final = {
    pa.float64(): "double", pa.float32(): "float", pa.int64(): "long", pa.int32(): "int",
    pa.bool_(): "boolean", pa.string(): "string", pa.binary(): "binary",
    pa.timestamp("us", tz="UTC"): "timestamp",
}

#: The envelope columns every row starts with (``message.arrow.ENVELOPE_FIELDS``), as DDL.
META_DDL: Final = ", ".join(f"{name} {_ARROW_DDL[typ]}" for name, typ in ENVELOPE_FIELDS)


def proto_content_ddl(path: str, uuid_field: str) -> str:
    """DDL of the scalar fields of a protobuf class, except its UUID field."""
    cls = load_proto_class(path)
    parts = []
    for f in cls.DESCRIPTOR.fields:
        repeated = getattr(f, "is_repeated", f.label == 3)
        if f.name == uuid_field or repeated or f.type not in PROTO_TYPES:
            continue
        parts.append(f"`{f.name}` {_ARROW_DDL[PROTO_TYPES[f.type]]}")
    return ", ".join(parts)


def message_from_row(
    content: ArrowContent, content_type: str | None, row: dict[str, Any]
) -> Message:
    """A message holding ``row`` (a column -> value dict), for publishing."""
    factory: Callable[[], Message] = content.message_type(content_type)
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


__all__ = [
    "META_DDL", "message_from_row", "proto_content_ddl",
]
