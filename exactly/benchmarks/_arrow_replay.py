"""A Python data source that only hands over Arrow batches, for
``bench_spark``'s floor row: what Spark itself costs for a Python data
source's read, with no reading or parsing of ours. Its own module, imported
by ``run`` only, so that the benchmarks import without the spark extra."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType


class ArrowReplay(DataSource):
    """``spark.read.format("arrow-replay")``: the record batches of an Arrow
    IPC file (option ``path``), the even ones in one task and the odd ones in
    another; the schema is the option ``schema_json`` (``StructType.json()``).
    It only maps the file and hands its batches over."""

    @classmethod
    def name(cls) -> str:
        return "arrow-replay"

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema_json"]))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ReplayReader(str(self.options["path"]))


class _ReplayReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(self.path) as source:
            batches = pa.ipc.open_file(source)
            for i in range(partition.value, batches.num_record_batches, 2):
                yield batches.get_batch(i)


def save_batches(df: DataFrame, path: Path) -> None:
    """The rows of ``df`` as an Arrow IPC file of 64k-row batches."""
    table = df.toArrow()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        for batch in table.to_batches(max_chunksize=65536):
            out.write_batch(batch)
