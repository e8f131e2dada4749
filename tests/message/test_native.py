"""The native core (message/_native.c) against the Python implementation.

Differential tests: both are fed the same random workloads and must give the
same outputs and producer states, step by step.

- Sequencer level: every ring size, a checkpoint (``checkpoint_states``) at
  every cut, mid-sequence ones included, resumed in either implementation;
  replays; messages whose UUIDs are spelled oddly or not at all.
- Reader level: random journals (transactions, roll-backs, duplicates, odd
  UUID spellings, garbage frames) read uncommitted and committed, with a
  checkpoint between every two yields.
- How the core is found: built where it can be, turned off by
  ``EXACTLY_PURE_PYTHON``, one warning where it is not built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import logging
import os
import pickle
import random
import shutil
import subprocess
import sys
import sysconfig
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import message._reader as reader_module
from framing import FrameDecodeError, TruncatedFrameError
from journal import MemoryJournalClient
from message import (
    Clock,
    CSVRecord,
    Envelope,
    Flags,
    JsonDocument,
    MustStartReplay,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    _core,
    build_uuid,
    get_clock,
    new_clock,
)
from message._sequencer import Sequencer as PySequencer
from message.columns import uuid_strings
from tests.strategies import Workload, chaos_workloads, workloads

J = "odd/part-0"
NDJSON = {"content-type": "application/x-ndjson"}
CSV = {"content-type": "text/csv"}
ROOT = Path(__file__).resolve().parents[2]

needs_c = pytest.mark.skipif(_core.NATIVE is None, reason="the native core is not in use here")


@contextlib.contextmanager
def loops(mode: str) -> Iterator[None]:
    """Use the native core ("c") or the Python implementation ("python")
    for the iterators made inside the block."""
    saved = reader_module.NATIVE
    reader_module.NATIVE = saved if mode == "c" else None
    try:
        yield
    finally:
        reader_module.NATIVE = saved


@dataclasses.dataclass
class Doc:
    """A dataclass message: the Sequencer asks it get_uuid()."""

    v: str = ""
    uuid: uuid.UUID = dataclasses.field(default_factory=lambda: uuid.UUID(int=0))

    def get_uuid(self) -> uuid.UUID:
        return self.uuid

    def set_uuid(self, u: uuid.UUID) -> None:
        self.uuid = u

    def new_acknowledgement(self, journal: str) -> Doc:
        return Doc("ack")


class CountingDocument(JsonDocument):
    """A document type whose own __getitem__ must be honoured."""

    lookups = 0

    def __getitem__(self, key: str) -> Any:
        type(self).lookups += 1
        return super().__getitem__(key)


def as_json(env: Envelope) -> tuple[int, int, Any]:
    msg = env.message
    if isinstance(msg, dict):
        body: Any = dict(msg)
    elif isinstance(msg, list):
        body = list(msg)
    else:
        body = dataclasses.astuple(msg)
    return env.begin, env.end, repr(body)


# -- the Sequencer, fed the same workloads ------------------------------------


class Twin:
    """The same calls on a native and a Python Sequencer, checked to give the
    same results; replays are served from the whole log."""

    def __init__(self, log: list[Envelope], states: list[Any] = (), buffer: int = 4096,
                 types: tuple[type[Any], type[Any]] | None = None) -> None:
        native, python = types or (_core.NATIVE.Sequencer, PySequencer)
        self.seqs = (native(list(states), buffer=buffer), python(list(states), buffer=buffer))
        self.log: dict[str, list[Envelope]] = {}
        for env in log:
            self.log.setdefault(env.journal.name, []).append(env)
        self.replays = 0

    def same(self, name: str, *args: Any) -> Any:
        """Call ``name`` on both; the same result, or the same exception type."""
        results = []
        for seq in self.seqs:
            try:
                results.append(("ok", getattr(seq, name)(*args)))
            except Exception as exc:  # compared below
                results.append(("raised", type(exc)))
        assert results[0] == results[1], (name, args, results)
        kind, value = results[0]
        return value if kind == "ok" else results[0]

    def queue(self, env: Envelope) -> list[Envelope]:
        """Queue ``env`` in both, and dequeue what it commits, comparing the
        checkpoint states before every dequeue (mid-sequence included)."""
        self.same("queue_uncommitted", env)
        out: list[Envelope] = []
        for _ in range(10 * sum(map(len, self.log.values())) + 10):
            self.same("checkpoint_states")
            got = self.same("deque_committed")
            if got == ("raised", MustStartReplay):
                begin, end = self.same("replay_range")
                self.replays += 1
                replayed = [e for e in self.log[env.journal.name]
                            if begin <= e.begin and e.end <= end]
                for seq in self.seqs:
                    seq.start_replay(iter(replayed))
                continue
            if got is None:
                return out
            out.append(got)
        raise AssertionError("deque_committed never returned None")

    def states(self) -> list[Any]:
        return cast(list[Any], self.same("producer_states"))


class Key(str):
    """A str subclass as a document's key: found as the str it equals."""


