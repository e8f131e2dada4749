"""Spark: the ``journal`` source's read-committed throughput against Spark's
own JSON reader over the same fragment files.

Traffic: 400k clicks at scale 1 (about 100 bytes each) in four NDJSON
journals, published committed by several producers, plus transactions (one
in five aborted) and re-appended frames. The journals are sealed, so their
content is exactly the Gazette-named ``.raw`` fragment files that
``spark.read.json`` is given, with the same schema.

- ``read committed / spark.read.json``: rows/s of the journal source
  (duplicates dropped, transactions sequenced) over rows/s of Spark parsing
  the same files. Both are written to the ``noop`` sink, so all rows are
  materialised and decoded.
- ``dropDuplicates(uuid)``: the naive exactly-once attempt, for comparison;
  its row count is wrong by the aborted transactions' messages (reported).
- ``Arrow hand-off alone``: the journal source's own output (the same
  committed rows as Arrow batches, saved once to an Arrow IPC file) replayed
  by a Python data source that does nothing else, in the same two tasks:
  what Spark itself costs for any Python data source's read of these rows.
  The journal source's ratio can only approach this one; the difference is
  its reading, parsing and sequencing.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, cast

from exactly.benchmarks._harness import Result, interleaved
from journal import LocalJournalStore
from message import JsonDocument, Publisher, Transaction, modulo_mapping

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_CONTENT = "session string, page string, ms long"
_PAGES = ["/", "/search", "/product/1", "/product/2", "/cart", "/checkout"]


def _populate(root: Path, n: int) -> tuple[list[str], int]:
    """Write about ``n`` clicks; return the fragment files and the committed count."""
    rng = random.Random(1)
    committed = 0
    with LocalJournalStore(root) as store:
        for i in range(4):
            store.create(f"clicks/part-{i}", {"content-type": "application/x-ndjson", "app": "c"})
        parts = store.list("app=c")
        mapping = modulo_mapping(lambda d: cast(JsonDocument, d)["session"], lambda: parts)

        def click() -> JsonDocument:
            return JsonDocument(session=f"s{rng.randrange(5000)}", page=rng.choice(_PAGES),
                                ms=rng.randrange(10_000))

        publishers = [Publisher(store) for _ in range(4)]
        while committed < n:
            if rng.random() < 0.9:
                for _ in range(1000):
                    rng.choice(publishers).publish_committed(mapping, click())
                committed += 1000
            else:
                txn = Transaction(Publisher(store))
                size = rng.randrange(10, 200)
                for _ in range(size):
                    txn.publish(mapping, click())
                if rng.random() < 0.2:
                    txn.abort()
                else:
                    txn.commit()
                    committed += size
        store.flush()
        for spec in parts:  # a few hundred retried appends
            with store.read(spec.name, 0, min(store.head(spec.name), 20_000)) as r:
                lines = r.read(20_000).splitlines(keepends=True)[:-1]
            for _ in range(100):
                store.append(spec.name, rng.choice(lines))
        store.flush()
        files = []
        for spec in parts:
            store.seal(spec.name)
            files += [f.path for f in store.fragments(spec.name)]
    return files, committed


def run(scale: float) -> list[Result]:
    import pipeline
    from exactly.benchmarks._arrow_replay import ArrowReplay, save_batches

    n = max(5000, int(400_000 * scale))
    spark = pipeline.local_session("local[2]")
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        files, committed = _populate(tmp, n)
        opts = {"root": str(tmp), "selector": "app=c", "schema": _CONTENT,
                "include_acks": "false"}
        json_schema = f"{_CONTENT}, _meta struct<uuid: string>"
        counts: dict[str, int] = {}

        def journal() -> None:
            df = spark.read.format("journal").options(**opts).load()
            df.write.format("noop").mode("overwrite").save()

        def read_json() -> None:
            df = spark.read.schema(json_schema).json(files)
            df.write.format("noop").mode("overwrite").save()

        def dedup() -> None:
            df = spark.read.schema(json_schema).json(files)
            df = df.where("page is not null").withColumn("uuid", df["_meta.uuid"])
            df = df.dropDuplicates(["uuid"])
            df.write.format("noop").mode("overwrite").save()

        source = spark.read.format("journal").options(**opts).load()
        batches = tmp / "committed.arrow"
        save_batches(source, batches)
        spark.dataSource.register(ArrowReplay)
        replay_opts = {"path": str(batches), "schema_json": source.schema.json()}

        def load_replay() -> DataFrame:
            return spark.read.format("arrow-replay").options(**replay_opts).load()

        def replay() -> None:
            load_replay().write.format("noop").mode("overwrite").save()

        journal()  # warm up: worker start-up and imports are not throughput
        replay()
        counts["journal"] = source.where("page is not null").count()
        counts["replay"] = load_replay().where("page is not null").count()
        raw = spark.read.schema(json_schema).json(files).where("page is not null")
        counts["dedup"] = raw.withColumn("uuid", raw["_meta.uuid"]).dropDuplicates(["uuid"]).count()
        counts["json"] = spark.read.schema(json_schema).json(files).count()
        times = interleaved(
            {"journal": journal, "json": read_json, "dedup": dedup, "replay": replay},
            repeat=5 if scale >= 0.5 else 1,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name in ("journal", "replay"):
        if counts[name] != committed:
            raise AssertionError(f"{name}: read {counts[name]} rows, {committed} committed")
    rows = counts["json"]
    json_rate = rows / times["json"]
    return [
        Result("spark: read committed vs spark.read.json (same files)",
               rows / times["journal"], "rows/s", baseline_name="spark.read.json",
               baseline=json_rate, target=1.0),
        Result("spark: Arrow hand-off alone (same batches, from memory) vs spark.read.json",
               rows / times["replay"], "rows/s", baseline_name="spark.read.json",
               baseline=json_rate),
        Result("spark: json + dropDuplicates(uuid) vs spark.read.json",
               rows / times["dedup"], "rows/s", baseline_name="spark.read.json",
               baseline=json_rate),
        # Not a target of ours: how wrong the naive approach is (the journal
        # source returns none of these rows; the Spark tests check that).
        Result("spark: naive dropDuplicates(uuid) keeps uncommitted rows",
               counts["dedup"] - committed, "rows"),
    ]
