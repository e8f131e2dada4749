"""TransactionPipeline: transactions committed in the background, in order,
as producers taking turns; a prefix of what ended commits, whatever fails
or is killed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import orjson
import pytest

from journal import LocalJournalStore, MemoryJournalClient
from message import (
    Flags,
    IntentLog,
    JsonDocument,
    ReadCommittedIter,
    ReadUncommittedIter,
    TransactionAbortedError,
    TransactionPipeline,
    get_flags,
    get_producer_id,
    modulo_mapping,
)
from tests.message.test_publisher import FailingAppends

NDJSON = {"content-type": "application/x-ndjson"}
PARTS = [f"out/part-{i}" for i in range(3)]


def new_doc(_spec: object) -> JsonDocument:
    return JsonDocument()


def create_parts(client) -> list:
    return [client.create(name, NDJSON) for name in PARTS]


def mapping_over(specs):
    return modulo_mapping(lambda doc: f"{doc['t']}/{doc['i']}", lambda: specs)


def committed(client) -> dict[str, list[tuple[int, int]]]:
    """Per journal, the (transaction, index) of each committed data message."""
    out = {}
    for name in PARTS:
        out[name] = [
            (env.message["t"], env.message["i"])
            for env in ReadCommittedIter(client, name, new_doc)
            if get_flags(env.message.get_uuid()) != Flags.ACK_TXN
        ]
    return out


def all_of(per_journal: dict[str, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    return [p for msgs in per_journal.values() for p in msgs]


def size_of(t: int) -> int:
    return 1 + (t * 37) % 90


@pytest.fixture
def client():
    with MemoryJournalClient() as c:
        yield c


def test_transactions_commit_whole_and_in_order_as_producers_taking_turns(client) -> None:
    specs = create_parts(client)
    mapping = mapping_over(specs)
    futures = []
    with TransactionPipeline(client, in_flight=3) as pipeline:
        for t in range(60):
            with pipeline.transaction() as txn:
                for i in range(size_of(t)):
                    txn.publish(mapping, JsonDocument(t=t, i=i))
            futures.append(txn.committed)
        producers = set(pipeline.producer_ids)
    assert all(f.done() and f.exception() is None for f in futures)
    assert all(f.result() for f in futures)  # the ACK intents written
    got = committed(client)
    everything = sorted(p for msgs in got.values() for p in msgs)
    assert everything == [(t, i) for t in range(60) for i in range(size_of(t))]
    for msgs in got.values():  # each journal: transaction after transaction
        assert [t for t, _ in msgs] == sorted(t for t, _ in msgs)
    assert len(producers) == 3
    used = {
        get_producer_id(env.message.get_uuid())
        for name in PARTS for env in ReadUncommittedIter(client, name, new_doc)
    }
    assert used == producers


def test_an_aborted_transaction_is_rolled_back_and_the_next_commit(client) -> None:
    mapping = mapping_over(create_parts(client))
    with TransactionPipeline(client, in_flight=2) as pipeline:
        with pipeline.transaction() as first:
            first.publish(mapping, JsonDocument(t=0, i=0))
        with pytest.raises(ValueError), pipeline.transaction() as aborted:
            for i in range(5):
                aborted.publish(mapping, JsonDocument(t=1, i=i))
            raise ValueError("declined")
        explicit = pipeline.transaction()
        explicit.publish(mapping, JsonDocument(t=2, i=0))
        explicit.abort()
        for t in (3, 4, 5):  # the aborting producers take their turns again
            with pipeline.transaction() as txn:
                txn.publish(mapping, JsonDocument(t=t, i=0))
    with pytest.raises(TransactionAbortedError):
        aborted.committed.result()
    with pytest.raises(TransactionAbortedError):
        explicit.committed.result()
    got = committed(client)
    assert sorted(p for msgs in got.values() for p in msgs) == [(0, 0), (3, 0), (4, 0), (5, 0)]
    for name in PARTS:  # nobody waits for the aborted ones
        it = ReadCommittedIter(client, name, new_doc)
        list(it)
        assert not it.sequencer.has_pending({})


def test_a_failed_commit_rolls_back_it_and_every_transaction_after_it(client) -> None:
    specs = create_parts(client)
    flaky = FailingAppends(client, PARTS[1])
    to = {name: (lambda n: lambda _m: (n, "application/x-ndjson"))(name) for name in PARTS}
    pipeline = TransactionPipeline(flaky, in_flight=3)
    txns = []
    for t in range(8):
        txn = pipeline.transaction()
        txn.publish(to[PARTS[0]], JsonDocument(t=t, i=0))
        flaky.failing = t == 4
        txn.publish(to[PARTS[1]], JsonDocument(t=t, i=1))
        flaky.failing = False
        txn.publish(to[PARTS[2]], JsonDocument(t=t, i=2))
        txn.commit()
        txns.append(txn)
        if t == 3:
            pipeline.flush()  # 0-3 are committed before 4 ends
    with pytest.raises(TransactionAbortedError) as stopped:
        pipeline.close()
    assert isinstance(stopped.value.__cause__, OSError)
    for txn in txns[:4]:
        assert txn.committed.result()
    with pytest.raises(OSError):
        txns[4].committed.result()
    for txn in txns[5:]:  # ended after the one that failed: rolled back
        with pytest.raises(TransactionAbortedError) as after:
            txn.committed.result()
        assert isinstance(after.value.__cause__, OSError)
    got = committed(client)
    assert sorted(t for msgs in got.values() for t, _ in msgs) == sorted(
        t for t in range(4) for _ in range(3))
    for name in PARTS:
        it = ReadCommittedIter(client, name, new_doc)
        list(it)
        assert not it.sequencer.has_pending({}), name
    with pytest.raises(RuntimeError, match="closed"):
        pipeline.transaction()
    assert specs


def is_ack(frame: bytes) -> bool:
    """True if ``frame`` (an NDJSON document) is an ACK."""
    return get_flags(JsonDocument(orjson.loads(frame)).get_uuid()) == Flags.ACK_TXN


class FailingAcks:
    """A client whose first ACK append to ``journal`` fails (in its future)."""

    def __init__(self, inner, journal: str) -> None:
        self.inner, self.journal, self.failed = inner, journal, 0

    def append(self, name: str, data: bytes):
        if is_ack(data) and name == self.journal and not self.failed:
            self.failed += 1
            f: Future = Future()
            f.set_exception(OSError(5, "Input/output error"))
            return f
        return self.inner.append(name, data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_an_ack_that_failed_stays_in_the_log_until_recovered(tmp_path: Path) -> None:
    """The transaction is decided once its intents are saved: an ACK that
    could not be appended stays in the log through later saves, the
    pipeline stops, and recovery commits the transaction whole."""
    with LocalJournalStore(tmp_path / "store") as store:
        mapping = mapping_over(create_parts(store))
        log = IntentLog(tmp_path / "intents")
        flaky = FailingAcks(store, PARTS[1])
        pipeline = TransactionPipeline(flaky, log, in_flight=2)
        with pipeline.transaction() as first:
            for i in range(30):
                first.publish(mapping, JsonDocument(t=0, i=i))
        with pytest.raises(OSError):
            first.committed.result(timeout=30)
        with pytest.raises(TransactionAbortedError):
            pipeline.close()
        assert flaky.failed == 1
        assert {i.journal for i in log.load()} >= {PARTS[1]}
        # Visible where its ACK landed only (not whole) until recovered.
        assert sorted(all_of(committed(store))) == [
            (0, i) for i in range(30) if mapping(JsonDocument(t=0, i=i))[0] != PARTS[1]]
        held = len(log.load())
        assert held and log.recover(store) == held
        assert sorted(all_of(committed(store))) == [(0, i) for i in range(30)]


class HeldAcks:
    """A client that holds the ACK appends to ``journal`` until ``release``."""

    def __init__(self, inner, journal: str) -> None:
        self.inner, self.journal, self.held = inner, journal, []

    def append(self, name: str, data: bytes):
        if is_ack(data) and name == self.journal:
            f: Future = Future()
            self.held.append((f, data))
            return f
        return self.inner.append(name, data)

    def release(self) -> None:
        for f, data in self.held:
            f.set_result(self.inner.append(self.journal, data).result())

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_each_save_keeps_the_intents_of_commits_not_yet_durable(tmp_path: Path) -> None:
    """While a transaction's ACK is not durable, every later save still
    holds its intent: a crash then loses no decided commit."""
    with LocalJournalStore(tmp_path / "store") as store:
        create_parts(store)
        log = IntentLog(tmp_path / "intents")
        held = HeldAcks(store, PARTS[1])
        to = {name: (lambda n: lambda _m: (n, "application/x-ndjson"))(name) for name in PARTS}
        with TransactionPipeline(held, log, in_flight=2) as pipeline:
            try:
                with pipeline.transaction() as first:
                    first.publish(to[PARTS[1]], JsonDocument(t=0, i=0))
                with pipeline.transaction() as second:
                    second.publish(to[PARTS[0]], JsonDocument(t=1, i=0))
                second.committed.result(timeout=30)  # its ACK durable; the first's held
                assert not first.committed.done()
                saved = {(i.journal, i.intent) for i in log.load()}
                assert (PARTS[1], held.held[0][1]) in saved
                assert {j for j, _ in saved} == {PARTS[0], PARTS[1]}
            finally:
                held.release()
        assert first.committed.result() and log.load() == []


def test_a_pipeline_that_failed_takes_no_more_transactions(client) -> None:
    create_parts(client)
    flaky = FailingAppends(client, PARTS[0])
    with pytest.raises(TransactionAbortedError), TransactionPipeline(flaky) as pipeline:
        txn = pipeline.transaction()
        flaky.failing = True
        txn.publish(lambda _m: (PARTS[0], "application/x-ndjson"), JsonDocument(t=0, i=0))
        txn.commit()
        with pytest.raises(OSError):
            txn.committed.result(timeout=30)
        with pytest.raises(TransactionAbortedError, match="takes no more"):
            pipeline.transaction()


def test_misuse_is_a_clear_error(client) -> None:
    mapping = mapping_over(create_parts(client))
    with pytest.raises(ValueError, match="in_flight"):
        TransactionPipeline(client, in_flight=0)
    with TransactionPipeline(client, in_flight=2) as pipeline:
        a, b = pipeline.transaction(), pipeline.transaction()
        with pytest.raises(RuntimeError, match="still open"):
            pipeline.transaction()
        publish = a.publish  # bound in the transaction, called after it
        publish(mapping, JsonDocument(t=0, i=0))
        a.commit()
        b.abort()
        for late in (a.publish, publish, b.publish):
            with pytest.raises(RuntimeError, match="already committed or aborted"):
                late(mapping, JsonDocument(t=0, i=1))
        with pytest.raises(RuntimeError, match="already committed or aborted"):
            b.commit()
    assert all_of(committed(client)) == [(0, 0)]


def test_a_transaction_left_open_is_rolled_back_by_close(client) -> None:
    mapping = mapping_over(create_parts(client))
    with TransactionPipeline(client) as pipeline:
        with pipeline.transaction() as done:
            done.publish(mapping, JsonDocument(t=0, i=0))
        left = pipeline.transaction()
        left.publish(mapping, JsonDocument(t=1, i=0))
    with pytest.raises(TransactionAbortedError):
        left.committed.result(timeout=30)
    with pytest.raises(RuntimeError, match="already committed or aborted"):
        left.commit()
    assert all_of(committed(client)) == [(0, 0)]
    for name in PARTS:  # nobody waits for the one rolled back
        it = ReadCommittedIter(client, name, new_doc)
        list(it)
        assert not it.sequencer.has_pending({})


def test_the_log_is_cleared_once_every_commit_is_durable(tmp_path: Path) -> None:
    with LocalJournalStore(tmp_path / "store") as store:
        mapping = mapping_over(create_parts(store))
        log = IntentLog(tmp_path / "intents")
        saves: list[int] = []
        save = log.save
        log.save = lambda intents: (saves.append(len(intents)), save(intents))[1]  # type: ignore[method-assign]
        with TransactionPipeline(store, log) as pipeline:
            for t in range(30):
                with pipeline.transaction() as txn:
                    for i in range(size_of(t)):
                        txn.publish(mapping, JsonDocument(t=t, i=i))
        assert saves and log.load() == []
        assert log.path.read_bytes().startswith(IntentLog.CLEARED)
        assert len(all_of(committed(store))) == sum(map(size_of, range(30)))


FORGETFUL = textwrap.dedent("""
    import sys
    from journal import LocalJournalStore
    from message import JsonDocument, TransactionPipeline

    store = LocalJournalStore(sys.argv[1])
    pipeline = TransactionPipeline(store)
    for t in range(20):
        with pipeline.transaction() as txn:
            for i in range(1 + (t * 37) % 90):
                txn.publish(lambda d: ("out/part-0", "application/x-ndjson"),
                            JsonDocument(t=t, i=i))
    # exits without closing the pipeline or the store
