"""The ``journal`` Python data source of PySpark: batch and streaming, read and write.

Options (all strings, as Spark passes them):

=====================  ==========================================================
``root``               the journal store directory, or
``broker``             a Gazette broker URL (journals on a Gazette cluster); one of the two
``file_root``          with ``broker``: where the cluster's ``file://`` fragment store is
                       mounted on the hosts running tasks (persisted fragments are then
                       read from it directly)
``trusted_ca_file``,   with ``broker``: a secured cluster's TLS and authorizations, as
``cert_file``,         ``GazetteClient`` takes them (files on every host that runs tasks;
``cert_key_file``,     each left out is read from the tasks' ``BROKER_*`` environment)
``auth_keys``
``journal``            one journal, or
``selector``           a label selector (``"app=clicks"``; ``prefix=a/`` matches names)
``schema``             content columns: a DDL string (``"page string, n long"``) or a
                       StructType's JSON; none with ``proto_class`` means all scalars;
                       none at all infers NDJSON fields from the journals' first MiB
``isolation``          ``read_committed`` (default) or ``read_uncommitted``
``splits_per_journal`` tasks per journal (``auto``: one per 64 MiB, at most 8)
``uuid_path``          NDJSON: where the UUID lives (default ``_meta/uuid``)
``proto_class``        fixed protobuf: ``package.module.Class``; ``uuid_field`` its
                       UUID field (default ``uuid``)
``key``, ``mapping``,  writes to a selector: key column, ``modulo`` (default) or
``hash``               ``rendezvous``, ``mmh3`` (default) or ``fnv1a``
``sink_id``            streaming writes: the sink's identity (default: its target)
``starting_offsets``   streaming reads: ``earliest`` (default) or ``latest``
``starting_time``      streaming reads: start at the first fragment written at or
                       after this time (ISO-8601, or seconds since the epoch)
``prune_horizon``      streaming reads: forget producers idle this many seconds
                       (default 86400) relative to a journal's newest
``max_bytes_per_trigger``  streaming reads: at most this many bytes of journal a
                       micro-batch (whole frames, shared by the journals with data)
``content_type``       writes to a journal that does not exist yet create it with
                       this framing: ``ndjson`` (default), ``csv`` or ``proto``
``include_acks``       ``false`` (default): read-committed rows leave out ACK_TXN
                       messages (control records, as Kafka's transaction markers);
                       ``true``: rows are exactly what a Sequencer emits. Read
                       uncommitted returns every frame, ACKs included
=====================  ==========================================================

A content field named like a metadata column (``uuid``, ``begin``, ...) is
the column ``content_<name>`` (see ``content_columns``).
"""

from __future__ import annotations

import datetime
import heapq
import json
import math
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
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

from framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    registered_content_types,
)
from journal import GazetteClient, JournalNotFoundError
from message.arrow import ENVELOPE_FIELDS, ENVELOPE_NAMES, ArrowContent, infer_json_fields

from ._content import META_DDL, proto_content_ddl
from ._scan import READ_COMMITTED, READ_UNCOMMITTED, read_journal
from ._stores import StoreOptions, select_journals
from ._stream import (
    Offset,
    empty_offset,
    encode_states,
    frame_boundary,
    read_range,
    sequence_range,
    states_of,
)
from ._write import (
    PublishedBatch,
    Target,
    abort_job,
    commit_job,
    commit_stream_batch,
    iter_batches,
    publish_rows,
    recover,
    sink_id_of,
    sink_job,
    start_job,
)

SPLIT_BYTES: Final = 64 << 20
MAX_SPLITS: Final = 8


def content_ddl(options: Mapping[str, str]) -> str:
    """The content columns named by the options, as DDL."""
    schema = (options.get("schema") or "").strip()
    if schema.startswith("{"):
        st = StructType.fromJson(json.loads(schema))
        return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in st.fields)
    if not schema and options.get("proto_class"):
        return proto_content_ddl(options["proto_class"], options.get("uuid_field", "uuid"))
    if not schema:
        return _inferred_ddl(options)
    return schema


