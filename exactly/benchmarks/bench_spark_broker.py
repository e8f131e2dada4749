"""Spark on a Gazette cluster: the ``journal`` source through the brokers,
beside the same over the embedded store, and beside Spark's own JSON writer.

A cluster of 3 brokers is started here on 127.0.0.1 (``exactly.localcluster``),
and Spark runs locally (2 cores): what is measured is the source's own work
through the brokers, not a network.

- ``read committed, brokers vs embedded store``: the workload of
  ``bench_spark`` (clicks, transactions, aborted ones, retried appends) is
  copied byte for byte into journals of the cluster; the same read (committed
  rows, content decoded, written to the ``noop`` sink) from either store.
- ``exactly-once write, brokers vs df.write.json``: one DataFrame written to
  a journal of the cluster (uncommitted by each task, committed by the
  driver), beside the same DataFrame written as JSON files to local disk.
  The journal is created by the write with the default replication (3: every
  broker of this cluster stores, and checksums, every byte), and again with
  ``replication`` 1 — one copy, as the local files are. Beside them, the
  hand-off alone: the same DataFrame passed to Python workers as Arrow
  batches and dropped (``mapInArrow`` to the ``noop`` sink), the least a
  write by a Python data source costs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from exactly.benchmarks._harness import Result, interleaved
from exactly.benchmarks._workload import copy_journal
from exactly.benchmarks.bench_broker import Unavailable, start_cluster
from exactly.benchmarks.bench_spark import _CONTENT, _populate
from journal import GazetteClient, LocalJournalStore


def run(scale: float) -> list[Result]:
    import pipeline

    n = max(5000, int(400_000 * scale))
    rows_out = max(5000, int(1_000_000 * scale))
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-broker-"))
    try:
        try:
            cluster = start_cluster(tmp / "cluster")
        except Unavailable as exc:
            print(f"  Spark broker rows skipped: {exc}")
            return []
        try:
            spark = pipeline.local_session("local[2]")
            _populate(tmp / "store", n)
            address = cluster.address
            with LocalJournalStore(tmp / "store") as store, GazetteClient(address) as client:
                for spec in store.list("app=c"):
                    client.create(spec.name, spec.labels)
                    copy_journal(store, client, spec.name)
            read_opts = {"selector": "app=c", "schema": _CONTENT}
            runs = iter(range(1_000_000))

            def read(**where: str) -> None:
                df = spark.read.format("journal").options(**read_opts, **where).load()
                df.write.format("noop").mode("overwrite").save()

            df = spark.range(0, rows_out, numPartitions=2).selectExpr(
                "id as n", "concat('s', id % 5000) as session", "id % 10000 as ms")
            df = df.cache()
            df.count()

            def write_broker(replication: int = 3) -> None:
                (df.write.format("journal").option("broker", address)
                 .option("journal", f"bench/out-{next(runs)}")
                 .option("replication", str(replication)).mode("append").save())

            def write_json() -> None:
                df.write.mode("overwrite").json(str(tmp / "json-out"))

            def hand_off() -> None:
                (df.mapInArrow(_drop, df.schema).write.format("noop")
                 .mode("overwrite").save())

            read(broker=address)  # warm up: worker start-up and imports are not throughput
            write_broker()
            repeat = 3 if scale >= 0.5 else 1
            reads = interleaved({"broker": lambda: read(broker=address),
                                 "store": lambda: read(root=str(tmp / "store"))}, repeat=repeat)
            writes = interleaved({"broker": write_broker, "one copy": lambda: write_broker(1),
                                  "hand-off": hand_off, "json": write_json}, repeat=repeat)
            rows_in = spark.read.format("journal").options(**read_opts,
                                                           root=str(tmp / "store")).load().count()
            df.unpersist()
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [
        Result("spark: read committed through brokers vs embedded store",
               rows_in / reads["broker"], "rows/s", baseline_name="same, embedded store",
               baseline=rows_in / reads["store"], target=0.8),
        Result("spark: exactly-once write through brokers vs df.write.json",
               rows_out / writes["broker"], "rows/s", baseline_name="df.write.json (local)",
               baseline=rows_out / writes["json"], target=0.5),
        Result("spark: same, journal of replication 1 vs df.write.json",
               rows_out / writes["one copy"], "rows/s", baseline_name="df.write.json (local)",
               baseline=rows_out / writes["json"]),
        Result("spark: Arrow hand-off to Python alone vs df.write.json",
               rows_out / writes["hand-off"], "rows/s", baseline_name="df.write.json (local)",
               baseline=rows_out / writes["json"]),
    ]


def _drop(batches: Any) -> Any:
    """Arrow batches received and dropped (nothing is written)."""
    for batch in batches:
        yield batch.slice(0, 0)


if __name__ == "__main__":
    import os
    import time

    from exactly.benchmarks._harness import format_table

    t0 = time.perf_counter()
    print(format_table(run(float(os.environ.get("BENCH_SCALE", "1")))))
    print(f"({time.perf_counter() - t0:.1f} s)")
