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
from typing import Any

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
        """The checkpoint as its protobuf message."""
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
        write the empty value (``12 00``)."""
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
            for entry in source.producers:
                if len(entry.id) != 6:
                    raise CheckpointError(
                        f"producer id of {journal} must be 6 bytes, not {len(entry.id)}"
                    )
                states.append(
                    ProducerState(journal, bytes(entry.id), entry.state.last_ack, entry.state.begin)
                )
        intents = {j: bytes(pb.ack_intents[j]) for j in sorted(pb.ack_intents)}
        return cls(offsets, states, intents)

    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        """Decode :meth:`to_bytes` output (or a Gazette consumer Checkpoint)."""
        pb = checkpoint_pb2.Checkpoint()
        try:
            pb.ParseFromString(data)
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
        try:
            offsets = {str(j): int(o) for j, o in doc.get("offsets", {}).items()}
            states = []
            for s in doc.get("states", []):
                producer = bytes.fromhex(s["producer"])
                if len(producer) != 6:
                    raise ValueError(f"producer {s['producer']} is not 6 bytes")
                states.append(
                    ProducerState(str(s["journal"]), producer, int(s["last_ack"]), int(s["begin"]))
                )
            intents = {
                str(j): base64.b64decode(b, validate=True)
                for j, b in doc.get("ack_intents", {}).items()
            }
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"not a JSON checkpoint: {exc!r}") from exc
        return cls(offsets, states, intents)

    @classmethod
    def from_json(cls, data: str | bytes) -> Checkpoint:
        """Decode :meth:`to_json` output."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise CheckpointError(f"not JSON: {exc}") from exc
        return cls.from_dict(doc)
