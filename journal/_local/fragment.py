"""Fragments, the commit record and whole frames: the pure (I/O-free) half of the local store.

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

``frame_cut`` says how much of some bytes is whole frames of a journal's
framing: what an append, an emit or a repair may keep.
"""

from __future__ import annotations

import contextlib
import io
import re
import struct
import zlib
from typing import TYPE_CHECKING, Final, NamedTuple

from framing import FramingError, UnknownContentTypeError, framing_by_content_type

if TYPE_CHECKING:
    from .._spec import JournalSpec

OPEN_PREFIX: Final = "@open-"
COMMIT_FILE: Final = "@commit"
SPEC_FILE: Final = "@spec.json"
LOCK_FILE: Final = "@lock"
#: The journal's recorded start: the offset below which retention
#: (``trim``) removed everything. A fragment missing at or above it is lost,
#: not trimmed. Journals made before it existed have none.
START_FILE: Final = "@start"
#: A journal being deleted: its spec, renamed (the journal no longer exists
#: from then on) until its files are gone. What a deletion that crashed
#: half-way leaves beside it is removed by the next ``create``; files
#: found without a spec and without this mark are not leftovers of a
#: deletion, and are never removed for them.
DELETING_FILE: Final = "@deleting"
#: The files of a journal directory besides its fragments.
JOURNAL_FILES: Final = frozenset((SPEC_FILE, COMMIT_FILE, LOCK_FILE, START_FILE, DELETING_FILE))
#: ``@sums-%016x-%016x``: the batch checksums of the sealed fragment
#: ``[begin, end)`` (journal/_local/sums.py). The open fragment's follow its
#: commit record in ``@commit``.
SUMS_PREFIX: Final = "@sums-"

#: Damaged bytes are moved to files of this prefix, never deleted. A file
#: ``@quarantine-%016x-%016x-<kind>`` stands for journal offsets
#: ``[begin, end)``, which readers skip (with a warning): it holds what was
#: left of them, from ``begin`` on (possibly nothing, for bytes found
#: missing). Other ``@quarantine-<kind>-<name>`` files hold files that were
#: in the journal directory but stood for no offsets (foreign files, stray
#: open fragments).
QUARANTINE_PREFIX: Final = "@quarantine-"

RECORD_MAGIC: Final = b"EXJC"
# Precompiled: the record is read on every poll of a following reader.
_SLOT: Final = struct.Struct("<4sQQQ")
_CRC: Final = struct.Struct("<I")
SLOT_SIZE: Final = _SLOT.size + _CRC.size  # 32
RECORD_SIZE: Final = 2 * SLOT_SIZE

_SEALED_RE: Final = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})\.raw")
_OPEN_RE: Final = re.compile(r"@open-([0-9a-f]{16})")
_SUMS_RE: Final = re.compile(r"@sums-([0-9a-f]{16})-([0-9a-f]{16})")
_QUARANTINE_RE: Final = re.compile(r"@quarantine-([0-9a-f]{16})-([0-9a-f]{16})-([a-z]+)(?:-\d+)?")
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


def area_with(area: bytes, record: CommitRecord) -> bytes:
    """The record area ``area`` once ``record`` is written in its slot."""
    at = slot_offset(record.seq)
    return area[:at] + pack_slot(record) + area[at + SLOT_SIZE:]


def _parse_slot(slot: bytes, off: int) -> CommitRecord | None:
    if len(slot) < SLOT_SIZE:
        return None
    magic, seq, begin, end = _SLOT.unpack_from(slot)
    (crc,) = _CRC.unpack_from(slot, _SLOT.size)
    if magic != RECORD_MAGIC or crc != zlib.crc32(slot[: _SLOT.size]):
        return None
    if begin > end or slot_offset(seq) != off:
        return None
    return CommitRecord(seq, begin, end)


def parse_record(buf: bytes) -> CommitRecord | None:
    """The newest valid slot of a record file's bytes, or None if neither is valid."""
    best: CommitRecord | None = None
    for off in (0, SLOT_SIZE):
        rec = _parse_slot(buf[off : off + SLOT_SIZE], off)
        if rec is not None and (best is None or rec.seq > best.seq):
            best = rec
    return best


def damaged_slot(buf: bytes, rec: CommitRecord) -> bool:
    """Whether the slot that ``rec`` (the newest valid one) does not occupy is
    damaged in a way that may have hidden a newer record: it is not the
    zeroes of a record never written twice, nor a valid or recognisably
    older record. A slot whose seq field still reads one less than ``rec``'s
    was the older record: its damage hides nothing."""
    off = SLOT_SIZE - slot_offset(rec.seq)
    slot = buf[off : off + SLOT_SIZE]
    if len(slot) < SLOT_SIZE or not any(slot):
        return False
    other = _parse_slot(slot, off)
    if other is not None:
        return other.seq > rec.seq  # Cannot be: rec is the newest valid slot.
    magic, seq, _, _ = _SLOT.unpack_from(slot)
    return not (magic == RECORD_MAGIC and seq + 1 == rec.seq)


def open_name(begin: int) -> str:
    return f"{OPEN_PREFIX}{begin:016x}"


def parse_sealed_name(name: str) -> tuple[int, int, bytes] | None:
    """``(begin, end, sha1)`` of a sealed fragment file name, or None."""
    m = _SEALED_RE.fullmatch(name)
    if m is None:
        return None
    return int(m[1], 16), int(m[2], 16), bytes.fromhex(m[3])


def quarantine_name(begin: int, end: int, kind: str) -> str:
    """The name of a quarantine file standing for journal offsets ``[begin, end)``."""
    return f"{QUARANTINE_PREFIX}{begin:016x}-{end:016x}-{kind}"


def parse_quarantine_name(name: str) -> tuple[int, int, str] | None:
    """``(begin, end, kind)`` of a quarantine file standing for offsets, or None."""
    m = _QUARANTINE_RE.fullmatch(name)
    if m is None:
        return None
    return int(m[1], 16), int(m[2], 16), m[3]


def sums_name(begin: int, end: int) -> str:
    """The name of the file of batch checksums of the sealed fragment ``[begin, end)``."""
    return f"{SUMS_PREFIX}{begin:016x}-{end:016x}"


def parse_sums_name(name: str) -> tuple[int, int] | None:
    """``(begin, end)`` of a batch checksum file's name, or None."""
    m = _SUMS_RE.fullmatch(name)
    return (int(m[1], 16), int(m[2], 16)) if m else None


def parse_open_name(name: str) -> int | None:
    """The begin offset of an open fragment file name, or None."""
    m = _OPEN_RE.fullmatch(name)
    return int(m[1], 16) if m else None


def frame_cut(spec: JournalSpec | None, data: bytes) -> int:
    """The length of the longest prefix of ``data`` made of whole frames of
    the journal's framing (all of it when the framing is unknown: then any
    byte may end an append)."""
    try:
        f = framing_by_content_type((spec.content_type if spec else None) or "")
    except UnknownContentTypeError:
        return len(data)
    read_frames = getattr(f, "read_frames", None)
    if read_frames is None:
        return len(data)
    cut = 0
    with contextlib.suppress(FramingError):
        for _, end, _ in read_frames(io.BytesIO(data)):
            cut = end
    return cut
