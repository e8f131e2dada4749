"""Read iterators end to end over a journal client: decoding, replays, and
checkpoint/resume at every cut point of random publisher workloads."""

from __future__ import annotations

import io
import itertools
import random
import threading
import uuid
from dataclasses import dataclass, field

import pytest

from framing import register_framing, unpack_line
from journal import MemoryJournalClient
from message import (
    Checkpoint,
    Clock,
    Envelope,
    Flags,
    ProducerState,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    get_flags,
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


def is_ack(env) -> bool:
    return get_flags(env.message.get_uuid()) == Flags.ACK_TXN


@pytest.mark.parametrize("seed", range(6))
def test_include_acks_false_leaves_out_the_committing_acks_and_nothing_else(seed: int) -> None:
    """Without ``include_acks``, the output is the Sequencer's less its ACK_TXN
    messages, whatever the ring size (ACKs of replayed spans too); a
    checkpoint at any cut point resumes the same filtered output."""
    rng = random.Random(seed)
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, rng, 120)
        output = committed_output(uncommitted(client))
        expected = [key(e) for e in output if not is_ack(e)]
        assert len(expected) < len(output)  # the workload committed transactions
        for buffer in (1, 2, 8, 4096):
            it = ReadCommittedIter(client, J, new_doc, Sequencer(buffer=buffer),
                                   include_acks=False)
            assert [key(e) for e in it] == expected, buffer
            if buffer == 1:
                assert it.replays > 0
        for cut in range(len(expected) + 1):
            it = ReadCommittedIter(client, J, new_doc, Sequencer(buffer=rng.choice([1, 4096])),
                                   include_acks=False)
            got = [key(next(it)) for _ in range(cut)]
            cp = it.checkpoint()
            it.close()
            resumed = ReadCommittedIter(client, J, new_doc, checkpoint=cp, include_acks=False)
            got.extend(key(e) for e in resumed)
            assert got == expected, cut


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
    """A sequencer that has queued nothing, given alongside a checkpoint, keeps
    its buffer; its own producer states are replaced by the checkpoint's; the
    resumed output continues the interrupted one exactly."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, random.Random(3), 40)
        full = [key(e) for e in ReadCommittedIter(client, J, new_doc)]
        it = ReadCommittedIter(client, J, new_doc)
        head = [key(next(it)) for _ in range(len(full) // 2)]
        cp = it.checkpoint()
        it.close()
        stranger = ProducerState(J, b"\x01\x00\x00\x00\x00\x63", 1, -1)
        seq = Sequencer([stranger], buffer=7)
        resumed = ReadCommittedIter(client, J, new_doc, seq, checkpoint=cp)
        assert resumed.sequencer is seq and seq.buffer == 7
        assert sorted(map(repr, seq.producer_states())) == sorted(map(repr, cp.states))
        assert stranger not in seq.producer_states()
        assert head + [key(e) for e in resumed] == full
        used = Sequencer()
        list(ReadCommittedIter(client, J, new_doc, used))
        with pytest.raises(ValueError):
            ReadCommittedIter(client, J, new_doc, used, checkpoint=cp)


def test_checkpoint_inside_an_open_transaction_resumes_when_its_ack_arrives() -> None:
    """A checkpoint taken at the end of the journal while a transaction is open
    (its messages read, its ACK not yet appended) resumes it: once the ACK
    lands, the resumed reader yields the whole transaction, then the ACK."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        to = lambda _m: (J, "application/x-ndjson")  # noqa: E731
        pub, other = Publisher(client), Publisher(client)
        pub.publish_uncommitted(to, Doc("t1")).result()
        other.publish_committed(to, Doc("m1")).result()
        pub.publish_uncommitted(to, Doc("t2")).result()
        it = ReadCommittedIter(client, J, new_doc)
        assert [e.message.s for e in it] == ["m1"]
        cp = Checkpoint.from_bytes(it.checkpoint().to_bytes())
        for intent in pub.build_ack_intents():
            client.append(intent.journal, intent.intent).result()
        rest = ReadCommittedIter(client, J, new_doc, checkpoint=cp)
        assert [e.message.s for e in rest] == ["t1", "t2", "ack"]


def test_uncommitted_block_waits_for_appends() -> None:
    """ReadUncommittedIter(block=True) waits for new appends, and ends at end_offset."""
    frame = b'{"s": "late"}\n'
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        it = ReadUncommittedIter(client, J, new_doc, block=True, end_offset=2 * len(frame))
        timer = threading.Timer(0.05, lambda: [client.append(J, frame) for _ in range(2)])
        timer.start()
        try:
            got = [e.message.s for e in it]
        finally:
            timer.join()
        assert got == ["late", "late"]


class Upper:
    """A framing of the user's own, with no more than the Framing protocol
    asks: upper-case text lines."""

    content_type = "application/x-test-upper"

    def marshal(self, msg: dict) -> bytes:
        return msg["text"].upper().encode() + b"\n"

    def new_unmarshal_func(self, r: io.BufferedIOBase):
        def unmarshal(msg: dict) -> None:
            line = unpack_line(r)
            if not line:
                raise EOFError
            msg["text"] = line[:-1].decode()

        return unmarshal


class Text(dict):
    """A message type without a UUID, for the Upper framing."""

    def get_uuid(self) -> uuid.UUID:
        return uuid.UUID(int=0)

    def set_uuid(self, u: uuid.UUID) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> Text:
        return Text()


def test_a_registered_framing_serves_journals_of_its_content_type() -> None:
    """register_framing(f): journals whose content-type label names f are
    written and read through it, from any offset, uncommitted and committed."""
    register_framing(Upper())
    with MemoryJournalClient() as client:
        client.create("custom/a", {"content-type": Upper.content_type})
        client.append("custom/a", b"ONE\n").result()
        Publisher(client).publish_committed(lambda _m: ("custom/a", Upper.content_type),
                                            Text(text="two")).result()
        got = list(ReadUncommittedIter(client, "custom/a", lambda _s: Text()))
        assert [(e.begin, e.end, e.message["text"]) for e in got] == [(0, 4, "ONE"), (4, 8, "TWO")]
        committed = list(ReadCommittedIter(client, "custom/a", lambda _s: Text(), offset=4))
        assert [(e.begin, e.message["text"]) for e in committed] == [(4, "TWO")]


def test_uncommitted_offsets_are_contiguous_and_bounded() -> None:
    """ReadUncommittedIter yields contiguous [begin, end) and stops at end_offset."""
    with MemoryJournalClient() as client:
        client.create(J, NDJSON)
        random_workload(client, random.Random(9), 30)
        envs = uncommitted(client)
        assert all(type(e) is Envelope and e.journal == client.get(J) for e in envs)
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
