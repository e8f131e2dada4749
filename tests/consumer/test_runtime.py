"""The consumer runtime in one process: the transaction lifecycle of
docs/consumer.md, held to the counting application's expected outcome (see
tests/consumer_support.py)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from consumer import (
    Application,
    FencedError,
    JSONFileStore,
    PreparedCommit,
    Runner,
    Shard,
    ShardSpec,
    SQLiteStore,
    Store,
)
from journal import JournalError, JournalNotFoundError, LocalJournalStore, MemoryJournalClient
from message import (
    IMPLEMENTATION,
    Checkpoint,
    Envelope,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    modulo_mapping,
)
from tests.consumer_support import (
    NDJSON,
    CountingApp,
    committed_by_key,
    committed_state,
    expected_output,
    expected_state,
    make_input,
    new_doc,
    output_by_key,
)

SOURCES = ["in/part-0", "in/part-1"]
OUTPUTS = ["out/part-0", "out/part-1"]


@pytest.fixture
def journals(tmp_path: Path) -> Any:
    with LocalJournalStore(tmp_path / "journals") as store:
        for name in SOURCES + OUTPUTS:
            store.create(name, NDJSON)
        yield store


def store_kind(kind: str, tmp_path: Path) -> str:
    return {"json": f"json:{tmp_path}/state-{{shard}}",
            "sqlite": f"sqlite:{tmp_path}/state-{{shard}}.db"}[kind]


def check_outcome(journals: Any, kind: str, spec: ShardSpec,
                  sources: list[str] = SOURCES, outputs: list[str] = OUTPUTS) -> None:
    want = committed_by_key(journals, sources)
    assert output_by_key(journals, outputs) == expected_output(want)
    assert committed_state(kind, Shard(spec, journals)) == expected_state(want)


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_messy_input_is_processed_exactly_once(journals: Any, tmp_path: Path, kind: str) -> None:
    """Duplicates, roll-backs and abandoned transactions in; each committed
    message counted once and its output committed once, in order."""
    make_input(journals, SOURCES, 600, seed=1)
    kind = store_kind(kind, tmp_path)
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=0.02)
    app = CountingApp(kind, {"count": OUTPUTS})
    with Runner(journals, app, [spec]) as runner:
        runner.run_until_idle(timeout=60)
    check_outcome(journals, kind, spec)
    # ACKs are not handed to the application; nothing was consumed twice.
    assert app.consumed == sum(len(v) for v in committed_by_key(journals, SOURCES).values())
    assert app.begun == app.finalized >= 1


def test_postgres_store_processes_exactly_once(journals: Any, postgres_dsn: str) -> None:
    """The same on a real PostgreSQL server."""
    make_input(journals, SOURCES, 400, seed=2)
    kind = f"postgres:{postgres_dsn}"
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=0.02)
    with Runner(journals, CountingApp(kind, {"count": OUTPUTS}), [spec]) as runner:
        runner.run_until_idle(timeout=60)
    check_outcome(journals, kind, spec)


def test_runs_on_the_in_memory_client(tmp_path: Path) -> None:
    """Any JournalClient serves: here the in-memory one."""
    client = MemoryJournalClient()
    for name in SOURCES + OUTPUTS:
        client.create(name, NDJSON)
    make_input(client, SOURCES, 200, seed=3)
    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES)
    with Runner(client, CountingApp(kind, {"count": OUTPUTS}), [spec]) as runner:
        runner.run_until_idle(timeout=60)
    check_outcome(client, kind, spec)


def test_run_until_idle_again_processes_what_came_since(journals: Any, tmp_path: Path) -> None:
    """run_until_idle may be called again: the shards go on serving."""
    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES)
    with Runner(journals, CountingApp(kind, {"count": OUTPUTS}), [spec]) as runner:
        make_input(journals, SOURCES, 100, seed=4, messy=False)
        runner.run_until_idle(timeout=60)
        assert sum(len(v) for v in output_by_key(journals, OUTPUTS).values()) == 100
        make_input(journals, SOURCES, 50, seed=5)
        runner.run_until_idle(timeout=60)
    check_outcome(journals, kind, spec)


def test_a_chain_of_shards_in_one_runner_drains(journals: Any, tmp_path: Path) -> None:
    """The output of one shard is the source of another: run_until_idle
    returns once both have drained, and the chain is exactly-once."""
    mids = ["mid/part-0", "mid/part-1"]
    for name in mids:
        journals.create(name, NDJSON)
    make_input(journals, SOURCES, 300, seed=6)
    kind = store_kind("sqlite", tmp_path)
    first = ShardSpec("first", sources=SOURCES, max_txn_duration=0.01)
    second = ShardSpec("second", sources=mids, max_txn_duration=0.01)
    app = CountingApp(kind, {"first": mids, "second": OUTPUTS})
    with Runner(journals, app, [second, first]) as runner:
        runner.run_until_idle(timeout=60)
    want = committed_by_key(journals, SOURCES)
    assert output_by_key(journals, mids) == expected_output(want)
    assert output_by_key(journals, OUTPUTS) == expected_output(want)
    assert committed_state(kind, Shard(second, journals)) == expected_state(want)


def test_transactions_end_after_max_txn_duration(journals: Any, tmp_path: Path) -> None:
    """A transaction stops consuming once max_txn_duration has passed."""
    make_input(journals, SOURCES, 12, seed=7, messy=False)
    app = CountingApp(store_kind("json", tmp_path), {"count": OUTPUTS},
                      on_message=lambda shard, env: time.sleep(0.05))
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=0.12)
    with Runner(journals, app, [spec]) as runner:
        runner.run_until_idle(timeout=60)
    assert app.consumed == 12
    assert 3 <= app.finalized <= 6  # about three messages a transaction


def test_min_txn_duration_gathers_messages_into_one_transaction(
        journals: Any, tmp_path: Path) -> None:
    """With no message ready, a transaction waits for min_txn_duration: what
    comes meanwhile joins it."""
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=10.0, min_txn_duration=1.0)
    app = CountingApp(store_kind("json", tmp_path), {"count": OUTPUTS})
    specs = [journals.get(s) for s in SOURCES]
    mapping = modulo_mapping(lambda d: d["k"], lambda: specs)
    pub = Publisher(journals)
    with Runner(journals, app, [spec]) as runner:
        runner.start()
        for n in range(5):
            pub.publish_committed(mapping, JsonDocument(k=f"k{n}", n=n)).result()
            time.sleep(0.1)
        runner.run_until_idle(timeout=30)
    assert app.consumed == 5 and app.finalized == 1


def test_max_txn_duration_bounds_a_longer_min_txn_duration(
        journals: Any, tmp_path: Path) -> None:
    """A min_txn_duration above max_txn_duration is allowed (as in Gazette),
    and never holds a transaction past max_txn_duration."""
    spec = ShardSpec("count", sources=SOURCES, min_txn_duration=3600)
    assert spec.max_txn_duration == 1.0
    app = CountingApp(store_kind("json", tmp_path), {"count": OUTPUTS})
    specs = [journals.get(s) for s in SOURCES]
    mapping = modulo_mapping(lambda d: d["k"], lambda: specs)
    Publisher(journals).publish_committed(mapping, JsonDocument(k="k0", n=0))
    with Runner(journals, app, [spec]) as runner:
        runner.run_until_idle(timeout=30)
    assert app.consumed == 1 and app.finalized == 1
    assert runner_outputs(journals) == 1


def test_transaction_ends_when_nothing_is_ready(journals: Any, tmp_path: Path) -> None:
    """With min_txn_duration 0, a transaction ends as soon as no message is
    ready: messages published one at a time commit one at a time."""
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=10.0)
    app = CountingApp(store_kind("json", tmp_path), {"count": OUTPUTS})
    specs = [journals.get(s) for s in SOURCES]
    mapping = modulo_mapping(lambda d: d["k"], lambda: specs)
    pub = Publisher(journals)
    with Runner(journals, app, [spec]) as runner:
        for n in range(3):
            pub.publish_committed(mapping, JsonDocument(k="k", n=n)).result()
            runner.run_until_idle(timeout=30)
            assert app.finalized == n + 1
            assert output_by_key(journals, OUTPUTS)["k"][-1] == (n, n + 1)


def test_acks_are_appended_only_after_the_commit(journals: Any, tmp_path: Path) -> None:
    """When a transaction commits, none of its output is visible yet (only
    that of the transactions before it); its checkpoint holds the ACK
    intents of the journals it wrote, and the offsets read through."""
    make_input(journals, SOURCES, 200, seed=8, messy=False)
    commits: list[tuple[int, int, Checkpoint]] = []

    class Spy(JSONFileStore):
        def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None:
            visible = sum(len(v) for v in output_by_key(journals, OUTPUTS).values())
            commits.append((visible, app.consumed, checkpoint))
            super().start_commit(shard, checkpoint)

    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=0.02)
    app = CountingApp(lambda shard: Spy(tmp_path / "spy"), {"count": OUTPUTS},
                      on_message=lambda shard, env: time.sleep(0.001))
    with Runner(journals, app, [spec]) as runner:
        runner.run_until_idle(timeout=60)
    assert len(commits) == app.finalized >= 2
    consumed_before = 0
    for visible, consumed, cp in commits:
        assert visible == consumed_before  # the earlier transactions' output only
        consumed_before = consumed
        assert cp.ack_intents and set(cp.ack_intents) <= set(OUTPUTS)
        assert set(SOURCES) <= set(cp.offsets)
    assert commits[-1][2].offsets == {s: journals.head(s) for s in SOURCES}
    assert sum(len(v) for v in output_by_key(journals, OUTPUTS).values()) == 200


class CrashError(Exception):
    """Stands for the death of the process at a chosen point."""


def test_a_crash_after_the_commit_is_finished_by_the_next_start(
        journals: Any, tmp_path: Path) -> None:
    """Committed but its ACKs never appended: the next start appends the
    checkpoint's intents again, and nothing is repeated."""
    make_input(journals, SOURCES, 100, seed=9, messy=False)
    kind = store_kind("json", tmp_path)

    class DiesAfterCommit(JSONFileStore):
        def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None:
            super().start_commit(shard, checkpoint)
            raise CrashError("after the commit, before the ACKs")

    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=30)
    app = CountingApp(lambda shard: DiesAfterCommit(f"{tmp_path}/state-count"),
                      {"count": OUTPUTS})
    # The application's store is the application's: its exception is raised
    # as it is.
    with pytest.raises(CrashError), Runner(journals, app, [spec]) as runner:
        runner.run_until_idle(timeout=60)
    assert output_by_key(journals, OUTPUTS) == {}  # committed, not yet acknowledged
    with Runner(journals, CountingApp(kind, {"count": OUTPUTS}), [spec]) as runner:
        runner.run_until_idle(timeout=60)
    check_outcome(journals, kind, spec)


