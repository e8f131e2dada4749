"""Fuzzing every decoder with random bytes and mutated valid encodings.

Whatever the input, decoding must only ever raise ``EOFError`` or a
``FramingError``, always terminate (each call consumes at least one byte),
and both read paths (``new_unmarshal_func`` on any kind of reader, and
``read_frames`` + ``unmarshal_frame`` at any chunk size) must split the input
into the same frames with the same outcomes.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framing import (
    FIXED_FRAME_WORD,
    DesyncError,
    FrameDecodeError,
    Framing,
    FramingError,
    TruncatedFrameError,
)
from tests.framing.support import BUILT_INS, READERS, Event
from tests.strategies import messages_for

# Decoding targets per framing: the first is used to compare the paths.
TARGETS: dict[str, list[Callable[[], Any]]] = {
    "ndjson": [dict, Event],
    "csv": [list],
    "fixed": [struct_pb2.Value, struct_pb2.Struct],
}

# Byte strings that mean something to some framing, to insert anywhere.
TOKENS = [
    FIXED_FRAME_WORD,
    FIXED_FRAME_WORD + b"\x03\x00\x00\x00",
    FIXED_FRAME_WORD + b"\xff\xff\xff\x7f",  # A length far past the end.
    FIXED_FRAME_WORD[:2],
    b"\n",
    b"\n\n",
    b"\r\n",
    b'"',
    b'""',
    b",",
    b"{",
    b"}",
    b"\x00",
]

MUTATIONS = ["flip", "truncate", "insert", "token", "append", "duplicate", "delete"]

Outcome = tuple[str, Any, int | None, int | None]  # (kind, detail, begin, end)


@st.composite
def inputs(draw: st.DrawFn, name: str) -> bytes:
    """Random bytes, or a valid stream of ``name`` frames with a few mutations."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=120))
    framing = BUILT_INS[name]
    data = bytearray(b"".join(framing.marshal(m) for m in draw(messages_for(name))))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(MUTATIONS))
        at = draw(st.integers(0, len(data)))
        if op == "append":  # The end of the input is where framings differ most.
            op, at = "token", len(data)
        if op == "flip" and data:
            at = min(at, len(data) - 1)
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=12))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif op == "duplicate":
            stop = draw(st.integers(at, len(data)))
            data[at:at] = data[at:stop]
        elif op == "delete":
            stop = draw(st.integers(at, len(data)))
            del data[at:stop]
    return bytes(data)


def _detail(msg: Any) -> Any:
    """What a decoded message holds, comparable across decodes."""
    if isinstance(msg, struct_pb2.Value | struct_pb2.Struct):
        return msg.SerializeToString(deterministic=True)  # NaN != NaN; bytes compare.
    return msg


def _classify(e: FramingError) -> tuple[str, bytes]:
    if isinstance(e, DesyncError):
        return "desync", e.data
    if isinstance(e, TruncatedFrameError):
        return "truncated", e.data
    if isinstance(e, FrameDecodeError):
        return "decode", e.data
    raise AssertionError(f"a decoder raised {e!r}")


def by_unmarshal_func(
    framing: Framing, reader: Any, new_message: Callable[[], Any], size: int
) -> list[Outcome]:
    """Outcome of each call of new_unmarshal_func until EOFError, with the
    reader's positions if it is a BytesIO (other readers may be read ahead of
    the frames: the fixed framing holds a magic word for a plain reader)."""
    unmarshal = framing.new_unmarshal_func(reader)
    tell = reader.tell if isinstance(reader, io.BytesIO) else None
    pos = tell() if tell else None
    out: list[Outcome] = []
    for _ in range(size + 2):  # Each call consumes a byte at least.
        msg = new_message()
        try:
            unmarshal(msg)
            kind, detail = "ok", _detail(msg)
        except EOFError:
            return out
        except FramingError as e:
            kind, detail = _classify(e)
        end = tell() if tell else None
        if pos is not None and end is not None:
            assert end > pos, "a call consumed nothing"
        out.append((kind, detail, pos, end))
        pos = end
    raise AssertionError("new_unmarshal_func never reached EOFError")


