"""A Spark driver program for the tests on a Spark standalone cluster:
``python -m tests.spark_cluster_job MASTER BROKER SCENARIO PREFIX [FILE_ROOT]``.

Run in a process of its own (a test process already has its local
SparkSession, and a process has one). It connects to the standalone master,
whose executors are JVMs of their own with Python workers of their own, runs
one scenario against journals of the Gazette cluster at BROKER (named with
PREFIX), and prints one JSON line: what the scenario saw.

``python -m tests.spark_cluster_job MASTER BROKER --serve`` runs scenarios
one after another in one application (an application's start, its driver
JVM and executors, is most of a short scenario's time): each line of its
standard input is ``[SCENARIO, PREFIX, FILE_ROOT]`` in JSON, and for each it
prints a line ``RESULT`` and what the scenario saw (or ``{"error": ...}``),
until its input ends. Scenarios that need settings of their own at the
application's start (speculation) run alone.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def main(master: str, broker: str, scenario: str, prefix: str = "", file_root: str = "") -> None:
    serve = scenario == "--serve"
    spark = _session(master, "serve" if serve else scenario,
                     speculation=scenario == "speculation")
    try:
        if serve:
            _serve(spark, broker)
            return
        out = SCENARIOS[scenario](spark, broker, prefix, file_root)
    finally:
        spark.stop()
    print(json.dumps(out), flush=True)


def _serve(spark: Any, broker: str) -> None:
    """Run the scenarios named on standard input, in this application."""
    import traceback

    for line in sys.stdin:
        if not line.strip():
            continue
        scenario, prefix, file_root = json.loads(line)
        try:
            out = SCENARIOS[scenario](spark, broker, prefix, file_root)
        except Exception:  # reported to the test that asked for it
            out = {"error": traceback.format_exc()}
        print("RESULT " + json.dumps(out), flush=True)


def _session(master: str, name: str, *, speculation: bool = False) -> Any:
    """The application ``exactly-test-NAME`` on ``master``."""
    import pipeline

    conf = {"spark.executor.memory": "512m", "spark.task.maxFailures": "4",
            "spark.cores.max": "2", "spark.sql.execution.arrow.maxRecordsPerBatch": "50"}
    if speculation:
        conf.update({"spark.speculation": "true", "spark.speculation.interval": "100ms",
                     "spark.speculation.multiplier": "1.5", "spark.speculation.quantile": "0.5",
                     "spark.speculation.minTaskRuntime": "500ms"})
    return pipeline.cluster_session(
        master, app=f"exactly-test-{name}", driver_host="127.0.0.1", conf=conf)


def _write(df: Any, broker: str, journal: str) -> None:
    (df.write.format("journal").option("broker", broker).option("journal", journal)
     .mode("append").save())


def _read(spark: Any, broker: str, **options: str) -> Any:
    r = spark.read.format("journal").option("broker", broker)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def write_and_read(spark: Any, broker: str, prefix: str, file_root: str) -> dict[str, Any]:
    """Write 2000 rows from 4 tasks, then read them back committed (through
    the brokers, and with file_root), and uncommitted; which executors ran."""
    import os

    df = spark.range(0, 2000, numPartitions=4).selectExpr("id as n", "id % 7 as k")
    _write(df, broker, f"{prefix}out")
    rows = _read(spark, broker, journal=f"{prefix}out", schema="n long, k long",
                 splits_per_journal="2")
    direct = _read(spark, broker, journal=f"{prefix}out", schema="n long",
                   file_root=file_root) if file_root else rows
    pids = spark.range(0, 8, numPartitions=8).rdd.map(lambda _: os.getpid()).distinct()
    return {
        "committed": sorted(r.n for r in rows.collect()),
        "direct": sorted(r.n for r in direct.collect()),
        "uncommitted": _read(spark, broker, journal=f"{prefix}out",
                             isolation="read_uncommitted").count(),
        "python_pids": sorted(pids.collect()),
        "driver_pid": os.getpid(),
    }


def first_attempts_fail(spark: Any, broker: str, prefix: str, file_root: str) -> dict[str, Any]:
    """The first attempt of two of four tasks fails half-way through its rows."""

    def flaky(batches: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for i, batch in enumerate(batches):
            if i == 5 and ctx.attemptNumber() == 0 and ctx.partitionId() in (1, 3):
                raise RuntimeError("injected failure of a first attempt")
            yield batch

    df = spark.range(0, 1000, numPartitions=4).withColumnRenamed("id", "n")
    _write(df.mapInArrow(flaky, "n long"), broker, f"{prefix}out")
    return {"written": True}


def job_fails(spark: Any, broker: str, prefix: str, file_root: str) -> dict[str, Any]:
    """One task fails on every attempt: the job fails."""
    from pyspark.sql import functions as F  # noqa: N812

    @F.udf(returnType="long", useArrow=False)
    def doomed(n: int) -> int:
        if n == 350:
            raise RuntimeError("this task always fails")
        return n

    df = spark.range(0, 400, numPartitions=4).select(doomed("id").alias("n"))
    try:
        _write(df, broker, f"{prefix}out")
    except Exception as exc:  # the failure is the point
        return {"failed": "always fails" in str(exc)}
    return {"failed": False}


def slow_write(spark: Any, broker: str, prefix: str, file_root: str) -> dict[str, Any]:
    """A write whose tasks publish slowly, for the test to SIGKILL an executor
    while they do; Spark runs the lost tasks again elsewhere."""

    def slowly(batches: Any) -> Any:
        for batch in batches:
            time.sleep(0.05)
            yield batch

    df = spark.range(0, 3000, numPartitions=4).withColumnRenamed("id", "n")
    _write(df.mapInArrow(slowly, "n long"), broker, f"{prefix}out")
    return {"written": True}


def speculation(spark: Any, broker: str, prefix: str, file_root: str) -> dict[str, Any]:
    """Speculation on: the first attempt of one task stalls half-way, after
    Spark handed its writer some of its rows, so Spark runs a copy of it on
    the other worker, keeps the copy and kills the straggler."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2000")

    def straggler(batches: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        slow = ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        if not slow and ctx.attemptNumber() == 0:
            time.sleep(4.0)  # time for the slow one to publish its first rows
        for i, batch in enumerate(batches):
            yield batch
            if slow and i == 10:
                time.sleep(30.0)

    df = spark.range(0, 160_000, numPartitions=4).withColumnRenamed("id", "n")
    _write(df.mapInArrow(straggler, "n long"), broker, f"{prefix}out")
    return {"written": True}


def stream(spark: Any, broker: str, prefix: str, file_root: str) -> dict[str, Any]:
    """A streaming query from one journal to another, run to the end of what
    is there, with a read limit."""
    import tempfile

    with tempfile.TemporaryDirectory() as ckpt:
        src = (spark.readStream.format("journal").option("broker", broker)
               .option("journal", f"{prefix}src").option("schema", "n long")
               .option("max_bytes_per_trigger", "2000").load())
        q = (src.select("n").writeStream.format("journal").option("broker", broker)
             .option("journal", f"{prefix}dst").option("checkpointLocation", ckpt)
             .trigger(processingTime="100 milliseconds").start())
        q.processAllAvailable()
        batches = sum(1 for p in q.recentProgress if p["numInputRows"] > 0)
        q.stop()
    return {"batches": batches}


SCENARIOS = {
    "write_and_read": write_and_read,
    "first_attempts_fail": first_attempts_fail,
    "job_fails": job_fails,
    "slow_write": slow_write,
    "speculation": speculation,
    "stream": stream,
}

if __name__ == "__main__":
    main(*sys.argv[1:])