def test_an_application_error_stops_the_shard_and_commits_nothing(
        journals: Any, tmp_path: Path) -> None:
    """An exception of consume_message is raised as it is; the transaction's
    output is rolled back, its state not committed; a restart redoes it."""
    make_input(journals, SOURCES, 100, seed=10, messy=False)
    kind = store_kind("sqlite", tmp_path)

    class BoomError(ValueError):
        pass

    def fail_at_60(shard: Shard, env: Envelope) -> None:
        if env.message["n"] == 60:
            raise BoomError("bad message 60")

    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=30)
    app = CountingApp(kind, {"count": OUTPUTS}, on_message=fail_at_60)
    runner = Runner(journals, app, [spec])
    with pytest.raises(BoomError, match="bad message 60") as first:
        runner.run_until_idle(timeout=60)
    # The shard stays stopped: each later call raises its exception again,
    # at once, rather than waiting for a shard that cannot become idle.
    for _ in range(2):
        with pytest.raises(BoomError) as again:
            runner.run_until_idle(timeout=5)
        assert again.value is first.value
    runner.stop()  # raised already: stop() does not raise it again
    assert app.finalized == 0 and output_by_key(journals, OUTPUTS) == {}
    assert committed_state(kind, Shard(spec, journals)) == ({}, 0)
    # The output of the failed transaction was rolled back: no span stays open.
    for name in OUTPUTS:
        with ReadCommittedIter(journals, name, lambda s: JsonDocument()) as it:
            list(it)
            assert not it.sequencer.has_pending({})
    with Runner(journals, CountingApp(kind, {"count": OUTPUTS}), [spec]) as runner:
        runner.run_until_idle(timeout=60)
    check_outcome(journals, kind, spec)


