"""Journals on a Gazette cluster: ``GazetteClient`` beside Gazette's own
``gazctl`` on the same cluster, and beside the embedded store.

A cluster of 3 brokers is started here on 127.0.0.1 (``exactly.localcluster``;
the first run builds Gazette with Go). Every journal has the same spec
(``GazetteClient``'s defaults: replication 3), so both sides pay the same
replication. Rows:

- append: 100-byte frames appended with many in flight, then flushed, beside
  ``gazctl journals append --framing lines`` of the same frames from a file
  (each line an atomic append, batched by Gazette's own AppendService);
- read: a journal's bytes through the brokers, beside ``gazctl journals read``
  of the same journal (to /dev/null);
- committed read: ``ReadCommittedIter`` over the brokers beside the same over a
  ``LocalJournalStore`` holding the same bytes (a mixed workload with
  transactions and duplicates).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.benchmarks._harness import Result, interleaved
from exactly.benchmarks._workload import copy_journal, publish_mixed
from journal import GazetteClient, JournalClient, LocalJournalStore
from message import JsonDocument, ReadCommittedIter

if TYPE_CHECKING:
    from exactly.localcluster import GazetteCluster

RECORD = b'{"pad": "' + b"x" * 88 + b'"}\n'  # 100 bytes
NDJSON = {"content-type": "application/x-ndjson"}


class Unavailable(Exception):  # noqa: N818 -- a reason, not an error
    """The cluster cannot be had here (no Go to build Gazette, ...)."""


def start_cluster(workdir: Path, brokers: int = 3) -> GazetteCluster:
    """A local cluster of ``brokers`` for a benchmark (``Unavailable`` if none
    can be had). Its brokers hold etcd leases of 10 s, not the local
    cluster's 3: on a loaded machine a 3 s lease can lapse (and its broker
    exit) while the benchmark runs, and no broker is killed here. A cluster
    that fails to start is tried once more, in a fresh directory."""
    from exactly.localcluster import ClusterError, GazetteCluster, ensure_binaries

    try:
        binaries = ensure_binaries()
    except ClusterError as exc:
        raise Unavailable(str(exc).splitlines()[0]) from None
    for attempt in range(2):
        try:
            return GazetteCluster(workdir / f"try-{attempt}", brokers=brokers,
                                  binaries=binaries, etcd_lease=10, log_level="warn").start()
        except ClusterError as exc:
            failure = exc
    raise Unavailable(str(failure)) from None


def run(scale: float) -> list[Result]:
    n = max(2000, int(1_000_000 * scale))
    messages = max(2000, int(300_000 * scale))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        try:
            cluster = start_cluster(base / "cluster")
        except Unavailable as exc:
            print(f"  broker rows skipped: {exc}")
            return []
        try:
            return _measure(cluster, base, n, messages)
        finally:
            cluster.stop()


def _measure(c: GazetteCluster, base: Path, n: int, messages: int) -> list[Result]:
    address = c.address
    lines = base / "lines.ndjson"
    lines.write_bytes(RECORD * n)
    runs = iter(range(1_000_000))

    with GazetteClient(address) as client:

        def fresh() -> str:
            name = f"bench/append-{next(runs)}"
            client.create(name, NDJSON)
            return name

        def ours() -> None:
            name = fresh()
            append = client.append
            for _ in range(n):
                append(name, RECORD)
            client.flush()

        def gazctl() -> None:
            name = fresh()
            c.gazctl(
                "journals", "append", "-l", f"name={name}", "--framing", "lines",
                "-i", str(lines), timeout=600,
            )

        appends = interleaved({"ours": ours, "gazctl": gazctl}, repeat=3)

        # Reads of one journal holding the n frames.
        full = f"bench/append-{next(runs) - 1}"

        def read_ours() -> None:
            with client.read(full) as r:
                while r.read(1 << 20):
                    pass

        def read_gazctl() -> None:
            # Its standard output to /dev/null (its -o flag fsyncs the file).
            subprocess.run(
                [str(c.binaries.gazctl), "journals", "read", "-l", f"name={full}"],
                env={**os.environ, "BROKER_ADDRESS": address},
                stdout=subprocess.DEVNULL, check=True, timeout=600,
            )

        reads = interleaved({"ours": read_ours, "gazctl": read_gazctl}, repeat=3)

        # Committed reads of the same bytes, on the cluster and in the embedded store.
        with LocalJournalStore(base / "store") as store:
            store.create("bench/mixed", NDJSON)
            frames = publish_mixed(store, "bench/mixed", messages)
            client.create("bench/mixed", NDJSON)
            copy_journal(store, client, "bench/mixed")

            def committed(journal_client: JournalClient) -> None:
                for _ in ReadCommittedIter(
                    journal_client, "bench/mixed", lambda _s: JsonDocument()
                ):
                    pass

            committed_times = interleaved(
                {"broker": lambda: committed(client), "local": lambda: committed(store)},
                repeat=3,
            )

    return [
        Result(
            name="broker: 100 B appends, many in flight",
            value=n / appends["ours"],
            unit="appends/s",
            baseline_name="gazctl journals append",
            baseline=n / appends["gazctl"],
            target=1.0,
        ),
        Result(
            name="broker: read a journal's bytes",
            value=n * len(RECORD) / reads["ours"] / 1e6,
            unit="MB/s",
            baseline_name="gazctl journals read",
            baseline=n * len(RECORD) / reads["gazctl"] / 1e6,
            target=1.0,
        ),
        Result(
            name="broker: read committed, mixed workload",
            value=frames / committed_times["broker"],
            unit="envelopes/s",
            baseline_name="same, embedded store",
            baseline=frames / committed_times["local"],
            target=0.8,
        ),
    ]


if __name__ == "__main__":
    from exactly.benchmarks._harness import format_table

    t0 = time.perf_counter()
    print(format_table(run(float(os.environ.get("BENCH_SCALE", "1")))))
    print(f"({time.perf_counter() - t0:.1f} s)")
