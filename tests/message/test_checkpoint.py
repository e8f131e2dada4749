"""Checkpoint encodings: protobuf (wire-compatible with Gazette's consumer Checkpoint) and JSON.

The hex fixtures were produced by Gazette's Go code marshalling
consumer/protocol.Checkpoint values written out beside them. The test also
decodes protobuf bytes with a small wire-format reader of its own, so that
what ``to_bytes`` writes is checked independently of the generated code.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from message import Checkpoint, CheckpointError, MessageError, ProducerState, Sequencer
from tests.strategies import EnvelopeGenerator, producer, state_key

# Checkpoint{Sources: {"a/journal": {ReadThrough: 1234, Producers: [
#     {Id: 010203040506, State: {LastAck: 0xfedcba9876543210, Begin: -1}},
#     {Id: 0b0c0d0e0f10, State: {LastAck: 42, Begin: 100}}]}},
#   AckIntents: {"b/journal": `{"ack":true}` + "\n"}}
GO_SINGLE = bytes.fromhex(
    "0a470a09612f6a6f75726e616c123a08d209121e0a060102030405061214091032547698badcfe10ff"
    "ffffffffffffffff0112150a060b0c0d0e0f10120b092a000000000000001064121a0a09622f6a6f75"
    "726e616c120d7b2261636b223a747275657d0a"
)
SINGLE = (
    {"a/journal": 1234},
    {
        ("a/journal", bytes.fromhex("010203040506"), 0xFEDCBA9876543210, -1),
        ("a/journal", bytes.fromhex("0b0c0d0e0f10"), 42, 100),
    },
    {"b/journal": b'{"ack":true}\n'},
)

# Checkpoint{Sources: {
#     "x/one": {ReadThrough: 0},
#     "x/two": {ReadThrough: 1 << 40, Producers: [{Id: 030000000001, State: {0, 0}}]},
#     "x/three": {ReadThrough: 7, Producers: [
#         {Id: 050000000002, State: {LastAck: 1<<64 - 1, Begin: 1<<63 - 1}},
#         {Id: 070000000003, State: {LastAck: 1, Begin: 6}}]}},
#   AckIntents: {"x/one": {}, "y/ack": 66339336 00000000}}
# (Go writes map entries in random order; these bytes are one such order.)
GO_MULTI = bytes.fromhex(
    "0a430a07782f746872656512380807121d0a06050000000002121309ffffffffffffffff10ffffffff"
    "ffffffff7f12150a06070000000003120b09010000000000000010060a1c0a05782f74776f12130880"
    "8080808020120a0a0603000000000112000a090a05782f6f6e65120012110a05792f61636b12086633"
    "93360000000012070a05782f6f6e65"
)
MULTI = (
    {"x/one": 0, "x/two": 1 << 40, "x/three": 7},
    {
        ("x/two", bytes.fromhex("030000000001"), 0, 0),
        ("x/three", bytes.fromhex("050000000002"), (1 << 64) - 1, (1 << 63) - 1),
        ("x/three", bytes.fromhex("070000000003"), 1, 6),
    },
    {"x/one": b"", "y/ack": bytes.fromhex("6633933600000000")},
)

Canonical = tuple[dict[str, int], set[tuple[str, bytes, int, int]], dict[str, bytes]]


# -- an independent reader of the protobuf wire format ----------------------


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    out = []
    i = 0
    while i < len(data):
        tag, i = _varint(data, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = int.from_bytes(data[i : i + 8], "little"), i + 8
        elif wire == 2:
            n, i = _varint(data, i)
            value, i = data[i : i + n], i + n
        elif wire == 5:
            value, i = int.from_bytes(data[i : i + 4], "little"), i + 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, wire, value))
    assert i == len(data)
    return out


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def parse_checkpoint(data: bytes) -> Canonical:
    """Decode Gazette's consumer Checkpoint from its wire format."""
    offsets: dict[str, int] = {}
    states: set[tuple[str, bytes, int, int]] = set()
    intents: dict[str, bytes] = {}
    for number, wire, value in _fields(data):
        assert wire == 2
        key, payload = "", b""
        for n, w, v in _fields(value):
            if n == 1:
                assert w == 2
                key = v.decode()
            elif n == 2:
                assert w == 2
                payload = v
        if number == 2:  # ack_intents
            intents[key] = payload
            continue
        assert number == 1  # sources
        offsets[key] = 0
        for n, w, v in _fields(payload):
            if n == 1:
                assert w == 0
                offsets[key] = _int64(v)
            elif n == 2:
                assert w == 2
                pid, last_ack, begin = b"", 0, 0
                for n2, w2, v2 in _fields(v):
                    assert w2 == 2
                    if n2 == 1:
                        pid = v2
                    elif n2 == 2:
                        for n3, w3, v3 in _fields(v2):
                            if n3 == 1:
                                assert w3 == 1  # fixed64
                                last_ack = v3
                            elif n3 == 2:
                                assert w3 == 0
                                begin = _int64(v3)
                states.add((key, pid, last_ack, begin))
    return offsets, states, intents


