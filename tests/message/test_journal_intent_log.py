"""JournalIntentLog: a transaction's ACK intents kept in a journal of the
store they commit, so that any process reaching the store finishes a commit
that a crash cut short."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from journal import JournalStore, LocalJournalStore, MemoryJournalClient
from message import (
    IntentLogError,
    JournalIntentLog,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    Transaction,
    modulo_mapping,
)

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JournalStore]:
    s: JournalStore = (
        MemoryJournalClient() if request.param == "memory" else LocalJournalStore(tmp_path)
    )
    with s:
        yield s


def _committed(store: JournalStore, names: list[str]) -> list[int]:
    return sorted(
        env.message["i"]
        for name in names
        for env in ReadCommittedIter(store, name, lambda _s: JsonDocument())
        if "i" in env.message
    )


def _uncommitted_txn(store: JournalStore, n: int = 6) -> tuple[Publisher, list[str]]:
    parts = [store.create(f"data/part-{i}", NDJSON) for i in range(2)]
    mapping = modulo_mapping(lambda d: str(d["i"]), lambda: parts)
    pub = Publisher(store)
    for i in range(n):
        pub.publish_uncommitted(mapping, JsonDocument(i=i))
    store.flush()
    return pub, [p.name for p in parts]


def test_save_load_recover_clear(store: JournalStore) -> None:
    """save() makes a labelled journal holding the intents; recover() writes
    them (committing the transaction) and deletes the log."""
    pub, names = _uncommitted_txn(store)
    intents = pub.build_ack_intents()
    log = JournalIntentLog(store, "state/intents/a1")
    log.save(intents)
    assert store.get("state/intents/a1").labels.value_of("exactly.state") == "intents"
    assert log.load() == intents
    assert _committed(store, names) == []
    assert log.recover() == len(intents) == 2
    assert _committed(store, names) == list(range(6))
    assert store.list("prefix=state/") == []
    assert log.load() == [] and log.recover() == 0  # gone: nothing to do


def test_recover_all_finds_every_unfinished_log(store: JournalStore) -> None:
    """recover_all lists the logs under a prefix (and only intent logs) and
    finishes each; a second call finds none."""
    pub, names = _uncommitted_txn(store)
    JournalIntentLog(store, "state/intents/x").save(pub.build_ack_intents())
    store.create("state/intents-not/other", NDJSON)  # not an intent log: left alone
    assert JournalIntentLog.recover_all(store, "state/intents/") == 2
    assert _committed(store, names) == list(range(6))
    assert JournalIntentLog.recover_all(store, "state/intents/") == 0
    assert [s.name for s in store.list("prefix=state/")] == ["state/intents-not/other"]


def test_transaction_commits_through_a_journal_log(store: JournalStore) -> None:
    """Transaction(log=JournalIntentLog(...)) commits and leaves no log behind."""
    parts = [store.create("t/part-0", NDJSON)]
    mapping = modulo_mapping(lambda d: str(d["i"]), lambda: parts)
    log = JournalIntentLog(store, "state/intents/t")
    with Transaction(Publisher(store), log) as txn:
        for i in range(4):
            txn.publish(mapping, JsonDocument(i=i))
    assert _committed(store, ["t/part-0"]) == [0, 1, 2, 3]
    assert store.list("prefix=state/") == []


def test_a_log_that_is_not_one_is_an_error(store: JournalStore) -> None:
    """A journal of that name holding something else: IntentLogError, not a guess."""
    store.create("state/intents/junk", NDJSON)
    store.append("state/intents/junk", b'{"not": "a log"}\n').result()
    with pytest.raises(IntentLogError, match="state/intents/junk"):
        JournalIntentLog(store, "state/intents/junk").load()