def spelled_key(name: str, rng: random.Random) -> str:
    """``name`` as the interned str, as another str object equal to it (as a
    decoder makes them), or as a str subclass."""
    return cast(str, rng.choice([name, name[:1] + name[1:], Key(name)]))


def odd_uuid_documents(w: Workload, rng: random.Random) -> list[Envelope]:
    """The workload's envelopes with JsonDocument messages, some of whose
    UUIDs are spelled oddly (upper case, braces, garbage: the nil UUID), with
    _meta first, last or missing, its keys as various str objects, and at
    times a decoy object with another UUID before it; or, as the only entry
    of _meta, the UUID under another key (the document then has none)."""
    out = []
    for env in w.envelopes:
        u = env.message.get_uuid()
        spell = rng.choice([str, str, str, *ODD_UUIDS])
        key = spelled_key("uuid", rng) if rng.random() < 0.9 else rng.choice(["uuid_", "UUID"])
        meta = {key: spell(u)}
        layout = rng.choice(["first", "first", "last", "last", "missing"])
        doc = JsonDocument()
        if rng.random() < 0.3:  # a decoy: the wrong key's UUID would differ
            doc["_metb"] = {"uuid": str(uuid.UUID(int=rng.getrandbits(128)))}
        if layout == "first":
            doc[spelled_key("_meta", rng)] = meta
        doc["text"] = env.message.text
        if layout == "last":
            doc[spelled_key("_meta", rng)] = meta
        out.append(Envelope(env.journal, env.begin, env.end, doc))
    return out


@needs_c
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=st.one_of(workloads(), chaos_workloads(max_size=40, max_journals=2)),
       buffer=st.sampled_from([0, 1, 2, 3, 5, 8, 4096]), odd=st.booleans(),
       seed=st.integers(0, 2**16))
def test_sequencers_agree_step_by_step(w: Workload, buffer: int, odd: bool, seed: int) -> None:
    """Same results, outputs, replays, producer states, pending spans and
    checkpoint states (before every dequeue), whatever the ring's size."""
    envs = odd_uuid_documents(w, random.Random(seed)) if odd else w.envelopes
    twin = Twin(envs, buffer=buffer)
    for env in envs:
        twin.queue(env)
        twin.states()
        twin.same("has_pending", {})
        twin.same("has_pending", {env.journal.name: env.begin})
        twin.same("committed_by")
    for horizon in (1e-6, datetime.timedelta(microseconds=3), 0.0):
        twin.same("producer_states", horizon)


