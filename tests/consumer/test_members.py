"""Shards served across processes through etcd (``consumer.Member``,
``exactly serve``): member processes SIGKILLed and started again under a
chained pipeline, a member paused past its lease, members joining and
leaving, etcd itself restarted, a store that cannot follow its shard. After
each, the output is exactly-once and no two members committed one shard in
overlapping terms."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer import (
    EtcdClient,
    EtcdError,
    Member,
    Shard,
    ShardGroup,
    ShardSpec,
    SQLiteStore,
    StoreElsewhereError,
)
from exactly._members_cmd import YOUNG_THRESHOLD
from journal import JournalClient, LocalJournalStore
from tests.consumer_support import (
    NDJSON,
    CountingApp,
    CountingState,
    committed_by_key,
    expected_output,
    expected_state,
    make_input,
    open_store,
    output_by_key,
)

ROOT = Path(__file__).resolve().parents[2]
TTL = 3  # the members' lease TTL in these tests (seconds)

pytestmark = pytest.mark.slow


# -- a chained pipeline of 2 x N shards --------------------------------------------


class Pipeline:
    """``n`` source partitions → ``n`` shards ``first-i`` → ``n`` mid
    partitions → ``n`` shards ``second-i`` → ``n`` output partitions, each
    shard's store a SQLite file under ``work``."""

    def __init__(self, prefix: str, n: int, work: Path) -> None:
        self.sources = [f"{prefix}in/part-{i}" for i in range(n)]
        self.mids = [f"{prefix}mid/part-{i}" for i in range(n)]
        self.outputs = [f"{prefix}out/part-{i}" for i in range(n)]
        self.work = work
        self.store = f"sqlite:{work}/{{shard}}.db"
        self.specs = [ShardSpec(f"first-{i}", [self.sources[i]], max_txn_duration=0.1)
                      for i in range(n)]
        self.specs += [ShardSpec(f"second-{i}", [self.mids[i]], max_txn_duration=0.1)
                       for i in range(n)]
        self.routes = {**{f"first-{i}": self.mids for i in range(n)},
                       **{f"second-{i}": self.outputs for i in range(n)}}

    def create(self, client: JournalClient, messages: int = 0, *, seed: int = 0,
               messy: bool = True) -> None:
        """Create the journals; with ``messages``, write that input to the
        sources (``make_input``) and flush it."""
        for name in self.sources + self.mids + self.outputs:
            client.create(name, NDJSON)
        if messages:
            make_input(client, self.sources, messages, seed=seed, messy=messy)
            client.flush()

    def env(self, slow: float = 0.0) -> dict[str, str]:
        config = {"store": self.store, "outputs": self.routes, "slow": slow}
        return {**os.environ, "PYTHONPATH": str(ROOT),
                "EXACTLY_TEST_MEMBER": json.dumps(config)}

    def app(self) -> CountingApp:
        return CountingApp(self.store, self.routes)

    def db(self, shard: str) -> Path:
        return self.work / f"{shard}.db"

    def done(self, client: JournalClient) -> bool:
        want = committed_by_key(client, self.sources)
        return bool(want) and output_by_key(client, self.outputs) == expected_output(want)

    def check(self, client: JournalClient) -> None:
        """Exactly-once at both stages, and one term at a time per shard."""
        want = committed_by_key(client, self.sources)
        assert want, "no input"
        assert output_by_key(client, self.mids) == expected_output(want)
        assert output_by_key(client, self.outputs) == expected_output(want)
        counts: dict[str, int] = {}
        total = 0
        for spec in self.specs:
            if not spec.id.startswith("second-"):
                continue
            store = SQLiteStore(self.db(spec.id))
            try:
                state = CountingState(store)
                store.restore_checkpoint(Shard(spec, client))
                c, t = state.snapshot()
            finally:
                store.close()
            for k, v in c.items():
                assert k not in counts, f"key {k} counted by two shards"
                counts[k] = v
            total += t
        assert (counts, total) == expected_state(want)
        for spec in self.specs:
            check_terms(self.db(spec.id))


def check_terms(db: Path) -> list[str]:
    """The terms that committed a shard, in commit order: each a single run
    (a term that committed after another term began never commits again)."""
    with sqlite3.connect(db) as conn:
        try:
            terms = [t for (t,) in conn.execute("SELECT term FROM terms ORDER BY seq")]
        except sqlite3.OperationalError:
            return []  # the app never committed here
    runs: list[str] = []
    for term in terms:
        if not runs or runs[-1] != term:
            assert term not in runs, f"{db.name}: term {term} committed again after {runs[-1]}"
            runs.append(term)
    return runs


