"""Conformance with SPEC.md, sentence by sentence, through public names only.

Each test pins one fixed name or behaviour of the contract; its docstring
quotes or paraphrases the sentence it checks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import enum
import inspect
import io
import itertools
import random
import subprocess
import sys
import threading
import time
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mmh3
import orjson
import pytest
from google.protobuf import wrappers_pb2

from framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
    DesyncError,
    FramingError,
    TruncatedFrameError,
    UnknownContentTypeError,
    encode_fixed_proto_frame,
    framing_by_content_type,
    register_framing,
    unpack_fixed_frame,
    unpack_line,
)
from journal import (
    AppendResult,
    JournalError,
    JournalExistsError,
    JournalNotFoundError,
    JournalSpec,
    LabelSelectorError,
    LabelSet,
    LocalJournalStore,
    parse_label_selector,
)
from message import (
    AckIntent,
    Checkpoint,
    Clock,
    EmptyPartitionsError,
    Envelope,
    Flags,
    JournalProducer,
    JsonDocument,
    Message,
    MessageError,
    MustStartReplay,
    ProducerState,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    ReplayError,
    Sequencer,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    modulo_mapping,
    new_clock,
    new_producer_id,
    random_mapping,
    rendezvous_mapping,
)

NDJSON = {"content-type": "application/x-ndjson"}
NIL = uuid.UUID(int=0)
OUTSIDE, CONTINUE, ACK = 0, 1, 2

# ---------------------------------------------------------------------------
# Helpers: a minimal user message, envelopes, and a model of the SPEC rules.
# ---------------------------------------------------------------------------


class Msg:
    """The smallest user type satisfying the Message protocol."""

    def __init__(self, u: uuid.UUID = NIL) -> None:
        self.u = u

    def get_uuid(self) -> uuid.UUID:
        return self.u

    def set_uuid(self, u: uuid.UUID) -> None:
        self.u = u

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg()


SPEC_A = JournalSpec("spec/a", NDJSON)
SPEC_B = JournalSpec("spec/b", NDJSON)
P1 = b"\x01\x00\x00\x00\x00\x01"
P2 = b"\x01\x00\x00\x00\x00\x02"
P3 = b"\x01\x00\x00\x00\x00\x03"


def mk(spec: JournalSpec, begin: int, producer: bytes, clock: int, flags: int,
       size: int = 10) -> Envelope:
    u = build_uuid(producer, clock, flags) if clock else NIL
    return Envelope(journal=spec, begin=begin, end=begin + size, message=Msg(u))


def layout(spec: JournalSpec, items: list[tuple[bytes, int, int]],
           start: int = 0) -> list[Envelope]:
    """Envelopes of one journal, back to back from ``start``, 10 bytes each."""
    return [mk(spec, start + 10 * i, p, c, f) for i, (p, c, f) in enumerate(items)]


def replay_source(envs: list[Envelope], journal: str, begin: int, end: int) -> Iterator[Envelope]:
    return iter([e for e in envs
                 if e.journal.name == journal and begin <= e.begin and e.end <= end])


def drain(seq: Sequencer, all_envs: list[Envelope], journal: str,
          out: list[Envelope], replays: list[int] | None = None) -> None:
    while True:
        try:
            c = seq.deque_committed()
        except MustStartReplay:
            b, e = seq.replay_range()
            if replays is not None:
                replays.append(1)
            seq.start_replay(replay_source(all_envs, journal, b, e))
            continue
        if c is None:
            return
        out.append(c)


def run_sequencer(envs: list[Envelope], buffer: int = 4096,
                  replays: list[int] | None = None) -> list[Envelope]:
    seq = Sequencer(buffer=buffer)
    out: list[Envelope] = []
    for e in envs:
        seq.queue_uncommitted(e)
        drain(seq, envs, e.journal.name, out, replays)
    return out


def model(envs: list[Envelope]) -> list[Envelope]:
    """The Sequencer rules of SPEC section 3, written without a ring."""
    state: dict[tuple[str, bytes], list[Any]] = {}  # key -> [last_ack, span_max, span]
    out: list[Envelope] = []
    for e in envs:
        u = e.message.get_uuid()
        c = get_clock(u)
        if c == 0:
            out.append(e)
            continue
        f = get_flags(u)
        st = state.setdefault((e.journal.name, get_producer_id(u)), [c - 1, c - 1, []])
        last_ack, span_max, span = st
        if f == CONTINUE:
            if c <= last_ack or c <= span_max:
                continue
            span.append(e)
            st[1] = c
        elif f == ACK:
            if c > last_ack:
                emitted = [s for s in span if get_clock(s.message.get_uuid()) <= c]
                out.extend(emitted)
                # The ACK follows, unless a span message had its own clock
                # (Gazette's Sequencer.Step drops it; SPEC's wording does not
                # say so).
                if not emitted or get_clock(emitted[-1].message.get_uuid()) < c:
                    out.append(e)
            st[:] = [c, c, []]
        else:
            if c <= last_ack:
                continue
            out.append(e)
            st[:] = [c, c, []]
    return out


def key(envs: list[Envelope]) -> list[tuple[str, int, int]]:
    return [(e.journal.name, e.begin, e.end) for e in envs]


def random_workload(rng: random.Random, n: int = 60) -> list[Envelope]:
    """Two journals, three producers, transactions, retries and roll-backs."""
    offsets = {SPEC_A.name: 0, SPEC_B.name: 0}
    clocks = {P1: 100, P2: 100, P3: 100}
    envs: list[Envelope] = []
    for _ in range(n):
        spec = rng.choice([SPEC_A, SPEC_B])
        p = rng.choice([P1, P2, P3])
        r = rng.random()
        if r < 0.15 and envs:  # an at-least-once retry of an earlier frame
            old = rng.choice(envs)
            spec, u = old.journal, old.message.get_uuid()
            p, c, f = get_producer_id(u), get_clock(u), get_flags(u)
        else:
            clocks[p] += rng.choice([1, 1, 1, 2])
            c = clocks[p]
            f = rng.choice([OUTSIDE, CONTINUE, CONTINUE, CONTINUE, ACK, ACK])
            if r < 0.2:
                c = max(1, c - rng.randrange(1, 6))  # an old clock: duplicate or roll-back
            if r > 0.97:
                c = 0
        b = offsets[spec.name]
        envs.append(mk(spec, b, p, c, f))
        offsets[spec.name] = b + 10
    return envs


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalJournalStore]:
    with LocalJournalStore(tmp_path / "store") as s:
        yield s


def to_journal(name: str) -> Any:
    def mapping(msg: Any) -> tuple[str, str]:
        return name, CONTENT_TYPE_JSON_LINES
    return mapping


# ---------------------------------------------------------------------------
# 2. Layout
# ---------------------------------------------------------------------------


def test_framing_and_journal_never_import_message() -> None:
    """SPEC 2: `framing` and `journal` never import `message`."""
    code = ("import sys, framing, journal, journal.testing, framing.testing; "
            "print(any(m == 'message' or m.startswith('message.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------
# 3. message — identifiers
# ---------------------------------------------------------------------------


def test_new_producer_id_is_six_random_multicast_bytes() -> None:
    """new_producer_id() -> bytes: 6 random bytes with the multicast bit set."""
    ids = {new_producer_id() for _ in range(64)}
    assert len(ids) == 64
    for p in ids:
        assert type(p) is bytes and len(p) == 6 and p[0] & 0x01 == 1


def test_flags_enum_values() -> None:
    """class Flags(enum.IntEnum): OUTSIDE_TXN = 0, CONTINUE_TXN = 1, ACK_TXN = 2."""
    assert issubclass(Flags, enum.IntEnum)
    assert (Flags.OUTSIDE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN) == (0, 1, 2)


def test_build_uuid_byte_layout() -> None:
    """build_uuid: byte layout exactly as Gazette's BuildUUID."""
    producer, clock, flags = bytes([0x8B, 2, 3, 4, 5, 6]), 0xFEDCBA9876543217, 0x2A5
    u = build_uuid(producer, clock, flags)
    assert isinstance(u, uuid.UUID)
    time_low = (clock >> 4) & 0xFFFFFFFF
    time_mid = (clock >> 36) & 0xFFFF
    time_hi = ((clock >> 52) & 0xFFFF) | 0x1000
    clock_seq = ((clock << 10) & 0x3C00) | flags | 0x8000
    expected = (time_low.to_bytes(4, "big") + time_mid.to_bytes(2, "big")
                + time_hi.to_bytes(2, "big") + clock_seq.to_bytes(2, "big") + producer)
    assert u.bytes == expected
    assert u.version == 1 and u.variant == uuid.RFC_4122


def test_build_uuid_accepts_every_flag_value_up_to_0x3ff() -> None:
    """Flag values are any int in 0..0x3ff."""
    for flags in (0, 1, 2, 3, 0x155, 0x3FF):
        assert get_flags(build_uuid(P1, 12345, flags)) == flags


def test_build_uuid_rejects_flags_above_0x3ff() -> None:
    """build_uuid raises ValueError if flags > 0x3ff."""
    with pytest.raises(ValueError):
        build_uuid(P1, 12345, 0x400)


@pytest.mark.parametrize("producer", [b"", b"\x01" * 5, b"\x01" * 7])
def test_build_uuid_rejects_producer_not_six_bytes(producer: bytes) -> None:
    """build_uuid raises ValueError if len(producer) != 6."""
    with pytest.raises(ValueError):
        build_uuid(producer, 12345, 0)


def test_uuid_accessors_are_exact_inverses() -> None:
    """get_clock, get_flags, get_producer_id: exact inverses of build_uuid."""
    rng = random.Random(7)
    for _ in range(200):
        p = new_producer_id()
        c = rng.getrandbits(64)
        f = rng.randrange(0x400)
        u = build_uuid(p, c, f)
        assert (get_clock(u), get_flags(u), get_producer_id(u)) == (c, f, p)
        assert type(get_producer_id(u)) is bytes


