"""What readers of a journal share: the journal offsets of the bytes a
reader returned, across retention's jumps; reading one to its end."""

from __future__ import annotations

from collections import deque
from typing import Any

from ._interfaces import JournalReader


class OffsetTracker:
    """Wraps a ``JournalReader`` to map positions in the byte stream it
    returned to journal offsets.

    A reader's bytes are contiguous in the stream it returns, but not always
    in the journal: where retention removed what was asked for, the reader
    goes on from the first offset still held (and logs the jump). Position
    ``p`` of the stream is journal offset ``base_at(p) + p``.

    Appends are whole frames and fragments hold whole appends, so a jump
    always falls between two frames: every frame has one base.

    >>> import tempfile
    >>> from journal import LocalJournalStore, OffsetTracker
    >>> with tempfile.TemporaryDirectory() as root, LocalJournalStore(root) as store:
    ...     store.create("a/b")
    ...     _ = store.append("a/b", b"one\\ntwo\\n").result()
    ...     with store.read("a/b", offset=4) as r:
    ...         t = OffsetTracker(r)
    ...         data = t.read()
    ...         (data, t.base_at(0) + 0, t.pos)
    (b'two\\n', 4, 4)
    """

    __slots__ = ("_base", "_shift", "jumps", "pos", "reader", "start")

    def __init__(self, reader: JournalReader) -> None:
        self.reader = reader
        #: The journal offset of stream position 0.
        self.start: int = reader.offset
        #: Bytes returned so far: the stream position.
        self.pos = 0
        self._shift = self.start  # journal offset minus stream position, now
        #: The jumps ``base_at`` has not taken yet, as ``(position, base)``,
        #: oldest first (read it, do not change it): while it is empty, every
        #: frame's base is the last one ``base_at`` returned.
        self.jumps: deque[tuple[int, int]] = deque()
        self._base = self.start  # the shift of the frames being handed out

    def base_at(self, pos: int) -> int:
        """Journal offset minus stream position for the frame that begins at
        ``pos``. Ask for frames in order: the jumps up to ``pos`` are taken
        and forgotten."""
        jumps = self.jumps
        while jumps and jumps[0][0] <= pos:
            _, self._base = jumps.popleft()
        return self._base

    def read(self, n: int = -1) -> bytes:
        """The reader's next bytes (``JournalReader.read``)."""
        data = self.reader.read(n)
        self._advance(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        """The reader's next bytes, into ``buffer`` (``JournalReader.readinto``)."""
        n = self.reader.readinto(buffer) or 0
        self._advance(n)
        return n

    def _advance(self, n: int) -> None:
        # Where these bytes began in the journal, as the reader tells it.
        begin = self.reader.offset - n
        if begin != self._shift + self.pos:
            self._shift = begin - self.pos
            self.jumps.append((self.pos, self._shift))
        self.pos += n


def read_all(reader: JournalReader) -> bytes:
    """Everything ``reader`` has to give, to its end (one ``read`` returns at
    most what one piece holds: a Gazette broker sends about 32 KiB)."""
    parts = []
    while chunk := reader.read(1 << 20):
        parts.append(chunk)
    return b"".join(parts)
