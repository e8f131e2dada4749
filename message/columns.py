"""UUID columns as text, and the lines of NDJSON, in bulk, for columnar
readers (the Spark source, ``message.arrow``).

Each function has its numpy definition here; the native core, when built,
does the same in one pass, and the test suite runs both (with
``EXACTLY_PURE_PYTHON=1``, the numpy one). The bit layout is
``message.layout``'s.

>>> import numpy as np
>>> from message.columns import format_uuid_strings, parse_uuid_strings
>>> text = b"9f2a6e1c-0000-1000-8000-0a0b0c0d0e0f"
>>> hi, lo = parse_uuid_strings(text, np.array([0, 36], dtype=np.int32))
>>> uuids, producers = format_uuid_strings(hi, lo)
>>> uuids == text, producers
(True, b'0a0b0c0d0e0f')
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from framing import NEWLINE

from ._core import NATIVE

if TYPE_CHECKING:
    import numpy as np

    Array = np.ndarray[Any, Any]
else:
    Array = Any

#: Positions of the 32 hex digits in a canonical 36-character UUID.
_DIGIT_POSITIONS: Final = tuple(i for i in range(36) if i not in (8, 13, 18, 23))


def parse_uuid_strings(
    data: Any, offsets: Array, valid: Array | None = None
) -> tuple[Array, Array]:
    """UUID strings as ``(hi, lo)`` uint64 halves.

    String ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (``data`` any bytes-like
    object, ``offsets`` ``n + 1`` int32 values: an Arrow string array's two
    buffers). A string that is not a UUID, and a row where ``valid`` (a bool
    mask, if given) is false, is the nil UUID, as ``JsonDocument.get_uuid``
    has it. Canonical strings are parsed in bulk; other forms that
    ``uuid.UUID`` takes (braces, no hyphens, ...) one by one.
    """
    import numpy as np

    offsets = np.ascontiguousarray(offsets, dtype=np.int32)
    n = len(offsets) - 1
    hi: Array = np.zeros(n, dtype=np.uint64)
    lo: Array = np.zeros(n, dtype=np.uint64)
    if n <= 0:
        return hi, lo
    if NATIVE is not None:
        others = NATIVE.parse_uuids(data, offsets, hi, lo)
    else:
        others = _parse_canonical(np.frombuffer(data, dtype=np.uint8), offsets, hi, lo)
    raw = memoryview(data)
    for i in others:
        text = bytes(raw[offsets[i] : offsets[i + 1]])
        try:
            v = uuid.UUID(text.decode()).int
        except (ValueError, UnicodeDecodeError):
            continue
        hi[i], lo[i] = v >> 64, v & 0xFFFFFFFFFFFFFFFF
    if valid is not None:
        hi[~valid] = 0
        lo[~valid] = 0
    return hi, lo


def _parse_canonical(data: Array, offsets: Array, hi: Array, lo: Array) -> list[int]:
    """``parse_uuid_strings``'s bulk step, in numpy: canonical strings into
    ``hi`` and ``lo``; returns the rows left (strings of any other form)."""
    import numpy as np

    hex_value = _hex_values()
    canonical = np.diff(offsets) == 36
    rows = np.flatnonzero(canonical)
    if len(rows):
        chars = data[offsets[rows][:, None] + np.arange(36)]
        digits = hex_value[chars[:, list(_DIGIT_POSITIONS)]]
        hyphens = (chars[:, [8, 13, 18, 23]] == ord("-")).all(axis=1)
        good = hyphens & (digits != 255).all(axis=1)
        d = digits[good].astype(np.uint64)
        weights = np.uint64(1) << (np.arange(15, -1, -1, dtype=np.uint64) * np.uint64(4))
        hi[rows[good]] = (d[:, :16] * weights).sum(axis=1, dtype=np.uint64)
        lo[rows[good]] = (d[:, 16:] * weights).sum(axis=1, dtype=np.uint64)
        canonical[rows[~good]] = False
    return [int(i) for i in np.flatnonzero(~canonical & (np.diff(offsets) > 0))]


@functools.cache
def _hex_values() -> Array:
    """The value of each hex digit's ASCII byte; 255 for any other byte."""
    import numpy as np

    values: Array = np.full(256, 255, dtype=np.uint8)
    for i, c in enumerate(b"0123456789abcdef"):
        values[c] = i
    for i, c in enumerate(b"ABCDEF"):
        values[c] = 10 + i
    return values


def format_uuid_strings(hi: Array, lo: Array) -> tuple[bytes, bytes]:
    """UUIDs given as uint64 halves, as text: their canonical strings (36
    bytes each) and their ProducerIDs (the low 48 bits, 12 lower-case hex
    digits each), each kind laid end to end."""
    import numpy as np

    hi = np.ascontiguousarray(hi, dtype=np.uint64)
    lo = np.ascontiguousarray(lo, dtype=np.uint64)
    if NATIVE is not None:
        uuids, producers = NATIVE.format_uuids(hi, lo)
        return bytes(uuids), bytes(producers)
    return _format_numpy(hi, lo)


def _format_numpy(hi: Array, lo: Array) -> tuple[bytes, bytes]:
    """``format_uuid_strings``, in numpy."""
    import numpy as np

    n = len(hi)
    raw: Array = np.empty((n, 16), dtype=np.uint8)
    raw[:, :8] = hi.astype(">u8").view(np.uint8).reshape(-1, 8)
    raw[:, 8:] = lo.astype(">u8").view(np.uint8).reshape(-1, 8)
    hex_digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    digits: Array = np.empty((n, 32), dtype=np.uint8)
    digits[:, 0::2] = hex_digits[raw >> 4]
    digits[:, 1::2] = hex_digits[raw & 15]
    text: Array = np.full((n, 36), ord("-"), dtype=np.uint8)
    text[:, list(_DIGIT_POSITIONS)] = digits
    return text.tobytes(), np.ascontiguousarray(digits[:, 20:]).tobytes()


