"""Message types and readers shared by the framing tests (their hypothesis
strategies are in tests/strategies.py).

Each built-in framing gets a few message shapes: NDJSON dicts, dataclasses
and hook classes; CSV records (lists, hook classes); protobuf messages and a
raw-payload stand-in that mirrors Gazette's ``frameablestring``.
"""

from __future__ import annotations

import dataclasses
import io
import uuid
from collections.abc import Callable
from typing import Any

from google.protobuf import struct_pb2

import framing

NDJSON = framing.framing_by_content_type(framing.CONTENT_TYPE_JSON_LINES)
CSV = framing.framing_by_content_type(framing.CONTENT_TYPE_CSV)
FIXED = framing.framing_by_content_type(framing.CONTENT_TYPE_PROTO_FIXED)
BUILT_INS = {"ndjson": NDJSON, "csv": CSV, "fixed": FIXED}


NIL = uuid.UUID(int=0)


@dataclasses.dataclass
class Event:
    """A dataclass message: a UUID, scalars and a list."""

    uuid: uuid.UUID = NIL
    kind: str = ""
    n: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)
    parent: uuid.UUID | None = None


class Greeting:
    """An NDJSON message with its own hooks (Gazette's ``TestStruct``)."""

    def __init__(self, a: str = "", b: int = 0) -> None:
        self.a, self.b = a, b

    def marshal_json(self) -> bytes:
        return f'{{"a": "{self.a}", "b": {self.b}}}'.encode()

    def unmarshal_json(self, data: bytes) -> None:
        import json

        doc = json.loads(data)
        self.a, self.b = doc["a"], doc["b"]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Greeting) and (self.a, self.b) == (other.a, other.b)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Greeting({self.a!r}, {self.b!r})"


class Row:
    """A CSV message with its own hooks."""

    def __init__(self, *fields: str) -> None:
        self.fields = list(fields)

    def marshal_csv(self) -> list[str]:
        return self.fields

    def unmarshal_csv(self, fields: list[str]) -> None:
        self.fields = list(fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Row) and self.fields == other.fields

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Row{tuple(self.fields)!r}"


class RawPayload:
    """Stands in for a protobuf message whose encoding is its text (Gazette's
    ``frameablestring``): the fixture bytes stay readable."""

    def __init__(self, s: str = "") -> None:
        self.s = s

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf method name.
        return self.s.encode()

    def ParseFromString(self, b: bytes) -> None:  # noqa: N802 - the protobuf method name.
        self.s = b.decode()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawPayload) and self.s == other.s

    __hash__ = None  # type: ignore[assignment]


class ReadOnly:
    """A reader with nothing but ``read``, over a ``BytesIO`` (so tests can
    look at its position); ``max_read`` caps each read, like a socket."""

    def __init__(self, data: bytes, max_read: int = 1 << 30) -> None:
        self._bio = io.BytesIO(data)
        self._max = max_read

    def read(self, n: int = -1) -> bytes:
        return self._bio.read(self._max if n < 0 else min(n, self._max))

    def tell(self) -> int:
        return self._bio.tell()


class NonSeekableRaw(io.RawIOBase):
    """A raw stream that cannot seek, like a pipe: an ``io.BufferedReader``
    over it has ``peek`` but no way back."""

    def __init__(self, data: bytes, max_read: int = 1 << 30) -> None:
        self._bio = io.BytesIO(data)
        self._max = max_read

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        chunk = self._bio.read(min(len(b), self._max))
        b[: len(chunk)] = chunk
        return len(chunk)


# A reader factory per kind the framings must handle.
READERS: dict[str, Callable[[bytes], Any]] = {
    "bytesio": io.BytesIO,
    "buffered16": lambda d: io.BufferedReader(io.BytesIO(d), buffer_size=16),
    "pipe16": lambda d: io.BufferedReader(NonSeekableRaw(d, 5), buffer_size=16),
    "readonly": ReadOnly,
    "readonly3": lambda d: ReadOnly(d, 3),
}


# What each built-in framing decodes into by default.
NEW_MESSAGE: dict[str, Callable[[], Any]] = {
    "ndjson": dict,
    "csv": list,
    "fixed": struct_pb2.Value,
}
