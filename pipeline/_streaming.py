"""Streaming reads and writes of the ``journal`` data source: micro-batches
of committed messages, and a sink that commits each micro-batch once."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ._batch import _batches, _create_target_journal, _Published, _target
from ._options import (
    _conform,
    _include_acks,
    _max_bytes_per_trigger,
    _skip_corrupt,
    _starting_time,
    content_spec,
)
from ._recover import recover
from ._scan import READ_COMMITTED
from ._sink import commit_stream_batch, query_of, sink_id_of, sink_job
from ._stores import StoreOptions, select_journals
from ._stream_offsets import (
    Offset,
    empty_offset,
    encode_states,
    frame_boundary,
    read_range,
    sequence_range,
    states_of,
)
from ._write import (
    abort_job,
    iter_batches,
    publish_rows,
    start_job,
)

# -- streaming ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Range(InputPartition):
    """A task of a micro-batch: ``[start, end)`` of a journal, from ``states``."""

    journal: str
    start: int
    end: int
    states: str  # JSON of {producer: "last_ack:begin"}


class SparkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("journal")``: micro-batches of committed messages.

    With ``Trigger.AvailableNow`` the query reads what its journals held when
    it started (their write heads then: ``prepareForTriggerAvailableNow``),
    in micro-batches bounded by ``max_bytes_per_trigger``, and stops.
    ``reportLatestOffset`` gives Spark's progress reports the write heads
    and the bytes between them and the last planned micro-batch."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.where = StoreOptions.of(options)
        self.content = content_spec(options, schema)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.prune_horizon = float(options.get("prune_horizon", "86400"))
        self.acks = _include_acks(options)
        self.skip_corrupt = _skip_corrupt(options)
        # Said at the query's first offset rather than here: an error raised
        # while Spark makes the reader reaches the user as one of PySpark's own.
        self.refused: str | None = None
        if options.get("isolation", READ_COMMITTED).lower() != READ_COMMITTED:
            self.refused = ("streaming reads are read_committed: the option isolation="
                            f"{options['isolation']} is for batch reads (spark.read)")
        self.max_bytes = _max_bytes_per_trigger(options)
        self.starting_time = _starting_time(options)
        # Trigger.AvailableNow: the write heads when the query started.
        self.targets: dict[str, int] | None = None
        self.planned: dict[str, int] = {}  # the end offsets of the last planned micro-batch
        # The store the driver's calls share (planning, progress), opened on
        # first use and never pickled to the executors, which open their own.
        self._store: Any = None
        recover(self._driver_store())

    def _driver_store(self) -> Any:
        if self._store is None:
            self._store = self.where.open()
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None
        return state

    def stop(self) -> None:
        """The query stopped: close the driver's store."""
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 -- Spark's name
        store = self._driver_store()
        self.targets = {
            spec.name: store.head(spec.name) for spec in select_journals(store, self.options)
        }

    def reportLatestOffset(self) -> dict[str, Any]:  # noqa: N802 -- Spark's name
        store = self._driver_store()
        heads = {spec.name: store.head(spec.name) for spec in select_journals(store, self.options)}
        behind = sum(max(0, h - int(self.planned.get(name, 0))) for name, h in heads.items())
        return {"offsets": heads, "bytes_behind": behind}

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 -- Spark's name
        if self.max_bytes is None:
            return ReadAllAvailable()
        return ReadMaxBytes(self.max_bytes)

    def initialOffset(self) -> Offset:  # noqa: N802 -- Spark's name
        if self.refused is not None:
            raise ValueError(self.refused)
        offset = empty_offset()
        if self.starting_time is not None:
            # Fragment times: the embedded store's files, Gazette's begin_mod_time.
            store = self._driver_store()
            for spec in select_journals(store, self.options):
                offset["offsets"][spec.name] = store.offset_since(spec.name, self.starting_time)
        elif self.options.get("starting_offsets", "earliest") == "latest":
            store = self._driver_store()
            for spec in select_journals(store, self.options):
                offset["offsets"][spec.name] = store.head(spec.name)
        return offset

    def latestOffset(  # noqa: N802 -- Spark's name
        self, start: Offset | None = None, limit: Any = None
    ) -> Offset:
        if self.refused is not None:
            raise ValueError(self.refused)
        start = start or self.initialOffset()
        out: Offset = {"offsets": dict(start["offsets"]), "states": dict(start["states"])}
        # ReadMaxBytes: the budget is shared equally by the journals with new
        # data, each cut at a frame boundary (and taking at least one frame).
        budget = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        store = self._driver_store()
        ranges = []
        for spec in select_journals(store, self.options):
            begin = int(start["offsets"].get(spec.name, 0))
            end = store.head(spec.name)
            if self.targets is not None:
                # AvailableNow: nothing past the heads when the query began
                # (a journal that joined since has none).
                end = min(end, self.targets.get(spec.name, begin))
            if end > begin:
                ranges.append((spec.name, begin, end))
        for name, begin, end in ranges:
            if budget is not None:
                end = frame_boundary(store, name, begin, end, max(1, budget // len(ranges)))
            states = sequence_range(
                store, name, self.content, begin, end, states_of(start, name),
                prune_horizon=self.prune_horizon, skip_corrupt=self.skip_corrupt,
            )
            out["offsets"][name] = end
            out["states"][name] = encode_states(states)
        self.planned = {name: int(at) for name, at in out["offsets"].items()}
        return out

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for name, stop in sorted(end["offsets"].items()):
            begin = int(start["offsets"].get(name, 0))
            if int(stop) > begin:
                states = json.dumps(start.get("states", {}).get(name, {}))
                out.append(_Range(name, begin, int(stop), states))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, _Range):
            return
        offset = {"states": {partition.journal: json.loads(partition.states)}}
        states = states_of(offset, partition.journal)
        with self.where.open() as store:
            for batch in read_range(
                store, partition.journal, self.content, partition.start, partition.end, states,
                include_acks=self.acks, skip_corrupt=self.skip_corrupt,
            ):
                yield _conform(batch, self.arrow_schema)


class SparkStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("journal")``: each micro-batch committed once."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        _create_target_journal(options)
        self.target = _target(options, schema)
        query = query_of(options)
        self.sink_id = options.get("sink_id") or sink_id_of(self.target, query)
        # Given its own identity, or a query a restart resumes: replays are
        # told by their batch ID.
        self.resumable = bool(options.get("sink_id")) or query is not None
        self.job = sink_job(self.sink_id)
        with self.target.options.open() as store:
            recover(store)
            self.target.check(store)  # fail on the driver, before any task runs
            start_job(store, self.job)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Published:
        return _Published(publish_rows(self.target, iter_batches(iterator), job=self.job))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        with self.target.options.open() as store:
            commit_stream_batch(store, self.sink_id, batchId, _batches(messages),
                                resumable=self.resumable)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        with self.target.options.open() as store:
            abort_job(store, _batches(messages), self.job, keep=True)
