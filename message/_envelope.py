"""Value types: Envelope, JournalProducer and ProducerState."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from journal import JournalSpec

    from ._interfaces import Message


@dataclass(slots=True)
class Envelope:
    """A message with where it was read: ``[begin, end)`` are the byte offsets
    of its frame in ``journal``."""

    journal: JournalSpec
    begin: int
    end: int
    message: Message


class JournalProducer(NamedTuple):
    """A producer of one journal."""

    journal: str
    producer: bytes


@dataclass(slots=True)
class ProducerState:
    """What a Sequencer knows of a producer of a journal, as checkpointed.

    ``last_ack`` is the Clock of the producer's last ACK_TXN or OUTSIDE_TXN;
    ``begin`` the offset of the first CONTINUE_TXN after it (the start of the
    open transaction, from which a resumed reader must replay), or -1.
    """

    journal: str
    producer: bytes
    last_ack: int
    begin: int