@needs_c
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(w=workloads(), buffer=st.sampled_from([1, 2, 4096]), data=st.data())
def test_checkpoints_at_every_cut_resume_in_either(w: Workload, buffer: int,
                                                   data: st.DataObject) -> None:
    """A checkpoint taken at any cut (between any two dequeues) by either
    implementation resumes in either with the same output as reading on."""
    envs = w.envelopes
    full: list[Envelope] = []
    cuts: list[tuple[int, int, Any]] = []  # (envelopes queued, yielded, checkpoint)
    twin = Twin(envs, buffer=buffer)
    for i, env in enumerate(envs):
        twin.same("queue_uncommitted", env)
        while True:
            cuts.append((i, len(full), twin.same("checkpoint_states")))
            try:
                got = twin.seqs[0].deque_committed()
                assert twin.seqs[1].deque_committed() is got
            except MustStartReplay:
                begin, end = twin.same("replay_range")
                replayed = [e for e in envs if e.journal.name == env.journal.name
                            and begin <= e.begin and e.end <= end]
                for seq in twin.seqs:
                    seq.start_replay(iter(replayed))
                continue
            if got is None:
                break
            full.append(got)
    by_offset = {(e.journal.name, e.begin): n for n, e in enumerate(envs)}
    for i, yielded, (states, resume) in data.draw(st.lists(st.sampled_from(cuts), max_size=6)):
        # Between sequences, reading resumes after envelope i; mid-sequence,
        # at the envelope that committed the sequence.
        start = i + 1 if resume is None else by_offset[resume]
        native, python = _core.NATIVE.Sequencer, PySequencer
        for types in ((native, python), (python, native)):
            rest = Twin(envs, states, buffer, types)
            out = [e for env in envs[start:] for e in rest.queue(env)]
            assert full[:yielded] + out == full


# -- random journals --------------------------------------------------------

ODD_UUIDS = [
    lambda u: str(u).upper(),                   # canonical, upper case: same UUID
    lambda u: "{" + str(u) + "}",               # braces: parsed by uuid.UUID
    lambda u: u.hex,                            # no hyphens
    lambda u: "urn:uuid:" + str(u),
    lambda u: str(u)[:-1] + "g",                # not hex: the nil UUID
    lambda u: str(u).replace("-", "_", 1),      # 36 characters, not canonical
    lambda u: " " + str(u)[1:],
    lambda u: 12345,                            # a number
    lambda u: None,
]

GARBAGE = [
    b"not json\n",
    b"[1, 2, 3]\n",
    b"null\n",
    b'{"_meta": "not a dict"}\n',
    b'{"_meta": {}}\n',
    b"{}\n",
    b'{"_meta": {"uuid": ""}}\n',
    b'\xff\xfe{"a": 1}\n',
]


def write_json_journal(client: MemoryJournalClient, rng: random.Random, steps: int) -> None:
    """Publishers committing, transacting, acknowledging and rolling back;
    duplicated appends; documents with odd UUID spellings; garbage lines."""
    client.create(J, NDJSON)
    to = lambda _m: (J, "application/x-ndjson")  # noqa: E731
    base = new_clock(1_700_000_000 * 10**9)
    pubs = [Publisher(client, Clock(base + 1000 * i)) for i in range(3)]
    frames: list[bytes] = []
    for step in range(steps):
        pub = rng.choice(pubs)
        r = rng.random()
        if r < 0.35:
            res = pub.publish_committed(to, JsonDocument(v=step)).result()
        elif r < 0.55:
            res = pub.publish_uncommitted(to, JsonDocument(v=step)).result()
        elif r < 0.65 and pub.has_open_transaction:
            for i in pub.build_ack_intents():
                client.append(i.journal, i.intent).result()
            continue
        elif r < 0.7 and pub.has_open_transaction:
            for i in pub.build_rollback_intents():
                client.append(i.journal, i.intent).result()
            continue
        elif r < 0.8 and frames:
            client.append(J, rng.choice(frames)).result()  # a retried append
            continue
        elif r < 0.9:
            u = build_uuid(bytes([1, 2, 3, 4, 5, rng.randrange(3)]),
                           base + step * 16, rng.choice([0, 0, 1, 2, 0x40]))
            doc = {"v": step, "_meta": {"uuid": rng.choice(ODD_UUIDS)(u)}}
            client.append(J, orjson_line(doc)).result()
            continue
        else:
            client.append(J, rng.choice(GARBAGE)).result()
            continue
        with client.read(J, res.begin, res.end) as rd:
            frames.append(rd.read())


def orjson_line(doc: Any) -> bytes:
    return orjson.dumps(doc) + b"\n"


