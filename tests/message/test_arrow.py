"""message.arrow: committed reads as Arrow record batches.

The differential property test is the contract: on random workloads
(transactions, roll-backs, duplicates, unknown flags, nil UUIDs), for every
ring size of ``ReadCommittedIter``'s Sequencer and any batch size of the
Arrow reader, both readers agree row for row; a checkpoint taken by either
at a random cut resumes in either with nothing lost or repeated.
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

import orjson  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from framing import FramingError  # noqa: E402
from journal import LocalJournalStore, MemoryJournalClient  # noqa: E402
from message import (  # noqa: E402
    Checkpoint,
    CSVRecord,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    Transaction,
    _core,
    get_flags,
)
from message.arrow import (  # noqa: E402
    ENVELOPE_FIELDS,
    ReadCommittedArrow,
    ReadUncommittedArrow,
    infer_json_fields,
)
from tests.strategies import Workload, workloads  # noqa: E402

NDJSON = {"content-type": "application/x-ndjson"}
SCHEMA = pa.schema([("s", pa.string()), ("n", pa.int64())])
Row = tuple[str, int, int, str, int, str | None, int | None]


@pytest.fixture(autouse=True)
def _quiet_sequencer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="message")  # unknown flags, old ACKs


def _store(w: Workload) -> MemoryJournalClient:
    """The workload's frames as NDJSON journals (each envelope a line)."""
    client = MemoryJournalClient()
    for name in w.journals:
        client.create(name, NDJSON)
    for i, env in enumerate(w.envelopes):
        doc = {"_meta": {"uuid": str(env.message.get_uuid())}, "s": env.message.text, "n": i}
        client.append(env.journal.name, orjson.dumps(doc) + b"\n").result()
    return client


def _iter_rows(it: Any, stop: int | None = None) -> list[Row]:
    rows: list[Row] = []
    for env in it:
        if get_flags(env.message.get_uuid()) != 2:
            m = env.message
            rows.append((env.journal.name, env.begin, env.end, str(m.get_uuid()),
                         it.commit_offset, m.get("s"), m.get("n")))
        if stop is not None and len(rows) >= stop:
            break
    return rows


def _batch_rows(batches: Any) -> list[Row]:
    rows: list[Row] = []
    for b in batches:
        d = b.to_pydict()
        rows += list(zip(d["journal"], d["begin"], d["end"], d["uuid"], d["commit_offset"],
                         d["s"], d["n"], strict=True))
    return rows


def _new_doc(spec: Any) -> JsonDocument:
    return JsonDocument()


def _committed(
    client: Any, journal: str, ring: int, cp: Checkpoint | None = None
) -> ReadCommittedIter:
    return ReadCommittedIter(client, journal, _new_doc, Sequencer(buffer=ring),
                             checkpoint=cp)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), ring=st.integers(1, 50), batch=st.integers(1, 600), data=st.data())
def test_both_readers_agree_row_for_row(w: Workload, ring: int, batch: int, data: Any) -> None:
    client = _store(w)
    for name in w.journals:
        expected = _iter_rows(_committed(client, name, ring))
        arrow = ReadCommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch)
        batches = list(arrow)
        assert _batch_rows(batches) == expected
        assert all(b.schema == arrow.schema for b in batches)

        # The Arrow reader's checkpoint after k batches resumes in either reader.
        k = data.draw(st.integers(0, len(batches)), label="batches before the checkpoint")
        first = ReadCommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch)
        head = _batch_rows(next(first) for _ in range(k))
        cp = Checkpoint.from_bytes(first.checkpoint().to_bytes())
        assert head + _iter_rows(_committed(client, name, ring, cp)) == expected
        again = ReadCommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch, checkpoint=cp)
        assert head + _batch_rows(again) == expected

        # ReadCommittedIter's checkpoint at any cut (mid-transaction too)
        # resumes in the Arrow reader.
        cut = data.draw(st.integers(0, len(expected)), label="rows before the checkpoint")
        it = _committed(client, name, ring)
        head = _iter_rows(it, stop=cut) if cut else []
        cp = it.checkpoint()
        resumed = ReadCommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch, checkpoint=cp)
        assert head + _batch_rows(resumed) == expected
        # Their states agree at the end of the journal.
        whole = _committed(client, name, ring)
        list(whole)
        ours = ReadCommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch)
        list(ours)
        assert _states(ours.checkpoint()) == _states(whole.checkpoint())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), buckets=st.integers(2, 5), batch=st.integers(1, 600))
