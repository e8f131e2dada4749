"""The contracts of the ``journal`` package, apart from their implementations.

``JournalClient`` is what the rest of the library (``message``, ``pipeline``)
codes against::

    with LocalJournalStore("/var/lib/journals") as client:   # or MemoryJournalClient()
        client.create("events/part-000", {"content-type": "application/x-ndjson"})
        fut = client.append("events/part-000", b'{"n": 1}\\n')
        fut.result()                      # AppendResult(journal, begin, end), durable
        with client.read("events/part-000", offset=0) as r:
            data = r.read()               # everything committed so far

``JournalStore`` adds administration (create, delete, head, trim) that both
shipped implementations offer; ``journal.testing`` checks both against it.

``JournalReader`` is a readable binary stream positioned at a journal
offset. ``read(n)`` returns as soon as at least one byte is available (up to
``n``) and returns ``b""`` only at the end: ``end_offset`` reached, or, for a
non-blocking reader, the journal's committed end at the time of the call. A
blocking reader (``block=True``) instead waits for further appends until
``end_offset``, or until it or its client is closed.
"""

from __future__ import annotations

import builtins
from concurrent.futures import Future
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from ._labels import LabelSelector, LabelSet, LabelsInit
from ._spec import AppendResult, JournalSpec

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


@runtime_checkable
class JournalReader(Protocol):
    """A readable binary stream over one journal (see the module docstring)."""

    @property
    def journal(self) -> str:
        """The journal's name."""
        ...

    @property
    def offset(self) -> int:
        """Journal offset of the next byte ``read`` will return. It jumps
        forward if the bytes at the old offset were removed by retention."""
        ...

    @property
    def end_offset(self) -> int | None:
        """The offset at which reading ends, or None for no bound."""
        ...

    @property
    def closed(self) -> bool: ...

    def read(self, size: int = -1, /) -> bytes:
        """At least one and at most ``size`` bytes, or ``b""`` at the end."""
        ...

    def read1(self, size: int = -1, /) -> bytes:
        """As ``read``, never more than one underlying read."""
        ...

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        """As ``read``, into ``buffer``; returns the count (0 at the end)."""
        ...

    def readable(self) -> bool: ...

    def close(self) -> None:
        """Release the reader; a ``read`` blocked in another thread returns ``b""``."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class JournalClient(Protocol):
    """Lists, reads and appends to journals (see docs/journal-store.md and docs/gazette.md)."""

    def list(self, selector: str | LabelSelector = "") -> builtins.list[JournalSpec]:
        """Specs of the journals matching ``selector``, sorted by name. The
        meta-labels ``name`` and ``prefix`` match on the journal name."""
        ...

    def get(self, name: str) -> JournalSpec:
        """The journal's spec; raises ``JournalNotFoundError``."""
        ...

    def append(self, name: str, data: bytes) -> Future[AppendResult]:
        """Append ``data`` atomically and contiguously, after every earlier
        append of this client to the journal. The future resolves once the
        bytes are durable. Bad input raises at once and changes nothing."""
        ...

    def read(
        self, name: str, offset: int = 0, end_offset: int | None = None, *, block: bool = False
    ) -> JournalReader:
        """A reader of ``[offset, end_offset)``; ``offset=-1`` means the
        current committed end (to follow new appends only)."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every append issued so far is resolved; raise
        ``TimeoutError`` on timeout, ``JournalError`` if any of them failed."""
        ...

    def close(self) -> None:
        """Flush, then release everything. Appends after close raise
        ``JournalClosedError``."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class JournalStore(JournalClient, Protocol):
    """A ``JournalClient`` that also administers its journals."""

    def create(self, name: str, labels: LabelSet | LabelsInit | None = None) -> JournalSpec:
        """Create a journal; idempotent for identical labels, else
        ``JournalExistsError``. Invalid names or labels raise ``ValueError``s."""
        ...

    def delete(self, name: str) -> None:
        """Remove a journal and all its content; ``JournalNotFoundError`` if absent."""
        ...

    def head(self, name: str) -> int:
        """The journal's committed end offset (the offset of the next append)."""
        ...

    def offset_since(self, name: str, when: float | datetime) -> int:
        """An offset from which a replay sees everything appended since
        ``when`` (epoch seconds or a datetime), possibly a little more."""
        ...

    def trim(
        self,
        name: str,
        *,
        before_offset: int | None = None,
        older_than: float | timedelta | None = None,
    ) -> int:
        """Retention: remove whole stored pieces (fragments) from the start of
        the journal that end at or before ``before_offset`` and/or were last
        written more than ``older_than`` (seconds) ago. Returns the first
        offset still readable."""
        ...
