"""The read side: the latest committed message per key, as a table.

Event sourcing keeps changes; readers want state. ``materialize_latest``
folds a DataFrame of committed messages (``spark.read.format("journal")``)
into one row per key — the last one committed — and drops keys whose last
message is a delete: a message with empty content (every content column
null, as gossip's empty data), or one matching a ``tombstone`` condition.
It is the compaction gossip describes, computed on the read side.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 -- the usual PySpark alias

from message.arrow import ENVELOPE_NAMES

#: Rows of one journal in the order a Sequencer commits them.
COMMIT_ORDER: tuple[str, ...] = ("commit_offset", "begin")


def latest_by_key(
    df: DataFrame,
    key: str | Sequence[str],
    *,
    order_by: Sequence[str] = COMMIT_ORDER,
    tombstone: str | Column | None = None,
) -> DataFrame:
    """One row per key: its last message in ``order_by`` order, unless that is
    a delete. A key's messages are expected in one journal (as a Publisher's
    key mapping puts them); ``order_by`` may name other columns (``clock``)."""
    keys = [key] if isinstance(key, str) else list(key)
    missing = [c for c in [*keys, *order_by] if c not in df.columns]
    if missing:
        raise ValueError(f"columns {missing} are not in the DataFrame ({df.columns})")
    others = [c for c in df.columns if c not in keys]
    content = [c for c in others if c not in ENVELOPE_NAMES]
    marker = "__deleted"
    deleted = (
        F.lit(True) if not content
        else ~F.greatest(*[F.col(c).isNotNull() for c in content]) if len(content) > 1
        else F.col(content[0]).isNull()
    )
    if tombstone is not None:
        cond = F.expr(tombstone) if isinstance(tombstone, str) else tombstone
        deleted = deleted | F.coalesce(cond.cast("boolean"), F.lit(False))
    latest = (
        df.withColumn(marker, deleted)
        .groupBy(*keys)
        .agg(
            F.max_by(
                F.struct(*[F.col(c) for c in [*others, marker]]),
                F.struct(*[F.col(c) for c in order_by]),
            ).alias("__latest")
        )
    )
    return (
        latest.where(~F.col(f"__latest.{marker}"))
        .select(*keys, *[F.col(f"__latest.`{c}`").alias(c) for c in others])
    )


def materialize_latest(
    df: DataFrame,
    key: str | Sequence[str],
    path: str,
    *,
    order_by: Sequence[str] = COMMIT_ORDER,
    tombstone: str | Column | None = None,
    mode: str = "overwrite",
) -> DataFrame:
    """Write :func:`latest_by_key` of ``df`` as Parquet at ``path``; return it, read back."""
    latest_by_key(df, key, order_by=order_by, tombstone=tombstone).write.mode(mode).parquet(path)
    return df.sparkSession.read.parquet(path)
