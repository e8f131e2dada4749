"""Batch reads and writes of the ``journal`` data source: reads split by
journal and producer bucket, writes committed by the driver."""

from __future__ import annotations

import heapq
import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    registered_content_types,
)
from journal import GazetteClient, JournalNotFoundError
from message.arrow import ArrowContent

from ._options import (
    MAX_SPLITS,
    SPLIT_BYTES,
    _conform,
    _include_acks,
    _skip_corrupt,
    content_spec,
    uuid_path_option,
)
from ._recover import recover
from ._scan import READ_COMMITTED, READ_UNCOMMITTED, read_journal
from ._stores import StoreOptions, select_journals
from ._values import given, positive_option
from ._write import (
    PublishedBatch,
    Target,
    abort_job,
    commit_job,
    iter_batches,
    publish_rows,
    start_job,
)

# -- batch read ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Split(InputPartition):
    """A task of a batch read: one producer bucket of a journal, up to ``end``."""

    journal: str
    end: int
    bucket: int
    buckets: int

    @property
    def weight(self) -> float:
        return self.end / self.buckets


@dataclass(frozen=True)
class _Splits(InputPartition):
    """A task of a batch read that reads several splits, one after another."""

    splits: tuple[_Split, ...]


def _splits_per_journal(options: Mapping[str, str]) -> int | None:
    """The option ``splits_per_journal``: a number of tasks, or None for
    ``auto`` (the default: one per 64 MiB, at most 8)."""
    if options.get("splits_per_journal", "auto").strip().lower() == "auto":
        return None
    return positive_option(options, "splits_per_journal", "auto or a whole number of tasks")


def _pack(splits: list[_Split], tasks: int) -> list[_Splits]:
    """``splits`` in ``tasks`` tasks of about equal bytes (the largest first,
    each to the task with the fewest bytes so far), each task's in order."""
    bins: list[tuple[float, int]] = [(0.0, i) for i in range(tasks)]
    members: list[list[_Split]] = [[] for _ in range(tasks)]
    for split in sorted(splits, key=lambda s: s.weight, reverse=True):
        load, i = heapq.heappop(bins)
        members[i].append(split)
        heapq.heappush(bins, (load + split.weight, i))
    return [_Splits(tuple(sorted(m, key=lambda s: (s.journal, s.bucket)))) for m in members if m]


class SparkBatchReader(DataSourceReader):
    """``spark.read.format("journal")``: plans splits on the driver, reads them in tasks."""

    def __init__(
        self, options: dict[str, str], schema: StructType, parallelism: int | None = None
    ) -> None:
        self.options = options
        self.parallelism = parallelism
        self.where = StoreOptions.of(options)
        self.isolation = options.get("isolation", READ_COMMITTED).lower()
        if self.isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
            raise ValueError(f"isolation must be {READ_COMMITTED} or {READ_UNCOMMITTED}")
        self.content = content_spec(options, schema)
        _splits_per_journal(options)  # a bad value fails here, not in partitions()
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        # ACKs are control records of read committed; read uncommitted is every frame.
        self.acks = _include_acks(options) or self.isolation == READ_UNCOMMITTED
        self.skip_corrupt = _skip_corrupt(options)
        with self.where.open() as store:
            recover(store)

    def partitions(self) -> Sequence[InputPartition]:
        splits = _splits_per_journal(self.options)
        out: list[_Split] = []
        with self.where.open() as store:
            for spec in select_journals(store, self.options):
                end = store.head(spec.name)
                n = (
                    min(MAX_SPLITS, max(1, math.ceil(end / SPLIT_BYTES)))
                    if splits is None else splits
                )
                out += [_Split(spec.name, end, b, n) for b in range(n)]
        tasks = self.parallelism
        if (splits is None and tasks is not None and len(out) > tasks
                and sum(s.weight for s in out) < tasks * SPLIT_BYTES):
            # Small journals: one wave of tasks, one a core, as Spark's file
            # sources pack small files (a Python task costs more to start).
            return _pack(out, tasks)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _Splits):
            for split in partition.splits:
                yield from self.read(split)
            return
        if not isinstance(partition, _Split):
            return  # no journal matched: Spark still runs one (empty) partition
        with self.where.open() as store:
            for batch in read_journal(
                store, partition.journal, self.content, end_offset=partition.end,
                isolation=self.isolation, bucket=partition.bucket, buckets=partition.buckets,
                include_acks=self.acks, skip_corrupt=self.skip_corrupt,
            ):
                yield _conform(batch, self.arrow_schema)


