"""The Publisher, transactions and durable ACK intents (ports of Gazette's
publisher_test.go, plus roll-back and recovery)."""

from __future__ import annotations

import base64
import functools
import threading
import uuid
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field

import orjson
import pytest

from journal import AppendResult, JournalSpec, MemoryJournalClient
from message import (
    AckIntent,
    Clock,
    EmptyPartitionsError,
    Flags,
    IntentLog,
    IntentLogError,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Transaction,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    modulo_mapping,
)

NDJSON = {"content-type": "application/x-ndjson"}


@dataclass
class Doc:
    """A dataclass message with a validation hook."""

    s: str = ""
    uuid: uuid.UUID = field(default_factory=lambda: uuid.UUID(int=0))
    fail: bool = False

    def get_uuid(self) -> uuid.UUID:
        return self.uuid

    def set_uuid(self, u: uuid.UUID) -> None:
        self.uuid = u

    def new_acknowledgement(self, journal: str) -> Doc:
        return Doc()

    def validate(self) -> None:
        if self.fail:
            raise ValueError("whoops!")


def to(journal: str):
    return lambda _msg: (journal, "application/x-ndjson")


def read_all(client, journal: str) -> list[Doc]:
    return [e.message for e in ReadUncommittedIter(client, journal, lambda _s: Doc())]


@pytest.fixture
def client():
    with MemoryJournalClient() as c:
        for name in ("a/journal", "journal/one", "journal/two", "journal/three"):
            c.create(name, NDJSON)
        yield c


def test_publish_committed_stamps_increasing_outside_txn_clocks(client) -> None:
    """publish_committed ticks the given clock once per message, stamps
    OUTSIDE_TXN, and returns a Future of the frame's AppendResult; it leaves
    nothing for build_ack_intents."""
    clock = Clock()
    pub = Publisher(client, clock)
    results = []
    for s in ("hello", "world", "beer!"):
        fut = pub.publish_committed(to("a/journal"), Doc(s))
        assert isinstance(fut, Future)
        results.append(fut.result())
    assert clock.value == 3
    assert read_all(client, "a/journal") == [
        Doc("hello", build_uuid(pub.producer_id, 1, Flags.OUTSIDE_TXN)),
        Doc("world", build_uuid(pub.producer_id, 2, Flags.OUTSIDE_TXN)),
        Doc("beer!", build_uuid(pub.producer_id, 3, Flags.OUTSIDE_TXN)),
    ]
    envs = list(ReadUncommittedIter(client, "a/journal", lambda _s: Doc()))
    assert all(isinstance(r, AppendResult) and r.journal == "a/journal" for r in results)
    assert [(r.begin, r.end) for r in results] == [(e.begin, e.end) for e in envs]
    assert pub.build_ack_intents() == []


class InvalidError(Exception):
    pass


@dataclass
class Validated(Doc):
    def validate(self) -> None:
        if self.fail:
            raise InvalidError("bad message")


def test_validation_error_propagates_before_mapping(client) -> None:
    """A message's validate() is called first, by both publish methods; its
    error propagates unchanged, before mapping runs, and nothing is appended."""
    clock = Clock()
    pub = Publisher(client, clock)

    def mapping(_msg: object) -> tuple[str, str]:
        raise AssertionError("mapping must not be called")

    with pytest.raises(ValueError, match="whoops!"):
        pub.publish_committed(mapping, Doc(fail=True))
    for publish in (pub.publish_committed, pub.publish_uncommitted):
        with pytest.raises(InvalidError) as info:
            publish(mapping, Validated(fail=True))
        assert type(info.value) is InvalidError and str(info.value) == "bad message"
    assert client.head("a/journal") == 0 and clock.value == 0
    assert pub.build_ack_intents() == []
    pub.publish_committed(to("a/journal"), Validated("fine")).result()
    assert client.head("a/journal") > 0