def wait_for(what: str, cond: Callable[[], bool], timeout: float, every: float = 0.2) -> float:
    """Wait until ``cond()``; return the seconds it took."""
    began = time.monotonic()
    while not cond():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"not {what} within {timeout} s")
        time.sleep(every)
    return time.monotonic() - began


class Members:
    """``exactly serve`` processes of one group, each logging to a file."""

    def __init__(self, pipeline: Pipeline, etcd: str, prefix: str, broker: str,
                 slow: float = 0.0) -> None:
        self.pipeline, self.etcd, self.prefix, self.broker = pipeline, etcd, prefix, broker
        self.slow = slow
        self.ttl = TTL
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self._n = 0

    def start(self) -> str:
        self._n += 1
        name = f"m{self._n}"
        log = self.pipeline.work / f"{name}.log"
        with open(log, "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "exactly", "serve", "tests.member_app:MemberApp",
                 "--etcd", self.etcd, "--etcd-prefix", self.prefix, "--broker", self.broker,
                 "--lease-ttl", str(self.ttl), "--member-id", name],
                cwd=ROOT, env=self.pipeline.env(self.slow), stdout=out, stderr=subprocess.STDOUT)
        self.logs[name] = log
        return name

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name) if sig == signal.SIGKILL else self.procs[name]
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(30)

    def stop_all(self, timeout: float = 60) -> dict[str, int]:
        """SIGTERM each once it has joined the group, and wait: their exit
        statuses."""
        for name in self.procs:
            wait_for(f"{name} joined", lambda n=name: " joined " in self.log(n), timeout=30)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[name] = -9
        self.procs.clear()
        return codes

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with_cont = [signal.SIGCONT, signal.SIGKILL]
                for sig in with_cont:
                    proc.send_signal(sig)
                proc.wait()
        self.procs.clear()
        for name in self.logs:  # pytest shows this output when the test failed
            print(f"--- log of member {name} ---\n{self.log(name)}")


@pytest.fixture
def etcd_prefix() -> str:
    return f"/t/{secrets.token_hex(4)}"


@pytest.fixture
def group(gazette_cluster: Any, etcd_prefix: str) -> Iterator[ShardGroup]:
    etcd = EtcdClient(gazette_cluster.etcd_address)
    yield ShardGroup(etcd, etcd_prefix)
    etcd.delete(etcd_prefix + "/", prefix=True)
    etcd.close()


def feed(client: JournalClient, sources: list[str], rounds: int, each: int,
         stop: threading.Event) -> threading.Thread:
    """Publish ``rounds`` messy batches of input in the background."""
    def run() -> None:
        for r in range(rounds):
            if stop.is_set():
                return
            make_input(client, sources, each, seed=100 + r)
            time.sleep(0.5)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- the tests -----------------------------------------------------------------------


def test_three_members_sigkilled_in_turn_keep_twelve_shards_exactly_once(
        gazette_cluster: Any, gazette_prefix: str, group: ShardGroup, tmp_path: Path) -> None:
    """Three `exactly serve` processes serve a chain of twelve shards on a
    Gazette cluster; every few seconds one is SIGKILLed and a new one
    started, while input keeps arriving. At the end both stages' output is
    exactly-once, the state counts every message once, and each shard was
    committed by one term at a time."""
    from journal import GazetteClient

    pipe = Pipeline(gazette_prefix, 6, tmp_path)
    rng = random.Random(25)
    with GazetteClient(gazette_cluster.address) as client:
        pipe.create(client)
        group.apply(pipe.specs)
        members = Members(pipe, gazette_cluster.etcd_address, group.prefix,
                          gazette_cluster.address)
        stop = threading.Event()
        try:
            for _ in range(3):
                members.start()
            feeder = feed(client, pipe.sources, rounds=8, each=150, stop=stop)
            for _ in range(5):
                time.sleep(rng.uniform(2.0, 4.0))
                members.kill(rng.choice(sorted(members.procs)))
                members.start()
            feeder.join(120)
            client.flush()
            wait_for("exactly-once output", lambda: pipe.done(client), timeout=120, every=1.0)
            codes = members.stop_all()
            assert set(codes.values()) == {0}, codes
        finally:
            stop.set()
            members.close()
        pipe.check(client)
        moved = [s.id for s in pipe.specs if len(check_terms(pipe.db(s.id))) > 1]
        assert moved, "no shard ever moved between members"
        # Each member settled the collector before it served (settle_collector).
        said = {(int(frozen), int(young)) for name in members.logs
                for frozen, young in re.findall(r"gc: (\d+) frozen, threshold (\d+)\n",
                                                members.log(name))}
        assert said and all(frozen > 0 and young == YOUNG_THRESHOLD
                            for frozen, young in said), said
        # Given up on SIGTERM, or gone with the lease of a member killed last.
        wait_for("no claims left", lambda: not group.view().claims, timeout=2 * TTL + 2)