def read_committed(mode: str, client: MemoryJournalClient, new: Callable[[Any], Any],
                   buffer: int, prune: float = 0) -> tuple[list[Any], list[Any], int, int]:
    """Everything a committed read shows: envelopes, a checkpoint between
    every two yields (forgetting producers idle ``prune`` seconds: the
    Sequencer drops them, and the C loop must forget them too), replays and
    skipped frames."""
    with loops(mode):
        seq = reader_module._new_sequencer()
        it = ReadCommittedIter(client, J, new, type(seq)(buffer=buffer), skip_corrupt=True)
        out, cps = [], [it.checkpoint(prune)]
        for env in it:
            out.append(as_json(env))
            cps.append(it.checkpoint(prune))
        return out, cps, it.replays, it.skipped


def read_uncommitted(mode: str, client: MemoryJournalClient,
                     new: Callable[[Any], Any]) -> tuple[list[Any], int, int]:
    with loops(mode):
        it = ReadUncommittedIter(client, J, new, skip_corrupt=True)
        out = [as_json(env) for env in it]
        return out, it.skipped, it.offset


@needs_c
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), steps=st.integers(1, 80),
       buffer=st.sampled_from([1, 2, 3, 16, 4096]))
def test_json_documents_read_the_same_in_c_and_python(seed: int, steps: int, buffer: int) -> None:
    rng = random.Random(seed)
    with MemoryJournalClient() as client:
        write_json_journal(client, rng, steps)
        for new in (lambda _s: JsonDocument(), lambda _s: {}):
            assert read_uncommitted("c", client, new) == read_uncommitted("python", client, new)
        new = lambda _s: JsonDocument()  # noqa: E731
        for prune in (0, 2e-7):  # 2e-7 s: a few clock ticks, so producers are forgotten
            c = read_committed("c", client, new, buffer, prune)
            assert c == read_committed("python", client, new, buffer, prune)


@needs_c
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(1, 60),
       buffer=st.sampled_from([1, 2, 4096]))
def test_resuming_from_every_checkpoint_mixes_c_and_python(seed: int, steps: int,
                                                           buffer: int) -> None:
    """A checkpoint taken by one implementation resumes in the other."""
    rng = random.Random(seed)
    with MemoryJournalClient() as client:
        write_json_journal(client, rng, steps)
        new = lambda _s: JsonDocument()  # noqa: E731
        full, cps, _, _ = read_committed("c", client, new, buffer)
        for n, cp in enumerate(cps):
            mode = rng.choice(["c", "python"])
            with loops(mode):
                rest = [as_json(e) for e in
                        ReadCommittedIter(client, J, new, checkpoint=cp, skip_corrupt=True)]
            assert full[:n] + rest == full, (n, mode)


def write_typed_journal(client: MemoryJournalClient, rng: random.Random, steps: int,
                        labels: dict[str, str], make: Callable[[int], Any]) -> None:
    client.create(J, labels)
    content_type = labels["content-type"]
    to = lambda _m: (J, content_type)  # noqa: E731
    base = new_clock(1_700_000_000 * 10**9)
    pubs = [Publisher(client, Clock(base + 1000 * i)) for i in range(2)]
    for step in range(steps):
        pub = rng.choice(pubs)
        r = rng.random()
        if r < 0.5:
            pub.publish_committed(to, make(step)).result()
        elif r < 0.8:
            pub.publish_uncommitted(to, make(step)).result()
        elif pub.has_open_transaction:
            intents = pub.build_ack_intents() if r < 0.9 else pub.build_rollback_intents()
            for i in intents:
                client.append(i.journal, i.intent).result()
                if rng.random() < 0.3:
                    client.append(i.journal, i.intent).result()  # duplicated


