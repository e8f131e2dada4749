"""The pipeline's read engine and write protocol, without Spark: the parallel
committed set equals a sequential ReadCommittedIter, and writes commit once."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framing import FrameDecodeError
from journal import LocalJournalStore, MemoryJournalClient
from message import (
    CSVRecord,
    Flags,
    JsonDocument,
    ReadCommittedIter,
    ReadUncommittedIter,
    build_uuid,
    get_clock,
    get_flags,
    proto_message_type,
)
from message.arrow import ArrowContent
from pipeline import recover
from pipeline._scan import read_journal
from pipeline._sink import commit_stream_batch, sink_job
from pipeline._state import INTENTS, SINKS
from pipeline._stream_offsets import encode_states, read_range, sequence_range, states_of
from pipeline._write import (
    JobEndedError,
    Target,
    abort_job,
    attempts_journal,
    commit_job,
    publish_rows,
    start_job,
)
from tests import examples_pb2
from tests.strategies import Workload, chaos_workloads, producer, publisher_workloads

NDJSON = {"content-type": "application/x-ndjson"}

TEXT = ArrowContent((("text", pa.string()),))


@pytest.fixture(autouse=True)
def _quiet_sequencer() -> Any:
    # Workloads roll back and use unknown flags on purpose; the Sequencer
    # warns about each, once per reader.
    logging.getLogger("message").setLevel(logging.ERROR)
    yield
    logging.getLogger("message").setLevel(logging.NOTSET)


def load(w: Workload) -> MemoryJournalClient:
    """The workload's envelopes as NDJSON frames of a memory client."""
    client = MemoryJournalClient()
    for j in w.journals:
        client.create(j, NDJSON)
    for env in w.envelopes:
        doc = {"_meta": {"uuid": str(env.message.get_uuid())}, "text": env.message.text}
        client.append(env.journal.name, orjson.dumps(doc) + b"\n").result()
    return client


def sequential(client: Any, journal: str) -> list[tuple[int, str, Any]]:
    return [
        (e.begin, str(e.message.get_uuid()), e.message.get("text"))
        for e in ReadCommittedIter(client, journal, lambda _s: JsonDocument())
    ]


def parallel(client: Any, journal: str, buckets: int, **kw: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for b in range(buckets):
        for batch in read_journal(client, journal, TEXT, bucket=b, buckets=buckets, **kw):
            rows += batch.to_pylist()
    return sorted(rows, key=lambda r: (r["commit_offset"], r["begin"]))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(publisher_workloads(), chaos_workloads(max_journals=3)), st.integers(1, 4))
def test_parallel_committed_set_equals_read_committed_iter(w: Workload, buckets: int) -> None:
    """Bucketed reads, ordered by (commit_offset, begin), are a ReadCommittedIter's output."""
    client = load(w)
    for j in w.journals:
        got = [(r["begin"], r["uuid"], r["text"]) for r in parallel(client, j, buckets)]
        assert got == sequential(client, j)


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(publisher_workloads(), st.integers(1, 3))
def test_read_uncommitted_returns_every_frame_once(w: Workload, buckets: int) -> None:
    """read_uncommitted yields each frame exactly once across buckets, with its metadata."""
    client = load(w)
    for j in w.journals:
        want = [
            (e.begin, e.end, str(e.message.get_uuid()), get_flags(e.message.get_uuid()))
            for e in ReadUncommittedIter(client, j, lambda _s: JsonDocument())
        ]
        rows = parallel(client, j, buckets, isolation="read_uncommitted")
        assert [(r["begin"], r["end"], r["uuid"], r["flags"]) for r in rows] == want


def test_metadata_columns_decode_the_uuid() -> None:
    """producer, clock, flags and publish_time come from the UUID; clock 0 has no time."""
    client = MemoryJournalClient()
    client.create("j", NDJSON)
    pid = producer(7)
    clock = ((1_700_000_000 * 10_000_000 + 122192928000000000) << 4) | 5
    for u in (build_uuid(pid, clock, Flags.OUTSIDE_TXN), build_uuid(pid, 0, Flags.OUTSIDE_TXN)):
        client.append("j", orjson.dumps({"_meta": {"uuid": str(u)}, "text": "x"}) + b"\n")
    rows = parallel(client, "j", 1)
    assert rows[0]["producer"] == pid.hex()
    assert rows[0]["clock"] == clock
    assert rows[0]["flags"] == 0
    assert rows[0]["publish_time"].timestamp() == 1_700_000_000
    assert rows[1]["publish_time"] is None and rows[1]["clock"] == 0


