"""The files of one journal directory of a ``LocalJournalStore``.

Everything here is a short sequence of system calls, shared by the writer,
the readers and the store. The invariants they keep (see docs/journal-store.md):

* Only a holder of the journal's ``@lock`` (``flock``) writes fragment data,
  the commit record, or renames and removes files.
* Bytes become visible only through the commit record, which is updated
  after the data it covers is on disk (``fdatasync``). Bytes past the
  committed end of the open fragment are garbage from a writer that died,
  and the next lock holder truncates them.
* A sealed fragment never holds uncommitted bytes: the open fragment is
  sealed only once its whole content is committed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from .._errors import CorruptJournalError, JournalNotFoundError
from .._labels import LabelSet
from .._spec import Fragment, JournalSpec, sealed_name
from ..durable import TEMP_PREFIX, create_temp_in, fsync_dir, write_all, write_durably
from .fragment import (
    COMMIT_FILE,
    JOURNAL_FILES,
    LOCK_FILE,
    QUARANTINE_PREFIX,
    RECORD_SIZE,
    SPEC_FILE,
    START_FILE,
    CommitRecord,
    damaged_slot,
    open_name,
    pack_slot,
    parse_open_name,
    parse_quarantine_name,
    parse_record,
    parse_sealed_name,
    parse_sums_name,
    quarantine_name,
    slot_offset,
    sums_name,
)
from .iobatch import IO_FDATASYNC, IO_PWRITE, Op, run_io, same_file_ops
from .sums import Batch, OpenLog, pack_batches, parse_batches, read_log

SPEC_FORMAT: Final = 1
# Files are read and hashed in pieces of this size.
_CHUNK: Final = 1 << 20
# ... but hashed in pieces of this size by a writer sealing a fragment (one
# piece for a fragment of the default size). Each read and each hash gives
# up the interpreter lock, and while another thread keeps the interpreter
# busy (the application publishing) each takes it back only after the
# switch interval: in pieces of 1 MiB a 16 MiB fragment took 60-180 ms to
# hash that way, against 10 ms alone; in one piece 30 ms, against 15 ms
# alone (which is why readers, whose own thread is the busy one, keep 1 MiB).
_SEAL_CHUNK: Final = 16 << 20
O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
# Files the store writes are never reached through a symbolic link.
O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CREATE_NEW: Final = os.O_CREAT | os.O_EXCL | O_CLOEXEC | O_NOFOLLOW
LOG: Final = logging.getLogger("journal")


@dataclass(frozen=True, slots=True)
class JournalDir:
    """Paths of one journal's directory: the name's ``/``-separated parts
    become nested directories under the store root."""

    name: str
    path: str

    @classmethod
    def of(cls, root: str, name: str) -> JournalDir:
        return cls(name, os.path.join(root, *name.split("/")))

    def file(self, base: str) -> str:
        return os.path.join(self.path, base)

    @property
    def spec_path(self) -> str:
        return self.file(SPEC_FILE)

    @property
    def commit_path(self) -> str:
        return self.file(COMMIT_FILE)

    @property
    def lock_path(self) -> str:
        return self.file(LOCK_FILE)

    @property
    def start_path(self) -> str:
        return self.file(START_FILE)

    def corrupt(
        self, base: str, reason: str, offset: int | None = None, end_offset: int | None = None
    ) -> CorruptJournalError:
        return CorruptJournalError(
            self.name, self.file(base), reason, offset=offset, end_offset=end_offset
        )


# The recorded start ----------------------------------------------------------


def dir_entries(jd: JournalDir) -> list[os.DirEntry[str]]:
    """The entries of ``jd``'s directory; ``JournalNotFoundError`` if it is gone."""
    try:
        return list(os.scandir(jd.path))
    except (FileNotFoundError, NotADirectoryError):
        raise JournalNotFoundError(jd.name) from None


def read_start(jd: JournalDir) -> int | None:
    """The journal's recorded start (see ``START_FILE``); None when it has
    none (made before starts were recorded) or it cannot be read (``fsck``
    says so)."""
    try:
        with open(jd.start_path, "rb") as f:
            raw = f.read(64)
    except (FileNotFoundError, NotADirectoryError):
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def write_start(jd: JournalDir, offset: int) -> None:
    """Record, durably, that retention removed everything below ``offset``."""
    write_atomically(jd, START_FILE, b"%d\n" % offset)


