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
``connect_timeout``,   with ``broker``: the tasks' clients wait this many seconds for
``retry_timeout``,     the first answer of a broker, retry a failing cluster this long,
``auth_token_ttl``     and sign tokens for this long (``GazetteClient``'s defaults: 5,
                       60, 3600)
``direct_reads``       with ``broker``: ``true`` (default) reads persisted fragments
                       from their store's signed URLs, ``false`` through the brokers
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
``sink_id``            streaming writes: the sink's identity (default: its target and query)
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
``skip_corrupt``       ``true``: frames that do not decode, and damaged pieces of a
                       journal, are skipped (a warning in the task's log) instead
                       of failing the read; ``false`` (default)
=====================  ==========================================================

A content field named like a metadata column (``uuid``, ``begin``, ...) is
the column ``content_<name>`` (see ``content_columns``).
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
)
from pyspark.sql.types import StructType

from message.arrow import ENVELOPE_FIELDS

from ._batch import SparkBatchReader, SparkBatchWriter
from ._content import META_DDL
from ._options import _max_bytes_per_trigger, _starting_time, content_columns, content_ddl
from ._streaming import SparkStreamReader, SparkStreamWriter


def _check_schema(schema: StructType) -> None:
    """A schema given with ``spark.read.schema(...)`` must begin with the
    envelope columns every row has (as ``schema()`` says them); content
    columns alone are ``.option("schema", ...)``'s."""
    envelope = [name for name, _ in ENVELOPE_FIELDS]
    given = [f.name for f in schema.fields][: len(envelope)]
    if given != envelope:
        raise ValueError(
            "the journal source's rows begin with the columns " + ", ".join(envelope)
            + f" (then the content's), not {', '.join(f.name for f in schema.fields) or 'none'}:"
            " name the content columns with .option(\"schema\", \"n long, ...\"),"
            " not with .schema()"
        )


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
        _check_schema(schema)
        return SparkBatchReader(dict(self.options), schema, self.parallelism)

    def writer(self, schema: StructType, overwrite: bool) -> SparkBatchWriter:
        if overwrite:
            raise ValueError(
                "journals are append-only: write with .mode(\"append\"); mode"
                " \"overwrite\" would replace nothing (to keep only the latest row of"
                " each key, see pipeline.materialize_latest)"
            )
        return SparkBatchWriter(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 -- Spark's name
        _check_schema(schema)
        return SparkStreamReader(dict(self.options), schema)

    def streamWriter(  # noqa: N802 -- Spark's name
        self, schema: StructType, overwrite: bool
    ) -> SparkStreamWriter:
        return SparkStreamWriter(dict(self.options), schema)