def test_buckets_split_the_committed_rows_between_them(
    w: Workload, buckets: int, batch: int
) -> None:
    """Readers of the buckets of a journal (the Spark tasks of one journal:
    each parses every UUID, and the content of its own producers' lines)
    deliver, between them, every committed row once, with its content."""
    client = _store(w)
    for name in w.journals:
        expected = _iter_rows(_committed(client, name, 8))
        got: list[Row] = []
        for b in range(buckets):
            got += _batch_rows(ReadCommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch,
                                                  bucket=b, buckets=buckets))
        assert sorted(got) == sorted(expected)
        every = ReadUncommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch).read_all()
        split = sum(ReadUncommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch,
                                         bucket=b, buckets=buckets).read_all().num_rows
                    for b in range(buckets))
        assert split == every.num_rows


def _states(cp: Checkpoint) -> tuple[dict[str, int], set[tuple[str, bytes, int, int]]]:
    return cp.offsets, {(s.journal, s.producer, s.last_ack, s.begin) for s in cp.states}


@settings(max_examples=40, deadline=None)
@given(w=workloads(), batch=st.integers(1, 400))
def test_acks_included_and_uncommitted(w: Workload, batch: int) -> None:
    client = _store(w)
    name = w.journals[0]
    with _committed(client, name, 8) as it:
        expected = [(e.begin, it.commit_offset) for e in it]
    got = ReadCommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch,
                             include_acks=True).read_all()
    assert list(zip(got["begin"].to_pylist(), got["commit_offset"].to_pylist(),
                    strict=True)) == expected
    every = ReadUncommittedArrow(client, name, schema=SCHEMA, batch_bytes=batch).read_all()
    with ReadUncommittedIter(client, name, _new_doc) as un:
        assert every["begin"].to_pylist() == [e.begin for e in un]


def test_selector_buckets_and_schema(tmp_path: Any) -> None:
    with LocalJournalStore(tmp_path) as store:
        for i in range(3):
            store.create(f"clicks/{i}", {**NDJSON, "app": "clicks"})
        parts = store.list("app=clicks")
        pubs = [Publisher(store) for _ in range(4)]
        for i in range(300):
            spec = parts[i % 3]
            pubs[i % 4].publish_committed(lambda d, s=spec: (s.name, s.content_type),
                                          JsonDocument(page=f"/{i}", n=i))
        txn = Transaction(Publisher(store))
        for i in range(5):
            txn.publish(lambda d: (parts[0].name, parts[0].content_type), JsonDocument(n=1000 + i))
        txn.abort()
        store.flush()
        table = ReadCommittedArrow(store, selector="app=clicks").read_all()
        assert table.schema.names == [*(n for n, _ in ENVELOPE_FIELDS), "page", "n"]
        assert sorted(table["n"].to_pylist()) == list(range(300))
        parts_of = [
            ReadCommittedArrow(store, selector="app=clicks", bucket=b, buckets=3).read_all()
            for b in range(3)
        ]
        assert sorted(n for t in parts_of for n in t["n"].to_pylist()) == list(range(300))


def test_csv_and_skip_corrupt(tmp_path: Any) -> None:
    with LocalJournalStore(tmp_path) as store:
        spec = store.create("rows", {"content-type": "text/csv"})
        pub = Publisher(store)
        for i in range(10):
            pub.publish_committed(lambda r: (spec.name, spec.content_type),
                                  CSVRecord(["", f"r{i}", str(i)]))
        store.flush()
        schema = [("name", pa.string()), ("n", pa.int64())]
        table = ReadCommittedArrow(store, "rows", schema=schema, batch_bytes=64).read_all()
        assert table["n"].to_pylist() == list(range(10))

        nd = store.create("docs", NDJSON)
        for i in range(4):
            pub.publish_committed(lambda d: (nd.name, nd.content_type), JsonDocument(n=i))
            if i == 1:
                store.append("docs", b"{not json\n").result()
        store.flush()
        reader = ReadCommittedArrow(store, "docs", schema=[("n", pa.int64())])
        with pytest.raises(FramingError) as err:
            list(reader)
        assert err.value.journal == "docs"  # type: ignore[attr-defined]
        assert "of journal docs" in str(err.value)  # (what Spark shows is the message)
        skipped: list[Exception] = []
        reader = ReadCommittedArrow(store, "docs", schema=[("n", pa.int64())],
                                    skip_corrupt=True, on_skip=skipped.append)
        assert reader.read_all()["n"].to_pylist() == [0, 1, 2, 3]
        assert reader.skipped == 1 and len(skipped) == 1


