"""Ready-made message types: each carries its UUID through its framing."""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass, field

import pytest
import uuid6

from framing import framing_by_content_type
from message import (
    NIL_UUID,
    CSVRecord,
    DataclassMessage,
    Flags,
    JsonDocument,
    build_uuid,
    document_type,
    get_clock,
    new_producer_id,
    proto_message_type,
    sortable_uuid,
)
from tests import examples_pb2

U = build_uuid(new_producer_id(), 0x1EF0123456789ABC, Flags.CONTINUE_TXN)


def round_trip(content_type: str, msg, empty):
    f = framing_by_content_type(content_type)
    frame = f.marshal(msg)
    f.new_unmarshal_func(io.BufferedReader(io.BytesIO(frame)))(empty)
    return empty


def test_json_document_default_and_custom_paths() -> None:
    """JsonDocument keeps the UUID at _meta/uuid, as its canonical string, so
    that a document equals itself read back; document_type puts it elsewhere."""
    d = JsonDocument(page="/")
    assert d.get_uuid() == NIL_UUID
    d.set_uuid(U)
    assert d == {"page": "/", "_meta": {"uuid": str(U)}}
    back = round_trip("application/x-ndjson", d, JsonDocument())
    assert back.get_uuid() == U and back["page"] == "/"
    assert back == d
    flat = document_type("id")
    f = flat(x=1)
    f.set_uuid(U)
    assert f == {"x": 1, "id": str(U)} and f.get_uuid() == U
    assert round_trip("application/x-ndjson", f, flat()) == f
    deep = document_type("a/b/c")
    g = deep()
    g.set_uuid(U)
    assert g["a"]["b"]["c"] == str(U) and g.get_uuid() == U
    v7 = uuid6.uuid7()  # a subclass of uuid.UUID
    h = JsonDocument(page="/")
    h.set_uuid(v7)
    assert h["_meta"]["uuid"] == str(v7)
    assert round_trip("application/x-ndjson", h, JsonDocument()) == h
    assert isinstance(d.new_acknowledgement("j"), JsonDocument)
    assert type(f.new_acknowledgement("j")) is flat
    with pytest.raises(ValueError):
        document_type("/")


def test_set_uuid_never_replaces_a_value_of_the_document() -> None:
    """A document whose UUID path holds something else than an object is an
    error, not a value silently replaced; a null is replaced."""
    d = JsonDocument(_meta="v1", page="/")
    with pytest.raises(TypeError, match="'_meta' is a str, not an object"):
        d.set_uuid(U)
    assert d == {"_meta": "v1", "page": "/"}
    deep = document_type("a/b/c")
    g = deep(a={"b": [1, 2]})
    with pytest.raises(TypeError, match="'a/b' is a list"):
        g.set_uuid(U)
    assert g == {"a": {"b": [1, 2]}}
    n = JsonDocument(_meta=None)
    n.set_uuid(U)
    assert n.get_uuid() == U


def test_publishing_such_a_document_appends_nothing() -> None:
    from journal import MemoryJournalClient
    from message import Publisher

    with MemoryJournalClient() as client:
        client.create("j/0", {"content-type": "application/x-ndjson"})
        pub = Publisher(client)
        with pytest.raises(TypeError):
            pub.publish_committed(lambda _m: ("j/0", "application/x-ndjson"),
                                  JsonDocument(_meta=7))
        assert client.head("j/0") == 0
        pub.publish_committed(lambda _m: ("j/0", "application/x-ndjson"),
                              JsonDocument(v=1)).result()
        assert client.head("j/0") > 0


@pytest.mark.parametrize(
    "value", [None, 7, "not-a-uuid", "", {"uuid": 1}, "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"]
)
def test_json_document_bad_uuid_is_nil(value) -> None:
    """A document whose UUID slot holds something else reads as the nil UUID."""
    assert JsonDocument(_meta={"uuid": value}).get_uuid() == NIL_UUID
    assert JsonDocument(_meta=value).get_uuid() == NIL_UUID


def test_json_document_accepts_other_uuid_spellings() -> None:
    """Braced, URN and hyphen-less UUID strings parse too."""
    for text in ("{" + str(U) + "}", f"urn:uuid:{U}", U.hex, str(U).upper()):
        assert JsonDocument(_meta={"uuid": text}).get_uuid() == U


