"""The Spark benchmark still runs (at a tiny scale) on the shared session."""

from __future__ import annotations

from typing import Any

import pytest

from exactly.benchmarks import bench_spark
from exactly.benchmarks._harness import format_table


@pytest.mark.spark
def test_spark_benchmark_runs_at_small_scale(spark: Any) -> None:
    """run(0.01) reads exactly the committed rows (from the journals, and as
    the replayed Arrow batches) and reports positive rates."""
    results = bench_spark.run(0.01)  # raises if the committed count is wrong
    rates = [r for r in results if r.unit == "rows/s"]
    assert [r.name.split(" vs ")[0] for r in rates] == [
        "spark: read committed", "spark: Arrow hand-off alone (same batches, from memory)",
        "spark: json + dropDuplicates(uuid)"]
    assert all(r.value > 0 and (r.baseline or 0) > 0 for r in rates)
    wrong = next(r for r in results if "keeps uncommitted rows" in r.name)
    assert wrong.value > 0  # the workload has aborted transactions the naive way keeps
    assert format_table(results).count("\n") == len(results) + 1


@pytest.mark.spark
def test_spark_broker_benchmark_runs_at_small_scale(spark: Any, gazette_binaries: Any) -> None:
    """The Spark-on-brokers rows run (their own cluster, the shared session)."""
    from exactly.benchmarks import bench_spark_broker

    results = bench_spark_broker.run(0.01)
    assert [r.name.split(" vs ")[0] for r in results] == [
        "spark: read committed through brokers", "spark: exactly-once write through brokers",
        "spark: same, journal of replication 1", "spark: Arrow hand-off to Python alone"]
    assert all(r.value > 0 and (r.baseline or 0) > 0 for r in results)