def test_non_canonical_and_invalid_uuids_read_as_json_document_does() -> None:
    """Braced or upper-case UUIDs parse; a non-UUID is the nil UUID (committed, untracked)."""
    client = MemoryJournalClient()
    client.create("j", NDJSON)
    u = build_uuid(producer(1), 1234, Flags.OUTSIDE_TXN)
    for text in ("{" + str(u) + "}", str(u).upper(), "not-a-uuid", 17):
        client.append("j", orjson.dumps({"_meta": {"uuid": text}, "text": str(text)}) + b"\n")
    client.append("j", b'{"text": "no meta"}\n')
    got = [(r["begin"], r["uuid"], r["text"]) for r in parallel(client, "j", 2)]
    assert got == sequential(client, "j")
    assert [r[1] for r in got] == [str(u), *["00000000-0000-0000-0000-000000000000"] * 3]


def test_typed_columns_and_values_that_do_not_convert() -> None:
    """Schema types apply; a value of the wrong type is null, as in Spark's PERMISSIVE mode."""
    client = MemoryJournalClient()
    client.create("j", NDJSON)
    for n in (1, "two", 3):
        u = build_uuid(producer(1), 100 + (n if isinstance(n, int) else 2), 0)
        client.append("j", orjson.dumps({"_meta": {"uuid": str(u)}, "n": n}) + b"\n")
    spec = ArrowContent((("n", pa.int64()), ("absent", pa.string())))
    rows = [r for b in read_journal(client, "j", spec) for r in b.to_pylist()]
    assert [r["n"] for r in rows] == [1, None, 3]
    assert [r["absent"] for r in rows] == [None] * 3


def test_a_line_that_is_not_an_object_raises_the_framing_error() -> None:
    """A corrupt frame raises what ReadUncommittedIter raises, naming journal and offset."""
    client = MemoryJournalClient()
    client.create("j", NDJSON)
    client.append("j", b'{"text": "ok"}\n[1, 2]\n')
    with pytest.raises(FrameDecodeError) as err:
        list(read_journal(client, "j", TEXT))
    assert getattr(err.value, "offset", None) == 15


def test_csv_and_fixed_protobuf_journals() -> None:
    """CSV columns are positional after the UUID; protobuf columns are fields by name."""
    client = MemoryJournalClient()
    client.create("csv", {"content-type": "text/csv"})
    client.create("pb", {"content-type": "application/x-protobuf-fixed"})
    from framing import framing_by_content_type

    csv = framing_by_content_type("text/csv")
    fixed = framing_by_content_type("application/x-protobuf-fixed")
    pv = proto_message_type(examples_pb2.PageView)
    for i in range(3):
        u = build_uuid(producer(1), 10 + i, Flags.OUTSIDE_TXN)
        client.append("csv", csv.marshal(CSVRecord([str(u), f"/p{i}", str(i)])))
        client.append("pb", fixed.marshal(pv(uuid=u.bytes, page=f"/p{i}", duration_ms=i)))
    client.append("csv", csv.marshal(CSVRecord([str(u), "/dup", "9"])))  # a duplicate
    spec = ArrowContent((("page", pa.string()), ("n", pa.int64())))
    rows = [r for b in read_journal(client, "csv", spec) for r in b.to_pylist()]
    assert [(r["page"], r["n"]) for r in rows] == [("/p0", 0), ("/p1", 1), ("/p2", 2)]
    pspec = ArrowContent(
        (("page", pa.string()), ("duration_ms", pa.int64())),
        proto_class="tests.examples_pb2.PageView",
    )
    rows = [r for b in read_journal(client, "pb", pspec, buckets=2) for r in b.to_pylist()]
    rows += [r for b in read_journal(client, "pb", pspec, bucket=1, buckets=2)
             for r in b.to_pylist()]
    assert sorted((r["page"], r["duration_ms"]) for r in rows) == [
        ("/p0", 0), ("/p1", 1), ("/p2", 2)
    ]


def test_ndjson_windows_span_many_lines_and_fragments(tmp_path: Path) -> None:
    """Reading across window and fragment boundaries of a LocalJournalStore loses no line."""
    import pipeline._scan as scan

    old = scan.WINDOW_BYTES
    scan.WINDOW_BYTES = 1000  # many windows, lines cut at their edges
    try:
        with LocalJournalStore(tmp_path, fragment_size=3000) as store:
            store.create("j", NDJSON)
            for i in range(300):
                u = build_uuid(producer(1), 1000 + i, Flags.OUTSIDE_TXN)
                store.append("j", orjson.dumps({"_meta": {"uuid": str(u)}, "text": f"{i}"})
                             + b"\n")
            store.flush()
            rows = parallel(store, "j", 2)
            assert [r["text"] for r in rows] == [str(i) for i in range(300)]
            assert len(store.fragments("j")) > 1
    finally:
        scan.WINDOW_BYTES = old


