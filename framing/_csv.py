"""The CSV framing (``text/csv``): one RFC 4180 record per frame.

Wire layout of a frame::

    +---------+------+---------+------+-----+---------+------+
    | field 1 | 0x2c | field 2 | 0x2c | ... | field n | 0x0a |
    +---------+------+---------+------+-----+---------+------+

    field = raw text without , " CR LF
          | 0x22, text with each " doubled (may hold , CR LF), 0x22

Fields are UTF-8 text. A field is quoted only when it must be: when it holds
a comma, a quote, a CR or an LF (and a record of one empty field is written
``""``, so that it differs from an empty line, which is a record of no
fields). Lines end with ``\\n``; a ``\\r\\n`` ending is accepted when reading.
Decoding is strict: a quote inside an unquoted field, or text after a closing
quote, is a ``FrameDecodeError``.

A message is encoded by its hooks, ``marshal_csv() -> list[str]`` and
``unmarshal_csv(fields: list[str])``; a plain ``list`` of ``str`` is a record
by itself (decoding replaces its items).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, final

from ._constants import CONTENT_TYPE_CSV, DEFAULT_CHUNK_SIZE
from ._errors import (
    FrameDecodeError,
    FrameEncodeError,
    TruncatedFrameError,
    UnsupportedMessageError,
)
from ._interfaces import BatchFraming, ByteReader, Frame, UnmarshalFunc
from ._lines import read_records, record_batches, unpack_record
from ._registry import register_framing

# Characters that force a field to be quoted.
_SPECIAL: Final = frozenset(',"\r\n')


@final
class CSVFraming:
    """The CSV framing. Registered for ``CONTENT_TYPE_CSV``."""

    __slots__ = ()

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE_CSV

    def marshal(self, msg: Any) -> bytes:
        """One frame: the record of ``msg`` and a newline."""
        return encode_record(_fields_of(msg), msg)

    def unmarshal_frame(self, frame: Frame, msg: Any) -> None:
        """Decode one record (with or without its newline) into ``msg``."""
        apply = _applier_for(msg)
        try:
            apply(msg, decode_record(frame))
        except FrameDecodeError as e:
            # A hook may refuse the record's fields (CSVRecord does when the
            # first is no UUID): the error then carries the frame too.
            if not e.data:
                e.data = bytes(frame)
            raise

    def new_unmarshal_func(self, r: ByteReader) -> UnmarshalFunc:
        """Decode one record of ``r`` per call; see ``Framing.new_unmarshal_func``.

        Like Go's ``encoding/csv`` reader, it also requires every record of the
        reader to have as many fields as the first one (``FrameDecodeError``
        otherwise). ``unmarshal_frame`` decodes each frame on its own and does
        not check this.
        """
        offset = 0  # Bytes consumed from ``r``, for errors' ``.offset``.
        line = 1  # Line number of the next record, for error messages.
        width: int | None = None  # Fields per record, set by the first record.

        def unmarshal(msg: Any) -> None:
            nonlocal offset, line, width
            apply = _applier_for(msg)  # A wrong type consumes nothing.
            try:
                frame = unpack_record(r)
            except TruncatedFrameError as e:
                e.offset = offset
                offset += len(e.data)
                raise
            if not frame:
                raise EOFError("end of input")
            begin, start_line = offset, line
            offset += len(frame)
            line += frame.count(b"\n")
            try:
                fields = decode_record(frame)
            except FrameDecodeError as e:
                e.offset = begin
                raise
            if width is None:
                width = len(fields)
            elif len(fields) != width:
                raise FrameDecodeError(
                    f"record on line {start_line}: wrong number of fields"
                    f" ({len(fields)}, not {width})",
                    data=frame,
                    offset=begin,
                )
            try:
                apply(msg, fields)
            except FrameDecodeError as e:
                e.data, e.offset = e.data or frame, begin
                raise

        return unmarshal

    def read_frames(
        self, r: ByteReader, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[tuple[int, int, Frame]]:
        """Every complete record of ``r``; see ``Framing.read_frames``."""
        return read_records(r, chunk_size)

    def read_frame_batches(
        self, r: ByteReader, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[tuple[int, list[bytes]]]:
        """Every complete record of ``r``, by chunk; see ``BatchFraming``."""
        return record_batches(r, chunk_size)

    def __repr__(self) -> str:
        return "CSVFraming()"


def _fields_of(msg: Any) -> Sequence[str]:
    hook = getattr(msg, "marshal_csv", None)
    if hook is not None:
        fields = hook()
        if not isinstance(fields, list | tuple):
            raise FrameEncodeError(
                f"{type(msg).__qualname__}.marshal_csv() returned"
                f" {type(fields).__qualname__}, not a list of str"
            )
        return fields
    if isinstance(msg, list | tuple):
        return msg
    raise UnsupportedMessageError(
        f"the CSV framing cannot encode {type(msg).__qualname__}: it has no marshal_csv()"
        " method and is not a list of str",
        message_type=type(msg),
    )


def _apply_with_hook(msg: Any, fields: list[str]) -> None:
    # What the hook raises is the caller's own: it propagates unchanged.
    msg.unmarshal_csv(fields)


def _apply_to_list(msg: Any, fields: list[str]) -> None:
    msg[:] = fields


def _applier_for(msg: Any) -> Callable[[Any, list[str]], None]:
    if callable(getattr(msg, "unmarshal_csv", None)):
        return _apply_with_hook
    if isinstance(msg, list):
        return _apply_to_list
    raise UnsupportedMessageError(
        f"the CSV framing cannot decode into {type(msg).__qualname__}: it has no"
        " unmarshal_csv() method and is not a list",
        message_type=type(msg),
    )


def _quote(field: str) -> str:
    if _SPECIAL.isdisjoint(field):
        return field
    return '"' + field.replace('"', '""') + '"'


def encode_record(fields: Sequence[str], msg: object = None) -> bytes:
    """One CSV frame (RFC 4180, ``\\n`` ending) of ``fields``."""
    for field in fields:
        if not isinstance(field, str):
            raise FrameEncodeError(
                f"CSV fields must be str; {type(msg).__qualname__} gave"
                f" {type(field).__qualname__}: {field!r}"
            )
    # A record of one empty field is written ``""``: an empty line is a
    # record of no fields.
    text = '""' if len(fields) == 1 and not fields[0] else ",".join(map(_quote, fields))
    try:
        return (text + "\n").encode()
    except UnicodeEncodeError as e:  # A lone surrogate.
        raise FrameEncodeError(f"CSV field is not valid text: {e}") from e


def decode_record(frame: Frame) -> list[str]:
    """The fields of one CSV record (with or without its line ending)."""
    try:
        text = str(frame, "utf-8")
    except UnicodeDecodeError as e:
        raise FrameDecodeError(f"CSV record is not UTF-8: {e}", data=frame) from e
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    if '"' not in text:
        # The common case: no quoted field, so a split is the whole parse.
        if "\n" in text or "\r" in text:
            raise FrameDecodeError("CSV record has a line break outside quotes", data=frame)
        return text.split(",") if text else []
    try:
        return _parse_quoted(text)
    except ValueError as e:
        raise FrameDecodeError(f"invalid CSV record: {e}", data=frame) from None


def _parse_quoted(text: str) -> list[str]:
    """Strict RFC 4180 parse of a record that holds at least one quote."""
    fields: list[str] = []
    n = len(text)
    i = 0
    while True:
        if i < n and text[i] == '"':
            # Quoted field: runs to a quote that is not doubled.
            parts: list[str] = []
            j = i + 1
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ValueError(f'quoted field at column {i + 1} has no closing "')
                parts.append(text[j:k])
                if k + 1 < n and text[k + 1] == '"':
                    parts.append('"')
                    j = k + 2
                    continue
                break
            fields.append("".join(parts))
            i = k + 1
            if i == n:
                return fields
            if text[i] != ",":
                raise ValueError(f'extraneous text after closing " at column {i + 1}')
            i += 1
        else:
            k = text.find(",", i)
            end = n if k < 0 else k
            field = text[i:end]
            if '"' in field:
                raise ValueError(f'bare " in unquoted field at column {i + 1}')
            if "\n" in field or "\r" in field:
                raise ValueError(f"line break in unquoted field at column {i + 1}")
            fields.append(field)
            if k < 0:
                return fields
            i = k + 1


# Typed as the protocol it implements, so that mypy checks it does.
_FRAMING: BatchFraming = CSVFraming()
register_framing(_FRAMING)
