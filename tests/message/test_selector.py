"""ReadCommittedSelectorIter: the committed messages of every journal of a
selector, each journal's as ReadCommittedIter reads it, with checkpoints
across them, following journals as they grow, come and go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from journal import (
    GazetteClient,
    JournalClient,
    JournalError,
    LocalJournalStore,
    MemoryJournalClient,
)
from message import (
    Checkpoint,
    CommittedSource,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadCommittedSelectorIter,
    modulo_mapping,
)
from tests.consumer_support import committed_by_key, make_input

NDJSON = {"content-type": "application/x-ndjson"}
PARTS = ["clicks/part-0", "clicks/part-1", "clicks/part-2"]


def new_doc(spec: Any) -> JsonDocument:
    return JsonDocument()


def per_journal(envelopes: Any) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for env in envelopes:
        out.setdefault(env.journal.name, []).append((env.begin, env.end))
    return out


def read_each(client: JournalClient, names: list[str]) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for name in names:
        with ReadCommittedIter(client, name, new_doc) as it:
            out[name] = [(env.begin, env.end) for env in it]
    return out


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with LocalJournalStore(tmp_path / "journals") as s:
        for name in [*PARTS, "other/part-0"]:
            s.create(name, NDJSON)
        yield s


def test_reads_each_journal_of_the_selector_as_read_committed_iter_does(store: Any) -> None:
    """Duplicates, roll-backs and abandoned transactions in every journal:
    each journal's committed envelopes, in its own order; no other journal's."""
    make_input(store, PARTS, 900, seed=11)
    make_input(store, ["other/part-0"], 50, seed=12)
    with ReadCommittedSelectorIter(store, "prefix=clicks/", new_doc, block=False) as it:
        assert it.journals == PARTS
        envelopes = list(it)
    assert per_journal(envelopes) == read_each(store, PARTS)
    numbers = sorted(env.message["n"] for env in envelopes if "n" in env.message)
    assert numbers == sorted(n for ns in committed_by_key(store, PARTS).values() for n in ns)
    assert len(numbers) < len(envelopes)  # the ACKs come too


def test_include_acks_false_hands_over_the_messages_alone(store: Any) -> None:
    """Without ``include_acks``, each journal's committed envelopes less its ACKs."""
    make_input(store, PARTS, 600, seed=13)
    with ReadCommittedSelectorIter(store, "prefix=clicks/", new_doc, block=False,
                                   include_acks=False) as it:
        envelopes = list(it)
    assert envelopes and all("n" in env.message for env in envelopes)
    expected = {}
    for name in PARTS:
        with ReadCommittedIter(store, name, new_doc) as full:
            expected[name] = [(e.begin, e.end) for e in full if "n" in e.message]
    assert per_journal(envelopes) == expected


def test_journals_take_turns(store: Any) -> None:
    """A long journal does not hold back the others: the first envelopes
    come from every journal with envelopes ready."""
    pub = Publisher(store)
    to = {name: modulo_mapping(lambda d: "x", lambda n=name: [store.get(n)]) for name in PARTS}
    for i in range(2000):
        pub.publish_committed(to["clicks/part-0"], JsonDocument(i=i))
    for name in PARTS[1:]:
        pub.publish_committed(to[name], JsonDocument(i=-1))
    store.flush()
    with ReadCommittedSelectorIter(store, "prefix=clicks/", new_doc, block=False) as it:
        first = [env.journal.name for _, env in zip(range(600), it, strict=False)]
    assert set(first) == set(PARTS)