def by_read_frames(
    framing: Framing, data: bytes, new_message: Callable[[], Any], chunk_size: int
) -> list[Outcome]:
    """Outcome of unmarshal_frame for each frame read_frames yields."""
    out: list[Outcome] = []
    end = 0
    frames = framing.read_frames(io.BytesIO(data), chunk_size=chunk_size)
    try:
        for count, (begin, stop, frame) in enumerate(frames):
            assert count <= len(data), "read_frames yields more frames than bytes"
            assert begin == end and stop > begin, "offsets are not contiguous"
            assert bytes(frame) == data[begin:stop]
            end = stop
            msg = new_message()
            try:
                framing.unmarshal_frame(frame, msg)
                out.append(("ok", _detail(msg), begin, stop))
            except FramingError as e:
                kind, detail = _classify(e)
                assert kind != "truncated", "unmarshal_frame raised TruncatedFrameError"
                out.append((kind, detail, begin, stop))
    except TruncatedFrameError as e:
        assert e.offset == end and e.data == data[end:], "truncation data or offset"
        out.append(("truncated", e.data, end, len(data)))
        return out
    # A clean end: everything consumed (the fixed framing also allows one "\n").
    assert data[end:] in (b"", b"\n"), "read_frames stopped before the end"
    return out


def _without_positions(outcomes: list[Outcome]) -> list[tuple[str, Any]]:
    return [(kind, detail) for kind, detail, _, _ in outcomes]


def _csv_comparable(outcomes: list[Outcome]) -> list[Outcome]:
    # The CSV unmarshal func also checks that records keep one width, which
    # unmarshal_frame cannot: a decoded record and a decode error are alike.
    return [
        ("record", None, b, e) if k in ("ok", "decode") else (k, d, b, e)
        for k, d, b, e in outcomes
    ]


def check_input(name: str, data: bytes, chunk_size: int) -> None:
    framing = BUILT_INS[name]
    new_message = TARGETS[name][0]
    reference = by_unmarshal_func(framing, io.BytesIO(data), new_message, len(data))
    # Other readers (buffered, unseekable, short reads) give the same outcomes.
    for kind in ("buffered16", "pipe16", "readonly3"):
        got = by_unmarshal_func(framing, READERS[kind](data), new_message, len(data))
        assert _without_positions(got) == _without_positions(reference), kind
    # The bulk path finds the same frames, with the same outcomes.
    bulk = by_read_frames(framing, data, new_message, chunk_size)
    if name == "csv":
        assert _csv_comparable(bulk) == _csv_comparable(reference)
    else:
        assert bulk == reference
    # Other message types: still nothing but FramingError.
    for other in TARGETS[name][1:]:
        by_read_frames(framing, data, other, chunk_size)
        by_unmarshal_func(framing, io.BytesIO(data), other, len(data))


FUZZ = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(st.data(), st.integers(1, 40))
def test_fuzz_ndjson(data: st.DataObject, chunk_size: int) -> None:
    """NDJSON decoders survive mutated and random input, and agree."""
    check_input("ndjson", data.draw(inputs("ndjson")), chunk_size)


@FUZZ
@given(st.data(), st.integers(1, 40))
def test_fuzz_csv(data: st.DataObject, chunk_size: int) -> None:
    """CSV decoders survive mutated and random input, and agree."""
    check_input("csv", data.draw(inputs("csv")), chunk_size)


@FUZZ
@given(st.data(), st.integers(1, 40))
def test_fuzz_fixed(data: st.DataObject, chunk_size: int) -> None:
    """Fixed-frame decoders survive mutated and random input, and agree."""
    check_input("fixed", data.draw(inputs("fixed")), chunk_size)


@pytest.mark.parametrize("name", sorted(BUILT_INS))
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n",
        b"\n\n\n",
        FIXED_FRAME_WORD * 3,
        FIXED_FRAME_WORD + b"\xff\xff\xff\xff",
        b'"' * 7 + b"\n",
        b"\x00" * 64,
        bytes(range(256)) * 2,
    ],
    ids=lambda d: repr(d[:12]),
)
def test_edge_inputs(name: str, data: bytes) -> None:
    """Hand-picked hostile inputs behave like fuzzed ones, at several chunk sizes."""
    for chunk_size in (1, 5, 1 << 20):
        check_input(name, data, chunk_size)
