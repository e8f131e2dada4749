"""Newline-terminated frames: what a line is (``NEWLINE``, ``line_ends``,
``whole_lines_end``), ``unpack_line``, and the bulk splitters of the NDJSON
and CSV framings.

This module is the one definition of a line. The other forms of it are
held to it by the tests: the native readers' loops, the column form
``message.columns.line_ends`` (numpy or native), the windows of whole lines
of ``message.arrow``, and the NDJSON writers (the framing's ``marshal``,
``message.arrow.ndjson_frames`` and the native Publisher), which end every
frame with ``NEWLINE``.

Wire layout of a line frame::

    +------------------------------+------+
    | content (no 0x0a, see below) | 0x0a |
    +------------------------------+------+

An NDJSON frame is one line. A CSV frame is one record, which spans several
lines when a quoted field holds a newline: a record ends at the first newline
after which the count of ``"`` characters since the record's start is even
(RFC 4180 escapes a quote inside a quoted field by doubling it, so quotes
always come in pairs in a complete record).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from io import BytesIO
from itertools import accumulate, chain, islice
from typing import Any, Final

from ._errors import TruncatedFrameError
from ._interfaces import ByteReader, Frame

#: The byte that ends a line frame (an NDJSON document; a CSV record, when
#: no quoted field is open).
NEWLINE: Final = b"\n"
_NL = NEWLINE
_QUOTE = b'"'


def line_ends(data: bytes | bytearray | memoryview) -> list[int]:
    """The end of each whole line of ``data`` (just past its newline),
    relative to its start; bytes after the last newline are no line."""
    raw = bytes(data)
    ends = []
    at = raw.find(NEWLINE)
    while at >= 0:
        ends.append(at + 1)
        at = raw.find(NEWLINE, at + 1)
    return ends


def whole_lines_end(data: bytes | bytearray, stop: int) -> int:
    """Where the whole lines of ``data[:stop]`` end (just past the last
    newline), 0 if it holds none: the cut between complete frames and the
    start of one still incomplete."""
    return data.rfind(NEWLINE, 0, stop) + 1


def unpack_line(r: ByteReader) -> bytes:
    """The bytes of ``r`` through the next ``\\n``, inclusive.

    Returns ``b""`` at a clean end of input. Raises ``TruncatedFrameError``
    (with ``.data``, which has been consumed) if the input ends mid-line. Never
    reads past the newline: it uses ``r.readline()`` when ``r`` has one (the
    ``io`` streams), else ``r.peek()``, else one-byte reads.
    """
    readline = getattr(r, "readline", None)
    line = readline() if readline is not None else _readline_without_readline(r)
    if line and line[-1] != 0x0A:
        raise TruncatedFrameError("input ended inside a line", data=line)
    return line if type(line) is bytes else bytes(line)


def _readline_without_readline(r: Any) -> bytes:
    """``readline`` for readers that only have ``read`` (and maybe ``peek``)."""
    parts: list[bytes] = []
    peek = getattr(r, "peek", None)
    while True:
        if peek is not None:
            # Look into the reader's buffer for the newline, then take exactly
            # the bytes through it: one copy, no over-read.
            buffered = peek(1)
            if not buffered:
                break
            i = buffered.find(_NL)
            part = r.read(i + 1 if i >= 0 else len(buffered))
        else:
            # Without peek, reading more than one byte could consume bytes of
            # the next frame, which a plain reader cannot take back.
            part = r.read(1)
        if not part:
            break
        parts.append(part)
        if part[-1] == 0x0A:
            break
    return b"".join(parts)


def read_lines(r: ByteReader, chunk_size: int) -> Iterator[tuple[int, int, Frame]]:
    """The bulk splitter of the NDJSON framing: ``(begin, end, line)`` for
    every complete line of ``r``; see ``Framing.read_frames``."""
    # The per-frame work runs in C: ``chain.from_iterable`` flattens one
    # ``zip(begins, ends, lines)`` per chunk, so no Python bytecode runs per
    # line. Measured on 100-byte lines, this costs about a third of a Python
    # loop of ``bytes.find`` and ``memoryview`` slices with a ``yield`` each.
    _check_chunk_size(chunk_size)
    return chain.from_iterable(_with_offsets(_line_batches(r, chunk_size, quote_aware=False)))


def read_records(r: ByteReader, chunk_size: int) -> Iterator[tuple[int, int, Frame]]:
    """The bulk splitter of the CSV framing: like ``read_lines``, but a frame
    is a whole record, which may span lines inside a quoted field."""
    _check_chunk_size(chunk_size)
    return chain.from_iterable(_with_offsets(_line_batches(r, chunk_size, quote_aware=True)))


def line_batches(r: ByteReader, chunk_size: int) -> Iterator[tuple[int, list[bytes]]]:
    """``read_lines`` by chunk: ``(begin, lines)``, the lines of a chunk and
    the offset of the first, each line beginning where the previous ended."""
    _check_chunk_size(chunk_size)
    return _line_batches(r, chunk_size, quote_aware=False)


def record_batches(r: ByteReader, chunk_size: int) -> Iterator[tuple[int, list[bytes]]]:
    """``read_records`` by chunk, as ``line_batches``."""
    _check_chunk_size(chunk_size)
    return _line_batches(r, chunk_size, quote_aware=True)


def _with_offsets(
    batches: Iterator[tuple[int, list[bytes]]],
) -> Iterator[Iterable[tuple[int, int, Frame]]]:
    """``(begin, end, frame)`` of every frame of each batch."""
    for base, frames in batches:
        # Offsets of every frame start, and one past the last frame: one
        # item more than ``frames``, so ``zip`` stops at the shortest on purpose.
        offsets = list(accumulate(map(len, frames), initial=base))
        yield zip(offsets, islice(offsets, 1, None), frames, strict=False)


def _check_chunk_size(chunk_size: int) -> None:
    # Checked when iteration is set up, not at its first step.
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")


def _line_batches(
    r: ByteReader, chunk_size: int, *, quote_aware: bool
) -> Iterator[tuple[int, list[bytes]]]:
    """The complete frames of each chunk read from ``r``, with the offset of
    the first; raises ``TruncatedFrameError`` at the end if input ended
    inside a frame."""
    read = r.read
    base = 0  # Offset of the first byte of ``pending`` (or of the next chunk).
    # Bytes of a frame that is not complete yet. A list, joined once the frame
    # completes, so that a frame spanning many chunks is copied only once.
    pending: list[bytes] = []
    odd = False  # CSV: whether ``pending`` holds an odd number of quotes.
    while True:
        chunk = read(chunk_size)
        if not chunk:
            break
        if type(chunk) is not bytes:
            chunk = bytes(chunk)

        if quote_aware and (
            odd or _QUOTE in chunk or (pending and any(_NL in p for p in pending))
        ):
            # The fast path below splits at every newline: right only when no
            # quoted field can be open (no quote in the chunk, and what is
            # pending is at most the start of one line, with even quotes).
            records, odd = _split_records(chunk, pending, odd)
            if records:
                yield base, records
                base += sum(map(len, records))
            continue

        if _NL not in chunk:
            pending.append(chunk)
            continue
        if pending:
            pending.append(chunk)
            chunk = b"".join(pending)
            pending.clear()
        # ``BytesIO`` over ``bytes`` shares the buffer (no copy); iterating it
        # splits lines in C, each a small ``bytes`` that keeps its newline.
        # That one copy per line is cheaper, at these sizes, than a
        # ``memoryview`` slice, and ``orjson`` parses ``bytes`` fastest.
        lines = list(BytesIO(chunk))
        if lines[-1][-1] != 0x0A:
            pending.append(lines.pop())
        if lines:
            yield base, lines
            base += len(chunk) - (len(pending[0]) if pending else 0)

    if pending:
        raise TruncatedFrameError(data=b"".join(pending), offset=base)


def _split_records(
    chunk: bytes, pending: list[bytes], odd: bool
) -> tuple[list[bytes], bool]:
    """Complete CSV records of ``pending`` + ``chunk``, quote-aware.

    ``pending`` (the start of an incomplete record: ``odd`` says whether it
    holds an odd number of quotes) is extended in place with what is left
    over; returns the records and the parity of what is left.
    """
    out: list[bytes] = []
    for line in BytesIO(chunk):
        # Parity of quotes: a newline ends the record only outside quotes.
        if line.count(_QUOTE) & 1:
            odd = not odd
        if odd or line[-1] != 0x0A:
            pending.append(line)
            continue
        if pending:
            pending.append(line)
            line = b"".join(pending)
            pending.clear()
        out.append(line)
    return out, odd


def unpack_record(r: ByteReader) -> bytes:
    """The next CSV record of ``r`` (one or more lines, quote-aware), or
    ``b""`` at a clean end; never reads past it."""
    line = unpack_line(r)
    if not line or not line.count(_QUOTE) & 1:
        return line
    parts = [line]
    odd = True
    while odd:
        try:
            line = unpack_line(r)
        except TruncatedFrameError as e:
            raise TruncatedFrameError(data=b"".join(parts) + e.data) from None
        if not line:
            raise TruncatedFrameError(data=b"".join(parts))
        parts.append(line)
        if line.count(_QUOTE) & 1:
            odd = False
    return b"".join(parts)
