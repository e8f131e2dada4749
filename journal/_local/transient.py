"""Transient messages: emitted to the journal's live followers, never stored.

``LocalJournalStore.emit`` hands bytes to every follower of a journal that
listens at that moment, in any process of the machine (of the same user),
without touching the journal's files: no offset, no fragment, no replay.

How it goes. Each journal has a *meeting place*, a directory outside the
store, in memory (``$XDG_RUNTIME_DIR``, else ``/dev/shm``, else the temporary
directory; its name is a hash of the store's real root and the journal's
name). It holds:

* ``@ring``: a ring of the latest emits (``RING_SIZE`` bytes), shared by
  every process through ``mmap``. An emitter writes under the ring's
  ``flock``; followers read it without any lock, each at its own pace, so a
  stopped follower never holds an emitter up. When the ring comes round to
  an emit a follower has not read yet, that follower has lost it, and counts
  it (emits are numbered).
* one Unix datagram socket per listener: a *doorbell*. After writing, the
  emitter sends each a one-byte datagram, never waiting (a full queue means
  a ring is pending already); the listener's thread wakes the journal's
  readers in its process.

The ring's header (64 bytes, integers little-endian)::

    0   4  magic "EXTR"
    8   8  lock: odd while a writer changes the ring (a sequence lock)
    16  8  capacity of the data area (it follows the header)
    24  8  write position (bytes written since the ring was made)
    32  8  number of the next emit
    40  8  position of the oldest emit still whole
    48  8  its number

An emit is a 32-byte head — its length padded to 8 (u32), its data's length
(u32), its number (u64), the journal's committed end when it was emitted
(u64), a CRC-32 of the rest (u32), 4 zero bytes — then the data; it may
wrap round the end of the data area. A follower copies an emit, then checks
the header again: an emit overwritten while it was copied counts as lost.
The CRC keeps out an emit read half-written. Nothing of it reaches a disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import secrets
import select
import socket
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

from .._closing import Closing
from .._errors import AppendTooLargeError, JournalError
from .files import O_CLOEXEC, O_NOFOLLOW, JournalDir, open_commit, read_record, read_spec
from .fragment import frame_cut

if TYPE_CHECKING:
    from .._spec import JournalSpec
    from .reader import LocalJournalReader

#: The largest emit, in bytes.
MAX_EMIT: Final = 64 * 1024
#: Bytes of emits a journal's ring holds: a follower more than this far
#: behind the emitters loses the oldest.
RING_SIZE: Final = 4 << 20
_MAGIC: Final = b"EXTR"
_HEADER: Final = struct.Struct("<4s4xQQQQQQ8x")  # 64 bytes
_LOCK_AT: Final = 8
_U64: Final = struct.Struct("<Q")
_ENTRY: Final = struct.Struct("<IIQQI4x")  # 32 bytes
_RING_FILE: Final = "@ring"
_BELL_SUFFIX: Final = ".bell"
_BELL: Final = b"\x01"
_RECENT_NS: Final = 100_000_000


@dataclass(frozen=True, slots=True)
class Transient:
    """One emit as a listener took it: ``data`` (whole frames of the
    journal's framing), its number ``seq`` (a journal's emits are numbered in
    the order they were written), and ``head``, the journal's committed end
    when it was emitted (it follows every append that completed before)."""

    seq: int
    head: int
    data: bytes


class _Header(NamedTuple):
    capacity: int
    write_pos: int
    next_seq: int
    tail_pos: int
    tail_seq: int


def meeting_place(root: str, journal: str) -> str:
    """The directory of the ring and doorbells of ``journal`` of the store at
    ``root`` (its real path); see the module docstring."""
    base = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not (base and os.path.isdir(base) and os.access(base, os.W_OK)):
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    key = hashlib.sha1(f"{root}\0{journal}".encode(), usedforsecurity=False).hexdigest()[:32]
    # Socket paths are at most 107 bytes: the base leaves room for the name.
    return os.path.join(base, f"exactly-transient-{os.getuid()}", key)


def _align(n: int) -> int:
    return (n + 7) & ~7


class Ring:
    """The ring of one meeting place, mapped into this process."""

    def __init__(self, place: str) -> None:
        os.makedirs(place, mode=0o700, exist_ok=True)
        self.place: Final = place
        path = os.path.join(place, _RING_FILE)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(self._fd).st_size
                if size < _HEADER.size + RING_SIZE or os.pread(self._fd, 4, 0) != _MAGIC:
                    os.ftruncate(self._fd, _HEADER.size + RING_SIZE)
                    os.pwrite(self._fd, _HEADER.pack(_MAGIC, 0, RING_SIZE, 0, 1, 0, 1), 0)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._map = mmap.mmap(self._fd, os.fstat(self._fd).st_size)
        except BaseException:
            os.close(self._fd)
            raise
        self._capacity = _HEADER.unpack_from(self._map)[2]
        self._bells: tuple[int, list[str]] = (-1, [])  # (place's mtime, doorbell paths)
        self._sender: socket.socket | None = None

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self._fd)
        if self._sender is not None:
            self._sender.close()

    # Reading (no lock) ---------------------------------------------------------

    def settled_header(self) -> _Header:
        """The header, read under the ring's lock (``locked``): no writer is at
        work, even if the lock field is odd (one killed mid-write: the next
        write makes it even again)."""
        _, _, capacity, write_pos, next_seq, tail_pos, tail_seq = _HEADER.unpack_from(self._map)
        return _Header(capacity, write_pos, next_seq, tail_pos, tail_seq)

    def header(self) -> _Header | None:
        """The header, or None while a writer is at work (look again later)."""
        m = self._map
        before = _U64.unpack_from(m, _LOCK_AT)[0]
        if before & 1:
            return None
        _, lock, capacity, write_pos, next_seq, tail_pos, tail_seq = _HEADER.unpack_from(m)
        if lock != before or _U64.unpack_from(m, _LOCK_AT)[0] != before:
            return None
        return _Header(capacity, write_pos, next_seq, tail_pos, tail_seq)

    def _copy(self, pos: int, n: int) -> bytes:
        at = pos % self._capacity
        first = min(n, self._capacity - at)
        base = _HEADER.size
        data = self._map[base + at : base + at + first]
        if first < n:
            data += self._map[base : base + n - first]
        return data

    def entry(self, pos: int, seq: int) -> tuple[int, int, bytes] | None:
        """``(length, head, data)`` of emit ``seq`` at ``pos``, or None if it
        is not (or no longer, or not yet wholly) there."""
        raw = self._copy(pos, _ENTRY.size)
        length, size, number, head, crc = _ENTRY.unpack(raw)
        if number != seq or length != _align(_ENTRY.size + size) or size > MAX_EMIT:
            return None
        data = self._copy(pos + _ENTRY.size, size)
        if crc != zlib.crc32(data, zlib.crc32(raw[:24])):
            return None
        return length, head, data

    # Writing -------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the ring's lock: no emit is written meanwhile."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def write(self, head: int, data: bytes) -> list[str]:
        """Add an emit, under the ring's lock; return the doorbells of the
        listeners that will take it: those there under the same lock, which
        listeners take to set up (so an emit counts exactly the listeners
        that get it)."""
        m = self._map
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            _, lock, capacity, write_pos, seq, tail_pos, tail_seq = _HEADER.unpack_from(m)
            _U64.pack_into(m, _LOCK_AT, lock | 1)  # readers keep off
            need = _align(_ENTRY.size + len(data))
            while write_pos + need - tail_pos > capacity:
                (length,) = struct.unpack("<I", self._copy(tail_pos, 4))
                tail_pos += length
                tail_seq += 1
            head_bytes = _ENTRY.pack(need, len(data), seq, head, 0)[:24]
            crc = zlib.crc32(data, zlib.crc32(head_bytes))
            entry = _ENTRY.pack(need, len(data), seq, head, crc) + data
            entry += bytes(need - len(entry))
            at = write_pos % capacity
            first = min(need, capacity - at)
            base = _HEADER.size
            m[base + at : base + at + first] = entry[:first]
            if first < need:
                m[base : base + need - first] = entry[first:]
            _HEADER.pack_into(
                m, 0, _MAGIC, lock | 1, capacity, write_pos + need, seq + 1, tail_pos, tail_seq
            )
            _U64.pack_into(m, _LOCK_AT, (lock | 1) + 1)
            return self._doorbells()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _doorbells(self) -> list[str]:
        try:
            mtime = os.stat(self.place).st_mtime_ns
        except FileNotFoundError:
            return []
        # The listing is kept while the directory's time says nothing changed;
        # file times are coarse (a few ms), so a recent one is not trusted.
        if mtime != self._bells[0] or time.time_ns() - mtime < _RECENT_NS:
            names = [n for n in os.listdir(self.place) if n.endswith(_BELL_SUFFIX)]
            self._bells = (mtime, [os.path.join(self.place, n) for n in names])
        return self._bells[1]

    def ring_bells(self, bells: list[str]) -> int:
        """Wake the listeners of these doorbells (a one-byte datagram each,
        never waiting); return how many are there."""
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        reached = 0
        for path in bells:
            try:
                self._sender.sendto(_BELL, socket.MSG_DONTWAIT, path)
                reached += 1
            except BlockingIOError:
                reached += 1  # Rung already, not answered yet: it will read the ring.
            except ConnectionRefusedError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # Left by a process that died.
            except FileNotFoundError:
                continue  # Gone since listed.
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
        return reached


class TransientListener(Closing):
    """Takes the emits of one journal from the moment it is made until
    ``close()``. Made by ``LocalJournalStore.listen``; a following reader made
    by :meth:`read` returns from a blocked read when an emit can be handed
    out (:meth:`take`).

    ``lost`` counts the emits it missed by falling more than the ring
    (``RING_SIZE`` bytes of emits) behind, as their numbers show."""

    def __init__(
        self,
        journal: str,
        place: str,
        *,
        wake: Callable[[], None],
        reader: Callable[[TransientListener, int, int | None], LocalJournalReader],
    ) -> None:
        self.journal: Final = journal
        self._wake = wake
        self._reader = reader
        self._lock = threading.Lock()
        self._lost = 0
        self._closed = False
        self._ring = Ring(place)
        self._bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._path = os.path.join(place, f"{os.getpid()}-{secrets.token_hex(6)}{_BELL_SUFFIX}")
        # The doorbell goes up, and the listener takes the emits from the next
        # one on, under the ring's lock: an emit either comes before both (not
        # taken, not counted) or after both (taken, and counted by emit()).
        with self._ring.locked():
            self._bell.bind(self._path)
            h = self._ring.settled_header()
        self._pos, self._seq = h.write_pos, h.next_seq
        self._bell.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"transient-{journal}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<TransientListener journal={self.journal!r} lost={self.lost}>"

    @property
    def lost(self) -> int:
        """How many emits this listener missed so far."""
        with self._lock:
            return self._lost

    @property
    def closed(self) -> bool:
        return self._closed

    def read(self, offset: int = -1, end_offset: int | None = None) -> LocalJournalReader:
        """A following reader of the journal bound to this listener: its
        blocked reads return (``b""``, or 0 bytes read) when an emit can be
        handed out; it stays open, to read on after :meth:`take`."""
        return self._reader(self, offset, end_offset)

    def ready(self, offset: int) -> bool:
        """Whether an emit can be handed out to a reader at ``offset``: the
        next one followed only appends that end at or before it."""
        return bool(self._next(offset, peek=True))

    def take(self, offset: int | None = None) -> list[Transient]:
        """The emits not taken yet, oldest first, that can be handed out to a
        reader at ``offset`` (all of them without one)."""
        return self._next(offset, peek=False)

    def _next(self, offset: int | None, *, peek: bool) -> list[Transient]:
        out: list[Transient] = []
        with self._lock:
            if self._closed:
                return out
            ring = self._ring
            while True:
                h = ring.header()
                if h is None:
                    break  # A writer is at work: its bell will ring.
                if self._seq < h.tail_seq:
                    self._lost += h.tail_seq - self._seq  # The ring came round.
                    self._pos, self._seq = h.tail_pos, h.tail_seq
                if self._seq >= h.next_seq:
                    break
                got = ring.entry(self._pos, self._seq)
                after = ring.header()
                if after is None:
                    break
                if after.tail_seq > self._seq:
                    continue  # Overwritten as we read it: lost (counted above).
                if got is None:
                    break  # Not wholly there for us yet: its bell will ring again.
                length, head, data = got
                if offset is not None and head > offset:
                    break
                out.append(Transient(self._seq, head, data))
                if peek:
                    break
                self._pos += length
                self._seq += 1
        return out

    def close(self) -> None:
        """Stop listening: remove the doorbell, stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        self._bell.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ring.close()
        self._wake()


    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._bell.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                return
            with contextlib.suppress(OSError):
                while self._bell.recv(16):
                    pass
            self._wake()


