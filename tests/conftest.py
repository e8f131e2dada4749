"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run (starting one takes seconds),
    with the ``journal`` data source registered. ``local[2,4]``: two cores,
    and a failed task is retried up to three times, which the exactly-once
    write tests rely on."""
    pytest.importorskip("pyspark")
    import pipeline

    session = pipeline.local_session("local[2,4]", conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