def test_a_failed_shard_starts_afresh_after_stop(journals: Any, tmp_path: Path) -> None:
    """After stop(), run_until_idle starts the shards again from their
    stores: a shard that failed on a transient error goes on, and the
    outcome is exactly-once; the other shard served meanwhile."""
    make_input(journals, SOURCES, 120, seed=14)
    mids = ["mid/part-0", "mid/part-1"]
    for name in mids:
        journals.create(name, NDJSON)
    kind = store_kind("json", tmp_path)
    flaky = {"fail": True}

    def fail_once_at_70(shard: Shard, env: Envelope) -> None:
        if shard.id == "second" and env.message["n"] == 70 and flaky["fail"]:
            raise ConnectionError("the service is down")

    first = ShardSpec("first", sources=SOURCES, max_txn_duration=0.01)
    second = ShardSpec("second", sources=mids, max_txn_duration=0.01)
    app = CountingApp(kind, {"first": mids, "second": OUTPUTS}, on_message=fail_once_at_70)
    with Runner(journals, app, [first, second]) as runner:
        with pytest.raises(ConnectionError):
            runner.run_until_idle(timeout=60)
        with pytest.raises(ConnectionError):
            runner.run_until_idle(timeout=60)
        runner.stop()
        flaky["fail"] = False
        runner.run_until_idle(timeout=60)
    want = committed_by_key(journals, SOURCES)
    assert output_by_key(journals, mids) == expected_output(want)
    assert output_by_key(journals, OUTPUTS) == expected_output(want)
    assert committed_state(kind, Shard(second, journals)) == expected_state(want)