@pytest.mark.parametrize("cut", [0, 1, 137, 400, 801, -1])
def test_a_checkpoint_resumes_every_journal_with_nothing_lost_or_repeated(
        store: Any, cut: int) -> None:
    """Cut anywhere (in the middle of transactions too), checkpointed as
    bytes, resumed: the envelopes of both runs are those of one."""
    make_input(store, PARTS, 600, seed=13)
    want = read_each(store, PARTS)
    total = sum(map(len, want.values()))
    cut = total if cut == -1 else cut
    with ReadCommittedSelectorIter(store, "prefix=clicks/", new_doc, block=False) as it:
        first = [env for _, env in zip(range(cut), it, strict=False)]
        saved = it.checkpoint().to_bytes()
    with ReadCommittedSelectorIter(store, "prefix=clicks/", new_doc, block=False,
                                   checkpoint=Checkpoint.from_bytes(saved)) as it:
        rest = list(it)
    both = per_journal(first)
    for name, spans in per_journal(rest).items():
        both.setdefault(name, []).extend(spans)
    assert both == want


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Follower:
    """Iterates in a thread, collecting messages' ``i``."""

    def __init__(self, it: ReadCommittedSelectorIter) -> None:
        self.it = it
        self.seen: list[tuple[str, int]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            for env in self.it:
                if "i" in env.message:
                    self.seen.append((env.journal.name, env.message["i"]))
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.it.close()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "close() did not end the iteration"
        assert self.error is None, self.error


def _follows(client: Any, prefix: str, **kw: Any) -> None:
    """Growth, a new journal and a deleted one, while an iteration waits."""
    names = [f"{prefix}part-{i}" for i in range(3)]
    for name in names[:2]:
        client.create(name, NDJSON)
    pub = Publisher(client)

    def publish(name: str, i: int) -> None:
        pub.publish_committed(modulo_mapping(lambda d: "x", lambda: [client.get(name)]),
                              JsonDocument(i=i)).result()

    publish(names[0], 0)
    follower = Follower(ReadCommittedSelectorIter(client, f"prefix={prefix}", new_doc, **kw))
    try:
        wait_until(lambda: follower.seen == [(names[0], 0)], "the first message")
        publish(names[1], 1)  # a journal grows
        wait_until(lambda: (names[1], 1) in follower.seen, "a journal's growth")
        client.create(names[2], NDJSON)  # a new journal
        publish(names[2], 2)
        wait_until(lambda: (names[2], 2) in follower.seen, "a new journal's message")
        assert follower.it.journals == names
        client.delete(names[0])  # a journal goes away
        wait_until(lambda: follower.it.journals == names[1:], "a deleted journal dropped")
        assert names[0] not in follower.it.checkpoint().offsets
        publish(names[1], 3)
        wait_until(lambda: (names[1], 3) in follower.seen, "growth after a deletion")
        assert sorted(i for _, i in follower.seen) == [0, 1, 2, 3]
    finally:
        follower.stop()


def test_follows_journals_of_the_embedded_store(tmp_path: Path) -> None:
    with LocalJournalStore(tmp_path) as client:
        _follows(client, "clicks/", interval=0.05)


def test_follows_journals_in_memory() -> None:
    _follows(MemoryJournalClient(), "clicks/", interval=0.05)


def test_follows_journals_of_a_gazette_cluster(gazette_cluster: Any, gazette_prefix: str) -> None:
    """On a cluster, a watching List RPC tells of new and deleted journals."""
    with GazetteClient(gazette_cluster.address, replication=1) as client:
        _follows(client, gazette_prefix)


def test_close_ends_a_waiting_iteration_and_releases_its_threads(store: Any) -> None:
    make_input(store, PARTS, 30, seed=14, messy=False)

    def ours() -> list[str]:  # the listing's thread and the journals' watches
        return [t.name for t in threading.enumerate() if t.name.startswith("exactly watch")]

    assert ours() == []
    it = ReadCommittedSelectorIter(store, "prefix=clicks/", new_doc, interval=0.05)
    follower = Follower(it)
    wait_until(lambda: len(ours()) == 1 + len(PARTS), "the watches")
    time.sleep(0.2)
    follower.stop()
    assert ours() == []
    it.close()  # again: nothing happens


def test_a_checkpoint_past_a_journals_end_is_an_error_when_not_following(store: Any) -> None:
    """Read once (block=False), a journal that ends before the checkpoint's
    offset is an error, as for ReadCommittedIter; followed, it is waited for
    (see the consumer's tests)."""
    from journal import OffsetNotYetAvailableError

    with pytest.raises(OffsetNotYetAvailableError):
        ReadCommittedSelectorIter(store, "prefix=clicks/", new_doc, block=False,
                                  checkpoint=Checkpoint({PARTS[0]: 10_000}, []))
    with pytest.raises(OffsetNotYetAvailableError):
        CommittedSource(store, PARTS[0], new_doc, offset=10_000, follow=False)


def test_a_committed_source_reads_on_when_its_journal_grows(tmp_path: Path) -> None:
    """CommittedSource alone: read to the end, told of growth, read on over
    the same Sequencer; a wait that fails is raised by reopen()."""
    client = MemoryJournalClient()
    client.create("j", NDJSON)
    pub = Publisher(client)
    to_j = modulo_mapping(lambda d: "x", lambda: [client.get("j")])
    pub.publish_committed(to_j, JsonDocument(i=1)).result()
    grew = threading.Event()
    src = CommittedSource(client, "j", new_doc, notify=grew.set)
    try:
        assert src.it is not None
        assert [env.message["i"] for env in src.it] == [1]
        src.ended()
        assert src.it is None and not src.grown
        assert src.checkpoint().offsets == {"j": client.head("j")}
        pub.publish_committed(to_j, JsonDocument(i=2)).result()
        assert grew.wait(10) and src.grown
        src.reopen()
        assert [env.message["i"] for env in src.it] == [2]
        src.ended()
        client.close()  # the wait for growth fails
        wait_until(lambda: src.grown, "the failed wait")
        with pytest.raises(JournalError):
            src.reopen()
    finally:
        src.close()
