"""The CSV framing: Gazette's csv_framing_test.go ported, RFC 4180 edge
cases, and agreement with Python's own csv module."""

from __future__ import annotations

import csv
import io
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framing import FrameDecodeError, FrameEncodeError, TruncatedFrameError
from tests.framing.support import CSV, READERS, Row
from tests.strategies import csv_records

U = "9f2ba8e4-2f6d-11ef-8000-0b1a2c3d4e5f"


class UUIDRecord(list[str]):
    """Gazette's CSVRecord: a list of fields whose first one is a UUID."""

    def marshal_csv(self) -> list[str]:
        return list(self)

    def unmarshal_csv(self, fields: list[str]) -> None:
        if not fields:
            raise ValueError("fields are empty")
        uuid.UUID(fields[0])
        self[:] = fields


# -- Gazette's csv_framing_test.go ----------------------------------------------


def test_marshal_with_fixtures() -> None:
    """Fields are quoted only when needed, quotes doubled (TestCSVFramingMarshalWithFixtures)."""
    buf = CSV.marshal(UUIDRecord([U, "123", 'qu"ote']))
    assert buf == f'{U},123,"qu""ote"\n'.encode()
    buf += CSV.marshal(UUIDRecord([U, "567,891"]))
    assert buf == f'{U},123,"qu""ote"\n{U},"567,891"\n'.encode()


@pytest.mark.parametrize("kind", sorted(READERS))
def test_decode_with_fixture(kind: str) -> None:
    """A record decodes into its fields, then EOF on the boundary
    (TestCSVFramingDecodeWithFixture)."""
    unmarshal = CSV.new_unmarshal_func(READERS[kind](f"{U},bar,baz\n".encode()))
    msg = UUIDRecord()
    unmarshal(msg)
    assert msg == [U, "bar", "baz"]
    with pytest.raises(EOFError):
        unmarshal(msg)


def test_errors_if_fields_change() -> None:
    """Every record of a reader has as many fields as the first
    (TestCSVFramingErrorsIfFieldsChange)."""
    fixture = f"{U},foo,bar\n{U},baz\n{U},x,y\n".encode()
    unmarshal = CSV.new_unmarshal_func(io.BytesIO(fixture))
    msg = UUIDRecord()
    unmarshal(msg)
    assert msg == [U, "foo", "bar"]
    with pytest.raises(FrameDecodeError, match="record on line 2: wrong number of fields"):
        unmarshal(msg)
    unmarshal(msg)  # The bad record was consumed; the next one decodes.
    assert msg == [U, "x", "y"]


def test_fields_change_line_counts_multiline_records() -> None:
    """The line number of a wrong-width record counts lines inside quotes."""
    unmarshal = CSV.new_unmarshal_func(io.BytesIO(b'"a\nb",c\nd\n'))
    unmarshal([])
    with pytest.raises(FrameDecodeError, match="on line 3"):
        unmarshal([])


def test_decode_error_from_the_hook_propagates() -> None:
    """The message's own validation error reaches the caller unchanged
    (TestCSVFramingDecodeError)."""
    unmarshal = CSV.new_unmarshal_func(io.BytesIO(b"not-a-uuid, bar, baz\n"))
    with pytest.raises(ValueError, match="badly formed hexadecimal UUID string") as info:
        unmarshal(UUIDRecord())
    assert not isinstance(info.value, FrameDecodeError)