def canonical(cp: Checkpoint) -> Canonical:
    states = {(s.journal, bytes(s.producer), s.last_ack, s.begin) for s in cp.states}
    assert len(states) == len(cp.states)
    return dict(cp.offsets), states, {k: bytes(v) for k, v in cp.ack_intents.items()}


def build(c: Canonical, order: list[tuple[str, bytes, int, int]] | None = None) -> Checkpoint:
    offsets, states, intents = c
    rows = order if order is not None else sorted(states)
    return Checkpoint(
        offsets=dict(offsets),
        states=[ProducerState(j, p, a, b) for j, p, a, b in rows],
        ack_intents=dict(intents),
    )


# -- tests ---------------------------------------------------------------------


def test_reader_decodes_go_fixtures() -> None:
    """The test's wire reader agrees with the values the Go fixtures were built from."""
    assert parse_checkpoint(GO_SINGLE) == SINGLE
    assert parse_checkpoint(GO_MULTI) == MULTI


def test_from_bytes_reads_gazette_checkpoints() -> None:
    """Checkpoint.from_bytes decodes what Gazette's consumer Checkpoint marshals."""
    for raw, expect in ((GO_SINGLE, SINGLE), (GO_MULTI, MULTI)):
        cp = Checkpoint.from_bytes(raw)
        assert isinstance(cp, Checkpoint)
        assert canonical(cp) == expect
        assert all(isinstance(s, ProducerState) for s in cp.states)


def test_to_bytes_is_gazettes_wire_format() -> None:
    """to_bytes writes Gazette's wire format: byte for byte for a one-entry checkpoint."""
    order = [
        ("a/journal", bytes.fromhex("010203040506"), 0xFEDCBA9876543210, -1),
        ("a/journal", bytes.fromhex("0b0c0d0e0f10"), 42, 100),
    ]
    single = build(SINGLE, order)
    assert single.to_bytes() == GO_SINGLE
    # Map entries may come in any order: compare what the bytes say.
    assert parse_checkpoint(build(MULTI).to_bytes()) == MULTI


def test_empty_checkpoint() -> None:
    """An empty checkpoint is zero bytes, as Gazette marshals it; and it round-trips."""
    empty = Checkpoint(offsets={}, states=[])
    assert empty.ack_intents == {}
    assert empty.to_bytes() == b""
    assert canonical(Checkpoint.from_bytes(b"")) == ({}, set(), {})
    assert canonical(Checkpoint.from_json(empty.to_json())) == ({}, set(), {})


@pytest.mark.parametrize(
    ("decode", "data"),
    [
        (Checkpoint.from_bytes, b"\xff\xff\xff"),
        (Checkpoint.from_json, "not json"),
        (Checkpoint.from_json, "[1]"),
        (Checkpoint.from_json, '{"offsets": 3}'),
    ],
)
def test_garbage_is_a_checkpoint_error(decode: Any, data: Any) -> None:
    """Bytes or text that are no checkpoint raise CheckpointError: a
    MessageError and a ValueError (errors derive from the package's base)."""
    with pytest.raises(CheckpointError) as info:
        decode(data)
    assert isinstance(info.value, MessageError) and isinstance(info.value, ValueError)


def test_json_round_trip_of_fixtures() -> None:
    """to_json is JSON, and from_json restores the same checkpoint."""
    for c in (SINGLE, MULTI):
        cp = build(c)
        text = cp.to_json()
        json.loads(text)
        assert canonical(Checkpoint.from_json(text)) == c


journal_names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x2FF), min_size=1, max_size=12
)


@st.composite
def checkpoints(draw: st.DrawFn) -> Canonical:
    """Checkpoints whose producer states are all of journals with an offset."""
    offsets = draw(st.dictionaries(journal_names, st.integers(0, 2**63 - 1), max_size=4))
    states = set()
    for journal in offsets:
        pids = draw(st.lists(st.binary(min_size=6, max_size=6), unique=True, max_size=3))
        for pid in pids:
            states.add(
                (
                    journal,
                    pid,
                    draw(st.integers(0, 2**64 - 1)),
                    draw(st.one_of(st.just(-1), st.integers(0, 2**63 - 1))),
                )
            )
    intents = draw(st.dictionaries(journal_names, st.binary(max_size=40), max_size=3))
    return offsets, states, intents


