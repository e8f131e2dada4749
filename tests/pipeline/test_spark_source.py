"""The ``journal`` data source in a real local Spark: reads equal the
sequential reader, writes are exactly-once under task retries, streams are
exactly-once across restarts, and the latest state per key.

The journal data source of docs/spark.md is checked here: reads by journal or selector, the envelope
columns and their types, ``schema``, ``isolation``, ``include_acks`` and
column clashes; exactly-once writes, after retries and after a failed job.
test_pipeline_scan.py checks the same reads and writes without Spark."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Any

import pytest

from journal import LocalJournalStore, metrics
from message import (
    Flags,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Transaction,
    get_flags,
)
from pipeline._state import INTENTS
from pipeline._stores import STATE_PREFIX
from pipeline._write import Target, publish_rows
from tests.pipeline.support import committed_rows, random_workload

pytestmark = pytest.mark.spark

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture(autouse=True)
def _quiet_sequencer() -> Any:
    logging.getLogger("message").setLevel(logging.ERROR)
    yield
    logging.getLogger("message").setLevel(logging.NOTSET)


def reader(spark: Any, root: Path, **options: str) -> Any:
    r = spark.read.format("journal").option("root", str(root))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_small_journals_are_read_in_one_task_a_core(spark: Any, tmp_path: Path) -> None:
    """With ``splits_per_journal`` left to ``auto``, journals smaller than a
    split are packed into as many tasks as the session has cores (two here),
    each reading whole journals one after another: the same rows, in the
    same per-journal order, as one task a journal."""
    journals = ["p/a", "p/b", "p/c", "p/d", "p/e"]
    with LocalJournalStore(tmp_path) as store:
        random_workload(store, random.Random(11), journals)
        want = committed_rows(store, journals, acks=False)
    assert spark.sparkContext.defaultParallelism == 2
    df = reader(spark, tmp_path, selector="app=w", schema="n long")
    assert df.rdd.getNumPartitions() == 2
    rows = df.orderBy("journal", "commit_offset", "begin").collect()
    assert [(r.journal, r.begin, r.uuid, r.n) for r in rows] == want
    assert reader(spark, tmp_path, selector="app=w", schema="n long",
                  splits_per_journal="1").rdd.getNumPartitions() == 5


def test_read_committed_equals_read_committed_iter(spark: Any, tmp_path: Path) -> None:
    """Parallel committed rows, in (commit_offset, begin) order, are ReadCommittedIter's."""
    journals = ["w/a", "w/b", "w/c"]
    with LocalJournalStore(tmp_path) as store:
        random_workload(store, random.Random(7), journals)
        want = committed_rows(store, journals, acks=True)
        total = sum(1 for j in journals for _ in ReadUncommittedIter(
            store, j, lambda _s: JsonDocument()))
    df = reader(spark, tmp_path, selector="app=w", schema="n long", splits_per_journal="3",
                include_acks="true")
    assert df.rdd.getNumPartitions() == 9
    rows = df.orderBy("journal", "commit_offset", "begin").collect()
    assert [(r.journal, r.begin, r.uuid, r.n) for r in rows] == want
    # By default, read committed leaves out the ACKs (control records) and only them.
    acks = {u for j in journals for u in _ack_uuids(tmp_path, j)}
    assert acks
    df = reader(spark, tmp_path, selector="app=w", schema="n long", splits_per_journal="3")
    rows = df.orderBy("journal", "commit_offset", "begin").collect()
    assert [(r.journal, r.begin, r.uuid, r.n) for r in rows] == [w for w in want
                                                                 if w[2] not in acks]
    # Read uncommitted returns every frame, ACKs included, whatever include_acks says.
    for option in ("true", "false"):
        uncommitted = reader(spark, tmp_path, selector="app=w", isolation="read_uncommitted",
                             include_acks=option)
        assert uncommitted.count() == total > len(want)


def test_a_corrupt_frame_fails_the_read_naming_its_journal_or_is_skipped(
        spark: Any, tmp_path: Path) -> None:
    """A frame that does not decode fails a batch read with its journal and
    offset in the message; skip_corrupt skips it, in a batch read and in a
    stream, and every other row is read."""
    with LocalJournalStore(tmp_path) as store:
        store.create("bad", NDJSON)
        pub = Publisher(store)
        for n in range(6):
            pub.publish_committed(lambda d: ("bad", "application/x-ndjson"), JsonDocument(n=n))
            if n == 2:
                store.append("bad", b"{not json\n").result()
        store.flush()
    with pytest.raises(Exception, match="of journal bad"):
        reader(spark, tmp_path, journal="bad", schema="n long").collect()
    # The content columns go in .option("schema"): .schema() says so.
    with pytest.raises(Exception, match=r"not with \.schema\(\)"):
        spark.read.format("journal").schema("n long").option("root", str(tmp_path)) \
            .option("journal", "bad").load().collect()
    rows = reader(spark, tmp_path, journal="bad", schema="n long", skip_corrupt="true")
    assert sorted(r.n for r in rows.collect()) == list(range(6))
    out = tmp_path / "streamed"
    q = (spark.readStream.format("journal").option("root", str(tmp_path))
         .option("journal", "bad").option("schema", "n long").option("skip_corrupt", "true")
         .load().select("n").writeStream.format("memory").queryName("skipped_stream")
         .option("checkpointLocation", str(out)).trigger(availableNow=True).start())
    q.awaitTermination()
    got = spark.sql("SELECT n FROM skipped_stream").collect()
    assert sorted(r.n for r in got) == list(range(6))
    # A stream is read committed: asked otherwise, it fails saying so (not
    # with one of PySpark's own errors about its runner).
    q = (spark.readStream.format("journal").option("root", str(tmp_path))
         .option("journal", "bad").option("isolation", "read_uncommitted").load()
         .writeStream.format("memory").queryName("uncommitted_stream")
         .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True)
         .start())
    with pytest.raises(Exception, match="streaming reads are read_committed") as err:
        q.awaitTermination()
    assert "UnboundLocalError" not in str(err.value)