def test_run_until_idle_reads_what_was_appended_before_it(
        journals: Any, tmp_path: Path) -> None:
    """Messages published before run_until_idle, their appends not waited
    for, are read by it: it waits for the client's appends issued so far."""
    specs = [journals.get(s) for s in SOURCES]
    mapping = modulo_mapping(lambda d: d["k"], lambda: specs)
    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES)
    with Runner(journals, CountingApp(kind, {"count": OUTPUTS}), [spec]) as runner:
        runner.run_until_idle(timeout=60)  # serving, idle
        pub = Publisher(journals)
        for round_ in range(20):
            for n in range(round_ * 100, (round_ + 1) * 100):
                pub.publish_committed(mapping, JsonDocument(k=f"k{n % 23}", n=n))
            runner.run_until_idle(timeout=60)
            assert runner_outputs(journals) == (round_ + 1) * 100
    check_outcome(journals, kind, spec)


def runner_outputs(client: Any) -> int:
    return sum(len(v) for v in output_by_key(client, OUTPUTS).values())


def test_a_restored_store_fences_off_the_running_instance(
        journals: Any, tmp_path: Path) -> None:
    """Another instance restoring the store makes the running one's next
    commit raise FencedError (as it is); its transaction does not commit."""
    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES)
    make_input(journals, SOURCES, 50, seed=11, messy=False)
    app = CountingApp(kind, {"count": OUTPUTS})
    runner = Runner(journals, app, [spec])
    runner.run_until_idle(timeout=60)
    newer = JSONFileStore(f"{tmp_path}/state-count")
    newer.restore_checkpoint(Shard(spec, journals))
    make_input(journals, SOURCES, 20, seed=12, messy=False)
    with pytest.raises(FencedError):
        runner.run_until_idle(timeout=60)
    runner.stop()
    assert sum(len(v) for v in output_by_key(journals, OUTPUTS).values()) == 50


class PreparingSpy(JSONFileStore):
    """A JSONFileStore that records its prepare_commit, the commit() or
    abort() of each, and its start_commit (defining both, it keeps the
    runtime committing through prepare_commit)."""

    def __init__(self, path: Path, events: list[Any], visible: Any) -> None:
        super().__init__(path)
        self.events = events
        self.visible = visible

    def prepare_commit(self, shard: Shard, checkpoint: Checkpoint) -> PreparedCommit:
        prepared = super().prepare_commit(shard, checkpoint)
        self.events.append("prepare")
        events, visible = self.events, self.visible

        class Recorded:
            def commit(self) -> None:
                events.append(("commit", visible()))
                prepared.commit()

            def abort(self) -> None:
                events.append("abort")
                prepared.abort()

        return Recorded()

    def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None:
        self.events.append("start_commit")
        super().start_commit(shard, checkpoint)