def test_publish_uncommitted_and_ack_intents(client) -> None:
    """ACK intents come per journal in first-publish order, one per journal however
    many messages went to it, as AckIntent(journal, bytes), with fresh clocks."""
    pub = Publisher(client, Clock())
    pub.publish_uncommitted(to("journal/one"), Doc("value one"))
    pub.publish_uncommitted(to("journal/two"), Doc("value two"))
    assert isinstance(pub.publish_uncommitted(to("journal/one"), Doc("value 1b")).result(),
                      AppendResult)
    intents = pub.build_ack_intents()
    assert isinstance(intents, list) and all(isinstance(i, AckIntent) for i in intents)
    assert all(type(i.intent) is bytes for i in intents)
    assert [i.journal for i in intents] == ["journal/one", "journal/two"]
    for i in intents:
        client.append(i.journal, i.intent).result()
    pub.publish_uncommitted(to("journal/three"), Doc("value three"))
    pub.publish_uncommitted(to("journal/one"), Doc("value four"))
    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == ["journal/three", "journal/one"]
    for i in intents:
        client.append(i.journal, i.intent).result()
    assert pub.build_ack_intents() == []

    p = pub.producer_id
    assert read_all(client, "journal/one") == [
        Doc("value one", build_uuid(p, 1, Flags.CONTINUE_TXN)),
        Doc("value 1b", build_uuid(p, 3, Flags.CONTINUE_TXN)),
        Doc("", build_uuid(p, 4, Flags.ACK_TXN)),
        Doc("value four", build_uuid(p, 7, Flags.CONTINUE_TXN)),
        Doc("", build_uuid(p, 9, Flags.ACK_TXN)),
    ]
    assert read_all(client, "journal/two") == [
        Doc("value two", build_uuid(p, 2, Flags.CONTINUE_TXN)),
        Doc("", build_uuid(p, 5, Flags.ACK_TXN)),
    ]
    assert read_all(client, "journal/three") == [
        Doc("value three", build_uuid(p, 6, Flags.CONTINUE_TXN)),
        Doc("", build_uuid(p, 8, Flags.ACK_TXN)),
    ]


def _doc_frames(producer: bytes, values: list[str]):
    """publish_uncommitted_frames' frame function for Docs of ``values``."""
    from message.columns import uuid_strings

    def frame(first: int) -> bytes:
        uuids = uuid_strings(producer, first, len(values), Flags.CONTINUE_TXN).decode()
        return b"".join(
            b'{"s":"%s","uuid":"%s"}\n' % (v.encode(), uuids[36 * i:36 * i + 36].encode())
            for i, v in enumerate(values))

    return frame


def test_an_ack_is_framed_as_its_transactions_messages_without_a_spec_lookup(client) -> None:
    """The ACK of messages the Publisher framed is framed in their content
    type, with no call to the client's ``get`` (a commit's cost on a store
    that reads the spec from disk); where the caller framed the messages,
    the journal's spec says."""
    asked: list[str] = []
    get = client.get

    def counting_get(name: str) -> JournalSpec:
        asked.append(name)
        return get(name)

    client.get = counting_get
    pub = Publisher(client)
    pub.publish_uncommitted(to("journal/one"), Doc("x"))
    (ack,) = pub.build_ack_intents()
    assert asked == []
    assert ack.journal == "journal/one" and ack.intent.endswith(b"\n")
    client.append(ack.journal, ack.intent).result()
    assert [e.message.s for e in ReadCommittedIter(
        client, "journal/one", lambda _s: Doc())] == ["x", ""]

    asked.clear()  # (the reader asked)
    pub.publish_uncommitted_frames("journal/two", 1, _doc_frames(pub.producer_id, ["y"]), Doc())
    (ack,) = pub.build_ack_intents()
    assert asked == ["journal/two"]
    pub.publish_uncommitted(to("journal/two"), Doc("z"))
    (rollback,) = pub.build_rollback_intents()
    assert rollback.journal == "journal/two"
    assert asked == ["journal/two"]  # known from the transaction's message again


def doc_lines(client, journal: str) -> list[Doc]:
    import orjson

    with client.read(journal) as r:
        data = r.read()
    return [Doc(d.get("s", ""), uuid.UUID(d["uuid"])) for d in map(orjson.loads, data.splitlines())]


