"""The ``journal`` data source on a Gazette cluster (``.option("broker", url)``),
in the local SparkSession: the same reads, exactly-once writes and streams as
on the embedded store, with every task opening its own client."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest

from journal import GazetteClient
from message import (
    Flags,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Transaction,
    get_flags,
)
from pipeline._stores import STATE_PREFIX
from tests.pipeline.support import committed_rows, random_workload

pytestmark = pytest.mark.spark

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture(autouse=True)
def _quiet_sequencer() -> Any:
    logging.getLogger("message").setLevel(logging.ERROR)
    yield
    logging.getLogger("message").setLevel(logging.NOTSET)


@pytest.fixture
def client(gazette_cluster: Any) -> Any:
    with GazetteClient(gazette_cluster.address) as c:
        yield c


def read(spark: Any, cluster: Any, **options: str) -> Any:
    r = spark.read.format("journal").option("broker", cluster.address)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def committed(client: GazetteClient, journal: str) -> list[Any]:
    return [
        e.message for e in ReadCommittedIter(client, journal, lambda _s: JsonDocument())
        if get_flags(e.message.get_uuid()) != Flags.ACK_TXN
    ]


def no_open_transaction(client: GazetteClient, journal: str) -> bool:
    it = ReadCommittedIter(client, journal, lambda _s: JsonDocument())
    for _ in it:
        pass
    return not it.sequencer.has_pending({})


def test_read_committed_through_brokers_equals_read_committed_iter(
    spark: Any, gazette_cluster: Any, gazette_prefix: str, client: GazetteClient
) -> None:
    """Parallel committed rows (3 splits a journal) are ReadCommittedIter's,
    in (commit_offset, begin) order; read uncommitted is every frame."""
    journals = [f"{gazette_prefix}w/{x}" for x in "abc"]
    random_workload(client, random.Random(11), journals)
    want = committed_rows(client, journals, acks=False)
    total = sum(1 for j in journals for _ in ReadUncommittedIter(
        client, j, lambda _s: JsonDocument()))
    selector = f"prefix={gazette_prefix}w/"
    df = read(spark, gazette_cluster, selector=selector, schema="n long", splits_per_journal="3")
    assert df.rdd.getNumPartitions() == 9
    rows = df.orderBy("journal", "commit_offset", "begin").collect()
    assert [(r.journal, r.begin, r.uuid, r.n) for r in rows] == want
    uncommitted = read(spark, gazette_cluster, selector=selector, isolation="read_uncommitted")
    assert uncommitted.count() == total > len(want)


def test_persisted_fragments_read_from_the_file_store(
    spark: Any, gazette_cluster: Any, gazette_prefix: str, client: GazetteClient
) -> None:
    """With file_root, tasks read persisted fragments from the fragment store
    (a copy with one document changed shows the change) and the rest through
    the brokers."""
    import shutil

    name = f"{gazette_prefix}persisted"
    with GazetteClient(gazette_cluster.address, refresh_interval=1) as quick:
        quick.create(name, NDJSON, fragment_length=1024)  # brokers list the store each second
    pub = Publisher(client)
    for i in range(300):
        pub.publish_committed(lambda _m: (name, NDJSON["content-type"]), JsonDocument(n=i))
        if i % 30 == 29:
            client.flush()  # a fragment closes between Append RPCs
    client.flush()
    import time

    deadline = time.monotonic() + 60
    while not any(f.sealed for f in client.fragments(name)):
        assert time.monotonic() < deadline, "no fragment was persisted"
        time.sleep(0.2)
    plain = read(spark, gazette_cluster, journal=name, schema="n long")
    assert sorted(r.n for r in plain.collect()) == list(range(300))
    direct = read(spark, gazette_cluster, journal=name, schema="n long",
                  file_root=str(gazette_cluster.fragment_root))
    assert sorted(r.n for r in direct.collect()) == list(range(300))
    # A copy of the store whose first persisted fragment says 9 where it said 0.
    copy = Path(str(gazette_cluster.fragment_root) + "-copy-" + gazette_prefix.strip("/")
                .replace("/", "-"))
    shutil.copytree(gazette_cluster.fragment_root, copy)
    try:
        first = next(f for f in client.fragments(name) if f.sealed)
        victim = copy / first.path[len("file:///"):]
        data = victim.read_bytes()
        assert b'{"n":0,' in data
        victim.write_bytes(data.replace(b'{"n":0,', b'{"n":9,', 1))  # the same length
        changed = read(spark, gazette_cluster, journal=name, schema="n long",
                       file_root=str(copy))
        got = sorted(r.n for r in changed.collect())
        assert got == sorted([*range(1, 300), 9])
    finally:
        shutil.rmtree(copy)


def test_write_through_brokers_exactly_once_when_first_attempts_fail(
    spark: Any, gazette_cluster: Any, gazette_prefix: str, client: GazetteClient
) -> None:
    """First attempts fail half-way and are retried: every row committed once,
    no transaction left open, no state journal left behind."""
    name = f"{gazette_prefix}out"

    def flaky(batches: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for i, batch in enumerate(batches):
            if i == 5 and ctx.attemptNumber() == 0 and ctx.partitionId() in (1, 3):
                raise RuntimeError("injected failure of a first attempt")
            yield batch

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        df = spark.range(0, 800, numPartitions=4).withColumnRenamed("id", "n")
        (df.mapInArrow(flaky, "n long").write.format("journal")
         .option("broker", gazette_cluster.address).option("journal", name)
         .mode("append").save())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert sorted(d["n"] for d in committed(client, name)) == list(range(800))
    assert no_open_transaction(client, name)
    # The job's attempts journal went with the job (streaming sinks keep theirs).
    jobs = [s.name for s in client.list(f"prefix={STATE_PREFIX}attempts/")]
    assert [j for j in jobs if not j.rsplit("/", 1)[-1].startswith("sink-")] == []


def test_a_write_creates_its_journal_with_the_replication_asked_for(
    spark: Any, gazette_cluster: Any, gazette_prefix: str, client: GazetteClient, tmp_path: Path
) -> None:
    """``replication`` sets how many brokers hold a journal the write creates;
    a bad value, or the option on the embedded store, is one clear error."""
    name = f"{gazette_prefix}one-copy"
    df = spark.range(0, 300, numPartitions=2).selectExpr("id as n", "concat('s', id) as s")
    (df.write.format("journal").option("broker", gazette_cluster.address)
     .option("journal", name).option("replication", "1").mode("append").save())
    out = gazette_cluster.gazctl("journals", "list", "-l", f"name={name}", "--format", "yaml")
    assert "replication: 1" in out.stdout.decode()
    assert sorted((d["n"], d["s"]) for d in committed(client, name)) == \
        [(n, f"s{n}") for n in range(300)]
    for where, value, error in [("broker", "0", "at least 1"), ("broker", "two", "at least 1"),
                                ("root", "1", "Gazette cluster")]:
        at = gazette_cluster.address if where == "broker" else str(tmp_path)
        with pytest.raises(Exception, match=error):
            (df.write.format("journal").option(where, at).option("journal", f"{name}-{value}")
             .option("replication", value).mode("append").save())


def test_a_write_job_that_fails_through_brokers_leaves_nothing(
    spark: Any, gazette_cluster: Any, gazette_prefix: str, client: GazetteClient
) -> None:
    """A task that always fails fails the job: no row committed, no open transaction."""
    from pyspark.sql import functions as F  # noqa: N812

    name = f"{gazette_prefix}doomed"
    client.create(name, NDJSON)

    @F.udf(returnType="long", useArrow=False)
    def doomed(n: int) -> int:
        if n == 350:
            raise RuntimeError("this task always fails")
        return n

    df = spark.range(0, 400, numPartitions=4).select(doomed("id").alias("n"))
    with pytest.raises(Exception, match="always fails"):
        (df.write.format("journal").option("broker", gazette_cluster.address)
         .option("journal", name).mode("append").save())
    assert committed(client, name) == []
    assert no_open_transaction(client, name)


def test_stream_through_brokers_exactly_once_across_restarts(
    spark: Any, gazette_cluster: Any, gazette_prefix: str, client: GazetteClient, tmp_path: Path
) -> None:
    """A stream between two cluster journals, with a read limit, stopped with
    its last commit forgotten and restarted, delivers every message once."""
    src, dst = f"{gazette_prefix}src", f"{gazette_prefix}dst"
    client.create(src, NDJSON)
    client.create(dst, NDJSON)
    to_src = lambda _d: (src, "application/x-ndjson")  # noqa: E731
    pub = Publisher(client)
    for n in range(20):
        pub.publish_committed(to_src, JsonDocument(n=n))
    txn = Transaction(Publisher(client))
    for n in range(100, 105):
        txn.publish(to_src, JsonDocument(n=n))  # open across micro-batches
    client.flush()
    ckpt = tmp_path / "ckpt"

    def start() -> Any:
        stream = (spark.readStream.format("journal").option("broker", gazette_cluster.address)
                  .option("journal", src).option("schema", "n long")
                  .option("max_bytes_per_trigger", "400").load())
        return (stream.select("n").writeStream.format("journal")
                .option("broker", gazette_cluster.address).option("journal", dst)
                .option("checkpointLocation", str(ckpt))
                .trigger(processingTime="100 milliseconds").start())

    q = start()
    q.processAllAvailable()
    assert sorted(d["n"] for d in committed(client, dst)) == list(range(20))
    for n in range(20, 30):
        pub.publish_committed(to_src, JsonDocument(n=n))
    txn.commit()
    q.processAllAvailable()
    q.stop()
    commits = sorted((p for p in (ckpt / "commits").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    commits[-1].unlink()  # as if the query died after the sink's commit, before Spark's
    (ckpt / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    for n in range(30, 40):
        pub.publish_committed(to_src, JsonDocument(n=n))
    client.flush()
    q = start()
    q.processAllAvailable()
    q.stop()
    assert sorted(d["n"] for d in committed(client, dst)) == [*range(40), *range(100, 105)]


def test_latest_state_by_key_through_brokers(
    spark: Any, gazette_cluster: Any, gazette_prefix: str, client: GazetteClient, tmp_path: Path
) -> None:
    """materialize_latest over a cluster journal: last committed per key, deletes applied."""
    import pipeline

    name = f"{gazette_prefix}state"
    client.create(name, NDJSON)
    to_j = lambda _d: (name, "application/x-ndjson")  # noqa: E731
    pub = Publisher(client)
    for key, value in [("a", 1), ("b", 1), ("a", 2), ("c", 1)]:
        pub.publish_committed(to_j, JsonDocument(key=key, value=value))
    pub.publish_committed(to_j, JsonDocument(key="c"))  # a delete
    aborted = Transaction(Publisher(client))
    aborted.publish(to_j, JsonDocument(key="b", value=99))
    aborted.abort()
    client.flush()
    df = read(spark, gazette_cluster, journal=name, schema="key string, value long")
    out = pipeline.materialize_latest(df, "key", str(tmp_path / "latest"))
    assert sorted((r.key, r.value) for r in out.collect()) == [("a", 2), ("b", 1)]


def test_root_and_broker_together_is_one_error(spark: Any, tmp_path: Path) -> None:
    """Both root and broker, or neither: one clear error."""
    with pytest.raises(Exception, match="give one, not both"):
        (spark.read.format("journal").option("root", str(tmp_path))
         .option("broker", "http://127.0.0.1:1").option("journal", "x").load().collect())


def test_reads_and_writes_through_a_secured_cluster(
    spark: Any, gazette_secure_cluster: Any, tmp_path: Path
) -> None:
    """The source's options trusted_ca_file, cert_file, cert_key_file and
    auth_keys reach a cluster that serves TLS, asks for client certificates
    and checks authorizations: a write, then a committed read, exactly once;
    without them the job fails with the broker's refusal."""
    import secrets

    c = gazette_secure_cluster
    options = {k: v for k, v in c.client_options().items() if v}
    name = f"secure/spark-{secrets.token_hex(3)}/out"
    with GazetteClient(c.address, replication=1, **options) as g:
        g.create(name, NDJSON)
    df = spark.createDataFrame([(i, f"/p{i}") for i in range(20)], "n long, page string")
    # replication 1: the cluster has two brokers; the job's own state journals too.
    w = df.write.format("journal").option("broker", c.address).option("journal", name) \
        .option("replication", "1")
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()
    r = spark.read.format("journal").option("broker", c.address).option("journal", name)
    for k, v in options.items():
        r = r.option(k, v)
    rows = r.option("schema", "n long, page string").load().collect()
    assert sorted(row.n for row in rows) == list(range(20))
    bare = spark.read.format("journal").option("broker", c.address).option("journal", name)
    with pytest.raises(Exception, match=r"BrokerAuthError|TLS|refused"):
        bare.option("trusted_ca_file", options["trusted_ca_file"]).load().collect()