class LateAppends:
    """The journal client, whose appends each reach it 5 ms late, in order
    (a slow disk or broker): an append is written only well after it was
    made, and its future resolves once it is."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queue: queue.Queue[tuple[float, str, bytes, Future[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def append(self, name: str, data: bytes) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((time.monotonic() + 0.005, name, data, future))
        return future

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            due, name, data, future = item
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                future.set_result(self._client.append(name, data).result())
            except Exception as exc:
                future.set_exception(exc)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_store_that_prepares_commits_after_the_appends_and_before_the_acks(
        journals: Any, tmp_path: Path) -> None:
    """A store with prepare_commit is prepared at each transaction's end and
    committed once its appends are written, before its ACKs: at each commit
    every message published so far is in the journals, and only the earlier
    transactions' output is visible. (In line, on the Python
    implementation, start_commit does both steps.)"""
    make_input(journals, SOURCES, 200, seed=8, messy=False)
    events: list[Any] = []

    def visible() -> tuple[int, int, int]:
        """(messages written, of them committed, messages consumed)."""
        written = 0
        for name in OUTPUTS:
            with ReadUncommittedIter(journals, name, new_doc) as it:
                written += sum(1 for env in it if "k" in env.message)
        committed = sum(len(v) for v in output_by_key(journals, OUTPUTS).values())
        return written, committed, app.consumed

    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=0.02)
    app = CountingApp(lambda shard: PreparingSpy(tmp_path / "spy", events, visible),
                      {"count": OUTPUTS}, on_message=lambda shard, env: time.sleep(0.001))
    late = LateAppends(journals)
    try:
        with Runner(late, app, [spec]) as runner:
            runner.run_until_idle(timeout=60)
    finally:
        late.close()
    in_line = IMPLEMENTATION == "python"
    steps = [e for e in events if e != "start_commit"]
    assert app.finalized >= 2 and steps[0::2] == ["prepare"] * app.finalized
    assert [e[0] for e in steps[1::2]] == ["commit"] * app.finalized
    assert events.count("start_commit") == (app.finalized if in_line else 0)
    before = 0  # consumed by the transactions committed before
    for _, (written, committed, consumed) in steps[1::2]:
        assert written == consumed and committed == before
        before = consumed
    assert visible()[:2] == (200, 200)
    check_outcome(journals, f"json:{tmp_path}/spy", spec)


class FailingAppends:
    """The journal client, whose appends to ``outputs`` fail from the
    ``after``-th on (a disk that filled, a broker that refused)."""

    def __init__(self, client: Any, outputs: list[str], after: int) -> None:
        self._client = client
        self._outputs = outputs
        self._left = after

    def append(self, name: str, data: bytes) -> Future[Any]:
        if name in self._outputs:
            self._left -= 1
            if self._left < 0:
                failed: Future[Any] = Future()
                failed.set_exception(JournalError(f"{name}: no space left on device"))
                return failed
        return self._client.append(name, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_an_append_that_fails_before_the_commit_commits_nothing(
        journals: Any, tmp_path: Path) -> None:
    """An append of the transaction that fails stops the shard with that
    error, before its commit: what the store prepared is dropped (no file
    left), the last commit stands, and a new start finishes the work."""
    make_input(journals, SOURCES, 300, seed=9, messy=False)
    events: list[Any] = []
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=0.02)
    app = CountingApp(lambda shard: PreparingSpy(tmp_path / "spy", events, lambda: 0),
                      {"count": OUTPUTS}, on_message=lambda shard, env: time.sleep(0.0005))
    with pytest.raises(JournalError, match="no space left"), \
            Runner(FailingAppends(journals, OUTPUTS, 150), app, [spec]) as runner:
        runner.run_until_idle(timeout=60)
    commits = sum(1 for e in events if isinstance(e, tuple))
    assert 1 <= commits < app.finalized
    # Prepared while the appends were still being made, then dropped (in
    # line, on the Python implementation, nothing follows the last commit).
    in_line = IMPLEMENTATION == "python"
    assert isinstance(events[-1], tuple) if in_line else events[-1] == "abort"
    assert not [p for p in (tmp_path / "spy").iterdir() if p.name.startswith(".tmp")]
    restored = JSONFileStore(tmp_path / "spy")
    restored.restore_checkpoint(Shard(spec, journals))
    assert sum(restored.state["counts"].values()) < 300
    app = CountingApp(lambda shard: JSONFileStore(tmp_path / "spy"), {"count": OUTPUTS})
    with Runner(journals, app, [spec]) as runner:
        runner.run_until_idle(timeout=60)
    check_outcome(journals, f"json:{tmp_path}/spy", spec)


def test_stop_commits_the_open_transaction(journals: Any, tmp_path: Path) -> None:
    """stop() ends the open transaction with a commit, and returns once its
    ACKs are appended."""
    make_input(journals, SOURCES, 40, seed=13, messy=False)
    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=3600, min_txn_duration=3600)
    app = CountingApp(kind, {"count": OUTPUTS})
    runner = Runner(journals, app, [spec])
    runner.start()
    deadline = time.monotonic() + 30
    while app.consumed < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert app.consumed == 40 and app.finalized == 0  # all in one open transaction
    runner.stop()
    assert app.finalized == 1
    check_outcome(journals, kind, spec)


def test_each_start_publishes_as_a_new_producer(journals: Any, tmp_path: Path) -> None:
    """A fresh producer ID for each start of a shard."""
    ids: list[bytes] = []

    class App(CountingApp):
        def finalize_txn(self, shard: Shard, store: Store, publisher: Publisher) -> None:
            super().finalize_txn(shard, store, publisher)
            ids.append(publisher.producer_id)

    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES)
    for seed in (14, 15):
        make_input(journals, SOURCES, 10, seed=seed, messy=False)
        with Runner(journals, App(kind, {"count": OUTPUTS}), [spec]) as runner:
            runner.run_until_idle(timeout=60)
    assert len(set(ids)) == 2


def test_a_long_upstream_transaction_is_replayed(journals: Any, tmp_path: Path) -> None:
    """An upstream transaction longer than the Sequencer's ring, interleaved
    with other producers, is replayed from the journal when its ACK comes,
    and a transaction that ends in the middle of it resumes exactly."""
    specs = [journals.get(s) for s in SOURCES]
    only_first = modulo_mapping(lambda d: "x", lambda: specs[:1])
    big, other = Publisher(journals), Publisher(journals)
    n = 0
    for i in range(6000):
        big.publish_uncommitted(only_first, JsonDocument(k="big", n=n))
        n += 1
        if i % 100 == 0:
            other.publish_committed(only_first, JsonDocument(k="other", n=n))
            n += 1
    for intent in big.build_ack_intents():
        journals.append(intent.journal, intent.intent).result()
    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=0.002)
    stopping: list[threading.Thread] = []

    def stop_midway(shard: Shard, env: Envelope) -> None:
        if app.consumed == 3000:
            stopper = threading.Thread(target=runner.stop)
            stopper.start()
            stopping.append(stopper)

    app = CountingApp(kind, {"count": OUTPUTS}, on_message=stop_midway)
    runner = Runner(journals, app, [spec])
    runner.start()
    deadline = time.monotonic() + 60
    while not stopping and time.monotonic() < deadline:
        time.sleep(0.01)
    stopping[0].join(60)
    assert 3000 < app.consumed < n  # stopped inside the big transaction
    with Runner(journals, CountingApp(kind, {"count": OUTPUTS}), [spec]) as again:
        again.run_until_idle(timeout=60)
    check_outcome(journals, kind, spec)


def test_a_source_that_ends_before_the_checkpoint_is_waited_for(
        journals: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A source journal that says it ends before the checkpoint's offset (as
    a Gazette broker that has not caught up after a failover says) does not
    stop the shard: it warns, waits, and reads on from the checkpoint's
    offset once the journal reaches it."""
    kind = store_kind("json", tmp_path)
    spec = ShardSpec("count", sources=SOURCES)
    make_input(journals, SOURCES, 100, seed=8, messy=False)
    with Runner(journals, CountingApp(kind, {"count": OUTPUTS}), [spec]) as runner:
        runner.run_until_idle(timeout=60)
    _, total = committed_state(kind, Shard(spec, journals))
    end = journals.head("in/part-0")
    journals.delete("in/part-0")
    journals.create("in/part-0", NDJSON)
    app = CountingApp(kind, {"count": OUTPUTS})
    with caplog.at_level("WARNING", logger="message"), Runner(journals, app, [spec]) as runner:
        runner.run_until_idle(timeout=60)
        assert any(f"journal in/part-0 ends at 0, before offset {end}" in r.getMessage()
                   for r in caplog.records)
        # The journal grows past the checkpoint: what follows it is read
        # (the bytes before it never are).
        journals.append("in/part-0", b"?" * (end - 1) + b"\n").result()
        publisher = Publisher(journals)
        mapping = modulo_mapping(lambda d: d["k"], lambda: [journals.get("in/part-0")])
        for n in range(1, 21):
            publisher.publish_committed(mapping, JsonDocument(k=f"late{n % 3}", n=n))
        journals.flush()
        runner.run_until_idle(timeout=60)
    counts_after, total_after = committed_state(kind, Shard(spec, journals))
    assert total_after == total + sum(range(1, 21))
    assert {k: counts_after[k] for k in ("late0", "late1", "late2")} == {
        "late0": 6, "late1": 7, "late2": 7}