def test_inferred_schema_and_empty_journal(tmp_path: Any) -> None:
    with LocalJournalStore(tmp_path) as store:
        spec = store.create("docs", NDJSON)
        assert ReadCommittedArrow(store, "docs").read_all().num_rows == 0
        pub = Publisher(store)
        pub.publish_committed(lambda d: (spec.name, spec.content_type),
                              JsonDocument(page="/", n=1, nested={"a": 1})).result()
        table = ReadCommittedArrow(store, "docs").read_all()
        assert table.column_names[len(ENVELOPE_FIELDS):] == ["page", "n"]
        assert table["uuid"][0].as_py() == str(uuid.UUID(table["uuid"][0].as_py()))


def test_inference_unifies_the_types_a_field_takes(tmp_path: Any) -> None:
    """A field with two types in one journal (or across journals) is a
    string, integers and floats a float, nested values left out unless a
    scalar shares their name; no field's mix hides the other fields."""
    with LocalJournalStore(tmp_path) as store:
        a, b = store.create("mix/a", NDJSON), store.create("mix/b", NDJSON)
        pub = Publisher(store)
        for spec, doc in [(a, JsonDocument(k=1, x=1, n={"a": 1}, page="/")),
                          (a, JsonDocument(k="one", x=2.5, n={"b": 2}, page="/b")),
                          (b, JsonDocument(k=3, x=3, m=[1], ok=True)),
                          (b, JsonDocument(m="text", ok=None))]:
            pub.publish_committed(lambda d, s=spec: (s.name, s.content_type), doc).result()
        fields = infer_json_fields(store, [a, b])
    assert fields == [("k", pa.string()), ("x", pa.float64()), ("page", pa.string()),
                      ("m", pa.string()), ("ok", pa.bool_())]


def test_maps_and_json_text_in_string_columns(tmp_path: Any) -> None:
    """A map column reads a JSON object (Arrow's own JSON reader cannot: the
    exact path does it); a string column over a value that is not a string
    holds its JSON text, as Spark's JSON reader gives it."""
    with LocalJournalStore(tmp_path) as store:
        spec = store.create("docs", NDJSON)
        pub = Publisher(store)
        for i in range(3):
            pub.publish_committed(lambda d: (spec.name, spec.content_type),
                                  JsonDocument(m={"a": i}, s={"x": [1, 2]}, t=i == 1)).result()
        table = ReadCommittedArrow(store, "docs", schema=[
            ("m", pa.map_(pa.string(), pa.int64())), ("s", pa.string()), ("t", pa.string())
        ]).read_all()
    assert table.column("m").to_pylist() == [[("a", 0)], [("a", 1)], [("a", 2)]]
    assert table.column("s").to_pylist() == ['{"x":[1,2]}'] * 3
    assert table.column("t").to_pylist() == ["false", "true", "false"]


@pytest.mark.parametrize("exact", [False, True])
def test_decimals_binary_and_non_finite_floats_round_trip(tmp_path: Any, exact: bool) -> None:
    """What a write puts in a journal as Spark's to_json does (a decimal's
    exact number, binary data as base64, NaN and infinities as strings) reads
    back as it was, in bulk and frame by frame (a map column sends the read
    that way): no decimal through a float, no base64 text for the bytes."""
    from decimal import Decimal

    from message.arrow import json_values

    big = Decimal("123456789012345.12345")
    values = {
        "d": pa.array([big, Decimal("-0.00001"), None], pa.decimal128(20, 5)),
        "b": pa.array([b"\x00\xff", b"", None], pa.binary()),
        "f": pa.array([float("nan"), float("inf"), -float("inf")], pa.float64()),
    }
    docs = [{name: json_values(col)[i] for name, col in values.items()} for i in range(3)]
    assert docs[0]["f"] == "NaN" and docs[0]["b"] == "AP8="
    schema = [("d", pa.decimal128(20, 5)), ("b", pa.binary()), ("f", pa.float64())]
    if exact:
        schema.append(("m", pa.map_(pa.string(), pa.int64())))
    with LocalJournalStore(tmp_path) as store:
        spec = store.create("docs", NDJSON)
        pub = Publisher(store)
        for doc in docs:
            pub.publish_committed(lambda d: (spec.name, spec.content_type),
                                  JsonDocument(doc, m={"k": 1})).result()
        table = ReadCommittedArrow(store, "docs", schema=schema).read_all()
    assert table.column("d").to_pylist() == [big, Decimal("-0.00001"), None]
    assert table.column("b").to_pylist() == [b"\x00\xff", b"", None]
    f = table.column("f").to_pylist()
    assert math.isnan(f[0]) and f[1:] == [float("inf"), -float("inf")]


