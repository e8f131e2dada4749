"""The ``journal`` data source's options: content schemas as DDL, and the
checks and defaults of each option (see the table in pipeline/_source.py)."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from message import DEFAULT_UUID_PATH, uuid_path_of
from message.arrow import (
    ENVELOPE_FIELDS,
    ENVELOPE_NAMES,
    ArrowContent,
    content_column_names,
    infer_content_fields,
)

from ._content import proto_content_ddl
from ._stores import StoreOptions, select_journals
from ._values import bool_option, positive_option

SPLIT_BYTES: Final = 64 << 20
MAX_SPLITS: Final = 8


def content_ddl(options: Mapping[str, str]) -> str:
    """The content columns named by the options, as DDL."""
    schema = (options.get("schema") or "").strip()
    if schema.startswith("{"):
        st = StructType.fromJson(json.loads(schema))
        return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in st.fields)
    if not schema and options.get("proto_class"):
        return proto_content_ddl(options["proto_class"], options.get("uuid_field", "uuid"))
    if not schema:
        return _inferred_ddl(options)
    return schema


_INFERRED_TYPES: Final = {
    pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string",
}


def _inferred_ddl(options: Mapping[str, str]) -> str:
    """Content columns inferred, as ``spark.read.json`` would, from the first
    documents of the NDJSON journals read, or the CSV records' fields
    (``message.arrow.infer_content_fields``).
    Empty when nothing can be inferred; name the columns with the ``schema``
    option to be sure."""
    try:
        where = StoreOptions.of(options)
    except ValueError:
        return ""  # the reader reports it
    if where.root is not None and not os.path.isdir(where.root):
        return ""
    try:
        path = uuid_path_option(options)
        with where.open() as store:
            fields = infer_content_fields(store, select_journals(store, options), path)
    except (OSError, ValueError):
        return ""  # inference is a convenience: it never fails a read
    return ", ".join(f"`{name}` {_INFERRED_TYPES[typ]}" for name, typ in fields)


#: The comment of a content column renamed because its field has the name of
#: an envelope column: ``message field uuid`` names the field it holds.
RENAMED_COMMENT: Final = "message field "


def content_columns(ddl: str) -> str:
    """``ddl`` with each content field named like an envelope column
    (``uuid``, ``begin``, ...) renamed ``content_<name>``: the column keeps the
    message's field, whose name its comment says, and Spark never sees two
    columns of one name (its AMBIGUOUS_REFERENCE)."""
    items = _ddl_items(ddl)
    out = []
    for (name, text), column in zip(
        items, content_column_names([name for name, _ in items]), strict=True
    ):
        if column == name:
            out.append(text)
            continue
        rest = text.strip()[len(_quoted(name)) if text.strip().startswith("`") else len(name):]
        if " comment " in f" {rest.lower()} ":
            raise ValueError(
                f"the content column {name!r} has the name of an envelope column, and a"
                f" comment: name it otherwise in the schema (its field is read as {column!r}"
                " without a comment)"
            )
        out.append(f"{_quoted(column)} {rest.strip()} COMMENT '{RENAMED_COMMENT}{name}'")
    return ", ".join(out)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ddl_items(ddl: str) -> list[tuple[str, str]]:
    """``(name, text)`` of each top-level column of a DDL string."""
    items: list[tuple[str, str]] = []
    depth, quote, start = 0, "", 0
    for i, ch in enumerate(ddl + ","):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "`'\"":
            quote = ch
        elif ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            text = ddl[start:i]
            start = i + 1
            if text.strip():
                items.append((_ddl_name(text.strip()), text.strip()))
    return items


def _ddl_name(item: str) -> str:
    if item.startswith("`"):
        name, i = [], 1
        while i < len(item):
            if item[i] == "`":
                if item[i + 1 : i + 2] == "`":
                    name.append("`")
                    i += 2
                    continue
                break
            name.append(item[i])
            i += 1
        return "".join(name)
    return item.replace(":", " ").split()[0]


def content_spec(options: Mapping[str, str], schema: StructType) -> ArrowContent:
    """The ArrowContent of the content columns of ``schema`` (those after the
    metadata columns): each holds the message field of its name, or the one
    its comment names (see ``content_columns``)."""
    fields = schema.fields[len(ENVELOPE_FIELDS) :]
    arrow = to_arrow_schema(StructType(fields), timezone="UTC") if fields else pa.schema([])
    path = uuid_path_option(options)
    return ArrowContent(
        tuple((_field_of(f), a.type) for f, a in zip(fields, arrow, strict=True)),
        uuid_path=path,
        proto_class=options.get("proto_class") or None,
        uuid_field=options.get("uuid_field", "uuid"),
    )


def _field_of(column: Any) -> str:
    comment = str((column.metadata or {}).get("comment", ""))
    field = comment[len(RENAMED_COMMENT) :]
    if comment.startswith(RENAMED_COMMENT) and field.lower() in _ENVELOPE_LOWER:
        return field
    return str(column.name)


#: The envelope columns' names, as Spark compares them (without regard to case).
_ENVELOPE_LOWER: Final = frozenset(name.lower() for name in ENVELOPE_NAMES)


def uuid_path_option(options: Mapping[str, str]) -> tuple[str, ...]:
    """The option ``uuid_path`` as keys (``message.DEFAULT_UUID_PATH`` if not given)."""
    return uuid_path_of(options.get("uuid_path", "/".join(DEFAULT_UUID_PATH)))


def _starting_time(options: Mapping[str, str]) -> float | None:
    """The option ``starting_time`` as seconds since the epoch (None if not given)."""
    text = options.get("starting_time")
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"starting_time must be an ISO-8601 time or seconds since the epoch, not {text!r}"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return float(t.timestamp())


def _max_bytes_per_trigger(options: Mapping[str, str]) -> int | None:
    return positive_option(options, "max_bytes_per_trigger", "a positive number of bytes")


def _include_acks(options: Mapping[str, str]) -> bool:
    return bool_option(options, "include_acks", False)


def _skip_corrupt(options: Mapping[str, str]) -> bool:
    """``skip_corrupt``: frames that do not decode, and damaged pieces of a
    journal, are skipped (with a warning in the task's log) instead of
    failing the read, as ``exactly read --skip-corrupt`` does."""
    return bool_option(options, "skip_corrupt", False)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly the columns and types Spark expects. Columns go
    by position: the metadata columns, then the content columns, whose names
    may differ from their fields' (``content_columns``)."""
    if batch.schema == schema:
        return batch
    cols = []
    for i, f in enumerate(schema):
        col = batch.column(i)
        cols.append(col if col.type == f.type else col.cast(f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)
