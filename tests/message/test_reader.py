"""Read iterators end to end over a journal client: decoding, replays, and
checkpoint/resume at every cut point of random publisher workloads."""

from __future__ import annotations

import itertools
import random
import uuid
from dataclasses import dataclass, field

import pytest

from journal import MemoryJournalClient
from message import (
    Checkpoint,
    Clock,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    new_clock,
)
from message._publisher import Publisher
from tests.sequencer_model import committed_output

# Every test runs with the C read loops and with the Python ones.
pytestmark = pytest.mark.usefixtures("read_loops")

NDJSON = {"content-type": "application/x-ndjson"}
J = "orders/part-0"


@dataclass
class Doc:
    s: str = ""
    uuid: uuid.UUID = field(default_factory=lambda: uuid.UUID(int=0))

    def get_uuid(self) -> uuid.UUID:
        return self.uuid

    def set_uuid(self, u: uuid.UUID) -> None:
        self.uuid = u

    def new_acknowledgement(self, journal: str) -> Doc:
        return Doc("ack")


def new_doc(_spec: object) -> Doc:
    return Doc()


def random_workload(client: MemoryJournalClient, rng: random.Random, steps: int) -> None:
    """Several publishers on one journal: committed messages; transactions
    committed, aborted (roll-back ACKs) and abandoned; duplicated frames."""
    mapping = lambda _m: (J, "application/x-ndjson")  # noqa: E731
    base = new_clock(1_700_000_000 * 10**9)
    pubs = [Publisher(client, Clock(base + 1000 * i)) for i in range(3)]
    frames: list[tuple[int, int]] = []
    for step in range(steps):
        pub = rng.choice(pubs)
        r = rng.random()
        if r < 0.3:
            res = pub.publish_committed(mapping, Doc(f"c{step}")).result()
            frames.append((res.begin, res.end))
        elif r < 0.6:
            res = pub.publish_uncommitted(mapping, Doc(f"t{step}")).result()
            frames.append((res.begin, res.end))
        elif r < 0.75 and pub.has_open_transaction:
            for i in pub.build_ack_intents():
                res = client.append(i.journal, i.intent).result()
                frames.append((res.begin, res.end))
        elif r < 0.82 and pub.has_open_transaction:
            for i in pub.build_rollback_intents():
                res = client.append(i.journal, i.intent).result()
                frames.append((res.begin, res.end))
        elif frames:
            # Re-append a frame already written: a retried append.
            b, e = rng.choice(frames)
            with client.read(J, b, e) as rd:
                data = rd.read()
                while len(data) < e - b:
                    data += rd.read()
            client.append(J, data).result()
    # Some transactions stay open forever (abandoned producers).


def uncommitted(client: MemoryJournalClient) -> list:
    return list(ReadUncommittedIter(client, J, new_doc))


def key(env) -> tuple[int, int, str]:
    return (env.begin, env.end, str(env.message.uuid))


@pytest.mark.parametrize("seed", range(6))
def test_read_committed_equals_model_for_every_ring_size(seed: int) -> None:
    """ReadCommittedIter outputs what the reference model says, whatever its ring size."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, random.Random(seed), 120)
        expected = [key(e) for e in committed_output(uncommitted(client))]
        assert expected
        for buffer in (1, 2, 3, 8, 4096):
            it = ReadCommittedIter(client, J, new_doc, Sequencer(buffer=buffer))
            assert [key(e) for e in it] == expected, buffer
            if buffer == 1:
                assert it.replays > 0


@pytest.mark.parametrize("seed", range(4))
def test_checkpoint_and_resume_at_every_cut_point(seed: int) -> None:
    """A checkpoint between any two yields resumes with none twice and none lost,
    through the protobuf and JSON encodings, even mid-transaction."""
    rng = random.Random(seed)
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, rng, 80)
        full = [key(e) for e in ReadCommittedIter(client, J, new_doc)]
        for cut in range(len(full) + 1):
            it = ReadCommittedIter(client, J, new_doc, Sequencer(buffer=rng.choice([1, 2, 4096])))
            got = [key(next(it)) for _ in range(cut)]
            cp = it.checkpoint()
            it.close()
            encoded = rng.choice([cp.to_bytes, cp.to_json])()
            restored = (
                Checkpoint.from_bytes(encoded)
                if isinstance(encoded, bytes)
                else Checkpoint.from_json(encoded)
            )
            assert restored == cp
            resumed = ReadCommittedIter(
                client, J, new_doc, Sequencer(buffer=rng.choice([1, 3, 4096])),
                checkpoint=restored,
            )
            got.extend(key(e) for e in resumed)
            assert got == full, cut


def test_checkpoint_before_first_yield_and_chained_resumes() -> None:
    """Checkpointing before anything is read, then resuming repeatedly one message
    at a time, reproduces the whole output."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, random.Random(42), 60)
        full = [key(e) for e in ReadCommittedIter(client, J, new_doc)]
        cp = ReadCommittedIter(client, J, new_doc).checkpoint()
        assert cp.offsets == {J: 0}
        got = []
        while True:
            it = ReadCommittedIter(client, J, new_doc, Sequencer(buffer=2), checkpoint=cp)
            env = next(it, None)
            if env is None:
                break
            got.append(key(env))
            cp = it.checkpoint()
            it.close()
        assert got == full