@pytest.mark.parametrize("where", ["struct", "fixed_size_list", "map"])
def test_decimals_at_any_depth_are_exact(tmp_path: Any, where: str) -> None:
    """Decimals inside a struct, a list of fixed size or a map's items read
    exactly (no float on the way), frame by frame (a map column)."""
    from decimal import Decimal

    from message.arrow import json_values

    big = Decimal("123456789012345.12345")
    dec = pa.decimal128(20, 5)
    typ, value = {
        "struct": (pa.struct([("d", dec)]), {"d": big}),
        "fixed_size_list": (pa.list_(dec, 2), [big, Decimal("0.00001")]),
        "map": (pa.map_(pa.string(), dec), [("k", big)]),
    }[where]
    # The column with the decimals, and a map of integers (read frame by frame).
    schema = [("c", typ), ("x", pa.map_(pa.string(), pa.int64()))]
    with LocalJournalStore(tmp_path) as store:
        spec = store.create("docs", NDJSON)
        # As a write puts them: each decimal its exact number in the JSON.
        doc = JsonDocument(c=json_values(pa.array([value], typ))[0], x={"k": 1})
        Publisher(store).publish_committed(
            lambda d: (spec.name, spec.content_type), doc).result()
        table = ReadCommittedArrow(store, "docs", schema=schema).read_all()
    assert table.column("c").to_pylist() == [value]


def test_csv_fields_are_inferred_by_position(tmp_path: Any) -> None:
    """Without a schema, a CSV journal's fields after the UUID are string
    columns _c1, _c2, ... (as wide as its widest record)."""
    from message import CSVRecord

    with LocalJournalStore(tmp_path) as store:
        spec = store.create("csv", {"content-type": "text/csv"})
        pub = Publisher(store)
        to = lambda d: (spec.name, spec.content_type)  # noqa: E731
        pub.publish_committed(to, CSVRecord(["", "a", "1"])).result()
        pub.publish_uncommitted(to, CSVRecord(["", "b", "2, with a comma"])).result()
        for intent in pub.build_ack_intents():
            store.append(intent.journal, intent.intent).result()
        table = ReadCommittedArrow(store, "csv").read_all()
    assert table.column_names[len(ENVELOPE_FIELDS):] == ["_c1", "_c2"]
    assert table.column("_c1").to_pylist() == ["a", "b"]
    assert table.column("_c2").to_pylist() == ["1", "2, with a comma"]


def test_blank_lines_and_values_of_another_type_take_the_exact_path(tmp_path: Any) -> None:
    """Windows Arrow will not take as they are (a blank line, which the
    framing calls corrupt; a field of another type than the schema's) are
    decoded frame by frame, with the rows and errors ReadCommittedIter gives."""
    with LocalJournalStore(tmp_path) as store:
        spec = store.create("docs", NDJSON)
        pub = Publisher(store)
        for i in range(6):
            value: Any = i if i != 3 else "three"
            pub.publish_committed(lambda d: (spec.name, spec.content_type),
                                  JsonDocument(n=value, s=f"s{i}")).result()
            if i == 1:
                store.append("docs", b"\n").result()
        with pytest.raises(FramingError):
            ReadCommittedArrow(store, "docs", schema=SCHEMA).read_all()
        with ReadCommittedIter(store, "docs", _new_doc, skip_corrupt=True) as it:
            expected = [(e.begin, e.message["s"]) for e in it]
        table = ReadCommittedArrow(store, "docs", schema=SCHEMA, skip_corrupt=True,
                                   on_skip=lambda e: None).read_all()
        assert list(zip(table["begin"].to_pylist(), table["s"].to_pylist(),
                        strict=True)) == expected
        assert table["n"].to_pylist() == [0, 1, 2, None, 4, 5]


