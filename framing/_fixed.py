"""The fixed-header protobuf framing (``application/x-protobuf-fixed``).

Wire layout of a frame (all offsets in bytes)::

     0                4                8
    +----------------+----------------+------------------------------+
    | word           | length         | payload                      |
    | 66 33 93 36    | uint32, little | ``length`` bytes: the        |
    |                | endian         | message's protobuf encoding  |
    +----------------+----------------+------------------------------+

The magic word lets a reader notice bytes that are not a frame (a
de-synchronisation: a torn write, a foreign writer) and skip to the next
frame: such a run of bytes, up to the next magic word or the end of the
input, is reported as a ``DesyncError`` carrying it, and reading goes on.
Fewer than 8 bytes left at the end of the input are a ``TruncatedFrameError``
(a partial header), except a single ``\\n``, which is a clean end.

A message is encoded with ``SerializeToString()`` and decoded with
``ParseFromString(payload)``: any generated protobuf message class works.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final, final

from google.protobuf import message as _protobuf

from ._constants import (
    CONTENT_TYPE_PROTO_FIXED,
    DEFAULT_CHUNK_SIZE,
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
)
from ._errors import (
    DesyncError,
    FrameDecodeError,
    FrameEncodeError,
    TruncatedFrameError,
    UnsupportedMessageError,
)
from ._interfaces import ByteReader, Frame, Framing, UnmarshalFunc
from ._registry import register_framing

# Precompiled: one parse of the format, then ``pack``/``unpack_from`` work on
# the buffer in place, without slicing the header out first. Reading, the
# word is unpacked as an integer: one call yields word and length, and an
# int comparison is cheaper than building and comparing a 4-byte string.
_HEADER: Final = struct.Struct("<4sI")
_HEADER_INTS: Final = struct.Struct("<II")
_LENGTH: Final = struct.Struct("<I")
_WORD: Final = FIXED_FRAME_WORD
_WORD_INT: Final[int] = _LENGTH.unpack(FIXED_FRAME_WORD)[0]
_HLEN: Final = FIXED_FRAME_HEADER_LENGTH
_MAX_PAYLOAD: Final = 0xFFFFFFFF
# ``read_frames`` copies frames up to this size out of its buffer, and slices
# larger ones (a ``memoryview``, no copy). Measured: generated messages parse
# ``bytes`` faster than a ``memoryview`` (by more than a small copy costs),
# while copying a large frame would cost more than the parse saves.
_COPY_LIMIT: Final = 4096
# How much a seekable reader is read at a time while skipping a desync run.
_SCAN_CHUNK: Final = 1 << 16


@final
class ProtoFixedFraming:
    """The fixed-header protobuf framing. Registered for
    ``CONTENT_TYPE_PROTO_FIXED``."""

    __slots__ = ()

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE_PROTO_FIXED

    def marshal(self, msg: Any) -> bytes:
        """One frame: header and the protobuf encoding of ``msg``."""
        payload = _serialize(msg)
        return _HEADER.pack(_WORD, len(payload)) + payload

    def unmarshal_frame(self, frame: Frame, msg: Any) -> None:
        """Decode one frame, header included, into ``msg``.

        Raises ``DesyncError`` if ``frame`` does not start with the magic
        word (a run of bytes that ``read_frames`` reports as not a frame).
        """
        parse = _parser_of(msg)
        word, size = _HEADER_INTS.unpack_from(frame) if len(frame) >= _HLEN else (-1, -1)
        if word != _WORD_INT and frame[:4] != _WORD:
            raise DesyncError(data=frame)  # Not a frame: a run of other bytes.
        if size < 0 or size != len(frame) - _HLEN:
            raise FrameDecodeError("fixed frame's length does not match its header", data=frame)
        _parse(parse, msg, frame[_HLEN:], frame)

    def new_unmarshal_func(self, r: ByteReader) -> UnmarshalFunc:
        """Decode one frame of ``r`` per call; see ``Framing.new_unmarshal_func``."""
        offset = 0  # Bytes consumed from ``r``, for errors' ``.offset``.

        def unmarshal(msg: Any) -> None:
            nonlocal offset
            parse = _parser_of(msg)  # A wrong type consumes nothing.
            try:
                frame = unpack_fixed_frame(r)
            except (TruncatedFrameError, DesyncError) as e:
                e.offset = offset
                offset += len(e.data)
                raise
            if not frame:
                raise EOFError("end of input")
            begin = offset
            offset += len(frame)
            try:
                _parse(parse, msg, frame[_HLEN:], frame)
            except FrameDecodeError as e:
                e.offset = begin
                raise

        return unmarshal

    def read_frames(
        self, r: ByteReader, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[tuple[int, int, Frame]]:
        """Every complete frame of ``r``, and every desync run as a frame of
        its own; see ``Framing.read_frames``."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, not {chunk_size}")
        return _read_fixed_frames(r, chunk_size)

    def __repr__(self) -> str:
        return "ProtoFixedFraming()"