""")


@pytest.mark.parametrize("log", [False, True], ids=["no log", "IntentLog"])
def test_a_pipeline_left_open_at_exit_commits_what_ended(tmp_path: Path, log: bool) -> None:
    """Also with an IntentLog: its file must still be open when the
    pipeline's exit handler saves the last intents (the log's descriptor
    used to be closed by then, and the last transactions were lost)."""
    with LocalJournalStore(tmp_path) as store:
        create_parts(store)
    script = FORGETFUL
    if log:
        script = script.replace(
            "TransactionPipeline(store)",
            "TransactionPipeline(store, IntentLog(sys.argv[1] + '/intents.bin'))",
        ).replace("import JsonDocument,", "import IntentLog, JsonDocument,")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    with LocalJournalStore(tmp_path) as store:
        assert sorted(all_of(committed(store))) == [
            (t, i) for t in range(20) for i in range(size_of(t))]
    if log:
        assert IntentLog(tmp_path / "intents.bin").load() == []  # cleared by the last flush


FORKING = textwrap.dedent("""
    import os, sys, time
    from journal import LocalJournalStore
    from message import JsonDocument, TransactionPipeline

    to = lambda d: ("out/part-0", "application/x-ndjson")
    store = LocalJournalStore(sys.argv[1])
    pipeline = TransactionPipeline(store)
    with pipeline.transaction() as txn:
        txn.publish(to, JsonDocument(t=0, i=0))
    pid = os.fork()
    if pid == 0:
        for call in (pipeline.transaction, pipeline.flush, pipeline.close):
            try:
                call()
            except RuntimeError as exc:
                print("child:", exc, flush=True)
        sys.exit(0)  # a normal exit: its exit handlers must not wait for the parent's committer
    deadline = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            sys.exit("the child hung at exit")
        time.sleep(0.05)
    with pipeline.transaction() as txn:
        txn.publish(to, JsonDocument(t=1, i=0))
    pipeline.close()
    store.close()