_LINE_PARTS = st.sampled_from([
    b'{"_meta":{"uuid":"%s"},"n":1}', b'{"_meta":{"uuid":"%s"}}',
    b'{"_meta":{"uuid":"%s"},"s":"a"}',
    b'{"_meta":{"uuid":"%s"},"_meta":{"uuid":"%s"}}', b'{"_meta":{"uuid":"%s"},"\\u005fmeta":1}',
    b'{"_meta":{"uuid":"%s"},"s":"\\\\u"}', b'{"_meta":{"uuid":"%s"},"s":"_meta"}',
    b'{"_meta":{"uuid":"%s"},"s":"\\"_meta\\""}', b'{"_meta":{"uuid":"%s","x":1}}',
    b'{"_meta": {"uuid":"%s"}}', b'{"s":1,"_meta":{"uuid":"%s"}}', b'{"_meta":{"uuid":"%s"}x',
    b'{"_meta":{"uuid":"%s"}', b'{"uuid":"%s"}',
])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_LINE_PARTS, st.sampled_from(
    ["9f2a6e1c-0000-1000-8000-0a0b0c0d0e0f", "9F2A6E1C-0000-1000-8000-0A0B0C0D0E0F",
     "9f2a6e1c-0000-1000-8000-0a0b0c0d0e0", "9f2a6e1c00001000-8000-0a0b0c0d0e0f0",
     "{9f2a6e1c-0000-1000-8000-0a0b0c0d0e}", "9f2a6e1c-0000-1000-8000-0a0b0c0d0e0g"])),
    max_size=8), st.sampled_from([("_meta", "uuid"), ("uuid",)]))
def test_uuids_from_the_bytes_of_lines(
    lines: list[tuple[bytes, str]], path: tuple[str, ...]
) -> None:
    """``prefixed_uuids`` reads the UUIDs of lines that begin with them as
    the framing writes them, and gives up on anything else: another key of
    the UUID's name (spelled with an escape too), a UUID not canonical, a
    layout of its own. Native and numpy agree."""
    import numpy as np

    from message import columns

    raw = [part.replace(b"%s", text.encode()) for part, text in lines]
    data = b"".join(line + b"\n" for line in raw)
    ends = np.cumsum([len(line) + 1 for line in raw]).astype(np.int64)
    begins = ends - np.array([len(line) + 1 for line in raw], dtype=np.int64)
    keys = [orjson.dumps(k) for k in path]
    layout = (b"{" + b"".join(k + b":{" for k in keys[:-1]) + keys[-1] + b':"',
              b'"' + b"}" * (len(path) - 1), keys[0])
    got = columns.prefixed_uuids(data, begins, ends, *layout)
    if got is not None and raw:  # then each line holds its UUID once, where Arrow finds it
        table = pa.json.read_json(pa.BufferReader(data))
        col: Any = table.column(path[0]).combine_chunks()
        for key in path[1:]:
            col = col.field(key)
        want = [uuid.UUID(text).int for text in col.to_pylist()]
        assert [(int(h) << 64) | int(v) for h, v in zip(*got, strict=True)] == want
    if _core.NATIVE is not None:
        hi, lo = np.zeros(len(raw), np.uint64), np.zeros(len(raw), np.uint64)
        assert _core.NATIVE.prefixed_uuids(data, ends, *layout, hi, lo) == (got is not None)
        saved = columns.NATIVE
        columns.NATIVE = None
        try:
            again = columns.prefixed_uuids(data, begins, ends, *layout)
        finally:
            columns.NATIVE = saved
        if again is None or got is None:
            assert again is None and got is None
        else:
            assert again[0].tolist() == got[0].tolist() and again[1].tolist() == got[1].tolist()


def test_lines_with_their_uuid_key_twice_take_arrows_way(tmp_path: Any) -> None:
    """A document whose UUID's key comes twice (plainly, or spelled with an
    escape) is not read from its bytes: the rows are ReadCommittedIter's."""
    with LocalJournalStore(tmp_path) as store:
        store.create("docs", NDJSON)
        u = [str(uuid.UUID(int=(0x1EF00000 << 96) | (i << 64) | (0x8000 << 48) | 7))
             for i in range(1, 5)]
        lines = [
            '{"_meta":{"uuid":"U0"},"s":"a","n":1}',
            '{"_meta":{"uuid":"U1"},"s":"b","n":2,"\\u005fmeta":{"uuid":"U2"}}',
            '{"_meta":{"uuid":"U3"},"s":"c","n":3}',
        ]
        for i, text in enumerate(u):
            lines = [line.replace(f"U{i}", text) for line in lines]
        store.append("docs", "".join(line + "\n" for line in lines).encode()).result()
        expected = _iter_rows(ReadCommittedIter(store, "docs", _new_doc))
        assert _batch_rows(ReadCommittedArrow(store, "docs", schema=SCHEMA)) == expected