@needs_c
@pytest.mark.parametrize("kind", ["csv", "dataclass", "counting"])
@pytest.mark.parametrize("seed", range(4))
def test_other_message_types_read_the_same(kind: str, seed: int) -> None:
    """CSV records (UUID from the UUID_INT_OF registry), dataclasses (from
    get_uuid) and a document type with its own __getitem__."""
    rng = random.Random(seed)
    new: Callable[[Any], Any]
    with MemoryJournalClient() as client:
        if kind == "csv":
            write_typed_journal(client, rng, 60, CSV, lambda i: CSVRecord(["", str(i)]))
            new = lambda _s: CSVRecord()  # noqa: E731
        elif kind == "dataclass":
            write_typed_journal(client, rng, 60, NDJSON, lambda i: Doc(str(i)))
            new = lambda _s: Doc()  # noqa: E731
        else:
            write_typed_journal(client, rng, 60, NDJSON, lambda i: CountingDocument(v=i))
            new = lambda _s: CountingDocument()  # noqa: E731
        for buffer in (1, 4096):
            c = read_committed("c", client, new, buffer)
            assert c[0], "nothing committed"
            assert c == read_committed("python", client, new, buffer)
        if kind == "counting":
            before = CountingDocument.lookups
            read_committed("c", client, new, 4096)
            assert CountingDocument.lookups > before


# -- errors -----------------------------------------------------------------


def journal_with(lines: list[bytes]) -> MemoryJournalClient:
    client = MemoryJournalClient()
    client.create(J, NDJSON)
    for line in lines:
        client.append(J, line).result()
    return client


def line_of(n: int, flags: Flags, producer: bytes) -> bytes:
    """A document {"v": n} of ``producer`` with clock (a fixed time + n)."""
    u = build_uuid(producer, new_clock(1_700_000_000 * 10**9) + n, flags)
    return orjson_line({"v": n, "_meta": {"uuid": str(u)}})


def good_line(n: int) -> bytes:
    return line_of(n, Flags.OUTSIDE_TXN, b"\x01\x02\x03\x04\x05\x06")


@pytest.mark.usefixtures("read_loops")
@pytest.mark.parametrize("committed", [False, True])
def test_corrupt_frame_is_an_error_naming_journal_and_offset(committed: bool) -> None:
    client = journal_with([good_line(1), good_line(2), b"{oops\n", good_line(3)])
    it_type = ReadCommittedIter if committed else ReadUncommittedIter
    offset = len(good_line(1)) + len(good_line(2))
    it = it_type(client, J, lambda _s: JsonDocument())
    assert [e.message["v"] for e in (next(it), next(it))] == [1, 2]
    with pytest.raises(FrameDecodeError) as info:
        next(it)
    err: Any = info.value
    assert (err.journal, err.offset) == (J, offset)
    assert f"in journal {J} at offset {offset}" in "\n".join(err.__notes__)
    assert err.__traceback__ is not None
    # As a generator: after the exception, the iterator is exhausted.
    assert next(it, None) is None


@pytest.mark.usefixtures("read_loops")
@pytest.mark.parametrize("committed", [False, True])
def test_truncated_tail_is_an_error_or_skipped(committed: bool) -> None:
    client = journal_with([good_line(1), b'{"v": 2'])
    it_type = ReadCommittedIter if committed else ReadUncommittedIter
    with pytest.raises(TruncatedFrameError) as info:
        list(it_type(client, J, lambda _s: JsonDocument()))
    assert getattr(info.value, "offset", None) == len(good_line(1))
    it = it_type(client, J, lambda _s: JsonDocument(), skip_corrupt=True)
    assert [e.message["v"] for e in it] == [1]
    assert it.skipped == 1


class BoomError(Exception):
    pass


@pytest.mark.usefixtures("read_loops")
@pytest.mark.parametrize("committed", [False, True])
def test_exceptions_of_user_code_propagate_unchanged(committed: bool) -> None:
    client = journal_with([good_line(1), good_line(2)])
    it_type = ReadCommittedIter if committed else ReadUncommittedIter
    calls = iter([JsonDocument()])

    def new(_spec: object) -> JsonDocument:
        try:
            return next(calls)
        except StopIteration:
            raise BoomError("no more messages") from None

    it = it_type(client, J, new)
    assert next(it).message["v"] == 1
    with pytest.raises(BoomError):
        next(it)

    class BadUUID(JsonDocument):
        def get_uuid(self) -> uuid.UUID:
            raise BoomError("get_uuid")

    if committed:
        with pytest.raises(BoomError):
            list(ReadCommittedIter(client, J, lambda _s: BadUUID()))


