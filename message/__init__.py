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
at once; ``publish_uncommitted``, then ``build_ack_intents`` appended, for a
transaction (``Transaction`` does both, with the intents kept durable first;
``TransactionPipeline`` commits each in the background while the next publishes).
A store is a ``JournalClient``; here, the embedded one in a directory::

    >>> import tempfile
    >>> from journal import LocalJournalStore
    >>> from message import JsonDocument, Publisher, modulo_mapping
    >>> store = LocalJournalStore(tempfile.mkdtemp())
    >>> _ = store.create("clicks/part-0", {"content-type": "application/x-ndjson"})
    >>> to_part = modulo_mapping(lambda doc: doc["session"],
    ...                          lambda: store.list("name=clicks/part-0"))
    >>> pub = Publisher(store)
    >>> pub.publish_committed(to_part, JsonDocument(session="s-1", page="/")).result().begin
    0
    >>> _ = pub.publish_uncommitted(to_part, JsonDocument(session="s-1", page="/cart"))
    >>> _ = pub.publish_uncommitted(to_part, JsonDocument(session="s-2", page="/buy"))
    >>> for intent in pub.build_ack_intents():      # commits the two above
    ...     _ = store.append(intent.journal, intent.intent).result()

**Read uncommitted** with ``ReadUncommittedIter``: every frame as an
``Envelope`` (journal, offsets, message), duplicates and unacknowledged
transactions included, the ACK too::

    >>> from message import Flags, ReadUncommittedIter, get_flags
    >>> new_doc = lambda spec: JsonDocument()
    >>> with ReadUncommittedIter(store, "clicks/part-0", new_doc) as it:
    ...     [Flags(get_flags(env.message.get_uuid())).name for env in it]
    ['OUTSIDE_TXN', 'CONTINUE_TXN', 'CONTINUE_TXN', 'ACK_TXN']

**Sequence.** A :class:`Sequencer` turns read-uncommitted envelopes into
committed ones: it drops duplicates, holds transactions until their ACK and
drops rolled-back ones. A frame appended twice (a retried append) is
delivered once::

    >>> from message import MustStartReplay, Sequencer
    >>> with ReadUncommittedIter(store, "clicks/part-0", new_doc) as it:
    ...     uncommitted = list(it)
    >>> seq, committed = Sequencer(buffer=4096), []
    >>> for env in uncommitted + uncommitted[:1]:        # the first one, again
    ...     _ = seq.queue_uncommitted(env)
    ...     while (out := seq.deque_committed()) is not None:
    ...         committed.append(out.message.get("page"))
    >>> committed
    ['/', '/cart', '/buy', None]

(``None`` is the ACK's page: the ACK is delivered too, as in Gazette. A
Sequencer whose ring no longer holds a transaction's first messages raises
``MustStartReplay`` from ``deque_committed``: read
``seq.replay_range()`` again and pass it to ``seq.start_replay``;
``sequence_committed`` is this loop, replays included.)

**Read committed** with ``ReadCommittedIter``, which does all of the above,
replays included::

    >>> from message import ReadCommittedIter
    >>> with ReadCommittedIter(store, "clicks/part-0", new_doc) as it:
    ...     [env.message["page"] for env in it if "page" in env.message]
    ['/', '/cart', '/buy']