def test_a_missing_source_journal_is_raised(journals: Any, tmp_path: Path) -> None:
    """A source that does not exist stops the shard with JournalNotFoundError."""
    spec = ShardSpec("count", sources=["in/nope"])
    with pytest.raises(JournalNotFoundError), Runner(
            journals, CountingApp(store_kind("json", tmp_path), {"count": OUTPUTS}),
            [spec]) as runner:
        runner.run_until_idle(timeout=30)


def test_run_until_idle_times_out(journals: Any, tmp_path: Path) -> None:
    """Past its timeout, run_until_idle raises TimeoutError; stop() then
    still commits what was consumed."""
    make_input(journals, SOURCES, 3, seed=16, messy=False)
    gate = threading.Event()
    app = CountingApp(store_kind("json", tmp_path), {"count": OUTPUTS},
                      on_message=lambda shard, env: gate.wait(30))
    with Runner(journals, app, [ShardSpec("count", sources=SOURCES)]) as runner:
        with pytest.raises(TimeoutError, match="not idle"):
            runner.run_until_idle(timeout=0.3)
        gate.set()
        runner.run_until_idle(timeout=30)
    assert app.consumed == 3


def test_bad_arguments_are_refused() -> None:
    """Runner refuses what is not a shard spec, twice the same id, an object
    that is no application."""
    client = MemoryJournalClient()
    app = CountingApp("json:x", {})
    with pytest.raises(TypeError, match="ShardSpec"):
        Runner(client, app, ["in"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unique"):
        Runner(client, app, [ShardSpec("a", ["x"]), ShardSpec("a", ["y"])])
    with pytest.raises(TypeError, match="no new_store"):
        Runner(client, object(), [ShardSpec("a", ["x"])])  # type: ignore[arg-type]


def test_application_must_define_its_methods() -> None:
    """An Application subclass without the required methods cannot be made."""

    class Incomplete(Application):
        def new_store(self, shard: Shard) -> Store:
            return SQLiteStore(":memory:")

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


@pytest.mark.parametrize("bad", [
    {"id": "", "sources": ["a"]},
    {"id": "has space", "sources": ["a"]},
    {"id": "a", "sources": "in/a"},
    {"id": "a", "sources": []},
    {"id": "a", "sources": ["a", "a"]},
    {"id": "a", "sources": ["/abs"]},
    {"id": "a", "sources": ["a"], "max_txn_duration": 0},
    {"id": "a", "sources": ["a"], "max_txn_duration": float("inf")},
    {"id": "a", "sources": ["a"], "min_txn_duration": -1},
    {"id": "a", "sources": ["a"], "max_txn_duration": True},
])
def test_shard_spec_refuses_bad_values(bad: dict[str, Any]) -> None:
    """Bad shard specs raise ValueError, naming what is wrong."""
    with pytest.raises(ValueError):
        ShardSpec(**bad)


def test_shard_spec_keeps_sources_as_a_tuple() -> None:
    """A list of sources is kept as a tuple; defaults are those of the contract."""
    spec = ShardSpec("a/b", sources=["x", "y"])
    assert spec.sources == ("x", "y") and isinstance(spec.sources, tuple)
    assert spec.max_txn_duration == 1.0 and spec.min_txn_duration == 0.0
    assert hash(spec) == hash(ShardSpec("a/b", ("x", "y")))
    shard = Shard(spec, MemoryJournalClient())
    assert shard.id == "a/b" and shard.spec is spec


_FORGETFUL_RUNNER = """
import sys, time
from journal import LocalJournalStore
from message import JsonDocument, modulo_mapping
from consumer import Application, JSONFileStore, Runner, ShardSpec

root, wait = sys.argv[1], sys.argv[2]
store = LocalJournalStore(root + "/journals")
out = store.get("out")
to_out = modulo_mapping(lambda d: "k", lambda: [out])


class Copy(Application):
    def new_store(self, shard):
        return JSONFileStore(root + "/state")

    def new_message(self, spec):
        return JsonDocument()

    def consume_message(self, shard, store, envelope, publisher):
        store.state["n"] = store.state.get("n", 0) + 1
        publisher.publish_uncommitted(to_out, JsonDocument(n=envelope.message["n"]))


runner = Runner(store, Copy(), [ShardSpec("copy", sources=["in"], max_txn_duration=60)])
if wait == "idle":
    runner.run_until_idle(timeout=60)  # (it goes on serving)
    time.sleep(0.2)
else:  # in its first transaction (of up to 60 s), publishing
    runner.start()
    deadline = time.monotonic() + 60
    while store.head("out") < 100_000 and time.monotonic() < deadline:
        time.sleep(0.01)
# exits, the runner still serving
"""


@pytest.mark.parametrize("wait", ["busy", "idle"], ids=["in a transaction", "idle"])
def test_a_runner_left_serving_at_exit_commits_and_stops(tmp_path: Path, wait: str) -> None:
    """A program that exits while its Runner serves: the shard commits its
    open transaction and stops before the journal clients close under it,
    so nothing is left pending downstream and no error is reported (an
    idle shard's reader used to end with 'was the journal client
    closed?', and an open transaction was abandoned)."""
    import json
    import os
    import subprocess
    import sys

    n = 30_000
    with LocalJournalStore(tmp_path / "journals") as store:
        src = store.create("in", NDJSON)
        store.create("out", NDJSON)
        pub = Publisher(store)
        to_in = modulo_mapping(lambda d: "k", lambda: [src])
        for i in range(n):
            pub.publish_committed(to_in, JsonDocument(n=i))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", _FORGETFUL_RUNNER, str(tmp_path), wait],
                       env=env, capture_output=True, timeout=120)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    with LocalJournalStore(tmp_path / "journals") as store:
        def data(it: Any) -> list[int]:
            return [e.message["n"] for e in it if "n" in e.message]

        committed = data(ReadCommittedIter(store, "out", lambda _s: JsonDocument()))
        written = data(ReadUncommittedIter(store, "out", lambda _s: JsonDocument()))
    saved = json.loads(max((tmp_path / "state").iterdir()).read_bytes())
    assert committed == written == list(range(len(committed)))  # none pending
    assert committed and saved["state"] == {"n": len(committed)}
    if wait == "idle":
        assert len(committed) == n


_FORKING_RUNNER = _FORGETFUL_RUNNER.split("runner = Runner")[0] + """
import os
from message import Publisher
runner = Runner(store, Copy(), [ShardSpec("copy", sources=["in"], max_txn_duration=0.01)])
runner.run_until_idle(timeout=60)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit of the child: the parent's shards are not its own
_, status = os.waitpid(pid, 0)
to_in = modulo_mapping(lambda d: "k", lambda: [store.get("in")])
pub = Publisher(store)
for i in range(1000, 2000):
    pub.publish_committed(to_in, JsonDocument(n=i))
store.flush()
runner.run_until_idle(timeout=60)
runner.stop()
print(os.waitstatus_to_exitcode(status))
"""


def test_a_child_made_by_fork_leaves_the_parents_shards_alone(tmp_path: Path) -> None:
    """A child forked from a process whose runner serves exits at once and
    quietly (it neither stops nor waits for shards whose threads are the
    parent's), and the parent's runner goes on."""
    import os
    import subprocess
    import sys

    with LocalJournalStore(tmp_path / "journals") as store:
        src = store.create("in", NDJSON)
        store.create("out", NDJSON)
        pub = Publisher(store)
        to_in = modulo_mapping(lambda d: "k", lambda: [src])
        for i in range(1000):
            pub.publish_committed(to_in, JsonDocument(n=i))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", _FORKING_RUNNER, str(tmp_path), "fork"],
                       env=env, capture_output=True, timeout=120)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    assert r.stdout.decode().split() == ["0"]
    with LocalJournalStore(tmp_path / "journals") as store:
        out = [e.message["n"] for e in ReadCommittedIter(store, "out", lambda _s: JsonDocument())
               if "n" in e.message]
    assert out == list(range(2000))


