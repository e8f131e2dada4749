"""NDJSON frames of Arrow rows, for writes: each row's fields as JSON text,
with its UUID first, as the NDJSON framing writes it."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from framing import NEWLINE

from .._types import DEFAULT_UUID_PATH
from ._windows import _fixed_width_strings

if TYPE_CHECKING:
    Array = np.ndarray[Any, Any]
else:
    Array = Any



def ndjson_frames(
    batch: pa.RecordBatch, uuids: bytes, uuid_path: Sequence[str] = DEFAULT_UUID_PATH
) -> bytes | None:
    """The rows of ``batch`` framed as NDJSON documents, laid end to end:
    each row a JSON object of its columns in order (null for a null), then
    ``uuid_path`` holding the row's UUID from ``uuids`` (canonical strings,
    36 bytes each, laid end to end; see ``message.columns.uuid_strings``).

    The bytes are those of ``JsonDocument(row)`` stamped and framed one by
    one, each value as ``json_values`` gives it (as Spark's ``to_json``
    writes it: NaN and infinities as strings, decimals exact, binary data
    base64), built a column at a time:
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
    parts.append('"' + "}" * len(uuid_path) + NEWLINE.decode())
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
        return pa.array([orjson.dumps(v).decode() for v in json_values(column)], pa.string())
    return pc.fill_null(texts, "null") if texts.null_count else texts


def json_values(column: pa.Array) -> list[Any]:
    """The values of ``column`` as ``orjson.dumps`` writes them into a JSON
    object's field, as Spark's ``to_json`` does: a map is an object, a
    decimal an exact number, binary data a base64 string, NaN and the
    infinities the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``;
    structs and lists hold their values so. (``to_pylist`` gives a map as a list of
    pairs, a decimal as a ``Decimal`` and binary data as ``bytes``, which
    JSON has no form for.)"""
    values: list[Any] = column.to_pylist()
    typ = column.type
    if pa.types.is_floating(typ):
        finite = pc.is_finite(column)
        if finite.null_count == len(column) or pc.all(pc.fill_null(finite, True)).as_py():
            return values
        return [_json_value(v, typ) for v in values]
    if not _needs_json_form(typ):
        return values
    return [_json_value(v, typ) for v in values]


def nested_types(typ: pa.DataType) -> Iterator[pa.DataType]:
    """Every type inside ``typ``, depth first, ``typ`` itself left out: the
    fields of a struct, the values of a list (of any kind), the keys and
    items of a map. The one walk of a column's type, wherever a rule looks
    for a kind of value at any depth."""
    children: list[pa.DataType]
    if pa.types.is_struct(typ):
        children = [typ.field(i).type for i in range(typ.num_fields)]
    elif pa.types.is_map(typ):
        children = [typ.key_type, typ.item_type]
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or \
            pa.types.is_fixed_size_list(typ):
        children = [typ.value_type]
    else:
        children = []
    for child in children:
        yield child
        yield from nested_types(child)


def _json_form_of(typ: pa.DataType) -> bool:
    """A value of ``typ`` is written other than as pyarrow gives it."""
    return bool(pa.types.is_map(typ) or pa.types.is_decimal(typ) or pa.types.is_binary(typ)
                or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ))


def _needs_json_form(typ: pa.DataType) -> bool:
    # A float inside counts too (a NaN or an infinity in it; top-level
    # columns are checked at once, by their values).
    return _json_form_of(typ) or any(
        _json_form_of(t) or pa.types.is_floating(t) for t in nested_types(typ))


#: How Spark's ``to_json`` writes the floats JSON has no number for (and
#: its JSON reader reads them back).
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _json_value(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE[str(value)]
    if pa.types.is_map(typ):
        return {str(k): _json_value(v, typ.item_type) for k, v in value}
    if pa.types.is_decimal(typ):
        return orjson.Fragment(str(value))
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if pa.types.is_struct(typ):
        return {f.name: _json_value(value[f.name], f.type)
                for f in (typ.field(i) for i in range(typ.num_fields))}
    if isinstance(value, list):
        return [_json_value(v, typ.value_type) for v in value]
    return value
