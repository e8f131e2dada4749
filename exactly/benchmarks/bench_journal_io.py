"""Publishing and reading through the LocalJournalStore.

- durable ``publish_committed`` of ~100-byte NDJSON messages from one process
  (target 600k/s: faster than a Kafka producer, ~570k msg/s of 100 bytes
  without waiting for fsync), beside raw appends of the same frames;
- read-uncommitted messages/s as a ratio to a bare ``orjson.loads`` loop over
  the same lines (target 0.5);
- read-committed over read-uncommitted (target 0.8);
- read-committed with every batch checked against its CRC-32C
  (``verify_checksums``) over the same without (target 0.97);
- durable publishing and read-committed with metrics on (journal.metrics,
  in a registry of its own) over the same with metrics off (target 0.97);
- follow latency, append to delivery, of a blocking read-committed reader.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import orjson

from exactly.benchmarks._harness import Result, interleaved
from journal import LocalJournalStore, metrics, read_all
from message import JsonDocument, Publisher, ReadCommittedIter, ReadUncommittedIter

J = "bench/ndjson"
NDJSON = {"content-type": "application/x-ndjson"}


def _to_j(_msg: object) -> tuple[str, str]:
    return J, "application/x-ndjson"


def _new_doc(_spec: object) -> JsonDocument:
    return JsonDocument()


def _doc(i: int) -> JsonDocument:
    # About 100 bytes once framed with its _meta/uuid.
    return JsonDocument(page=f"/products/{i % 977:05d}", session=f"s-{i % 5003:06d}", n=i)


def _publish(root: Path, n: int) -> float:
    with LocalJournalStore(root) as store:
        store.create(J, NDJSON)
        pub = Publisher(store)
        t0 = time.perf_counter()
        for i in range(n):
            pub.publish_committed(_to_j, _doc(i))
        store.flush()
        return time.perf_counter() - t0


def _raw_append(root: Path, frames: list[bytes]) -> float:
    with LocalJournalStore(root) as store:
        store.create(J, NDJSON)
        t0 = time.perf_counter()
        for f in frames:
            store.append(J, f)
        store.flush()
        return time.perf_counter() - t0


def _metrics_on_vs_off(root: Path, n: int) -> list[Result]:
    """Durable publishing, and read-committed, with metrics on beside off,
    interleaved (nothing where prometheus-client is not installed)."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        return []
    registry = CollectorRegistry()
    runs = iter(range(1_000_000))

    def metered(fn: Callable[[], object], on: bool) -> Callable[[], None]:
        def go() -> None:
            if on:
                metrics.enable(registry)
            try:
                fn()
            finally:
                metrics.disable()

        return go

    def publish() -> None:
        _publish(root / f"m{next(runs)}", n)

    pub = interleaved({"off": metered(publish, False), "on": metered(publish, True)}, repeat=5)
    with LocalJournalStore(root / "p0") as store:

        def committed() -> None:
            with ReadCommittedIter(store, J, _new_doc) as it:
                for _ in it:
                    pass
                it.checkpoint()

        read = interleaved({"off": metered(committed, False), "on": metered(committed, True)},
                           repeat=5)
    return [
        Result("publish_committed, durable, metrics on", n / pub["on"], "msg/s",
               baseline_name="metrics off", baseline=n / pub["off"], target=0.97),
        Result("read committed, metrics on", n / read["on"], "msg/s",
               baseline_name="metrics off", baseline=n / read["off"], target=0.97),
    ]


def _follow_latency(root: Path, count: int) -> list[float]:
    latencies: list[float] = []
    with LocalJournalStore(root) as store:
        store.create("bench/follow", NDJSON)
        to = lambda _m: ("bench/follow", "application/x-ndjson")  # noqa: E731
        it = ReadCommittedIter(store, "bench/follow", _new_doc, block=True)
        ready = threading.Event()

        def follow() -> None:
            ready.set()
            for env in it:
                latencies.append(time.perf_counter() - cast(JsonDocument, env.message)["t"])
                if len(latencies) == count:
                    return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        ready.wait()
        pub = Publisher(store)
        for _ in range(count):
            pub.publish_committed(to, JsonDocument(t=time.perf_counter())).result()
            time.sleep(0.002)
        t.join(30)
        it.close()
    return latencies


def run(scale: float) -> list[Result]:
    n = max(2000, int(200_000 * scale))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Publish, and raw appends of the same frames, side by side.
        times = {"publish": float("inf"), "append": float("inf")}
        for rep in range(2):
            times["publish"] = min(times["publish"], _publish(root / f"p{rep}", n))
        with LocalJournalStore(root / "p0") as store, store.read(J) as r:
            data = read_all(r)
        lines = data.splitlines(keepends=True)
        for rep in range(2):
            times["append"] = min(times["append"], _raw_append(root / f"a{rep}", lines))

        with LocalJournalStore(root / "p0") as store:

            def uncommitted() -> None:
                for _ in ReadUncommittedIter(store, J, _new_doc):
                    pass

            def committed() -> None:
                for _ in ReadCommittedIter(store, J, _new_doc):
                    pass

            def bare() -> None:
                loads = orjson.loads
                for line in lines:
                    loads(line)

            read = interleaved({"u": uncommitted, "c": committed, "orjson": bare}, repeat=3)
        # Readers that check every batch's CRC-32C (verify_checksums), beside
        # ones that do not, over the same files.
        with LocalJournalStore(root / "p0") as plain, LocalJournalStore(
            root / "p0", verify_checksums=True
        ) as checking:

            def reads_through(store: LocalJournalStore) -> Callable[[], None]:
                def go() -> None:
                    for _ in ReadCommittedIter(store, J, _new_doc):
                        pass

                return go

            verified = interleaved(
                {"plain": reads_through(plain), "verified": reads_through(checking)}, repeat=3
            )
        metered = _metrics_on_vs_off(root, n)
        lat = sorted(_follow_latency(root / "f", max(50, int(500 * scale))))
    size = len(data) / len(lines)
    return [
        Result(f"publish_committed, durable ({size:.0f} B NDJSON)", n / times["publish"],
               "msg/s", baseline_name="raw append", baseline=n / times["append"]),
        Result("publish_committed, durable: msg/s", n / times["publish"], "msg/s",
               target=600_000),
        Result("read uncommitted vs orjson.loads", n / read["u"], "msg/s",
               baseline_name="orjson.loads", baseline=n / read["orjson"], target=0.5),
        Result("read committed vs read uncommitted", n / read["c"], "msg/s",
               baseline_name="uncommitted", baseline=n / read["u"], target=0.8),
        Result("read committed, batch checksums verified", n / verified["verified"], "msg/s",
               baseline_name="not verified", baseline=n / verified["plain"], target=0.97),
        *metered,
        Result("follow latency p50", statistics.median(lat) * 1e3, "ms",
               target=100, higher_is_better=False),
        Result("follow latency p99", lat[int(len(lat) * 0.99) - 1] * 1e3, "ms",
               target=100, higher_is_better=False),
    ]
