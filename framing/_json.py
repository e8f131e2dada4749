"""The NDJSON framing (``application/x-ndjson``): one JSON document per line.

Wire layout of a frame::

    +-------------------------------------------+------+
    | JSON document, UTF-8, without a raw 0x0a  | 0x0a |
    +-------------------------------------------+------+

A message is encoded, in order of preference, by its own hooks
(``marshal_json() -> bytes`` and ``unmarshal_json(data: bytes)``, where
``data`` is the document without its newline), or with ``orjson`` when it is
a ``dict`` (decoding clears it and fills it with the document's keys) or a
dataclass instance (fields typed ``uuid.UUID`` round-trip; keys that name no
field are ignored; fields the document lacks keep their value).
"""

from __future__ import annotations

import dataclasses
import types
import typing
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final, final

import orjson

from ._constants import CONTENT_TYPE_JSON_LINES, DEFAULT_CHUNK_SIZE
from ._errors import (
    FrameDecodeError,
    FrameEncodeError,
    TruncatedFrameError,
    UnsupportedMessageError,
)
from ._interfaces import ByteReader, Frame, PlainJsonFraming, UnmarshalFunc
from ._lines import line_batches, read_lines, unpack_line
from ._registry import register_framing

# Module-level aliases: one global lookup instead of an attribute lookup on
# the hot path of every frame.
_loads: Final = orjson.loads
_dumps: Final = orjson.dumps
_JSONDecodeError: Final = orjson.JSONDecodeError
_JSONEncodeError: Final = orjson.JSONEncodeError

_Encoder = Callable[[Any], bytes]
_Decoder = Callable[[Frame, Any], None]