# -- batch write --------------------------------------------------------------------


@dataclass
class _Published(WriterCommitMessage):
    batch: PublishedBatch


def _target(options: Mapping[str, str], schema: StructType) -> Target:
    fields = list(schema.fields)
    arrow = to_arrow_schema(StructType(fields), timezone="UTC") if fields else pa.schema([])
    content = ArrowContent(
        tuple((f.name, f.type) for f in arrow),
        uuid_path=uuid_path_option(options),
        proto_class=options.get("proto_class") or None,
        uuid_field=options.get("uuid_field", "uuid"),
    )
    return Target(
        StoreOptions.of(options), options.get("journal"), options.get("selector"),
        options.get("key"), options.get("mapping", "modulo"), options.get("hash", "mmh3"),
        content,
    )


def _create_target_journal(options: Mapping[str, str]) -> None:
    """A write to one named journal creates the store and the journal if
    they do not exist yet (NDJSON unless ``content_type`` says otherwise),
    as a Spark write to a new path creates it, on a Gazette cluster with
    ``replication`` brokers holding it (the client's default, 3, unless the
    option says otherwise). A selector names journals that must exist: their
    partitioning is the user's to decide."""
    journal = options.get("journal")
    where = StoreOptions.of(options)
    replication = _replication(options, where)
    if not journal or options.get("selector") is not None:
        return
    with where.open(create=True) as store:
        try:
            store.get(journal)
        except JournalNotFoundError:
            ct = options.get("content_type") or CONTENT_TYPE_JSON_LINES
            ct = _CONTENT_TYPES.get(ct, ct)
            if ct not in registered_content_types():
                raise ValueError(
                    f"content_type {options.get('content_type')!r}: no framing writes it;"
                    f" use ndjson, csv or proto"
                ) from None
            if ct == CONTENT_TYPE_PROTO_FIXED and not options.get("proto_class"):
                raise ValueError("a protobuf journal is written with the option proto_class"
                                 " (package.module.Class): none is given") from None
            if isinstance(store, GazetteClient) and replication is not None:
                store.create(journal, {"content-type": ct}, replication=replication)
            else:
                store.create(journal, {"content-type": ct})


def _replication(options: Mapping[str, str], where: StoreOptions) -> int | None:
    if given(options, "replication") and where.broker is None:
        raise ValueError("the option replication is for journals a write creates on a Gazette"
                         " cluster (option broker); the embedded store keeps one copy")
    return where.replication


_CONTENT_TYPES: Final = {
    "ndjson": CONTENT_TYPE_JSON_LINES,
    "json": CONTENT_TYPE_JSON_LINES,
    "csv": CONTENT_TYPE_CSV,
    "proto": CONTENT_TYPE_PROTO_FIXED,
}


class SparkBatchWriter(DataSourceArrowWriter):
    """``df.write.format("journal")``: tasks publish uncommitted, the driver commits."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        _create_target_journal(options)
        self.target = _target(options, schema)
        self.job = uuid.uuid4().hex  # where attempts record their roll-backs
        with self.target.options.open() as store:
            recover(store)
            self.target.check(store)  # fail on the driver, before any task runs
            start_job(store, self.job)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Published:
        return _Published(publish_rows(self.target, iter_batches(iterator), job=self.job))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.target.options.open() as store:
            commit_job(store, _batches(messages), self.job)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with self.target.options.open() as store:
            abort_job(store, _batches(messages), self.job)


def _batches(messages: list[Any]) -> list[PublishedBatch | None]:
    return [m.batch if isinstance(m, _Published) else None for m in messages]
