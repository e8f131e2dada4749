"""The ``message`` API (docs/api.md): the shapes and signatures it fixes.

Where the rest of the message contract is checked:

- Identifiers (``new_producer_id``, ``Flags``, ``build_uuid``, ``get_*``,
  ``new_clock``, ``Clock``): test_uuid.py.
- Messages and envelopes: this module; a message without a UUID and
  ``validate()``: test_publisher.py.
- Sequencer: test_sequencer_gazette.py (each rule, replays, ``ReplayError``,
  ``has_pending``, pruning), test_sequencer_properties.py (the output equals
  the reference model for every buffer size and across checkpoints).
- Checkpoints: test_checkpoint.py.
- Mapping: test_mapping.py.
- Publisher: test_publisher.py.
- Read iterators: test_reader.py, and test_sequencer_properties.py for
  ``ReadCommittedIter.checkpoint()`` at every yield.
- Errors: this module, and tests/test_exports.py for the class tree.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
import uuid

import pytest

from framing import FramingError
from journal import JournalNotFoundError, JournalSpec, MemoryJournalClient
from message import (
    AckIntent,
    Checkpoint,
    Envelope,
    JournalProducer,
    JsonDocument,
    Message,
    ProducerState,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    modulo_mapping,
    rendezvous_mapping,
)

P1 = b"\x01\x00\x00\x00\x00\x01"
NDJSON = {"content-type": "application/x-ndjson"}


def fields(cls: type) -> list[str]:
    assert dataclasses.is_dataclass(cls)
    return [f.name for f in dataclasses.fields(cls)]


class Msg:
    """The smallest user type satisfying the Message protocol."""

    def get_uuid(self) -> uuid.UUID:
        return uuid.UUID(int=0)

    def set_uuid(self, u: uuid.UUID) -> None:
        pass

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg()


def test_message_is_a_protocol() -> None:
    """Message (a typing.Protocol): get_uuid, set_uuid, new_acknowledgement."""
    assert typing.Protocol in Message.__mro__
    for name in ("get_uuid", "set_uuid", "new_acknowledgement"):
        assert callable(getattr(Message, name))


def test_envelope_fields() -> None:
    """@dataclass class Envelope: journal, begin, end, message, in that order."""
    assert fields(Envelope) == ["journal", "begin", "end", "message"]
    spec, m = JournalSpec("spec/a", NDJSON), Msg()
    e = Envelope(spec, 3, 9, m)
    assert (e.journal, e.begin, e.end, e.message) == (spec, 3, 9, m)


def test_journal_producer_is_a_named_tuple() -> None:
    """class JournalProducer(NamedTuple): journal: str, producer: bytes."""
    jp = JournalProducer("a/b", P1)
    assert isinstance(jp, tuple) and JournalProducer._fields == ("journal", "producer")
    assert jp == ("a/b", P1) and jp.journal == "a/b" and jp.producer == P1


def test_producer_state_fields() -> None:
    """@dataclass class ProducerState: journal, producer, last_ack, begin."""
    assert fields(ProducerState) == ["journal", "producer", "last_ack", "begin"]
    s = ProducerState("a/b", P1, 10, -1)
    assert (s.journal, s.producer, s.last_ack, s.begin) == ("a/b", P1, 10, -1)


def test_ack_intent_fields() -> None:
    """@dataclass class AckIntent: journal: str, intent: bytes."""
    assert fields(AckIntent) == ["journal", "intent"]
    assert AckIntent("a/b", b"x") == AckIntent(journal="a/b", intent=b"x")


def test_checkpoint_fields_and_default_ack_intents() -> None:
    """@dataclass Checkpoint: offsets, states, ack_intents (default empty, one per instance)."""
    assert fields(Checkpoint)[:3] == ["offsets", "states", "ack_intents"]
    assert Checkpoint(offsets={"a": 1}, states=[]).ack_intents == {}
    assert Checkpoint({"a": 1}, []).ack_intents is not Checkpoint({"a": 1}, []).ack_intents


def test_sequencer_signature() -> None:
    """Sequencer(states: Iterable[ProducerState] = (), buffer: int = 4096)."""
    params = inspect.signature(Sequencer).parameters
    assert list(params)[:2] == ["states", "buffer"]
    assert params["states"].default == () and params["buffer"].default == 4096
    seq = Sequencer([ProducerState("a", P1, 5, -1)], 10)
    assert seq.producer_states() == [ProducerState("a", P1, 5, -1)]


def test_publisher_signature_and_producer_id() -> None:
    """Publisher(client, clock=None); .producer_id: 6 bytes with the multicast bit
    set, one per Publisher."""
    params = inspect.signature(Publisher).parameters
    assert list(params) == ["client", "clock"] and params["clock"].default is None
    with MemoryJournalClient() as client:
        p = Publisher(client)
        assert type(p.producer_id) is bytes and len(p.producer_id) == 6
        assert p.producer_id[0] & 1 == 1
        assert Publisher(client).producer_id != p.producer_id


def test_methods_take_their_arguments_by_the_names_of_the_contract() -> None:
    """The Sequencer's and the Publisher's methods take each argument by
    position or by its name (as the contract names them), and refuse
    another, on either implementation."""
    seq = Sequencer()
    with MemoryJournalClient() as client:
        spec = client.create("kw/a", NDJSON)
        mapping = modulo_mapping(lambda m: "k", lambda: [spec])
        pub = Publisher(client)
        pub.publish_uncommitted(mapping=mapping, msg=JsonDocument(n=1)).result()
        pub.publish_uncommitted(mapping, msg=JsonDocument(n=2)).result()
        for intent in pub.build_ack_intents():
            client.append(intent.journal, intent.intent).result()
        pub.publish_committed(mapping=mapping, msg=JsonDocument(n=3)).result()
        with ReadUncommittedIter(client, "kw/a", lambda s: JsonDocument()) as it:
            envs = list(it)
    done, committed = [], []
    for env in envs:
        done.append(seq.queue_uncommitted(env=env))
        assert seq.has_pending(since={"kw/a": 0}) is not done[-1]
        while (out := seq.deque_committed()) is not None:
            committed.append(out.message.get("n", "ack"))
    assert done == [False, False, True, True] and committed == [1, 2, "ack", 3]
    with pytest.raises(TypeError, match="since"):
        seq.has_pending({}, since={})
    with pytest.raises(TypeError, match="unexpected keyword"):
        seq.has_pending(offsets={})
    with pytest.raises(TypeError, match="msg"):
        pub.publish_committed(mapping)  # type: ignore[call-arg]


def test_mapping_hash_is_a_keyword_defaulting_to_mmh3() -> None:
    """modulo_mapping / rendezvous_mapping(key, partitions, *, hash="mmh3")."""
    for f in (modulo_mapping, rendezvous_mapping):
        params = inspect.signature(f).parameters
        assert list(params)[:2] == ["key", "partitions"]
        assert params["hash"].default == "mmh3"
        assert params["hash"].kind is inspect.Parameter.KEYWORD_ONLY


def test_read_iterator_signatures() -> None:
    """ReadUncommittedIter(client, journal, new_message, *, offset=0, end_offset=None,
    block=False); ReadCommittedIter adds sequencer=None and *, checkpoint=None;
    .checkpoint(prune_horizon=0)."""
    assert inspect.signature(ReadCommittedIter.checkpoint).parameters["prune_horizon"].default == 0
    keywords = {"offset": 0, "end_offset": None, "block": False}
    params = inspect.signature(ReadCommittedIter).parameters
    assert list(params)[:4] == ["client", "journal", "new_message", "sequencer"]
    assert params["sequencer"].default is None
    for name, default in {**keywords, "checkpoint": None}.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default
    params = inspect.signature(ReadUncommittedIter).parameters
    assert list(params)[:3] == ["client", "journal", "new_message"]
    for name, default in keywords.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == default


def test_errors_of_the_message_api_derive_from_package_bases() -> None:
    """What the library raises derives from JournalError / FramingError / MessageError:
    the read iterators over an unknown journal, a message its framing cannot encode."""
    with MemoryJournalClient() as client:
        client.create("err/bad", NDJSON)
        for it in (ReadUncommittedIter, ReadCommittedIter):
            with pytest.raises(JournalNotFoundError):
                list(it(client, "err/none", lambda s: JsonDocument()))
        # The mapping names CSV: a JsonDocument has no CSV form.
        with pytest.raises(FramingError):
            Publisher(client).publish_committed(lambda m: ("err/bad", "text/csv"),
                                                JsonDocument(n=1))
        assert client.head("err/bad") == 0