# -- encoding ---------------------------------------------------------------


def _serialize(msg: Any) -> bytes:
    serialize = getattr(msg, "SerializeToString", None)
    if serialize is None:
        raise UnsupportedMessageError(
            f"the fixed protobuf framing cannot encode {type(msg).__qualname__}:"
            " it has no SerializeToString() method",
            message_type=type(msg),
        )
    try:
        payload = serialize()
    except _protobuf.EncodeError as e:  # A proto2 message missing a required field.
        raise FrameEncodeError(f"cannot encode {type(msg).__qualname__}: {e}") from e
    if not isinstance(payload, bytes):
        if not isinstance(payload, bytearray | memoryview):
            raise FrameEncodeError(
                f"{type(msg).__qualname__}.SerializeToString() returned"
                f" {type(payload).__qualname__}, not bytes"
            )
        payload = bytes(payload)
    if len(payload) > _MAX_PAYLOAD:
        raise FrameEncodeError(f"payload of {len(payload)} bytes does not fit a fixed frame")
    return payload


def encode_fixed_proto_frame(msg: Any, buf: bytearray | None = None) -> bytearray:
    """Append one fixed frame of ``msg`` (word, 4-byte little-endian length,
    payload) to ``buf``, or to a new ``bytearray``, and return it.

    Appending in place lets a caller batch many frames into one buffer (and
    reuse it after ``buf.clear()``) without a copy per frame.
    """
    payload = _serialize(msg)
    if buf is None:
        buf = bytearray()
    buf += _HEADER.pack(_WORD, len(payload))
    buf += payload
    return buf


# -- decoding ---------------------------------------------------------------

_Parser = Callable[[Any], Any]


def _parser_of(msg: Any) -> _Parser:
    parse = getattr(msg, "ParseFromString", None)
    if parse is None:
        raise UnsupportedMessageError(
            f"the fixed protobuf framing cannot decode into {type(msg).__qualname__}:"
            " it has no ParseFromString() method",
            message_type=type(msg),
        )
    return parse  # type: ignore[no-any-return]


def _parse(parse: _Parser, msg: Any, payload: Frame, frame: Frame) -> None:
    if type(payload) is memoryview and not isinstance(msg, _protobuf.Message):
        # Generated messages parse a memoryview in place; anything else is
        # promised ``bytes``.
        payload = bytes(payload)
    try:
        parse(payload)
    except _protobuf.DecodeError as e:
        raise FrameDecodeError(f"invalid protobuf payload: {e}", data=frame) from e
    # Anything else a user's ParseFromString raises is theirs: it propagates.


# -- unpack_fixed_frame -----------------------------------------------------
#
# ``unpack_fixed_frame`` must not consume bytes past the frame (or past the
# desync run) it returns: the next call starts there. Finding where a desync
# run ends means looking at the magic word that follows it, so the word must
# then be "given back": by not consuming it in the first place (``peek``), by
# seeking back (``seek``), or, for a plain reader that can do neither, by
# holding it here until the next call for the same reader.