def test_a_member_paused_past_its_lease_is_fenced_and_rejoins(
        gazette_cluster: Any, gazette_prefix: str, group: ShardGroup, tmp_path: Path) -> None:
    """A member SIGSTOPped in the middle of its transactions for two lease
    TTLs: the other member serves its shards meanwhile (restoring their
    stores fences it off). Resumed, the paused member finds its lease gone,
    stops every shard without committing, and joins again. Nothing is
    committed twice."""
    from journal import GazetteClient

    pipe = Pipeline(gazette_prefix, 2, tmp_path)
    with GazetteClient(gazette_cluster.address) as client:
        pipe.create(client)
        group.apply(pipe.specs)
        # Slow messages, which arrive faster than they are consumed: a
        # transaction is open whenever the member is paused.
        members = Members(pipe, gazette_cluster.etcd_address, group.prefix,
                          gazette_cluster.address, slow=0.01)
        stop = threading.Event()
        try:
            a = members.start()
            wait_for("a serving", lambda: len(group.view().claims) == 4, timeout=30)
            b = members.start()
            wait_for("b holding its share", lambda: sum(
                c.member == b for c in group.view().claims.values()) == 2, timeout=30)
            # A backlog of several seconds for each shard (10 ms a message):
            # paused while it lasts, the member has a transaction open, or
            # opens one as soon as it resumes.
            make_input(client, pipe.sources, 1200, seed=11)
            client.flush()
            feeder = feed(client, pipe.sources, rounds=2, each=100, stop=stop)
            time.sleep(1.0)
            members.kill(a, signal.SIGSTOP)
            wait_for("b serving all", lambda: all(
                c.member == b for c in group.view().claims.values())
                and len(group.view().claims) == 4, timeout=4 * TTL)
            time.sleep(TTL)
            members.kill(a, signal.SIGCONT)
            wait_for("a back in the group", lambda: any(
                c.member == a for c in group.view().claims.values()), timeout=30)
            feeder.join(120)
            client.flush()
            wait_for("exactly-once output", lambda: pipe.done(client), timeout=120, every=1.0)
            codes = members.stop_all()
            assert codes == {a: 0, b: 0}
        finally:
            stop.set()
            members.close()
        # Resumed, it finds its lease expired, its renewal failing for a TTL
        # (a channel that must reconnect), or, when paused with a renewal's
        # answer on its way, its member key gone with the lease.
        said = members.log(a)
        assert any(f"lost its lease ({why}" in said for why in (
            "its lease expired", "no renewal of its lease reached etcd",
            "its member key is gone")), [line for line in said.splitlines() if "lease" in line]
        assert "stopped: fenced off" in members.log(a)
        pipe.check(client)


def test_serve_stuck_in_its_application_stops_at_once_when_asked_again(
        gazette_cluster: Any, gazette_prefix: str, group: ShardGroup, tmp_path: Path) -> None:
    """`exactly serve` whose application hangs in consume_message: SIGTERM
    asks its shards to commit and stop, and it says which one it still
    waits for; a second SIGTERM ends it at once (status 1), its lease given
    back, so that the next member claims the shard now rather than when the
    30 s lease would have expired. The output stays exactly-once."""
    from journal import GazetteClient

    pipe = Pipeline(gazette_prefix, 1, tmp_path)
    with GazetteClient(gazette_cluster.address) as client:
        pipe.create(client)
        group.apply(pipe.specs)
        make_input(client, pipe.sources, 50, seed=5)
        client.flush()
        members = Members(pipe, gazette_cluster.etcd_address, group.prefix,
                          gazette_cluster.address, slow=300)
        members.ttl = 30
        try:
            a = members.start()
            wait_for("a serving", lambda: len(group.view().claims) == 2, timeout=30)
            wait_for("a's first shard in its application", lambda: "gc: " in members.log(a),
                     timeout=30)
            time.sleep(1.0)
            members.kill(a, signal.SIGTERM)
            wait_for("a saying what it waits for",
                     lambda: "still waiting for shards first-0 " in members.log(a), timeout=20)
            assert members.procs[a].poll() is None  # it waits for the shard
            members.kill(a, signal.SIGTERM)
            assert members.procs.pop(a).wait(10) == 1
            assert "stopping now (SIGTERM again): shards first-0 abandon" in members.log(a)
            view = group.view()
            assert not view.members and not view.claims, (view.members, view.claims)
            members.slow = 0.0
            b = members.start()
            wait_for("exactly-once output", lambda: pipe.done(client), timeout=60)
            assert members.stop_all() == {b: 0}
        finally:
            members.close()
        pipe.check(client)


