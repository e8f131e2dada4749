"""Reading past damaged pieces of a journal (``skip_corrupt`` of the read iterators).

A journal client reports a damaged piece of a journal — a fragment whose
bytes do not match its name, a missing fragment, an open fragment cut short
— as a ``CorruptJournalError`` whose ``[offset, end_offset)`` say where it
lies. With ``skip_corrupt``, the iterators go on with a new reader at
``end_offset``: fragments hold whole appends, so the bytes after the damage
begin with a whole frame, and offsets jump there as they do over what
retention removed.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING

from journal import CorruptJournalError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    from journal import JournalClient, JournalReader

#: ``on_damage(error, begin, end)``: told that ``[begin, end)`` is skipped; raises to stop.
OnDamage = Callable[[CorruptJournalError, int, int], None]


class DamageSkippingReader(io.RawIOBase):
    """A journal reader that reads on past damaged pieces of the journal.

    On a ``CorruptJournalError`` with offsets it calls ``on_damage``, closes
    its reader and opens another at the error's ``end_offset``. ``offset``
    is the journal offset of the next byte, as for any ``JournalReader``."""

    def __init__(
        self,
        client: JournalClient,
        reader: JournalReader,
        end_offset: int | None,
        block: bool,
        on_damage: OnDamage,
    ) -> None:
        super().__init__()
        self._client = client
        self._reader = reader
        self._end_offset = end_offset
        self._block = block
        self._on_damage = on_damage
        self._ended_at: int | None = None  # the damage reached end_offset

    @property
    def journal(self) -> str:
        return self._reader.journal

    @property
    def offset(self) -> int:
        return self._reader.offset if self._ended_at is None else self._ended_at

    @property
    def end_offset(self) -> int | None:
        return self._end_offset

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.offset

    def read(self, size: int = -1, /) -> bytes:
        while self._ended_at is None:
            try:
                return self._reader.read(size)
            except CorruptJournalError as exc:
                self._skip(exc)
        return b""

    def read1(self, size: int = -1, /) -> bytes:
        while self._ended_at is None:
            try:
                return self._reader.read1(size)
            except CorruptJournalError as exc:
                self._skip(exc)
        return b""

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        while self._ended_at is None:
            try:
                return self._reader.readinto(buffer)
            except CorruptJournalError as exc:
                self._skip(exc)
        return 0

    def _skip(self, exc: CorruptJournalError) -> None:
        here = self._reader.offset
        if exc.offset is None or exc.end_offset is None or exc.end_offset <= here:
            raise exc  # Damage with no known end: nothing to read past.
        self._on_damage(exc, here, exc.end_offset)
        self._reader.close()
        if self._end_offset is not None and exc.end_offset >= self._end_offset:
            self._ended_at = self._end_offset
            return
        self._reader = self._client.read(
            self._reader.journal, exc.end_offset, self._end_offset, block=self._block
        )

    def close(self) -> None:
        self._reader.close()
        super().close()