def _ack_uuids(root: Path, journal: str) -> list[str]:
    with LocalJournalStore(root) as store:
        return [str(e.message.get_uuid())
                for e in ReadUncommittedIter(store, journal, lambda _s: JsonDocument())
                if get_flags(e.message.get_uuid()) == Flags.ACK_TXN]


def test_schema_as_ddl_or_struct_json_and_acks_option(spark: Any, tmp_path: Path) -> None:
    """The content schema is DDL or StructType JSON; absent fields are null; ACK rows optional."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    with LocalJournalStore(tmp_path) as store:
        store.create("j", NDJSON)
        pub = Publisher(store)
        with Transaction(pub) as txn:
            txn.publish(lambda d: ("j", "application/x-ndjson"), JsonDocument(page="/a", n=1))
            txn.publish(lambda d: ("j", "application/x-ndjson"), JsonDocument(page="/b"))
    st = StructType([StructField("page", StringType()), StructField("n", LongType())])
    for schema in ("page string, n long", st.json()):
        rows = reader(spark, tmp_path, journal="j", schema=schema, include_acks="true")
        assert [(r.page, r.n, r.flags) for r in rows.orderBy("begin").collect()] == [
            ("/a", 1, Flags.CONTINUE_TXN), ("/b", None, Flags.CONTINUE_TXN),
            (None, None, Flags.ACK_TXN),
        ]
    no_acks = reader(spark, tmp_path, journal="j", schema="page string")  # the default
    assert sorted((r.page, r.flags) for r in no_acks.collect()) == [("/a", 1), ("/b", 1)]
    assert no_acks.dtypes[:4] == [("journal", "string"), ("begin", "bigint"), ("end", "bigint"),
                                  ("uuid", "string")]
    with pytest.raises(Exception, match="include_acks must be true or false"):
        reader(spark, tmp_path, journal="j", include_acks="maybe").collect()


def test_values_of_another_json_kind_read_as_sparks_json_reader_reads_them(
        spark: Any, tmp_path: Path) -> None:
    """A value whose JSON kind is not its column's (2.5 or "7" for a long,
    1 or "true" for a boolean, true or "1.5" for a double) is null, as in
    spark.read.json over the same documents; a non-string value in a
    string column is its JSON text; NaN and infinities written as text read
    back into a double column. Nothing is converted with a loss."""
    docs = [
        {"n": 2.5, "b": "true", "d": "1.5", "s": 1, "i": 2**40},
        {"n": "7", "b": 1, "d": True, "s": {"a": 1}, "i": 3},
        {"n": 5, "b": False, "d": 2, "s": "x", "i": -4},
        {"n": 2.0, "b": None, "d": "NaN", "s": True, "i": 1.5},
        {"n": -(2**63), "b": True, "d": "Infinity", "s": [1, 2], "i": "9"},
    ]
    ddl = "n long, b boolean, d double, s string, i int"
    with LocalJournalStore(tmp_path / "store") as store:
        store.create("j", NDJSON)
        pub = Publisher(store)
        for k, doc in enumerate(docs):
            pub.publish_committed(lambda d: ("j", "application/x-ndjson"),
                                  JsonDocument(doc, k=k)).result()
    ours = reader(spark, tmp_path / "store", journal="j", schema=ddl + ", k int")
    got = [r.asDict() for r in ours.orderBy("k").select("n", "b", "d", "s", "i").collect()]
    path = tmp_path / "docs.json"
    path.write_text("\n".join(json.dumps(d, separators=(",", ":")) for d in docs) + "\n")
    want = [r.asDict() for r in spark.read.schema(ddl).json(str(path)).collect()]
    assert [{k: v for k, v in r.items() if k != "d"} for r in got] == \
        [{k: v for k, v in r.items() if k != "d"} for r in want]
    ds = [r["d"] for r in got]  # (NaN is not equal to itself)
    assert ds[:3] == [None, None, 2.0] and math.isnan(ds[3]) and ds[4] == float("inf")
    assert [r["d"] for r in want][:3] == [None, None, 2.0]


def committed_docs(root: Path, journal: str) -> list[Any]:
    with LocalJournalStore(root) as store:
        return [
            dict(e.message) for e in ReadCommittedIter(store, journal, lambda _s: JsonDocument())
            if get_flags(e.message.get_uuid()) != Flags.ACK_TXN
        ]


def test_write_exactly_once_when_first_attempts_fail(spark: Any, tmp_path: Path) -> None:
    """Tasks whose first attempt fails mid-write are retried; each row is committed once."""
    with LocalJournalStore(tmp_path) as store:
        store.create("out", NDJSON)

    root = str(tmp_path)
    attempts = tmp_path / "attempts"
    attempts.mkdir()

    def flaky(batches: Any) -> Any:
        # The first attempt of two of the four tasks fails half-way.
        from pyspark import TaskContext

        ctx = TaskContext.get()
        (attempts / f"{ctx.partitionId()}-{ctx.attemptNumber()}").touch()
        for i, batch in enumerate(batches):
            if i == 5 and ctx.attemptNumber() == 0 and ctx.partitionId() in (1, 3):
                raise RuntimeError("injected failure of a first attempt")
            yield batch

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        df = spark.range(0, 800, numPartitions=4).withColumnRenamed("id", "n")
        df = df.mapInArrow(flaky, "n long")
        (df.write.format("journal").option("root", root).option("journal", "out")
         .mode("append").save())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert sorted(d["n"] for d in committed_docs(tmp_path, "out")) == list(range(800))
    assert {"1-0", "1-1", "3-0", "3-1"} <= {p.name for p in attempts.iterdir()}
    spark_rows = reader(spark, tmp_path, journal="out", schema="n long", include_acks="false")
    assert spark_rows.count() == 800


def test_a_write_job_that_fails_leaves_nothing_visible(spark: Any, tmp_path: Path) -> None:
    """When every attempt of a task fails, the job fails, no row is committed
    and no transaction stays open."""
    from pyspark.sql import functions as F  # noqa: N812

    with LocalJournalStore(tmp_path) as store:
        store.create("out", NDJSON)

    @F.udf(returnType="long", useArrow=False)
    def doomed(n: int) -> int:
        if n == 350:
            raise RuntimeError("this task always fails")
        return n

    df = spark.range(0, 400, numPartitions=4).select(doomed("id").alias("n"))
    with pytest.raises(Exception, match="always fails"):
        (df.write.format("journal").option("root", str(tmp_path)).option("journal", "out")
         .mode("append").save())
    assert committed_docs(tmp_path, "out") == []
    # Spark killed the other tasks' attempts when the job failed: the driver
    # rolled them back too, from what they recorded before publishing.
    with LocalJournalStore(tmp_path) as store:
        it = ReadCommittedIter(store, "out", lambda _s: JsonDocument())
        # Only ACKs, if anything: an attempt killed after it recorded its
        # roll-back, before its first message landed, leaves a roll-back with
        # nothing before it, which a reader emits as an ACK of no message.
        assert [e for e in it if get_flags(e.message.get_uuid()) != Flags.ACK_TXN] == []
        assert not it.sequencer.has_pending({})
        # The job's attempts journal is gone with the job: no state is left.
        assert store.list(f"prefix={STATE_PREFIX}") == []


def test_durable_intents_are_reapplied_by_the_next_read(spark: Any, tmp_path: Path) -> None:
    """A commit cut short after its intents were made durable completes on the next read."""
    from message import AckIntent, JournalIntentLog

    with LocalJournalStore(tmp_path) as store:
        store.create("out", NDJSON)
        import pyarrow as pa

        batch = pa.RecordBatch.from_pylist([{"n": i} for i in range(5)])
        published = publish_rows(Target(str(tmp_path), journal="out"), [batch], store)
    with LocalJournalStore(tmp_path) as store:
        JournalIntentLog(store, f"{INTENTS}cut-short").save(
            [AckIntent(j, b) for j, b in published.intents]
        )
    df = reader(spark, tmp_path, journal="out", schema="n long", include_acks="false")
    assert sorted(r.n for r in df.collect()) == [0, 1, 2, 3, 4]
    with LocalJournalStore(tmp_path) as store:
        assert store.list(f"prefix={INTENTS}") == []


def test_write_to_selector_by_key_and_read_back(spark: Any, tmp_path: Path) -> None:
    """Rows written to a selector land by their key's rendezvous hash, each once."""
    from message import rendezvous_mapping

    with LocalJournalStore(tmp_path) as store:
        specs = [store.create(f"t/p{i}", {**NDJSON, "app": "t"}) for i in range(3)]
    df = spark.range(0, 60, numPartitions=2).selectExpr("id as n", "concat('k', id) as k")
    (df.write.format("journal").option("root", str(tmp_path)).option("selector", "app=t")
     .option("key", "k").option("mapping", "rendezvous").mode("append").save())
    mapping = rendezvous_mapping(lambda d: d["k"], lambda: specs)
    for spec in specs:
        # Each row is published as a JSON object of its columns.
        got = sorted((d["n"], d["k"]) for d in committed_docs(tmp_path, spec.name))
        assert got == [(i, f"k{i}") for i in range(60)
                       if mapping({"k": f"k{i}"})[0] == spec.name]