def test_a_joining_member_takes_its_share_and_a_leaving_one_hands_over(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path) -> None:
    """Twelve shards on one member; two more join and each is serving four
    within a bounded time; one leaves and the other two serve six each.
    Shards stop cleanly on each move: the output stays exactly-once."""
    pipe = Pipeline("", 6, tmp_path)
    with LocalJournalStore(tmp_path / "journals") as client:
        pipe.create(client, 600, seed=3)
        group.apply(pipe.specs)
        etcd = gazette_cluster.etcd_address
        first = Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                       member_id="first")
        with first:
            wait_for("first serving 12", lambda: len(first.serving) == 12, timeout=30)
            with Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                        member_id="second") as second, \
                    Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                           member_id="third") as third:
                took = wait_for("an even share", lambda: sorted(
                    len(m.serving) for m in (first, second, third)) == [4, 4, 4], timeout=30)
                assert took < 30
                first.stop()
                wait_for("two members serving 6 each", lambda: sorted(
                    len(m.serving) for m in (second, third)) == [6, 6], timeout=30)
                assert set(second.serving) | set(third.serving) == {s.id for s in pipe.specs}
                client.flush()
                wait_for("exactly-once output", lambda: pipe.done(client), timeout=60)
            for m in (first, second, third):
                assert not m.errors, m.errors
        pipe.check(client)
        assert not group.view().members


def test_a_shard_that_always_fails_does_not_move_healthy_shards(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path) -> None:
    """Two members, three healthy shards and one whose application always
    fails: the failing shard is tried on one member, then the other (each
    waiting its retry period), and the healthy shards stay where the even
    share put them all along; none is handed over to make room for it."""
    pipe = Pipeline("", 2, tmp_path)

    def fail_bad(shard: Shard, env: Any) -> None:
        if shard.id == "first-1":
            raise RuntimeError("a message this shard cannot take")

    with LocalJournalStore(tmp_path / "journals") as client:
        pipe.create(client, 50, seed=8)
        group.apply(pipe.specs)
        etcd = gazette_cluster.etcd_address
        ttl = 2  # a grace of 1 s before an unclaimed shard is anybody's
        members = [Member(client, CountingApp(pipe.store, pipe.routes, on_message=fail_bad),
                          etcd, prefix=group.prefix, lease_ttl=ttl, member_id=name,
                          retry_failed=2.0) for name in ("a", "b")]
        logging.getLogger("consumer").setLevel(logging.CRITICAL)  # (the failures)
        try:
            good = {"first-0", "second-0", "second-1"}
            members[0].start()
            wait_for("a serving the healthy shards", lambda: good <= set(members[0].serving),
                     timeout=30)
            members[1].start()
            wait_for("the healthy shards shared", lambda: sorted(
                len(good & set(m.serving)) for m in members) == [1, 2], timeout=30)
            since = [len(m.history) for m in members]
            wait_for("the bad shard failing on both members", lambda: all(
                any(shard == "first-1" for shard, _ in m.errors) for m in members),
                timeout=30)
            time.sleep(6 * ttl)
            healthy = [(m.id, what, shard) for m, n in zip(members, since, strict=True)
                       for what, shard, _ in list(m.history)[n:] if shard != "first-1"]
            moved = [h for h in healthy if h[1] == "released"]
            assert not moved, healthy
            assert sorted(s for m in members for s in m.serving) == [
                "first-0", "second-0", "second-1"]
        finally:
            for m in members:
                m.stop()
            logging.getLogger("consumer").setLevel(logging.NOTSET)