def test_nil_uuid_has_clock_zero() -> None:
    """uuid.UUID(int=0) (the nil UUID) has clock 0."""
    assert get_clock(uuid.UUID(int=0)) == 0


def test_new_clock_formula() -> None:
    """new_clock(unix_ns) = ((unix_ns // 100) + 122192928000000000) << 4."""
    for ns in (0, 99, 100, 1_700_000_000_123_456_789):
        assert new_clock(ns) == ((ns // 100) + 122192928000000000) << 4


def test_clock_constructor_value_and_tick() -> None:
    """Clock(value=0); .value; .tick() adds one and returns the new value."""
    assert Clock().value == 0
    c = Clock(41)
    assert c.value == 41
    assert c.tick() == 42 and c.value == 42


def test_clock_update_never_decreases() -> None:
    """.update(unix_ns) sets new_clock(unix_ns) only if larger (sequence bits included)."""
    t = 1_700_000_000_000_000_000
    c = Clock()
    c.update(t)
    assert c.value == new_clock(t)
    c.tick()
    c.tick()
    c.update(t)  # same instant: the ticks are kept
    assert c.value == new_clock(t) + 2
    c.update(t - 10_000)
    assert c.value == new_clock(t) + 2
    c.update(t + 100)
    assert c.value == new_clock(t + 100)


def test_clock_update_none_means_now() -> None:
    """.update(None) sets the clock from the current wall time."""
    before = new_clock(time.time_ns())
    c = Clock()
    c.update()
    assert before <= c.value <= new_clock(time.time_ns())


def test_clock_is_thread_safe() -> None:
    """class Clock: a thread-safe, monotonic clock (concurrent ticks are unique)."""
    c = Clock()
    seen: list[list[int]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        seen[i].extend(c.tick() for _ in range(5000))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    values = [v for s in seen for v in s]
    assert len(set(values)) == 20000 and c.value == 20000


# ---------------------------------------------------------------------------
# 3. message — messages and envelopes
# ---------------------------------------------------------------------------


def test_message_is_a_protocol() -> None:
    """Message (a typing.Protocol): get_uuid, set_uuid, new_acknowledgement."""
    assert typing.Protocol in Message.__mro__
    for name in ("get_uuid", "set_uuid", "new_acknowledgement"):
        assert hasattr(Message, name)


def test_envelope_dataclass_fields() -> None:
    """@dataclass class Envelope: journal, begin, end, message."""
    assert dataclasses.is_dataclass(Envelope)
    assert [f.name for f in dataclasses.fields(Envelope)] == ["journal", "begin", "end", "message"]
    m = Msg()
    e = Envelope(SPEC_A, 3, 9, m)
    assert (e.journal, e.begin, e.end, e.message) == (SPEC_A, 3, 9, m)


def test_journal_producer_named_tuple() -> None:
    """class JournalProducer(NamedTuple): journal: str, producer: bytes."""
    jp = JournalProducer("a/b", P1)
    assert isinstance(jp, tuple) and JournalProducer._fields == ("journal", "producer")
    assert jp == ("a/b", P1) and jp.journal == "a/b" and jp.producer == P1


def test_producer_state_dataclass_fields() -> None:
    """@dataclass class ProducerState: journal, producer, last_ack, begin."""
    assert dataclasses.is_dataclass(ProducerState)
    assert [f.name for f in dataclasses.fields(ProducerState)] == [
        "journal", "producer", "last_ack", "begin"]
    s = ProducerState("a/b", P1, 10, -1)
    assert (s.journal, s.producer, s.last_ack, s.begin) == ("a/b", P1, 10, -1)


class NoUUID(dict[str, Any]):
    """A message type that cannot carry a UUID."""

    def get_uuid(self) -> uuid.UUID:
        return NIL

    def set_uuid(self, u: uuid.UUID) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> NoUUID:
        return NoUUID()


def test_message_without_uuid_opts_out_to_at_least_once(store: LocalJournalStore) -> None:
    """A type returning the nil UUID and ignoring set_uuid is at-least-once."""
    store.create("nouuid/a", NDJSON)
    pub = Publisher(store)
    m = NoUUID(n=1)
    pub.publish_committed(to_journal("nouuid/a"), m).result()
    pub.publish_committed(to_journal("nouuid/a"), m).result()
    assert m.get_uuid() == NIL
    got = list(ReadCommittedIter(store, "nouuid/a", lambda spec: NoUUID()))
    assert [dict(e.message) for e in got] == [{"n": 1}, {"n": 1}]


class InvalidError(Exception):
    pass


class Validated(JsonDocument):
    def validate(self) -> None:
        if "bad" in self:
            raise InvalidError("bad message")


def test_publisher_calls_validate_and_propagates_unchanged(store: LocalJournalStore) -> None:
    """A message's validate() is called first; its exception propagates unchanged."""
    store.create("val/a", NDJSON)
    pub = Publisher(store)
    doc = Validated(bad=1)
    for publish in (pub.publish_committed, pub.publish_uncommitted):
        with pytest.raises(InvalidError) as info:
            publish(to_journal("val/a"), doc)
        assert type(info.value) is InvalidError and str(info.value) == "bad message"
    store.flush()
    with store.read("val/a") as r:
        assert r.read() == b""
    pub.publish_committed(to_journal("val/a"), Validated(good=1)).result()


# ---------------------------------------------------------------------------
# 3. message — Sequencer
# ---------------------------------------------------------------------------


def test_sequencer_signature_defaults() -> None:
    """Sequencer(states: Iterable[ProducerState] = (), buffer: int = 4096)."""
    params = inspect.signature(Sequencer).parameters
    assert list(params)[:2] == ["states", "buffer"]
    assert params["states"].default == () and params["buffer"].default == 4096
    Sequencer()
    Sequencer([ProducerState("a", P1, 5, -1)], 10)


def test_sequencer_buffer_below_one_is_one() -> None:
    """A buffer below 1 is treated as 1 (same output, with replays)."""
    envs = layout(SPEC_A, [(P1, 10, CONTINUE), (P1, 11, CONTINUE), (P2, 5, OUTSIDE),
                           (P1, 12, ACK)])
    expected = key(run_sequencer(envs, buffer=1))
    assert expected == key(model(envs))
    for buffer in (0, -1, -100):
        assert key(run_sequencer(envs, buffer=buffer)) == expected


def test_queue_uncommitted_return_values() -> None:
    """queue_uncommitted: True if it completes a sequence, a duplicate or roll-back, else False."""
    seq = Sequencer()
    envs = layout(SPEC_A, [
        (P1, 10, OUTSIDE),   # commits
        (P1, 10, OUTSIDE),   # duplicate
        (P1, 11, CONTINUE),  # pending
        (P1, 12, CONTINUE),  # pending
        (P1, 12, CONTINUE),  # duplicate
        (P1, 13, ACK),       # commits
        (P1, 13, ACK),       # roll-back to 13 (a duplicate ACK)
        (P1, 14, CONTINUE),  # pending
        (P1, 9, ACK),        # roll-back
    ])
    results = []
    for e in envs:
        results.append(seq.queue_uncommitted(e))
        while seq.deque_committed() is not None:
            pass
    assert results == [True, True, False, False, True, True, True, False, True]


def test_queue_uncommitted_raises_when_committed_remain() -> None:
    """queue_uncommitted raises RuntimeError if committed messages remain to dequeue."""
    seq = Sequencer()
    a, b = layout(SPEC_A, [(P1, 10, OUTSIDE), (P1, 11, OUTSIDE)])
    assert seq.queue_uncommitted(a) is True
    with pytest.raises(RuntimeError):
        seq.queue_uncommitted(b)
    assert seq.deque_committed() is a
    assert seq.deque_committed() is None
    seq.queue_uncommitted(b)


def test_deque_committed_returns_none_when_empty() -> None:
    """deque_committed() -> Envelope | None: None when none remain."""
    seq = Sequencer()
    assert seq.deque_committed() is None
    (e,) = layout(SPEC_A, [(P1, 10, CONTINUE)])
    seq.queue_uncommitted(e)
    assert seq.deque_committed() is None


def make_replay_case(start: int = 100) -> tuple[Sequencer, list[Envelope], int, int]:
    envs = layout(SPEC_A, [(P1, 10, CONTINUE), (P1, 11, CONTINUE), (P1, 12, CONTINUE),
                           (P1, 13, ACK)], start=start)
    seq = Sequencer(buffer=1)
    for e in envs[:-1]:
        seq.queue_uncommitted(e)
        assert seq.deque_committed() is None
    seq.queue_uncommitted(envs[-1])
    with pytest.raises(MustStartReplay):
        seq.deque_committed()
    b, end = seq.replay_range()
    return seq, envs, b, end


def test_must_start_replay_and_replay_range() -> None:
    """deque_committed raises MustStartReplay; replay_range() -> [begin, end); start_replay."""
    seq, envs, b, end = make_replay_case()
    assert isinstance((b, end), tuple) and type(b) is int and type(end) is int
    assert b == 100 and b < end <= envs[-1].begin
    seq.start_replay(replay_source(envs, SPEC_A.name, b, end))
    out = []
    while (c := seq.deque_committed()) is not None:
        out.append(c)
    assert key(out) == key(envs)


def test_replay_of_another_journal_raises_replay_error() -> None:
    """A replayed envelope of another journal raises ReplayError."""
    seq, envs, b, end = make_replay_case()
    other = [mk(SPEC_B, e.begin, P1, get_clock(e.message.get_uuid()), CONTINUE)
             for e in envs if b <= e.begin and e.end <= end]
    with pytest.raises(ReplayError):
        seq.start_replay(iter(other))
        while seq.deque_committed() is not None:
            pass


def test_replay_envelope_before_range_raises_replay_error() -> None:
    """A replayed envelope with begin before the range raises ReplayError."""
    seq, envs, b, end = make_replay_case()
    early = [mk(SPEC_A, b - 10, P3, 5, OUTSIDE), *replay_source(envs, SPEC_A.name, b, end)]
    with pytest.raises(ReplayError):
        seq.start_replay(iter(early))
        while seq.deque_committed() is not None:
            pass


def test_replay_envelope_ending_after_range_raises_replay_error() -> None:
    """A replayed envelope with end after the range raises ReplayError."""
    seq, envs, _, end = make_replay_case()
    first = envs[0]
    long = Envelope(first.journal, first.begin, end + 5, first.message)
    with pytest.raises(ReplayError):
        seq.start_replay(iter([long]))
        while seq.deque_committed() is not None:
            pass


def test_replay_iterator_exception_is_chained() -> None:
    """An exception from the replay iterator is raised as ReplayError chained to it."""
    seq, _, _, _ = make_replay_case()
    boom = OSError("disk on fire")

    def failing() -> Iterator[Envelope]:
        raise boom
        yield  # pragma: no cover

    with pytest.raises(ReplayError) as info:
        seq.start_replay(failing())
        while seq.deque_committed() is not None:
            pass
    assert info.value.__cause__ is boom


def test_has_pending() -> None:
    """has_pending(since): True if any partial sequence begins at or after its journal's offset."""
    seq = Sequencer()
    (e,) = layout(SPEC_A, [(P1, 10, CONTINUE)], start=100)
    seq.queue_uncommitted(e)
    assert seq.has_pending({SPEC_A.name: 50}) is True
    assert seq.has_pending({SPEC_A.name: 100}) is True
    assert seq.has_pending({SPEC_A.name: 101}) is False


def test_has_pending_missing_journal_is_offset_zero() -> None:
    """has_pending treats a journal missing from `since` as offset 0."""
    seq = Sequencer()
    (e,) = layout(SPEC_A, [(P1, 10, CONTINUE)], start=100)
    seq.queue_uncommitted(e)
    assert seq.has_pending({}) is True
    assert seq.has_pending({SPEC_B.name: 10_000}) is True
    assert Sequencer().has_pending({}) is False


def test_producer_states_snapshot() -> None:
    """producer_states() -> list[ProducerState]: last_ack and begin of each producer."""
    seq = Sequencer()
    envs = layout(SPEC_A, [(P1, 10, OUTSIDE), (P2, 20, CONTINUE), (P2, 21, CONTINUE)])
    for e in envs:
        seq.queue_uncommitted(e)
        while seq.deque_committed() is not None:
            pass
    states = seq.producer_states()
    assert isinstance(states, list)
    by = {s.producer: s for s in states}
    assert by[P1] == ProducerState(SPEC_A.name, P1, 10, -1)
    assert by[P2] == ProducerState(SPEC_A.name, P2, 19, 10)


def test_producer_states_raises_when_messages_remain() -> None:
    """producer_states raises RuntimeError if messages remain to dequeue."""
    seq = Sequencer()
    (e,) = layout(SPEC_A, [(P1, 10, OUTSIDE)])
    seq.queue_uncommitted(e)
    with pytest.raises(RuntimeError):
        seq.producer_states()


def _prune(horizon: float | datetime.timedelta) -> set[bytes]:
    newest = new_clock(1_700_000_000_000_000_000)
    states = [
        ProducerState(SPEC_A.name, P1, newest, -1),
        ProducerState(SPEC_A.name, P2, newest - (10 << 4), -1),  # 1 µs older
        ProducerState(SPEC_B.name, P3, newest - (10_000_000 << 4), -1),  # alone in its journal
    ]
    return {s.producer for s in Sequencer(states).producer_states(horizon)}


def test_producer_states_prune_horizon() -> None:
    """A horizon > 0 prunes producers more than the horizon older than their journal's newest."""
    assert _prune(0) == {P1, P2, P3}
    assert _prune(1e-6) == {P1, P2, P3}  # exactly 1 µs older: not *more* than
    assert _prune(0.9e-6) == {P1, P3}
    assert _prune(datetime.timedelta(microseconds=1)) == {P1, P2, P3}
    assert _prune(-5) == {P1, P2, P3}


def test_prune_horizon_compared_with_zero_before_rounding() -> None:
    """The prune horizon is compared with 0 before it is rounded to Clock units."""
    assert _prune(1e-9) == {P1, P3}  # rounds to 0 units, but is > 0: prunes
    assert _prune(datetime.timedelta(0)) == {P1, P2, P3}


def test_first_seen_producer_starts_at_clock_minus_one() -> None:
    """A producer first seen with clock c starts at last_ack = c - 1."""
    seq = Sequencer()
    (e,) = layout(SPEC_A, [(P1, 500, CONTINUE)])
    seq.queue_uncommitted(e)
    (s,) = seq.producer_states()
    assert s.last_ack == 499 and s.begin == 0


def test_outside_txn_duplicates_and_unknown_flags() -> None:
    """OUTSIDE_TXN (and unknown flags): clock <= last_ack is a duplicate, otherwise commits."""
    envs = layout(SPEC_A, [(P1, 10, OUTSIDE), (P1, 10, OUTSIDE), (P1, 9, 0x3F0),
                           (P1, 11, 0x3F0), (P1, 11, OUTSIDE), (P1, 12, OUTSIDE)])
    assert [e.begin for e in run_sequencer(envs)] == [0, 30, 50]


def test_outside_txn_discards_open_span() -> None:
    """OUTSIDE_TXN commits itself and discards any open span."""
    envs = layout(SPEC_A, [(P1, 10, CONTINUE), (P1, 11, OUTSIDE), (P1, 12, ACK)])
    assert [e.begin for e in run_sequencer(envs)] == [10, 20]


def test_continue_duplicates_recognised_outside_the_ring() -> None:
    """CONTINUE_TXN duplicates are recognised whether or not their originals are buffered."""
    envs = layout(SPEC_A, [(P1, 10, CONTINUE), (P1, 11, CONTINUE), (P2, 5, OUTSIDE),
                           (P2, 6, OUTSIDE), (P1, 10, CONTINUE), (P1, 11, CONTINUE),
                           (P1, 12, ACK)])
    for buffer in (1, 2, 4096):
        assert [e.begin for e in run_sequencer(envs, buffer)] == [20, 30, 0, 10, 60]


def test_ack_at_or_below_last_ack_rolls_back() -> None:
    """ACK_TXN with clock <= last_ack rolls back: the open span is discarded, last_ack = clock."""
    envs = layout(SPEC_A, [(P1, 10, OUTSIDE), (P1, 11, CONTINUE), (P1, 12, CONTINUE),
                           (P1, 10, ACK), (P1, 11, CONTINUE), (P1, 12, ACK)])
    out = run_sequencer(envs)
    assert [e.begin for e in out] == [0, 40, 50]


def test_ack_commit_drops_clocks_larger_than_ack() -> None:
    """A CONTINUE_TXN appended before its ACK but with a larger clock than that ACK is dropped."""
    envs = layout(SPEC_A, [(P1, 10, CONTINUE), (P1, 12, CONTINUE), (P1, 11, ACK)])
    for buffer in (1, 4096):
        assert [e.begin for e in run_sequencer(envs, buffer)] == [0, 20]


def test_nil_clock_always_commits_and_is_never_tracked() -> None:
    """Envelopes whose clock is 0 (the nil UUID included) always commit and are never tracked."""
    envs = layout(SPEC_A, [(P1, 0, OUTSIDE), (P1, 0, OUTSIDE), (P1, 0, CONTINUE)])
    seq = Sequencer()
    out: list[Envelope] = []
    for e in envs:
        assert seq.queue_uncommitted(e) is True
        drain(seq, envs, SPEC_A.name, out)
    assert [e.begin for e in out] == [0, 10, 20]
    assert seq.producer_states() == []


def test_output_in_commit_order_each_in_offset_order() -> None:
    """Output order is the order in which sequences commit, each in offset order."""
    envs = layout(SPEC_A, [(P1, 10, CONTINUE), (P2, 10, CONTINUE), (P1, 11, CONTINUE),
                           (P2, 11, ACK), (P3, 7, OUTSIDE), (P1, 12, ACK)])
    assert [e.begin for e in run_sequencer(envs)] == [10, 30, 40, 0, 20, 50]


def test_dropped_envelopes_take_no_ring_slot() -> None:
    """The ring holds the last `buffer` kept envelopes (duplicates and roll-backs take no slot)."""
    envs = layout(SPEC_A, [(P1, 10, CONTINUE),
                           *[(P1, 10, CONTINUE)] * 5,  # duplicates
                           (P2, 5, OUTSIDE), *[(P2, 4, ACK)] * 5,  # roll-backs
                           (P1, 11, ACK)])
    replays: list[int] = []
    out = run_sequencer(envs, buffer=3, replays=replays)
    assert key(out) == key(model(envs)) and replays == []


def test_output_identical_for_every_buffer_size() -> None:
    """The committed output must be identical for every buffer size (it follows the SPEC rules)."""
    for seed in range(60):
        envs = random_workload(random.Random(seed))
        expected = key(model(envs))
        for buffer in (1, 2, 3, 7, 4096):
            assert key(run_sequencer(envs, buffer)) == expected, (seed, buffer)


def test_output_identical_across_checkpoints() -> None:
    """The committed output must be identical across checkpoints (producer_states + resume)."""
    for seed in range(40):
        rng = random.Random(1000 + seed)
        envs = random_workload(rng)
        expected = key(model(envs))
        cut = rng.randrange(len(envs) + 1)
        buffer = rng.choice([1, 2, 4096])
        seq = Sequencer(buffer=buffer)
        out: list[Envelope] = []
        for e in envs[:cut]:
            seq.queue_uncommitted(e)
            drain(seq, envs, e.journal.name, out)
        resumed = Sequencer(seq.producer_states(), buffer=buffer)
        for e in envs[cut:]:
            resumed.queue_uncommitted(e)
            drain(resumed, envs, e.journal.name, out)
        assert key(out) == expected, seed


# ---------------------------------------------------------------------------
# 3. message — checkpoints
# ---------------------------------------------------------------------------


def test_checkpoint_fields_and_default_ack_intents() -> None:
    """@dataclass Checkpoint: offsets, states, ack_intents (default empty)."""
    assert dataclasses.is_dataclass(Checkpoint)
    names = [f.name for f in dataclasses.fields(Checkpoint)]
    assert names[:3] == ["offsets", "states", "ack_intents"]
    cp = Checkpoint(offsets={"a": 1}, states=[])
    assert cp.ack_intents == {}
    assert Checkpoint({"a": 1}, []).ack_intents is not Checkpoint({"a": 1}, []).ack_intents


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def test_checkpoint_decodes_gazette_wire_format() -> None:
    """from_bytes reads Gazette's consumer Checkpoint (sources, producers, ack_intents)."""
    last_ack = new_clock(1_700_000_000_000_000_000) + 3
    state = b"\x09" + last_ack.to_bytes(8, "little") + b"\x10" + _varint(-1)  # fixed64, int64
    entry = _field(1, P1) + _field(2, state)
    source = b"\x08" + _varint(4096) + _field(2, entry)
    wire = (_field(1, _field(1, b"x/y") + _field(2, source))
            + _field(2, _field(1, b"x/y") + _field(2, b"ack-bytes")))
    cp = Checkpoint.from_bytes(wire)
    assert cp.offsets == {"x/y": 4096}
    assert cp.states == [ProducerState("x/y", P1, last_ack, -1)]
    assert cp.ack_intents == {"x/y": b"ack-bytes"}


def test_checkpoint_bytes_round_trip_and_fixed64_last_ack() -> None:
    """to_bytes() / Checkpoint.from_bytes(b) round-trip; last_ack is a fixed64."""
    last_ack = 0xFEDCBA9876543210
    cp = Checkpoint(offsets={"x/y": 7, "x/z": 0},
                    states=[ProducerState("x/y", P1, last_ack, 3),
                            ProducerState("x/z", P2, 1, -1)],
                    ack_intents={"x/y": b"\x00\x01"})
    b = cp.to_bytes()
    assert isinstance(b, bytes)
    assert b"\x09" + last_ack.to_bytes(8, "little") in b
    back = Checkpoint.from_bytes(b)
    assert back.offsets == cp.offsets and back.ack_intents == cp.ack_intents
    assert sorted(back.states, key=lambda s: s.journal) == cp.states


def test_checkpoint_json_round_trip() -> None:
    """to_json() / from_json() encode a Checkpoint as JSON."""
    cp = Checkpoint(offsets={"x/y": 7}, states=[ProducerState("x/y", P1, 2**63 + 5, 3)],
                    ack_intents={"x/y": b"\xff\x00"})
    text = cp.to_json()
    orjson.loads(text)
    back = Checkpoint.from_json(text)
    assert (back.offsets, back.states, back.ack_intents) == (cp.offsets, cp.states, cp.ack_intents)


def test_checkpoint_garbage_raises_library_error() -> None:
    """Errors raised by the library derive from MessageError (or are ValueError)."""
    with pytest.raises((MessageError, ValueError)):
        Checkpoint.from_bytes(b"\xff\xff\xff")
    with pytest.raises((MessageError, ValueError)):
        Checkpoint.from_json("not json")


# ---------------------------------------------------------------------------
# 3. message — mapping
# ---------------------------------------------------------------------------


def fnv1a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def murmur(data: bytes) -> int:
    return mmh3.hash(data, 0, signed=False)


PARTS = [JournalSpec(f"topic/part-{i:03d}", NDJSON) for i in range(7)]
KEYS = [f"key-{i}" for i in range(200)]


@pytest.mark.parametrize(("hash_name", "h"), [("mmh3", murmur), ("fnv1a", fnv1a)])
def test_modulo_mapping_hashes(hash_name: str, h: Any) -> None:
    """modulo picks index h(key) % n (mmh3: 32-bit unsigned, seed 0; fnv1a: 32-bit FNV-1a)."""
    m = modulo_mapping(lambda k: k, lambda: PARTS, hash=hash_name)
    for k in KEYS:
        assert m(k) == (PARTS[h(k.encode()) % len(PARTS)].name, CONTENT_TYPE_JSON_LINES)


@pytest.mark.parametrize(("hash_name", "h"), [("mmh3", murmur), ("fnv1a", fnv1a)])
def test_rendezvous_mapping_hashes(hash_name: str, h: Any) -> None:
    """rendezvous picks the first index with the strictly largest h(key) ^ h(journal name)."""
    m = rendezvous_mapping(lambda k: k, lambda: PARTS, hash=hash_name)
    for k in KEYS:
        scores = [h(k.encode()) ^ h(p.name.encode()) for p in PARTS]
        assert m(k)[0] == PARTS[scores.index(max(scores))].name


def test_rendezvous_ties_pick_first_index() -> None:
    """rendezvous: the first index with the strictly largest score wins ties."""
    twins = [JournalSpec("same/name", {"content-type": CONTENT_TYPE_CSV}),
             JournalSpec("same/name", NDJSON)]
    m = rendezvous_mapping(lambda k: k, lambda: twins)
    assert m("anything") == ("same/name", CONTENT_TYPE_CSV)


def test_mapping_default_hash_is_mmh3() -> None:
    """modulo_mapping / rendezvous_mapping: hash="mmh3" is the keyword-only default."""
    for f in (modulo_mapping, rendezvous_mapping):
        p = inspect.signature(f).parameters["hash"]
        assert p.default == "mmh3" and p.kind is inspect.Parameter.KEYWORD_ONLY


def test_mapping_str_key_is_utf8_of_bytes_key() -> None:
    """key(msg) -> bytes | str (str is UTF-8 encoded)."""
    for make in (modulo_mapping, rendezvous_mapping):
        for hash_name in ("mmh3", "fnv1a"):
            by_str = make(lambda k: k, lambda: PARTS, hash=hash_name)
            by_bytes = make(lambda k: k.encode("utf-8"), lambda: PARTS, hash=hash_name)
            for k in ["ü-straße", "日本", "plain", *KEYS[:50]]:
                assert by_str(k) == by_bytes(k)


def test_mapping_returns_journal_and_content_type() -> None:
    """mapping(msg) -> tuple[str, str] = (journal name, content type)."""
    parts = [JournalSpec("csv/a", {"content-type": CONTENT_TYPE_CSV})]
    for m in (modulo_mapping(lambda k: k, lambda: parts),
              rendezvous_mapping(lambda k: k, lambda: parts), random_mapping(lambda: parts)):
        assert m("k") == ("csv/a", CONTENT_TYPE_CSV)


def test_mapping_follows_new_partitions_not_identical_by_is() -> None:
    """Only a partitions() result identical by `is` to the last one may reuse cached hashes."""
    current = [PARTS]
    for make in (modulo_mapping, rendezvous_mapping):
        m = make(lambda k: k, lambda: current[0])
        for k in KEYS[:20]:
            current[0] = PARTS
            assert m(k)[0] in {p.name for p in PARTS}
            renamed = [JournalSpec(p.name.replace("topic", "other"), NDJSON) for p in PARTS]
            current[0] = renamed
            expected = make(lambda k: k, lambda r=renamed: r)(k)  # type: ignore[misc]
            assert m(k) == expected
            current[0] = renamed[:3]
            assert m(k)[0] in {p.name for p in renamed[:3]}


def test_random_mapping_picks_a_partition() -> None:
    """random_mapping(partitions) returns a MappingFunc over the partitions."""
    m = random_mapping(lambda: PARTS)
    seen = {m(object())[0] for _ in range(300)}
    assert seen <= {p.name for p in PARTS} and len(seen) > 1


def test_empty_partitions_error() -> None:
    """No partitions: raise EmptyPartitionsError (a MessageError)."""
    assert issubclass(EmptyPartitionsError, MessageError)
    for m in (modulo_mapping(lambda k: k, lambda: []),
              rendezvous_mapping(lambda k: k, lambda: []), random_mapping(lambda: [])):
        with pytest.raises(EmptyPartitionsError):
            m("k")


# ---------------------------------------------------------------------------
# 3. message — Publisher
# ---------------------------------------------------------------------------


def uncommitted(store: LocalJournalStore, name: str) -> list[Envelope]:
    return list(ReadUncommittedIter(store, name, lambda spec: JsonDocument()))


def test_publisher_signature_and_producer_id(store: LocalJournalStore) -> None:
    """Publisher(client, clock=None); .producer_id -> bytes."""
    params = inspect.signature(Publisher).parameters
    assert list(params) == ["client", "clock"] and params["clock"].default is None
    p = Publisher(store)
    assert type(p.producer_id) is bytes and len(p.producer_id) == 6
    assert p.producer_id[0] & 1 == 1
    assert Publisher(store).producer_id != p.producer_id


def test_publish_committed(store: LocalJournalStore) -> None:
    """publish_committed -> Future[AppendResult]: OUTSIDE_TXN UUID, framed by the journal."""
    store.create("pub/a", NDJSON)
    pub = Publisher(store)
    fut = pub.publish_committed(to_journal("pub/a"), JsonDocument(n=1))
    assert isinstance(fut, concurrent.futures.Future)
    res = fut.result()
    assert isinstance(res, AppendResult) and res.journal == "pub/a" and res.begin == 0
    (env,) = uncommitted(store, "pub/a")
    u = env.message.get_uuid()
    assert get_flags(u) == Flags.OUTSIDE_TXN and get_producer_id(u) == pub.producer_id
    assert (env.begin, env.end) == (res.begin, res.end) and env.message["n"] == 1


def test_publisher_without_clock_follows_wall_clock(store: LocalJournalStore) -> None:
    """With no clock the Publisher updates its own from the wall clock on each publish."""
    store.create("pub/w", NDJSON)
    before = new_clock(time.time_ns())
    Publisher(store).publish_committed(to_journal("pub/w"), JsonDocument()).result()
    after = new_clock(time.time_ns())
    (env,) = uncommitted(store, "pub/w")
    assert before < get_clock(env.message.get_uuid()) <= after + 16


def test_publisher_with_given_clock_ticks_it(store: LocalJournalStore) -> None:
    """Publisher(client, clock): each publish ticks the given clock."""
    store.create("pub/c", NDJSON)
    clock = Clock(5000 << 4)
    pub = Publisher(store, clock)
    pub.publish_committed(to_journal("pub/c"), JsonDocument()).result()
    pub.publish_committed(to_journal("pub/c"), JsonDocument()).result()
    clocks = [get_clock(e.message.get_uuid()) for e in uncommitted(store, "pub/c")]
    assert clocks == [(5000 << 4) + 1, (5000 << 4) + 2] and clock.value == (5000 << 4) + 2


def test_publish_committed_concurrent_clocks_increase_per_journal(
        store: LocalJournalStore) -> None:
    """Safe for concurrent use; UUID clocks appear in each journal in increasing order."""
    for j in ("conc/a", "conc/b"):
        store.create(j, NDJSON)
    pub = Publisher(store)

    def work(i: int) -> None:
        for n in range(100):
            pub.publish_committed(to_journal(f"conc/{'ab'[(i + n) % 2]}"), JsonDocument(n=n))

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(work, range(4)))
    store.flush()
    total = 0
    for j in ("conc/a", "conc/b"):
        clocks = [get_clock(e.message.get_uuid()) for e in uncommitted(store, j)]
        total += len(clocks)
        assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
    assert total == 400


def test_publish_uncommitted_and_ack_intents(store: LocalJournalStore) -> None:
    """publish_uncommitted: CONTINUE_TXN; build_ack_intents: first-publish order, fresh clocks."""
    for j in ("tx/a", "tx/b", "tx/c"):
        store.create(j, NDJSON)
    pub = Publisher(store)
    for j in ("tx/b", "tx/a", "tx/b", "tx/c", "tx/a"):
        fut = pub.publish_uncommitted(to_journal(j), JsonDocument(j=j))
        assert isinstance(fut.result(), AppendResult)
    published = [e for j in ("tx/a", "tx/b", "tx/c") for e in uncommitted(store, j)]
    assert {get_flags(e.message.get_uuid()) for e in published} == {Flags.CONTINUE_TXN}
    top = max(get_clock(e.message.get_uuid()) for e in published)

    intents = pub.build_ack_intents()
    assert isinstance(intents, list) and all(isinstance(i, AckIntent) for i in intents)
    assert [i.journal for i in intents] == ["tx/b", "tx/a", "tx/c"]
    framing = framing_by_content_type(CONTENT_TYPE_JSON_LINES)
    clocks = []
    for i in intents:
        assert isinstance(i.intent, bytes)
        doc = JsonDocument()
        framing.new_unmarshal_func(io.BytesIO(i.intent))(doc)
        u = doc.get_uuid()
        assert get_flags(u) == Flags.ACK_TXN and get_producer_id(u) == pub.producer_id
        clocks.append(get_clock(u))
    assert top < clocks[0] < clocks[1] < clocks[2]
    assert pub.build_ack_intents() == []

    for i in intents:
        store.append(i.journal, i.intent).result()
    committed = list(ReadCommittedIter(store, "tx/b", lambda spec: JsonDocument()))
    assert [get_flags(e.message.get_uuid()) for e in committed] == [1, 1, 2]


def test_publish_committed_leaves_no_ack_intent(store: LocalJournalStore) -> None:
    """Only publish_uncommitted remembers the journal for the next build_ack_intents."""
    store.create("tx/d", NDJSON)
    pub = Publisher(store)
    pub.publish_committed(to_journal("tx/d"), JsonDocument()).result()
    assert pub.build_ack_intents() == []


def test_ack_intent_dataclass() -> None:
    """@dataclass class AckIntent: journal: str, intent: bytes."""
    assert dataclasses.is_dataclass(AckIntent)
    assert [f.name for f in dataclasses.fields(AckIntent)] == ["journal", "intent"]


# ---------------------------------------------------------------------------
# 3. message — read iterators
# ---------------------------------------------------------------------------


def test_read_uncommitted_iter(store: LocalJournalStore) -> None:
    """ReadUncommittedIter yields Envelopes; new_message(spec); offset and end_offset."""
    spec = store.create("ru/a", NDJSON)
    pub = Publisher(store)
    results = [pub.publish_committed(to_journal("ru/a"), JsonDocument(n=n)).result()
               for n in range(3)]
    seen_specs: list[JournalSpec] = []

    def new_message(s: JournalSpec) -> JsonDocument:
        seen_specs.append(s)
        return JsonDocument()

    envs = list(ReadUncommittedIter(store, "ru/a", new_message))
    assert all(isinstance(e, Envelope) for e in envs)
    assert [(e.begin, e.end) for e in envs] == [(r.begin, r.end) for r in results]
    assert all(e.journal == spec for e in envs) and seen_specs[0] == spec
    assert [e.message["n"] for e in envs] == [0, 1, 2]
    mid = list(ReadUncommittedIter(store, "ru/a", new_message, offset=results[1].begin,
                                   end_offset=results[1].end))
    assert [e.message["n"] for e in mid] == [1]


def test_read_uncommitted_iter_block_waits_for_appends(store: LocalJournalStore) -> None:
    """With block=True the iterator waits for new appends."""
    store.create("ru/b", NDJSON)
    frame = b'{"n": 7}\n'
    it = ReadUncommittedIter(store, "ru/b", lambda s: JsonDocument(), block=True,
                             end_offset=len(frame))
    timer = threading.Timer(0.2, lambda: store.append("ru/b", frame))
    timer.start()
    try:
        got = list(it)
    finally:
        timer.join()
    assert [e.message["n"] for e in got] == [7]


def test_read_iterators_use_content_type_framing(store: LocalJournalStore) -> None:
    """Framing comes from the journal's content-type label."""

    class Row:
        def __init__(self) -> None:
            self.fields: list[str] = []

        def get_uuid(self) -> uuid.UUID:
            return uuid.UUID(self.fields[0]) if self.fields else NIL

        def set_uuid(self, u: uuid.UUID) -> None:
            self.fields[0:1] = [str(u)]

        def new_acknowledgement(self, journal: str) -> Row:
            r = Row()
            r.fields = [str(NIL)]
            return r

        def marshal_csv(self) -> list[str]:
            return self.fields

        def unmarshal_csv(self, fields: list[str]) -> None:
            self.fields = list(fields)

    store.create("csv/a", {"content-type": CONTENT_TYPE_CSV})
    r = Row()
    r.fields = [str(NIL), "a,b", 'q"x']
    Publisher(store).publish_committed(lambda m: ("csv/a", CONTENT_TYPE_CSV), r).result()
    with store.read("csv/a") as rd:
        raw = rd.read()
    assert raw.endswith(b'"a,b","q""x"\n')
    (env,) = list(ReadCommittedIter(store, "csv/a", lambda s: Row()))
    assert env.message.fields[1:] == ["a,b", 'q"x']


def transaction_journal(store: LocalJournalStore, name: str) -> None:
    """Two producers interleaving committed messages, a transaction and a retry."""
    store.create(name, NDJSON)
    p1, p2 = Publisher(store), Publisher(store)
    to = to_journal(name)
    p1.publish_committed(to, JsonDocument(n="m1")).result()
    t1 = p2.publish_uncommitted(to, JsonDocument(n="t1")).result()
    p1.publish_committed(to, JsonDocument(n="m2")).result()
    p2.publish_uncommitted(to, JsonDocument(n="t2")).result()
    with store.read(name, t1.begin, t1.end) as r:
        store.append(name, r.read()).result()  # an at-least-once retry
    p1.publish_committed(to, JsonDocument(n="m3")).result()
    for i in p2.build_ack_intents():
        store.append(i.journal, i.intent).result()
    p2.publish_uncommitted(to, JsonDocument(n="t3")).result()  # never acknowledged
    p1.publish_committed(to, JsonDocument(n="m4")).result()


def names(envs: list[Envelope]) -> list[Any]:
    return [e.message.get("n") for e in envs]


def test_read_committed_iter_sequences(store: LocalJournalStore) -> None:
    """ReadCommittedIter composes ReadUncommittedIter with a Sequencer, replays itself."""
    transaction_journal(store, "rc/a")
    expected = ["m1", "m2", "m3", "t1", "t2", None, "m4"]
    assert names(list(ReadCommittedIter(store, "rc/a", lambda s: JsonDocument()))) == expected
    small = ReadCommittedIter(store, "rc/a", lambda s: JsonDocument(), Sequencer(buffer=1))
    assert names(list(small)) == expected


@pytest.mark.parametrize("buffer", [1, 4096])
def test_read_committed_checkpoint_between_yields(store: LocalJournalStore, buffer: int) -> None:
    """checkpoint() between any yields (or before the first): resuming loses and repeats nothing."""
    transaction_journal(store, "rc/b")
    full = list(ReadCommittedIter(store, "rc/b", lambda s: JsonDocument()))
    for k in range(len(full) + 1):
        it = ReadCommittedIter(store, "rc/b", lambda s: JsonDocument(), Sequencer(buffer=buffer))
        head = [next(it) for _ in range(k)]
        cp = it.checkpoint()
        assert isinstance(cp, Checkpoint)
        cp = Checkpoint.from_bytes(cp.to_bytes())
        rest = list(ReadCommittedIter(store, "rc/b", lambda s: JsonDocument(),
                                      Sequencer(buffer=buffer), checkpoint=cp))
        assert key(head + rest) == key(full), k


def test_read_committed_checkpoint_inside_open_transaction(store: LocalJournalStore) -> None:
    """A checkpoint taken while a transaction is open resumes it once its ACK arrives."""
    store.create("rc/d", NDJSON)
    pub, other = Publisher(store), Publisher(store)
    pub.publish_uncommitted(to_journal("rc/d"), JsonDocument(n="t1")).result()
    other.publish_committed(to_journal("rc/d"), JsonDocument(n="m1")).result()
    pub.publish_uncommitted(to_journal("rc/d"), JsonDocument(n="t2")).result()
    it = ReadCommittedIter(store, "rc/d", lambda s: JsonDocument())
    assert names(list(it)) == ["m1"]
    cp = Checkpoint.from_bytes(it.checkpoint().to_bytes())
    for i in pub.build_ack_intents():
        store.append(i.journal, i.intent).result()
    rest = list(ReadCommittedIter(store, "rc/d", lambda s: JsonDocument(), checkpoint=cp))
    assert names(rest) == ["t1", "t2", None]


def test_read_committed_checkpoint_signature() -> None:
    """.checkpoint(prune_horizon=0) -> Checkpoint."""
    p = inspect.signature(ReadCommittedIter.checkpoint).parameters["prune_horizon"]
    assert p.default == 0
    params = inspect.signature(ReadCommittedIter).parameters
    assert list(params)[:4] == ["client", "journal", "new_message", "sequencer"]
    assert params["sequencer"].default is None
    for name, default in (("offset", 0), ("end_offset", None), ("block", False),
                          ("checkpoint", None)):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default
    params = inspect.signature(ReadUncommittedIter).parameters
    assert list(params)[:3] == ["client", "journal", "new_message"]
    for name, default in (("offset", 0), ("end_offset", None), ("block", False)):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default


def test_read_committed_checkpoint_with_sequencer_alongside(store: LocalJournalStore) -> None:
    """A sequencer passed alongside a checkpoint takes the checkpoint's producer states."""
    transaction_journal(store, "rc/c")
    full = list(ReadCommittedIter(store, "rc/c", lambda s: JsonDocument()))
    it = ReadCommittedIter(store, "rc/c", lambda s: JsonDocument())
    head = [next(it), next(it), next(it)]
    cp = it.checkpoint()
    seq = Sequencer([ProducerState("rc/c", P1, 1, -1)], buffer=1)
    rest = list(ReadCommittedIter(store, "rc/c", lambda s: JsonDocument(), seq, checkpoint=cp))
    assert key(head + rest) == key(full)
    assert all(s.producer != P1 for s in seq.producer_states())


# ---------------------------------------------------------------------------
# 3. message — errors
# ---------------------------------------------------------------------------


def test_message_error_hierarchy() -> None:
    """MustStartReplay, ReplayError, EmptyPartitionsError derive from MessageError."""
    assert issubclass(MessageError, Exception)
    for cls in (MustStartReplay, ReplayError, EmptyPartitionsError):
        assert issubclass(cls, MessageError)


def test_library_errors_derive_from_package_bases(store: LocalJournalStore) -> None:
    """Errors derive from MessageError / FramingError / JournalError (or ValueError)."""
    store.create("err/noct", {})
    store.create("err/bad", NDJSON)
    store.append("err/bad", b"not json\n").result()
    with pytest.raises(JournalNotFoundError):
        store.append("err/none", b"x\n").result()
    with pytest.raises(JournalNotFoundError):
        store.read("err/none")
    with pytest.raises(JournalNotFoundError):
        list(ReadUncommittedIter(store, "err/none", lambda s: JsonDocument()))
    with pytest.raises(FramingError):
        list(ReadUncommittedIter(store, "err/noct", lambda s: JsonDocument()))
    with pytest.raises(FramingError):
        list(ReadCommittedIter(store, "err/bad", lambda s: JsonDocument()))
    with pytest.raises(FramingError):
        Publisher(store).publish_committed(lambda m: ("err/bad", CONTENT_TYPE_CSV),
                                           JsonDocument(n=1))


# ---------------------------------------------------------------------------
# 4. framing
# ---------------------------------------------------------------------------


def test_framing_constants() -> None:
    """Content types and the fixed frame word and header length."""
    assert CONTENT_TYPE_CSV == "text/csv"
    assert CONTENT_TYPE_JSON_LINES == "application/x-ndjson"
    assert CONTENT_TYPE_PROTO_FIXED == "application/x-protobuf-fixed"
    assert FIXED_FRAME_WORD == b"\x66\x33\x93\x36"
    assert FIXED_FRAME_HEADER_LENGTH == 8


def test_builtin_framings_registered() -> None:
    """framing_by_content_type(ct) -> Framing for the three built-in content types."""
    for ct in (CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_PROTO_FIXED):
        assert framing_by_content_type(ct).content_type == ct


def test_unknown_content_type_error() -> None:
    """UnknownContentTypeError (FramingError and ValueError): `unrecognized content-type (<ct>)`."""
    assert issubclass(UnknownContentTypeError, FramingError)
    assert issubclass(UnknownContentTypeError, ValueError)
    with pytest.raises(UnknownContentTypeError) as info:
        framing_by_content_type("application/x-nope")
    assert str(info.value) == "unrecognized content-type (application/x-nope)"


class UpperFraming:
    content_type = "application/x-spec-test-upper"

    def marshal(self, msg: Any) -> bytes:
        return msg["text"].upper().encode() + b"\n"

    def new_unmarshal_func(self, r: io.BufferedIOBase) -> Any:
        def unmarshal(msg: Any) -> None:
            line = unpack_line(r)
            if not line:
                raise EOFError
            msg["text"] = line[:-1].decode()
        return unmarshal


def test_register_framing() -> None:
    """register_framing(f) makes f available by its content type."""
    register_framing(UpperFraming())
    f = framing_by_content_type(UpperFraming.content_type)
    assert f.marshal({"text": "hi"}) == b"HI\n"


def test_register_framing_used_by_journals(store: LocalJournalStore) -> None:
    """A registered framing serves journals whose content-type label names it."""
    register_framing(UpperFraming())
    store.create("custom/a", {"content-type": UpperFraming.content_type})
    store.append("custom/a", b"ONE\nTWO\n").result()
    got = list(ReadUncommittedIter(store, "custom/a", lambda s: NoUUID()))
    assert [e.message["text"] for e in got] == ["ONE", "TWO"]
    assert [(e.begin, e.end) for e in got] == [(0, 4), (4, 8)]
    committed = list(ReadCommittedIter(store, "custom/a", lambda s: NoUUID(), offset=4))
    assert [(e.begin, e.message["text"]) for e in committed] == [(4, "TWO")]


def frames_of(ct: str) -> tuple[Any, list[bytes], Any]:
    """A framing, two marshalled frames, and a fresh-message factory."""
    f = framing_by_content_type(ct)
    if ct == CONTENT_TYPE_JSON_LINES:
        return f, [f.marshal({"a": 1}), f.marshal({"b": [1, 2]})], dict
    if ct == CONTENT_TYPE_CSV:
        rows = [CsvRow(["x,y", 'q"'], ), CsvRow(["multi\nline", ""])]
        return f, [f.marshal(r) for r in rows], CsvRow
    msgs = [wrappers_pb2.StringValue(value="one"), wrappers_pb2.StringValue(value="")]
    return f, [f.marshal(m) for m in msgs], wrappers_pb2.StringValue


class CsvRow:
    def __init__(self, fields: list[str] | None = None) -> None:
        self.fields = fields or []

    def marshal_csv(self) -> list[str]:
        return self.fields

    def unmarshal_csv(self, fields: list[str]) -> None:
        self.fields = list(fields)


ALL_CT = [CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_CSV, CONTENT_TYPE_PROTO_FIXED]


@pytest.mark.parametrize("ct", ALL_CT)
def test_unmarshal_consumes_exactly_one_frame_then_eof(ct: str) -> None:
    """new_unmarshal_func consumes exactly one frame's bytes; EOFError at a clean end."""
    f, frames, new = frames_of(ct)
    assert all(isinstance(b, bytes) for b in frames)
    r = io.BytesIO(b"".join(frames))
    unmarshal = f.new_unmarshal_func(r)
    unmarshal(new())
    assert r.tell() == len(frames[0])
    unmarshal(new())
    assert r.tell() == len(frames[0]) + len(frames[1])
    with pytest.raises(EOFError):
        unmarshal(new())
    with pytest.raises(EOFError):
        f.new_unmarshal_func(io.BytesIO(b""))(new())


@pytest.mark.parametrize("ct", ALL_CT)
def test_unmarshal_truncated_frame(ct: str) -> None:
    """TruncatedFrameError if input ends inside a frame."""
    f, frames, new = frames_of(ct)
    data = frames[0] + frames[1][:-1] if ct != CONTENT_TYPE_PROTO_FIXED else frames[0][:-1]
    unmarshal = f.new_unmarshal_func(io.BytesIO(data))
    with pytest.raises(TruncatedFrameError):
        unmarshal(new())
        unmarshal(new())
    assert issubclass(TruncatedFrameError, FramingError)


def test_fixed_unmarshal_desync() -> None:
    """Fixed framing raises DesyncError when the magic word is not at the position."""
    f, frames, new = frames_of(CONTENT_TYPE_PROTO_FIXED)
    r = io.BytesIO(b"junk" + frames[0])
    unmarshal = f.new_unmarshal_func(r)
    with pytest.raises(DesyncError):
        unmarshal(new())
    m = new()
    unmarshal(m)
    assert m.value == "one"


def test_ndjson_hooks() -> None:
    """NDJSON uses msg.marshal_json() (no newline; the framing adds it) / unmarshal_json(data)."""

    class Doc:
        def __init__(self) -> None:
            self.got: Any = None

        def marshal_json(self) -> bytes:
            return b'{"k":1}'

        def unmarshal_json(self, data: bytes) -> None:
            self.got = orjson.loads(data)

    f = framing_by_content_type(CONTENT_TYPE_JSON_LINES)
    frame = f.marshal(Doc())
    assert frame == b'{"k":1}\n'
    d = Doc()
    f.new_unmarshal_func(io.BytesIO(frame))(d)
    assert d.got == {"k": 1}


@dataclasses.dataclass
class Event:
    name: str = ""
    id: uuid.UUID = NIL
    tags: list[str] = dataclasses.field(default_factory=list)


def test_ndjson_dataclass_and_dict() -> None:
    """orjson on dicts and dataclasses: UUID fields round-trip, unknown keys ignored."""
    f = framing_by_content_type(CONTENT_TYPE_JSON_LINES)
    u = build_uuid(P1, 77, 1)
    frame = f.marshal(Event("x", u, ["a"]))
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    back = Event()
    f.new_unmarshal_func(io.BytesIO(frame))(back)
    assert back == Event("x", u, ["a"]) and isinstance(back.id, uuid.UUID)
    extra = Event()
    f.new_unmarshal_func(io.BytesIO(b'{"name":"y","zzz":1}\n'))(extra)
    assert extra.name == "y"
    d: dict[str, Any] = {}
    f.new_unmarshal_func(io.BytesIO(frame))(d)
    assert d == {"name": "x", "id": str(u), "tags": ["a"]}


def test_csv_hooks_rfc4180_with_lf() -> None:
    """CSV: marshal_csv / unmarshal_csv, RFC 4180, `\\n` line ends, commas, quotes and newlines."""
    f = framing_by_content_type(CONTENT_TYPE_CSV)
    fields = ["plain", "com,ma", 'quo"te', "new\nline", ""]
    frame = f.marshal(CsvRow(fields))
    assert frame.endswith(b"\n") and b"\r\n" not in frame
    back = CsvRow()
    f.new_unmarshal_func(io.BytesIO(frame))(back)
    assert back.fields == fields


def test_fixed_proto_uses_serialize_and_parse() -> None:
    """Fixed protobuf: word + 4-byte little-endian length + SerializeToString() payload."""
    f = framing_by_content_type(CONTENT_TYPE_PROTO_FIXED)
    m = wrappers_pb2.StringValue(value="hello")
    payload = m.SerializeToString()
    frame = f.marshal(m)
    assert frame == FIXED_FRAME_WORD + len(payload).to_bytes(4, "little") + payload
    back = wrappers_pb2.StringValue()
    f.new_unmarshal_func(io.BytesIO(frame))(back)
    assert back.value == "hello"


class HookError(Exception):
    pass


def _propagated(exc: BaseException, original: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if seen is original:
            return True
        seen = seen.__cause__
    return False


def test_hook_exceptions_propagate() -> None:
    """A user hook's exception propagates unchanged, or wrapped with the original chained."""
    err = HookError("boom")

    class Bad:
        def marshal_json(self) -> bytes:
            raise err

        def unmarshal_json(self, data: bytes) -> None:
            raise err

        def marshal_csv(self) -> list[str]:
            raise err

        def unmarshal_csv(self, fields: list[str]) -> None:
            raise err

    for ct, frame in ((CONTENT_TYPE_JSON_LINES, b"{}\n"), (CONTENT_TYPE_CSV, b"a\n")):
        f = framing_by_content_type(ct)
        with pytest.raises(Exception) as info:
            f.marshal(Bad())
        assert _propagated(info.value, err)
        with pytest.raises(Exception) as info:
            f.new_unmarshal_func(io.BytesIO(frame))(Bad())
        assert _propagated(info.value, err)


def test_encode_fixed_proto_frame() -> None:
    """encode_fixed_proto_frame(msg, buf=None) -> bytearray: appends word + LE length + payload."""
    m = wrappers_pb2.StringValue(value="abc")
    payload = m.SerializeToString()
    frame = FIXED_FRAME_WORD + len(payload).to_bytes(4, "little") + payload
    out = encode_fixed_proto_frame(m)
    assert isinstance(out, bytearray) and bytes(out) == frame
    buf = bytearray(b"prefix")
    out2 = encode_fixed_proto_frame(m, buf)
    assert isinstance(out2, bytearray) and bytes(out2) == b"prefix" + frame


def test_unpack_line() -> None:
    """unpack_line(r): bytes through the next newline; b"" at a clean end."""
    r = io.BytesIO(b"one\ntwo\n\n")
    assert [unpack_line(r) for _ in range(4)] == [b"one\n", b"two\n", b"\n", b""]


def test_unpack_line_truncated_has_data() -> None:
    """unpack_line raises TruncatedFrameError (with .data) if input ends mid-line."""
    r = io.BytesIO(b"one\npartial")
    assert unpack_line(r) == b"one\n"
    with pytest.raises(TruncatedFrameError) as info:
        unpack_line(r)
    assert info.value.data == b"partial"


def _fixed(payload: bytes) -> bytes:
    return FIXED_FRAME_WORD + len(payload).to_bytes(4, "little") + payload


def test_unpack_fixed_frame() -> None:
    """unpack_fixed_frame(r): the next frame including its header; b"" at a clean end."""
    a, b = _fixed(b"abc"), _fixed(b"")
    r = io.BytesIO(a + b)
    assert unpack_fixed_frame(r) == a
    assert unpack_fixed_frame(r) == b
    assert unpack_fixed_frame(r) == b""


def test_unpack_fixed_frame_trailing_newline_is_clean_end() -> None:
    """A single trailing newline also counts as a clean end."""
    r = io.BytesIO(_fixed(b"x") + b"\n")
    assert unpack_fixed_frame(r) == _fixed(b"x")
    assert unpack_fixed_frame(r) == b""
    assert unpack_fixed_frame(io.BytesIO(b"\n")) == b""


@pytest.mark.parametrize("cut", [1, 4, 7, 9])
def test_unpack_fixed_frame_truncated(cut: int) -> None:
    """TruncatedFrameError if input ends in a frame (header or payload)."""
    with pytest.raises(TruncatedFrameError):
        unpack_fixed_frame(io.BytesIO(_fixed(b"abcd")[:cut]))


def test_unpack_fixed_frame_desync() -> None:
    """No magic word here: discard up to the next one, DesyncError(.data); the next call goes on."""
    assert issubclass(DesyncError, FramingError)
    frame = _fixed(b"payload")
    r = io.BytesIO(b"garbage!" + frame + _fixed(b"2"))
    with pytest.raises(DesyncError) as info:
        unpack_fixed_frame(r)
    assert info.value.data == b"garbage!"
    assert unpack_fixed_frame(r) == frame
    assert unpack_fixed_frame(r) == _fixed(b"2")
    assert unpack_fixed_frame(r) == b""


# ---------------------------------------------------------------------------
# 5. journal
# ---------------------------------------------------------------------------


def test_journal_spec_from_plain_dict() -> None:
    """JournalSpec("a/b", {"content-type": ...}): frozen, labels a LabelSet, .content_type."""
    spec = JournalSpec("a/b", {"content-type": "application/x-ndjson"})
    assert dataclasses.is_dataclass(spec)
    assert spec.name == "a/b" and isinstance(spec.labels, LabelSet)
    assert spec.content_type == "application/x-ndjson"
    assert JournalSpec("a/b", {}).content_type is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "c/d"  # type: ignore[misc]
    assert spec == JournalSpec("a/b", {"content-type": "application/x-ndjson"})
    assert hash(spec) == hash(JournalSpec("a/b", {"content-type": "application/x-ndjson"}))


def test_label_set_multimap_and_value_of() -> None:
    """LabelSet: immutable multi-map from str -> str | Sequence[str]; .value_of(name)."""
    ls = LabelSet({"app": "clicks", "region": ["eu", "us"]})
    assert ls.value_of("app") == "clicks"
    assert ls.value_of("missing") is None
    assert ls.value_of("region") in {"eu", "us"}
    assert parse_label_selector("region=us").matches(ls)
    assert parse_label_selector("region=eu").matches(ls)
    with pytest.raises((TypeError, AttributeError)):
        ls["app"] = "other"  # type: ignore[index]


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=clicks", True),
    ("app=views", False),
    ("app!=views", True),
    ("app!=clicks", False),
    ("missing!=x", True),
    ("region!=eu", False),
    ("app", True),
    ("missing", False),
    ("!missing", True),
    ("!app", False),
    ("region in (us, ap)", True),
    ("region in (ap, sa)", False),
    ("region notin (ap, sa)", True),
    ("region notin (eu)", False),
    ("missing notin (a)", True),
    ("app=clicks, region in (eu), !missing", True),
    ("app=clicks,region=ap", False),
    ("", True),
])
def test_label_selector_syntax(selector: str, expected: bool) -> None:
    """parse_label_selector: name=value, !=, name, !name, in (...), notin (...), comma-separated."""
    labels = LabelSet({"app": "clicks", "region": ["eu", "us"]})
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize("bad", ["app in (a, b", "!", "=x", "app notin a", "a b c"])
def test_malformed_selector_raises_label_selector_error(bad: str) -> None:
    """Malformed selectors raise journal.LabelSelectorError (a ValueError)."""
    assert issubclass(LabelSelectorError, ValueError)
    with pytest.raises(LabelSelectorError):
        parse_label_selector(bad)


def test_append_result_named_tuple() -> None:
    """AppendResult(NamedTuple): journal, begin, end."""
    r = AppendResult("a/b", 1, 5)
    assert isinstance(r, tuple) and AppendResult._fields == ("journal", "begin", "end")
    assert (r.journal, r.begin, r.end) == ("a/b", 1, 5)


def test_journal_client_list_get(store: LocalJournalStore) -> None:
    """list(selector="") -> list[JournalSpec]; get(name) raises JournalNotFoundError."""
    a = store.create("jc/a", {**NDJSON, "app": "x"})
    b = store.create("jc/b", {"app": "y"})
    assert isinstance(a, JournalSpec)
    assert {s.name for s in store.list()} == {"jc/a", "jc/b"}
    assert [s.name for s in store.list("app=x")] == ["jc/a"]
    assert store.get("jc/b") == b and store.get("jc/a").content_type == CONTENT_TYPE_JSON_LINES
    assert issubclass(JournalNotFoundError, JournalError)
    with pytest.raises(JournalNotFoundError):
        store.get("jc/none")


def test_journal_client_append_is_contiguous(store: LocalJournalStore) -> None:
    """append(name, data) -> Future[AppendResult], atomic, contiguous, in call order."""
    store.create("ap/a", NDJSON)
    futs = [store.append("ap/a", f"{n:04d}\n".encode()) for n in range(50)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futs)
    results = [f.result() for f in futs]
    assert results[0] == AppendResult("ap/a", 0, 5)
    for prev, nxt in itertools.pairwise(results):
        assert nxt.begin == prev.end and nxt.end - nxt.begin == 5
    with store.read("ap/a") as r:
        assert r.read() == b"".join(f"{n:04d}\n".encode() for n in range(50))


def test_journal_client_append_threads_never_interleave(store: LocalJournalStore) -> None:
    """append is never interleaved with another writer (threads)."""
    store.create("ap/t", NDJSON)
    blob = {i: bytes([65 + i]) * 3000 + b"\n" for i in range(4)}

    def work(i: int) -> list[AppendResult]:
        return [store.append("ap/t", blob[i]).result() for _ in range(20)]

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = [r for rs in ex.map(work, range(4)) for r in rs]
    with store.read("ap/t") as r:
        data = r.read()
    assert len(data) == 80 * 3001
    for res in results:
        chunk = data[res.begin:res.end]
        assert chunk in blob.values()


def test_journal_client_appends_from_processes(tmp_path: Path) -> None:
    """Several processes may open the same root and append to the same journal at once."""
    root = tmp_path / "shared"
    with LocalJournalStore(root) as s:
        s.create("mp/a", NDJSON)
    code = ("import sys; from journal import LocalJournalStore\n"
            "with LocalJournalStore(sys.argv[1]) as s:\n"
            "    futs = [s.append('mp/a', (sys.argv[2] * 500 + '\\n').encode())"
            " for _ in range(40)]\n"
            "    [f.result() for f in futs]\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root), c]) for c in "XYZ"]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    with LocalJournalStore(root) as s, s.read("mp/a") as r:
        lines = r.read().split(b"\n")
    assert lines[-1] == b""
    assert sorted(set(lines[:-1])) == [c.encode() * 500 for c in "XYZ"]
    assert len(lines) - 1 == 120


def test_journal_client_read_offset(store: LocalJournalStore) -> None:
    """read(name, offset, end_offset) -> JournalReader whose .offset is the next byte's offset."""
    store.create("rd/a", NDJSON)
    store.append("rd/a", b"0123456789").result()
    with store.read("rd/a", 2, 8) as r:
        assert r.offset == 2
        assert r.read(3) == b"234"
        assert r.offset == 5
        assert r.read() == b"567"
        assert r.offset == 8
    with store.read("rd/a", offset=4) as r:
        assert r.readable() and isinstance(r, io.IOBase)
        assert r.read() == b"456789" and r.offset == 10


def test_journal_client_read_block(store: LocalJournalStore) -> None:
    """read(..., block=True) waits for new appends."""
    store.create("rd/b", NDJSON)
    timer = threading.Timer(0.2, lambda: store.append("rd/b", b"late\n"))
    timer.start()
    try:
        with store.read("rd/b", 0, 5, block=True) as r:
            assert r.read(5) == b"late\n"
    finally:
        timer.join()


def test_journal_client_flush_close_context_manager(tmp_path: Path) -> None:
    """flush(timeout=None) waits for durability; close(); usable as a context manager."""
    assert "timeout" in inspect.signature(LocalJournalStore.flush).parameters
    with LocalJournalStore(tmp_path / "s") as s:
        s.create("fl/a", NDJSON)
        futs = [s.append("fl/a", b"x\n") for _ in range(10)]
        s.flush()
        s.flush(timeout=10)
        assert all(f.done() for f in futs)
    s2 = LocalJournalStore(tmp_path / "s")
    with s2.read("fl/a") as r:
        assert r.read() == b"x\n" * 10
    s2.close()


def test_local_store_create_idempotent(store: LocalJournalStore) -> None:
    """create(name, labels) is idempotent for identical labels; JournalExistsError otherwise."""
    a = store.create("cr/a", NDJSON)
    assert store.create("cr/a", dict(NDJSON)) == a
    assert issubclass(JournalExistsError, JournalError)
    with pytest.raises(JournalExistsError):
        store.create("cr/a", {"content-type": CONTENT_TYPE_CSV})


# ---------------------------------------------------------------------------
# 6. pipeline (Spark)
# ---------------------------------------------------------------------------


def _spark_journals(root: Path, *, acks: bool = False) -> dict[str, list[Envelope]]:
    """What a Sequencer outputs per journal, less its ACK_TXN messages unless ``acks``."""
    with LocalJournalStore(root) as s:
        if "sp/a" not in [spec.name for spec in s.list()]:
            transaction_journal(s, "sp/a")
            s.create("sp/b", {**NDJSON, "app": "other"})
            pub = Publisher(s)
            pub.publish_committed(to_journal("sp/b"), JsonDocument(n="b1", k=5)).result()
            s.flush()
        return {j: [e for e in ReadCommittedIter(s, j, lambda spec: JsonDocument())
                    if acks or get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
                for j in ("sp/a", "sp/b")}


@pytest.mark.spark
def test_spark_read_source(spark: Any, tmp_path: Path) -> None:
    """spark.read.format("journal"): root + journal/selector, columns, schema, isolation."""
    import pipeline

    pipeline.register(spark)
    root = tmp_path / "store"
    expected = _spark_journals(root)
    with LocalJournalStore(root) as s:
        s.create("sp/a2", NDJSON)  # selector target shares labels with nothing else
    df = (spark.read.format("journal").option("root", str(root)).option("journal", "sp/a")
          .option("schema", "n string, absent long").load())
    types = dict(df.dtypes)
    assert types["journal"] == "string" and types["begin"] == "bigint"
    assert types["end"] == "bigint" and types["uuid"] == "string"
    rows = sorted(df.collect(), key=lambda r: r["begin"])
    exp = sorted(expected["sp/a"], key=lambda e: e.begin)
    assert [(r["journal"], r["begin"], r["end"]) for r in rows] == [
        ("sp/a", e.begin, e.end) for e in exp]
    assert [r["uuid"] for r in rows] == [str(e.message.get_uuid()) for e in exp]
    assert [r["n"] for r in rows] == [e.message.get("n") for e in exp]
    assert all(r["absent"] is None for r in rows)

    by_selector = (spark.read.format("journal").option("root", str(root))
                   .option("selector", "app=other").load().collect())
    assert [(r["journal"], r["begin"]) for r in by_selector] == [
        ("sp/b", e.begin) for e in expected["sp/b"]]

    with LocalJournalStore(root) as s:
        raw = list(ReadUncommittedIter(s, "sp/a", lambda spec: JsonDocument()))
    unc = (spark.read.format("journal").option("root", str(root)).option("journal", "sp/a")
           .option("isolation", "read_uncommitted").load().collect())
    assert sorted(r["begin"] for r in unc) == [e.begin for e in raw]

    # ACK_TXN messages are control records: left out unless include_acks is true.
    with_acks = _spark_journals(root, acks=True)["sp/a"]
    assert len(with_acks) > len(exp)
    all_rows = (spark.read.format("journal").option("root", str(root)).option("journal", "sp/a")
                .option("include_acks", "true").load().collect())
    assert sorted(r["begin"] for r in all_rows) == sorted(e.begin for e in with_acks)


@pytest.mark.spark
def test_spark_write_exactly_once(spark: Any, tmp_path: Path) -> None:
    """df.write.format("journal")...mode("append").save(): each row seen once, read committed."""
    import pipeline

    pipeline.register(spark)
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create("sp/out", NDJSON)
    df = spark.createDataFrame([(i, f"v{i}") for i in range(20)], "i long, v string")
    (df.repartition(3).write.format("journal").option("root", str(root))
     .option("journal", "sp/out").mode("append").save())
    with LocalJournalStore(root) as s:
        docs = [e.message for e in ReadCommittedIter(s, "sp/out", lambda spec: JsonDocument())]
    rows = sorted((d["i"], d["v"]) for d in docs if "i" in d)
    assert rows == [(i, f"v{i}") for i in range(20)]


@pytest.mark.spark
def test_spark_failed_write_publishes_nothing(spark: Any, tmp_path: Path) -> None:
    """After a failed write job, a read-committed reader sees none of its rows."""
    from pyspark.sql import functions as F  # noqa: N812

    import pipeline

    pipeline.register(spark)
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create("sp/fail", NDJSON)

    refuse = F.raise_error(F.lit("row 17 is refused"))
    df = (spark.range(0, 20, numPartitions=2)
          .select(F.when(F.col("id") == 17, refuse).otherwise(F.col("id")).alias("i")))
    with pytest.raises(Exception, match="row 17 is refused"):
        (df.write.format("journal").option("root", str(root)).option("journal", "sp/fail")
         .mode("append").save())
    with LocalJournalStore(root) as s:
        docs = [e.message for e in ReadCommittedIter(s, "sp/fail", lambda spec: JsonDocument())]
    assert [d for d in docs if "i" in d] == []


# ---------------------------------------------------------------------------
# 7. command line
# ---------------------------------------------------------------------------


def exactly(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "exactly"
    return subprocess.run([str(script), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_help_lists_subcommands(tmp_path: Path) -> None:
    """`exactly --help` lists subcommands (demo, journal administration, append, read, bench)."""
    r = exactly("--help", root=tmp_path)
    assert r.returncode == 0
    for word in ("demo", "journals", "append", "read", "bench"):
        assert word in r.stdout


def test_cli_has_admin_append_and_read_modes(tmp_path: Path) -> None:
    """Journal administration (create, list); read uncommitted, committed, follow."""
    journals = exactly("journals", "--help", root=tmp_path)
    assert journals.returncode == 0
    assert "create" in journals.stdout and "list" in journals.stdout
    read = exactly("read", "--help", root=tmp_path)
    assert read.returncode == 0
    for word in ("--uncommitted", "--committed", "--follow"):
        assert word in read.stdout


@pytest.mark.parametrize("args", [
    ("read", "no/such-journal"),
    ("read",),
    ("append",),
    ("read", "ok/a", "--limit", "many"),
    ("journals", "create", "bad name with spaces"),
    ("no-such-command",),
])
def test_cli_errors_are_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Errors print one clear line and exit non-zero, never a traceback for user mistakes."""
    (tmp_path / "store").mkdir()
    with LocalJournalStore(tmp_path / "store") as s:
        s.create("ok/a", NDJSON)
    r = exactly(*args, root=tmp_path / "store")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