def test_a_shard_stuck_at_exit_does_not_hold_the_exit(tmp_path: Path) -> None:
    """A shard whose application never returns: at exit it is asked to stop,
    and given 10 s, after which the process exits anyway, saying so; its
    transaction is abandoned (nothing committed, read again next start)."""
    import os
    import subprocess
    import sys

    with LocalJournalStore(tmp_path / "journals") as store:
        src = store.create("in", NDJSON)
        store.create("out", NDJSON)
        Publisher(store).publish_committed(modulo_mapping(lambda d: "k", lambda: [src]),
                                           JsonDocument(n=0))
    script = _FORGETFUL_RUNNER.replace(
        "        store.state[\"n\"] =",
        "        open(root + '/stuck', 'w').close()\n"
        "        time.sleep(3600)\n"
        "        store.state[\"n\"] =",
    ).replace('while store.head("out") < 100_000',
              'while not __import__("os").path.exists(root + "/stuck")')
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    began = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path), "busy"],
                       env=env, capture_output=True, timeout=120)
    took = time.monotonic() - began
    assert r.returncode == 0 and 9 < took < 60, (took, r.stderr.decode())
    assert b"shard copy did not stop within 10 s" in r.stderr, r.stderr.decode()
    with LocalJournalStore(tmp_path / "journals") as store:
        assert list(ReadUncommittedIter(store, "out", lambda _s: JsonDocument())) == []