@final
class JSONLinesFraming:
    """The NDJSON framing. Registered for ``CONTENT_TYPE_JSON_LINES``."""

    __slots__ = ()

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE_JSON_LINES

    @property
    def newline_delimited(self) -> bool:
        """Every frame is one line; see ``PlainJsonFraming``."""
        return True

    def marshal(self, msg: Any) -> bytes:
        """One frame: the JSON document of ``msg`` and a newline."""
        if type(msg) in _orjson_dicts:
            # Inlined _encode_with_orjson: dicts and hook-less dict subclasses
            # are most messages, and the call shows per frame.
            try:
                return _dumps(msg) + b"\n"
            except _JSONEncodeError as e:
                raise FrameEncodeError(
                    f"cannot encode {type(msg).__qualname__} as JSON: {e}"
                ) from e
        return _encoder_for(type(msg))(msg)

    def unmarshal_frame(self, frame: Frame, msg: Any) -> None:
        """Decode one line (with or without its newline) into ``msg``."""
        # The plain-dict case is inlined (dicts, and dict subclasses that keep
        # dict's own update/clear and have no hooks, such as a document type
        # carrying its UUID): it is the common one, and a call less per frame
        # shows in the throughput.
        if type(msg) in _plain_dicts:
            try:
                doc = _loads(frame)
            except _JSONDecodeError as e:
                raise FrameDecodeError(f"invalid JSON: {e}", data=frame) from e
            if type(doc) is not dict:
                raise _not_an_object(frame, doc)
            if msg:
                msg.clear()
            # ``|=`` rather than ``.update``: an operator, not a method call,
            # and measurably cheaper per frame.
            msg |= doc
            return
        _decoder_for(type(msg))(frame, msg)

    def new_unmarshal_func(self, r: ByteReader) -> UnmarshalFunc:
        """Decode one line of ``r`` per call; see ``Framing.new_unmarshal_func``."""
        offset = 0  # Bytes consumed from ``r`` so far, for errors' ``.offset``.

        def unmarshal(msg: Any) -> None:
            nonlocal offset
            # Check the message first, so that a wrong type consumes nothing.
            decode = _decode_into_plain_dict if type(msg) is dict else _decoder_for(type(msg))
            try:
                line = unpack_line(r)
            except TruncatedFrameError as e:
                e.offset = offset
                offset += len(e.data)
                raise
            if not line:
                raise EOFError("end of input")
            begin = offset
            offset += len(line)
            try:
                decode(line, msg)
            except FrameDecodeError as e:
                e.offset = begin
                raise

        return unmarshal

    def read_frames(
        self, r: ByteReader, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[tuple[int, int, Frame]]:
        """Every complete line of ``r``; see ``Framing.read_frames``."""
        return read_lines(r, chunk_size)

    def read_frame_batches(
        self, r: ByteReader, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[tuple[int, list[bytes]]]:
        """Every complete line of ``r``, by chunk; see ``BatchFraming``."""
        return line_batches(r, chunk_size)

    def plain_dumps(self) -> tuple[Callable[[Any], bytes], set[type]]:
        """See ``PlainJsonFraming.plain_dumps``."""
        return _dumps, _orjson_dicts

    def plain_json(self) -> tuple[Callable[[Frame], Any], set[type]]:
        """See ``PlainJsonFraming.plain_json``."""
        return _loads, _plain_dicts

    def __repr__(self) -> str:
        return "JSONLinesFraming()"


# -- encoders ---------------------------------------------------------------


def _encode_with_orjson(msg: Any) -> bytes:
    try:
        # Not ``option=OPT_APPEND_NEWLINE``: orjson returns its own oversized
        # output buffer, shrunk, and frames that are kept (a publisher holds
        # them until appended) then fragment the heap: measured 3-5 times
        # slower over 300k messages. The concatenation makes a compact copy
        # and frees orjson's buffer at once, for ~30 ns a frame.
        return _dumps(msg) + b"\n"
    except _JSONEncodeError as e:
        raise FrameEncodeError(f"cannot encode {type(msg).__qualname__} as JSON: {e}") from e


def _encode_with_hook(msg: Any) -> bytes:
    doc = msg.marshal_json()
    if isinstance(doc, str):
        doc = doc.encode()
    elif isinstance(doc, bytearray | memoryview):
        doc = bytes(doc)
    elif not isinstance(doc, bytes):
        raise FrameEncodeError(
            f"{type(msg).__qualname__}.marshal_json() returned {type(doc).__qualname__}, not bytes"
        )
    # The hook returns the document without its newline; one is tolerated.
    if doc.endswith(b"\n"):
        doc = doc[:-1]
    if b"\n" in doc:
        # A raw newline would split the document over two frames and
        # corrupt the journal for every reader.
        raise FrameEncodeError(
            f"{type(msg).__qualname__}.marshal_json() returned a document with a raw newline"
        )
    if not doc or doc.isspace():
        raise FrameEncodeError(f"{type(msg).__qualname__}.marshal_json() returned no document")
    return doc + b"\n"


# Per-type caches of the encoder and decoder to use, so that the hooks are
# looked up once per type, not per message. Message types are few and
# long-lived; a race between threads only computes an entry twice. Types the
# framing cannot handle raise, and are not cached.
_encoders: dict[type, _Encoder] = {}
_decoders: dict[type, _Decoder] = {}


# Types that marshal encodes inline with orjson: dict, and the hook-less dict
# subclasses _encoder_for has seen.
_orjson_dicts: set[type] = {dict}


def _encoder_for(cls: type) -> _Encoder:
    try:
        return _encoders[cls]
    except KeyError:
        pass
    encoder: _Encoder
    if callable(getattr(cls, "marshal_json", None)):
        encoder = _encode_with_hook
    elif issubclass(cls, dict) or dataclasses.is_dataclass(cls):
        encoder = _encode_with_orjson
        if issubclass(cls, dict):
            _orjson_dicts.add(cls)
    else:
        raise UnsupportedMessageError(
            f"the NDJSON framing cannot encode {cls.__qualname__}: it is not a dict"
            " or a dataclass, and has no marshal_json() method",
            message_type=cls,
        )
    _encoders[cls] = encoder
    return encoder


# -- decoders ---------------------------------------------------------------


def _document(frame: Frame) -> bytes:
    """A frame's document, without the newline the framing added."""
    if frame[-1:] == b"\n":
        frame = frame[:-1]
    return frame if type(frame) is bytes else bytes(frame)


def _load_object(frame: Frame) -> dict[str, Any]:
    try:
        doc = _loads(frame)
    except _JSONDecodeError as e:
        raise FrameDecodeError(f"invalid JSON: {e}", data=frame) from e
    if type(doc) is not dict:
        raise _not_an_object(frame, doc)
    return doc


def _not_an_object(frame: Frame, doc: object) -> FrameDecodeError:
    kind = "null" if doc is None else type(doc).__qualname__
    return FrameDecodeError(f"expected a JSON object, not {kind}", data=frame)


def _decode_into_plain_dict(frame: Frame, msg: Any) -> None:
    doc = _load_object(frame)
    if msg:
        msg.clear()
    msg |= doc


def _decode_into_dict(frame: Frame, msg: Any) -> None:
    doc = _load_object(frame)
    msg.clear()
    msg.update(doc)


def _decode_with_hook(frame: Frame, msg: Any) -> None:
    # What the hook raises is the caller's own: it propagates unchanged.
    msg.unmarshal_json(_document(frame))


def _is_uuid_type(hint: object) -> bool:
    """Whether a field annotation is ``uuid.UUID``, possibly optional."""
    if hint is uuid.UUID:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return uuid.UUID in typing.get_args(hint)
    if isinstance(hint, str):
        # An annotation that could not be evaluated: read its text, e.g.
        # "uuid.UUID", "UUID | None" or "Optional[UUID]".
        text = hint.replace(" ", "").replace("typing.", "")
        if text.startswith("Optional[") and text.endswith("]"):
            text = text[len("Optional[") : -1]
        parts = set(text.split("|"))
        return bool(parts & _UUID_NAMES) and parts <= _UUID_NAMES | {"None"}
    return False


_UUID_NAMES: Final = frozenset({"uuid.UUID", "UUID"})


def _dataclass_decoder(cls: type) -> _Decoder:
    params = getattr(cls, "__dataclass_params__", None)
    if params is not None and params.frozen:
        raise _unsupported(cls, "it is a frozen dataclass")
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        # Annotations that cannot be evaluated (a name defined later, a typo)
        # raise all sorts of errors; fall back to the raw annotations.
        hints = {}
    # Per field: its name, and whether a string must become a ``uuid.UUID``.
    # Computed once per class; the per-frame loop only reads this tuple.
    fields = tuple(
        (f.name, _is_uuid_type(hints.get(f.name, f.type))) for f in dataclasses.fields(cls)
    )

    def decode(frame: Frame, msg: Any) -> None:
        doc = _load_object(frame)
        # Convert everything first, so that a bad value leaves ``msg`` as it was.
        values: list[tuple[str, Any]] = []
        for name, is_uuid in fields:
            if name not in doc:
                continue
            value = doc[name]
            if is_uuid and value is not None:
                try:
                    value = uuid.UUID(value)
                except (TypeError, ValueError, AttributeError) as e:
                    raise FrameDecodeError(
                        f"field {name!r} of {cls.__qualname__} is not a UUID: {value!r}",
                        data=frame,
                    ) from e
            values.append((name, value))
        for name, value in values:
            setattr(msg, name, value)

    return decode


def _unsupported(cls: type, why: str) -> UnsupportedMessageError:
    return UnsupportedMessageError(
        f"the NDJSON framing cannot decode into {cls.__qualname__}: {why}", message_type=cls
    )


# Types whose frames unmarshal_frame decodes inline: dict, and the dict
# subclasses _decoder_for found to behave as dict (added as they are seen).
_plain_dicts: set[type] = {dict}


def _decoder_for(cls: type) -> _Decoder:
    try:
        return _decoders[cls]
    except KeyError:
        pass
    decoder: _Decoder
    if callable(getattr(cls, "unmarshal_json", None)):
        decoder = _decode_with_hook
    elif cls is dict:
        decoder = _decode_into_plain_dict
    elif issubclass(cls, dict) and all(
        getattr(cls, m) is getattr(dict, m) for m in ("update", "clear", "__ior__")
    ):
        decoder = _decode_into_plain_dict
        _plain_dicts.add(cls)
    elif issubclass(cls, dict):
        decoder = _decode_into_dict
    elif dataclasses.is_dataclass(cls):
        decoder = _dataclass_decoder(cls)
    else:
        raise _unsupported(
            cls, "it is not a dict or a dataclass, and has no unmarshal_json() method"
        )
    _decoders[cls] = decoder
    return decoder


# Typed as the protocol it implements, so that mypy checks it does.
_FRAMING: PlainJsonFraming = JSONLinesFraming()
register_framing(_FRAMING)