class _CountingClient(MemoryJournalClient):
    """Counts the reads of journals."""

    reads = 0

    def read(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return super().read(*args, **kwargs)


@pytest.mark.parametrize(("batch", "one_read"), [(150, False), (1500, True)])
def test_spans_across_windows_are_replayed_from_memory(batch: int, one_read: bool) -> None:
    """Transactions of interleaved producers, each spanning several windows
    (some rolled back, some of duplicates), give ReadCommittedIter's rows.
    The frames of the spans open at a window's end are kept (up to
    ``batch_bytes`` of them): committing them reads nothing again; beyond
    that, they are read again from the journal."""
    from message import Flags, build_uuid

    client = _CountingClient()
    client.create("txns", NDJSON)
    producers = [bytes([0, 0, 0, 0, 0, p]) for p in range(1, 4)]
    clock = [100, 100, 100]
    lines = []
    for step in range(60):
        i = step % 3
        clock[i] += 1
        flags = Flags.ACK_TXN if step % 7 == i else Flags.CONTINUE_TXN
        if step % 11 == 0:
            clock[i] -= 1  # a duplicate clock: dropped
        if step == 40:
            flags, clock[i] = Flags.ACK_TXN, 50  # a roll-back
        doc = {"_meta": {"uuid": str(build_uuid(producers[i], clock[i], flags))}, "s": "x",
               "n": step}
        lines.append(orjson.dumps(doc) + b"\n")
    client.append("txns", b"".join(lines)).result()
    expected = _iter_rows(_committed(client, "txns", 4))
    assert len(expected) > 10
    client.reads = 0
    got = _batch_rows(ReadCommittedArrow(client, "txns", schema=SCHEMA, batch_bytes=batch))
    assert got == expected
    # 4.3 kB in windows of 1500 bytes: the open spans fit; in windows of 150, not.
    assert (client.reads == 1) == one_read


# -- rows back into frames ----------------------------------------------------


def test_ndjson_frames_are_json_documents_framed_one_by_one() -> None:
    """``ndjson_frames`` writes the bytes the NDJSON framing writes for each
    row as a ``JsonDocument`` stamped with its UUID: for every Arrow type
    (kernels for integers, booleans and strings, orjson for the others),
    strings that need escaping, nulls, NaN and infinities."""
    import datetime
    import random

    import pyarrow as pa

    from framing import framing_by_content_type
    from message import Flags, build_uuid
    from message.arrow import ndjson_frames
    from message.columns import uuid_strings

    rnd = random.Random(7)
    alphabet = ["a", '"', "\\", "\x00", "\x1f", "\x7f", "é", "\u2028", "😀", " ", "\n"]

    def text() -> str | None:
        return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 6))) \
            if rnd.random() > 0.2 else None

    n = 600
    t0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    batch = pa.record_batch({
        "i": pa.array([rnd.choice([None, rnd.randint(-2**63, 2**63 - 1)]) for _ in range(n)],
                      pa.int64()),
        "u8": pa.array([rnd.randint(0, 255) for _ in range(n)], pa.uint8()),
        "b": pa.array([rnd.choice([None, True, False]) for _ in range(n)]),
        "s": pa.array([text() for _ in range(n)]),
        "ls": pa.array([text() for _ in range(n)], pa.large_string()),
        "f": pa.array([rnd.choice([None, 1.0, 0.1, 1e20, -0.0, float("nan"), float("inf"),
                                   rnd.random()]) for _ in range(n)]),
        "t": pa.array([t0 + datetime.timedelta(microseconds=rnd.randint(0, 10**12))
                       for _ in range(n)], pa.timestamp("us", tz="UTC")),
        "l": pa.array([rnd.choice([[1, 2], [], None]) for _ in range(n)]),
        "st": pa.array([{"x": 1, "y": 'q"'}] * n),
        'a "key"': pa.array(range(n)),
    })
    producer = bytes.fromhex("0a0b0c0d0e0f")
    ndjson = framing_by_content_type("application/x-ndjson")
    # NaN and infinities as Spark's to_json writes them (orjson alone would
    # write null, and the value would be lost).
    spark_floats = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

    def as_spark(row: dict[str, Any]) -> dict[str, Any]:
        return {k: spark_floats.get(str(v), v) if isinstance(v, float) else v
                for k, v in row.items()}

    expected = b"".join(
        ndjson.marshal(JsonDocument({**as_spark(row), "_meta": {
            "uuid": build_uuid(producer, 1000 + i, Flags.CONTINUE_TXN)}}))
        for i, row in enumerate(batch.to_pylist()))
    assert b'"f":"NaN"' in expected and b'"f":"Infinity"' in expected
    uuids = uuid_strings(producer, 1000, n, Flags.CONTINUE_TXN)
    assert ndjson_frames(batch, uuids) == expected
    deep = ndjson_frames(batch.slice(5, 3), uuids[:108], ("a", "b", "c"))
    assert deep is not None
    assert [orjson.loads(line)["a"]["b"]["c"] for line in deep.splitlines()] == \
        [uuids[i:i + 36].decode() for i in range(0, 108, 36)]
    assert ndjson_frames(batch.slice(0, 0), b"") == b""
    assert ndjson_frames(batch, uuids, ("s", "uuid")) is None  # the UUID would go inside "s"
    with pytest.raises(ValueError, match="bytes of UUIDs"):
        ndjson_frames(batch, uuids[:-1])


