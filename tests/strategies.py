"""The hypothesis strategies of the tests, and the helpers of the message package's tests.

- ``Msg`` is a minimal message implementing the ``Message`` protocol.
- ``EnvelopeGenerator`` builds envelopes at increasing offsets, as Gazette's
  ``newTestMsgGenerator`` does (100-byte frames with 2 bytes of dead space,
  so that consumers must not assume contiguous envelopes).
- ``chaos_workloads`` draws arbitrary envelope sequences over a few producers
  and tiny clocks (lots of duplicates, roll-backs, partial ACKs).
- ``publisher_workloads`` simulates publishers the way docs/concepts.md describes them:
  committed messages, transactions committed, rolled back, partially
  acknowledged or abandoned, duplicated frames and transactions, re-written
  ACKs, unknown flags, nil UUIDs and clock 0, interleaved producers and
  journals. A transaction's ACK intent is written to a journal before its
  producer publishes further uncommitted messages there.
- ``messages_for`` and ``cases`` draw messages of each built-in framing
  (JSON documents, dataclass events, CSV records, protobuf values); the
  message types themselves are in tests/framing/support.py.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2
from hypothesis import strategies as st

from journal import JournalSpec
from message import Envelope, ProducerState, build_uuid
from tests.framing.support import BUILT_INS, Event
from tests.sequencer_model import decode

NDJSON = "application/x-ndjson"
NIL = uuid.UUID(int=0)

OUTSIDE, CONTINUE, ACK = 0, 1, 2
UNKNOWN_FLAGS = (3, 0x100, 0x3FF)


@dataclass(eq=True)
class Msg:
    """A message implementing the Message protocol; ``text`` tells copies apart in failures."""

    uuid: uuid.UUID = NIL
    text: str = ""

    def get_uuid(self) -> uuid.UUID:
        return self.uuid

    def set_uuid(self, u: uuid.UUID) -> None:
        self.uuid = u

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg(text=f"ack of {journal}")


def producer(n: int) -> bytes:
    """A deterministic producer ID with the multicast bit set, as new_producer_id's are."""
    return bytes([0x01 | (n << 1) & 0xFF, 0xA0, 0, 0, n >> 8 & 0xFF, n & 0xFF])


class EnvelopeGenerator:
    """Builds envelopes of journals at increasing offsets."""

    def __init__(self, size: int = 100, gap: int = 2) -> None:
        self.size, self.gap = size, gap
        self.specs: dict[str, JournalSpec] = {}
        self.offsets: dict[str, int] = {}

    def spec(self, journal: str) -> JournalSpec:
        if journal not in self.specs:
            self.specs[journal] = JournalSpec(journal, {"content-type": NDJSON})
        return self.specs[journal]

    def envelope(self, journal: str, u: uuid.UUID, text: str = "") -> Envelope:
        begin = self.offsets.get(journal, 0)
        self.offsets[journal] = begin + self.size + self.gap
        return Envelope(
            journal=self.spec(journal), begin=begin, end=begin + self.size, message=Msg(u, text)
        )

    def __call__(
        self, prod: bytes, clock: int, flags: int, journal: str = "test/journal"
    ) -> Envelope:
        return self.envelope(journal, build_uuid(prod, clock, flags), f"{clock}/{flags}")

    def nil(self, journal: str = "test/journal") -> Envelope:
        return self.envelope(journal, NIL, "nil")


def key(env: Any) -> tuple[str, int, int, str]:
    """A comparable identity of an envelope, for readable assertion failures."""
    return (env.journal.name, env.begin, env.end, str(env.message.get_uuid()))


def state_key(s: Any) -> tuple[str, bytes, int, int]:
    """A comparable form of a ProducerState."""
    return (s.journal, bytes(s.producer), s.last_ack, s.begin)


@dataclass
class Workload:
    """Envelopes in read order (each journal in offset order), and a description."""

    envelopes: list[Envelope]
    journals: list[str]
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        lines = [f"Workload({len(self.envelopes)} envelopes)"]
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