def test_a_store_of_ones_own_raising_fenced_error_stops_the_shard(
        journals: Any, tmp_path: Path) -> None:
    """A store written by the user (the Store protocol, duck-typed) that
    raises FencedError("...") from start_commit: run_until_idle raises that
    very error, and nothing the transaction published is committed."""
    fenced = FencedError("another instance restored")

    class FencingStore:
        def restore_checkpoint(self, shard: Shard) -> Checkpoint:
            return Checkpoint()

        def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None:
            raise fenced

        def close(self) -> None:
            pass

    class Forward(Application):
        def new_store(self, shard: Shard) -> Store:
            return FencingStore()

        def new_message(self, spec: Any) -> JsonDocument:
            return JsonDocument()

        def consume_message(self, shard: Shard, store: Any, env: Envelope, pub: Any) -> None:
            pub.publish_uncommitted(to_outputs, JsonDocument(k=env.message["k"], n=0, seen=0))

    to_outputs = modulo_mapping(lambda d: d["k"], lambda: [journals.get(o) for o in OUTPUTS])
    make_input(journals, SOURCES, 20, seed=5, messy=False)
    with Runner(journals, Forward(), [ShardSpec("fwd", sources=SOURCES)]) as runner:
        with pytest.raises(FencedError) as raised:
            runner.run_until_idle(timeout=60)
        assert raised.value is fenced
    assert output_by_key(journals, OUTPUTS) == {}
    published = sum(1 for o in OUTPUTS for _ in ReadUncommittedIter(journals, o, new_doc))
    assert published >= 20  # published, and never committed


def test_an_application_not_made_from_application_may_leave_out_the_hooks(
        journals: Any, tmp_path: Path) -> None:
    """An application with the three required methods and no begin_txn or
    finalize_txn (not a subclass of Application) runs: the hooks do nothing."""

    class Bare:  # (not an Application)
        def __init__(self) -> None:
            self.seen = 0

        def new_store(self, shard: Shard) -> Store:
            return JSONFileStore(tmp_path / "bare")

        def new_message(self, spec: Any) -> JsonDocument:
            return JsonDocument()

        def consume_message(self, shard: Shard, store: Any, env: Envelope, pub: Any) -> None:
            self.seen += 1

    make_input(journals, SOURCES, 30, seed=6, messy=False)
    app = Bare()
    with Runner(journals, app, [ShardSpec("bare", sources=SOURCES)]) as runner:  # type: ignore[arg-type]
        runner.run_until_idle(timeout=60)
    assert app.seen == 30