def envelope_fields(
    hi: Array, lo: Array, allocate: Callable[[int], Any] = bytearray
) -> tuple[Any, Any, Array, Array, Array]:
    """What the envelope columns of ``message.arrow`` hold of UUIDs given as
    uint64 halves: their texts (as :func:`format_uuid_strings`), their
    clocks (int64), flags (int32) and publish times in microseconds since
    the Unix epoch (int64, floored; meaningless where the clock is 0).

    The native core writes them into buffers from ``allocate`` (a function
    of a size in bytes giving a writable buffer: ``pyarrow.allocate_buffer``
    puts them in Arrow's memory pool, which reuses its pages); the numpy
    definition returns its own."""
    import numpy as np

    hi = np.ascontiguousarray(hi, dtype=np.uint64)
    lo = np.ascontiguousarray(lo, dtype=np.uint64)
    if NATIVE is None:
        return _envelope_fields_numpy(hi, lo)
    n = len(hi)
    uuids, producers, clocks, flags, micros = (allocate(n * w) for w in (36, 12, 8, 4, 8))
    NATIVE.envelope_fields(hi, lo, uuids, producers, clocks, flags, micros)
    return (uuids, producers, np.frombuffer(clocks, dtype=np.int64, count=n),
            np.frombuffer(flags, dtype=np.int32, count=n),
            np.frombuffer(micros, dtype=np.int64, count=n))


def _envelope_fields_numpy(hi: Array, lo: Array) -> tuple[bytes, bytes, Array, Array, Array]:
    """``envelope_fields``, in numpy (the layout's numpy forms)."""
    import numpy as np

    from .layout import UUID_EPOCH_OFFSET, clocks_of, flags_of

    uuids, producers = _format_numpy(hi, lo)
    clocks = clocks_of(hi, lo)
    micros = ((clocks >> np.uint64(4)).astype(np.int64) - UUID_EPOCH_OFFSET) // 10
    return uuids, producers, clocks.astype(np.int64), flags_of(lo), micros


def line_ends(data: Any) -> Array:
    """``framing.line_ends`` as a column: the end of each line of ``data``
    (any bytes-like object), relative to its start and just past the line's
    newline, as int64; bytes after the last newline are no line."""
    import numpy as np

    if NATIVE is not None:
        ends: Array = np.frombuffer(NATIVE.line_ends(data), dtype=np.int64)
        return ends
    newline = np.frombuffer(NEWLINE, dtype=np.uint8)[0]
    return (np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == newline) + 1).astype(np.int64)


def prefixed_uuids(
    data: Any, begins: Array, ends: Array, prefix: bytes, suffix: bytes, key: bytes
) -> tuple[Array, Array] | None:
    """The UUIDs of the lines ``[begins[i], ends[i])`` of ``data`` (whole
    lines, end to end) as ``(hi, lo)`` uint64 halves, read from the bytes
    where every line is laid out as ``prefix``, a canonical UUID, ``suffix``,
    then ``,`` or ``}`` (as the NDJSON framing writes ``{"_meta":{"uuid":
    "..."}`` first); None where one is not, where ``key`` (the quoted
    top-level key of the UUID) occurs more than once in a line, or where the
    bytes ``\\u`` occur at all (an escape could spell that key again)."""
    import numpy as np

    n = len(ends)
    hi: Array = np.zeros(n, dtype=np.uint64)
    lo: Array = np.zeros(n, dtype=np.uint64)
    if NATIVE is not None:
        ends = np.ascontiguousarray(ends, dtype=np.int64)
        return (hi, lo) if NATIVE.prefixed_uuids(data, ends, prefix, suffix, key, hi, lo) else None
    raw = bytes(data)
    if b"\\u" in raw or raw.count(key) != n:
        return None
    width = len(prefix) + 36 + len(suffix) + 1
    if n == 0:
        return hi, lo
    if bool((ends - begins < width).any()):
        return None
    head = np.frombuffer(raw, dtype=np.uint8)[begins[:, None] + np.arange(width)]
    text = head[:, len(prefix) : len(prefix) + 36]
    if not (
        (head[:, : len(prefix)] == np.frombuffer(prefix, dtype=np.uint8)).all()
        and (head[:, len(prefix) + 36 : -1] == np.frombuffer(suffix, dtype=np.uint8)).all()
        and np.isin(head[:, -1], [ord(","), ord("}")]).all()
    ):
        return None
    offsets = np.arange(0, 36 * (n + 1), 36, dtype=np.int32)
    if _parse_canonical(np.ascontiguousarray(text).reshape(-1), offsets, hi, lo):
        return None
    return hi, lo


def uuid_strings(producer: bytes, first_clock: int, count: int, flags: int) -> bytes:
    """The canonical strings (36 bytes each, laid end to end) of the UUIDs of
    ``producer`` (6 bytes) with the ``count`` clocks from ``first_clock`` on
    and ``flags``: what a Publisher stamps on messages it sequences."""
    import numpy as np

    from .layout import halves_of

    clocks = np.arange(first_clock, first_clock + count, dtype=np.uint64)
    hi, lo = halves_of(int.from_bytes(producer, "big"), clocks, flags)
    return format_uuid_strings(hi, lo)[0]
