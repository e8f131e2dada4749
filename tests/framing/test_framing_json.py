"""The NDJSON framing: Gazette's json_framing_test.go ported, then dicts,
dataclasses, hooks and their errors."""

from __future__ import annotations

import dataclasses
import io
import uuid
from typing import Any, Optional

import orjson
import pytest
from hypothesis import given, settings

from framing import (
    FrameDecodeError,
    FrameEncodeError,
    TruncatedFrameError,
    UnsupportedMessageError,
)
from tests.framing.support import NDJSON, READERS, Event, Greeting
from tests.strategies import events, json_documents

U1 = uuid.UUID("9f2ba8e4-2f6d-11ef-8000-0b1a2c3d4e5f")
U2 = uuid.UUID("00000000-0000-1000-8000-000000000001")


@dataclasses.dataclass
class AB:
    A: int = 0
    B: str = ""


@dataclasses.dataclass
class OnlyB:
    B: str = ""


# -- Gazette's json_framing_test.go -------------------------------------------


def test_marshal_with_fixtures() -> None:
    """Documents are compact JSON, one per line (TestJSONFramingMarshalWithFixtures)."""
    buf = NDJSON.marshal(AB(42, "the answer"))
    assert buf == b'{"A":42,"B":"the answer"}\n'
    buf += NDJSON.marshal({"Bar": 63})
    assert buf == b'{"A":42,"B":"the answer"}\n{"Bar":63}\n'


def test_marshal_error() -> None:
    """An unencodable value raises FrameEncodeError chained to orjson's error
    (TestJSONFramingMarshalError)."""
    with pytest.raises(FrameEncodeError, match="cannot encode dict as JSON") as info:
        NDJSON.marshal({"Unencodable": object()})
    assert isinstance(info.value.__cause__, orjson.JSONEncodeError)
    with pytest.raises(FrameEncodeError):
        NDJSON.marshal({1: "non-str key"})


@pytest.mark.parametrize("kind", sorted(READERS))
def test_decode_with_fixture(kind: str) -> None:
    """A document decodes into the fields it names, then EOF on the boundary
    (TestJSONFramingDecodeWithFixture)."""
    unmarshal = NDJSON.new_unmarshal_func(READERS[kind](b'{"A":42,"B":"test message content"}\n'))
    msg = OnlyB()
    unmarshal(msg)
    assert msg.B == "test message content"
    with pytest.raises(EOFError):
        unmarshal(msg)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_unexpected_eof(kind: str) -> None:
    """A document without its newline is a truncated frame (TestJSONFramingUnexpectedEOF)."""
    fixture = b'{"A":42,"B":"missing trailing newline"}'
    unmarshal = NDJSON.new_unmarshal_func(READERS[kind](fixture))
    with pytest.raises(TruncatedFrameError) as info:
        unmarshal(OnlyB())
    assert info.value.data == fixture
    assert info.value.offset == 0


@pytest.mark.parametrize("kind", sorted(READERS))
def test_message_decode_error(kind: str) -> None:
    """Invalid JSON raises FrameDecodeError and consumes exactly its line
    (TestJSONFramingMessageDecodeError)."""
    line = b'{"A":42,"B":"missing quote but including newline}\n'
    r = READERS[kind](line + b"extra")
    with pytest.raises(FrameDecodeError, match="invalid JSON") as info:
        NDJSON.new_unmarshal_func(r)({})
    assert info.value.data == line
    assert isinstance(info.value.__cause__, orjson.JSONDecodeError)
    assert b"".join(iter(lambda: r.read(100), b"")) == b"extra"


def test_hooks_round_trip() -> None:
    """A message's own marshal_json/unmarshal_json hooks are used (TestJSONFrameable)."""
    m = Greeting("hello, world!", 42)
    frame = NDJSON.marshal(m)
    assert frame == b'{"a": "hello, world!", "b": 42}\n'
    out = Greeting()
    NDJSON.new_unmarshal_func(io.BytesIO(frame))(out)
    assert out == m


# -- dicts --------------------------------------------------------------------


def test_dict_decode_replaces_the_content() -> None:
    """Decoding into a dict clears it and fills it with the document."""
    msg = {"stale": True, "a": 0}
    NDJSON.unmarshal_frame(b'{"a":1,"b":[1,2]}\n', msg)
    assert msg == {"a": 1, "b": [1, 2]}


def test_dict_values_come_back_as_json_gives_them() -> None:
    """Tuples come back as lists and UUIDs as strings."""
    msg: dict[str, Any] = {}
    NDJSON.unmarshal_frame(NDJSON.marshal({"t": (1, 2), "u": U1}), msg)
    assert msg == {"t": [1, 2], "u": str(U1)}


