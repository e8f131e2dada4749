"""Value types: Envelope, JournalProducer and ProducerState."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from journal import JournalSpec

    from ._interfaces import Message


#: The ``begin`` and ``end`` of a transient envelope (an emit, never
#: stored): no stored frame has a negative offset.
TRANSIENT_OFFSET: Final = -1


@dataclass(slots=True)
class Envelope:
    """A message with where it was read: ``[begin, end)`` are the byte offsets
    of its frame in ``journal`` (both ``TRANSIENT_OFFSET`` for a transient
    message, which was emitted to live followers and never stored)."""

    journal: JournalSpec
    begin: int
    end: int
    message: Message

    @property
    def transient(self) -> bool:
        """Whether this is a transient message (see ``Publisher.emit``)."""
        return self.begin < 0


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