def test_sequencer_passed_with_checkpoint_keeps_buffer_and_takes_states() -> None:
    """A fresh sequencer given alongside a checkpoint keeps its buffer and takes its states."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, random.Random(3), 40)
        it = ReadCommittedIter(client, J, new_doc)
        list(it)
        cp = it.checkpoint()
        seq = Sequencer(buffer=7)
        resumed = ReadCommittedIter(client, J, new_doc, seq, checkpoint=cp)
        assert resumed.sequencer is seq and seq.buffer == 7
        assert sorted(map(repr, seq.producer_states())) == sorted(map(repr, cp.states))
        used = Sequencer()
        list(ReadCommittedIter(client, J, new_doc, used))
        with pytest.raises(ValueError):
            ReadCommittedIter(client, J, new_doc, used, checkpoint=cp)


def test_uncommitted_offsets_are_contiguous_and_bounded() -> None:
    """ReadUncommittedIter yields contiguous [begin, end) and stops at end_offset."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, random.Random(9), 30)
        envs = uncommitted(client)
        assert envs[0].begin == 0
        assert all(a.end == b.begin for a, b in itertools.pairwise(envs))
        assert envs[-1].end == client.head(J)
        mid = envs[len(envs) // 2]
        part = list(ReadUncommittedIter(client, J, new_doc, offset=mid.begin, end_offset=mid.end))
        assert [key(e) for e in part] == [key(mid)]


def test_corrupt_frame_error_names_journal_and_offset() -> None:
    """A frame that is not JSON raises a framing error naming journal and offset;
    skip_corrupt skips and counts it instead."""
    from framing import FramingError

    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        client.append(J, b'{"s": "ok"}\n').result()
        client.append(J, b"this is not json\n").result()
        client.append(J, b'{"s": "after"}\n').result()
        with pytest.raises(FramingError) as info:
            list(ReadUncommittedIter(client, J, new_doc))
        assert info.value.journal == J and info.value.offset == 12
        it = ReadUncommittedIter(client, J, new_doc, skip_corrupt=True)
        assert [e.message.s for e in it] == ["ok", "after"]
        assert it.skipped == 1


def test_journal_without_content_type_is_a_clear_error() -> None:
    """Reading a journal with no content-type label fails at construction, clearly."""
    from framing import UnknownContentTypeError

    with MemoryJournalClient() as client:
        client.create("plain/bytes", {})
        with pytest.raises(UnknownContentTypeError):
            ReadUncommittedIter(client, "plain/bytes", new_doc)


@pytest.mark.parametrize("seed", range(3))
def test_commit_offset_orders_output_like_the_sequencer(seed: int) -> None:
    """commit_offset is the begin of the committing envelope: sorting by
    (commit_offset, begin) reproduces the output order, and for a lone committed
    message it is the message itself."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, random.Random(seed), 100)
        it = ReadCommittedIter(client, J, new_doc, Sequencer(buffer=2))
        with pytest.raises(RuntimeError):
            it.commit_offset  # noqa: B018 -- nothing committed yet
        rows = [(it.commit_offset, e.begin, key(e)) for e in it]
        assert [r[2] for r in sorted(rows)] == [r[2] for r in rows]
        assert all(c >= b for c, b, _ in rows)
        assert any(c == b for c, b, _ in rows) and any(c > b for c, b, _ in rows)


def test_a_replay_over_a_skipped_corrupt_frame_skips_it_again_without_counting_it() -> None:
    """With skip_corrupt, a transaction replayed across a corrupt frame is
    still committed; the frame is counted once, when first read."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        pub = Publisher(client, Clock(new_clock(1_700_000_000 * 10**9)))
        to = lambda _m: (J, "application/x-ndjson")  # noqa: E731
        pub.publish_uncommitted(to, Doc("a")).result()
        client.append(J, b"{not json\n").result()
        pub.publish_uncommitted(to, Doc("b")).result()
        for intent in pub.build_ack_intents():
            client.append(intent.journal, intent.intent).result()
        it = ReadCommittedIter(client, J, new_doc, Sequencer(buffer=1), skip_corrupt=True)
        assert [e.message.s for e in it] == ["a", "b", "ack"]
        assert it.replays == 1
        assert it.skipped == 1


@pytest.mark.parametrize("committed", [False, True])
def test_csv_record_whose_first_field_is_no_uuid_is_a_corrupt_frame(committed: bool) -> None:
    """A CSV line whose first field is not a UUID is a FramingError naming journal
    and offset, not a plain ValueError; skip_corrupt skips and counts it."""
    from framing import FrameDecodeError, FramingError
    from message import CSVRecord

    csv_journal = "csv/part-0"
    with MemoryJournalClient() as client:
        client.create(csv_journal, {"content-type": "text/csv"})
        pub = Publisher(client, Clock(new_clock(1_700_000_000 * 10**9)))
        to = lambda _m: (csv_journal, "text/csv")  # noqa: E731
        first = pub.publish_committed(to, CSVRecord(["", "one"])).result()
        client.append(csv_journal, b"hello,world\n").result()  # a foreign line
        pub.publish_committed(to, CSVRecord(["", "two"])).result()
        it_type = ReadCommittedIter if committed else ReadUncommittedIter
        new = lambda _s: CSVRecord()  # noqa: E731
        with pytest.raises(FramingError) as info:
            list(it_type(client, csv_journal, new))
        assert isinstance(info.value, FrameDecodeError)
        assert info.value.journal == csv_journal and info.value.offset == first.end
        assert info.value.data == b"hello,world\n"
        it = it_type(client, csv_journal, new, skip_corrupt=True)
        assert [e.message[1] for e in it] == ["one", "two"]
        assert it.skipped == 1