# -- RFC 4180 decoding ----------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "fields"),
    [
        (b"a,b,c\n", ["a", "b", "c"]),
        (b"a,,b\n", ["a", "", "b"]),
        (b",,\n", ["", "", ""]),
        (b"a,\n", ["a", ""]),
        (b'""\n', [""]),
        (b'"",""\n', ["", ""]),
        (b'"a""b"\n', ['a"b']),
        (b'""""\n', ['"']),
        (b'"a,b",c\n', ["a,b", "c"]),
        (b'"line1\nline2",x\n', ["line1\nline2", "x"]),
        (b'"crlf\r\ninside"\n', ["crlf\r\ninside"]),
        (b"a,b\r\n", ["a", "b"]),  # A CRLF record ending.
        (b" a , b \n", [" a ", " b "]),  # Spaces are data.
        (b"\n", []),  # An empty line is a record of no fields.
        ("é,ü,日本\n".encode(), ["é", "ü", "日本"]),
        (b"no-newline", ["no-newline"]),  # unmarshal_frame takes a frame without one too.
        (b'x,"",y\n', ["x", "", "y"]),
    ],
)
def test_decode_rfc4180(record: bytes, fields: list[str]) -> None:
    """Records decode as RFC 4180 says."""
    msg: list[str] = ["stale"]
    CSV.unmarshal_frame(record, msg)
    assert msg == fields
    CSV.unmarshal_frame(memoryview(record), msg)
    assert msg == fields


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (b'a"b,c\n', 'bare "'),
        (b'"a"b\n', "extraneous text"),
        (b'"a" ,b\n', "extraneous text"),
        (b'"open\n', 'no closing "'),
        (b"a\rb\n", "line break"),
        (b"\xff\xfe\n", "not UTF-8"),
        (b'x,"a\nb\n', 'no closing "'),
    ],
)
def test_decode_errors(record: bytes, why: str) -> None:
    """Malformed records raise FrameDecodeError saying why, with the frame."""
    msg = ["kept"]
    with pytest.raises(FrameDecodeError, match=why) as info:
        CSV.unmarshal_frame(record, msg)
    assert info.value.data == record
    assert msg == ["kept"]


def test_decode_error_then_next_record() -> None:
    """A malformed record is consumed; the next one decodes, with its offset
    on the error."""
    unmarshal = CSV.new_unmarshal_func(io.BytesIO(b'a,b\n"c"d,e\nf,g\n'))
    msg: list[str] = []
    unmarshal(msg)
    with pytest.raises(FrameDecodeError) as info:
        unmarshal(msg)
    assert info.value.offset == 4
    unmarshal(msg)
    assert msg == ["f", "g"]


# -- RFC 4180 encoding ----------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "record"),
    [
        (["a", "b"], b"a,b\n"),
        ([""], b'""\n'),  # Not an empty line.
        ([], b"\n"),
        (["", ""], b",\n"),
        (["a b", " c "], b"a b, c \n"),  # Spaces need no quotes.
        (["x\ny"], b'"x\ny"\n'),
        (["cr\r"], b'"cr\r"\n'),
        (['"'], b'""""\n'),
        (("t", "u"), b"t,u\n"),  # A tuple is a record too.
    ],
)
def test_encode_rfc4180(fields: Any, record: bytes) -> None:
    """Records encode as RFC 4180 says, quoting only what needs it."""
    assert CSV.marshal(fields) == record
    assert CSV.marshal(Row(*fields)) == record


@pytest.mark.parametrize("fields", [["a", 1], [None], ["\ud800"]])
def test_encode_errors(fields: list[Any]) -> None:
    """A field that is not text raises FrameEncodeError."""
    with pytest.raises(FrameEncodeError):
        CSV.marshal(fields)


def test_marshal_csv_must_return_a_list() -> None:
    """A hook that returns something else than a list raises FrameEncodeError."""

    class Bad:
        def marshal_csv(self) -> str:
            return "a,b"

    with pytest.raises(FrameEncodeError, match="not a list of str"):
        CSV.marshal(Bad())


def test_hook_errors_propagate_unchanged() -> None:
    """What marshal_csv raises reaches the caller as it is."""

    class Failing:
        def marshal_csv(self) -> list[str]:
            raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        CSV.marshal(Failing())


# -- multi-line records on both read paths --------------------------------------

MULTI = b'1,"a\nb"\n2,"c\n\nd"\n3,"x""\ny"\n4,plain\n'
MULTI_FIELDS = [["1", "a\nb"], ["2", "c\n\nd"], ["3", 'x"\ny'], ["4", "plain"]]


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 8, 1 << 20])
def test_read_frames_is_quote_aware(chunk_size: int) -> None:
    """A record spanning lines inside quotes is one frame, at any chunk size."""
    got = list(CSV.read_frames(io.BytesIO(MULTI), chunk_size=chunk_size))
    frames = [bytes(f) for _, _, f in got]
    assert b"".join(frames) == MULTI
    decoded = []
    for _, _, frame in got:
        msg: list[str] = []
        CSV.unmarshal_frame(frame, msg)
        decoded.append(msg)
    assert decoded == MULTI_FIELDS