@needs_c
def test_a_sequencer_subclass_sees_every_envelope() -> None:
    """Overriding queue_uncommitted turns the C loop off: the override runs."""
    seen: list[int] = []

    class Watching(Sequencer):
        def queue_uncommitted(self, env: Envelope) -> bool:
            seen.append(env.begin)
            return super().queue_uncommitted(env)

    client = journal_with([good_line(n) for n in range(5)])
    out = [e.begin for e in ReadCommittedIter(client, J, lambda _s: JsonDocument(), Watching())]
    assert seen == out and len(out) == 5


@pytest.mark.usefixtures("read_loops")
@pytest.mark.parametrize("committed", [False, True])
def test_closing_releases_the_journal_reader(committed: bool) -> None:
    client = journal_with([good_line(n) for n in range(5)])
    opened: list[Any] = []
    real_read = client.read

    def read(*args: Any, **kwargs: Any) -> Any:
        opened.append(real_read(*args, **kwargs))
        return opened[-1]

    client.read = read  # type: ignore[method-assign]
    it_type = ReadCommittedIter if committed else ReadUncommittedIter
    it = it_type(client, J, lambda _s: JsonDocument())
    next(it)
    it.close()
    assert opened and all(r.closed for r in opened)
    opened.clear()
    list(it_type(client, J, lambda _s: JsonDocument()))
    assert opened and all(r.closed for r in opened)


# -- the envelopes themselves -----------------------------------------------


@needs_c
def test_envelopes_made_in_c_are_ordinary_envelopes() -> None:
    client = journal_with([good_line(1)])
    with loops("c"):
        (c_env,) = ReadUncommittedIter(client, J, lambda _s: JsonDocument())
    with loops("python"):
        (py_env,) = ReadUncommittedIter(client, J, lambda _s: JsonDocument())
    assert type(c_env) is Envelope
    assert c_env == py_env and repr(c_env) == repr(py_env)
    assert dataclasses.astuple(c_env) == dataclasses.astuple(py_env)
    assert pickle.loads(pickle.dumps(c_env)) == c_env
    assert dataclasses.replace(c_env, begin=7).begin == 7