def emit(ring: Ring, head: int, data: bytes) -> int:
    """Write ``data`` (emitted when the journal's committed end was ``head``)
    to the ring and wake every listener; return how many there are."""
    return ring.ring_bells(ring.write(head, data))


@dataclass(slots=True)
class _Emitting:
    """What emits to one journal use: its spec, its commit record (for the
    committed end each emit follows; ``ident`` tells the file), its ring."""

    jd: JournalDir
    spec: JournalSpec
    commit_fd: int
    ident: tuple[int, int]
    ring: Ring

    def close(self) -> None:
        os.close(self.commit_fd)
        self.ring.close()


class Emitters:
    """The emits of one ``LocalJournalStore`` (under ``root``): what each
    journal's use, kept from one emit to the next while its commit record
    is the same file (the journal was not deleted and made again)."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._by_name: dict[str, _Emitting] = {}

    def emit(self, name: str, data: bytes, journal_dir: Callable[[str], JournalDir]) -> int:
        """See ``LocalJournalStore.emit``; ``journal_dir`` finds a journal's directory."""
        e = self._emitting_to(name, journal_dir)
        if not data:
            raise ValueError(f"nothing to emit to {name!r}")
        if len(data) > MAX_EMIT:
            raise AppendTooLargeError(name, len(data), MAX_EMIT)
        if frame_cut(e.spec, data) != len(data):
            raise ValueError(
                f"an emit to {name!r} must be whole frames of its framing"
                f" ({e.spec.content_type}); these {len(data)} bytes are not"
            )
        return emit(e.ring, read_record(e.jd, e.commit_fd).end, data)

    def _emitting_to(self, name: str, journal_dir: Callable[[str], JournalDir]) -> _Emitting:
        with self._lock:
            e = self._by_name.get(name)
        if e is not None:
            try:
                st = os.stat(e.jd.commit_path)
            except (FileNotFoundError, NotADirectoryError):
                st = None
            if st is not None and (st.st_dev, st.st_ino) == e.ident:
                return e
            with self._lock:
                self._by_name.pop(name, None)
            e.close()
        jd = journal_dir(name)
        spec = read_spec(jd)
        fd = open_commit(jd)
        place = meeting_place(self._root, name)
        try:
            st = os.fstat(fd)
            new = _Emitting(jd, spec, fd, (st.st_dev, st.st_ino), Ring(place))
        except OSError as err:
            os.close(fd)
            raise JournalError(
                f"cannot emit to {name!r}: {err} (emits go through {place})"
            ) from err
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            old = self._by_name.pop(name, None)
            self._by_name[name] = new
        if old is not None:
            old.close()
        return new

    def close(self) -> None:
        with self._lock:
            emitting = list(self._by_name.values())
            self._by_name.clear()
        for e in emitting:
            e.close()