**Checkpoint.** ``ReadCommittedIter.checkpoint()`` (read offsets and the
producers' states) may be taken between any two messages; a reader made
with it resumes with nothing lost and nothing repeated.
``Checkpoint.to_bytes()`` is wire-compatible with Gazette's consumer
checkpoint::

    >>> from message import Checkpoint
    >>> with ReadCommittedIter(store, "clicks/part-0", new_doc) as it:
    ...     first = next(it).message["page"]
    ...     saved = it.checkpoint().to_bytes()
    >>> resumed = ReadCommittedIter(store, "clicks/part-0", new_doc,
    ...                             checkpoint=Checkpoint.from_bytes(saved))
    >>> [first] + [env.message["page"] for env in resumed if "page" in env.message]
    ['/', '/cart', '/buy']
    >>> resumed.close(); store.close()
"""

from typing import TYPE_CHECKING

from ._checkpoint import Checkpoint as Checkpoint
from ._core import IMPLEMENTATION as IMPLEMENTATION
from ._envelope import TRANSIENT_OFFSET as TRANSIENT_OFFSET
from ._envelope import Envelope as Envelope
from ._envelope import JournalProducer as JournalProducer
from ._envelope import ProducerState as ProducerState
from ._errors import CheckpointError as CheckpointError
from ._errors import EmptyPartitionsError as EmptyPartitionsError
from ._errors import IntentLogError as IntentLogError
from ._errors import MessageError as MessageError
from ._errors import MustStartReplay as MustStartReplay
from ._errors import ReplayError as ReplayError
from ._errors import TransactionAbortedError as TransactionAbortedError
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
from ._reader import published_at as published_at
from ._reader import sequence_committed as sequence_committed
from ._selector import ReadCommittedSelectorIter as ReadCommittedSelectorIter
from ._sources import CommittedSource as CommittedSource
from ._transaction import IntentLog as IntentLog
from ._transaction import JournalIntentLog as JournalIntentLog
from ._transaction import Transaction as Transaction
from ._transaction import write_intents as write_intents
from ._txn_pipeline import PipelinedTransaction as PipelinedTransaction
from ._txn_pipeline import TransactionPipeline as TransactionPipeline
from ._types import DEFAULT_UUID_PATH as DEFAULT_UUID_PATH
from ._types import NIL_UUID as NIL_UUID
from ._types import CSVRecord as CSVRecord
from ._types import DataclassMessage as DataclassMessage
from ._types import JsonDocument as JsonDocument
from ._types import ProtoMessage as ProtoMessage
from ._types import document_type as document_type
from ._types import proto_message_type as proto_message_type
from ._types import sortable_uuid as sortable_uuid
from ._types import uuid_path_of as uuid_path_of
from ._uuid import Clock as Clock
from ._uuid import Flags as Flags
from ._uuid import build_uuid as build_uuid
from ._uuid import clock_to_unix_ns as clock_to_unix_ns
from ._uuid import get_clock as get_clock
from ._uuid import get_flags as get_flags
from ._uuid import get_producer_id as get_producer_id
from ._uuid import new_clock as new_clock
from ._uuid import new_producer_id as new_producer_id

if TYPE_CHECKING:
    # Type checkers see the definitions (the readable implementation, whose
    # methods the native one shares) and can use them as types.
    from ._publisher import Publisher as Publisher
    from ._sequencer import Sequencer as Sequencer
else:
    from ._core import Publisher, Sequencer

__all__ = [
    # identifiers
    "Clock", "Flags", "build_uuid", "clock_to_unix_ns", "get_clock", "get_flags",
    "get_producer_id", "new_clock", "new_producer_id",
    # messages and envelopes
    "Message", "Envelope", "TRANSIENT_OFFSET", "JournalProducer", "ProducerState", "NewMessageFunc",
    "NIL_UUID", "JsonDocument", "document_type", "DataclassMessage", "CSVRecord",
    "ProtoMessage", "proto_message_type", "sortable_uuid", "DEFAULT_UUID_PATH", "uuid_path_of",
    # publishing
    "Publisher", "AckIntent", "Transaction", "TransactionPipeline", "PipelinedTransaction",
    "IntentLog", "JournalIntentLog", "write_intents",
    # reading, sequencing and checkpoints
    "ReadUncommittedIter", "ReadCommittedIter", "ReadCommittedSelectorIter", "CommittedSource",
    "published_at", "sequence_committed",
    "Sequencer", "Checkpoint",
    # mapping
    "MappingFunc", "MappingKeyFunc", "PartitionsFunc", "modulo_mapping",
    "rendezvous_mapping", "random_mapping", "fnv1a_32", "mmh3_32",
    # errors
    "MessageError", "MustStartReplay", "ReplayError", "EmptyPartitionsError",
    "CheckpointError", "IntentLogError", "TransactionAbortedError",
    # which implementation runs
    "IMPLEMENTATION",
]
