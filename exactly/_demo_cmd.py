"""``exactly demo --cluster``: the demo's story on local clusters.

Starts a Gazette cluster (etcd and three brokers) and a Spark standalone
cluster (a master and two workers) under the demo's directory, runs
``pipeline.demo.run_demo`` on them, and stops every process it started,
whatever happens. Progress is shown while each starts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from exactly.localcluster import GazetteCluster, SparkCluster


def run_cluster_demo(store: Path, out: TextIO = sys.stdout,
                     progress_every: float = 5.0) -> int:
    """The demo in ``store`` (its clusters' directories inside); an exit status."""
    from pipeline._stores import StoreOptions
    from pipeline.demo import Progress, prepare, run_demo, say

    t0 = time.monotonic()
    root = store.resolve()
    prepare(root)
    gazette = GazetteCluster(root / "gazette", brokers=3, log_level="warn")
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
        where = StoreOptions(broker=gazette.address, file_root=str(gazette.fragment_root))
        return run_demo(root, where=where, master=spark.master_url, out=out,
                        progress_every=progress_every, prepared=True)
    finally:
        say(out, t0, "stopping the clusters")
        spark.stop(grace=2.0)
        gazette.stop(grace=0.5)
        say(out, t0, "clusters stopped")
