"""The fixed-header protobuf framing: Gazette's fixed_framing_test.go ported,
desync recovery on every kind of reader, and protobuf round trips."""

from __future__ import annotations

import io
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, struct_pb2
from google.protobuf import message as protobuf_message
from hypothesis import given, settings
from hypothesis import strategies as st

from framing import (
    FIXED_FRAME_WORD,
    DesyncError,
    FrameDecodeError,
    FrameEncodeError,
    FramingError,
    TruncatedFrameError,
    encode_fixed_proto_frame,
    unpack_fixed_frame,
)
from tests.framing.support import FIXED, READERS, RawPayload
from tests.strategies import proto_values

W = FIXED_FRAME_WORD
# Gazette's fixture: "test message content" (20 = 0x14 bytes) in one frame.
FRAME = W + b"\x14\x00\x00\x00" + b"test message content"


class HalfThenFail(RawPayload):
    """Gazette's ``frameableerror``: fails after doing half the work."""

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf method name.
        raise RuntimeError("error!")

    def ParseFromString(self, b: bytes) -> None:  # noqa: N802 - the protobuf method name.
        self.s = b[: len(b) // 2].decode()
        raise RuntimeError("error!")


def _unmarshal(data: bytes, kind: str = "bytesio") -> tuple[Any, Any]:
    r = READERS[kind](data)
    return r, FIXED.new_unmarshal_func(r)


# -- Gazette's fixed_framing_test.go ------------------------------------------------


def test_marshal_with_fixtures() -> None:
    """A frame is word, little-endian length, payload (TestFixedFramingMarshalWithFixtures)."""
    buf = FIXED.marshal(RawPayload("test message content"))
    assert buf == FRAME
    buf += FIXED.marshal(RawPayload("foo message"))
    assert buf == FRAME + W + b"\x0b\x00\x00\x00foo message"


def test_marshal_error() -> None:
    """An error of the message's own encoder propagates (TestFixedFramingMarshalError)."""
    with pytest.raises(RuntimeError, match="error!"):
        FIXED.marshal(HalfThenFail("test message"))


def test_encode_with_fixtures() -> None:
    """encode_fixed_proto_frame appends to the buffer it is given, in place
    (TestFixedFramingEncodeWithFixtures)."""
    b = encode_fixed_proto_frame(RawPayload("foo"))
    assert b == W + b"\x03\x00\x00\x00foo"
    assert type(b) is bytearray
    b2 = encode_fixed_proto_frame(RawPayload("bar"), b)
    assert b2 is b
    assert b == W + b"\x03\x00\x00\x00foo" + W + b"\x03\x00\x00\x00bar"
    b.clear()  # A truncated buffer is reused, not re-allocated.
    assert encode_fixed_proto_frame(RawPayload("baz"), b) is b
    assert b == W + b"\x03\x00\x00\x00baz"


@pytest.mark.parametrize("kind", sorted(READERS))
def test_decode_with_fixture(kind: str) -> None:
    """One frame is decoded and exactly its bytes consumed (TestFixedFramingDecodeWithFixture)."""
    r, unmarshal = _unmarshal(FRAME + b"extra", kind)
    msg = RawPayload()
    unmarshal(msg)
    assert msg.s == "test message content"
    assert b"".join(iter(lambda: r.read(100), b"")) == b"extra"


def test_decoding_error() -> None:
    """An error of the message's own parser propagates (TestFixedFramingDecodingError)."""
    msg = HalfThenFail()
    _, unmarshal = _unmarshal(FRAME)
    with pytest.raises(RuntimeError, match="error!"):
        unmarshal(msg)
    assert msg.s == "test messa"


@pytest.mark.parametrize("kind", sorted(READERS))
def test_decode_trailing_newline(kind: str) -> None:
    """A single trailing newline is a clean end (TestFixedFramingDecodeTrailingNewLine)."""
    r, unmarshal = _unmarshal(FRAME + b"\n", kind)
    msg = RawPayload()
    unmarshal(msg)
    assert msg.s == "test message content"
    if hasattr(r, "peek"):
        assert r.peek(1)[:1] == b"\n"  # The reader is at the newline.
    with pytest.raises(EOFError):
        unmarshal(msg)
    # A lone newline is a clean end too.
    assert unpack_fixed_frame(READERS[kind](b"\n")) == b""
    with pytest.raises(EOFError):
        _unmarshal(b"\n", kind)[1](msg)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_desync_detection(kind: str) -> None:
    """Leading bytes without the word are skipped as a DesyncError carrying
    them; the next frame decodes (TestFixedFramingDesyncDetection)."""
    r = READERS[kind](b"foobar" + FRAME)
    with pytest.raises(DesyncError) as info:
        unpack_fixed_frame(r)
    assert info.value.data == b"foobar"
    msg = RawPayload()
    FIXED.new_unmarshal_func(r)(msg)
    assert msg.s == "test message content"


@pytest.mark.parametrize("kind", sorted(READERS))
def test_incomplete_buffer_handling(kind: str) -> None:
    """EOF at the first byte is clean; anywhere inside a header or a frame it
    is a truncation (TestFixedFramingIncompleteBufferHandling)."""
    fixture = b"foo" + FRAME

    def first(data: bytes) -> Any:
        return _unmarshal(data, kind)[1](RawPayload())

    with pytest.raises(EOFError):
        first(fixture[3:3])
    for cut, data in [
        ("partway through the header", fixture[3:10]),
        ("partway through a desync'd header", fixture[0:7]),  # Fewer than 8 bytes left.
        ("just after the header", fixture[3:11]),
        ("partway through the payload", fixture[3:22]),
    ]:
        with pytest.raises(TruncatedFrameError) as info:
            first(data)
        assert info.value.data == data, cut
    msg = RawPayload()
    _unmarshal(fixture[3:], kind)[1](msg)
    assert msg.s == "test message content"


@pytest.mark.parametrize("kind", sorted(READERS))
def test_underflow_reading_desync_header(kind: str) -> None:
    """A desync run longer than the reader's buffer is skipped whole, up to
    the magic word (TestFixedFramingUnderflowReadingDesyncHeader). Gazette
    returns it in pieces as large as its buffer; here it is one DesyncError."""
    fixture = b"x" * (13 + 8) + FRAME
    r = READERS[kind](fixture)
    with pytest.raises(DesyncError) as info:
        unpack_fixed_frame(r)
    assert info.value.data == fixture[:21]
    assert unpack_fixed_frame(r) == FRAME
    assert unpack_fixed_frame(r) == b""


# -- desync recovery, every reader, every position ------------------------------------


def _outcomes_by_unpack(data: bytes, kind: str) -> list[tuple[str, bytes]]:
    r = READERS[kind](data)
    out: list[tuple[str, bytes]] = []
    for _ in range(len(data) + 2):
        try:
            frame = unpack_fixed_frame(r)
        except DesyncError as e:
            out.append(("desync", e.data))
            continue
        except TruncatedFrameError as e:
            out.append(("truncated", e.data))
            continue
        if not frame:
            return out
        out.append(("frame", frame))
    raise AssertionError("unpack_fixed_frame made no progress")


def _outcomes_by_read_frames(data: bytes, chunk_size: int) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    end = 0
    try:
        for begin, stop, frame in FIXED.read_frames(io.BytesIO(data), chunk_size=chunk_size):
            assert begin == end
            end = stop
            try:
                FIXED.unmarshal_frame(frame, RawPayload())
            except DesyncError as e:
                assert e.data == bytes(frame)
                out.append(("desync", e.data))
            else:
                out.append(("frame", bytes(frame)))
    except TruncatedFrameError as e:
        assert e.offset == end
        out.append(("truncated", e.data))
    return out


def _stream(garbage: bytes, at: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Three frames with ``garbage`` before frame ``at`` (3: after the last)."""
    frames = [FIXED.marshal(RawPayload(s)) for s in ("one", "two two", "")]
    expected: list[tuple[str, bytes]] = [("frame", f) for f in frames]
    frames.insert(at, garbage)
    expected.insert(at, ("desync", garbage))
    return b"".join(frames), expected


GARBAGE = [
    b"x" * 8,
    b"x" * 9,
    b"x" * 40,  # Longer than the 16-byte buffers.
    b"x" * 13 + W[:3],  # Ends with most of a magic word.
    W[:1] + b"y" * 10,
    W[:3] + W[:2] + W[:1] + b"zzzzzz",  # Partial words overlapping.
    b"\n" + b"q" * 7,  # A newline that is not the last byte.
    bytes(range(256)),
]


@pytest.mark.parametrize("kind", sorted(READERS))
@pytest.mark.parametrize("at", [0, 1, 2])
@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_desync_recovery(kind: str, at: int, garbage: bytes) -> None:
    """A desync run before any frame is reported whole and every frame is
    recovered, on every reader (peek, seek, or neither)."""
    data, expected = _stream(garbage, at)
    assert _outcomes_by_unpack(data, kind) == expected


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 7, 16, 1 << 20])
@pytest.mark.parametrize("at", [0, 1, 2])
@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_read_frames_desync_recovery(chunk_size: int, at: int, garbage: bytes) -> None:
    """read_frames yields a desync run as one frame, for which unmarshal_frame
    raises DesyncError, and every real frame after it."""
    data, expected = _stream(garbage, at)
    assert _outcomes_by_read_frames(data, chunk_size) == expected


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b"\n", []),  # One trailing newline: a clean end.
        (b"\n\n", [("truncated", b"\n\n")]),
        (b"abc", [("truncated", b"abc")]),  # Fewer than 8 bytes: a partial header.
        (b"x" * 8, [("desync", b"x" * 8)]),  # A run to the end, then a clean end.
        (b"x" * 30 + b"\n", [("desync", b"x" * 30 + b"\n")]),
        (W + b"\x05\x00\x00\x00ab", [("truncated", W + b"\x05\x00\x00\x00ab")]),
        (b"x" * 9 + W, [("desync", b"x" * 9), ("truncated", W)]),
        # A run ending with the start of a magic word: the word may begin a
        # frame still being appended, so it is kept for what follows.
        (b"x" * 13 + W[:3], [("desync", b"x" * 13), ("truncated", W[:3])]),
        (b"x" * 8 + W[:1], [("desync", b"x" * 8), ("truncated", W[:1])]),
        (b"y" * 20 + W[:2], [("desync", b"y" * 20), ("truncated", W[:2])]),
        (b"x" * 8 + W[1:3], [("desync", b"x" * 8 + W[1:3])]),  # not a word's start
    ],
)
@pytest.mark.parametrize("kind", [*sorted(READERS), "read_frames"])
def test_end_of_input_after_a_frame(
    kind: str, tail: bytes, expected: list[tuple[str, bytes]]
) -> None:
    """What the bytes after the last frame mean, the same on both read paths."""
    data = FRAME + tail
    want = [("frame", FRAME), *expected]
    if kind == "read_frames":
        for chunk_size in (1, 3, 1 << 20):
            assert _outcomes_by_read_frames(data, chunk_size) == want
    else:
        assert _outcomes_by_unpack(data, kind) == want


def test_held_bytes_of_a_plain_reader() -> None:
    """With a reader that can neither peek nor seek, the magic word read past
    a desync run is kept for the next call on that reader, and only that one."""
    one = READERS["readonly"](b"junkjunk" + FRAME)
    two = READERS["readonly"](FRAME)
    with pytest.raises(DesyncError):
        unpack_fixed_frame(one)
    assert unpack_fixed_frame(two) == FRAME
    assert unpack_fixed_frame(one) == FRAME
    assert unpack_fixed_frame(one) == b""


def test_held_bytes_are_dropped_with_their_reader() -> None:
    """Bytes held for a plain reader are forgotten when the reader is."""
    import gc

    from framing import _fixed

    r = READERS["readonly"](b"junkjunk" + FRAME)
    with pytest.raises(DesyncError):
        unpack_fixed_frame(r)
    assert id(r) in _fixed._held
    key = id(r)
    del r
    gc.collect()
    assert key not in _fixed._held


def test_held_bytes_of_a_reader_without_weak_references() -> None:
    """A plain reader that cannot be weakly referenced recovers from a desync too."""

    class Slotted:
        __slots__ = ("_bio",)

        def __init__(self, data: bytes) -> None:
            self._bio = io.BytesIO(data)

        def read(self, n: int) -> bytes:
            return self._bio.read(n)

    r = Slotted(b"junkjunk" + FRAME)
    with pytest.raises(DesyncError):
        unpack_fixed_frame(r)
    assert unpack_fixed_frame(r) == FRAME
    assert unpack_fixed_frame(r) == b""


def test_errors_carry_offsets_from_the_unmarshal_func() -> None:
    """new_unmarshal_func puts each error's offset relative to its start."""
    data = FRAME + b"garbage!" + FRAME + W + b"\x01"
    _, unmarshal = _unmarshal(data)
    msg = RawPayload()
    unmarshal(msg)
    with pytest.raises(DesyncError) as desync:
        unmarshal(msg)
    assert desync.value.offset == len(FRAME)
    unmarshal(msg)
    with pytest.raises(TruncatedFrameError) as truncated:
        unmarshal(msg)
    assert truncated.value.offset == 2 * len(FRAME) + 8
    with pytest.raises(EOFError):
        unmarshal(msg)


@pytest.mark.parametrize("chunk_size", [1, 7, 1 << 20])
def test_large_frame_spanning_chunks(chunk_size: int) -> None:
    """A frame larger than many chunks is read whole and decoded."""
    big = struct_pb2.Value(string_value="z" * 5000)
    frame = FIXED.marshal(big)
    got = list(FIXED.read_frames(io.BytesIO(frame + frame), chunk_size=chunk_size))
    assert [(b, e) for b, e, _ in got] == [(0, len(frame)), (len(frame), 2 * len(frame))]
    out = struct_pb2.Value()
    FIXED.unmarshal_frame(got[1][2], out)
    assert out == big


# -- unmarshal_frame and protobuf -------------------------------------------------------


def test_unmarshal_frame_errors() -> None:
    """A desync run raises DesyncError; a frame whose header disagrees with its
    length, or whose payload is not protobuf, raises FrameDecodeError."""
    with pytest.raises(DesyncError) as d:
        FIXED.unmarshal_frame(b"garbage", struct_pb2.Value())
    assert d.value.data == b"garbage"
    with pytest.raises(FrameDecodeError, match="length"):
        FIXED.unmarshal_frame(FRAME + b"x", RawPayload())
    for short in (W, W + b"\x00", W + b"\x00\x00\x00"):  # Shorter than a header.
        with pytest.raises(FrameDecodeError, match="length"):
            FIXED.unmarshal_frame(short, RawPayload())
    bad = W + b"\x01\x00\x00\x00\xff"
    with pytest.raises(FrameDecodeError, match="invalid protobuf") as info:
        FIXED.unmarshal_frame(bad, struct_pb2.Value())
    assert isinstance(info.value.__cause__, protobuf_message.DecodeError)
    assert info.value.data == bad


def test_bad_payload_is_consumed_and_skipped() -> None:
    """An undecodable payload is a FrameDecodeError; the next frame decodes."""
    good = FIXED.marshal(struct_pb2.Value(string_value="ok"))
    _, unmarshal = _unmarshal(W + b"\x01\x00\x00\x00\xff" + good)
    msg = struct_pb2.Value()
    with pytest.raises(FrameDecodeError) as info:
        unmarshal(msg)
    assert info.value.offset == 0
    unmarshal(msg)
    assert msg.string_value == "ok"


def test_encode_error_of_a_proto2_message() -> None:
    """A proto2 message missing a required field raises FrameEncodeError
    chained to protobuf's EncodeError."""
    incomplete = descriptor_pb2.UninterpretedOption.NamePart()
    with pytest.raises(FrameEncodeError) as info:
        FIXED.marshal(incomplete)
    assert isinstance(info.value.__cause__, protobuf_message.EncodeError)
    with pytest.raises(FrameEncodeError):
        encode_fixed_proto_frame(incomplete)


def test_serialize_must_return_bytes() -> None:
    """A SerializeToString returning something else raises FrameEncodeError."""

    class Bad(RawPayload):
        def SerializeToString(self) -> Any:  # noqa: N802 - the protobuf method name.
            return "text"

    with pytest.raises(FrameEncodeError, match="not bytes"):
        FIXED.marshal(Bad())


@settings(max_examples=100, deadline=None)
@given(st.lists(proto_values, min_size=1, max_size=4), st.integers(1, 12))
def test_protobuf_round_trip(values: list[struct_pb2.Value], chunk_size: int) -> None:
    """Protobuf messages round-trip through both read paths."""
    data = bytearray()
    for v in values:
        encode_fixed_proto_frame(v, data)
    assert bytes(data) == b"".join(FIXED.marshal(v) for v in values)
    unmarshal = FIXED.new_unmarshal_func(io.BytesIO(bytes(data)))
    for v in values:
        out = struct_pb2.Value()
        unmarshal(out)
        assert out == v
    got = list(FIXED.read_frames(io.BytesIO(bytes(data)), chunk_size=chunk_size))
    assert len(got) == len(values)
    for (_, _, frame), v in zip(got, values, strict=True):
        out = struct_pb2.Value()
        FIXED.unmarshal_frame(frame, out)
        assert out == v


def test_only_framing_errors_from_generated_messages() -> None:
    """Garbage decoded into a generated message raises only FramingError."""
    for payload in (b"\xff\xff", b"\x0a\x05ab", b"\x12\x80", b"\x00"):
        frame = W + len(payload).to_bytes(4, "little") + payload
        with pytest.raises(FramingError):
            FIXED.unmarshal_frame(frame, struct_pb2.Value())


class _Unbuffered:
    """A plain reader of a file (no peek, no seek): ``read`` only."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def read(self, n: int = -1) -> bytes:
        return bytes(self.f.read(n))


@pytest.mark.parametrize("kind", ["buffered", "raw", "plain"])
@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_follower_keeps_the_start_of_a_frame_still_being_appended(
    tmp_path: Any, kind: str, cut: int
) -> None:
    """After a desync run that reaches the end of what is written so far, the
    bytes that may begin a magic word are not discarded: once the rest of the
    frame is appended, the same reader reads it (as Gazette's framing)."""
    path = tmp_path / "stream"
    path.write_bytes(b"junk" * 3 + FRAME[:cut])
    raw = open(path, "rb", buffering=0)  # noqa: SIM115 -- closed below
    r: Any = raw
    if kind == "buffered":
        r = io.BufferedReader(raw, 16)
    elif kind == "plain":
        r = _Unbuffered(raw)
    try:
        with pytest.raises(DesyncError) as info:
            unpack_fixed_frame(r)
        assert info.value.data == b"junk" * 3
        with open(path, "ab") as w:
            w.write(FRAME[cut:])
        assert unpack_fixed_frame(r) == FRAME
        assert unpack_fixed_frame(r) == b""
    finally:
        raw.close()
