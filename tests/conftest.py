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


@pytest.fixture(params=["c", "python"])
def read_loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the read iterators' C loops (message/_speedups.c),
    then with the pure Python ones: both must behave the same."""
    import message._reader as reader

    if request.param == "python":
        monkeypatch.setattr(reader, "SPEEDUPS", None)
    elif reader.SPEEDUPS is None:
        pytest.skip("message._speedups is not built here")
    return str(request.param)