_INFERRED_TYPES: Final = {
    pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string",
}


def _inferred_ddl(options: Mapping[str, str]) -> str:
    """Content columns inferred, as ``spark.read.json`` would, from the first
    documents of the NDJSON journals read (``message.arrow.infer_json_fields``).
    Empty when nothing can be inferred; name the columns with the ``schema``
    option to be sure."""
    try:
        where = StoreOptions.of(options)
    except ValueError:
        return ""  # the reader reports it
    if where.root is not None and not os.path.isdir(where.root):
        return ""
    path = tuple(p for p in options.get("uuid_path", "_meta/uuid").split("/") if p)
    try:
        with where.open() as store:
            fields = infer_json_fields(store, select_journals(store, options), path)
    except (OSError, ValueError):
        return ""  # inference is a convenience: it never fails a read
    return ", ".join(f"`{name}` {_INFERRED_TYPES[typ]}" for name, typ in fields)


#: The comment of a content column renamed because its field has the name of
#: an envelope column: ``message field uuid`` names the field it holds.
RENAMED_COMMENT: Final = "message field "


def content_columns(ddl: str) -> str:
    """``ddl`` with each content field named like an envelope column
    (``uuid``, ``begin``, ...) renamed ``content_<name>``: the column keeps the
    message's field, whose name its comment says, and Spark never sees two
    columns of one name (its AMBIGUOUS_REFERENCE)."""
    items = _ddl_items(ddl)
    taken = set(ENVELOPE_NAMES) | {name for name, _ in items}
    out = []
    for name, text in items:
        if name not in ENVELOPE_NAMES:
            out.append(text)
            continue
        column = f"content_{name}"
        while column in taken:
            column = f"content_{column}"
        taken.add(column)
        rest = text.strip()[len(_quoted(name)) if text.strip().startswith("`") else len(name):]
        if " comment " in f" {rest.lower()} ":
            raise ValueError(
                f"the content column {name!r} has the name of an envelope column, and a"
                f" comment: name it otherwise in the schema (its field is read as {column!r}"
                " without a comment)"
            )
        out.append(f"{_quoted(column)} {rest.strip()} COMMENT '{RENAMED_COMMENT}{name}'")
    return ", ".join(out)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _ddl_items(ddl: str) -> list[tuple[str, str]]:
    """``(name, text)`` of each top-level column of a DDL string."""
    items: list[tuple[str, str]] = []
    depth, quote, start = 0, "", 0
    for i, ch in enumerate(ddl + ","):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "`'\"":
            quote = ch
        elif ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            text = ddl[start:i]
            start = i + 1
            if text.strip():
                items.append((_ddl_name(text.strip()), text.strip()))
    return items


def _ddl_name(item: str) -> str:
    if item.startswith("`"):
        name, i = [], 1
        while i < len(item):
            if item[i] == "`":
                if item[i + 1 : i + 2] == "`":
                    name.append("`")
                    i += 2
                    continue
                break
            name.append(item[i])
            i += 1
        return "".join(name)
    return item.replace(":", " ").split()[0]


def content_spec(options: Mapping[str, str], schema: StructType) -> ArrowContent:
    """The ArrowContent of the content columns of ``schema`` (those after the
    metadata columns): each holds the message field of its name, or the one
    its comment names (see ``content_columns``)."""
    fields = schema.fields[len(ENVELOPE_FIELDS) :]
    arrow = to_arrow_schema(StructType(fields), timezone="UTC") if fields else pa.schema([])
    path = tuple(p for p in options.get("uuid_path", "_meta/uuid").split("/") if p)
    if not path:
        raise ValueError("uuid_path must name at least one key")
    return ArrowContent(
        tuple((_field_of(f), a.type) for f, a in zip(fields, arrow, strict=True)),
        uuid_path=path,
        proto_class=options.get("proto_class") or None,
        uuid_field=options.get("uuid_field", "uuid"),
    )