@needs_c
@pytest.mark.parametrize("committed", [False, True])
def test_no_envelope_outlives_its_reader(committed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reference counts are right: nothing the loops made is kept alive."""
    client = journal_with([good_line(n) for n in range(300)] + [b"junk\n"])
    # A log record of the skipped frame would hold its traceback, and so the
    # reader's frame: not what this test is about.
    monkeypatch.setattr(logging.getLogger("message"), "disabled", True)

    def envelopes() -> int:
        return sum(type(o) is Envelope for o in gc.get_objects())

    it_type = ReadCommittedIter if committed else ReadUncommittedIter
    gc.collect()
    before = envelopes()
    with loops("c"):
        for _ in range(3):
            it = it_type(client, J, lambda _s: JsonDocument(), skip_corrupt=True)
            assert sum(1 for _ in it) == 300
            it.close()
            del it
    gc.collect()
    assert envelopes() == before


# -- a transaction's envelopes wait outside the garbage collector -------------

PRODUCER = b"\x03\x02\x03\x04\x05\x06"


def txn_line(n: int, flags: Flags, producer: bytes = PRODUCER) -> bytes:
    return line_of(n, flags, producer)


class SelfRef(JsonDocument):
    """A message in a reference cycle of its own, and weakly referable: a
    leak of it would outlive gc.collect()."""

    def __init__(self) -> None:
        super().__init__()
        self.me = self


@needs_c
def test_a_transactions_messages_wait_outside_the_collector() -> None:
    """While a transaction waits for its ACK, and once committed until each
    is handed out, the native Sequencer keeps its envelopes and messages
    out of the collector's lists (each collection would walk them again);
    every envelope handed out is tracked again, with its message."""
    open_txn = [txn_line(n, Flags.CONTINUE_TXN) for n in range(1, 201)]
    lines = [*open_txn, good_line(1), txn_line(201, Flags.ACK_TXN)]
    client = journal_with(lines)

    def tracked_docs() -> int:
        return sum(type(o) is SelfRef for o in gc.get_objects())

    with loops("c"):
        it = ReadCommittedIter(client, J, lambda _s: SelfRef())
        first = next(it)  # good_line(1): read after the 200 that wait
        assert first.message["v"] == 1
        assert tracked_docs() == 1  # its own: the 200 waiting are untracked
        second = next(it)  # the ACK committed the 200: handed out one by one
        assert second.message["v"] == 1
        assert tracked_docs() == 3  # and the ACK, which never waited
        rest = list(it)
        it.close()
    assert [e.message["v"] for e in rest] == [*range(2, 202)]  # the ACK last
    assert all(gc.is_tracked(e) and gc.is_tracked(e.message) for e in [first, second, *rest])
    assert tracked_docs() == 202


def _dead_after_reading(lines: list[bytes], buffer: int, stop_after: int | None = None
                        ) -> tuple[int, int]:
    """Reads ``lines`` committed (with a ring of ``buffer``) into SelfRef
    messages, keeping none of them; returns how many were made and how
    many are still alive after gc.collect()."""
    client = journal_with(lines)
    refs: list[weakref.ref[SelfRef]] = []

    def new(_spec: object) -> SelfRef:
        doc = SelfRef()
        refs.append(weakref.ref(doc))
        return doc

    with loops("c"):
        seq = Sequencer(buffer=buffer)
        it = ReadCommittedIter(client, J, new, seq)
        for k, _env in enumerate(it):
            if stop_after is not None and k + 1 >= stop_after:
                break
        it.close()
        del it, seq, _env
    # An iterator is freed by the collector (it is in a reference cycle):
    # its Sequencer gives back what waited during that collection, and the
    # next frees it.
    gc.collect()
    gc.collect()
    return len(refs), sum(r() is not None for r in refs)


@needs_c
@pytest.mark.parametrize("buffer", [1, 3, 4096])
def test_messages_that_waited_are_collected_on_every_path_out(buffer: int) -> None:
    """Every way out of the ring gives an envelope back to the collector, so
    that messages in reference cycles are freed: committed (wholly in the
    ring, or replayed after leaving it), rolled back, dropped as
    duplicates, superseded by a committed message, or still waiting when
    the reader closes."""
    other = b"\x05\x02\x03\x04\x05\x06"
    c, a, o = Flags.CONTINUE_TXN, Flags.ACK_TXN, Flags.OUTSIDE_TXN
    lines = (
        [txn_line(n, c) for n in range(1, 6)] + [txn_line(5, a)]            # committed
        + [txn_line(n, c) for n in range(6, 9)] + [txn_line(5, a)]          # rolled back
        + [txn_line(n, c) for n in range(9, 12)] + [txn_line(9, c)]         # a duplicate,
        + [txn_line(12, o)]                                                 # then superseded
        + [txn_line(n, c, other) for n in range(1, 7)]                      # another producer's,
        + [good_line(2)] + [txn_line(7, c, other)]                          # open at the end
    )
    made, alive = _dead_after_reading(lines, buffer)
    assert made >= len(lines)
    assert alive == 0
    made, alive = _dead_after_reading(lines, buffer, stop_after=3)  # closed mid-way
    assert alive == 0


# -- how the native core is found -------------------------------------------


def _can_build() -> bool:
    """A C compiler and Python's headers: what building the core needs."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(cc) is not None and headers.is_file()


def test_the_native_core_is_built_where_it_can_be() -> None:
    """`pip install` builds message/_native.c when it can (it is optional),
    and the public names are bound to it."""
    if _core.pure_python_requested():
        pytest.skip("EXACTLY_PURE_PYTHON is set")
    if not _can_build():
        pytest.skip("no C compiler or no Python headers: the Python implementation runs")
    assert _core.NATIVE is not None and _core.IMPLEMENTATION == "native"
    import message

    assert message.Sequencer is _core.NATIVE.Sequencer


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=ROOT,
                          capture_output=True, text=True, check=True)


def test_exactly_pure_python_picks_the_python_implementation() -> None:
    code = ("import message, message._core as c, message._reader as r;"
            "print(c.NATIVE is None, r.NATIVE is None, message.Sequencer.__module__)")
    out = _run(code, EXACTLY_PURE_PYTHON="1")
    assert out.stdout.split() == ["True", "True", "message._sequencer"]
    assert out.stderr == ""


