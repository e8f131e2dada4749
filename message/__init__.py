"""Exactly-once message semantics atop at-least-once, append-only journals.

A guided tour, one step at a time.

**Identify.** Every message carries an RFC 4122 v1 UUID: a random 6-byte
ProducerID, the producer's Clock (timestamp and counter) and Flags::

    >>> from message import Clock, Flags, build_uuid, get_clock, new_producer_id
    >>> producer, clock = new_producer_id(), Clock()
    >>> clock.update()                       # to the wall clock; never backwards
    >>> u = build_uuid(producer, clock.tick(), Flags.OUTSIDE_TXN)
    >>> get_clock(u) == clock.value
    True

**Map.** A mapping picks the journal (partition) of a message by its key::

    >>> from journal import JournalSpec
    >>> parts = [JournalSpec(f"clicks/part-{i}", {"content-type": "application/x-ndjson"})
    ...          for i in range(4)]
    >>> from message import rendezvous_mapping
    >>> mapping = rendezvous_mapping(lambda doc: doc["session"], lambda: parts)
    >>> mapping({"session": "s-1"})[0] in {p.name for p in parts}
    True

**Publish** with a ``Publisher``: ``publish_committed`` for messages readable
at once, ``publish_uncommitted`` then ``build_ack_intents`` for transactions.

**Read uncommitted** with ``ReadUncommittedIter``: every frame, duplicates and
unacknowledged transactions included.

**Sequence.** A :class:`Sequencer` turns read-uncommitted envelopes into
committed ones: it drops duplicates, holds transactions until their ACK and
drops rolled-back ones::

    seq = Sequencer(buffer=4096)
    for env in uncommitted:
        seq.queue_uncommitted(env)
        while True:
            try:
                committed = seq.deque_committed()
            except MustStartReplay:
                begin, end = seq.replay_range()
                seq.start_replay(read_uncommitted(journal, begin, end))
                continue
            if committed is None:
                break
            handle(committed)

**Read committed** with ``ReadCommittedIter``, which does all of the above.

**Checkpoint.** ``Sequencer.producer_states()`` and the read offsets make a
:class:`Checkpoint`; a reader restored from it resumes with nothing lost and
nothing repeated. ``Checkpoint.to_bytes()`` is wire-compatible with Gazette's
consumer checkpoint.
"""

from ._checkpoint import Checkpoint as Checkpoint
from ._core import IMPLEMENTATION as IMPLEMENTATION
from ._core import Publisher as Publisher
from ._core import Sequencer as Sequencer
from ._envelope import Envelope as Envelope
from ._envelope import JournalProducer as JournalProducer
from ._envelope import ProducerState as ProducerState
from ._errors import CheckpointError as CheckpointError
from ._errors import EmptyPartitionsError as EmptyPartitionsError
from ._errors import MessageError as MessageError
from ._errors import MustStartReplay as MustStartReplay
from ._errors import ReplayError as ReplayError
from ._interfaces import MappingFunc as MappingFunc
from ._interfaces import MappingKeyFunc as MappingKeyFunc
from ._interfaces import Message as Message
from ._interfaces import NewMessageFunc as NewMessageFunc
from ._interfaces import PartitionsFunc as PartitionsFunc
from ._mapping import fnv1a_32 as fnv1a_32
from ._mapping import mmh3_32 as mmh3_32
from ._mapping import modulo_mapping as modulo_mapping
from ._mapping import random_mapping as random_mapping
from ._mapping import rendezvous_mapping as rendezvous_mapping
from ._publisher import AckIntent as AckIntent
from ._reader import ReadCommittedIter as ReadCommittedIter
from ._reader import ReadUncommittedIter as ReadUncommittedIter
from ._transaction import IntentLog as IntentLog
from ._transaction import IntentLogError as IntentLogError
from ._transaction import JournalIntentLog as JournalIntentLog
from ._transaction import Transaction as Transaction
from ._transaction import write_intents as write_intents
from ._types import NIL_UUID as NIL_UUID
from ._types import CSVRecord as CSVRecord
from ._types import DataclassMessage as DataclassMessage
from ._types import JsonDocument as JsonDocument
from ._types import ProtoMessage as ProtoMessage
from ._types import document_type as document_type
from ._types import proto_message_type as proto_message_type
from ._types import sortable_uuid as sortable_uuid
from ._uuid import Clock as Clock
from ._uuid import Flags as Flags
from ._uuid import build_uuid as build_uuid
from ._uuid import clock_to_unix_ns as clock_to_unix_ns
from ._uuid import get_clock as get_clock
from ._uuid import get_flags as get_flags
from ._uuid import get_producer_id as get_producer_id
from ._uuid import new_clock as new_clock
from ._uuid import new_producer_id as new_producer_id

__all__ = [
    # identifiers
    "Clock", "Flags", "build_uuid", "clock_to_unix_ns", "get_clock", "get_flags",
    "get_producer_id", "new_clock", "new_producer_id",
    # messages and envelopes
    "Message", "Envelope", "JournalProducer", "ProducerState", "NewMessageFunc",
    "NIL_UUID", "JsonDocument", "document_type", "DataclassMessage", "CSVRecord",
    "ProtoMessage", "proto_message_type", "sortable_uuid",
    # publishing
    "Publisher", "AckIntent", "Transaction", "IntentLog", "JournalIntentLog", "write_intents",
    # reading, sequencing and checkpoints
    "ReadUncommittedIter", "ReadCommittedIter", "Sequencer", "Checkpoint",
    # mapping
    "MappingFunc", "MappingKeyFunc", "PartitionsFunc", "modulo_mapping",
    "rendezvous_mapping", "random_mapping", "fnv1a_32", "mmh3_32",
    # errors
    "MessageError", "MustStartReplay", "ReplayError", "EmptyPartitionsError",
    "CheckpointError", "IntentLogError",
    # which implementation runs
    "IMPLEMENTATION",
]