# -- streaming ranges ------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(publisher_workloads(), st.data())
def test_streaming_ranges_concatenate_to_the_batch_result(w: Workload, data: Any) -> None:
    """Micro-batches cut anywhere, each resumed from encoded states, emit each message once."""
    client = load(w)
    for j in w.journals:
        head = client.head(j)
        # Micro-batches end where a journal's head was: on a frame boundary.
        ends = [0, *(e.end for e in ReadUncommittedIter(client, j, lambda _s: JsonDocument()))]
        cuts = sorted(data.draw(st.lists(st.sampled_from(ends), max_size=4)))
        offset: dict[str, Any] = {"states": {}}
        got: list[tuple[int, str]] = []
        start = 0
        for stop in [*cuts, head]:
            states = states_of(offset, j)
            for batch in read_range(client, j, TEXT, start, stop, states):
                got += [(r["begin"], r["uuid"]) for r in batch.to_pylist()]
            end_states = sequence_range(client, j, TEXT, start, stop, states)
            offset = {"states": {j: encode_states(end_states)}}
            start = stop
        assert got == [(b, u) for b, u, _ in sequential(client, j)]


# -- writes -----------------------------------------------------------------------


def batches(n: int, start: int = 0) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pylist([{"n": i, "k": f"k{i}"} for i in range(start, start + n)])]


def committed_ns(store: Any, journal: str) -> list[int]:
    return [
        e.message["n"] for e in ReadCommittedIter(store, journal, lambda _s: JsonDocument())
        if get_flags(e.message.get_uuid()) != Flags.ACK_TXN
    ]


def test_write_is_invisible_until_the_driver_commits(tmp_path: Path) -> None:
    """Task output is uncommitted; commit_job makes exactly the reported attempts visible."""
    root = str(tmp_path)
    with LocalJournalStore(root) as store:
        store.create("out", NDJSON)
        target = Target(root, journal="out")
        kept = publish_rows(target, batches(5), store)
        dropped = publish_rows(target, batches(5), store)  # an attempt Spark discarded
        assert committed_ns(store, "out") == []
        commit_job(store, [kept])
        assert committed_ns(store, "out") == [0, 1, 2, 3, 4]
        abort_job(store, [dropped])
        assert committed_ns(store, "out") == [0, 1, 2, 3, 4]
        assert store.list(f"prefix={INTENTS}") == []