@settings(deadline=None, max_examples=200)
@given(checkpoints())
def test_bytes_round_trip(c: Canonical) -> None:
    """from_bytes(to_bytes(cp)) is cp; the bytes decode to cp with an independent reader."""
    cp = build(c)
    raw = cp.to_bytes()
    assert isinstance(raw, bytes)
    assert parse_checkpoint(raw) == c
    back = Checkpoint.from_bytes(raw)
    assert canonical(back) == c
    assert back.to_bytes() == raw or parse_checkpoint(back.to_bytes()) == c


@settings(deadline=None, max_examples=200)
@given(checkpoints())
def test_json_round_trip(c: Canonical) -> None:
    """from_json(to_json(cp)) is cp, and to_json is valid JSON."""
    cp = build(c)
    text = cp.to_json()
    json.loads(text)
    assert canonical(Checkpoint.from_json(text)) == c
    assert canonical(Checkpoint.from_json(Checkpoint.from_bytes(cp.to_bytes()).to_json())) == c


def test_checkpoint_of_a_sequencer_restores_it() -> None:
    """producer_states() through to_bytes/from_bytes restore a Sequencer with the same states."""
    gen = EnvelopeGenerator()
    a, b = producer(1), producer(2)
    seq = Sequencer()
    envs = [gen(a, 5, 1), gen(b, 9, 0), gen(a, 6, 1), gen(b, 3, 2, journal="other")]
    for env in envs:
        seq.queue_uncommitted(env)
        while seq.deque_committed() is not None:
            pass
    cp = Checkpoint(
        offsets={"test/journal": envs[2].end, "other": envs[3].end}, states=seq.producer_states()
    )
    restored = Sequencer(Checkpoint.from_bytes(cp.to_bytes()).states)
    assert sorted(map(state_key, restored.producer_states())) == sorted(
        map(state_key, seq.producer_states())
    )
    assert sorted(map(state_key, seq.producer_states())) == [
        ("other", b, 3, -1),
        ("test/journal", a, 4, envs[0].begin),
        ("test/journal", b, 9, -1),
    ]


def test_an_empty_ack_intent_is_encoded_as_gazette_does() -> None:
    """An empty ACK intent is a map entry with its key alone (Go leaves out the
    empty value): the bytes are identical to Gazette's, and decode back."""
    cp = Checkpoint(offsets={}, states=[], ack_intents={"x/one": b""})
    assert cp.to_bytes() == bytes.fromhex("12070a05782f6f6e65")  # from GO_MULTI
    assert Checkpoint.from_bytes(cp.to_bytes()) == cp
    mixed = Checkpoint(
        offsets={"a/journal": 1}, states=[], ack_intents={"b": b"", "a": b"\n", "c": b""}
    )
    raw = mixed.to_bytes()
    assert b"\x12\x00" not in raw
    assert raw == bytes.fromhex(
        "0a0f0a09612f6a6f75726e616c12020801"  # sources: {"a/journal": {read_through: 1}}
        "12060a016112010a"  # "a": "\n"
        "12030a0162"  # "b": empty, key alone
        "12030a0163"  # "c": empty, key alone
    )
    assert Checkpoint.from_bytes(raw) == mixed
    # The same bytes as the generated code's deterministic encoding otherwise.
    plain = Checkpoint(offsets={"a/journal": 1}, states=[], ack_intents={"a": b"\n"})
    assert plain.to_bytes() == plain.to_proto().SerializeToString(deterministic=True)


AUDIT = ('{"ack_intents":{},"offsets":{"a/j":true},"states":[{"begin":77,"journal":"a/j",'
         '"last_ack":22423971003270158897,"producer":"010203040506"}]}')


def _state(**fields: Any) -> str:
    doc = {"journal": "a/j", "producer": "010203040506", "last_ack": 1, "begin": -1}
    doc.update(fields)
    return json.dumps({"offsets": {"a/j": 5}, "states": [doc]})


