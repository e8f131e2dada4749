"""Byte framings: how messages are laid out in a journal's bytes.

A journal's ``content-type`` label names its framing, and the framing turns a
message into one frame of bytes and back. Three are built in and registered
when this package is imported:

- ``text/csv`` (``CONTENT_TYPE_CSV``): one RFC 4180 record per frame, through
  the message's ``marshal_csv()`` / ``unmarshal_csv(fields)`` hooks.
- ``application/x-ndjson`` (``CONTENT_TYPE_JSON_LINES``): one JSON document
  per line, through ``marshal_json()`` / ``unmarshal_json(data)``, or orjson
  for dicts and dataclasses.
- ``application/x-protobuf-fixed`` (``CONTENT_TYPE_PROTO_FIXED``): a magic
  word, a little-endian length and a protobuf payload.

A tour, one step at a time.

Look a framing up by content type::

    >>> from framing import framing_by_content_type
    >>> f = framing_by_content_type("application/x-ndjson")

Encode a message as one frame::

    >>> f.marshal({"id": 1, "text": "hello"})
    b'{"id":1,"text":"hello"}\\n'

Decode frames one at a time from a reader, reading no further than each
frame (``EOFError`` marks a clean end)::

    >>> import io
    >>> unmarshal = f.new_unmarshal_func(io.BytesIO(b'{"id":1}\\n{"id":2}\\n'))
    >>> msg = {}
    >>> unmarshal(msg); msg
    {'id': 1}

Or take the bulk path, which reads large chunks and finds the frames inside
them, with their offsets::

    >>> r = io.BytesIO(b'{"id":1}\\n{"id":2}\\n')
    >>> for begin, end, frame in f.read_frames(r):
    ...     f.unmarshal_frame(frame, msg)
    ...     print(begin, end, msg)
    0 9 {'id': 1}
    9 18 {'id': 2}

Errors form one tree under ``FramingError`` (drawn in ``docs/framing.md``).
Add a framing of your own with ``register_framing``; ``framing.testing``
holds the conformance check that every framing passes.
"""

from ._constants import CONTENT_TYPE_CSV as CONTENT_TYPE_CSV
from ._constants import CONTENT_TYPE_JSON_LINES as CONTENT_TYPE_JSON_LINES
from ._constants import CONTENT_TYPE_PROTO_FIXED as CONTENT_TYPE_PROTO_FIXED
from ._constants import DEFAULT_CHUNK_SIZE as DEFAULT_CHUNK_SIZE
from ._constants import FIXED_FRAME_HEADER_LENGTH as FIXED_FRAME_HEADER_LENGTH
from ._constants import FIXED_FRAME_WORD as FIXED_FRAME_WORD
from ._csv import CSVFraming as CSVFraming
from ._errors import DesyncError as DesyncError
from ._errors import FrameDecodeError as FrameDecodeError
from ._errors import FrameEncodeError as FrameEncodeError
from ._errors import FramingError as FramingError
from ._errors import TruncatedFrameError as TruncatedFrameError
from ._errors import UnknownContentTypeError as UnknownContentTypeError
from ._errors import UnsupportedMessageError as UnsupportedMessageError
from ._fixed import ProtoFixedFraming as ProtoFixedFraming
from ._fixed import encode_fixed_proto_frame as encode_fixed_proto_frame
from ._fixed import unpack_fixed_frame as unpack_fixed_frame
from ._interfaces import BatchFraming as BatchFraming
from ._interfaces import ByteReader as ByteReader
from ._interfaces import Frame as Frame
from ._interfaces import Framing as Framing
from ._interfaces import PlainJsonFraming as PlainJsonFraming
from ._interfaces import UnmarshalFunc as UnmarshalFunc
from ._json import JSONLinesFraming as JSONLinesFraming
from ._lines import NEWLINE as NEWLINE
from ._lines import line_ends as line_ends
from ._lines import unpack_line as unpack_line
from ._lines import whole_lines_end as whole_lines_end
from ._registry import framing_by_content_type as framing_by_content_type
from ._registry import register_framing as register_framing
from ._registry import registered_content_types as registered_content_types

__all__ = [
    # Content types and wire constants.
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTO_FIXED",
    "FIXED_FRAME_WORD",
    "FIXED_FRAME_HEADER_LENGTH",
    "DEFAULT_CHUNK_SIZE",
    # The contract, and the registry.
    "Framing",
    "BatchFraming",
    "PlainJsonFraming",
    "ByteReader",
    "Frame",
    "UnmarshalFunc",
    "register_framing",
    "framing_by_content_type",
    "registered_content_types",
    # The built-in framings.
    "CSVFraming",
    "JSONLinesFraming",
    "ProtoFixedFraming",
    # Per-frame helpers.
    "unpack_line",
    "NEWLINE",
    "line_ends",
    "whole_lines_end",
    "unpack_fixed_frame",
    "encode_fixed_proto_frame",
    # Errors.
    "FramingError",
    "UnknownContentTypeError",
    "UnsupportedMessageError",
    "FrameEncodeError",
    "FrameDecodeError",
    "TruncatedFrameError",
    "DesyncError",
]
