"""Checkpoints: where a consumer resumes, and what it must remember to do so.

``to_bytes`` is the protobuf ``Checkpoint`` of ``proto/checkpoint.proto``,
wire-compatible with Gazette's consumer ``Checkpoint``::

    Checkpoint
      sources:     map<journal, Source{read_through, producers[{id, state}]}>
      ack_intents: map<journal, bytes>
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from google.protobuf.message import DecodeError

from ._envelope import ProducerState
from ._errors import CheckpointError
from ._proto import checkpoint_pb2


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative ``n``."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _state_key(s: ProducerState) -> tuple[str, bytes]:
    return (s.journal, s.producer)


#: The members of a JSON checkpoint (``Checkpoint.to_dict``).
_JSON_KEYS: Final = frozenset({"offsets", "states", "ack_intents"})
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1


def _number(value: Any, what: str, low: int, high: int) -> int:
    """``value`` if it is an integer (not a bool, not a float) in
    ``[low, high]``, else ``CheckpointError`` naming ``what``."""
    if type(value) is not int or not low <= value <= high:
        raise CheckpointError(f"{what} must be an integer from {low} to {high}, not {value!r}")
    return value


def _checked(offsets: dict[str, int], states: list[ProducerState]) -> None:
    """The rules of the checkpoint's numbers, whatever it was decoded from:
    offsets are non-negative int64; a producer's ``last_ack`` a uint64 (a
    Clock), its ``begin`` an int64 offset or -1 (no open transaction); a
    producer ID is 6 bytes."""
    for journal, offset in offsets.items():
        _number(offset, f"the offset of {journal}", 0, _INT64_MAX)
    for st in states:
        where = f"producer {st.producer.hex()} of {st.journal}"
        if len(st.producer) != 6:
            raise CheckpointError(f"the ID of {where} must be 6 bytes, not {len(st.producer)}")
        _number(st.last_ack, f"last_ack of {where}", 0, _UINT64_MAX)
        _number(st.begin, f"begin of {where}", -1, _INT64_MAX)


@dataclass(eq=False)
class Checkpoint:
    """Read offsets, producer states and pending ACK intents of a consumer.

    ``offsets`` maps a journal to the offset to resume reading at; ``states``
    are the Sequencer's ProducerStates; ``ack_intents`` maps a journal to the
    framed ACK messages to (re-)append to it on recovery. Two checkpoints are
    equal when they hold the same offsets, intents and set of states.
    """

    offsets: dict[str, int] = field(default_factory=dict)
    states: list[ProducerState] = field(default_factory=list)
    ack_intents: dict[str, bytes] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return (
            self.offsets == other.offsets
            and self.ack_intents == other.ack_intents
            and sorted(self.states, key=_state_key) == sorted(other.states, key=_state_key)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like its fields

    # -- protobuf -------------------------------------------------------------

    def to_proto(self) -> checkpoint_pb2.Checkpoint:
        """The checkpoint as its protobuf message (``CheckpointError`` for a
        number out of its field's range)."""
        _checked(self.offsets, self.states)
        pb = checkpoint_pb2.Checkpoint()
        for journal, offset in self.offsets.items():
            pb.sources[journal].read_through = offset
        for s in self.states:
            entry = pb.sources[s.journal].producers.add()
            entry.id = s.producer
            entry.state.last_ack = s.last_ack
            entry.state.begin = s.begin
        for journal, intent in self.ack_intents.items():
            pb.ack_intents[journal] = intent
        return pb

    def to_bytes(self) -> bytes:
        """Protobuf encoding (deterministic: map entries sorted by journal).

        The bytes are those Gazette's Go encoder writes (which orders map
        entries at random): in particular an ACK intent that is empty is an
        entry with its key alone, where protobuf's Python encoder would also
        write the empty value (``12 00``). A producer state of a journal
        that has no offset decodes with offset 0: protobuf keeps both in
        the journal's ``Source``."""
        pb = self.to_proto()
        if not any(not intent for intent in self.ack_intents.values()):
            data: bytes = pb.SerializeToString(deterministic=True)
            return data
        # Field 1 (sources) by the generated code, then field 2 (ack_intents)
        # entry by entry, in the order the deterministic encoder would use.
        pb.ClearField("ack_intents")
        out = bytearray(pb.SerializeToString(deterministic=True))
        for key, intent in sorted(
            ((j.encode(), bytes(i)) for j, i in self.ack_intents.items())
        ):
            entry = bytearray(b"\x0a") + _varint(len(key)) + key
            if intent:
                entry += b"\x12" + _varint(len(intent)) + intent
            out += b"\x12" + _varint(len(entry)) + entry
        return bytes(out)

    @classmethod
    def from_proto(cls, pb: checkpoint_pb2.Checkpoint) -> Checkpoint:
        offsets: dict[str, int] = {}
        states: list[ProducerState] = []
        for journal in sorted(pb.sources):
            source = pb.sources[journal]
            offsets[journal] = source.read_through
            states.extend(
                ProducerState(journal, bytes(e.id), e.state.last_ack, e.state.begin)
                for e in source.producers
            )
        _checked(offsets, states)
        intents = {j: bytes(pb.ack_intents[j]) for j in sorted(pb.ack_intents)}
        return cls(offsets, states, intents)

    @classmethod
    def from_bytes(cls, b: bytes) -> Checkpoint:
        """Decode :meth:`to_bytes` output ``b`` (or a Gazette consumer Checkpoint)."""
        pb = checkpoint_pb2.Checkpoint()
        try:
            pb.ParseFromString(b)
        except DecodeError as exc:
            raise CheckpointError(f"not a protobuf Checkpoint: {exc}") from exc
        return cls.from_proto(pb)

    # -- JSON -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: producers as hex, intents as base64."""
        return {
            "offsets": dict(self.offsets),
            "states": [
                {
                    "journal": s.journal,
                    "producer": s.producer.hex(),
                    "last_ack": s.last_ack,
                    "begin": s.begin,
                }
                for s in self.states
            ],
            "ack_intents": {
                j: base64.b64encode(b).decode("ascii") for j, b in self.ack_intents.items()
            },
        }

    def to_json(self) -> str:
        """JSON encoding; see :meth:`to_dict`."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_dict(cls, doc: Any) -> Checkpoint:
        """Decode :meth:`to_dict` output. Every field is checked: a wrong
        type, a number out of its range (or not an integer) raises
        ``CheckpointError`` naming it."""
        if not isinstance(doc, dict):
            raise CheckpointError(f"a JSON checkpoint is an object, not {type(doc).__name__}")
        if doc and not doc.keys() & _JSON_KEYS:
            # Some other JSON document: not an empty checkpoint.
            raise CheckpointError(
                "not a JSON checkpoint: an object with none of offsets, states and ack_intents"
                f" (its keys: {', '.join(sorted(map(str, doc))[:5])})")
        offsets: dict[str, int] = {}
        for j, o in _object(doc, "offsets").items():
            offsets[j] = _number(o, f"the offset of {j}", 0, _INT64_MAX)
        states = []
        raw_states = doc.get("states", [])
        if not isinstance(raw_states, list):
            raise CheckpointError(f"states must be a list, not {type(raw_states).__name__}")
        for i, st in enumerate(raw_states):
            if not isinstance(st, dict):
                raise CheckpointError(f"states[{i}] must be an object")
            journal, producer = st.get("journal"), st.get("producer")
            if not isinstance(journal, str) or not journal:
                raise CheckpointError(f"states[{i}].journal must be a journal name")
            try:
                pid = bytes.fromhex(producer) if isinstance(producer, str) else b""
            except ValueError:
                pid = b""
            if len(pid) != 6:
                raise CheckpointError(
                    f"states[{i}].producer must be 6 bytes in hex, not {producer!r}")
            states.append(ProducerState(
                journal, pid,
                _number(st.get("last_ack"), f"states[{i}].last_ack", 0, _UINT64_MAX),
                _number(st.get("begin"), f"states[{i}].begin", -1, _INT64_MAX),
            ))
        intents: dict[str, bytes] = {}
        for j, b in _object(doc, "ack_intents").items():
            try:
                intents[j] = base64.b64decode(b, validate=True)
            except (TypeError, ValueError) as exc:
                raise CheckpointError(f"the ACK intent of {j} is not base64: {exc}") from exc
        return cls(offsets, states, intents)

    @classmethod
    def from_json(cls, data: str | bytes) -> Checkpoint:
        """Decode :meth:`to_json` output."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise CheckpointError(f"not JSON: {exc}") from exc
        return cls.from_dict(doc)


def _object(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """``doc[name]``: an object whose keys are journal names ({} if absent)."""
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise CheckpointError(f"{name} must be an object, not {type(value).__name__}")
    for key in value:
        if not key:
            raise CheckpointError(f"{name} has an empty journal name")
    return value