def test_members_ride_out_an_etcd_restart(gazette_binaries: Any, tmp_path: Path) -> None:
    """etcd SIGKILLed and started again, twice, under two member processes
    serving a chain on a cluster of its own: once for less than a lease TTL
    (the members keep their shards), once for longer (they stop them, join
    again and claim them anew). The output stays exactly-once."""
    from exactly.localcluster import GazetteCluster
    from journal import GazetteClient

    with GazetteCluster(tmp_path / "cluster", brokers=1, binaries=gazette_binaries,
                        etcd_lease=20) as cluster:
        work = tmp_path / "work"
        work.mkdir()
        pipe = Pipeline("", 2, work)
        etcd = EtcdClient(cluster.etcd_address)
        group = ShardGroup(etcd, "/restart")
        with GazetteClient(cluster.address, retry_timeout=120, replication=1) as client:
            pipe.create(client)
            group.apply(pipe.specs)
            members = Members(pipe, cluster.etcd_address, group.prefix, cluster.address)
            stop = threading.Event()
            try:
                a, b = members.start(), members.start()
                wait_for("shards shared", lambda: sorted(
                    c.member for c in group.view().claims.values()) == [a, a, b, b],
                    timeout=30)
                feeder = feed(client, pipe.sources, rounds=8, each=150, stop=stop)
                claims = {s: c.revision for s, c in group.view().claims.items()}
                cluster.restart_etcd(down=0.5)
                time.sleep(2)
                kept = {s: c.revision for s, c in group.view().claims.items()}
                assert kept == claims, "a short restart moved shards"
                cluster.restart_etcd(down=TTL + 2)

                def anew() -> bool:
                    now = {s: c.revision for s, c in group.view().claims.items()}
                    return len(now) == 4 and all(now[s] != claims[s] for s in now)

                wait_for("every shard claimed anew", anew, timeout=30)
                feeder.join(120)
                client.flush()
                wait_for("exactly-once output", lambda: pipe.done(client), timeout=120,
                         every=1.0)
                codes = members.stop_all()
                assert codes == {a: 0, b: 0}
            finally:
                stop.set()
                members.close()
                etcd.close()
            assert "lost its lease" in members.log(a) + members.log(b)
            pipe.check(client)


