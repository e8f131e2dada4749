"""The reader logic shared by every journal client: offsets, bounds, blocking, close.

A concrete reader supplies four hooks: ``_fill`` copies committed bytes at
the current offset, ``_token``/``_wait`` wait for the journal to change
without losing a wake-up, and ``_release`` frees its resources.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

LOG: Final = logging.getLogger("journal")

# read1() with no size reads at most this much: one fragment-file read.
_READ1_DEFAULT: Final = 64 * 1024
# _fill's answer when it moved the offset forward over removed bytes.
JUMPED: Final = -1


class JournalStream(io.RawIOBase):
    """What every journal reader is as a stream (``JournalReader``): a raw
    binary stream of one journal from ``offset`` (the journal offset of the
    next byte; ``tell()`` too) to ``end_offset``, following new appends if
    ``block``. How the bytes come is the subclass's: ``ReaderBase`` fills
    buffers from a client's storage, ``GazetteReader`` takes a broker's
    stream."""

    def __init__(self, journal: str, offset: int, end_offset: int | None, block: bool) -> None:
        super().__init__()
        self._journal = journal
        self._offset = offset
        self._end_offset = end_offset
        self._block = block

    @property
    def journal(self) -> str:
        return self._journal

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def end_offset(self) -> int | None:
        return self._end_offset

    @property
    def block(self) -> bool:
        return self._block

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        self._check_open()
        return self._offset

    def read1(self, size: int = -1, /) -> bytes:
        return self.read(size if size >= 0 else _READ1_DEFAULT)

    def readinto1(self, buffer: WriteableBuffer, /) -> int:
        return self.readinto(buffer)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"I/O operation on a closed reader of {self._journal!r}")

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} journal={self._journal!r} offset={self._offset}"
            f" end_offset={self._end_offset} block={self._block}>"
        )


class ReaderBase(JournalStream):
    """A raw binary stream positioned at a journal offset.

    ``tell()`` and ``offset`` give the journal offset of the next byte;
    ``seek`` moves to another journal offset (``SEEK_END`` is relative to the
    committed end). Wrapping in ``io.BufferedReader`` keeps ``tell()``
    meaningful, so framing code can compute frame offsets.
    """

    def __init__(self, journal: str, offset: int, end_offset: int | None, block: bool) -> None:
        super().__init__(journal, offset, end_offset, block)
        # A close() from another thread must not free what a read is using:
        # the last reader out releases instead.
        self._state_lock = threading.Lock()
        self._busy = 0
        self._closing = False
        self._released = False

    # Hooks ---------------------------------------------------------------

    def _fill(self, buf: memoryview) -> int:
        """Copy committed bytes at ``self._offset`` into ``buf`` (non-empty).

        Return the count, 0 if no byte is committed at the offset yet, or
        ``JUMPED`` after moving ``self._offset`` past removed bytes."""
        raise NotImplementedError

    def _token(self) -> int:
        """A change counter of the journal, read before looking for data."""
        raise NotImplementedError

    def _wait(self, token: int) -> bool:
        """Block until the journal may have changed since ``token`` (or a
        safety timeout). Return False if waiting is pointless (client closed)."""
        raise NotImplementedError

    def _head(self) -> int:
        """The committed end offset, for ``seek(..., SEEK_END)``."""
        raise NotImplementedError

    def _reposition(self) -> None:
        """Forget cached file positions after a seek."""

    def _wake(self) -> None:
        """Wake a read blocked in ``_wait`` (called by close)."""

    def _yield_to_transient(self) -> bool:
        """Whether a read with nothing to return should return (0 bytes)
        instead of waiting, to let transient messages be handed out."""
        return False

    def _release(self) -> None:
        """Free files and subscriptions; called once."""

    # Public API ----------------------------------------------------------

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET, /) -> int:
        self._check_open()
        if whence == io.SEEK_SET:
            target = pos
        elif whence == io.SEEK_CUR:
            target = self._offset + pos
        elif whence == io.SEEK_END:
            target = self._head() + pos
        else:
            raise ValueError(f"invalid whence ({whence})")
        if target < 0:
            raise ValueError(f"negative journal offset ({target})")
        self._offset = target
        self._reposition()
        return target

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        self._check_open()
        with self._state_lock:
            if self._closing:
                return 0
            self._busy += 1
        try:
            return self._readinto(buffer)
        finally:
            with self._state_lock:
                self._busy -= 1
                release = self._closing and self._busy == 0 and not self._released
                self._released = self._released or release
            if release:
                self._release()

    def _readinto(self, buffer: WriteableBuffer) -> int:
        with memoryview(buffer) as view, view.cast("B") as mv:
            if len(mv) == 0:
                return 0
            while not self._closing:
                limit = len(mv)
                if self._end_offset is not None:
                    limit = min(limit, self._end_offset - self._offset)
                    if limit <= 0:
                        return 0
                if self._yield_to_transient():
                    # An emit that follows only bytes already read goes first.
                    return 0
                token = self._token()
                n = self._fill(mv[:limit])
                if n > 0:
                    self._offset += n
                    return n
                if n == JUMPED:
                    continue
                if not self._block or self._yield_to_transient() or not self._wait(token):
                    return 0
            return 0

    def read(self, size: int = -1, /) -> bytes:
        data = super().read(size)
        # RawIOBase.read returns None only for non-blocking files, never here.
        return data if data is not None else b""

    def close(self) -> None:
        if self.closed:
            return
        with self._state_lock:
            self._closing = True
            release = self._busy == 0 and not self._released
            self._released = self._released or release
        self._wake()
        if release:
            self._release()
        super().close()



def warn_jump(journal: str, old: int, new: int) -> None:
    """Log that a reader skipped removed bytes ``[old, new)``."""
    LOG.warning(
        "journal %s: offsets [%d, %d) are no longer available (removed by retention);"
        " continuing at offset %d",
        journal,
        old,
        new,
        new,
    )


def warn_quarantined(journal: str, old: int, new: int, quarantined: Sequence[Any]) -> None:
    """Log that a reader skipped damaged bytes ``[old, new)``, which are in quarantine."""
    files = ", ".join(q.path for q in quarantined if q.begin < new and q.end > old)
    LOG.warning(
        "journal %s: offsets [%d, %d) were damaged and are in quarantine (%s);"
        " continuing at offset %d",
        journal,
        old,
        new,
        files,
        new,
    )