def test_dict_subclass() -> None:
    """A dict subclass without hooks encodes and decodes like a dict."""

    class Doc(dict[str, Any]):
        pass

    msg = Doc(old=1)
    NDJSON.unmarshal_frame(NDJSON.marshal(Doc(a=1)), msg)
    assert msg == {"a": 1} and type(msg) is Doc


@pytest.mark.parametrize(
    "line", [b"[1,2]\n", b"null\n", b"3\n", b'"s"\n', b"\n", b"  \n", b"{}{}\n", b'{"a":1,}\n']
)
@pytest.mark.parametrize("target", [dict, Event])
def test_not_an_object(line: bytes, target: type) -> None:
    """A line that is not one JSON object raises FrameDecodeError, and the
    message keeps its content."""
    msg = target()
    before = dataclasses.replace(msg) if dataclasses.is_dataclass(msg) else dict(msg)
    with pytest.raises(FrameDecodeError) as info:
        NDJSON.unmarshal_frame(line, msg)
    assert info.value.data == line
    assert msg == before


def test_blank_line_in_a_stream_is_skippable() -> None:
    """A blank line is a frame of its own that fails to decode; the next frame
    decodes (with its offset on the error)."""
    unmarshal = NDJSON.new_unmarshal_func(io.BytesIO(b'{"a":1}\n\n{"a":2}\n'))
    msg: dict[str, Any] = {}
    unmarshal(msg)
    with pytest.raises(FrameDecodeError) as info:
        unmarshal(msg)
    assert info.value.offset == 8
    unmarshal(msg)
    assert msg == {"a": 2}


def test_crlf_and_memoryview_frames() -> None:
    """A CRLF line and a memoryview frame decode."""
    msg: dict[str, Any] = {}
    NDJSON.unmarshal_frame(memoryview(b'xx{"a":1}\r\n')[2:], msg)
    assert msg == {"a": 1}


# -- dataclasses --------------------------------------------------------------


def test_dataclass_uuid_round_trip() -> None:
    """A dataclass with UUID fields (optional or not) round-trips exactly."""
    e = Event(uuid=U1, kind="k", n=7, tags=["a"], parent=U2)
    frame = NDJSON.marshal(e)
    assert orjson.loads(frame)["uuid"] == str(U1)
    out = Event()
    NDJSON.unmarshal_frame(frame, out)
    assert out == e
    assert type(out.uuid) is uuid.UUID and type(out.parent) is uuid.UUID


def test_dataclass_unknown_and_missing_keys() -> None:
    """Unknown keys are ignored; fields the document lacks keep their value."""
    out = Event(kind="kept", n=5)
    NDJSON.unmarshal_frame(b'{"n": 6, "unknown": [1], "parent": null}\n', out)
    assert out == Event(kind="kept", n=6, parent=None)


@pytest.mark.parametrize("bad", ['"not-a-uuid"', "12", "[1]"])
def test_dataclass_bad_uuid(bad: str) -> None:
    """A UUID field that is not a UUID raises FrameDecodeError; the message is
    left as it was (no field is set)."""
    out = Event(kind="before")
    with pytest.raises(FrameDecodeError, match="'uuid'"):
        NDJSON.unmarshal_frame(f'{{"kind": "after", "uuid": {bad}}}\n'.encode(), out)
    assert out == Event(kind="before")


def test_dataclass_with_unresolvable_annotations() -> None:
    """UUID fields are recognised even when annotations cannot be evaluated."""

    @dataclasses.dataclass
    class Local:
        u: uuid.UUID | None = None
        later: Undefined | None = None  # type: ignore[name-defined]  # noqa: F821

    out = Local()
    NDJSON.unmarshal_frame(NDJSON.marshal(Local(u=U1)), out)
    assert out.u == U1


def test_optional_uuid_spelled_with_typing() -> None:
    """Optional[uuid.UUID] is a UUID field too."""

    @dataclasses.dataclass
    class Old:
        u: Optional[uuid.UUID] = None  # noqa: UP045 - the old spelling is what this pins.

    out = Old()
    NDJSON.unmarshal_frame(NDJSON.marshal(Old(u=U2)), out)
    assert out.u == U2


def test_dataclass_with_slots() -> None:
    """A slotted dataclass encodes and decodes."""

    @dataclasses.dataclass(slots=True)
    class Slotted:
        u: uuid.UUID = U2
        x: int = 0

    out = Slotted()
    NDJSON.unmarshal_frame(NDJSON.marshal(Slotted(U1, 3)), out)
    assert out == Slotted(U1, 3)


def test_frozen_dataclass_encodes_but_cannot_be_decoded_into() -> None:
    """A frozen dataclass is encoded; decoding into one is UnsupportedMessageError."""

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        x: int = 0

    assert NDJSON.marshal(Frozen(1)) == b'{"x":1}\n'
    with pytest.raises(UnsupportedMessageError, match="frozen"):
        NDJSON.unmarshal_frame(b'{"x":2}\n', Frozen())


# -- hooks --------------------------------------------------------------------