def test_stream_is_exactly_once_across_restarts(spark: Any, tmp_path: Path) -> None:
    """A query stopped, its last commit forgotten, and restarted delivers every message once."""
    root, ckpt = tmp_path / "store", tmp_path / "ckpt"
    to_src = lambda d: ("src", "application/x-ndjson")  # noqa: E731
    with LocalJournalStore(root) as store:
        store.create("src", NDJSON)
        store.create("dst", NDJSON)
    store = LocalJournalStore(root)
    pub = Publisher(store)
    for n in range(20):
        pub.publish_committed(to_src, JsonDocument(n=n))
    txn = Transaction(Publisher(store))
    for n in range(100, 105):
        txn.publish(to_src, JsonDocument(n=n))  # open across micro-batches
    store.flush()

    def start() -> Any:
        src = reader_stream(spark, root)
        return (
            src.where("flags != 2").select("n").writeStream.format("journal")
            .option("root", str(root)).option("journal", "dst")
            .option("checkpointLocation", str(ckpt)).trigger(processingTime="200 milliseconds")
            .start()
        )

    q = start()
    q.processAllAvailable()
    assert sorted(d["n"] for d in committed_docs(root, "dst")) == list(range(20))
    for n in range(20, 30):
        pub.publish_committed(to_src, JsonDocument(n=n))
    txn.commit()
    q.processAllAvailable()
    q.stop()
    # As if the query died after the sink committed its last batch but
    # before Spark recorded it: on restart Spark runs that batch again.
    commits = sorted((ckpt / "commits").iterdir(), key=lambda p: p.name)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    (ckpt / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    for n in range(30, 40):
        pub.publish_committed(to_src, JsonDocument(n=n))
    store.flush()
    q = start()
    q.processAllAvailable()
    q.stop()
    store.close()
    got = sorted(d["n"] for d in committed_docs(root, "dst"))
    assert got == [*range(40), *range(100, 105)]


def test_two_queries_taking_turns_into_one_target_each_deliver_every_row(
        spark: Any, tmp_path: Path) -> None:
    """Two scheduled availableNow queries, each with its checkpoint and its
    source, write in turn into one journal: each one's batch 0 (and 1) is
    its own, not a replay of the other's: every row arrives, once."""
    root = tmp_path / "store"
    with LocalJournalStore(root) as store:
        for name in ("a", "b"):
            store.create(name, {**NDJSON, "app": name})
        store.create("sink", NDJSON)

    def run(app: str, first: int) -> None:
        with LocalJournalStore(root) as store:
            pub = Publisher(store)
            for i in range(first, first + 5):
                pub.publish_committed(lambda d: (app, "application/x-ndjson"),
                                      JsonDocument(src=app, i=i))
            store.flush()
        q = (spark.readStream.format("journal").option("root", str(root))
             .option("selector", f"app={app}").option("schema", "src string, i long").load()
             .select("src", "i").writeStream.format("journal").option("root", str(root))
             .option("journal", "sink").option("checkpointLocation", str(tmp_path / f"ck-{app}"))
             .trigger(availableNow=True).start())
        q.awaitTermination()

    for first in (0, 5):
        run("a", first)
        run("b", first)
    rows = sorted((d["src"], d["i"]) for d in committed_docs(root, "sink"))
    assert rows == sorted((src, i) for src in "ab" for i in range(10))


def test_stream_read_limit_cuts_micro_batches(spark: Any, tmp_path: Path) -> None:
    """max_bytes_per_trigger: each micro-batch reads at most that many bytes
    (whole frames), a transaction may straddle micro-batches, and every
    message is delivered exactly once."""
    root, ckpt = tmp_path / "store", tmp_path / "ckpt"
    to_src = lambda d: ("src", "application/x-ndjson")  # noqa: E731
    with LocalJournalStore(root) as store:
        store.create("src", NDJSON)
        store.create("dst", NDJSON)
        pub = Publisher(store)
        with Transaction(Publisher(store)) as txn:
            for n in range(100, 104):
                txn.publish(to_src, JsonDocument(n=n))
                pub.publish_committed(to_src, JsonDocument(n=n - 100))
        for n in range(4, 24):
            pub.publish_committed(to_src, JsonDocument(n=n))
        store.flush()
        frame = store.head("src") // 29  # 28 messages and an ACK, of about the same size
    with pytest.raises(Exception, match="max_bytes_per_trigger must be a positive"):
        (spark.readStream.format("journal").option("root", str(root)).option("journal", "src")
         .option("schema", "n long").option("max_bytes_per_trigger", "0").load())
    src = (
        spark.readStream.format("journal").option("root", str(root)).option("journal", "src")
        .option("schema", "n long").option("max_bytes_per_trigger", str(frame * 3 + 2))
        .load()
    )
    q = (
        src.where("flags != 2").select("n").writeStream.format("journal")
        .option("root", str(root)).option("journal", "dst")
        .option("checkpointLocation", str(ckpt)).trigger(processingTime="50 milliseconds")
        .start()
    )
    q.processAllAvailable()
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    q.stop()
    got = sorted(d["n"] for d in committed_docs(root, "dst"))
    assert got == [*range(24), *range(100, 104)]
    assert len(progress) >= 8  # 29 frames, at most 3 a micro-batch (a committed span more)
    assert all(p["numInputRows"] <= 3 + 5 for p in progress)


def test_a_stream_over_a_selector_reads_journals_that_join_it(
        spark: Any, tmp_path: Path) -> None:
    """A journal created after the query started, matching its selector, is
    read from its beginning at the next micro-batch; nothing is read twice."""
    root, ckpt = tmp_path / "store", tmp_path / "ckpt"
    store = LocalJournalStore(root)
    for name in ("src/part-0", "src/part-1", "dst"):
        store.create(name, NDJSON)
    pub = Publisher(store)

    def publish(journal: str, numbers: range) -> None:
        for n in numbers:
            pub.publish_committed(lambda d: (journal, "application/x-ndjson"), JsonDocument(n=n))
        store.flush()

    publish("src/part-0", range(0, 10))
    publish("src/part-1", range(10, 20))
    src = (spark.readStream.format("journal").option("root", str(root))
           .option("selector", "prefix=src/").option("schema", "n long").load())
    q = (src.where("flags != 2").select("n").writeStream.format("journal")
         .option("root", str(root)).option("journal", "dst")
         .option("checkpointLocation", str(ckpt)).trigger(processingTime="100 milliseconds")
         .start())
    try:
        q.processAllAvailable()
        assert sorted(d["n"] for d in committed_docs(root, "dst")) == list(range(20))
        store.create("src/part-2", NDJSON)
        publish("src/part-2", range(20, 30))
        publish("src/part-0", range(30, 35))
        q.processAllAvailable()
    finally:
        q.stop()
        store.close()
    assert sorted(d["n"] for d in committed_docs(root, "dst")) == list(range(35))


def test_available_now_stops_at_the_heads_when_the_query_began(tmp_path: Path) -> None:
    """The reader's contract with Spark for Trigger.AvailableNow: after
    prepareForTriggerAvailableNow, latestOffset goes (in bounded steps) to the
    write heads of that moment and no further, whatever is appended later,
    and a journal that joins the selector later is not read."""
    from pyspark.sql.streaming.datasource import ReadMaxBytes
    from pyspark.sql.types import LongType, StructField, StructType

    from pipeline._streaming import SparkStreamReader

    root = tmp_path / "store"
    with LocalJournalStore(root) as store:
        store.create("src/a", {**NDJSON, "app": "t"})
        pub = Publisher(store)
        for n in range(20):
            pub.publish_committed(lambda d: ("src/a", "application/x-ndjson"),
                                  JsonDocument(n=n)).result()
        options = {"root": str(root), "selector": "app=t", "schema": "n long"}
        r = SparkStreamReader(options, StructType([StructField("n", LongType())]))
        r.prepareForTriggerAvailableNow()
        head = store.head("src/a")
        for n in range(20, 30):  # after the query began
            pub.publish_committed(lambda d: ("src/a", "application/x-ndjson"),
                                  JsonDocument(n=n)).result()
        store.create("src/b", {**NDJSON, "app": "t"})
        store.append("src/b", b'{"n": 99}\n').result()
        offset = r.initialOffset()
        steps = 0
        while True:
            nxt = r.latestOffset(offset, ReadMaxBytes(head // 5))
            if nxt["offsets"] == offset["offsets"]:
                break
            assert nxt["offsets"]["src/a"] - offset["offsets"].get("src/a", 0) <= head // 5 + 64
            offset, steps = nxt, steps + 1
        assert offset["offsets"] == {"src/a": head} and steps >= 5
        latest = r.reportLatestOffset()
        assert latest["offsets"] == {"src/a": store.head("src/a"), "src/b": store.head("src/b")}
        assert latest["bytes_behind"] == store.head("src/a") - head + store.head("src/b")


def test_stream_starting_time_available_now_and_progress(spark: Any, tmp_path: Path) -> None:
    """starting_time: the stream begins at the first fragment written since
    (the earlier, sealed one is not read); Trigger.AvailableNow reads the rest
    in micro-batches of at most max_bytes_per_trigger and stops by itself;
    the progress reports carry the write heads (reportLatestOffset), and
    pipeline.StreamingMetrics records the rows of each micro-batch."""
    import time

    from prometheus_client import CollectorRegistry

    import pipeline

    root, ckpt = tmp_path / "store", tmp_path / "ckpt"
    to_src = lambda d: ("src", "application/x-ndjson")  # noqa: E731
    with LocalJournalStore(root) as store:
        store.create("src", NDJSON)
        store.create("dst", NDJSON)
        pub = Publisher(store)
        for n in range(10):
            pub.publish_committed(to_src, JsonDocument(n=n)).result()
        store.seal("src")
        time.sleep(0.05)
        since = time.time()
        time.sleep(0.05)
        for n in range(10, 30):
            pub.publish_committed(to_src, JsonDocument(n=n)).result()
        head = store.head("src")
    with pytest.raises(Exception, match="starting_time must be"):
        (spark.readStream.format("journal").option("root", str(root)).option("journal", "src")
         .option("schema", "n long").option("starting_time", "yesterday").load())
    src = (
        spark.readStream.format("journal").option("root", str(root)).option("journal", "src")
        .option("schema", "n long").option("starting_time", str(since))
        .option("max_bytes_per_trigger", str(head // 8)).load()
    )
    registry = CollectorRegistry()
    metrics.enable(registry)
    listener = pipeline.StreamingMetrics()
    spark.streams.addListener(listener)
    try:
        q = (
            src.where("flags != 2").select("n").writeStream.format("journal")
            .queryName("to_dst").option("root", str(root)).option("journal", "dst")
            .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
        )
        assert q.awaitTermination(300)
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
        assert sorted(d["n"] for d in committed_docs(root, "dst")) == list(range(10, 30))
        assert len(progress) >= 3
        latest = progress[-1]["sources"][0]["latestOffset"]
        latest = json.loads(latest) if isinstance(latest, str) else latest
        assert latest["offsets"] == {"src": head}
        # The listener saw every micro-batch (its events come asynchronously).
        query = {"query": "to_dst"}
        deadline = time.monotonic() + 30
        while (registry.get_sample_value("exactly_spark_sink_rows_total", query) != 20
               and time.monotonic() < deadline):
            time.sleep(0.1)
        assert registry.get_sample_value("exactly_spark_source_rows_total", query) == 20
        assert registry.get_sample_value("exactly_spark_sink_rows_total", query) == 20
        assert registry.get_sample_value("exactly_spark_source_bytes_behind", query) == 0
    finally:
        spark.streams.removeListener(listener)
        metrics.disable()


def reader_stream(spark: Any, root: Path) -> Any:
    return (
        spark.readStream.format("journal").option("root", str(root)).option("journal", "src")
        .option("schema", "n long").load()
    )


def test_latest_state_by_key_with_deletes(spark: Any, tmp_path: Path) -> None:
    """The last committed message per key wins; empty content or a tombstone deletes."""
    import pipeline

    to_j = lambda d: ("s", "application/x-ndjson")  # noqa: E731
    with LocalJournalStore(tmp_path / "store") as store:
        store.create("s", NDJSON)
        pub = Publisher(store)
        for key, value in [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2), ("d", 5)]:
            pub.publish_committed(to_j, JsonDocument(key=key, value=value))
        pub.publish_committed(to_j, JsonDocument(key="c"))  # empty content: a delete
        pub.publish_committed(to_j, JsonDocument(key="d", value=6, deleted=True))
        with Transaction(Publisher(store)) as txn:
            txn.publish(to_j, JsonDocument(key="a", value=3))
        aborted = Transaction(Publisher(store))
        aborted.publish(to_j, JsonDocument(key="b", value=99))
        aborted.abort()
    df = reader(spark, tmp_path / "store", journal="s",
                schema="key string, value long, deleted boolean", include_acks="false")
    out = pipeline.materialize_latest(
        df, "key", str(tmp_path / "latest"), tombstone="deleted"
    )
    assert sorted((r.key, r.value) for r in out.collect()) == [("a", 3), ("b", 2)]
    parquet = spark.read.parquet(str(tmp_path / "latest"))
    assert {"key", "value", "uuid", "commit_offset"} <= set(parquet.columns)


def test_bad_options_are_clear_errors(spark: Any, tmp_path: Path) -> None:
    """Missing root, both journal and selector, or a bad isolation name raise at once;
    a selector that matches nothing reads no rows."""
    with LocalJournalStore(tmp_path) as store:
        store.create("j", NDJSON)
    with pytest.raises(Exception, match=r"root .* or the option broker .*: neither was given"):
        spark.read.format("journal").option("journal", "j").load().collect()
    with pytest.raises(Exception, match="splits_per_journal must be auto or a whole number"):
        reader(spark, tmp_path, journal="j", splits_per_journal="zero").collect()
    with pytest.raises(Exception, match="exactly one of"):
        reader(spark, tmp_path, journal="j", selector="a=b").collect()
    with pytest.raises(Exception, match="isolation"):
        reader(spark, tmp_path, journal="j", isolation="dirty").collect()
    with pytest.raises(Exception, match="no journal store at"):
        reader(spark, tmp_path / "absent", journal="j").collect()
    assert reader(spark, tmp_path, selector="app=none").count() == 0
    # Write mistakes fail on the driver, before any task runs or a journal is made.
    with LocalJournalStore(tmp_path) as store:
        store.create("t/0", {**NDJSON, "app": "t"})
    df = spark.createDataFrame([(1, "k")], "n long, k string")

    def write(frame: Any, **options: str) -> None:
        w = frame.write.format("journal").option("root", str(tmp_path)).mode("append")
        for k, v in options.items():
            w = w.option(k, v)
        w.save()

    for frame, options, says in (
        (df, {"selector": "app=t", "key": "zz"}, "key column 'zz' is not among"),
        (df, {"selector": "app=t", "key": "k", "hash": "bogus"}, "unknown hash 'bogus'"),
        (df, {"journal": "p1", "content_type": "proto"}, "option proto_class"),
        (df.selectExpr("n", "'x' AS _meta"), {"journal": "j"},
         "the column '_meta' is string, not a struct"),
    ):
        with pytest.raises(Exception, match=says):
            write(frame, **options)
    with LocalJournalStore(tmp_path) as store:
        assert [s.name for s in store.list()] == ["j", "t/0"]
        assert store.head("j") == 0 and store.head("t/0") == 0


def test_a_cluster_that_never_answers_fails_within_the_connect_timeout_option(
    spark: Any,
) -> None:
    """``connect_timeout`` reaches the clients of a read: a broker address
    where nothing listens fails within it, and says so; a value that is not
    a number of seconds is a clear error."""
    import socket

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        broker = f"http://127.0.0.1:{s.getsockname()[1]}"

    def read(**options: str) -> Any:
        r = spark.read.format("journal").option("broker", broker).option("journal", "j")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load().collect()

    with pytest.raises(Exception, match=r"no Gazette broker answered .* within 0\.5 s"):
        read(connect_timeout="0.5", schema="page string")
    with pytest.raises(Exception, match="the option connect_timeout must be a number of seconds"):
        read(connect_timeout="soon", schema="page string")


def test_offsets_are_json(tmp_path: Path) -> None:
    """A streaming offset round-trips through JSON (Spark's offset log)."""
    from message import ProducerState
    from pipeline._stream_offsets import encode_states, states_of

    states = [ProducerState("j", bytes(range(6)), 2**64 - 1, 42)]
    offset = {"offsets": {"j": 10}, "states": {"j": encode_states(states)}}
    assert states_of(json.loads(json.dumps(offset)), "j") == states



def test_content_columns_are_inferred_without_a_schema(spark: Any, tmp_path: Path) -> None:
    """With no schema option, NDJSON fields become columns, as spark.read.json would
    infer them: scalars typed, the UUID's _meta left out, mixed types as strings."""
    with LocalJournalStore(tmp_path) as store:
        store.create("i/a", NDJSON)
        store.create("i/b", NDJSON)
        pub = Publisher(store)
        pub.publish_committed(lambda d: ("i/a", "application/x-ndjson"),
                              JsonDocument(page="/a", n=1, ok=True, nested={"x": 1})).result()
        pub.publish_committed(lambda d: ("i/b", "application/x-ndjson"),
                              JsonDocument(page="/b", n="two", ratio=0.5)).result()
    df = (spark.read.format("journal").option("root", str(tmp_path))
          .option("selector", "prefix=i/").load())
    types = dict(df.dtypes)
    assert types["page"] == "string" and types["ok"] == "boolean" and types["ratio"] == "double"
    assert types["n"] == "string"  # a number in one journal, a string in the other
    assert "_meta" not in types and "nested" not in types
    rows = sorted((r.journal, r.page, r.n) for r in df.collect())
    assert rows == [("i/a", "/a", "1"), ("i/b", "/b", "two")]


def test_csv_content_columns_are_inferred_without_a_schema(spark: Any, tmp_path: Path) -> None:
    """With no schema option, a CSV journal's fields after the UUID are
    string columns _c1, _c2, ..., by position."""
    from message import CSVRecord

    with LocalJournalStore(tmp_path) as store:
        store.create("c", {"content-type": "text/csv"})
        pub = Publisher(store)
        for i in range(3):
            pub.publish_committed(lambda d: ("c", "text/csv"), CSVRecord(["", f"k{i}", str(i)]))
        store.flush()
    df = spark.read.format("journal").option("root", str(tmp_path)).option("journal", "c").load()
    assert dict(df.dtypes)["_c1"] == "string" and dict(df.dtypes)["_c2"] == "string"
    assert sorted((r._c1, r._c2) for r in df.collect()) == [(f"k{i}", str(i)) for i in range(3)]


def test_write_creates_a_missing_store_and_journal(spark: Any, tmp_path: Path) -> None:
    """Writing to a journal that does not exist creates the store and the journal
    (NDJSON by default, or the content_type option), then reads back exactly once."""
    root = tmp_path / "fresh"
    df = spark.createDataFrame([(f"w{i}", i) for i in range(5)], "s string, n long")
    df.write.format("journal").option("root", str(root)).option("journal", "new/j") \
        .mode("append").save()
    df.write.format("journal").option("root", str(root)).option("journal", "new/c") \
        .option("content_type", "csv").mode("append").save()
    with LocalJournalStore(root) as store:
        assert store.get("new/j").content_type == "application/x-ndjson"
        assert store.get("new/c").content_type == "text/csv"
    back = (spark.read.format("journal").option("root", str(root)).option("journal", "new/j")
            .option("include_acks", "false").load())
    assert sorted((r.s, r.n) for r in back.collect()) == [(f"w{i}", i) for i in range(5)]
    csv = (spark.read.format("journal").option("root", str(root)).option("journal", "new/c")
           .option("schema", "s string, n long").option("include_acks", "false").load())
    assert sorted((r.s, r.n) for r in csv.collect()) == [(f"w{i}", i) for i in range(5)]


def test_a_write_in_overwrite_mode_is_refused(spark: Any, tmp_path: Path) -> None:
    """Journals are append-only: mode("overwrite") is one clear error, and
    writes nothing (it used to append)."""
    root = tmp_path / "store"
    df = spark.createDataFrame([("a", 1)], "s string, n long")
    df.write.format("journal").option("root", str(root)).option("journal", "j") \
        .mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        df.write.format("journal").option("root", str(root)).option("journal", "j") \
            .mode("overwrite").save()
    with LocalJournalStore(root) as store:
        rows = [e for e in ReadCommittedIter(store, "j", lambda _s: JsonDocument())
                if "s" in e.message]
    assert len(rows) == 1


def test_content_fields_named_like_envelope_columns_are_renamed(
    spark: Any, tmp_path: Path
) -> None:
    """A message field named like an envelope column (a top-level `uuid`,
    `begin`, ...) comes as `content_<name>`, inferred or named in the schema:
    never two columns of one name (Spark's AMBIGUOUS_REFERENCE)."""
    with LocalJournalStore(tmp_path) as store:
        store.create("j", NDJSON)
        pub = Publisher(store)
        to = lambda _d: ("j", "application/x-ndjson")  # noqa: E731
        for i in range(3):
            pub.publish_committed(to, JsonDocument(uuid=f"order-{i}", begin=i, page="/p"))
        store.flush()
        want = [(str(e.message.get_uuid()), e.message["uuid"], e.begin, e.message["begin"])
                for e in ReadCommittedIter(store, "j", lambda _s: JsonDocument())]
    inferred = reader(spark, tmp_path, journal="j")
    assert inferred.columns.count("uuid") == 1 and inferred.columns.count("begin") == 1
    assert {"content_uuid", "content_begin", "page"} <= set(inferred.columns)
    for df in (
        inferred,
        reader(spark, tmp_path, journal="j", schema="uuid string, begin long, page string"),
        reader(spark, tmp_path, journal="j",
               schema='{"type": "struct", "fields": [{"name": "uuid", "type": "string",'
                      ' "nullable": true, "metadata": {}}, {"name": "begin", "type": "long",'
                      ' "nullable": true, "metadata": {}}]}'),
    ):
        rows = df.select("uuid", "content_uuid", "begin", "content_begin").orderBy("begin")
        assert [tuple(r) for r in rows.collect()] == want
    # The renamed columns say what they hold.
    field = inferred.schema["content_uuid"]
    assert field.metadata.get("comment") == "message field uuid"


def test_content_fields_named_like_envelope_columns_in_another_case_are_renamed(
    spark: Any, tmp_path: Path
) -> None:
    """Spark resolves column names without regard to case: a field `UUID` or
    `End` would make `uuid` and `end` ambiguous, so it is renamed too."""
    with LocalJournalStore(tmp_path) as store:
        store.create("j", NDJSON)
        pub = Publisher(store)
        to = lambda _d: ("j", "application/x-ndjson")  # noqa: E731
        for i in range(3):
            pub.publish_committed(to, JsonDocument(UUID=f"order-{i}", End=i, total=12))
        store.flush()
    for df in (reader(spark, tmp_path, journal="j"),
               reader(spark, tmp_path, journal="j", schema="UUID string, End long")):
        assert {"content_UUID", "content_End"} <= set(df.columns)
        rows = df.where("end > 0").select("uuid", "content_UUID", "content_End").orderBy("end")
        got = [tuple(r) for r in rows.collect()]
        assert [r[1:] for r in got] == [(f"order-{i}", i) for i in range(3)]
        assert all(len(r[0]) == 36 for r in got)  # the envelope's own uuid


def test_a_spark_jvm_that_dies_at_start_is_started_again_then_reported(tmp_path: Path) -> None:
    """local_session starts the JVM again when it exits before answering (a
    forked launcher can be aborted by gRPC's fork handler), up to three
    times; a JVM that never starts (here: no java at JAVA_HOME) is then
    PySpark's own error, not a hang. The pipes of the launchers started
    again are let go quietly (under a test's warnings-as-errors, a
    ResourceWarning for them would fail whatever test the garbage collector
    ran in); only the last one's, whose error is raised, stays PySpark's."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c",
         "import pipeline; pipeline.local_session()"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "JAVA_GATEWAY_EXITED" in proc.stderr
    assert proc.stderr.count("starting it again") == 2
    assert proc.stderr.count("ResourceWarning") <= 1, proc.stderr