def test_frames_framed_by_the_caller_join_the_transaction(client) -> None:
    """publish_uncommitted_frames takes consecutive clocks, as as many
    publishes would, appends the caller's frames in one append, and joins
    the journal to the open transaction: its ACK and roll-back intents are
    those of messages published one by one."""
    clock = Clock(100)
    pub = Publisher(client, clock)
    p = pub.producer_id
    pub.publish_uncommitted(to("journal/one"), Doc("before"))
    first = pub.publish_uncommitted_frames("journal/two", 3, _doc_frames(p, ["a", "b", "c"]),
                                           Doc()).result()
    assert isinstance(first, AppendResult) and clock.value == 104
    pub.publish_uncommitted_frames("journal/one", 1, _doc_frames(p, ["d"]), Doc()).result()
    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == ["journal/one", "journal/two"]
    for i in intents:
        client.append(i.journal, i.intent).result()
    assert doc_lines(client, "journal/two") == [
        Doc("a", build_uuid(p, 102, Flags.CONTINUE_TXN)),
        Doc("b", build_uuid(p, 103, Flags.CONTINUE_TXN)),
        Doc("c", build_uuid(p, 104, Flags.CONTINUE_TXN)),
        Doc("", build_uuid(p, 107, Flags.ACK_TXN)),
    ]
    committed = [e.message.s for e in ReadCommittedIter(client, "journal/two", lambda _s: Doc())]
    assert committed == ["a", "b", "c", ""]

    # A roll-back carries the clock before the journal's first frame.
    pub.publish_uncommitted_frames("journal/three", 2, _doc_frames(p, ["x", "y"]), Doc())
    (rollback,) = pub.build_rollback_intents()
    client.append(rollback.journal, rollback.intent).result()
    assert doc_lines(client, "journal/three")[-1] == Doc("", build_uuid(p, 107, Flags.ACK_TXN))
    assert [e.message.s for e in
            ReadCommittedIter(client, "journal/three", lambda _s: Doc())] == []

    with pytest.raises(ValueError, match="at least one"):
        pub.publish_uncommitted_frames("journal/one", 0, _doc_frames(p, []), Doc())
    assert not pub.has_open_transaction


def test_frames_with_the_publishers_own_clock_follow_wall_time(client) -> None:
    import time

    from message import new_clock

    before = new_clock(time.time_ns())
    pub = Publisher(client)
    pub.publish_uncommitted_frames("a/journal", 2, _doc_frames(pub.producer_id, ["a", "b"]),
                                   Doc()).result()
    pub.publish_uncommitted(to("a/journal"), Doc("c")).result()
    clocks = [get_clock(d.uuid) for d in doc_lines(client, "a/journal")]
    assert before < clocks[0] and clocks[1] == clocks[0] + 1 and clocks[2] > clocks[1]


def test_own_clock_follows_wall_time(client) -> None:
    """Without a clock, the Publisher's clock tracks the wall clock."""
    import time

    from message import new_clock

    before = new_clock(time.time_ns())
    pub = Publisher(client)
    pub.publish_committed(to("a/journal"), Doc("x")).result()
    clock = get_clock(read_all(client, "a/journal")[0].uuid)
    assert before < clock <= new_clock(time.time_ns()) + 16


def test_concurrent_publishers_keep_clocks_increasing_per_journal(client) -> None:
    """Many threads publishing at once still give increasing clocks in each journal."""
    journals = ["journal/one", "journal/two", "journal/three"]
    parts = [client.get(j) for j in journals]
    pub = Publisher(client)
    mapping = modulo_mapping(lambda d: d.s, lambda: parts)

    def work(t: int) -> None:
        for i in range(300):
            pub.publish_committed(mapping, Doc(f"{t}-{i}"))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.flush()
    total = 0
    for j in journals:
        clocks = [get_clock(d.uuid) for d in read_all(client, j)]
        assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
        total += len(clocks)
    assert total == 1200


def test_empty_partitions_error_from_mapping(client) -> None:
    """A mapping over no partitions raises EmptyPartitionsError; nothing is written."""
    pub = Publisher(client)
    with pytest.raises(EmptyPartitionsError):
        pub.publish_committed(modulo_mapping(lambda d: d.s, lambda: []), Doc("x"))


def committed(client, journal: str) -> list[str]:
    return [
        e.message.s
        for e in ReadCommittedIter(client, journal, lambda _s: Doc())
        if get_flags(e.message.uuid) != Flags.ACK_TXN
    ]


def test_transaction_commits_on_clean_exit(client, tmp_path) -> None:
    """A Transaction's messages become visible only when it commits, in every journal."""
    pub = Publisher(client)
    log = IntentLog(tmp_path / "intents.json")
    with Transaction(pub, log) as txn:
        txn.publish(to("journal/one"), Doc("a"))
        txn.publish(to("journal/two"), Doc("b"))
        assert committed(client, "journal/one") == []  # not yet
    assert committed(client, "journal/one") == ["a"]
    assert committed(client, "journal/two") == ["b"]
    assert log.load() == [] and log.path.read_bytes().startswith(IntentLog.CLEARED)  # cleared


