"""The contracts of the ``message`` package, apart from their implementations.

A message type implements :class:`Message`. Framings ask more of it (see the
``framing`` package): ``marshal_json``/``unmarshal_json`` or a dict or a
dataclass for NDJSON, ``marshal_csv``/``unmarshal_csv`` for CSV, and
``SerializeToString``/``ParseFromString`` for fixed-header protobuf. The
ready-made types of :mod:`message._types` do all of this already.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    from journal import JournalSpec


@runtime_checkable
class Message(Protocol):
    """A user message that carries the UUID the Publisher gives it.

    A type that cannot carry a UUID returns the nil UUID from ``get_uuid`` and
    ignores ``set_uuid``: it opts out of exactly-once, to at-least-once.
    A message with a ``validate()`` method is validated before publishing.
    """

    def get_uuid(self) -> uuid.UUID:
        """The UUID last set on the message (the nil UUID if none)."""
        ...

    def set_uuid(self, u: uuid.UUID) -> None:
        """Remember the UUID that the Publisher assigned."""
        ...

    def new_acknowledgement(self, journal: str) -> Message:
        """A new message of this type that will acknowledge a transaction's
        messages in ``journal``. Its UUID is set by the Publisher."""
        ...


#: ``mapping(msg) -> (journal name, content type)``.
MappingFunc: TypeAlias = Callable[[object], tuple[str, str]]
#: ``key(msg) -> bytes | str``: the stable key a message is mapped on.
MappingKeyFunc: TypeAlias = Callable[[object], "bytes | str"]
#: ``partitions() -> journals``: the current partitions of a topic.
PartitionsFunc: TypeAlias = Callable[[], "Sequence[JournalSpec]"]
#: ``new_message(spec) -> Message``: an empty message to decode a frame into.
NewMessageFunc: TypeAlias = Callable[["JournalSpec"], Message]