@pytest.mark.parametrize(("text", "field"), [
    (AUDIT, "offset of a/j"),
    ('{"offsets": {"a/j": true}}', "offset of a/j"),
    ('{"offsets": {"a/j": 1.5}}', "offset of a/j"),
    ('{"offsets": {"a/j": -1}}', "offset of a/j"),
    ('{"offsets": {"a/j": 9223372036854775808}}', "offset of a/j"),
    ('{"offsets": {"a/j": "7"}}', "offset of a/j"),
    ('{"offsets": {"": 7}}', "empty journal name"),
    (_state(last_ack=-1), "last_ack"),
    (_state(last_ack=2**64), "last_ack"),
    (_state(last_ack=22423971003270158897), "last_ack"),  # a float, once decoded
    (_state(last_ack=True), "last_ack"),
    (_state(begin=-3), "begin"),
    (_state(begin=1.5), "begin"),
    (_state(begin=2**63), "begin"),
    (_state(producer="0102"), "producer"),
    (_state(producer="zz0203040506"), "producer"),
    (_state(producer=7), "producer"),
    (_state(journal=""), "journal"),
    (_state(journal=3), "journal"),
    ('{"states": {}}', "states"),
    ('{"states": [3]}', "states[0]"),
    ('{"ack_intents": {"a/j": "***"}}', "ACK intent of a/j"),
    ('{"ack_intents": []}', "ack_intents"),
    # Some other JSON document is no empty checkpoint.
    ('{"page": "/home"}', "none of offsets, states and ack_intents (its keys: page)"),
])
def test_malformed_json_checkpoints_fail_at_decode_naming_the_field(text: str, field: str) -> None:
    """Every number is checked at decode: its type (an integer, not a bool
    or a float) and its range, as the protobuf fields hold them."""
    with pytest.raises(CheckpointError, match=re.escape(field)):
        Checkpoint.from_json(text)


def test_an_empty_json_object_is_an_empty_checkpoint() -> None:
    assert Checkpoint.from_json("{}") == Checkpoint()
    assert Checkpoint.from_json('{"offsets": {}}') == Checkpoint()


def test_malformed_protobuf_checkpoints_fail_at_decode() -> None:
    """The protobuf decoder holds a checkpoint to the same rules: a negative
    offset, a begin below -1, a producer ID that is not 6 bytes."""
    from message._proto import checkpoint_pb2

    for mutate, field in [
        (lambda pb: setattr(pb.sources["a/j"], "read_through", -5), "offset of a/j"),
        (lambda pb: setattr(pb.sources["a/j"].producers[0].state, "begin", -3), "begin"),
        (lambda pb: setattr(pb.sources["a/j"].producers[0], "id", b"\x01\x02"), "6 bytes"),
    ]:
        pb = checkpoint_pb2.Checkpoint()
        entry = pb.sources["a/j"].producers.add()
        entry.id, entry.state.last_ack, entry.state.begin = b"\x01" * 6, 7, -1
        mutate(pb)
        with pytest.raises(CheckpointError, match=field):
            Checkpoint.from_bytes(pb.SerializeToString())


def test_a_checkpoint_built_with_bad_numbers_fails_to_encode_clearly() -> None:
    cp = Checkpoint({"a/j": 5}, [ProducerState("a/j", b"\x01" * 6, 2**64, -1)])
    with pytest.raises(CheckpointError, match="last_ack"):
        cp.to_bytes()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8,
)


@st.composite
def mangled_json_checkpoints(draw: st.DrawFn) -> str:
    """A valid JSON checkpoint with one of its values replaced by anything."""
    doc = json.loads(_state())
    doc["ack_intents"] = {"b/j": "eyJhY2siOnRydWV9Cg=="}
    paths = [("offsets", "a/j"), ("states", 0, "journal"), ("states", 0, "producer"),
             ("states", 0, "last_ack"), ("states", 0, "begin"), ("ack_intents", "b/j"),
             ("offsets",), ("states",), ("ack_intents",), ("states", 0)]
    path = draw(st.sampled_from(paths))
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = draw(json_values)
    return json.dumps(doc)


@settings(max_examples=400, deadline=None)
@given(mangled_json_checkpoints())
def test_fuzzed_json_checkpoints_decode_and_encode_or_raise_checkpoint_error(text: str) -> None:
    """Whatever the JSON, decoding either gives a checkpoint that encodes
    both ways and decodes back the same, or raises CheckpointError: never a
    bare ValueError, TypeError or protobuf error."""
    try:
        cp = Checkpoint.from_json(text)
    except CheckpointError:
        return
    assert Checkpoint.from_bytes(cp.to_bytes()) == with_source_offsets(cp)
    assert Checkpoint.from_json(cp.to_json()) == cp


def with_source_offsets(cp: Checkpoint) -> Checkpoint:
    """``cp`` as protobuf keeps it: a producer state's journal is a Source,
    whose offset is 0 where ``cp`` gives none."""
    offsets = {s.journal: 0 for s in cp.states} | cp.offsets
    return Checkpoint(offsets, cp.states, cp.ack_intents)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80))
def test_fuzzed_protobuf_checkpoints_decode_and_encode_or_raise_checkpoint_error(
        data: bytes) -> None:
    try:
        cp = Checkpoint.from_bytes(data)
    except CheckpointError:
        return
    assert Checkpoint.from_bytes(cp.to_bytes()) == cp
    assert Checkpoint.from_json(cp.to_json()) == cp