def test_transaction_aborts_on_exception_with_rollback_acks(client) -> None:
    """An exception aborts: roll-back ACKs are written and readers drop the messages."""
    pub = Publisher(client)
    pub.publish_committed(to("journal/one"), Doc("before")).result()
    with pytest.raises(RuntimeError, match="boom"), Transaction(pub) as txn:
        txn.publish(to("journal/one"), Doc("x"))
        txn.publish(to("journal/two"), Doc("y"))
        raise RuntimeError("boom")
    # The roll-back ACKs are there, and nothing of the transaction commits.
    flags = [get_flags(d.uuid) for d in read_all(client, "journal/two")]
    assert flags == [Flags.CONTINUE_TXN, Flags.ACK_TXN]
    assert committed(client, "journal/one") == ["before"]
    assert committed(client, "journal/two") == []
    seq_reader = ReadCommittedIter(client, "journal/two", lambda _s: Doc())
    assert [e.message.s for e in seq_reader] == []
    assert not seq_reader.sequencer.has_pending({})  # readers stopped waiting
    # The producer goes on: its next transaction commits normally.
    with Transaction(pub) as txn:
        txn.publish(to("journal/one"), Doc("after"))
    assert committed(client, "journal/one") == ["before", "after"]


class FailingAppends:
    """A client whose appends to ``journal`` fail (in their futures) while
    ``failing`` is set: as a store whose disk filled up."""

    def __init__(self, inner: MemoryJournalClient, journal: str) -> None:
        self.inner, self.journal, self.failing = inner, journal, False

    def append(self, name: str, data: bytes):
        if self.failing and name == self.journal:
            f: Future = Future()
            f.set_exception(OSError(28, "No space left on device"))
            return f
        return self.inner.append(name, data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_commit_with_a_failed_append_raises_and_rolls_back(client) -> None:
    """A message not appended: commit raises its error and writes roll-back
    ACKs, so that none of the transaction is committed and readers stop waiting."""
    flaky = FailingAppends(client, "journal/two")
    pub = Publisher(flaky)
    txn = Transaction(pub)
    txn.publish(to("journal/one"), Doc("a"))
    flaky.failing = True
    txn.publish(to("journal/two"), Doc("lost"))
    flaky.failing = False
    txn.publish(to("journal/two"), Doc("b"))
    with pytest.raises(OSError, match="No space left"):
        txn.commit()
    for journal in ("journal/one", "journal/two"):
        assert committed(client, journal) == []
        it = ReadCommittedIter(client, journal, lambda _s: Doc())
        assert list(it) == []
        assert not it.sequencer.has_pending({})
    with pytest.raises(RuntimeError, match="already committed or aborted"):
        txn.commit()


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_a_publish_bound_before_the_end_refuses_after_it(client, end: str) -> None:
    """``publish = txn.publish`` taken in the transaction, called after it
    ended: refused, and nothing is appended (the message would otherwise
    hang uncommitted behind the transaction's ACK)."""
    txn = Transaction(Publisher(client))
    publish = txn.publish
    publish(to("journal/one"), Doc("a"))
    getattr(txn, end)()
    written = read_all(client, "journal/one")
    for late in (publish, txn.publish, functools.partial(Transaction.publish, txn)):
        with pytest.raises(RuntimeError, match="already committed or aborted"):
            late(to("journal/one"), Doc("late"))
    assert read_all(client, "journal/one") == written
    assert [d.s for d in written] == ["a", ""]  # the message, then its ACK
    assert committed(client, "journal/one") == (["a"] if end == "commit" else [])


def test_a_subclass_overriding_publish_keeps_its_own(client) -> None:
    """The fast publish of an instance does not bypass a subclass's publish."""
    seen: list[str] = []

    class Logged(Transaction):
        def publish(self, mapping, msg):  # type: ignore[no-untyped-def]
            seen.append(msg.s)
            return super().publish(mapping, msg)

    with Logged(Publisher(client)) as txn:
        txn.publish(to("journal/one"), Doc("a"))
    assert seen == ["a"] and committed(client, "journal/one") == ["a"]


def test_a_large_transaction_keeps_only_appends_not_done(client) -> None:
    """Memory does not grow with the transaction: done futures are dropped,
    and a failure among them is still reported at commit."""
    flaky = FailingAppends(client, "journal/two")
    pub = Publisher(flaky)
    txn = Transaction(pub)
    flaky.failing = True
    txn.publish(to("journal/two"), Doc("lost"))
    flaky.failing = False
    for i in range(20_000):
        txn.publish(to("journal/one"), Doc(str(i)))
        assert len(txn._appends) <= 4096
    with pytest.raises(OSError):
        txn.commit()
    assert committed(client, "journal/one") == []

    big = Transaction(Publisher(client))
    for i in range(10_000):
        big.publish(to("journal/three"), Doc(str(i)))
    assert len(big._appends) < 4096
    big.commit()
    assert len(committed(client, "journal/three")) == 10_000


def test_intent_log_recovery_completes_a_half_written_commit(client, tmp_path) -> None:
    """Intents saved but only partly written are re-written on recovery: all journals commit."""
    pub = Publisher(client)
    pub.publish_uncommitted(to("journal/one"), Doc("a")).result()
    pub.publish_uncommitted(to("journal/two"), Doc("b")).result()
    log = IntentLog(tmp_path / "intents.json")
    intents = pub.build_ack_intents()
    log.save(intents)
    client.append(intents[0].journal, intents[0].intent).result()  # then "crash"
    assert committed(client, "journal/one") == ["a"]
    assert committed(client, "journal/two") == []

    assert IntentLog(tmp_path / "intents.json").recover(client) == 2
    assert committed(client, "journal/one") == ["a"]  # the re-written ACK is harmless
    assert committed(client, "journal/two") == ["b"]
    assert IntentLog(tmp_path / "intents.json").recover(client) == 0


def test_intent_log_rejects_garbage(tmp_path) -> None:
    """A corrupt intent log is an IntentLogError, not a traceback from json."""
    path = tmp_path / "intents.json"
    path.write_bytes(b"\x00not json")
    with pytest.raises(IntentLogError):
        IntentLog(path).load()


def test_an_intent_log_whose_last_save_was_cut_short_holds_nothing(client, tmp_path) -> None:
    """A save overwrites the log in place: cut anywhere (a crash before its
    fsync returned), it loads as empty, since none of its intents was
    written yet; saved whole, it loads whole. A log of the earlier format
    (a JSON array written by rename) still loads."""
    pub = Publisher(client)
    pub.publish_uncommitted(to("journal/one"), Doc("a")).result()
    pub.publish_uncommitted(to("journal/two"), Doc("b")).result()
    intents = pub.build_ack_intents()
    path = tmp_path / "intents.json"
    log = IntentLog(path)
    log.save(intents)
    whole = path.read_bytes()
    assert whole.startswith(IntentLog.MAGIC) and log.load() == intents
    # Over a longer earlier save: the old tail past the new length is ignored.
    log.save(intents * 3)
    log.save(intents[:1])
    assert log.load() == intents[:1]
    for cut in (len(whole) - 1, len(whole) // 2, 30, len(IntentLog.MAGIC) + 2):
        path.write_bytes(whole[:cut])
        assert log.load() == [], cut
        assert IntentLog(path).recover(client) == 0
    flipped = bytearray(whole)
    flipped[-3] ^= 0x20  # a body that does not match its line
    path.write_bytes(bytes(flipped))
    assert log.load() == []
    old = orjson.dumps([{"journal": i.journal, "intent": base64.b64encode(i.intent).decode()}
                        for i in intents])
    path.write_bytes(old)
    assert log.load() == intents
    assert IntentLog(path).recover(client) == 2
    assert committed(client, "journal/two") == ["b"]
    assert log.load() == []


def test_an_intent_log_is_removed_only_once_it_holds_nothing(client, tmp_path) -> None:
    """``remove`` drops a cleared log's file, never one with intents to write."""
    pub = Publisher(client)
    pub.publish_uncommitted(to("journal/one"), Doc("a")).result()
    log = IntentLog(tmp_path / "intents.json")
    log.save(pub.build_ack_intents())
    log.remove()
    assert log.path.exists() and len(log.load()) == 1
    log.clear()
    log.remove()
    assert not log.path.exists()
    log.remove()  # (no file: nothing to do)


def test_an_intent_log_saves_into_its_file_even_once_it_was_replaced(client, tmp_path) -> None:
    """The log keeps its file open between saves; a file removed or replaced
    meanwhile (by hand, or a recovery elsewhere that removed a cleared log)
    is opened again, so a save never lands in a file no one can find."""
    pub = Publisher(client)
    pub.publish_uncommitted(to("journal/one"), Doc("a")).result()
    intents = pub.build_ack_intents()
    path = tmp_path / "logs" / "intents.json"
    log = IntentLog(path)
    log.save(intents)
    log.clear()
    size = path.stat().st_size
    log.save(intents[:0])  # a shorter save: the file does not shrink
    assert path.stat().st_size == size and log.load() == []
    path.unlink()
    log.save(intents)
    assert IntentLog(path).load() == intents
    path.rename(tmp_path / "moved.json")
    path.write_bytes(b"")
    log.save(intents)
    assert IntentLog(path).load() == intents
    # A fresh log object clears without having saved; an empty file stays empty.
    IntentLog(path).clear()
    assert path.read_bytes().startswith(IntentLog.CLEARED) and log.load() == []
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    IntentLog(empty).clear()
    IntentLog(tmp_path / "absent.json").clear()
    assert empty.read_bytes() == b"" and not (tmp_path / "absent.json").exists()
    log.close()
    log.close()  # (closed twice: nothing to do)
    log.save(intents)  # opened again
    assert log.load() == intents


class NoUUID(dict):
    """A message type that cannot carry a UUID: the nil UUID, set_uuid ignored."""

    def get_uuid(self) -> uuid.UUID:
        return uuid.UUID(int=0)

    def set_uuid(self, u: uuid.UUID) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> NoUUID:
        return NoUUID()


def test_message_without_a_uuid_is_at_least_once(client) -> None:
    """A message type that returns the nil UUID and ignores set_uuid opts
    out of exactly-once: each copy published is read committed."""
    pub = Publisher(client)
    m = NoUUID(n=1)
    pub.publish_committed(to("a/journal"), m).result()
    pub.publish_committed(to("a/journal"), m).result()
    pub.publish_uncommitted(to("a/journal"), NoUUID(n=2)).result()  # Commits alone too.
    assert m.get_uuid() == uuid.UUID(int=0)
    it = ReadCommittedIter(client, "a/journal", lambda _s: NoUUID())
    assert [dict(e.message) for e in it] == [{"n": 1}, {"n": 1}, {"n": 2}]
    assert it.checkpoint().states == []  # Never tracked.


def test_json_document_round_trips_through_ndjson(client) -> None:
    """JsonDocument keeps its UUID at _meta/uuid, as the canonical string,
    and reads back whole: the published document equals the one read."""
    pub = Publisher(client)
    doc = JsonDocument(page="/home", n=3)
    pub.publish_committed(to("a/journal"), doc).result()
    [env] = ReadCommittedIter(client, "a/journal", lambda _s: JsonDocument())
    assert env.message["page"] == "/home" and env.message["n"] == 3
    assert get_producer_id(env.message.get_uuid()) == pub.producer_id
    assert env.message["_meta"]["uuid"] == str(env.message.get_uuid())
    assert doc == env.message
    assert type(doc["_meta"]["uuid"]) is str


def test_spec_passed_to_new_message(client) -> None:
    """new_message receives the journal's spec."""
    seen: dict[str, list[JournalSpec]] = defaultdict(list)
    Publisher(client).publish_committed(to("a/journal"), Doc("x")).result()

    def new_message(spec: JournalSpec) -> Doc:
        seen[spec.name].append(spec)
        return Doc()

    list(ReadUncommittedIter(client, "a/journal", new_message))
    assert seen["a/journal"][0].content_type == "application/x-ndjson"


def test_a_csv_transaction_reads_back_through_a_fields_checking_reader() -> None:
    """A CSV journal holding transactions decodes with new_unmarshal_func,
    which requires every record to be as wide as the first (as Go's CSV
    reader does): each ACK is as wide as its transaction's records, as
    Gazette's CSVRecord makes it."""
    from message import CSVRecord
    from tests.csv_support import strict_csv_records

    csv = {"content-type": "text/csv"}
    with MemoryJournalClient() as client:
        spec = client.create("csv/a", csv)
        mapping = modulo_mapping(lambda r: r[1], lambda: [spec])
        pub = Publisher(client)
        for n in range(3):
            pub.publish_uncommitted(mapping, CSVRecord(["", f"k{n}", str(n)]))
        for intent in pub.build_ack_intents():
            client.append(intent.journal, intent.intent).result()
        pub.publish_committed(mapping, CSVRecord(["", "k9", "9"])).result()
        records = strict_csv_records(client.read("csv/a"))
        assert [len(r) for r in records] == [3] * 5
        assert [get_flags(r.get_uuid()) for r in records] == [
            Flags.CONTINUE_TXN, Flags.CONTINUE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN,
            Flags.OUTSIDE_TXN]
        with ReadCommittedIter(client, "csv/a", lambda s: CSVRecord()) as it:
            assert [e.message[2] for e in it if get_flags(e.message.get_uuid()) !=
                    Flags.ACK_TXN] == ["0", "1", "2", "9"]