class _Recording(MemoryJournalClient):
    """A memory store that remembers the journals created and appended to."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def create(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("create", name))
        return super().create(name, *args, **kwargs)

    def append(self, name: str, data: bytes) -> Any:
        self.calls.append(("append", name))
        return super().append(name, data)


def test_a_commit_to_one_journal_is_one_append_and_needs_no_log() -> None:
    """The intents of a job that wrote one journal go in one (atomic) append,
    with no intent log; intents to several journals are logged first."""
    with _Recording() as store:
        for j in ("out/0", "out/1"):
            store.create(j, {**NDJSON, "app": "out"})
        one = Target("unused", journal="out/0")
        done = [publish_rows(one, batches(5), store), publish_rows(one, batches(5, 5), store)]
        store.calls.clear()
        assert commit_job(store, done) == 2
        assert store.calls == [("append", "out/0")]
        assert committed_ns(store, "out/0") == list(range(10))

        spread = Target("unused", selector="app=out", key="k")
        done = [publish_rows(spread, batches(20, 100), store)]
        store.calls.clear()
        assert commit_job(store, done) == 2
        logged = [name for call, name in store.calls if call == "create"]
        assert len(logged) == 1 and logged[0].startswith(INTENTS)
        assert sorted(committed_ns(store, "out/0") + committed_ns(store, "out/1")) == \
            list(range(10)) + list(range(100, 120))
        assert store.list(f"prefix={INTENTS}") == []


def test_failed_task_rolls_back_its_own_rows(tmp_path: Path) -> None:
    """A task that raises writes roll-back ACKs before re-raising: no open transaction."""
    root = str(tmp_path)

    def failing() -> Any:
        yield from batches(3)
        raise RuntimeError("boom")

    with LocalJournalStore(root) as store:
        store.create("out", NDJSON)
        with pytest.raises(RuntimeError, match="boom"):
            publish_rows(Target(root, journal="out"), failing(), store)
        flags = [get_flags(e.message.get_uuid())
                 for e in ReadUncommittedIter(store, "out", lambda _s: JsonDocument())]
        assert flags == [Flags.CONTINUE_TXN] * 3 + [Flags.ACK_TXN]
        it = ReadCommittedIter(store, "out", lambda _s: JsonDocument())
        assert [e for e in it if get_flags(e.message.get_uuid()) != Flags.ACK_TXN] == []
        assert not it.sequencer.has_pending({})


_TEXT = st.text(alphabet=st.sampled_from(list('ab"\\\x00\x1f\x7fé\u2028😀 \n/')), max_size=6)
_VALUES = {
    "n": st.integers(-(2**63), 2**63 - 1),
    "s": _TEXT,
    "f": st.floats(allow_nan=True, allow_infinity=True),
    "b": st.booleans(),
}
_UUID_TEXT = re.compile(rb'"uuid":"[0-9a-f-]{36}"')


def _lines_without_uuids(store: Any, journal: str) -> tuple[list[bytes], list[int]]:
    """The frames of ``journal`` with their UUIDs taken out, and the flags
    and clocks of those UUIDs."""
    with store.read(journal) as r:
        data = r.read()
    docs = [orjson.loads(line) for line in data.splitlines()]
    clocks = [get_clock(uuid.UUID(d["_meta"]["uuid"])) for d in docs]
    flags = {get_flags(uuid.UUID(d["_meta"]["uuid"])) for d in docs}
    assert flags <= {Flags.CONTINUE_TXN, Flags.ACK_TXN}
    return [_UUID_TEXT.sub(b"<uuid>", line) for line in data.splitlines()], clocks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.fixed_dictionaries({k: st.one_of(st.none(), v)
                                            for k, v in _VALUES.items()}), max_size=60),
       cut=st.integers(1, 20), mapping=st.sampled_from(["journal", "modulo", "rendezvous"]))
def test_bulk_and_row_by_row_writes_frame_the_same_bytes(
    rows: list[dict[str, Any]], cut: int, mapping: str
) -> None:
    """The bulk write path (batches framed by Arrow's kernels, appended a
    journal at a time) and the reference path (a message per row) send
    each row to the same journal, as the same bytes but for the UUID, with
    increasing clocks; committed, each journal holds the same rows."""
    schema = pa.schema([("n", pa.int64()), ("s", pa.string()), ("f", pa.float64()),
                        ("b", pa.bool_())])
    parts = [pa.RecordBatch.from_pylist(rows[i:i + cut], schema=schema)
             for i in range(0, len(rows), cut)] or [pa.RecordBatch.from_pylist([], schema=schema)]
    journals = [f"out/{i}" for i in range(3)]
    seen = []
    for bulk in (False, True):
        with MemoryJournalClient() as store:
            for j in journals:
                store.create(j, {**NDJSON, "app": "out"})
            target = (Target("unused", journal=journals[0]) if mapping == "journal" else
                      Target("unused", selector="app=out", key="s", mapping=mapping))
            result = publish_rows(target, parts, store, bulk=bulk)
            assert result.rows == len(rows)
            written = {j: _lines_without_uuids(store, j) for j in journals}
            for _lines, clocks in written.values():
                assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
            commit_job(store, [result])
            committed = {j: [e.message for e in
                             ReadCommittedIter(store, j, lambda _s: JsonDocument())
                             if get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
                         for j in journals}
            seen.append(({j: w[0] for j, w in written.items()}, committed))
    assert seen[0][0] == seen[1][0]

    def content(committed: dict[str, list[JsonDocument]]) -> dict[str, list[dict[str, Any]]]:
        return {j: [{k: v for k, v in d.items() if k != "_meta"} for d in docs]
                for j, docs in committed.items()}

    assert content(seen[0][1]) == content(seen[1][1])
    assert sum(len(docs) for docs in seen[1][1].values()) == len(rows)


def test_maps_decimals_and_binary_are_written_as_json_holds_them() -> None:
    """Columns JSON has no form for in Python's values: a map is an object,
    a decimal an exact number, binary data base64 (as Spark's to_json
    writes them), also inside structs and lists; both write paths frame the
    same bytes."""
    from decimal import Decimal

    schema = pa.schema([
        ("m", pa.map_(pa.string(), pa.int64())), ("d", pa.decimal128(10, 3)),
        ("b", pa.binary()), ("s", pa.struct([("inner", pa.map_(pa.string(), pa.string()))])),
        ("l", pa.list_(pa.decimal128(5, 1))),
    ])
    rows = [{"m": [("a", 1), ("b", 2)], "d": Decimal("12.340"), "b": b"\x00\xffhi",
             "s": {"inner": [("k", "v")]}, "l": [Decimal("1.5"), None]},
            {"m": None, "d": None, "b": None, "s": None, "l": None}]
    framed = []
    for bulk in (False, True):
        with MemoryJournalClient() as store:
            store.create("out", NDJSON)
            result = publish_rows(Target("unused", journal="out"),
                                  [pa.RecordBatch.from_pylist(rows, schema=schema)], store,
                                  bulk=bulk)
            framed.append(_lines_without_uuids(store, "out")[0])
            commit_job(store, [result])
            docs = [e.message for e in ReadCommittedIter(store, "out", lambda _s: JsonDocument())
                    if get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
        assert [{k: v for k, v in d.items() if k != "_meta"} for d in docs] == [
            {"m": {"a": 1, "b": 2}, "d": 12.34, "b": "AP9oaQ==", "s": {"inner": {"k": "v"}},
             "l": [1.5, None]},
            {"m": None, "d": None, "b": None, "s": None, "l": None}]
        assert b'"d":12.340' in framed[-1][0]
    assert framed[0] == framed[1]


def test_a_column_named_like_the_uuid_path_is_written_row_by_row(tmp_path: Path) -> None:
    """A ``_meta`` column: the UUID goes inside its value, as JsonDocument
    puts it (the bulk path leaves such rows to the reference)."""
    with MemoryJournalClient() as store:
        store.create("out", NDJSON)
        rows = [{"n": 1, "_meta": {"who": "x"}}, {"n": 2, "_meta": None}]
        result = publish_rows(Target("unused", journal="out"), [pa.RecordBatch.from_pylist(rows)],
                              store, bulk=True)
        commit_job(store, [result])
        docs = [e.message for e in ReadCommittedIter(store, "out", lambda _s: JsonDocument())
                if get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
        assert [(d["n"], d["_meta"].get("who")) for d in docs] == [(1, "x"), (2, None)]


_KILLED_ATTEMPT = """
import sys
import pyarrow as pa
from pipeline._write import Target, publish_rows