def test_a_shard_starting_while_etcd_restarts_waits_for_it(
        gazette_binaries: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A shard claimed just before etcd goes down records its store's home
    in etcd while it is down: it waits for etcd and serves on, under the
    same claim, rather than failing (and being left for a retry period)."""
    from exactly.localcluster import GazetteCluster

    caplog.set_level(logging.INFO, "consumer.member")
    pipe = Pipeline("", 1, tmp_path / "work")
    pipe.work.mkdir()
    spec = pipe.specs[0]
    opening = threading.Event()
    opened = threading.Event()

    def new_store(shard: Shard) -> Any:
        opening.set()
        assert opened.wait(60), "never let through"
        return open_store(pipe.store, shard)

    with GazetteCluster(tmp_path / "cluster", brokers=1, binaries=gazette_binaries,
                        etcd_lease=20) as cluster, \
            LocalJournalStore(tmp_path / "journals") as client:
        pipe.create(client, 50, seed=3, messy=False)
        etcd = EtcdClient(cluster.etcd_address)
        try:
            group = ShardGroup(etcd, "/starting")
            group.apply([spec])
            app = CountingApp(new_store, pipe.routes)
            with Member(client, app, cluster.etcd_address, prefix=group.prefix,
                        lease_ttl=TTL) as member:
                assert opening.wait(30), "the shard was never claimed"
                claim = group.view().claims[spec.id].revision
                restart = threading.Thread(target=cluster.restart_etcd, kwargs={"down": 1.0})
                restart.start()
                wait_for("etcd down", lambda: not reachable(etcd), timeout=10, every=0.05)
                opened.set()
                restart.join(60)
                want = expected_output(committed_by_key(client, pipe.sources))
                wait_for("the output", lambda: output_by_key(client, pipe.mids) == want,
                         timeout=30)
                assert list(member.errors) == []
                assert member.serving == (spec.id,)
                assert f"shard {spec.id} waits for etcd" in caplog.text
                assert group.view().claims[spec.id].revision == claim
        finally:
            opened.set()
            etcd.close()


def reachable(etcd: EtcdClient) -> bool:
    try:
        etcd.get("/")
    except EtcdError:
        return False
    return True


def test_a_store_on_another_hosts_disk_is_refused(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path) -> None:
    """A shard whose SQLite store was opened on host "a" is never claimed by
    a member on host "b" (which says why in ``unservable`` and its log), and
    left unclaimed until a member of host "a" serves it."""
    pipe = Pipeline("", 1, tmp_path)
    spec = pipe.specs[0]
    with LocalJournalStore(tmp_path / "journals") as client:
        pipe.create(client, 50, seed=1, messy=False)
        group.apply([spec])
        etcd = gazette_cluster.etcd_address
        with Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                    host="a") as on_a:
            wait_for("a serving", lambda: on_a.serving == (spec.id,), timeout=30)
        assert group.view().homes[spec.id]["host"] == "a"
        with Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                    host="b") as on_b:
            wait_for("b refusing", lambda: spec.id in on_b.unservable, timeout=30)
            assert "host a" in on_b.unservable[spec.id]
            time.sleep(2 * TTL)  # it never claims the shard
            assert on_b.serving == () and not group.view().claims
            # `exactly shards list` says why, as the member's log does.
            listed = subprocess.run(
                [sys.executable, "-m", "exactly", "shards", "list", "--etcd", etcd,
                 "--etcd-prefix", group.prefix], capture_output=True, text=True, timeout=60)
            assert f"{spec.id}  -- not claimed --" in listed.stdout, listed.stderr
            assert "(store on host a: no live member there)" in listed.stdout
            assert ("claimed", spec.id) not in [h[:2] for h in on_b.history]
            # A store opened in the moment between its claim and the check
            # is refused too, before its checkpoint is restored.
            with pytest.raises(StoreElsewhereError, match="PostgresStore"):
                store = pipe.app().new_store(Shard(spec, client))
                try:
                    on_b.check_home(Shard(spec, client), store)
                finally:
                    store.close()
            with Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                        host="a") as again:
                wait_for("a serving again", lambda: again.serving == (spec.id,), timeout=30)


def test_a_stores_home_is_recorded_with_its_absolute_path(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store opened by a relative path is recorded in ``homes/`` by its
    absolute path: what a user on another host reads there names a file."""
    monkeypatch.chdir(tmp_path)
    spec = ShardSpec("s", ["in/p0"])
    with LocalJournalStore(tmp_path / "journals") as client:
        client.create("in/p0", NDJSON)
        group.apply([spec])
        app = CountingApp(lambda shard: SQLiteStore("s.db"), {"s": []})
        with Member(client, app, gazette_cluster.etcd_address, prefix=group.prefix,
                    lease_ttl=TTL) as member:
            wait_for("serving", lambda: member.serving == ("s",), timeout=30)
            wait_for("its home recorded", lambda: "s" in group.view().homes, timeout=30)
        home = group.view().homes["s"]
        assert (home["store"], home["path"]) == ("SQLiteStore", str(tmp_path / "s.db"))


def test_a_changed_or_deleted_spec_is_followed(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path) -> None:
    """A spec applied again with other values restarts its shard with them;
    a deleted one stops being served, and its claim is given up."""
    pipe = Pipeline("", 2, tmp_path)
    with LocalJournalStore(tmp_path / "journals") as client:
        pipe.create(client)
        group.apply(pipe.specs[:1])
        with Member(client, pipe.app(), gazette_cluster.etcd_address, prefix=group.prefix,
                    lease_ttl=TTL) as member:
            wait_for("serving", lambda: member.serving == ("first-0",), timeout=30)
            first = group.view().claims["first-0"].revision
            changed = ShardSpec("first-0", pipe.specs[0].sources, max_txn_duration=0.5)
            assert group.apply([changed]) == {"first-0": "updated"}
            wait_for("claimed anew", lambda: "first-0" in group.view().claims
                     and group.view().claims["first-0"].revision != first, timeout=30)
            assert [h for h in member.history if h[1] == "first-0"][:2] == [
                ("claimed", "first-0", first), ("released", "first-0", first)]
            assert group.delete(["first-0"]) == {"first-0": "deleted"}
            wait_for("stopped", lambda: member.serving == () and not group.view().claims,
                     timeout=30)
            assert not member.errors


def test_a_member_id_in_use_waits_for_its_holder(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path) -> None:
    """A second member given the id of a live one does not take its place
    (which would make both lose their lease in turn): it waits, and joins
    once the first has left."""
    pipe = Pipeline("", 1, tmp_path)
    with LocalJournalStore(tmp_path / "journals") as client:
        pipe.create(client)
        group.apply(pipe.specs)
        etcd = gazette_cluster.etcd_address
        first = Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                       member_id="same")
        second = Member(client, pipe.app(), etcd, prefix=group.prefix, lease_ttl=TTL,
                        member_id="same")
        with first:
            wait_for("first serving", lambda: len(first.serving) == 2, timeout=30)
            lease = first.lease
            with second:
                time.sleep(2 * TTL)
                assert second.lease is None and second.serving == ()
                assert first.lease == lease and len(first.serving) == 2
                first.stop()
                wait_for("second serving", lambda: len(second.serving) == 2, timeout=30)
        assert not first.errors and not second.errors