# Specs ---------------------------------------------------------------------


def read_spec(jd: JournalDir) -> JournalSpec:
    try:
        with open(jd.spec_path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):
        raise JournalNotFoundError(jd.name) from None
    try:
        doc = json.loads(raw)
        if doc.get("format") != SPEC_FORMAT:
            raise ValueError(f"unsupported format {doc.get('format')!r}")
        labels = LabelSet(doc["labels"])
        name = doc["name"]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise jd.corrupt(SPEC_FILE, f"unreadable journal spec ({err})") from None
    if name != jd.name:
        hint = ""
        if isinstance(name, str) and jd.name.endswith("/" + name):
            # The usual cause: a store opened at a parent of its root.
            nested = jd.path[: len(jd.path) - len(name)].rstrip(os.sep)
            hint = f"; is the store's root {nested}?"
        raise jd.corrupt(SPEC_FILE, f"spec names another journal ({name!r}){hint}")
    return JournalSpec(jd.name, labels)


def spec_bytes(spec: JournalSpec) -> bytes:
    doc = {"format": SPEC_FORMAT, "name": spec.name, "labels": spec.labels.to_dict()}
    return json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"


def create_temp(jd: JournalDir, base: str) -> tuple[int, str]:
    """A new temporary file of the journal directory, for ``base``: opened
    for writing, created exclusively under an unpredictable name (a file or
    link planted at a guessable name is never followed nor truncated)."""
    return create_temp_in(jd.path, base)


def write_atomically(jd: JournalDir, base: str, data: bytes | memoryview) -> None:
    """Replace file ``base`` of the journal directory with ``data``, durably."""
    write_durably(jd.file(base), data, create_dirs=False)


# Locking -------------------------------------------------------------------