JOURNALS = ("test/one", "test/two", "test/three")


@st.composite
def chaos_workloads(draw: st.DrawFn, max_size: int = 40, max_journals: int = 2) -> Workload:
    """Arbitrary envelopes over 1..max_journals journals: 3 producers (and nil UUIDs) whose
    clocks mostly rise but also repeat and fall back (to 0 at worst), with any flags."""
    n_journals = draw(st.integers(1, max_journals))
    ops = draw(
        st.lists(
            st.tuples(
                st.integers(0, n_journals - 1),
                st.sampled_from((0, 0, 0, 1, 1, 2, 3)),  # 3 means the nil UUID.
                st.sampled_from((-4, -2, -1, 0, 1, 1, 1, 1, 2, 3)),
                st.sampled_from(
                    (OUTSIDE, CONTINUE, CONTINUE, CONTINUE, CONTINUE, ACK, ACK, 3, 0x100)
                ),
            ),
            min_size=min(8, max_size),
            max_size=max_size,
        )
    )
    gen = EnvelopeGenerator()
    clocks = [4, 4, 4]
    envs, notes = [], []
    for j, p, delta, flags in ops:
        journal = JOURNALS[j]
        if p == 3:
            envs.append(gen.nil(journal))
            notes.append(f"{journal} nil")
        else:
            clocks[p] = clock = max(0, clocks[p] + delta)
            envs.append(gen(producer(p), clock, flags, journal))
            notes.append(f"{journal} p{p} clock={clock} flags={flags:#x}")
    return Workload(envs, list(JOURNALS[:n_journals]), notes)


@dataclass
class _Producer:
    """Publisher-side state of one simulated producer."""

    pid: bytes
    clock: int
    # Frames of the open transaction per journal, until its ACK is written.
    open_txn: dict[str, list[Envelope]] = field(default_factory=dict)
    # Journals published to uncommitted since the last commit, in first-publish order.
    pending: list[str] = field(default_factory=list)
    # ACK intents built but not yet written, in build order: (journal, uuid).
    intents: list[tuple[str, uuid.UUID]] = field(default_factory=list)
    # Last ACK written to each journal, for re-writes (roll-backs).
    last_ack: dict[str, uuid.UUID] = field(default_factory=dict)
    last_ack_clock: dict[str, int] = field(default_factory=dict)

    def tick(self) -> int:
        self.clock += 1
        return self.clock


_ACTIONS = (
    "committed",
    "committed",
    "uncommitted",
    "uncommitted",
    "uncommitted",
    "uncommitted",
    "uncommitted",
    "uncommitted",
    "commit",
    "commit",
    "commit",
    "write_intent",
    "write_intent",
    "write_intent",
    "write_intent",
    "rollback",
    "rollback_reuse",
    "partial_ack",
    "abandon",
    "dup_frame",
    "dup_run",
    "dup_txn",
    "unknown_flags",
    "nil",
    "clock_zero",
    "jump",
)


