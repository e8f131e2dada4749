"""The framing package as a whole: constants, registry, errors, exports,
the conformance check for every built-in framing, and ``unpack_line``.

The framing contract (docs/framing.md) is checked here (constants, ``register_framing``,
``framing_by_content_type`` and its error, the ``Framing`` contract through
``check_framing``: one frame per call, ``EOFError``, ``TruncatedFrameError``;
``unpack_line``) and in the modules of each framing: test_framing_json.py
(NDJSON hooks, dicts, dataclasses), test_framing_csv.py (RFC 4180, hooks),
test_framing_fixed.py (``encode_fixed_proto_frame``, ``unpack_fixed_frame``,
``DesyncError``). tests/message/test_reader.py reads journals through a
registered framing of the user's own."""

from __future__ import annotations

import io
import pickle
from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import given, settings

import framing
from framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
    DesyncError,
    FrameDecodeError,
    FrameEncodeError,
    FramingError,
    TruncatedFrameError,
    UnknownContentTypeError,
    UnsupportedMessageError,
    framing_by_content_type,
    register_framing,
    unpack_line,
)
from framing.testing import ShortReader, check_framing
from tests.framing.support import (
    BUILT_INS,
    CSV,
    FIXED,
    NDJSON,
    NEW_MESSAGE,
    READERS,
    Event,
    Greeting,
    RawPayload,
    Row,
)
from tests.strategies import cases

# -- constants and registry ---------------------------------------------------


def test_constants() -> None:
    """Content types and the fixed-frame header are Gazette's."""
    assert CONTENT_TYPE_CSV == "text/csv"
    assert CONTENT_TYPE_JSON_LINES == "application/x-ndjson"
    assert CONTENT_TYPE_PROTO_FIXED == "application/x-protobuf-fixed"
    assert FIXED_FRAME_WORD == b"\x66\x33\x93\x36"
    assert FIXED_FRAME_HEADER_LENGTH == 8


@pytest.mark.parametrize(
    ("content_type", "cls"),
    [
        (CONTENT_TYPE_CSV, framing.CSVFraming),
        (CONTENT_TYPE_JSON_LINES, framing.JSONLinesFraming),
        (CONTENT_TYPE_PROTO_FIXED, framing.ProtoFixedFraming),
    ],
)
def test_built_ins_register_themselves(content_type: str, cls: type) -> None:
    """Importing the package registers the three built-in framings."""
    f = framing_by_content_type(content_type)
    assert isinstance(f, cls)
    assert f.content_type == content_type
    assert isinstance(f, framing.Framing)


@pytest.mark.parametrize("content_type", ["text/plain", "", "TEXT/CSV", "application/x-ndjson "])
def test_unknown_content_type(content_type: str) -> None:
    """An unknown content type raises UnknownContentTypeError with Gazette's message."""
    with pytest.raises(UnknownContentTypeError) as info:
        framing_by_content_type(content_type)
    assert str(info.value) == f"unrecognized content-type ({content_type})"
    assert info.value.content_type == content_type
    assert isinstance(info.value, FramingError)
    assert isinstance(info.value, ValueError)


class _Upper:
    """A custom framing: NDJSON documents of upper-cased strings."""

    content_type = "test/upper-lines"

    def marshal(self, msg: Any) -> bytes:
        return str(msg["s"]).upper().encode() + b"\n"

    def new_unmarshal_func(self, r: Any) -> Any:
        def unmarshal(msg: Any) -> None:
            line = unpack_line(r)
            if not line:
                raise EOFError
            self.unmarshal_frame(line, msg)

        return unmarshal

    def read_frames(self, r: Any, *, chunk_size: int = 1 << 20) -> Any:
        return NDJSON.read_frames(r, chunk_size=chunk_size)

    def unmarshal_frame(self, frame: Any, msg: Any) -> None:
        msg.clear()
        msg["s"] = bytes(frame).rstrip(b"\n").decode()


def test_register_custom_framing() -> None:
    """A registered framing is found by its content type, replaces any earlier
    one, and passes the conformance check."""
    custom = _Upper()
    assert isinstance(custom, framing.Framing)
    register_framing(custom)
    assert framing_by_content_type("test/upper-lines") is custom
    again = _Upper()
    register_framing(again)
    assert framing_by_content_type("test/upper-lines") is again
    check_framing(again, [{"s": "A"}, {"s": "BC"}], dict)