def open_lock(jd: JournalDir, *, create: bool = False) -> int:
    """Open and ``flock`` the journal's lock file; return its descriptor.

    The lock file is removed when the journal is deleted, so after waiting
    for the lock we check that we hold the file now at the path, and retry
    otherwise. Raises ``JournalNotFoundError`` if there is none (and not
    ``create``)."""
    flags = os.O_RDWR | O_CLOEXEC | O_NOFOLLOW | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = os.open(jd.lock_path, flags, 0o644)
        except (FileNotFoundError, NotADirectoryError):
            if create:
                os.makedirs(jd.path, exist_ok=True)
                continue
            raise JournalNotFoundError(jd.name) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if lock_is_current(jd, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # Unlinked while we waited (deleted): start over.


def lock_is_current(jd: JournalDir, fd: int) -> bool:
    """Whether ``fd`` is still the lock file at the journal's path."""
    return bool(run_io(lock_check_ops(jd, fd))[-1])


def lock_check_ops(jd: JournalDir, fd: int, at: int = 0) -> list[Op]:
    """The operations (journal/_local/iobatch.py), placed at index ``at``,
    that stop their list unless ``fd`` is still the lock file at the path."""
    return same_file_ops(jd.lock_path, fd, at)


def unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(jd: JournalDir) -> Iterator[int]:
    fd = open_lock(jd)
    try:
        yield fd
    finally:
        unlock(fd)


# The commit record -----------------------------------------------------------


def open_commit(jd: JournalDir, *, write: bool = False) -> int:
    try:
        flags = (os.O_RDWR | O_NOFOLLOW) if write else os.O_RDONLY
        return os.open(jd.commit_path, flags | O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        if not os.path.exists(jd.spec_path):
            raise JournalNotFoundError(jd.name) from None
        raise jd.corrupt(COMMIT_FILE, "the commit record is missing") from None


def read_record(jd: JournalDir, fd: int) -> CommitRecord:
    return read_record_area(jd, fd)[0]


def read_record_area(jd: JournalDir, fd: int) -> tuple[CommitRecord, bytes]:
    """The commit record, and the bytes of the record area it was read from."""
    area = os.pread(fd, RECORD_SIZE, 0)
    rec = parse_record(area)
    if rec is None:
        raise jd.corrupt(COMMIT_FILE, "no valid commit record")
    return rec, area


def write_record(fd: int, rec: CommitRecord) -> None:
    """Durably store ``rec`` in its slot (the other slot keeps the previous one)."""
    run_io(record_ops(fd, rec))


def record_ops(fd: int, rec: CommitRecord) -> list[Op]:
    """The operations (journal/_local/iobatch.py) of ``write_record``."""
    return [(IO_PWRITE, fd, pack_slot(rec), slot_offset(rec.seq)), (IO_FDATASYNC, fd)]


# Batch checksums (journal/_local/sums.py) -----------------------------------------


def open_batches(commit_fd: int, begin: int, end: int) -> list[Batch]:
    """The batch checksums of the open fragment (holding ``[begin, end)``),
    from the commit record file."""
    return read_log(commit_fd, RECORD_SIZE, begin, end)


def settle_batches(commit_fd: int, rec: CommitRecord) -> OpenLog:
    """Cut entries that are not the open fragment's from the commit record
    file; return the writer's hold on them. The caller holds the lock."""
    return OpenLog.settle(commit_fd, RECORD_SIZE, rec.begin, rec.end)


def read_sums(jd: JournalDir, begin: int, end: int) -> list[Batch]:
    """The batch checksums of the sealed fragment ``[begin, end)`` (none if
    it has no checksum file)."""
    try:
        fd = os.open(jd.file(sums_name(begin, end)), os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        return parse_batches(os.pread(fd, os.fstat(fd).st_size, 0), begin, end)
    finally:
        os.close(fd)


def write_sums(jd: JournalDir, begin: int, end: int, batches: list[Batch]) -> None:
    """Durably write the batch checksums of the sealed fragment ``[begin, end)``
    (nothing when there are none)."""
    if batches:
        write_atomically(jd, sums_name(begin, end), pack_batches(batches))


def remove_sums(jd: JournalDir, begin: int, end: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(jd.file(sums_name(begin, end)))


# Fragments -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A quarantine file standing for journal offsets ``[begin, end)``."""

    begin: int
    end: int
    path: str


@dataclass(slots=True)
class Scan:
    """A journal directory's fragment files, checked against their names."""

    sealed: list[Fragment]
    opens: list[int]  # begin offsets of @open- files found
    quarantined: list[Quarantined]  # sorted by begin


def scan(jd: JournalDir, *, strict: bool = True) -> Scan:
    """List and check the journal's files.

    Raises ``CorruptJournalError`` for a file that does not belong in a
    journal directory, or a sealed fragment which overlaps another (unless
    not ``strict``). Sub-directories (child journals) are ignored. A sealed
    fragment whose size disagrees with its name is listed by its name: a
    reader reports it when it gets there (as it does a fragment whose SHA-1
    does not match), so that the rest of the journal stays readable.
    """
    sealed: list[Fragment] = []
    opens: list[int] = []
    quarantined: list[Quarantined] = []
    for entry in dir_entries(jd):
        base = entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                continue
            parsed = parse_sealed_name(base)
            if parsed is not None:
                begin, end, sha = parsed
                if begin >= end:
                    if strict:
                        raise jd.corrupt(base, "fragment name has begin >= end")
                    continue
                st = entry.stat(follow_symlinks=False)
                sealed.append(Fragment(jd.name, begin, end, entry.path, True, st.st_mtime, sha))
                continue
            begin_open = parse_open_name(base)
            if begin_open is not None:
                opens.append(begin_open)
            elif base.startswith(QUARANTINE_PREFIX):
                q = parse_quarantine_name(base)
                if q is not None and q[0] < q[1]:
                    quarantined.append(Quarantined(q[0], q[1], entry.path))
            elif (
                base in JOURNAL_FILES
                or base.startswith(TEMP_PREFIX)
                or parse_sums_name(base) is not None
            ):
                pass
            elif strict:
                raise jd.corrupt(base, "unrecognised file in a journal directory")
        except FileNotFoundError:
            continue  # Removed by retention or sealed while we listed.
    sealed.sort(key=lambda f: f.begin)
    quarantined.sort(key=lambda q: (q.begin, q.end))
    if strict:
        for a, b in itertools.pairwise(sealed):
            if b.begin < a.end:
                raise jd.corrupt(
                    os.path.basename(b.path),
                    f"fragment overlaps {os.path.basename(a.path)}",
                    b.begin,
                    b.end,
                )
    return Scan(sealed, opens, quarantined)


def quarantined_through(quarantined: list[Quarantined], offset: int) -> int:
    """The offset up to which quarantine files cover ``[offset, ...)`` without
    a gap (``offset`` itself when none covers it)."""
    pos = offset
    for q in quarantined:
        if q.begin <= pos < q.end:
            pos = q.end
    return pos


def fragment_sha1(fd: int, size: int, *, piece: int = _CHUNK) -> bytes:
    """SHA-1 of the first ``size`` bytes of the file, read ``piece`` bytes at a time."""
    h = hashlib.sha1(usedforsecurity=False)
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(piece, size - pos), pos)
        if not chunk:
            break
        h.update(chunk)
        pos += len(chunk)
    return h.digest()


def recover(jd: JournalDir, commit_fd: int) -> tuple[CommitRecord, int | None]:
    """Bring the journal to a consistent state; the caller holds the lock.

    Returns the commit record and a descriptor of the open fragment (None if
    there is none yet). Truncates bytes past the committed end, finishes a
    seal interrupted between its rename and its record update, and removes
    leftover temporary files.

    Bytes past the committed end are a dead writer's unfinished append, but
    for one case: when the other slot of the commit record is damaged, it
    may have held a newer record, whose append was acknowledged. Those bytes
    are then moved to a quarantine file (with a warning), never cut, and the
    journal goes on after them: offsets are never given out twice. The same
    holds after any repair that quarantined bytes at the journal's end."""
    raw = os.pread(commit_fd, RECORD_SIZE, 0)
    rec = parse_record(raw)
    if rec is None:
        raise jd.corrupt(
            COMMIT_FILE, "no valid commit record (exactly fsck --repair rebuilds it)"
        )
    listing = scan(jd)
    for begin in listing.opens:
        if begin != rec.begin:
            raise jd.corrupt(
                open_name(begin),
                f"open fragment does not match the commit record (open fragment at {rec.begin})",
            )
    for entry in os.scandir(jd.path):
        if entry.name.startswith(TEMP_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    damaged = damaged_slot(raw, rec)
    floor = max((q.end for q in listing.quarantined), default=0)
    committed = rec.end - rec.begin
    try:
        fd = os.open(jd.file(open_name(rec.begin)), os.O_RDWR | O_CLOEXEC | O_NOFOLLOW)
    except FileNotFoundError:
        if committed and floor < rec.end:
            done = [f for f in listing.sealed if f.begin == rec.begin and f.end == rec.end]
            if not done:
                raise jd.corrupt(
                    open_name(rec.begin),
                    f"missing, yet [{rec.begin}, {rec.end}) is committed"
                    " (exactly fsck --repair recovers the rest of the journal)",
                    rec.begin,
                    rec.end,
                ) from None
        # Crashed after sealing the fragment but before recording it; or a
        # repair moved the open fragment to quarantine: go on after it all.
        rec = _restart(commit_fd, rec, max(rec.end, floor), rewrite=damaged)
        return rec, None
    try:
        size = os.fstat(fd).st_size
        if size < committed:
            raise jd.corrupt(
                open_name(rec.begin),
                f"open fragment holds {size} bytes, fewer than the {committed} committed"
                " (exactly fsck --repair keeps what is left and makes it writable again)",
                rec.begin + size,
                rec.end,
            )
        if size > committed and damaged:
            floor = max(floor, _quarantine_tail(jd, fd, rec, size))
        elif damaged:
            LOG.warning(
                "journal %s: a slot of the commit record is damaged; no byte depended"
                " on it, and it is written again",
                jd.name,
            )
        if damaged:
            # Write the record again, over the damaged slot.
            rec = CommitRecord(rec.seq + 1, rec.begin, rec.end)
            write_record(commit_fd, rec)
        if size > committed:
            os.ftruncate(fd, committed)  # A dead writer's uncommitted bytes.
            os.fdatasync(fd)
        if floor > rec.end:
            # Offsets up to floor are in quarantine: the journal goes on after them.
            if committed:
                seal(jd, commit_fd, fd, rec, next_begin=floor)
            else:
                os.unlink(jd.file(open_name(rec.begin)))
                fsync_dir(jd.path)
                _restart(commit_fd, rec, floor)
            os.close(fd)
            return read_record(jd, commit_fd), None
    except BaseException:
        os.close(fd)
        raise
    return rec, fd


def _restart(
    commit_fd: int, rec: CommitRecord, begin: int, *, rewrite: bool = False
) -> CommitRecord:
    """Record that the next open fragment begins at ``begin`` (nothing
    committed in it). ``rewrite``: write the record even if it says so already
    (over a damaged slot)."""
    if (rec.begin, rec.end) == (begin, begin) and not rewrite:
        return rec
    new = CommitRecord(rec.seq + 1, begin, begin)
    write_record(commit_fd, new)
    return new


def _quarantine_tail(jd: JournalDir, fd: int, rec: CommitRecord, size: int) -> int:
    """Move the bytes of the open fragment past the committed end, which a
    damaged commit slot may have covered, to a quarantine file; return the
    journal offset just past them."""
    committed = rec.end - rec.begin
    end = rec.end + size - committed
    path = quarantine_copy(jd, fd, committed, size, rec.end, end, "uncommitted")
    LOG.warning(
        "journal %s: the newest commit record is damaged; bytes [%d, %d) past the last"
        " valid record (an append that may have been acknowledged) were moved to %s;"
        " the journal goes on at offset %d",
        jd.name,
        rec.end,
        end,
        path,
        end,
    )
    return end


def quarantine_copy(
    jd: JournalDir, fd: int, start: int, stop: int, begin: int, end: int, kind: str
) -> str:
    """Copy bytes ``[start, stop)`` of the file ``fd`` to a new quarantine file
    standing for journal offsets ``[begin, end)``, durably; return its path.
    Done already (a copy of that size under that name)? Then nothing is copied."""
    name = quarantine_name(begin, end, kind)
    with contextlib.suppress(FileNotFoundError):
        if os.stat(jd.file(name), follow_symlinks=False).st_size == stop - start:
            return jd.file(name)
    out, tmp = create_temp(jd, name)
    try:
        try:
            pos = start
            while pos < stop:
                chunk = os.pread(fd, min(_CHUNK, stop - pos), pos)
                if not chunk:
                    break
                write_all(out, chunk, pos - start)
                pos += len(chunk)
            os.fsync(out)
        finally:
            os.close(out)
        path = unused_name(jd, name)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(jd.path)
    return path


def quarantine_file(jd: JournalDir, base: str, name: str) -> str:
    """Move file ``base`` of the journal directory to quarantine as ``name``
    (made unique); return the new path."""
    path = unused_name(jd, name)
    os.rename(jd.file(base), path)
    fsync_dir(jd.path)
    return path


def unused_name(jd: JournalDir, name: str) -> str:
    """The path of ``name`` in the journal directory, or of ``name-1``,
    ``name-2``, ... if that exists."""
    path, n = jd.file(name), 0
    while os.path.lexists(path):
        n += 1
        path = jd.file(f"{name}-{n}")
    return path


def truncate_garbage(fd: int, rec: CommitRecord) -> None:
    """Cut bytes past the committed end, left by a writer that died holding the lock."""
    committed = rec.end - rec.begin
    if os.fstat(fd).st_size > committed:
        os.ftruncate(fd, committed)
        os.fdatasync(fd)


def seal(
    jd: JournalDir,
    commit_fd: int,
    open_fd: int,
    rec: CommitRecord,
    *,
    next_begin: int | None = None,
) -> tuple[CommitRecord, OpenLog]:
    """Seal the open fragment ``[rec.begin, rec.end)``: rename it to its content
    name, then record that the next open fragment begins at ``rec.end`` (or
    at ``next_begin``, past offsets that are in quarantine). Returns the new
    record and the (empty) checksum log of the new open fragment.

    A crash between the two leaves a consistent journal (``recover`` finishes)."""
    truncate_garbage(open_fd, rec)  # The sealed file must hold exactly its content.
    sha = fragment_sha1(open_fd, rec.end - rec.begin, piece=_SEAL_CHUNK)
    # Its batch checksums first: a sealed fragment without them is unchecked.
    write_sums(jd, rec.begin, rec.end, open_batches(commit_fd, rec.begin, rec.end))
    os.rename(jd.file(open_name(rec.begin)), jd.file(sealed_name(rec.begin, rec.end, sha)))
    fsync_dir(jd.path)
    begin = rec.end if next_begin is None else next_begin
    new = CommitRecord(rec.seq + 1, begin, begin)
    write_record(commit_fd, new)
    # The sealed fragment's entries are in their own file now.
    return new, settle_batches(commit_fd, new)


def open_fragment_path(jd: JournalDir, rec: CommitRecord) -> str:
    return jd.file(open_name(rec.begin))


# Helpers ---------------------------------------------------------------------


