"""Shards moving between member processes (``exactly serve``) through etcd.

A Gazette cluster (one broker, its etcd) is started here on 127.0.0.1. Two
members serve eight shards, each reading a journal that a feeder keeps
appending to (so every shard commits a transaction every
``MAX_TXN`` seconds). Rows:

- failover: one member is SIGKILLed (five times, at a random moment of its
  lease's renewal period, a new member started after each); the time until
  every shard it served has committed again at the other (the median),
  beside the lease TTL plus one transaction (the goal: within it), and the
  shards moved per second over that time;
- hand-over: the other member gets SIGTERM (its shards commit and are
  released) while a new member runs; the shards moved per second, from the
  SIGTERM until the last of them has committed at the new member.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumer import Application, Shard, SQLiteStore, Store
from exactly.benchmarks._harness import Result
from message import Envelope, JsonDocument, Publisher

if TYPE_CHECKING:
    from exactly.localcluster import GazetteCluster
    from journal import JournalSpec

NDJSON = {"content-type": "application/x-ndjson"}
SHARDS = 8
TTL = 3  # the members' lease TTL (seconds)
MAX_TXN = 0.2  # each shard's max_txn_duration (seconds)
_DIR = "EXACTLY_BENCH_MEMBERS_DIR"


class BenchApp(Application):
    """Counts each shard's messages in a SQLite store, and prints
    ``committing SHARD UNIX_TIME`` as each transaction ends."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def new_store(self, shard: Shard) -> Store:
        store = SQLiteStore(Path(os.environ[_DIR]) / f"{shard.id}.db")
        store.connection.execute(
            "CREATE TABLE IF NOT EXISTS n (k INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        store.connection.commit()
        self._counts[shard.id] = 0
        return store

    def new_message(self, spec: JournalSpec) -> JsonDocument:
        return JsonDocument()

    def consume_message(self, shard: Shard, store: Store, envelope: Envelope,
                        publisher: Publisher) -> None:
        self._counts[shard.id] += 1

    def finalize_txn(self, shard: Shard, store: Store, publisher: Publisher) -> None:
        assert isinstance(store, SQLiteStore)
        n = self._counts[shard.id]
        store.connection.execute(
            "INSERT INTO n (k, n) VALUES (0, ?) ON CONFLICT (k) DO UPDATE SET n = n.n + ?",
            (n, n))
        self._counts[shard.id] = 0
        print(f"committing {shard.id} {time.time():.3f}", flush=True)


def _commits(log: Path) -> list[tuple[str, float]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "committing":
            out.append((parts[1], float(parts[2])))
    return out


def run(scale: float) -> list[Result]:
    from exactly.benchmarks.bench_broker import Unavailable, start_cluster

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        try:
            cluster = start_cluster(base / "cluster", brokers=1)
        except Unavailable as exc:
            print(f"  member rows skipped: {exc}")
            return []
        try:
            return _measure(cluster, base, cycles=1 if scale < 0.5 else 5)
        finally:
            cluster.stop()


def _measure(cluster: GazetteCluster, base: Path, cycles: int) -> list[Result]:
    from consumer import EtcdClient, ShardGroup, ShardSpec
    from journal import GazetteClient

    sources = [f"bench/members/in-{i}" for i in range(SHARDS)]
    specs = [ShardSpec(f"count-{i}", [sources[i]], max_txn_duration=MAX_TXN)
             for i in range(SHARDS)]
    stores = base / "stores"
    stores.mkdir()
    env = {**os.environ, _DIR: str(stores), "PYTHONPATH": os.pathsep.join(sys.path)}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stop = threading.Event()

    def member(name: str) -> None:
        with open(base / f"{name}.log", "wb") as out:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "exactly", "serve",
                 "exactly.benchmarks.bench_members:BenchApp", "--etcd", cluster.etcd_address,
                 "--etcd-prefix", "/bench", "--broker", cluster.address, "--lease-ttl",
                 str(TTL), "--member-id", name, "--log-level", "warning"],
                env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait(cond: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError("the members did not settle in time: see their logs")
            time.sleep(0.05)

    etcd = EtcdClient(cluster.etcd_address)
    group = ShardGroup(etcd, "/bench")
    try:
        with GazetteClient(cluster.address, replication=1) as client:
            for name in sources:
                client.create(name, NDJSON)

            def feed() -> None:
                record = b'{"n": 1}\n'
                while not stop.is_set():
                    for name in sources:
                        client.append(name, record)
                    time.sleep(0.01)

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            group.apply(specs)
            member("a")
            member("b")

            def held(name: str) -> set[str]:
                return {s for s, c in group.view().claims.items() if c.member == name}

            def first_commits(log: str, shards: set[str], since: float) -> float:
                """Seconds from ``since`` until each of ``shards`` has committed at
                the member ``log``."""
                def firsts() -> dict[str, float]:
                    out: dict[str, float] = {}
                    for s, t in _commits(base / f"{log}.log"):
                        if s in shards and t > since:
                            out.setdefault(s, t)
                    return out

                wait(lambda: len(firsts()) == len(shards), timeout=4 * TTL + 30)
                return max(firsts().values()) - since

            live = ["a", "b"]
            failovers: list[float] = []
            moved: set[str] = set()
            phase = random.Random(7)
            for cycle in range(cycles):
                pair = list(live)
                wait(lambda pair=pair: [len(held(m)) for m in pair] == [SHARDS // 2] * 2)
                time.sleep(2 * MAX_TXN + 0.5)  # every shard has committed at its member
                # A crash comes at any moment of the lease's renewal period
                # (a third of the TTL), which the time to expiry depends on.
                time.sleep(phase.uniform(0, TTL / 3))
                victim, survivor = live
                moved = held(victim)
                killed = time.time()
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                failovers.append(first_commits(survivor, moved, killed))
                newcomer = f"n{cycle}"
                member(newcomer)
                live = [survivor, newcomer]

            wait(lambda: [len(held(m)) for m in live] == [SHARDS // 2] * 2)
            time.sleep(2 * MAX_TXN + 0.5)
            leaving, staying = live
            handed = held(leaving)
            termed = time.time()
            procs[leaving].send_signal(signal.SIGTERM)
            procs[leaving].wait(60)
            handover = first_commits(staying, handed, termed)
            stop.set()
            feeder.join()
    finally:
        stop.set()
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        etcd.close()
    failover = statistics.median(failovers)
    spread = f"median of {len(failovers)}: {min(failovers):.2f}-{max(failovers):.2f} s"
    return [
        Result(f"members: {len(moved)} shards served again after a SIGKILL", failover, "s",
               baseline_name=f"lease TTL {TTL} s + one transaction", baseline=TTL + MAX_TXN,
               target=1.0, higher_is_better=False, note=spread),
        Result("members: shards moved per second after a SIGKILL", len(moved) / failover,
               "shards/s", note=f"{len(moved)} shards in {failover:.2f} s, lease expiry included"),
        Result("members: shards handed over on SIGTERM", len(handed) / handover, "shards/s",
               note=f"{len(handed)} shards in {handover:.2f} s"),
    ]