class Raw:
    """Hooks that return or record raw documents."""

    def __init__(self, doc: Any = b"{}") -> None:
        self.doc = doc
        self.got: bytes | None = None

    def marshal_json(self) -> Any:
        return self.doc

    def unmarshal_json(self, data: bytes) -> None:
        self.got = data


def test_hook_gets_the_document_without_its_newline() -> None:
    """unmarshal_json receives the document as bytes, newline removed."""
    m = Raw()
    NDJSON.unmarshal_frame(memoryview(b'{"x": 1}\n'), m)
    assert m.got == b'{"x": 1}' and type(m.got) is bytes


@pytest.mark.parametrize(
    ("doc", "frame"),
    [
        (b'{"a":1}', b'{"a":1}\n'),
        ('{"a":1}', b'{"a":1}\n'),  # A str is encoded as UTF-8.
        (b'{"a":1}\n', b'{"a":1}\n'),  # One trailing newline is tolerated.
        (bytearray(b"[]"), b"[]\n"),
    ],
)
def test_hook_documents(doc: Any, frame: bytes) -> None:
    """marshal_json's document is framed with one newline."""
    assert NDJSON.marshal(Raw(doc)) == frame


@pytest.mark.parametrize("doc", [b'{"a":\n1}', b"", b"  ", 42, None])
def test_hook_documents_that_would_break_the_framing(doc: Any) -> None:
    """A document with a raw newline, an empty one or a non-bytes one raises
    FrameEncodeError rather than corrupt the journal."""
    with pytest.raises(FrameEncodeError):
        NDJSON.marshal(Raw(doc))


def test_hook_errors_propagate_unchanged() -> None:
    """What a hook raises reaches the caller as it is."""

    class Failing:
        def marshal_json(self) -> bytes:
            raise KeyError("mine")

        def unmarshal_json(self, data: bytes) -> None:
            raise LookupError("also mine")

    with pytest.raises(KeyError, match="mine"):
        NDJSON.marshal(Failing())
    with pytest.raises(LookupError, match="also mine"):
        NDJSON.unmarshal_frame(b"{}\n", Failing())
    r = io.BytesIO(b"{}\n{}\n")
    with pytest.raises(LookupError):
        NDJSON.new_unmarshal_func(r)(Failing())
    assert r.tell() == 3  # The frame was consumed; the next call goes on.


# -- bulk path ----------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 3, 64, 1 << 20])
def test_read_frames_long_line_and_offsets(chunk_size: int) -> None:
    """A line longer than many chunks is one frame; offsets are contiguous."""
    long = NDJSON.marshal({"s": "x" * 300})
    data = b'{"a":1}\n' + long + b'{"b":2}\n'
    got = list(NDJSON.read_frames(io.BytesIO(data), chunk_size=chunk_size))
    assert [(b, e) for b, e, _ in got] == [(0, 8), (8, 8 + len(long)), (8 + len(long), len(data))]
    assert bytes(got[1][2]) == long


@pytest.mark.parametrize("chunk_size", [1, 4, 1 << 20])
def test_read_frames_truncated(chunk_size: int) -> None:
    """Input ending mid-line raises TruncatedFrameError after the whole lines."""
    it = NDJSON.read_frames(io.BytesIO(b'{"a":1}\n{"b"'), chunk_size=chunk_size)
    assert next(it)[:2] == (0, 8)
    with pytest.raises(TruncatedFrameError) as info:
        next(it)
    assert (info.value.data, info.value.offset) == (b'{"b"', 8)


# -- properties ---------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(json_documents)
def test_dict_round_trip(doc: dict[str, Any]) -> None:
    """Any JSON object round-trips through a frame (floats as orjson writes them)."""
    frame = NDJSON.marshal(doc)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    out: dict[str, Any] = {"stale": 1}
    NDJSON.unmarshal_frame(frame, out)
    assert out == orjson.loads(orjson.dumps(doc))


@settings(max_examples=100, deadline=None)
@given(events)
def test_dataclass_round_trip(e: Event) -> None:
    """Any Event dataclass round-trips, UUIDs included."""
    out = Event()
    NDJSON.new_unmarshal_func(io.BytesIO(NDJSON.marshal(e)))(out)
    assert out == e


@pytest.mark.parametrize(
    ("text", "is_uuid"),
    [
        ("uuid.UUID", True),
        ("UUID | None", True),
        ("None|uuid.UUID", True),
        ("Optional[UUID]", True),
        ("typing.Optional[uuid.UUID]", True),
        ("UUID | int", False),
        ("None", False),
        ("str", False),
        ("list[UUID]", False),
    ],
)
def test_uuid_annotations_read_from_text(text: str, is_uuid: bool) -> None:
    """Annotations that cannot be evaluated are read as text to find UUID fields."""
    from framing._json import _is_uuid_type

    assert _is_uuid_type(text) is is_uuid