def test_register_rejects_a_framing_without_content_type() -> None:
    """register_framing needs a non-empty str content type."""
    bad = _Upper()
    bad.content_type = ""
    with pytest.raises(ValueError, match="content_type"):
        register_framing(bad)


# -- errors -------------------------------------------------------------------


def test_error_tree() -> None:
    """Every error derives from FramingError; bad input errors are ValueErrors."""
    for cls in (
        UnknownContentTypeError,
        UnsupportedMessageError,
        FrameEncodeError,
        FrameDecodeError,
        TruncatedFrameError,
        DesyncError,
    ):
        assert issubclass(cls, FramingError)
    for cls in (UnknownContentTypeError, FrameEncodeError, FrameDecodeError):
        assert issubclass(cls, ValueError)
    assert issubclass(UnsupportedMessageError, TypeError)
    assert not issubclass(TruncatedFrameError, EOFError)  # `except EOFError` must not hide it.


def test_errors_carry_data_and_offset() -> None:
    """Data errors keep their bytes (as bytes) and offset, and say so."""
    e = TruncatedFrameError(data=memoryview(b"abc"), offset=7)
    assert e.data == b"abc" and type(e.data) is bytes
    assert e.offset == 7
    assert str(e) == "input ended inside a frame (3 bytes at offset 7)"
    assert str(DesyncError(data=b"xy")) == "detected de-synchronization (2 bytes)"


@pytest.mark.parametrize(
    "err",
    [
        UnknownContentTypeError("a/b"),
        TruncatedFrameError(data=b"ab", offset=3),
        DesyncError(data=b"xx", offset=0),
        FrameDecodeError("invalid JSON", data=b"{\n", offset=9),
        FrameEncodeError("bad"),
    ],
)
def test_errors_pickle(err: FramingError) -> None:
    """Errors survive pickling (Spark ships them between processes) unchanged."""
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert getattr(back, "data", None) == getattr(err, "data", None)
    assert getattr(back, "offset", None) == getattr(err, "offset", None)


