"""Real Gazette deployments: the cost of TLS, and fragments read straight
from a cloud store.

- TLS: a cluster whose brokers serve TLS beside one in plain text (three
  brokers each, started here on 127.0.0.1): 100-byte appends with many in
  flight, and a journal's bytes read. Goal: TLS costs at most 15%.
- Cloud store: a cluster whose brokers persist fragments to an
  S3-compatible server (SeaweedFS, started here); committed reads of a
  journal whose fragments are all persisted, fetched by their signed URLs
  by the reader itself, beside the same reads proxied by the brokers
  (``direct_reads=False``). Goal: 1.5 times faster.

Each side builds what it needs with Go on first use (Gazette, SeaweedFS);
without Go the rows are skipped with the reason.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.benchmarks._harness import Result, interleaved
from journal import GazetteClient
from message import JsonDocument, ReadCommittedIter

if TYPE_CHECKING:
    from exactly.localcluster import GazetteCluster

RECORD = b'{"pad": "' + b"x" * 88 + b'"}\n'  # 100 bytes
#: A timed read reads the journal this many times: one read of 30 MB takes
#: about 0.1 s, too short to time on a busy machine.
READS = 5
NDJSON = {"content-type": "application/x-ndjson"}


def _cluster(workdir: Path, **kw: Any) -> GazetteCluster:
    from exactly.localcluster import GazetteCluster, ensure_binaries

    # Leases of 10 s, as bench_broker.start_cluster says why.
    return GazetteCluster(workdir, brokers=3, binaries=ensure_binaries(), log_level="warn",
                          etcd_lease=10, **kw).start()


def _tls_rows(base: Path, n: int) -> list[Result]:
    from exactly.localcluster import ClusterSecurity

    plain = _cluster(base / "plain")
    tls = _cluster(base / "tls", security=ClusterSecurity.generate(base / "certs", auth=False))
    try:
        clients = {
            "plain": GazetteClient(plain.address, replication=1),
            "tls": GazetteClient(tls.address, replication=1,
                                 trusted_ca_file=tls.security.ca_file if tls.security else None),
        }
        runs = iter(range(1_000_000))
        last: dict[str, str] = {}

        def appends(side: str) -> None:
            c = clients[side]
            name = last[side] = f"bench/tls-{next(runs)}"
            c.create(name, NDJSON)
            append = c.append
            for _ in range(n):
                append(name, RECORD)
            c.flush()

        def reads(side: str) -> None:
            for _ in range(READS):
                with clients[side].read(last[side]) as r:
                    while r.read(1 << 20):
                        pass

        wrote = interleaved({"plain": lambda: appends("plain"), "tls": lambda: appends("tls")},
                            repeat=3)
        read = interleaved({"plain": lambda: reads("plain"), "tls": lambda: reads("tls")},
                           repeat=5)
        for c in clients.values():
            c.close()
    finally:
        plain.stop()
        tls.stop()
    return [
        Result(name="TLS brokers: 100 B appends, many in flight", value=n / wrote["tls"],
               unit="appends/s", baseline_name="plain-text brokers",
               baseline=n / wrote["plain"], target=0.85),
        Result(name="TLS brokers: read a journal's bytes",
               value=READS * n * len(RECORD) / read["tls"] / 1e6, unit="MB/s",
               baseline_name="plain-text brokers",
               baseline=READS * n * len(RECORD) / read["plain"] / 1e6, target=0.85),
    ]


def _store_rows(base: Path, messages: int) -> list[Result]:
    from exactly._s3server import S3Server

    s3 = S3Server(base / "s3").start()
    cluster = None
    try:
        cluster = _cluster(base / "s3-cluster", broker_env=s3.aws_env())
        name = "bench/cloud"
        with GazetteClient(cluster.address, replication=1, refresh_interval=1) as c:
            c.create(name, NDJSON, fragment_stores=[s3.store_url("bench/")],
                     fragment_length=4 << 20, compression="none")
            for i in range(messages):
                c.append(name, b'{"_meta": {"uuid": null}, "i": %d, "pad": "%s"}\n'
                         % (i, b"p" * 60))
            c.flush()
            head = c.head(name)
            # Every fragment persisted but the last, which stays open (and is
            # read through a broker by both sides).
            deadline = time.monotonic() + 120
            while not all(f.sealed for f in c.fragments(name)[:-1]):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)

        def raw(direct: bool) -> None:
            with GazetteClient(cluster.address, direct_reads=direct) as c, c.read(name) as r:
                while r.read(1 << 20):
                    pass

        def committed(direct: bool) -> None:
            with GazetteClient(cluster.address, direct_reads=direct) as c:
                for _ in ReadCommittedIter(c, name, lambda _s: JsonDocument()):
                    pass

        raw_times = interleaved({"direct": lambda: raw(True), "proxied": lambda: raw(False)},
                                repeat=3)
        times = interleaved({"direct": lambda: committed(True),
                             "proxied": lambda: committed(False)}, repeat=3)
    finally:
        if cluster is not None:
            cluster.stop()
        s3.stop()
    return [
        Result(
            name="cloud store: a journal's bytes, fragments fetched by their signed URLs",
            value=head / raw_times["direct"] / 1e6, unit="MB/s",
            baseline_name="proxied by the brokers", baseline=head / raw_times["proxied"] / 1e6,
            target=1.5,
        ),
        Result(
            name="cloud store: read committed, fragments fetched by their signed URLs",
            value=messages / times["direct"], unit="msg/s",
            baseline_name="proxied by the brokers", baseline=messages / times["proxied"],
            target=1.5,
        ),
    ]


def run(scale: float) -> list[Result]:
    from exactly._clusterbuild import ClusterError

    n = max(2000, int(300_000 * scale))
    messages = max(2000, int(500_000 * scale))
    rows: list[Result] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        base = Path(tmp)
        try:
            rows += _tls_rows(base, n)
        except ClusterError as exc:
            print(f"  TLS rows skipped: {str(exc).splitlines()[0]}")
        try:
            rows += _store_rows(base, messages)
        except ClusterError as exc:
            print(f"  cloud store rows skipped: {str(exc).splitlines()[0]}")
    return rows


if __name__ == "__main__":
    from exactly.benchmarks._harness import format_table

    t0 = time.perf_counter()
    print(format_table(run(float(os.environ.get("BENCH_SCALE", "1")))))
    print(f"({time.perf_counter() - t0:.1f} s)")
