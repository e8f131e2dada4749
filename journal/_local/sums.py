"""Batch checksums: how the local store finds bytes changed in place.

A sealed fragment's name carries the SHA-1 of its content, but the open
fragment has no such sum, and a SHA-1 says only *that* a fragment changed,
not where. So each batch of appends the writer commits gets an entry, with
the CRC-32C of its bytes (``google-crc32c``)::

    offset  size  field
    0       8     end     u64 LE, the journal offset just past the batch
    8       4     size    u32 LE, its length: the batch is [end - size, end)
    12      4     crc32c  u32 LE, CRC-32C of the batch's bytes
    16      4     check   u32 LE, CRC-32 of bytes 0..16 (a torn entry fails it)

The open fragment's entries live in ``@commit``, after the commit record:
the writer writes a batch's entry with the record that commits the batch,
and one ``fdatasync`` makes both durable. So that this sync writes one page
of the file, as it did before entries existed, the newest entries are kept
in the record's own page: bytes 64 to 4084 hold up to 201 of them, the
*recent* run; when it is full, the writer appends it, whole, to the *spilled*
runs from byte 4096 on, and starts the recent run again from byte 64 (one
extra page written every 201 commits). The open fragment's entries are the
spilled ones, then the recent ones that follow them. Sealing a fragment
writes its entries to ``@sums-<begin>-<end>`` before renaming the fragment.

Entries are read as runs: from the first, while each is valid, ends after
the one before and lies inside the fragment. Bytes that no entry covers (a
journal written before checksums existed, a power loss that kept a record
and lost its entry, an append of 4 GiB or more) are *unchecked*: never
reported as damage, never a reason to refuse a read. Entries of an older
fragment (left by a crash just after a seal), or recent ones already spilled,
end at or before where the run they would continue begins: they end it.

Everything here is pure or works on file descriptors; ``journal/_local/files.py``
owns the files themselves.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Final, NamedTuple

import google_crc32c

_ENTRY: Final = struct.Struct("<QII")
_CHECK: Final = struct.Struct("<I")
ENTRY_SIZE: Final = _ENTRY.size + _CHECK.size  # 20
#: The spilled runs begin here, after the page of the commit record and of
#: the recent run.
SPILL_AT: Final = 4096
#: Batches at least this long get no entry (their size does not fit).
MAX_BATCH: Final = 1 << 32
# Batches are read back in pieces of this size: small enough for the
# allocator to reuse the memory (4 MiB pieces, each fresh from mmap, made
# checking an 8 MiB batch six times slower).
_CHUNK: Final = 1 << 16


class Batch(NamedTuple):
    """The journal offsets ``[begin, end)`` of one committed batch, and the
    CRC-32C of its bytes."""

    begin: int
    end: int
    crc: int


def crc32c(data: bytes) -> int:
    return int(google_crc32c.value(data))


def pack_entry(end: int, size: int, crc: int) -> bytes:
    head = _ENTRY.pack(end, size, crc)
    return head + _CHECK.pack(zlib.crc32(head))


def entry_for(end: int, data: bytes) -> bytes:
    """The entry of a batch ``data`` that ends at journal offset ``end``
    (nothing for one too long to have an entry)."""
    return pack_entry(end, len(data), crc32c(data)) if 0 < len(data) < MAX_BATCH else b""


def pack_batches(batches: list[Batch]) -> bytes:
    return b"".join(pack_entry(b.end, b.end - b.begin, b.crc) for b in batches)


def parse_batches(buf: bytes, begin: int, end: int) -> list[Batch]:
    """The run of valid entries at the start of ``buf`` that lie inside
    ``[begin, end)``, each after the one before (see the module docstring)."""
    out: list[Batch] = []
    at = begin
    for pos in range(0, len(buf) - ENTRY_SIZE + 1, ENTRY_SIZE):
        b_end, size, crc = _ENTRY.unpack_from(buf, pos)
        (check,) = _CHECK.unpack_from(buf, pos + _ENTRY.size)
        if check != zlib.crc32(buf[pos : pos + _ENTRY.size]):
            break
        b_begin = b_end - size
        if size == 0 or b_begin < at or b_end > end:
            break
        out.append(Batch(b_begin, b_end, crc))
        at = b_end
    return out


def _runs(buf: bytes, record_size: int, begin: int, end: int) -> tuple[list[Batch], list[Batch]]:
    spilled = parse_batches(buf[SPILL_AT:], begin, end)
    at = spilled[-1].end if spilled else begin
    return spilled, parse_batches(buf[record_size:SPILL_AT], at, end)


def read_log(commit_fd: int, record_size: int, begin: int, end: int) -> list[Batch]:
    """The open fragment's entries, from the commit record file (whose record
    is ``record_size`` bytes), for a fragment holding ``[begin, end)``."""
    size = os.fstat(commit_fd).st_size
    if size <= record_size:
        return []
    return log_batches(os.pread(commit_fd, size, 0), record_size, begin, end)


def log_batches(buf: bytes, record_size: int, begin: int, end: int) -> list[Batch]:
    """The open fragment's entries in ``buf``, the commit record file's bytes."""
    spilled, recent = _runs(buf, record_size, begin, end)
    return spilled + recent


class OpenLog:
    """The writer's hold on the open fragment's entries (see the module
    docstring): where the next one goes. Made by ``settle``; the caller
    holds the journal's lock."""

    def __init__(self, fd: int, record_size: int, recent: list[bytes], spill_at: int) -> None:
        self._fd = fd
        self._record_size = record_size
        self._room = (SPILL_AT - record_size) // ENTRY_SIZE
        self._recent = recent
        self._spill_at = spill_at

    @classmethod
    def settle(cls, fd: int, record_size: int, begin: int, end: int) -> OpenLog:
        """Take the commit record file's entries as those of the open fragment
        ``[begin, end)``: spilled runs past them (an older fragment's, a torn
        one) are cut; in the recent area, what follows the recent run ends
        any run (see the module docstring) and is written over in turn. The
        page is filled out with zeroes the first time, so that the file's
        size stays put while the recent run grows."""
        size = os.fstat(fd).st_size
        spilled, recent = _runs(os.pread(fd, size, 0), record_size, begin, end)
        spill_at = SPILL_AT + ENTRY_SIZE * len(spilled)
        if size > spill_at:
            os.ftruncate(fd, spill_at)
        elif size < SPILL_AT:
            _write(fd, bytes(SPILL_AT - size), size)
        packed = [pack_entry(b.end, b.end - b.begin, b.crc) for b in recent]
        return cls(fd, record_size, packed, spill_at)

    def add(self, entry: bytes) -> None:
        """Write ``entry`` (not synced: the commit record's sync covers it)."""
        for data, pos in self.place(entry):
            _write(self._fd, data, pos)

    def place(self, entry: bytes) -> list[tuple[bytes, int]]:
        """Take ``entry`` as added, and return the writes that add it, in
        order: ``(bytes, position)`` in the commit record file, for the
        caller to make before the record's sync (if they fail, the caller
        must drop this log: the next writer settles the file again)."""
        writes = []
        if len(self._recent) == self._room:
            run = b"".join(self._recent)
            writes.append((run, self._spill_at))
            self._spill_at += len(run)
            self._recent.clear()
        writes.append((entry, self._record_size + ENTRY_SIZE * len(self._recent)))
        self._recent.append(entry)
        return writes


def _write(fd: int, data: bytes, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n


def unchecked(batches: list[Batch], begin: int, end: int) -> list[tuple[int, int]]:
    """The pieces of ``[begin, end)`` that no batch covers."""
    out: list[tuple[int, int]] = []
    at = begin
    for b in batches:
        if b.begin > at:
            out.append((at, b.begin))
        at = max(at, b.end)
    if at < end:
        out.append((at, end))
    return out


def batch_matches(fd: int, base: int, batch: Batch) -> bool:
    """Whether the bytes of ``batch`` in file ``fd`` (which holds the journal
    from offset ``base`` on) have its checksum."""
    crc, pos, stop = 0, batch.begin - base, batch.end - base
    while pos < stop:
        chunk = os.pread(fd, min(_CHUNK, stop - pos), pos)
        if not chunk:
            return False
        crc = int(google_crc32c.extend(crc, chunk))
        pos += len(chunk)
    return crc == batch.crc


def bad_batches(fd: int, base: int, batches: list[Batch]) -> list[Batch]:
    """The batches whose bytes in file ``fd`` (see ``batch_matches``) do not
    have their checksum."""
    return [b for b in batches if not batch_matches(fd, base, b)]