# id(reader) -> (reader or a weak reference to it, bytes given back).
_held: dict[int, tuple[Any, bytes]] = {}


def _hold(r: Any, data: bytes | bytearray) -> None:
    key = id(r)
    try:
        ref: Any = weakref.ref(r, lambda dead: _forget(key, dead))
    except TypeError:
        ref = r  # Not weak-referenceable: hold the reader until its next call.
    _held[key] = (ref, bytes(data))


def _forget(key: int, ref: Any) -> None:
    entry = _held.get(key)
    if entry is not None and entry[0] is ref:
        del _held[key]


def _take_held(r: Any) -> bytes:
    entry = _held.get(id(r))
    if entry is None:
        return b""
    ref, data = entry
    if (ref() if isinstance(ref, weakref.ref) else ref) is not r:
        return b""
    del _held[id(r)]
    return data


def _take(r: Any, n: int) -> bytes:
    """Up to ``n`` bytes of ``r``, fewer only at the end of the input."""
    got = _take_held(r) if _held else b""
    if len(got) >= n:
        if len(got) > n:
            _hold(r, got[n:])
        return got[:n]
    parts = [got] if got else []
    have = len(got)
    read = r.read
    while have < n:
        part = read(n - have)
        if not part:
            break
        parts.append(part)
        have += len(part)
    if len(parts) == 1 and type(parts[0]) is bytes:
        return parts[0]
    return b"".join(parts)


def _give_back(r: Any, data: bytes | bytearray) -> None:
    if not data:
        return
    seekable = getattr(r, "seekable", None)
    if seekable is not None and seekable():
        try:
            r.seek(-len(data), 1)
        except (OSError, ValueError):
            pass
        else:
            return
    _hold(r, data)


def unpack_fixed_frame(r: ByteReader) -> bytes:
    """The next fixed frame of ``r``, header included.

    Returns ``b""`` at a clean end of input (a single trailing ``\\n``
    included). Raises ``TruncatedFrameError`` (with ``.data``, consumed) if
    the input ends inside a frame or its header. If the magic word is not at
    the current position, skips the bytes up to the next magic word (or to
    the end of the input) and raises ``DesyncError`` with ``.data`` = those
    bytes; the next call reads the frame that follows.

    Reads no further than the frame it returns. With ``peek`` (an
    ``io.BufferedReader``) a frame is checked in the reader's buffer and read
    with one call; readers without ``peek`` work too.
    """
    if not (_held and id(r) in _held):
        peek = getattr(r, "peek", None)
        if peek is not None:
            head = peek(_HLEN)
            if len(head) >= _HLEN and head[:4] == _WORD:
                size = _HLEN + _LENGTH.unpack_from(head, 4)[0]
                frame = _take(r, size)
                if len(frame) < size:
                    raise TruncatedFrameError(data=frame)
                return frame
    header = _take(r, _HLEN)
    if len(header) < _HLEN:
        if not header or header == b"\n":
            return b""
        raise TruncatedFrameError(data=header)
    if header.startswith(_WORD):
        size = _LENGTH.unpack_from(header, 4)[0]
        payload = _take(r, size)
        frame = header + payload
        if len(payload) < size:
            raise TruncatedFrameError(data=frame)
        return frame
    raise _skip_desync_run(r, bytearray(header))


def _partial_word_suffix(run: bytes | bytearray) -> int:
    """Length of the longest end of ``run`` that begins the magic word."""
    for k in (3, 2, 1):
        if run.endswith(_WORD[:k]):
            return k
    return 0


