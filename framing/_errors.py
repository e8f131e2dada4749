"""Errors raised by the framing package, one tree with one root::

    FramingError
     ├── UnknownContentTypeError  (ValueError)  no framing registered for a content type
     ├── UnsupportedMessageError  (TypeError)   a framing cannot encode or decode this type
     ├── FrameEncodeError         (ValueError)  a message whose content cannot be encoded
     ├── FrameDecodeError         (ValueError)  a complete frame whose content cannot be decoded
     ├── TruncatedFrameError                    the input ended inside a frame
     └── DesyncError                            bytes that are not a frame (fixed framing)

Catch at any level: ``FramingError`` for everything, or one leaf. The last
three describe bytes read from an input and carry them: ``.data`` is the
frame (or the partial frame, or the bytes that were skipped) and ``.offset``
its position relative to where reading started, when the reader knows it.

Decoders raise nothing but ``EOFError`` (a clean end of input, on a frame
boundary) and these errors. The one exception is a message's own hook
(``unmarshal_json``, ``unmarshal_csv``, ``ParseFromString`` of a class that is
not generated protobuf code): what it raises propagates unchanged, since it
is the caller's own error to handle.
"""

from __future__ import annotations


class FramingError(Exception):
    """Base class of every error raised by the framing package."""


class UnknownContentTypeError(FramingError, ValueError):
    """No framing is registered for a content type.

    ``str(err)`` is exactly ``unrecognized content-type (<content_type>)``.
    """

    def __init__(self, content_type: str) -> None:
        # ``args`` holds the content type alone, so that the error pickles and
        # unpickles (Spark ships errors between processes) without its message
        # being wrapped twice.
        super().__init__(content_type)
        self.content_type = content_type

    def __str__(self) -> str:
        return f"unrecognized content-type ({self.content_type})"


class UnsupportedMessageError(FramingError, TypeError):
    """A framing cannot encode or decode messages of this type: it has none
    of the hooks the framing looks for, nor a type the framing handles itself.
    """

    def __init__(self, reason: str, *, message_type: type | None = None) -> None:
        super().__init__(reason)
        self.message_type = message_type


class FrameEncodeError(FramingError, ValueError):
    """A message's content cannot be encoded: a value the encoder rejects, a
    hook that returned the wrong type, or a document that would break the
    framing (an NDJSON document with a newline in it). The encoder's own
    exception, if any, is chained as ``__cause__``."""


class _FrameDataError(FramingError):
    """Shared shape of the errors that carry the bytes they are about."""

    def __init__(
        self,
        reason: str = "",
        *,
        data: bytes | bytearray | memoryview = b"",
        offset: int | None = None,
    ) -> None:
        # ``args`` is ``(reason,)`` and the rest lives in ``__dict__``, which is
        # what ``BaseException.__reduce__`` pickles: errors survive pickling.
        super().__init__(reason)
        self.reason = reason
        # Always ``bytes``: a memoryview would pin a whole read buffer for as
        # long as the error lives.
        self.data = bytes(data)
        self.offset = offset

    def __str__(self) -> str:
        where = f" at offset {self.offset}" if self.offset is not None else ""
        # A reader of a journal names it (``journal``, set where it is known).
        journal = getattr(self, "journal", None)
        if journal:
            where += f" of journal {journal}"
        return f"{self.reason} ({len(self.data)} bytes{where})"


class TruncatedFrameError(_FrameDataError):
    """The input ended inside a frame. ``.data`` holds the partial frame, whose
    bytes have been consumed from the reader; ``.offset`` is where it began."""

    def __init__(
        self,
        reason: str = "input ended inside a frame",
        *,
        data: bytes | bytearray | memoryview = b"",
        offset: int | None = None,
    ) -> None:
        super().__init__(reason, data=data, offset=offset)


class DesyncError(_FrameDataError):
    """Bytes that do not begin with the fixed frame word were found where a
    frame should begin. ``.data`` holds the bytes that were skipped: all of
    them up to the next magic word, or to the end of the input. Reading may
    continue with the next frame."""

    def __init__(
        self,
        reason: str = "detected de-synchronization",
        *,
        data: bytes | bytearray | memoryview = b"",
        offset: int | None = None,
    ) -> None:
        super().__init__(reason, data=data, offset=offset)


class FrameDecodeError(_FrameDataError, ValueError):
    """A complete frame whose content cannot be decoded: invalid JSON, CSV or
    protobuf, or a document of the wrong shape for the message. The frame has
    been consumed, so reading may continue with the next one. The decoder's
    own exception, if any, is chained as ``__cause__``."""