@pytest.mark.parametrize("kind", sorted(READERS))
def test_unmarshal_func_is_quote_aware(kind: str) -> None:
    """new_unmarshal_func reads a multi-line record whole, and no further."""
    unmarshal = CSV.new_unmarshal_func(READERS[kind](MULTI))
    for want in MULTI_FIELDS:
        msg: list[str] = []
        unmarshal(msg)
        assert msg == want
    with pytest.raises(EOFError):
        unmarshal([])


@pytest.mark.parametrize("cut", [1, 3, 4, 6, 7])
def test_truncated_inside_quotes(cut: int) -> None:
    """Input ending inside a quoted field (even after a newline) is truncated,
    on both paths, with all the record's bytes."""
    data = MULTI[:cut]
    with pytest.raises(TruncatedFrameError) as info:
        CSV.new_unmarshal_func(io.BytesIO(data))([])
    assert info.value.data == data
    with pytest.raises(TruncatedFrameError) as info:
        list(CSV.read_frames(io.BytesIO(data), chunk_size=2))
    assert (info.value.data, info.value.offset) == (data, 0)


# -- properties -----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(csv_records)
def test_round_trip(fields: list[str]) -> None:
    """Any record of text fields round-trips through a frame."""
    frame = CSV.marshal(fields)
    msg: list[str] = []
    CSV.unmarshal_frame(frame, msg)
    assert msg == fields
    CSV.new_unmarshal_func(io.BytesIO(frame))(msg)
    assert msg == fields


@settings(max_examples=150, deadline=None)
@given(csv_records)
def test_agrees_with_python_csv(fields: list[str]) -> None:
    """Python's csv module reads our records, and we read its records, alike."""
    frame = CSV.marshal(fields)
    assert next(csv.reader(io.StringIO(frame.decode(), newline=""))) == fields
    if any("\r" in f for f in fields):
        return  # Python writes a CR unquoted when lines end with LF; RFC 4180 does not.
    out = io.StringIO(newline="")
    csv.writer(out, lineterminator="\n").writerow(fields)
    msg: list[str] = []
    CSV.unmarshal_frame(out.getvalue().encode(), msg)
    assert msg == fields


@settings(max_examples=100, deadline=None)
@given(st.lists(csv_records, min_size=1, max_size=6), st.integers(1, 16))
def test_stream_round_trip(records: list[list[str]], chunk_size: int) -> None:
    """A stream of records of any widths splits into the same frames on the
    bulk path at any chunk size."""
    frames = [CSV.marshal(r) for r in records]
    got = list(CSV.read_frames(io.BytesIO(b"".join(frames)), chunk_size=chunk_size))
    assert [bytes(f) for _, _, f in got] == frames


def test_read_frames_pending_record_with_closed_quotes() -> None:
    """A record cut after its closing quote, its newline still to come, is not
    split at the newline inside its quotes when the next chunk has no quote."""
    data = b'"a\nb",c\nd,e\n'
    for chunk_size in range(1, len(data) + 1):
        got = [bytes(f) for _, _, f in CSV.read_frames(io.BytesIO(data), chunk_size=chunk_size)]
        assert got == [b'"a\nb",c\n', b"d,e\n"], chunk_size


def test_read_frames_without_quotes_stays_on_the_fast_path() -> None:
    """Records without quotes, cut anywhere by chunks, split at each newline."""
    data = b"".join(b"%d,x,y\n" % i for i in range(50))
    for chunk_size in (1, 7, 64):
        got = list(CSV.read_frames(io.BytesIO(data), chunk_size=chunk_size))
        assert [bytes(f) for _, _, f in got] == data.splitlines(keepends=True)