def batches():
    for i in range(10_000_000):
        yield pa.RecordBatch.from_pylist([{"n": 1000 + i}])
        if i == 200:
            print("writing", flush=True)

publish_rows(Target(sys.argv[1], journal=sys.argv[2]), batches(), job="job-1")
"""


def kill_an_attempt_mid_write(root: str, journal: str = "out") -> None:
    """A write task attempt in a process of its own, SIGKILLed while it publishes."""
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_ATTEMPT, root, journal],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2],
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"writing\n"
        # Killed once some of its appends are durable (they are asynchronous).
        with LocalJournalStore(root) as store:
            deadline = time.monotonic() + 30
            while store.head(journal) == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL


def attempt_producers(store: Any, job: str) -> set[str]:
    """The producers that recorded roll-backs in the job's attempts journal."""
    with store.read(attempts_journal(job)) as r:
        return {json.loads(line)["producer"] for line in r.read().splitlines()}


def open_transactions(store: Any, journal: str) -> bool:
    it = ReadCommittedIter(store, journal, lambda _s: JsonDocument())
    for _ in it:
        pass
    return it.sequencer.has_pending({})


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_the_driver_rolls_back_attempts_killed_mid_write(tmp_path: Path, outcome: str) -> None:
    """An attempt SIGKILLed while publishing, and a finished one Spark did not
    keep (speculation), leave no open transaction once the job ends; the
    kept attempt's rows are committed exactly once."""
    root = str(tmp_path)
    with LocalJournalStore(root) as store:
        store.create("out", NDJSON)
        start_job(store, "job-1")
    kill_an_attempt_mid_write(root)
    with LocalJournalStore(root) as store:
        assert open_transactions(store, "out")
        target = Target(root, journal="out")
        kept = publish_rows(target, batches(5), store, job="job-1")
        publish_rows(target, batches(5, start=50), store, job="job-1")  # not kept
        assert len(attempt_producers(store, "job-1")) == 3
        if outcome == "commit":
            commit_job(store, [kept], "job-1")
            assert committed_ns(store, "out") == [0, 1, 2, 3, 4]
        else:
            abort_job(store, [kept], "job-1")
            assert committed_ns(store, "out") == []
        assert not open_transactions(store, "out")
        assert store.list(f"name={attempts_journal('job-1')}") == []
        with pytest.raises(JobEndedError):
            publish_rows(target, batches(5, start=70), store, job="job-1")
        assert not open_transactions(store, "out")


