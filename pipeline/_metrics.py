"""Streaming queries of the ``journal`` source and sink, in ``journal.metrics``.

The source's and the sink's own methods run in Spark's Python workers, not
in the process that a Prometheus server scrapes; what Spark learns of each
micro-batch reaches the driver's process as a ``StreamingQueryProgress``.
``StreamingMetrics`` listens to those and records them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from journal import metrics


class StreamingMetrics(StreamingQueryListener):
    """Records each micro-batch's rows read from ``journal`` sources and
    written to a ``journal`` sink, and how many bytes the sources are behind
    their write heads (``exactly_spark_*``, labelled by query name, or id).
    Spark describes every sink written by a Python data source alike: the
    rows of such a sink count as written to a journal.

    ::

        from journal import metrics
        metrics.start_http_server(9464)
        spark.streams.addListener(pipeline.StreamingMetrics())
    """

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 -- Spark's name
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 -- Spark's name
        if not metrics.enabled():
            return
        progress = event.progress
        read, behind, ours = 0, None, False
        for source in progress.sources:
            latest = _offset(source.latestOffset)
            if latest is None or "bytes_behind" not in latest:
                continue  # another kind of source
            ours = True
            read += max(0, int(source.numInputRows))
            behind = (behind or 0) + int(latest["bytes_behind"])
        sink = progress.sink
        written = 0
        if sink is not None and _is_journal_sink(sink.description):
            ours = True
            written = max(0, int(sink.numOutputRows))
        if ours:
            metrics.record_spark_progress(progress.name or str(progress.id), read, written, behind)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 -- Spark's name
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 -- Spark's name
        pass


def _offset(value: Any) -> Mapping[str, Any] | None:
    """A source's reported offset, parsed (Spark hands it over as JSON text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, Mapping) else None


def _is_journal_sink(description: str | None) -> bool:
    """Spark describes every Python data source's sink alike (a
    ``PythonTable``): a query writing to another Python data source is
    counted too."""
    return ".python.PythonTable@" in str(description)
