"""The PySpark ``journal`` data source and the pipeline jobs.

::

    import pipeline
    pipeline.register(spark)
    clicks = (spark.read.format("journal")
              .option("root", "store").option("selector", "app=clicks")
              .option("schema", "page string, session string")
              .load())                                   # committed messages only
    clicks.groupBy("page").count().show()
    pipeline.materialize_latest(clicks, "session", "out/sessions")

    (clicks.where("page = '/buy'")
     .write.format("journal").option("root", "store").option("journal", "sales")
     .mode("append").save())                             # exactly once

See docs/spark.md for every option, the streaming source and sink, and how
reads are split and writes committed.
"""

from ._errors import JobEndedError as JobEndedError
from ._errors import PipelineError as PipelineError
from ._latest import COMMIT_ORDER as COMMIT_ORDER
from ._latest import latest_by_key as latest_by_key
from ._latest import materialize_latest as materialize_latest
from ._metrics import StreamingMetrics as StreamingMetrics
from ._recover import recover as recover
from ._register import cluster_session as cluster_session
from ._register import local_session as local_session
from ._register import register as register
from ._source import JournalDataSource as JournalDataSource
from ._stores import StoreOptions as StoreOptions
from ._stream_offsets import committed_position as committed_position

__all__ = [
    "register", "local_session", "cluster_session", "JournalDataSource", "StoreOptions", "recover",
    "latest_by_key", "materialize_latest", "COMMIT_ORDER", "committed_position",
    "StreamingMetrics", "PipelineError", "JobEndedError",
]