def _skip_desync_run(r: Any, run: bytearray) -> DesyncError:
    """Consume a desync run that starts with ``run`` (already consumed, and
    not starting with the magic word) and return its ``DesyncError``."""
    at = run.find(_WORD, 1)
    peek = getattr(r, "peek", None)
    seekable = getattr(r, "seekable", None)
    scan_seekable = seekable is not None and peek is None and seekable()
    while at < 0:
        # The word may begin in the last 3 bytes of ``run`` at the earliest.
        start = max(1, len(run) - 3)
        if peek is not None:
            # Look for the word in the reader's buffer and consume exactly
            # the bytes before it: nothing to give back, unless the word
            # straddles ``run`` and the buffer.
            avail = peek(1)
            if not avail:
                break
            found = (bytes(run[start:]) + avail).find(_WORD)
            if found >= 0:
                at = start + found
                if at > len(run):
                    run += _take(r, at - len(run))
                break
            run += _take(r, len(avail))
        elif scan_seekable:
            more = r.read(_SCAN_CHUNK)
            if not more:
                break
            run += more
            at = run.find(_WORD, start)
        else:
            # A plain reader: read no further than the end of the earliest
            # magic word that could follow, which is what must be given back.
            more = r.read(4 - _partial_word_suffix(run))
            if not more:
                break
            run += more
            at = run.find(_WORD, start)
    if at < 0:
        # The run goes on to the end of the input. Its last bytes may be the
        # start of a frame still being written (a magic word cut short): as
        # Gazette's UnpackFixedFrame, keep them for the next call, which then
        # reads that frame if it has arrived, or reports a truncation.
        at = len(run) - _partial_word_suffix(run)
        if at == len(run):
            return DesyncError(data=run)
    _give_back(r, run[at:])
    return DesyncError(data=run[:at])


# -- read_frames --------------------------------------------------------------


def _read_fixed_frames(r: ByteReader, chunk_size: int) -> Iterator[tuple[int, int, Frame]]:
    read = r.read
    unpack_header = _HEADER_INTS.unpack_from
    buf = b""  # Unparsed bytes; ``buf[0]`` is at offset ``base``.
    base = 0
    # While a desync run starts at ``buf[0]``: where to resume looking for
    # the word, so that a long run is scanned once, not once per chunk.
    scan = 1
    while True:
        # Parse every complete frame out of ``buf``; ``need`` is the length
        # ``buf`` must reach before the next frame can be decided.
        mv = memoryview(buf)
        n = len(buf)
        pos = 0
        while True:
            if n - pos < _HLEN:
                need = pos + _HLEN
                break
            word, size = unpack_header(buf, pos)
            if word == _WORD_INT:
                end = pos + _HLEN + size
                if end > n:
                    need = end
                    break
                yield base + pos, base + end, buf[pos:end] if size <= _COPY_LIMIT else mv[pos:end]
                pos = end
                scan = 1
            else:
                at = buf.find(_WORD, pos + scan)
                if at < 0:
                    scan = max(1, n - pos - 3)
                    need = n + 1
                    break
                yield base + pos, base + at, mv[pos:at]
                pos = at
                scan = 1

        # Read until ``need`` is reached, collecting chunks in a list that is
        # joined once: a frame spanning many chunks is copied once.
        parts = [buf[pos:]] if pos < n else []
        have = n - pos
        want = need - pos
        eof = False
        while have < want:
            chunk = read(chunk_size)
            if not chunk:
                eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        base += pos
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        if type(buf) is not bytes:
            buf = bytes(buf)
        if eof:
            break

    # End of input: what is left cannot hold a complete frame.
    if not buf or buf == b"\n":
        return
    if len(buf) >= _HLEN and not buf.startswith(_WORD):
        # A desync run (known to hold no magic word) up to the end, but for
        # a partial magic word at its very end: that may begin a frame still
        # being appended, and is reported as a truncated frame, so that a
        # reader resuming at its offset reads the frame (as unpack_fixed_frame).
        keep = _partial_word_suffix(buf)
        yield base, base + len(buf) - keep, buf[: len(buf) - keep]
        if not keep:
            return
        base, buf = base + len(buf) - keep, buf[len(buf) - keep :]
    raise TruncatedFrameError(data=buf, offset=base)


# Typed as the protocol it implements, so that mypy checks it does.
_FRAMING: Framing = ProtoFixedFraming()
register_framing(_FRAMING)