def test_a_postgres_store_follows_its_shard_to_another_host(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path, postgres_dsn: str) -> None:
    """A shard kept in PostgreSQL is served on host "a", then on host "b"
    (no home is recorded for a store every host reaches); its output and
    state stay exactly-once across the move."""
    from consumer import PostgresStore

    pipe = Pipeline("", 1, tmp_path)
    spec = ShardSpec("count", pipe.sources, max_txn_duration=0.1)
    with LocalJournalStore(tmp_path / "journals") as client:
        pipe.create(client)
        group.apply([spec])
        etcd = gazette_cluster.etcd_address

        def app() -> CountingApp:
            return CountingApp(f"postgres:{postgres_dsn}", {"count": pipe.outputs})

        make_input(client, pipe.sources, 200, seed=7)
        client.flush()
        with Member(client, app(), etcd, prefix=group.prefix, lease_ttl=TTL, host="a") as a:
            wait_for("a serving", lambda: a.serving == ("count",), timeout=30)
            wait_for("a done", lambda: output_by_key(client, pipe.outputs) == expected_output(
                committed_by_key(client, pipe.sources)), timeout=60)
        make_input(client, pipe.sources, 200, seed=8)
        client.flush()
        with Member(client, app(), etcd, prefix=group.prefix, lease_ttl=TTL, host="b") as b:
            wait_for("b serving", lambda: b.serving == ("count",), timeout=30)
            want = committed_by_key(client, pipe.sources)
            wait_for("b done", lambda: output_by_key(client, pipe.outputs) == expected_output(
                want), timeout=60)
            assert not b.errors and not b.unservable
        assert "count" not in group.view().homes
        store = PostgresStore(postgres_dsn)
        try:
            state = CountingState(store)
            store.restore_checkpoint(Shard(spec, client))
            assert state.snapshot() == expected_state(want)
        finally:
            store.close()


_FORGETFUL_MEMBER = """
import sys, time
from journal import LocalJournalStore
from message import JsonDocument
from consumer import Application, JSONFileStore, Member

root, etcd, prefix = sys.argv[1], sys.argv[2], sys.argv[3]


class Count(Application):
    def new_store(self, shard):
        return JSONFileStore(f"{root}/{shard.id}")

    def new_message(self, spec):
        return JsonDocument()

    def consume_message(self, shard, store, envelope, publisher):
        store.state["n"] = store.state.get("n", 0) + 1


member = Member(LocalJournalStore(root + "/journals"), Count(), etcd, prefix=prefix,
                lease_ttl=30, member_id="leaver")
member.start()
deadline = time.monotonic() + 60
while len(member.serving) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print("serving", member.serving, flush=True)
# exits, the member still serving
"""


def test_a_member_left_serving_at_exit_leaves_the_group(
        gazette_cluster: Any, group: ShardGroup, tmp_path: Path) -> None:
    """A program that exits while its Member serves: the member stops its
    shards and leaves the group then, so its claims are gone at once, not
    when its lease (30 s here) expires, and nothing is reported as failed."""
    with LocalJournalStore(tmp_path / "journals") as client:
        for name in ("in/a", "in/b"):
            client.create(name, NDJSON)
    group.apply([ShardSpec("a", ["in/a"]), ShardSpec("b", ["in/b"])])
    r = subprocess.run(
        [sys.executable, "-c", _FORGETFUL_MEMBER, str(tmp_path), gazette_cluster.etcd_address,
         group.prefix],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=120)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    assert r.stdout.decode().startswith("serving ('a', 'b')"), r.stdout.decode()
    view = group.view()
    assert not view.members and not view.claims, (view.members, view.claims)