# -- the native core against the numpy definitions ------------------------------

needs_native = pytest.mark.skipif(_core.NATIVE is None, reason="the native core is not in use")


@st.composite
def _frame_columns(draw: Any) -> tuple[Any, ...]:
    """Frames as columns (offsets, producers, clocks, flags: duplicates,
    roll-backs, reused clocks, unknown flags, clock 0), some marked replayed,
    and producer states before them (some with an open span)."""
    import numpy as np

    from message._columns_sequencer import ProducerColumns

    n = draw(st.integers(0, 60))
    producers = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    clocks = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    flags = draw(st.lists(st.sampled_from([0, 0, 1, 1, 1, 2, 2, 3]), min_size=n, max_size=n))
    replayed = draw(st.integers(0, n))
    known = draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 12), st.integers(-1, 3)),
                          max_size=6))
    states = ProducerColumns.of([(p, a, b if b < 0 else 100 * b) for p, a, b in known])
    mask = np.zeros(n, dtype=bool)
    mask[:replayed] = True
    return (np.arange(n, dtype=np.int64) * 10, np.array(producers, dtype=np.uint64),
            np.array(clocks, dtype=np.uint64), np.array(flags, dtype=np.int32), states,
            mask if replayed and draw(st.booleans()) else None)


@needs_native
@settings(max_examples=400, deadline=None)
@given(_frame_columns())
def test_native_sequence_columns_is_the_numpy_definition(cols: tuple[Any, ...]) -> None:
    """The native ``sequence_columns`` gives the numpy definition's commit
    offsets and producer states, for any frames and states."""
    import numpy as np

    from message._columns_sequencer import numpy_sequence_columns, sequence_columns

    begin, producers, clocks, flags, states, replayed = cols
    want, want_states = numpy_sequence_columns(begin, producers, clocks, flags, states, replayed)
    got, got_states = sequence_columns(begin, producers, clocks, flags, states, replayed)
    assert got.tolist() == want.tolist()
    for name in ("producers", "last_ack", "begin"):
        assert np.asarray(getattr(got_states, name)).tolist() == \
            np.asarray(getattr(want_states, name)).tolist()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 299), max_size=20))
def test_line_ends_are_the_newlines(data: bytes, at: list[int]) -> None:
    """``message.columns.line_ends`` (native, or numpy with
    EXACTLY_PURE_PYTHON) is ``framing.line_ends``, the definition of a line,
    in a bytes object or a slice of a buffer; and ``framing.line_ends`` is
    just past each newline."""
    import framing
    from message.columns import line_ends

    raw = bytearray(data)
    for i in at:
        if i < len(raw):
            raw[i] = 10
    want = [i + 1 for i, c in enumerate(raw) if c == 10]
    assert framing.line_ends(raw) == want
    assert line_ends(bytes(raw)).tolist() == framing.line_ends(raw)
    view = memoryview(raw)[1:]
    assert line_ends(view).tolist() == framing.line_ends(view)
    cut = framing.whole_lines_end(raw, len(raw))
    assert cut == (want[-1] if want else 0)