""")


def test_a_pipeline_copied_by_fork_is_refused_in_the_child(tmp_path: Path) -> None:
    """In a child made by fork the parent's pipeline raises at once (its
    committer thread is not there) and the child exits without waiting for
    it; the parent's pipeline goes on."""
    with LocalJournalStore(tmp_path) as store:
        create_parts(store)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", FORKING, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all("made before a fork" in line for line in lines), lines
    with LocalJournalStore(tmp_path) as store:
        assert sorted(all_of(committed(store))) == [(0, 0), (1, 0)]


PRODUCER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from journal import LocalJournalStore
    from message import IntentLog, JsonDocument, TransactionPipeline, modulo_mapping

    root, run = Path(sys.argv[1]), int(sys.argv[2])
    with LocalJournalStore(root / "store") as store:
        log = IntentLog(root / "intents")
        log.recover(store)
        specs = [store.get(f"out/part-{i}") for i in range(3)]
        mapping = modulo_mapping(lambda d: f"{d['t']}/{d['i']}", lambda: specs)
        with TransactionPipeline(store, log, in_flight=3) as pipeline:
            t = 0
            while True:
                with pipeline.transaction() as txn:
                    for i in range(1 + (t * 37) % 90):
                        txn.publish(mapping, JsonDocument(t=run * 1_000_000 + t, i=i))
                t += 1
                if t == 5:
                    pipeline.flush()
                    print("started", flush=True)