@pytest.mark.parametrize("outcome", ["commit", "abort", "micro-batch"])
def test_an_attempt_still_publishing_when_its_job_ends_rolls_itself_back(
    tmp_path: Path, outcome: str
) -> None:
    """An attempt Spark no longer waits for (a task of a failed job, being
    cancelled; a speculation loser) that publishes on after the driver
    wrote its roll-back: the driver's roll-back ACK lands between its
    messages, and the rest would stay an open transaction. At the end of
    its rows the attempt sees that its job is ending, rolls back itself,
    and fails (JobEndedError): no open transaction is left. A streaming
    sink's next micro-batch writes as before."""
    root = str(tmp_path)
    target = Target(root, journal="out")
    job = sink_job("s1") if outcome == "micro-batch" else "job-1"
    with LocalJournalStore(root) as store:
        store.create("out", NDJSON)
        start_job(store, job)
        kept = publish_rows(target, batches(3), store, job=job)

        def zombie() -> Iterator[pa.RecordBatch]:
            yield from batches(2, start=50)
            store.flush()  # its first rows durable, and recorded for the driver
            if outcome == "commit":
                commit_job(store, [kept], job)
            elif outcome == "abort":
                abort_job(store, [kept], job)
            else:
                assert commit_stream_batch(store, "s1", 0, [kept])
            yield from batches(2, start=60)  # published after the driver's roll-back

        with pytest.raises(JobEndedError):
            publish_rows(target, zombie(), store, job=job)
        assert committed_ns(store, "out") == ([] if outcome == "abort" else [0, 1, 2])
        assert not open_transactions(store, "out")
        if outcome == "micro-batch":
            following = publish_rows(target, batches(2, start=80), store, job=job)
            assert commit_stream_batch(store, "s1", 1, [following])
            assert committed_ns(store, "out") == [0, 1, 2, 80, 81]
            assert not open_transactions(store, "out")


def test_a_streaming_sink_rolls_back_attempts_that_did_not_report(tmp_path: Path) -> None:
    root = str(tmp_path)
    target = Target(root, journal="out")
    job = sink_job("s1")
    with LocalJournalStore(root) as store:
        store.create("out", NDJSON)
        start_job(store, job)
        kept = publish_rows(target, batches(3), store, job=job)
        publish_rows(target, batches(3, start=10), store, job=job)  # lost to speculation
        assert commit_stream_batch(store, "s1", 0, [kept])
        assert committed_ns(store, "out") == [0, 1, 2]
        assert not open_transactions(store, "out")
        # Kept for the next micro-batch, what it holds settled: a replay of the
        # same batch commits nothing and rolls back nothing more.
        store.get(attempts_journal(job))
        assert not commit_stream_batch(store, "s1", 0, [])
        assert committed_ns(store, "out") == [0, 1, 2]


def test_a_long_streams_commit_reads_only_its_attempts_since_the_last_batch(
        tmp_path: Path) -> None:
    """A streaming sink keeps its attempts journal across micro-batches: a
    commit reads what follows the last micro-batch it ended, not the whole
    journal, which grows with every batch (each commit would else read more)."""
    root = str(tmp_path)
    target = Target(root, journal="out")
    job = sink_job("s1")

    class Counting:
        """The store, counting the bytes read through it."""

        def __init__(self, store: Any) -> None:
            self.store, self.bytes = store, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.store, name)

        def read(self, *args: Any, **kwargs: Any) -> Any:
            reader = self.store.read(*args, **kwargs)
            counting = self

            class Reader:
                def __enter__(self) -> Any:
                    return self

                def __exit__(self, *exc: object) -> None:
                    reader.close()

                def __getattr__(self, name: str) -> Any:
                    return getattr(reader, name)

                def read(self, *a: Any) -> bytes:
                    data = reader.read(*a)
                    counting.bytes += len(data)
                    return bytes(data)

                def readinto(self, buf: Any) -> int:
                    n = int(reader.readinto(buf))
                    counting.bytes += n
                    return n

            return Reader()

    with LocalJournalStore(root) as store:
        store.create("out", NDJSON)
        start_job(store, job)
        for batch_id in range(8000):  # settled micro-batches, MiBs of records
            store.append(attempts_journal(job), orjson.dumps(
                {"producer": f"p{batch_id}", "rollbacks": [["out", "eA=="] * 10]}) + b"\n")
            store.append(attempts_journal(job), b'{"end": true}\n')
        store.flush()
        grown = store.head(attempts_journal(job))
        assert grown > 1 << 20
        counted = Counting(store)
        kept = publish_rows(target, batches(3), store, job=job)
        assert commit_stream_batch(counted, "s1", 0, [kept])  # type: ignore[arg-type]
        assert committed_ns(store, "out") == [0, 1, 2]
        assert counted.bytes < grown // 8, (counted.bytes, grown)