@needs_native
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 2**20)),
                          st.integers(0, 2**64 - 1)), max_size=30),
       st.lists(st.tuples(st.sampled_from(["", "x", "{", "G", "g", "-", "A", "f", "F", "@", "`",
                                           ":", "/", "\x10", "\x19", "\x7f", "é", "A",
                                           "<empty>"]),
                          st.integers(0, 34)), max_size=30))
def test_native_uuid_columns_are_the_numpy_definitions(
    halves: list[tuple[int, int]], spoil: list[tuple[str, int]]
) -> None:
    """Native UUID formatting, envelope fields (clocks, flags, publish times,
    before 1970 too) and parsing against the numpy definitions: canonical
    strings (lower and upper case), ones spoiled here and there, and empty
    ones (a null, or a document without a UUID: the nil UUID, not a row left
    over to parse)."""
    import numpy as np

    from message import columns

    hi = np.array([h for h, _ in halves], dtype=np.uint64)
    lo = np.array([v for _, v in halves], dtype=np.uint64)
    text, producers = _core.NATIVE.format_uuids(hi, lo)
    assert text == b"".join(str(uuid.UUID(int=(h << 64) | v)).encode() for h, v in halves)
    assert producers == b"".join(f"{v & (2**48 - 1):012x}".encode() for _, v in halves)
    native = columns.envelope_fields(hi, lo, pa.allocate_buffer)
    numpy_fields = columns._envelope_fields_numpy(hi, lo)
    assert [bytes(t) for t in native[:2]] == list(numpy_fields[:2]) == [text, producers]
    for got, want in zip(native[2:], numpy_fields[2:], strict=True):
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
    strings = [text[i:i + 36].decode() for i in range(0, len(text), 36)]
    for i, (c, at) in enumerate(spoil[: len(strings)]):
        s = strings[i]  # "é" is two bytes: it takes the place of two characters
        strings[i] = ("" if c == "<empty>" else s.upper() if c == "A"
                      else s[:at] + c + s[at + 1 + (c == "é"):])
    data = "".join(strings).encode()
    offsets = np.cumsum([0] + [len(s.encode()) for s in strings]).astype(np.int32)
    h1, l1 = np.zeros(len(strings), np.uint64), np.zeros(len(strings), np.uint64)
    h2, l2 = np.zeros(len(strings), np.uint64), np.zeros(len(strings), np.uint64)
    rest = _core.NATIVE.parse_uuids(data, offsets, h1, l1)
    assert rest == columns._parse_canonical(np.frombuffer(data, np.uint8), offsets, h2, l2)
    assert h1.tolist() == h2.tolist() and l1.tolist() == l2.tolist()
    assert not any(strings[i] == "" for i in rest)


def test_fields_named_like_envelope_columns_are_content_columns_of_their_own() -> None:
    """A document's own ``uuid`` or ``begin`` is the column ``content_uuid``
    (``content_begin``) beside the envelope's, inferred or named by a
    schema, committed or not: a batch never has two columns of one name."""
    client = MemoryJournalClient()
    spec = client.create("j", NDJSON)
    pub = Publisher(client)
    for i in range(3):
        pub.publish_committed(lambda d: (spec.name, spec.content_type),
                              JsonDocument(uuid=f"order-{i}", begin=10 * i, content_uuid="x",
                                           page="/p"))
    client.flush()
    named = pa.schema([("uuid", pa.string()), ("begin", pa.int64()), ("page", pa.string())])
    for table in (ReadCommittedArrow(client, "j").read_all(),
                  ReadCommittedArrow(client, "j", schema=named).read_all(),
                  ReadUncommittedArrow(client, "j", schema=named).read_all()):
        names = table.column_names
        assert len(names) == len(set(names)), names
        assert table.column("content_begin").to_pylist() == [0, 10, 20]
        orders = [f"order-{i}" for i in range(3)]
        if "content_content_uuid" in names:
            # Inferred: the field content_uuid is a column of that name, so
            # the field uuid's takes one more prefix (as the Spark source's).
            assert table.column("content_content_uuid").to_pylist() == orders
            assert table.column("content_uuid").to_pylist() == ["x"] * 3
        else:
            assert table.column("content_uuid").to_pylist() == orders
        assert all(uuid.UUID(u).version == 1 for u in table.column("uuid").to_pylist())
        assert table.column("begin").to_pylist() == sorted(table.column("begin").to_pylist())
