"""The consumer runtime through real faults: consumer processes SIGKILLed at
random and at exact points of a transaction, a zombie stopped with SIGSTOP
and resumed after a new process restored its store, chains of shards, and
brokers of a Gazette cluster SIGKILLed under a chain. After each, the
committed output and state are those of exactly-once processing
(tests/consumer_support.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from consumer import ShardSpec
from journal import LocalJournalStore
from tests.consumer_support import (
    NDJSON,
    committed_by_key,
    committed_state,
    expected_output,
    expected_state,
    make_input,
    output_by_key,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["in/part-0", "in/part-1"]
MIDS = ["mid/part-0", "mid/part-1"]
OUTPUTS = ["out/part-0", "out/part-1"]

pytestmark = pytest.mark.slow


def start_child(config: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.consumer_child", json.dumps(config)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def finish(child: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    try:
        out, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
        raise AssertionError(f"the consumer did not finish in {timeout}s:\n{out}") from None
    return child.returncode, out


def wait_line(child: subprocess.Popen[str], prefix: str, timeout: float = 60) -> list[str]:
    """Read the child's output until a line starts with ``prefix``."""
    assert child.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            raise AssertionError(f"the consumer ended before {prefix!r}:\n{''.join(seen)}")
        seen.append(line)
        if line.startswith(prefix):
            return seen
    raise AssertionError(f"no {prefix!r} within {timeout}s:\n{''.join(seen)}")


def store_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "json":
        return f"json:{tmp_path}/state/{{shard}}"
    if kind == "sqlite":
        return f"sqlite:{tmp_path}/{{shard}}.db"
    dsn = request.getfixturevalue("postgres_dsn")
    return f"postgres:{dsn}"


def one_shard(root: Path, store: str, **extra: Any) -> dict[str, Any]:
    return {"root": str(root), "store": store,
            "shards": [{"id": "count", "sources": SOURCES, "outputs": OUTPUTS,
                        "max_txn": 0.02}], **extra}


def check(client: Any, store: str, sources: list[str] = SOURCES,
          outputs: list[str] = OUTPUTS, shard: str = "count") -> None:
    from consumer import Shard

    want = committed_by_key(client, sources)
    assert want, "no input"
    assert output_by_key(client, outputs) == expected_output(want)
    spec = ShardSpec(shard, sources=sources)
    assert committed_state(store, Shard(spec, client)) == expected_state(want)


def kill_at_random(config: dict[str, Any], seed: int, kills: int,
                   between: Any = None) -> int:
    """Run the consumer, SIGKILL it after a random moment, ``kills`` times
    (calling ``between(i)`` after each), then let it finish. Returns how
    many runs were killed."""
    rng = random.Random(seed)
    killed = 0
    for i in range(kills):
        child = start_child(config)
        time.sleep(rng.uniform(0.2, 0.9))
        if child.poll() is None:
            child.kill()
            killed += 1
        child.communicate()
        if between is not None:
            between(i)
    rc, out = finish(start_child(config))
    assert rc == 0, out
    return killed


