"""Constants of the wire formats: content types and the fixed-frame header."""

from __future__ import annotations

from typing import Final

#: Content type of the CSV framing (RFC 4180 records, ``\n`` line ends).
CONTENT_TYPE_CSV: Final = "text/csv"
#: Content type of the NDJSON framing (one JSON document per line).
CONTENT_TYPE_JSON_LINES: Final = "application/x-ndjson"
#: Content type of the fixed-header protobuf framing.
CONTENT_TYPE_PROTO_FIXED: Final = "application/x-protobuf-fixed"

#: The magic word that begins every fixed frame. Readers look for it to detect
#: and recover from a de-synchronisation (bytes that are not a frame).
FIXED_FRAME_WORD: Final = b"\x66\x33\x93\x36"
#: Length of a fixed frame's header: the magic word, then a 4-byte
#: little-endian unsigned payload length.
FIXED_FRAME_HEADER_LENGTH: Final = 8

#: Read size of the bulk path (``Framing.read_frames``): large enough that a
#: read's fixed cost is spread over thousands of small frames.
DEFAULT_CHUNK_SIZE: Final = 1 << 20