def test_exports() -> None:
    """__all__ lists exactly the public names, each importable."""
    public = {n for n in dir(framing) if not n.startswith("_")} - {"testing"}
    assert set(framing.__all__) == public
    import inspect
    import types
    import typing

    for name in framing.__all__:
        obj = getattr(framing, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            # Defined in the package and documented, not a stray re-export.
            assert obj.__module__.split(".")[0] == "framing", (name, obj.__module__)
            assert inspect.getdoc(obj), f"framing.{name} has no docstring"
        elif name in ("Frame", "UnmarshalFunc"):  # type aliases
            assert typing.get_origin(obj) is not None or isinstance(obj, types.UnionType)
        else:  # the constants: content types, the frame word, limits
            assert isinstance(obj, str | bytes | int) and name.isupper(), (name, obj)


def test_package_tour_runs() -> None:
    """The examples of the package docstring's tour run."""
    import doctest

    failures, tried = doctest.testmod(framing)
    assert tried > 0 and failures == 0


# -- conformance --------------------------------------------------------------


CONFORMANCE_CASES: dict[str, tuple[framing.Framing, list[Any], Any]] = {
    "ndjson-dict": (
        NDJSON,
        [{"a": 1}, {"b": [1, 2, {"c": None}], "é": "ü\n"}, {}],
        dict,
    ),
    "ndjson-dataclass": (
        NDJSON,
        [Event(kind="x", n=1), Event(tags=["a", "b"], n=-3), Event(kind="")],
        Event,
    ),
    "ndjson-hooks": (NDJSON, [Greeting("hi", 1), Greeting("there", 2)], Greeting),
    "csv-list": (CSV, [["a", "b"], ["x\ny", 'q"'], ["", ""], [",", "\r\n"]], list),
    "csv-hooks": (CSV, [Row("1", "a,b"), Row("2", ""), Row("3", '"')], Row),
    "csv-one-field": (CSV, [[""], ["a"], ["\n"]], list),
    "fixed-proto": (
        FIXED,
        [
            struct_pb2.Value(string_value="hello"),
            struct_pb2.Value(number_value=1.5),
            struct_pb2.Value(),  # An empty payload.
        ],
        struct_pb2.Value,
    ),
    "fixed-raw": (FIXED, [RawPayload("test message content"), RawPayload("foo")], RawPayload),
}


@pytest.mark.parametrize("case", sorted(CONFORMANCE_CASES))
def test_built_in_framings_conform(case: str) -> None:
    """Each built-in framing passes the shipped conformance check."""
    f, messages, new_message = CONFORMANCE_CASES[case]
    check_framing(f, messages, new_message)


@settings(max_examples=30, deadline=None)
@given(cases())
def test_conformance_property(case: tuple[str, list[Any]]) -> None:
    """Random messages of each built-in framing pass the conformance check."""
    name, messages = case
    check_framing(
        BUILT_INS[name],
        messages,
        NEW_MESSAGE[name],
        chunk_sizes=(1, 5, 1 << 20),
        max_cut_points=20,
    )


def test_conformance_check_catches_a_broken_framing() -> None:
    """check_framing fails a framing whose read_frames loses a frame."""

    class Lossy(_Upper):
        def read_frames(self, r: Any, *, chunk_size: int = 1 << 20) -> Any:
            return iter(list(NDJSON.read_frames(r, chunk_size=chunk_size))[1:])

    with pytest.raises(AssertionError, match="frames"):
        check_framing(Lossy(), [{"s": "A"}, {"s": "B"}], dict)


def test_conformance_check_catches_over_reading() -> None:
    """check_framing fails a framing whose unmarshal func reads past its frame."""

    class Greedy(_Upper):
        def new_unmarshal_func(self, r: Any) -> Any:
            lines = iter(r.read(1 << 20).splitlines(keepends=True))

            def unmarshal(msg: Any) -> None:
                line = next(lines, b"")
                if not line:
                    raise EOFError
                self.unmarshal_frame(line, msg)

            return unmarshal

    with pytest.raises(AssertionError, match="consume exactly"):
        check_framing(Greedy(), [{"s": "A"}, {"s": "B"}], dict)


def test_short_reader() -> None:
    """ShortReader returns at most max_read bytes per read, and b"" at the end."""
    r = ShortReader(b"abcdef", 4)
    assert r.read(10) == b"abcd"
    assert r.read(1) == b"e"
    assert r.read() == b"f"
    assert r.read(3) == b""
    assert r.tell() == 6 and r.reads == 4
    with pytest.raises(ValueError):
        ShortReader(b"", 0)


# -- unpack_line (Gazette's TestUnpackLine) -------------------------------------


@pytest.mark.parametrize("kind", sorted(READERS))
def test_unpack_line_cases(kind: str) -> None:
    """Lines in and beyond the reader's buffer, then a partial line, then EOF."""
    long = b"x" * 24 + b"\n"  # Longer than the 16-byte buffers.
    r = READERS[kind](b"a line\n" + long + b"extra")
    assert unpack_line(r) == b"a line\n"
    assert unpack_line(r) == long
    with pytest.raises(TruncatedFrameError) as info:
        unpack_line(r)
    assert info.value.data == b"extra"
    assert unpack_line(r) == b""  # The partial line was consumed.
    assert unpack_line(r) == b""


def test_unpack_line_reads_no_further() -> None:
    """unpack_line leaves the reader just past the newline."""
    r = io.BufferedReader(io.BytesIO(b"one\ntwo\n"), buffer_size=16)
    assert unpack_line(r) == b"one\n"
    assert r.read() == b"two\n"


def test_unpack_line_with_peek_only() -> None:
    """A reader with read and peek (no readline) is read through its buffer."""

    class Peeking:
        def __init__(self, data: bytes) -> None:
            self._r = io.BufferedReader(io.BytesIO(data), buffer_size=16)
            self.reads: list[int] = []

        def peek(self, n: int) -> bytes:
            return self._r.peek(n)

        def read(self, n: int) -> bytes:
            self.reads.append(n)
            return self._r.read(n)

    r = Peeking(b"ab\n" + b"y" * 40 + b"\n")
    assert unpack_line(r) == b"ab\n"
    assert r.reads == [3]  # One read, exactly through the newline.
    assert unpack_line(r) == b"y" * 40 + b"\n"
    assert unpack_line(r) == b""


def test_unpack_line_empty_input() -> None:
    """An empty input is a clean end."""
    assert unpack_line(io.BytesIO(b"")) == b""


# -- shared behaviour of the decoders ----------------------------------------


@pytest.mark.parametrize(
    ("f", "msg"),
    [(NDJSON, object()), (CSV, object()), (FIXED, object()), (NDJSON, 42), (CSV, "s")],
)
def test_unsupported_message_types(f: framing.Framing, msg: Any) -> None:
    """A message a framing cannot handle raises UnsupportedMessageError, and
    decoding into it consumes nothing."""
    with pytest.raises(UnsupportedMessageError):
        f.marshal(msg)
    frame = {NDJSON: b"{}\n", CSV: b"a\n", FIXED: FIXED.marshal(struct_pb2.Value())}[f]
    r = io.BytesIO(frame)
    with pytest.raises(UnsupportedMessageError):
        f.new_unmarshal_func(r)(msg)
    assert r.tell() == 0
    with pytest.raises(UnsupportedMessageError):
        f.unmarshal_frame(frame, msg)


@pytest.mark.parametrize("name", sorted(BUILT_INS))
def test_read_frames_rejects_bad_chunk_size(name: str) -> None:
    """read_frames needs a positive chunk size."""
    with pytest.raises(ValueError, match="chunk_size"):
        BUILT_INS[name].read_frames(io.BytesIO(b"x"), chunk_size=0)


@pytest.mark.parametrize("name", sorted(BUILT_INS))
def test_read_frames_offsets_are_relative_to_the_start(name: str) -> None:
    """Offsets count from the reader's position when iteration starts."""
    f = BUILT_INS[name]
    msg = {"ndjson": {"a": 1}, "csv": ["a"], "fixed": struct_pb2.Value(bool_value=True)}[name]
    frame = f.marshal(msg)
    r = io.BytesIO(b"skipped" + frame + frame)
    r.read(7)
    assert [(b, e) for b, e, _ in f.read_frames(r)] == [
        (0, len(frame)),
        (len(frame), 2 * len(frame)),
    ]


@pytest.mark.parametrize("name", sorted(BUILT_INS))
def test_read_frames_yields_as_soon_as_frames_arrive(name: str) -> None:
    """With a reader that returns a little at a time, each frame is yielded
    before anything past it is read (a follower of a live journal)."""
    f = BUILT_INS[name]
    msg = {"ndjson": {"a": 1}, "csv": ["a", "b"], "fixed": struct_pb2.Value(bool_value=True)}[name]
    frame = f.marshal(msg)
    r = ShortReader(frame * 3, max_read=len(frame))
    it = f.read_frames(r, chunk_size=1 << 20)
    for i in range(3):
        begin, end, _ = next(it)
        assert (begin, end) == (i * len(frame), (i + 1) * len(frame))
        assert r.tell() == end  # Nothing past this frame has been read.
    assert list(it) == []


def test_optional_capabilities_are_protocols_the_built_in_framings_declare() -> None:
    """What a bulk reader may use beyond ``Framing`` is declared as a
    protocol: NDJSON is a PlainJsonFraming, CSV a BatchFraming, fixed
    protobuf neither; a framing without the methods is not taken for one."""
    from framing import (
        BatchFraming,
        CSVFraming,
        JSONLinesFraming,
        PlainJsonFraming,
        ProtoFixedFraming,
    )

    assert isinstance(JSONLinesFraming(), PlainJsonFraming)
    assert isinstance(CSVFraming(), BatchFraming)
    assert not isinstance(CSVFraming(), PlainJsonFraming)
    assert not isinstance(ProtoFixedFraming(), BatchFraming)

    class NoBatches:
        content_type = "application/x-test"
        marshal = JSONLinesFraming.marshal
        new_unmarshal_func = JSONLinesFraming.new_unmarshal_func
        read_frames = JSONLinesFraming.read_frames
        unmarshal_frame = JSONLinesFraming.unmarshal_frame

    assert not isinstance(NoBatches(), BatchFraming)


def test_conformance_catches_a_broken_plain_json_promise() -> None:
    """check_framing holds a PlainJsonFraming to plain_dumps' promise."""
    from framing import JSONLinesFraming

    class Misleading(JSONLinesFraming):
        def plain_dumps(self) -> tuple[Any, set[type]]:
            return (lambda msg: b'{"other":1}'), {dict}

    with pytest.raises(AssertionError, match="plain_dumps"):
        check_framing(Misleading(), [{"s": "A"}, {"s": "B"}], dict)


def test_strategies_draw_encodable_messages() -> None:
    """Every framing strategy of tests/strategies.py draws messages its framing encodes."""
    from hypothesis import given, settings

    @settings(max_examples=25, deadline=None)
    @given(cases())
    def check(case: tuple[str, list[Any]]) -> None:
        name, msgs = case
        for m in msgs:
            assert BUILT_INS[name].marshal(m)

    check()