def test_a_long_streams_state_journals_keep_about_a_fragment(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A streaming sink's state and attempts journals, kept across its
    micro-batches, do not grow with them on the embedded store: what is
    settled is removed by retention as whole fragments. Replays are still
    rolled back, lost attempts still rolled back, and reading their tails
    jumps over nothing (no warning)."""
    root = str(tmp_path)
    target = Target(root, journal="out")
    job = sink_job("s1")
    size = 1024
    want: list[int] = []
    with LocalJournalStore(root, fragment_size=size) as store:
        store.create("out", NDJSON)
        start_job(store, job)
        caplog.set_level(logging.WARNING, logger="journal")
        for batch_id in range(200):
            first = 1000 * batch_id
            kept = publish_rows(target, batches(2, start=first), store, job=job)
            if batch_id % 7 == 3:  # an attempt lost to speculation: rolled back
                publish_rows(target, batches(2, start=first + 500), store, job=job)
            assert commit_stream_batch(store, "s1", batch_id, [kept])
            want += [first, first + 1]
            if batch_id % 11 == 5:  # Spark replays the batch after a restart
                replayed = publish_rows(target, batches(2, start=first), store, job=job)
                assert not commit_stream_batch(store, "s1", batch_id, [replayed])
        for name in (f"{SINKS}s1", attempts_journal(job)):
            held = sum(f.end - f.begin for f in store.fragments(name))
            assert store.head(name) > 8 * size  # what 200 batches wrote
            assert held <= 3 * size, (name, held, store.head(name))
        assert committed_ns(store, "out") == want
        assert not open_transactions(store, "out")
    assert not [r for r in caplog.records if "no longer available" in r.getMessage()]


def test_durable_intents_of_a_crashed_driver_are_recovered(tmp_path: Path) -> None:
    """An intent log left in the store is written by the next recover()."""
    root = str(tmp_path)
    with LocalJournalStore(root) as store:
        store.create("out", NDJSON)
        published = publish_rows(Target(root, journal="out"), batches(4), store)
        from message import AckIntent, JournalIntentLog

        JournalIntentLog(store, f"{INTENTS}crashed").save(
            [AckIntent(j, b) for j, b in published.intents]
        )
        assert committed_ns(store, "out") == []
    assert recover(root) == 1  # a store directory, as the data source's option root
    with LocalJournalStore(root) as store:
        assert committed_ns(store, "out") == [0, 1, 2, 3]
        assert recover(store) == 0


def test_selector_writes_follow_the_modulo_mapping(tmp_path: Path) -> None:
    """Rows go to the journal modulo_mapping picks for their key."""
    from message import modulo_mapping

    root = str(tmp_path)
    with LocalJournalStore(root) as store:
        specs = [store.create(f"t/p{i}", {**NDJSON, "app": "t"}) for i in range(3)]
        target = Target(root, selector="app=t", key="k")
        commit_job(store, [publish_rows(target, batches(30), store)])
        mapping = modulo_mapping(lambda d: d["k"], lambda: specs)
        for spec in specs:
            want = [i for i in range(30) if mapping({"k": f"k{i}"})[0] == spec.name]
            assert committed_ns(store, spec.name) == want


def test_frame_boundary_cuts_a_budget_at_whole_frames() -> None:
    """A micro-batch limited to a number of bytes ends at a frame boundary,
    takes at least one frame, and follows a retention jump."""
    from pipeline._stream_offsets import frame_boundary

    lines = [orjson.dumps({"n": "x" * n}) + b"\n" for n in (5, 40, 3, 70, 1)]
    ends = [sum(map(len, lines[: i + 1])) for i in range(len(lines))]
    with MemoryJournalClient() as client:
        client.create("j", {"content-type": "application/x-ndjson"})
        for line in lines:
            client.append("j", line).result()
        head = ends[-1]
        assert frame_boundary(client, "j", 0, head, head) == head
        assert frame_boundary(client, "j", 0, head, 1) == ends[0]  # at least one frame
        assert frame_boundary(client, "j", 0, head, ends[1]) == ends[1]
        assert frame_boundary(client, "j", 0, head, ends[1] + 1) == ends[1]
        assert frame_boundary(client, "j", ends[1], head, ends[3] - ends[1] - 1) == ends[2]
        assert frame_boundary(client, "j", ends[3], head, 1) == head
        for budget in range(1, head + 2):
            cut = frame_boundary(client, "j", 0, head, budget)
            assert cut in ends and (cut <= budget or cut == ends[0])


def test_frame_boundary_follows_a_retention_jump(tmp_path: Path, caplog: Any) -> None:
    from pipeline._stream_offsets import frame_boundary

    line = orjson.dumps({"n": "x" * 20}) + b"\n"
    with LocalJournalStore(tmp_path, fragment_size=len(line) * 3) as store:
        store.create("j", {"content-type": "application/x-ndjson"})
        for _ in range(9):
            store.append("j", line).result()
        removed = store.trim("j", before_offset=len(line) * 3)
        assert removed
        head = store.head("j")
        with caplog.at_level(logging.WARNING):
            # Asked from 0: the data begins at 3 lines; two lines fit the budget.
            assert frame_boundary(store, "j", 0, head, len(line) * 5) == len(line) * 5


_UUID_TEXTS = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: "{" + str(u) + "}"),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: str(u)[:-1] + "z"),
    st.uuids().map(lambda u: str(u).replace("-", "+", 1)),
    st.text(max_size=40),
    st.none(),
)


def _uuid_int_or_nil(text: Any) -> int:
    if not isinstance(text, str):
        return 0
    try:
        return uuid.UUID(text).int
    except ValueError:
        return 0


@settings(max_examples=200, deadline=None)
@given(st.lists(_UUID_TEXTS, max_size=40), st.integers(0, 3))
def test_uuid_columns_parse_as_uuid_does(values: list[Any], cut: int) -> None:
    """A column of UUID strings (sliced arrays too) gives what ``uuid.UUID``
    makes of each string, and the nil UUID for anything else, in whichever
    implementation runs (native, or numpy with EXACTLY_PURE_PYTHON)."""
    from message.arrow._windows import _uuid_halves

    arr = pa.array(values, pa.string()).slice(min(cut, len(values)))
    hi, lo = _uuid_halves(arr)
    got = [(int(h) << 64) | int(v) for h, v in zip(hi, lo, strict=True)]
    assert got == [_uuid_int_or_nil(text) for text in arr.to_pylist()]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=30))
def test_metadata_columns_format_uuids_as_uuid_does(halves: list[tuple[int, int]]) -> None:
    from message.arrow import envelope_columns

    n = len(halves)
    cols = envelope_columns(
        "a/journal", np.arange(n, dtype=np.int64), np.arange(1, n + 1, dtype=np.int64),
        np.array([h for h, _ in halves], dtype=np.uint64),
        np.array([lo for _, lo in halves], dtype=np.uint64), np.arange(n, dtype=np.int64),
    )
    want = [uuid.UUID(int=(h << 64) | lo) for h, lo in halves]
    assert cols[3].to_pylist() == [str(u) for u in want]
    assert cols[4].to_pylist() == [f"{u.node:012x}" for u in want]


def test_store_options_reach_the_tasks_gazette_clients(tmp_path: Path) -> None:
    """The data source's connect_timeout, retry_timeout, auth_token_ttl and
    direct_reads options make each task's GazetteClient; a value that is
    not one is one clear error."""
    import socket

    from journal import BrokerUnavailableError, GazetteClient
    from pipeline._stores import StoreOptions

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        broker = f"http://127.0.0.1:{s.getsockname()[1]}"
    opts = StoreOptions.of({"broker": broker, "connect_timeout": "0.3", "retry_timeout": "0",
                            "auth_token_ttl": "60", "direct_reads": "false"})
    client = opts.open()
    try:
        assert isinstance(client, GazetteClient) and client.direct_reads is False
        with pytest.raises(BrokerUnavailableError, match=r"within 0\.3 s"):
            client.list("")
    finally:
        client.close()
    with StoreOptions.of({"broker": broker}).open() as plain:
        assert isinstance(plain, GazetteClient) and plain.direct_reads is True
    for bad, name in (({"connect_timeout": "soon"}, "connect_timeout"),
                      ({"retry_timeout": "-1"}, "retry_timeout"),
                      ({"auth_token_ttl": "0"}, "auth_token_ttl"),
                      ({"direct_reads": "yes"}, "direct_reads"),
                      ({"replication": "0"}, "replication"),
                      ({"replication": "two"}, "replication")):
        with pytest.raises(ValueError, match=f"the option {name} must be .*, not '"):
            StoreOptions.of({"broker": broker, **bad})
    # Blank texts are options not given; case and spaces do not matter.
    blank = StoreOptions.of({"broker": broker, "connect_timeout": " ", "direct_reads": "",
                             "replication": ""})
    assert blank.client == () and blank.replication is None
    given = StoreOptions.of({"broker": broker, "direct_reads": " False ", "replication": "2"})
    assert given.client == (("direct_reads", False),) and given.replication == 2


def test_an_empty_security_option_means_none_whatever_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As GazetteClient's keyword: .option("auth_keys", "") is no keys at
    all in every task, not the task's BROKER_AUTH_KEYS (here unusable)."""
    from pipeline._stores import StoreOptions

    monkeypatch.setenv("BROKER_AUTH_KEYS", "not base64!")
    broker = "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="auth_keys"):
        StoreOptions.of({"broker": broker}).open()
    opts = StoreOptions.of({"broker": broker, "auth_keys": ""})
    assert opts.security == (("auth_keys", ""),)
    opts.open().close()  # the variable is not read
