"""Durable appends to a LocalJournalStore from one process.

- throughput: 100-byte records appended with many in flight (group commit:
  one write and two syncs per batch), beside a bare loop of ``os.write`` with
  one ``fsync`` per 1000 records -- a floor no durable store beats by much;
- latency: one append at a time, each waited for, beside ``os.write`` +
  ``fdatasync`` per record (the store syncs twice: data, then commit record).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from exactly.benchmarks._harness import Result, interleaved
from journal import LocalJournalStore

RECORD = b"x" * 99 + b"\n"
J = "bench/append"


def _store_throughput(root: Path, n: int) -> None:
    with LocalJournalStore(root) as store:
        store.create(J, {"content-type": "application/x-ndjson"})
        append = store.append
        for _ in range(n):
            append(J, RECORD)
        store.flush()


def _bare_throughput(path: Path, n: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(1, n + 1):
            os.write(fd, RECORD)
            if i % 1000 == 0:
                os.fsync(fd)
        os.fsync(fd)
    finally:
        os.close(fd)


def _store_sequential(root: Path, n: int) -> None:
    with LocalJournalStore(root) as store:
        store.create(J, {"content-type": "application/x-ndjson"})
        for _ in range(n):
            store.append(J, RECORD).result()


def _bare_sequential(path: Path, n: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(n):
            os.write(fd, RECORD)
            os.fdatasync(fd)
    finally:
        os.close(fd)


def run(scale: float) -> list[Result]:
    n = max(1000, int(200_000 * scale))
    k = max(20, int(400 * scale))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        runs = iter(range(1_000_000))

        def fresh() -> Path:
            return base / f"run-{next(runs)}"

        bulk = interleaved(
            {
                "store": lambda: _store_throughput(fresh(), n),
                "bare": lambda: _bare_throughput(fresh(), n),
            },
            repeat=3,
        )
        one = interleaved(
            {
                "store": lambda: _store_sequential(fresh(), k),
                "bare": lambda: _bare_sequential(fresh(), k),
            },
            repeat=3,
        )
    return [
        Result(
            name="journal: durable 100 B appends, many in flight",
            value=n / bulk["store"],
            unit="appends/s",
            baseline_name="os.write, fsync per 1000",
            baseline=n / bulk["bare"],
            target=0.08,
        ),
        Result(
            name="journal: durable append latency, one in flight",
            value=bulk_ms(one["store"], k),
            unit="ms",
            baseline_name="os.write + fdatasync",
            baseline=bulk_ms(one["bare"], k),
            target=3.0,
            higher_is_better=False,
        ),
    ]


def bulk_ms(seconds: float, count: int) -> float:
    return seconds / count * 1000.0


if __name__ == "__main__":
    from exactly.benchmarks._harness import format_table

    t0 = time.perf_counter()
    print(format_table(run(float(os.environ.get("BENCH_SCALE", "1")))))
    print(f"({time.perf_counter() - t0:.1f} s)")