@dataclass
class View(DataclassMessage):
    page: str
    count: int = 0
    tags: list[str] = field(default_factory=list)
    uuid: uuid.UUID = NIL_UUID


def test_dataclass_message_round_trip_and_ack() -> None:
    """A DataclassMessage round-trips its UUID through NDJSON; its ACK has defaults."""
    v = View("/home", 3, ["a"])
    v.set_uuid(U)
    back = round_trip("application/x-ndjson", v, View(""))
    assert back == v and back.get_uuid() == U
    ack = v.new_acknowledgement("j")
    assert ack == View("", 0, [], NIL_UUID)


def test_csv_record() -> None:
    """CSVRecord's first field is the UUID; fields with commas, quotes and newlines survive."""
    r = CSVRecord(["", 'a,b', 'say "hi"', "two\nlines"])
    r.set_uuid(U)
    back = round_trip("text/csv", r, CSVRecord())
    assert back == r and back.get_uuid() == U
    assert CSVRecord().get_uuid() == NIL_UUID
    empty = CSVRecord()
    empty.set_uuid(U)
    assert empty == [str(U)]
    with pytest.raises(ValueError):
        CSVRecord().unmarshal_csv(["not a uuid", "x"])


@pytest.mark.parametrize("pb_class", [examples_pb2.PageView, examples_pb2.PageViewText])
def test_proto_message_bytes_and_string_uuid_fields(pb_class) -> None:
    """proto_message_type wraps a protobuf class whose uuid field is bytes or string."""
    t = proto_message_type(pb_class)
    m = t(session="s1", page="/p", duration_ms=12)
    m.set_uuid(U)
    raw = m.pb.uuid
    assert raw == (U.bytes if isinstance(raw, bytes) else str(U))
    back = round_trip("application/x-protobuf-fixed", m, t())
    assert back == m and back.get_uuid() == U and back.pb.page == "/p"
    assert t().get_uuid() == NIL_UUID
    assert isinstance(m.new_acknowledgement("j"), t)
    with pytest.raises(ValueError):
        proto_message_type(pb_class, "session_missing")
    with pytest.raises(ValueError):
        proto_message_type(pb_class, "duration_ms")


def test_sortable_uuid_orders_by_clock() -> None:
    """The v6 form of message UUIDs sorts by clock, across producers."""
    ids = [new_producer_id() for _ in range(5)]
    us = [build_uuid(ids[i % 5], 0x1EF00000000000 + i * 7, i % 3) for i in range(50)]
    v6 = [sortable_uuid(u) for u in us]
    assert all(x.version == 6 for x in v6)
    assert [v.bytes for v in v6] == sorted(v.bytes for v in v6)
    assert [get_clock(u) for u in us] == sorted(get_clock(u) for u in us)


@pytest.mark.parametrize(
    "msg",
    [
        JsonDocument(_meta={"uuid": str(U)}),
        JsonDocument(_meta={"uuid": U}),
        JsonDocument(_meta={"uuid": "{" + str(U) + "}"}),
        JsonDocument(_meta={"uuid": "garbage-but-36-characters-long-xxxxx"}),
        JsonDocument(),
        CSVRecord([str(U), "x"]),
        CSVRecord(["nope"]),
        CSVRecord(),
        proto_message_type(examples_pb2.PageView)(uuid=U.bytes),
        proto_message_type(examples_pb2.PageView)(uuid=b"short"),
        proto_message_type(examples_pb2.PageViewText)(uuid=str(U)),
    ],
)
def test_uuid_int_shortcut_agrees_with_get_uuid(msg) -> None:
    """The Sequencer's int shortcut for ready-made types gives get_uuid().int."""
    from message._uuid import UUID_INT_OF

    assert UUID_INT_OF[type(msg)](msg) == msg.get_uuid().int


def test_subclass_with_its_own_get_uuid_gets_no_shortcut() -> None:
    """A JsonDocument subclass that overrides get_uuid is asked through it."""
    from message._uuid import UUID_INT_OF

    class Custom(JsonDocument):
        def get_uuid(self) -> uuid.UUID:
            return U

    assert Custom not in UUID_INT_OF and document_type("x/y") not in UUID_INT_OF


@pytest.mark.parametrize("thing", [len, uuid, object, "PageView"])
def test_proto_message_type_rejects_what_is_not_a_protobuf_class(thing) -> None:
    """proto_message_type of something that is not a generated class is a TypeError."""
    with pytest.raises(TypeError):
        proto_message_type(thing)