@st.composite
def publisher_workloads(draw: st.DrawFn, max_steps: int = 50, max_journals: int = 3) -> Workload:
    """Envelopes written by simulated publishers, with the faults docs/concepts.md describes."""
    n_journals = draw(st.integers(1, max_journals))
    n_producers = draw(st.integers(1, 3))
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(_ACTIONS),
                st.integers(0, n_producers - 1),
                st.integers(0, n_journals - 1),
                st.integers(0, 2**16),
            ),
            min_size=min(15, max_steps),
            max_size=max_steps,
        )
    )
    journals = list(JOURNALS[:n_journals])
    gen = EnvelopeGenerator()
    next_pid = n_producers
    producers = [_Producer(producer(i), clock=1 + 16 * 1000 * i) for i in range(n_producers)]
    written: dict[str, list[Envelope]] = {j: [] for j in journals}
    txns: dict[str, list[list[Envelope]]] = {j: [] for j in journals}
    envs: list[Envelope] = []
    notes: list[str] = []

    def append(journal: str, u: uuid.UUID, text: str) -> Envelope:
        env = gen.envelope(journal, u, text)
        written[journal].append(env)
        envs.append(env)
        return env

    def write_intent(p: _Producer, index: int = 0) -> None:
        journal, u = p.intents.pop(index)
        env = append(journal, u, "ack")
        p.last_ack[journal] = u
        p.last_ack_clock[journal] = decode_clock(u)
        txns[journal].append([*p.open_txn.pop(journal, []), env])
        notes.append(f"{journal} ACK {p.pid.hex()} clock={decode_clock(u)}")

    def publish(p: _Producer, journal: str, flags: int, what: str) -> Envelope:
        # Intents of an earlier transaction are written before further
        # messages go to the same journal.
        while any(j == journal for j, _ in p.intents):
            write_intent(p, next(i for i, (j, _) in enumerate(p.intents) if j == journal))
        clock = p.tick()
        notes.append(f"{journal} {what} {p.pid.hex()} clock={clock}")
        return append(journal, build_uuid(p.pid, clock, flags), what)

    for action, pi, ji, n in steps:
        p, journal = producers[pi], journals[ji]
        if action == "committed":
            publish(p, journal, OUTSIDE, "OUTSIDE")
        elif action == "uncommitted":
            p.open_txn.setdefault(journal, []).append(publish(p, journal, CONTINUE, "CONTINUE"))
            if journal not in p.pending:
                p.pending.append(journal)
        elif action == "commit":
            # build_ack_intents: one freshly ticked ACK per journal of the
            # transaction, in first-publish order; written later.
            for j in p.pending:
                p.intents.append((j, build_uuid(p.pid, p.tick(), ACK)))
            p.pending.clear()
        elif action == "write_intent":
            if p.intents:
                write_intent(p, n % len(p.intents))
        elif action in ("rollback", "rollback_reuse"):
            # Recovery from a checkpoint: its ACK intents are re-written (a
            # roll-back of whatever was published since), the open
            # transaction is lost, and unwritten intents are forgotten.
            if journal in p.last_ack:
                append(journal, p.last_ack[journal], "rewritten ACK")
                notes.append(f"{journal} re-written ACK {p.pid.hex()}")
                p.open_txn.clear()
                p.intents.clear()
                p.pending.clear()
                if action == "rollback_reuse":
                    # The restarted producer re-uses clocks after that ACK.
                    p.clock = p.last_ack_clock[journal]
        elif action == "partial_ack":
            # An ACK whose clock is below some CONTINUE_TXNs of the open span.
            span = p.open_txn.get(journal)
            if span:
                pos = n % len(span)
                clock = decode_clock(span[pos].message.get_uuid()) + n % 2
                append(journal, build_uuid(p.pid, clock, ACK), "partial ACK")
                notes.append(f"{journal} partial ACK {p.pid.hex()} clock={clock}")
                p.open_txn.pop(journal)
                if journal in p.pending:
                    p.pending.remove(journal)
                p.last_ack[journal] = build_uuid(p.pid, clock, ACK)
                p.last_ack_clock[journal] = clock
        elif action == "abandon":
            # The producer goes away mid-transaction; a new one takes its place.
            producers[pi] = _Producer(producer(next_pid), clock=p.clock + n)
            next_pid += 1
            notes.append(f"abandon {p.pid.hex()}")
        elif action == "dup_frame":
            if written[journal]:
                orig = written[journal][n % len(written[journal])]
                append(journal, orig.message.get_uuid(), "dup frame")
                notes.append(f"{journal} dup of {orig.begin}")
        elif action == "dup_run":
            frames = written[journal]
            if frames:
                start = n % len(frames)
                for orig in frames[start : start + 1 + n % 4]:
                    append(journal, orig.message.get_uuid(), "dup run")
                notes.append(f"{journal} dup run from {frames[start].begin}")
        elif action == "dup_txn":
            if txns[journal]:
                txn = txns[journal][n % len(txns[journal])]
                for orig in txn:
                    append(journal, orig.message.get_uuid(), "dup txn")
                notes.append(f"{journal} dup txn ending {txn[-1].begin}")
        elif action == "unknown_flags":
            publish(p, journal, UNKNOWN_FLAGS[n % len(UNKNOWN_FLAGS)], "UNKNOWN")
        elif action == "nil":
            append(journal, NIL, "nil")
            notes.append(f"{journal} nil")
        elif action == "clock_zero":
            append(journal, build_uuid(p.pid, 0, n % 3), "clock 0")
            notes.append(f"{journal} clock 0 {p.pid.hex()}")
        elif action == "jump":
            p.clock += n  # A wall-clock update.
    # Sometimes write the remaining intents at the end, sometimes not (a
    # transaction committed to the recovery log whose ACKs were never written).
    if draw(st.booleans()):
        for p in producers:
            while p.intents:
                write_intent(p)
    return Workload(envs, journals, notes)