def test_without_the_native_core_python_runs_with_one_warning() -> None:
    """Where the extension was not built, importing message warns once, and
    everything runs on the Python implementation."""
    code = (
        "import sys\n"
        "class NotBuilt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'message._native':\n"
        "            raise ImportError('No module named message._native')\n"
        "sys.meta_path.insert(0, NotBuilt())\n"
        "import message, message._core as c\n"
        "import message._reader, message._publisher\n"
        "print(c.IMPLEMENTATION, message.Sequencer.__module__)\n"
    )
    out = _run(code, EXACTLY_PURE_PYTHON="")
    assert out.stdout.split() == ["python", "message._sequencer"]
    warnings = [line for line in out.stderr.splitlines() if "Warning" in line]
    assert len(warnings) == 1, out.stderr
    assert _core.NOT_BUILT in warnings[0] and "RuntimeWarning" in warnings[0]


# -- the Publisher ------------------------------------------------------------


def _frames(producer: bytes, n: int, count: int) -> Any:
    """A frame function for publish_uncommitted_frames: ``count`` documents."""

    def frame(first: int) -> bytes:
        uuids = uuid_strings(producer, first, count, Flags.CONTINUE_TXN)
        return b"".join(b'{"n":%d,"i":%d,"_meta":{"uuid":"%s"}}\n'
                        % (n, i, uuids[36 * i:36 * i + 36]) for i in range(count))

    return frame


@needs_c
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["committed", "uncommitted", "ack", "rollback",
                                                "bad", "frames"]),
                              st.integers(0, 2)), max_size=40),
       own_clock=st.booleans())
def test_publishers_write_the_same_frames(ops: list[tuple[str, int]], own_clock: bool) -> None:
    """The native and the Python Publisher, given the same calls (and, with
    a caller's Clock, the same clocks), write the same frames and intents,
    and raise the same errors; ProducerIDs aside (each draws its own)."""
    from message._publisher import Publisher as PyPublisher

    journals = [f"pub/j{i}" for i in range(3)]
    written = []
    for publisher_type in (_core.NATIVE.Publisher, PyPublisher):
        client = MemoryJournalClient()
        for j in journals:
            client.create(j, NDJSON)
        pub = publisher_type(client, None if own_clock else Clock(new_clock(10**18)))
        log: list[Any] = []
        for n, (op, j) in enumerate(ops):
            to = lambda _m, j=j: (journals[j], "application/x-ndjson")  # noqa: E731
            try:
                if op in ("committed", "uncommitted"):
                    publish = (pub.publish_committed if op == "committed"
                               else pub.publish_uncommitted)
                    log.append(("result", publish(to, JsonDocument(n=n)).result()))
                elif op == "bad":
                    log.append(("result", pub.publish_committed(to, JsonDocument(_meta=7))))
                elif op == "frames":
                    log.append(("result", pub.publish_uncommitted_frames(
                        journals[j], j + 1, _frames(pub.producer_id, n, j + 1),
                        JsonDocument()).result()))
                else:
                    intents = (pub.build_ack_intents() if op == "ack"
                               else pub.build_rollback_intents())
                    log.append(("intents", [i.journal for i in intents]))
                    for i in intents:
                        client.append(i.journal, i.intent).result()
            except Exception as exc:  # compared below
                log.append(("raised", type(exc)))
            log.append(("open", pub.has_open_transaction))
        node = pub.producer_id.hex().encode()
        frames = []
        for j in journals:
            with client.read(j) as r:
                frames.append(r.read().replace(node, b"<producer>"))
        clocks = []
        for j in journals:
            clocks += [get_clock(e.message.get_uuid())
                       for e in ReadUncommittedIter(client, j, lambda _s: JsonDocument())]
        written.append((log, frames if not own_clock else None, len(clocks)))
        if own_clock:
            assert all(c > new_clock(10**18) for c in clocks)  # the wall clock: now
    assert written[0] == written[1]