@pytest.mark.parametrize("kind", ["json", "sqlite", "postgres"])
def test_random_sigkills_keep_exactly_once(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A consumer SIGKILLed at random, restarted each time, over thousands of
    messages (duplicates, roll-backs, abandoned transactions among them,
    more arriving between kills): nothing lost, nothing repeated."""
    root = tmp_path / "journals"
    with LocalJournalStore(root) as client:
        for name in SOURCES + OUTPUTS:
            client.create(name, NDJSON)
        make_input(client, SOURCES, 1500, seed=1)
        store = store_of(kind, tmp_path, request)

        def more(i: int) -> None:
            make_input(client, SOURCES, 300, seed=100 + i)

        config = one_shard(root, store, slow=0.001)
        killed = kill_at_random(config, seed=7, kills=9, between=more)
        assert killed >= 6
        check(client, store)


@pytest.mark.parametrize("point", ["after-publish", "after-commit", "between-acks"])
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_kill_at_exact_points_of_a_transaction(
        point: str, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """SIGKILL after publishing and before the commit; after the commit and
    before the ACKs; between two ACK appends. The next start finishes (or
    rolls back) the transaction: exactly-once all the same."""
    root = tmp_path / "journals"
    with LocalJournalStore(root) as client:
        for name in SOURCES + OUTPUTS:
            client.create(name, NDJSON)
        make_input(client, SOURCES, 600, seed=2, messy=False)
        store = store_of(kind, tmp_path, request)
        config = one_shard(root, store, slow=0.001, kill={"point": point, "at": 3})
        rc, out = finish(start_child(config))
        assert rc == -signal.SIGKILL, out
        consumed = [int(line.split()[-1]) for line in out.splitlines()
                    if line.startswith("committed")]
        assert len(consumed) == (2 if point == "after-publish" else 3), out
        visible = sum(len(v) for v in output_by_key(client, OUTPUTS).values())
        if point == "between-acks":
            # One of the two ACKs of the third transaction was written.
            assert consumed[1] < visible < consumed[2], out
        else:
            # The third transaction's output is not visible: its ACKs were never
            # written (after-commit) or it never committed (after-publish).
            assert visible == consumed[1], out
        rc, out = finish(start_child(one_shard(root, store)))
        assert rc == 0, out
        check(client, store)
        assert sum(len(v) for v in output_by_key(client, OUTPUTS).values()) == 600


@pytest.mark.parametrize("kind", ["json", "sqlite", "postgres"])
def test_a_zombie_is_fenced_off(kind: str, tmp_path: Path,
                                request: pytest.FixtureRequest) -> None:
    """Two processes on one shard: the first, stopped with SIGSTOP mid-work,
    is resumed once the second has restored the store; the first is fenced
    off at its next commit, and the outcome is exactly-once.

    (It is resumed before the second finishes: stopped, it may hold the
    embedded store's lock of an output journal mid-append, which every
    other writer of that journal waits for.)"""
    root = tmp_path / "journals"
    with LocalJournalStore(root) as client:
        for name in SOURCES + OUTPUTS:
            client.create(name, NDJSON)
        make_input(client, SOURCES, 400, seed=3)
        store = store_of(kind, tmp_path, request)
        old = start_child(one_shard(root, store, slow=0.01))
        try:
            wait_line(old, "committed count 2")
            os.kill(old.pid, signal.SIGSTOP)  # a zombie: it believes it serves the shard
            new = start_child(one_shard(root, store))
            wait_line(new, "restored count")
        finally:
            os.kill(old.pid, signal.SIGCONT)
        rc, out = finish(old)
        assert rc == 3 and "fenced" in out, out
        rc, out = finish(new)
        assert rc == 0, out
        check(client, store)  # the zombie committed nothing, published nothing visible


def test_a_chain_killed_at_random_is_exactly_once(tmp_path: Path) -> None:
    """Two shards in a chain (input -> mid -> output) in one process,
    SIGKILLed at random: the chain's output is exactly-once end to end."""
    root = tmp_path / "journals"
    store = f"json:{tmp_path}/state/{{shard}}"
    with LocalJournalStore(root) as client:
        for name in SOURCES + MIDS + OUTPUTS:
            client.create(name, NDJSON)
        make_input(client, SOURCES, 2500, seed=4)
        config = {"root": str(root), "store": store, "slow": 0.001, "shards": [
            {"id": "first", "sources": SOURCES, "outputs": MIDS, "max_txn": 0.02},
            {"id": "second", "sources": MIDS, "outputs": OUTPUTS, "max_txn": 0.02}]}
        assert kill_at_random(config, seed=8, kills=8) >= 4
        want = committed_by_key(client, SOURCES)
        assert output_by_key(client, MIDS) == expected_output(want)
        assert output_by_key(client, OUTPUTS) == expected_output(want)
        check(client, store, MIDS, OUTPUTS, shard="second")


def settle(client: Any, journals: list[str], heads: dict[str, int],
           timeout: float = 120.0) -> None:
    """Wait until each journal's brokers index all of it: its fragments
    cover it from 0 to its write head without a hole, and the write head
    is at least ``heads`` says."""
    deadline = time.monotonic() + timeout
    for name in journals:
        while True:
            head = client.head(name)
            end = 0
            for f in client.fragments(name):
                if f.begin > end:
                    break
                end = max(end, f.end)
            if end >= head >= heads.get(name, 0):
                break
            assert time.monotonic() < deadline, (
                f"{name}: indexed to {end}, head {head}, want {heads.get(name, 0)}")
            time.sleep(0.2)


def test_a_chain_on_a_gazette_cluster_survives_a_broker_sigkill(
        gazette_cluster: Any, gazette_prefix: str, tmp_path: Path) -> None:
    """The same chain on a Gazette cluster (journals replicated on two of
    three brokers), its consumer SIGKILLed at random while a broker is
    SIGKILLed and started again: exactly-once end to end."""
    from journal import GazetteClient

    p = gazette_prefix
    sources, mids, outputs = ([f"{p}{kind}/part-{i}" for i in range(2)]
                              for kind in ("in", "mid", "out"))
    store = f"json:{tmp_path}/state/{{shard}}"
    # Brokers list the fragment store every second: a broker that takes a
    # journal over knows its fragments persisted since soon.
    with GazetteClient(gazette_cluster.address, replication=2, retry_timeout=120,
                       refresh_interval=1.0) as client:
        journals = sources + mids + outputs
        for name in journals:
            client.create(name, NDJSON)
        make_input(client, sources, 800, seed=5)
        heads = {name: client.head(name) for name in sources}
        config = {"broker": gazette_cluster.address, "store": store, "shards": [
            {"id": "first", "sources": sources, "outputs": mids, "max_txn": 0.05},
            {"id": "second", "sources": mids, "outputs": outputs, "max_txn": 0.05}]}
        victim = 1

        def fault(i: int) -> None:
            if i == 1:
                gazette_cluster.kill_broker(victim)
            if i == 3:
                gazette_cluster.start_broker(victim)
            if i == 4:
                settle(client, journals, heads)

        try:
            kill_at_random(config, seed=9, kills=5, between=fault)
        finally:
            gazette_cluster.ensure_brokers()
        # Until the brokers that took journals over list what the others
        # persisted, a journal reads shorter than it is (Gazette's reads
        # of those offsets wait, and non-blocking ones end early): the last
        # run may have stopped, idle, before the end. Let it run once more.
        settle(client, journals, heads)
        rc, out = finish(start_child(config))
        assert rc == 0, out
        settle(client, journals, heads)
        want = committed_by_key(client, sources)
        assert output_by_key(client, mids) == expected_output(want)
        assert output_by_key(client, outputs) == expected_output(want)
        check(client, store, mids, outputs, shard="second")