def decode_clock(u: uuid.UUID) -> int:
    """The clock of a UUID (independent of the message package)."""
    return decode(u)[1]


def workloads() -> st.SearchStrategy[Workload]:
    """Either kind of workload."""
    return st.one_of(chaos_workloads(), publisher_workloads())


@st.composite
def producer_states(draw: st.DrawFn, journals: list[str]) -> list[ProducerState]:
    """Distinct ProducerStates over the given journals."""
    pids = draw(st.lists(st.binary(min_size=6, max_size=6), unique=True, max_size=4))
    pairs = [(j, pid) for j in journals for pid in pids if draw(st.booleans())]
    return [
        ProducerState(
            journal=j,
            producer=pid,
            last_ack=draw(st.integers(0, 2**64 - 1)),
            begin=draw(st.one_of(st.just(-1), st.integers(0, 2**63 - 1))),
        )
        for j, pid in pairs
    ]


# -- messages of the built-in framings ----------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
json_documents = st.dictionaries(st.text(), json_values, max_size=6)

uuids = st.uuids()
events = st.builds(
    Event,
    uuid=uuids,
    kind=st.text(),
    n=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    tags=st.lists(st.text(), max_size=4),
    parent=st.none() | uuids,
)

# CSV fields: any text without lone surrogates (which UTF-8 cannot encode),
# and with plenty of the characters that need quoting.
csv_fields = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)) | st.sampled_from(',"\n\r '),
    max_size=12,
)
csv_records = st.lists(csv_fields, min_size=1, max_size=6)

proto_values = st.recursive(
    st.builds(lambda s: struct_pb2.Value(string_value=s), st.text())
    | st.builds(lambda x: struct_pb2.Value(number_value=x), st.floats(allow_nan=False))
    | st.builds(lambda b: struct_pb2.Value(bool_value=b), st.booleans()),
    lambda inner: st.builds(
        lambda items: struct_pb2.Value(list_value=struct_pb2.ListValue(values=items)),
        st.lists(inner, max_size=3),
    ),
    max_leaves=8,
)


def messages_for(name: str) -> st.SearchStrategy[list[Any]]:
    """Lists of messages of one of the built-in framings."""
    if name == "ndjson":
        return st.lists(json_documents, min_size=1, max_size=5)
    if name == "csv":
        # new_unmarshal_func wants records of one width, as Go's reader does.
        return st.integers(1, 5).flatmap(
            lambda w: st.lists(st.lists(csv_fields, min_size=w, max_size=w), min_size=1, max_size=5)
        )
    return st.lists(proto_values, min_size=1, max_size=5)


def cases() -> st.SearchStrategy[tuple[str, list[Any]]]:
    """A built-in framing's name and messages for it."""
    return st.sampled_from(sorted(BUILT_INS)).flatmap(
        lambda n: st.tuples(st.just(n), messages_for(n))
    )
