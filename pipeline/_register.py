"""Registering the data source, and a local SparkSession set up for it."""

from __future__ import annotations

import gc
import logging
import os
import sys
import warnings
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger("pipeline")


def register(spark: SparkSession) -> None:
    """Register the ``journal`` data source with ``spark`` (knowing its
    default parallelism, by which a read of small journals plans its tasks)."""
    from ._source import JournalDataSource

    spark.dataSource.register(
        JournalDataSource.for_session(spark.sparkContext.defaultParallelism))


def local_session(
    master: str = "local[2]", *, app: str = "exactly", conf: dict[str, Any] | None = None
) -> SparkSession:
    """A local SparkSession whose Python workers run this interpreter (the one
    with this package installed), with the ``journal`` source registered."""
    return cluster_session(master, app=app, conf=conf,
                           driver_host="127.0.0.1" if master.startswith("local") else None)


def cluster_session(
    master: str,
    *,
    app: str = "exactly",
    conf: dict[str, Any] | None = None,
    driver_host: str | None = None,
) -> SparkSession:
    """A SparkSession on ``master`` (``spark://host:port`` for a standalone
    cluster, or ``local[N]``) with the ``journal`` source registered. Its
    Python workers, on the driver and on every executor, run this
    interpreter's path: the executors' hosts need this package installed in
    the same place. ``driver_host``: the address executors reach the driver
    at (Spark's choice when None)."""
    # Workers are started by the JVM: without this they would run whichever
    # ``python3`` is first on PATH, which may lack this package.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if driver_host == "127.0.0.1":
        # Everything is on this machine: bind to loopback rather than warn
        # about which interface the host name resolves to.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .config("spark.pyspark.python", sys.executable)
    )
    if driver_host is not None:
        builder = builder.config("spark.driver.host", driver_host).config(
            "spark.driver.bindAddress", driver_host)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    with warnings.catch_warnings():
        # PySpark 4 warns at start-up that it was not validated with pandas 3;
        # nothing here goes through pandas.
        warnings.filterwarnings(
            "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
        )
        spark = _get_or_create(builder)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


#: Start-ups of the JVM tried before its failure is the caller's.
_GATEWAY_ATTEMPTS = 3


def _get_or_create(builder: SparkSession.Builder) -> SparkSession:
    """``builder.getOrCreate()``, starting the JVM again if it died before it
    answered. PySpark starts it with a ``preexec_fn``, so the forked child
    runs the parent's fork handlers before it execs; gRPC's (in a process
    that has used a ``GazetteClient``) abort that child now and then (about
    one start in 150, measured), which PySpark reports as
    ``JAVA_GATEWAY_EXITED``. Any other failure, or the same one again and
    again, is raised."""
    from pyspark.errors import PySparkRuntimeError

    attempt = 1
    while True:
        try:
            return builder.getOrCreate()
        except PySparkRuntimeError as err:
            if err.getCondition() != "JAVA_GATEWAY_EXITED" or attempt >= _GATEWAY_ATTEMPTS:
                raise
            failed = [err]
        # PySpark leaves the dead launcher's pipes open; its traceback holds
        # them. Let them go here, quietly, rather than as a ResourceWarning
        # wherever the garbage collector happens to run next.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            failed.clear()
            gc.collect()
        log.warning("the Spark JVM exited while starting (attempt %d of %d); starting it again",
                    attempt, _GATEWAY_ATTEMPTS)
        attempt += 1