""")


@pytest.mark.slow
def test_producers_killed_at_random_leave_a_prefix_of_whole_transactions(
    tmp_path: Path,
) -> None:
    """SIGKILLed at random moments, then recovered from the log: every
    transaction is read whole or not at all, exactly once, and those of a
    run that are read are its first ones, in order."""
    with LocalJournalStore(tmp_path / "store") as store:
        create_parts(store)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    rng = random.Random(7)
    runs = 12
    for run in range(runs):
        proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(tmp_path), str(run)],
                                stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "started\n"
            time.sleep(rng.uniform(0.0, 0.25))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
    with LocalJournalStore(tmp_path / "store") as store:
        IntentLog(tmp_path / "intents").recover(store)
        got = committed(store)
    seen = [p for msgs in got.values() for p in msgs]
    assert len(seen) == len(set(seen)), "a message was read twice"
    by_txn: dict[int, set[int]] = {}
    for t, i in seen:
        by_txn.setdefault(t, set()).add(i)
    for t, indexes in by_txn.items():
        assert indexes == set(range(size_of(t % 1_000_000))), f"transaction {t} is not whole"
    for run in range(runs):
        ts = sorted(t % 1_000_000 for t in by_txn if t // 1_000_000 == run)
        assert ts == list(range(len(ts))) and len(ts) >= 5, (run, ts[:10])
    for msgs in got.values():
        assert [t for t, _ in msgs] == sorted(t for t, _ in msgs)


def test_futures_can_be_waited_on_from_another_thread(client) -> None:
    mapping = mapping_over(create_parts(client))
    results: list[object] = []
    with TransactionPipeline(client) as pipeline:
        txn = pipeline.transaction()
        txn.publish(mapping, JsonDocument(t=0, i=0))
        waiter = threading.Thread(target=lambda: results.append(txn.committed.result(30)))
        waiter.start()
        txn.commit()
        waiter.join(30)
    assert len(results) == 1 and results[0]