def _field_of(column: Any) -> str:
    comment = (column.metadata or {}).get("comment", "")
    if comment.startswith(RENAMED_COMMENT) and comment[len(RENAMED_COMMENT) :] in ENVELOPE_NAMES:
        return str(comment[len(RENAMED_COMMENT) :])
    return str(column.name)


def _positive_option(options: Mapping[str, str], name: str, what: str) -> int | None:
    """Option ``name`` as a whole number of at least 1, or None if not given;
    ``what`` says what it counts, in the error for any other value."""
    value = options.get(name)
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name} must be {what}, not {value!r}")
    return n


def _starting_time(options: Mapping[str, str]) -> float | None:
    """The option ``starting_time`` as seconds since the epoch (None if not given)."""
    text = options.get("starting_time")
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"starting_time must be an ISO-8601 time or seconds since the epoch, not {text!r}"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return float(t.timestamp())


def _max_bytes_per_trigger(options: Mapping[str, str]) -> int | None:
    return _positive_option(options, "max_bytes_per_trigger", "a positive number of bytes")


def _include_acks(options: Mapping[str, str]) -> bool:
    value = options.get("include_acks", "false").lower()
    if value not in ("true", "false"):
        raise ValueError(f"include_acks must be true or false, not {value!r}")
    return value == "true"


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly the columns and types Spark expects. Columns go
    by position: the metadata columns, then the content columns, whose names
    may differ from their fields' (``content_columns``)."""
    if batch.schema == schema:
        return batch
    cols = []
    for i, f in enumerate(schema):
        col = batch.column(i)
        cols.append(col if col.type == f.type else col.cast(f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


class JournalDataSource(DataSource):
    """``spark.read.format("journal")`` / ``df.write.format("journal")``."""

    #: The default parallelism of the session the source is registered with
    #: (see ``for_session``), or None: an ``auto``-split read of journals
    #: smaller than a split packs them into about that many tasks.
    parallelism: ClassVar[int | None] = None

    @classmethod
    def name(cls) -> str:
        return "journal"

    @classmethod
    def for_session(cls, parallelism: int) -> type[JournalDataSource]:
        """The source as registered with a session of ``parallelism`` cores
        (``pipeline.register``): a class of its own, which Spark pickles by
        value, so that its planner, in a Python process of its own, knows it."""
        attrs = {"parallelism": max(1, parallelism), "__module__": cls.__module__,
                 "__qualname__": f"{cls.__qualname__}.for_session.<locals>.{cls.__name__}"}
        return type(cls.__name__, (cls,), attrs)

    def schema(self) -> str:
        _max_bytes_per_trigger(self.options)  # a bad value fails load(), not a query later
        _starting_time(self.options)
        ddl = content_columns(content_ddl(self.options))
        return f"{META_DDL}, {ddl}" if ddl else META_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return SparkBatchReader(dict(self.options), schema, self.parallelism)

    def writer(self, schema: StructType, overwrite: bool) -> SparkBatchWriter:
        return SparkBatchWriter(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 -- Spark's name
        return SparkStreamReader(dict(self.options), schema)

    def streamWriter(  # noqa: N802 -- Spark's name
        self, schema: StructType, overwrite: bool
    ) -> SparkStreamWriter:
        return SparkStreamWriter(dict(self.options), schema)


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
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        # ACKs are control records of read committed; read uncommitted is every frame.
        self.acks = _include_acks(options) or self.isolation == READ_UNCOMMITTED
        with self.where.open() as store:
            recover(store)

    def partitions(self) -> Sequence[InputPartition]:
        splits = self.options.get("splits_per_journal", "auto")
        out: list[_Split] = []
        with self.where.open() as store:
            for spec in select_journals(store, self.options):
                end = store.head(spec.name)
                n = (
                    min(MAX_SPLITS, max(1, math.ceil(end / SPLIT_BYTES)))
                    if splits == "auto" else max(1, int(splits))
                )
                out += [_Split(spec.name, end, b, n) for b in range(n)]
        tasks = self.parallelism
        if (splits == "auto" and tasks is not None and len(out) > tasks
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
                include_acks=self.acks,
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
        uuid_path=tuple(p for p in options.get("uuid_path", "_meta/uuid").split("/") if p),
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
            if isinstance(store, GazetteClient) and replication is not None:
                store.create(journal, {"content-type": ct}, replication=replication)
            else:
                store.create(journal, {"content-type": ct})


def _replication(options: Mapping[str, str], where: StoreOptions) -> int | None:
    if options.get("replication") is not None and where.broker is None:
        raise ValueError("the option replication is for journals a write creates on a Gazette"
                         " cluster (option broker); the embedded store keeps one copy")
    return _positive_option(options, "replication", "a whole number of brokers, at least 1")


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
            self.target.content_type(store)  # fail on the driver, before any task runs
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
        if options.get("isolation", READ_COMMITTED).lower() != READ_COMMITTED:
            raise ValueError("streaming reads are read_committed")
        self.max_bytes = _max_bytes_per_trigger(options)
        self.starting_time = _starting_time(options)
        # Trigger.AvailableNow: the write heads when the query started.
        self.targets: dict[str, int] | None = None
        self.planned: dict[str, int] = {}  # the end offsets of the last planned micro-batch
        with self.where.open() as store:
            recover(store)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 -- Spark's name
        with self.where.open() as store:
            self.targets = {
                spec.name: store.head(spec.name) for spec in select_journals(store, self.options)
            }

    def reportLatestOffset(self) -> dict[str, Any]:  # noqa: N802 -- Spark's name
        with self.where.open() as store:
            heads = {spec.name: store.head(spec.name)
                     for spec in select_journals(store, self.options)}
        behind = sum(max(0, h - int(self.planned.get(name, 0))) for name, h in heads.items())
        return {"offsets": heads, "bytes_behind": behind}

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 -- Spark's name
        if self.max_bytes is None:
            return ReadAllAvailable()
        return ReadMaxBytes(self.max_bytes)

    def initialOffset(self) -> Offset:  # noqa: N802 -- Spark's name
        offset = empty_offset()
        if self.starting_time is not None:
            # Fragment times: the embedded store's files, Gazette's begin_mod_time.
            with self.where.open() as store:
                for spec in select_journals(store, self.options):
                    offset["offsets"][spec.name] = store.offset_since(
                        spec.name, self.starting_time
                    )
        elif self.options.get("starting_offsets", "earliest") == "latest":
            with self.where.open() as store:
                for spec in select_journals(store, self.options):
                    offset["offsets"][spec.name] = store.head(spec.name)
        return offset

    def latestOffset(  # noqa: N802 -- Spark's name
        self, start: Offset | None = None, limit: Any = None
    ) -> Offset:
        start = start or self.initialOffset()
        out: Offset = {"offsets": dict(start["offsets"]), "states": dict(start["states"])}
        # ReadMaxBytes: the budget is shared equally by the journals with new
        # data, each cut at a frame boundary (and taking at least one frame).
        budget = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        with self.where.open() as store:
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
                    prune_horizon=self.prune_horizon,
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
                include_acks=self.acks,
            ):
                yield _conform(batch, self.arrow_schema)


class SparkStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("journal")``: each micro-batch committed once."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        _create_target_journal(options)
        self.target = _target(options, schema)
        self.sink_id = options.get("sink_id") or sink_id_of(self.target)
        self.job = sink_job(self.sink_id)
        with self.target.options.open() as store:
            recover(store)
            start_job(store, self.job)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Published:
        return _Published(publish_rows(self.target, iter_batches(iterator), job=self.job))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        with self.target.options.open() as store:
            commit_stream_batch(store, self.sink_id, batchId, _batches(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        with self.target.options.open() as store:
            abort_job(store, _batches(messages), self.job, keep=True)
