"""Fragments and the commit record: the pure (I/O-free) half of the local store.

A journal's content is a sequence of fragments, each holding the bytes
``[begin, end)``. A sealed fragment is named the way Gazette names persisted
fragments, ``%016x-%016x-%x.raw`` (begin, end, SHA-1 of the content; ``.raw``
is Gazette's extension for uncompressed content). The fragment still being
written is ``@open-%016x`` (its begin); ``@`` is outside the journal-name
alphabet, so no journal directory can collide with it.

The commit record (file ``@commit``) says which bytes are committed. It holds
two 32-byte slots, written alternately, so that a torn slot never hides the
other one::

    offset  size  field
    0       4     magic  b"EXJC"
    4       8     seq    u64 LE, +1 per commit; slot = seq % 2
    12      8     begin  u64 LE, first offset of the open fragment
    20      8     end    u64 LE, committed end of the journal
    28      4     crc    u32 LE, CRC-32 of bytes 0..28

The valid slot with the larger ``seq`` wins. Bytes of the open fragment past
``end - begin`` are not committed and are never read.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from typing import Final, NamedTuple

#: Gazette's file extension of uncompressed fragments.
RAW_EXTENSION: Final = ".raw"
OPEN_PREFIX: Final = "@open-"
COMMIT_FILE: Final = "@commit"
SPEC_FILE: Final = "@spec.json"
LOCK_FILE: Final = "@lock"
TEMP_PREFIX: Final = "@tmp-"

RECORD_MAGIC: Final = b"EXJC"
# Precompiled: the record is read on every poll of a following reader.
_SLOT: Final = struct.Struct("<4sQQQ")
_CRC: Final = struct.Struct("<I")
SLOT_SIZE: Final = _SLOT.size + _CRC.size  # 32
RECORD_SIZE: Final = 2 * SLOT_SIZE

_SEALED_RE: Final = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})\.raw")
_OPEN_RE: Final = re.compile(r"@open-([0-9a-f]{16})")
# Any Gazette-style fragment name, whatever its codec: such a name is reserved
# inside a journal directory, so it cannot be a child journal's directory.
GAZETTE_FRAGMENT_RE: Final = re.compile(r"[0-9a-fA-F]+-[0-9a-fA-F]+-[0-9a-fA-F]+(\.[A-Za-z]*)?")


class CommitRecord(NamedTuple):
    """The decoded commit record: the open fragment begins at ``begin``, and
    the journal is committed through ``end``."""

    seq: int
    begin: int
    end: int


def pack_slot(record: CommitRecord) -> bytes:
    """One 32-byte slot for ``record``, to be written at ``slot_offset(record.seq)``."""
    head = _SLOT.pack(RECORD_MAGIC, record.seq, record.begin, record.end)
    return head + _CRC.pack(zlib.crc32(head))


def slot_offset(seq: int) -> int:
    return (seq % 2) * SLOT_SIZE


def parse_record(buf: bytes) -> CommitRecord | None:
    """The newest valid slot of a record file's bytes, or None if neither is valid."""
    best: CommitRecord | None = None
    for off in (0, SLOT_SIZE):
        slot = buf[off : off + SLOT_SIZE]
        if len(slot) < SLOT_SIZE:
            continue
        magic, seq, begin, end = _SLOT.unpack_from(slot)
        (crc,) = _CRC.unpack_from(slot, _SLOT.size)
        if magic != RECORD_MAGIC or crc != zlib.crc32(slot[: _SLOT.size]):
            continue
        if begin > end or slot_offset(seq) != off:
            continue
        if best is None or seq > best.seq:
            best = CommitRecord(seq, begin, end)
    return best


def sealed_name(begin: int, end: int, sha1: bytes) -> str:
    """Gazette's content name of a sealed, uncompressed fragment."""
    return f"{begin:016x}-{end:016x}-{sha1.hex()}{RAW_EXTENSION}"


def open_name(begin: int) -> str:
    return f"{OPEN_PREFIX}{begin:016x}"


def parse_sealed_name(name: str) -> tuple[int, int, bytes] | None:
    """``(begin, end, sha1)`` of a sealed fragment file name, or None."""
    m = _SEALED_RE.fullmatch(name)
    if m is None:
        return None
    return int(m[1], 16), int(m[2], 16), bytes.fromhex(m[3])


def parse_open_name(name: str) -> int | None:
    """The begin offset of an open fragment file name, or None."""
    m = _OPEN_RE.fullmatch(name)
    return int(m[1], 16) if m else None


@dataclass(frozen=True, slots=True)
class Fragment:
    """A contiguous piece ``[begin, end)`` of a journal and the file holding it.

    For a sealed fragment the file holds exactly those bytes and is named
    ``sealed_name(begin, end, sha1)``. For the open fragment (``sealed`` is
    False) only the first ``end - begin`` bytes of the file are committed;
    anything after them may be a write in progress and must not be read.
    ``mtime`` is the file's modification time (seconds since the epoch).
    """

    journal: str
    begin: int
    end: int
    path: str
    sealed: bool
    mtime: float
    sha1: bytes | None = None

    @property
    def size(self) -> int:
        """Number of committed content bytes."""
        return self.end - self.begin

    @property
    def content_name(self) -> str | None:
        """Gazette's content name of a sealed fragment; None for the open one."""
        if not self.sealed or self.sha1 is None:
            return None
        return sealed_name(self.begin, self.end, self.sha1)
