"""``exactly demo``, and with ``--cluster``, the demo's story on local clusters.

Starts a Gazette cluster (etcd and three brokers) and a Spark standalone
cluster (a master and two workers) under the demo's directory, runs
``exactly._demo.run_demo`` on them, and stops every process it started,
whatever happens. Progress is shown while each starts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from exactly._common import ArgumentsError, UsageError
from exactly.localcluster import ClusterSecurity, GazetteCluster, SparkCluster


def run_cluster_demo(store: Path, out: TextIO = sys.stdout,
                     progress_every: float = 5.0, *, secure: bool = False) -> int:
    """The demo in ``store`` (its clusters' directories inside); an exit
    status. With ``secure``, the Gazette brokers serve TLS, ask for client
    certificates and check authorizations, and every client of the demo
    (its producers, the Spark job's tasks) presents them."""
    from exactly._demo import Progress, prepare, run_demo, say
    from pipeline import StoreOptions

    t0 = time.monotonic()
    root = store.resolve()
    prepare(root)
    security = (ClusterSecurity.generate(root / "gazette-tls", mutual=True, auth=True)
                if secure else None)
    gazette = GazetteCluster(root / "gazette", brokers=3, log_level="warn", security=security)
    spark = SparkCluster(root / "spark", workers=2)
    try:
        with Progress(out, t0, "starting a Gazette cluster (the first time, Go builds"
                      " Gazette and etcd: a few minutes)", every=progress_every):
            gazette.start(timeout=120, progress=lambda line: say(out, t0, line))
        say(out, t0, f"Gazette cluster up: etcd and 3 brokers (BROKER_ADDRESS="
            f"{gazette.address}; logs in {gazette.log_dir})")
        with Progress(out, t0, "starting a Spark standalone cluster", every=progress_every):
            spark.start()
        say(out, t0, f"Spark standalone cluster up: a master and 2 workers at"
            f" {spark.master_url}")
        options = {k: str(v) for k, v in gazette.client_options().items() if v}
        where = StoreOptions(broker=gazette.address, file_root=str(gazette.fragment_root),
                             security=tuple(sorted(options.items())))
        return run_demo(root, where=where, master=spark.master_url, out=out,
                        progress_every=progress_every, prepared=True)
    finally:
        say(out, t0, "stopping the clusters")
        spark.stop(grace=2.0)
        gazette.stop(grace=0.5)
        say(out, t0, "clusters stopped")


def cmd_demo(args: argparse.Namespace) -> int:
    from exactly._quickdemo import run_quick_demo

    for option in ("root", "broker"):
        if getattr(args, option, None) is not None:
            # (The demo replaces its store: never one of the user's.)
            raise ArgumentsError(f"the demo keeps a store of its own, which it replaces: name"
                                 f" its directory with --store DIR, not --{option}")
    store = args.store or ("demo-cluster" if args.cluster else "demo-store")
    if args.secure and not args.cluster:
        raise ArgumentsError("--secure goes with --cluster (the embedded store has no TLS)")
    if args.quick:
        if args.cluster:
            raise ArgumentsError("--quick runs without Spark or clusters: not with --cluster")
        return run_quick_demo(Path(store), sys.stdout)
    try:
        from exactly._demo import run_demo  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:  # the spark extra is not installed
        if args.cluster:
            raise UsageError(f"the cluster demo needs the Spark pipeline ({exc}): install the"
                             " spark extra") from None
        print(f"the Spark pipeline is not available ({exc}); running the sequencing demo. "
              "Install the spark extra for the whole pipeline.", file=sys.stderr)
        return run_quick_demo(Path(store), sys.stdout)
    if not args.cluster:
        return int(run_demo(Path(store)) or 0)
    from exactly._clusterbuild import ClusterError

    try:
        return run_cluster_demo(Path(store), secure=args.secure)
    except ClusterError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
