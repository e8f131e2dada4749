"""``LocalJournalStore``: the embedded, on-disk journal store.

Layout (docs/journal-store.md has the full story)::

    <root>/
      <journal/name/as/directories>/
        @spec.json                      name and labels (exists <=> the journal exists)
        @lock                           flock()ed by whoever writes, seals or trims
        @commit                         the commit record: open fragment begin, committed end
        0000000000000000-0000000000001000-<sha1>.raw    sealed fragments, Gazette-named
        @open-0000000000001000          the fragment being written

Several stores, in one process or many, may share a root: every change to a
journal's files happens under its ``flock``, and readers go by the commit
record, which covers only bytes already on disk.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, final

from .._append_queue import append_router, flush_queues
from .._closing import CLIENTS, Closing
from .._errors import (
    AppendTooLargeError,
    JournalClosedError,
    JournalError,
    JournalExistsError,
    JournalNotFoundError,
)
from .._labels import LabelSelector, LabelSet, LabelsInit, parse_label_selector
from .._spec import AppendResult, Fragment, JournalSpec
from .._util import age_seconds
from ..durable import fsync_dir
from .check import JournalProblem, check_journal
from .files import (
    JournalDir,
    locked,
    open_commit,
    open_fragment_path,
    open_lock,
    read_record,
    read_spec,
    read_start,
    recover,
    remove_sums,
    scan,
    seal,
    spec_bytes,
    unlock,
    write_atomically,
    write_start,
)
from .fragment import (
    COMMIT_FILE,
    DELETING_FILE,
    LOCK_FILE,
    SPEC_FILE,
    CommitRecord,
    pack_slot,
)
from .layout import journal_data, journal_dir, journal_directories
from .listing import quarantine_files
from .reader import LocalJournalReader, StoreServices, open_reader
from .transient import Emitters
from .verify import FragmentChecks, verify_journal
from .watch import Watcher
from .writer import JournalWriter

if TYPE_CHECKING:
    # Loaded by the first emit or listen (sockets, mmap): nothing else pays for it.
    from .transient import TransientListener

#: Default size at which the open fragment is sealed. Fragments are the unit
#: of retention and of parallel reads (a Spark task per fragment).
DEFAULT_FRAGMENT_SIZE: Final = 16 << 20
#: Default bound on one append (as gossip's MaxData: appends are whole
#: messages or transactions, and a batch is written in one piece).
DEFAULT_MAX_APPEND_SIZE: Final = 16 << 20

LOG: Final = logging.getLogger("journal")

@final
class LocalJournalStore(Closing):
    """Journals stored as files under ``root`` (created if missing).

    ``fragment_size``: the open fragment is sealed (renamed to its Gazette
    content name) once it holds at least this many bytes.
    ``max_append_size``: larger appends raise ``AppendTooLargeError``.
    ``verify_fragments``: check each sealed fragment's SHA-1 against its name
    when a reader first opens it (once per file per store).
    ``verify_checksums``: readers check each batch of appends against its
    CRC-32C before handing out any of its bytes, in the open fragment too
    (``exactly fsck`` checks them all in any case).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fragment_size: int = DEFAULT_FRAGMENT_SIZE,
        max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
        verify_fragments: bool = True,
        verify_checksums: bool = False,
    ) -> None:
        if fragment_size < 1:
            raise ValueError(f"fragment_size must be positive ({fragment_size})")
        if max_append_size < 1:
            raise ValueError(f"max_append_size must be positive ({max_append_size})")
        self.root: Final = os.path.abspath(os.fspath(root))
        self.fragment_size: Final = fragment_size
        self.max_append_size: Final = max_append_size
        self.verify_fragments: Final = verify_fragments
        self.verify_checksums: Final = verify_checksums
        os.makedirs(self.root, exist_ok=True)
        self._lock = threading.Lock()
        self._writers: dict[str, JournalWriter] = {}
        # append() without Python code in the common case (journal/_append_queue.py).
        router = append_router(self, LocalJournalStore.append, self._writers, max_append_size)
        if router is not None:
            self.append = router  # type: ignore[assignment]
        self._watcher = Watcher()
        self._fragment_checks = FragmentChecks()
        self._warned: set[tuple[str, int]] = set()  # (journal, seq) of damaged records
        self._real_root = os.path.realpath(self.root)
        self._emitters = Emitters(self._real_root)  # what emits to each journal use
        self._closed = False
        CLIENTS.add(self)  # closed at exit
        # A store dropped without close() must not leave its inotify thread
        # behind. (Not at exit: the store is closed then, after what reads
        # through it, see journal.CloseAtExit.)
        weakref.finalize(self, self._watcher.close).atexit = False

    def __repr__(self) -> str:
        return f"LocalJournalStore({self.root!r})"

    # Administration ----------------------------------------------------------

    def create(self, name: str, labels: LabelSet | LabelsInit | None = None) -> JournalSpec:
        """Create journal ``name`` with ``labels``; return its spec.

        Idempotent for identical labels; ``JournalExistsError`` if it exists
        with other labels. Invalid names or labels raise ``ValueError``
        subclasses and change nothing."""
        spec = JournalSpec(name, labels)
        spec.validate()
        jd = self._dir(name)
        self._check_open()
        try:
            os.makedirs(jd.path, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as err:
            raise JournalError(
                f"cannot create journal {name!r}: {err.filename} is not a directory"
            ) from err
        fd = open_lock(jd, create=True)
        try:
            if os.path.exists(jd.spec_path):
                existing = read_spec(jd)
                if existing.labels != spec.labels:
                    raise JournalExistsError(name, existing.labels.to_dict())
                return existing
            data = journal_data(jd.path)
            if data and not os.path.exists(os.path.join(jd.path, DELETING_FILE)):
                # Files of a journal whose spec is gone (lost, or removed by
                # hand): never deleted. With its commit record, the journal
                # is made again over them; without, nothing is done.
                if COMMIT_FILE not in data:
                    raise JournalError(
                        f"cannot create journal {name!r}: {jd.path} holds fragments of a"
                        " journal but neither its spec nor its commit record; move them"
                        " away first (nothing was changed)"
                    )
                LOG.warning("journal %s: its files were found without a spec (%s lost?):"
                            " made again over them, with the labels given", name, SPEC_FILE)
                write_atomically(jd, SPEC_FILE, spec_bytes(spec))
                self._fsync_parents(jd)
                return spec
            # Leftovers of a deletion that crashed half-way belong to no journal.
            for entry in data:
                os.unlink(os.path.join(jd.path, entry))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(jd.path, DELETING_FILE))
            write_start(jd, 0)
            write_atomically(jd, COMMIT_FILE, _initial_record())
            write_atomically(jd, SPEC_FILE, spec_bytes(spec))
            self._fsync_parents(jd)
        finally:
            unlock(fd)
        return spec

    def delete(self, name: str) -> None:
        """Remove journal ``name`` and its fragments; ``JournalNotFoundError`` if absent.

        Appends still queued for it fail with ``JournalNotFoundError``; open
        readers may go on reading what they already hold open."""
        jd = self._dir(name)
        with locked(jd):
            if not os.path.exists(jd.spec_path):
                raise JournalNotFoundError(name)
            # From here on the journal does not exist, and what is left of it
            # is known for leftovers of a deletion (see DELETING_FILE).
            os.replace(jd.spec_path, os.path.join(jd.path, DELETING_FILE))
            fsync_dir(jd.path)
            for entry in os.scandir(jd.path):
                if entry.is_file(follow_symlinks=False) and \
                        entry.name not in (LOCK_FILE, DELETING_FILE):
                    os.unlink(entry.path)
            os.unlink(os.path.join(jd.path, DELETING_FILE))  # the mark, last
            os.unlink(jd.lock_path)  # Waiters for the lock notice and give up.
            fsync_dir(jd.path)
        with self._lock:
            writer = self._writers.pop(name, None)
        if writer is not None:
            writer.stop()
        # Remove directories left empty, up to the root.
        path = jd.path
        while path != self.root:
            try:
                os.rmdir(path)
            except OSError:
                break
            path = os.path.dirname(path)

    def get(self, name: str) -> JournalSpec:
        """The journal's spec; ``JournalNotFoundError`` if absent."""
        return read_spec(self._dir(name))

    def list(self, selector: str | LabelSelector = "") -> builtins.list[JournalSpec]:
        """Specs of the journals matching ``selector``, sorted by name."""
        sel = parse_label_selector(selector)
        out: builtins.list[JournalSpec] = []
        for name, path in journal_directories(self.root):
            if os.path.exists(os.path.join(path, SPEC_FILE)):
                try:
                    spec = read_spec(JournalDir(name, path))
                except JournalNotFoundError:
                    continue  # Deleted while we looked.
                if sel.matches(spec):
                    out.append(spec)
        out.sort(key=lambda s: s.name)
        return out

    def names(self) -> builtins.list[str]:
        """Names of every journal of the store, those whose spec cannot be
        read included (which ``list`` refuses, as ``get`` does): what
        ``exactly fsck`` checks and ``exactly journals list`` shows. Sorted."""
        return sorted(name for name, path in journal_directories(self.root)
                      if os.path.exists(os.path.join(path, SPEC_FILE)))

    def orphaned(self) -> builtins.list[str]:
        """Names of the directories that hold a journal's files (fragments, a
        commit record) but no spec: journals whose ``@spec.json`` was lost
        (a deletion under way is not one), invisible to ``list``. ``create``
        with their labels makes them again over their files. Sorted."""
        return sorted(
            name for name, path in journal_directories(self.root)
            if not os.path.exists(os.path.join(path, SPEC_FILE))
            and not os.path.exists(os.path.join(path, DELETING_FILE))
            and journal_data(path)
        )

    def head(self, name: str) -> int:
        """The journal's committed end offset: where the next append begins."""
        jd = self._dir(name)
        fd = open_commit(jd)
        try:
            return read_record(jd, fd).end
        finally:
            os.close(fd)

    def fragments(self, name: str) -> builtins.list[Fragment]:
        """The journal's fragments in offset order, the open one last.

        Sealed fragment files hold exactly ``[begin, end)``. The open fragment
        (``sealed`` False) is listed when it holds committed bytes: only its
        first ``end - begin`` bytes are committed; bytes after them must not
        be read. Readers of the files (e.g. Spark) should open the file, then
        read at most that many bytes; a sealed or removed file stays readable
        once opened."""
        jd = self._dir(name)
        fd = open_commit(jd)
        try:
            while True:
                before = read_record(jd, fd)
                listing = scan(jd)
                rec = read_record(jd, fd)
                # Commits only move the end; a seal moves the open fragment's
                # begin, and then the listing may miss the new sealed file.
                if rec.begin == before.begin:
                    break
        finally:
            os.close(fd)
        out = [f for f in listing.sealed if f.end <= rec.end]
        if rec.end > rec.begin and not any(f.begin == rec.begin for f in out):
            path = open_fragment_path(jd, rec)
            with contextlib.suppress(FileNotFoundError):
                mtime = os.stat(path).st_mtime
                out.append(Fragment(name, rec.begin, rec.end, path, False, mtime))
        return out

    def offset_since(self, name: str, when: float | datetime) -> int:
        """Where to replay from to see everything written since ``when``.

        The begin offset of the first fragment last written at or after
        ``when`` (seconds since the epoch, or a datetime), else the committed
        end. Like Gazette's ``begin_mod_time``, it works at fragment
        granularity, so the replay may start somewhat before ``when``."""
        cutoff = when.timestamp() if isinstance(when, datetime) else float(when)
        for f in self.fragments(name):
            if f.mtime >= cutoff:
                return f.begin
        return self.head(name)

    def trim(
        self,
        name: str,
        *,
        before_offset: int | None = None,
        older_than: float | timedelta | None = None,
    ) -> int:
        """Retention: remove sealed fragments from the start of the journal.

        Removes, oldest first, each sealed fragment that ends at or before
        ``before_offset`` and/or was last written more than ``older_than``
        (seconds, or a timedelta) ago; with both, a fragment must meet both.
        Stops at the first fragment to keep, so the journal stays contiguous,
        and never touches the open fragment (``seal()`` it first to trim it).
        Returns the first offset still readable. Readers asked for a removed
        offset continue at the next available one (logging a warning)."""
        age = age_seconds(before_offset, older_than)
        jd = self._dir(name)
        with locked(jd):
            if not os.path.exists(jd.spec_path):
                raise JournalNotFoundError(name)
            cutoff = time.time() - age if age is not None else None
            listing = scan(jd)
            removed = 0
            for f in listing.sealed:
                if before_offset is not None and f.end > before_offset:
                    break
                if cutoff is not None and f.mtime >= cutoff:
                    break
                removed += 1
            gone, kept = listing.sealed[:removed], listing.sealed[removed:]
            if gone:
                # Recorded first: a fragment missing above the recorded start
                # is a loss, and no reader may take one removed here for one.
                start = read_start(jd)
                if start is None or gone[-1].end > start:
                    write_start(jd, gone[-1].end)
                for f in gone:
                    remove_sums(jd, f.begin, f.end)  # First: a fragment may lack them.
                    os.unlink(f.path)
                fsync_dir(jd.path)
            if kept:
                return kept[0].begin
            fd = open_commit(jd)
            try:
                return read_record(jd, fd).begin
            finally:
                os.close(fd)

    def seal(self, name: str) -> Fragment | None:
        """Seal the open fragment now, if it holds committed bytes; return it."""
        jd = self._dir(name)
        fd = open_lock(jd)
        try:
            commit_fd = open_commit(jd, write=True)
            try:
                rec, open_fd = recover(jd, commit_fd)
                if open_fd is None:
                    return None
                try:
                    if rec.end == rec.begin:
                        return None
                    seal(jd, commit_fd, open_fd, rec)
                finally:
                    os.close(open_fd)
            finally:
                os.close(commit_fd)
        finally:
            unlock(fd)
        for f in self.fragments(name):
            if f.begin == rec.begin and f.sealed:
                return f
        return None  # Trimmed already by someone else.

    def verify(self, name: str) -> builtins.list[Fragment]:
        """Check that fragments hold every committed offset from the first
        kept one on (none missing from the middle, the open fragment there
        while it holds committed bytes: pieces moved to quarantine by a
        repair count as held), every sealed fragment's size and SHA-1
        against its name, that the open fragment holds its committed
        bytes, and every batch of appends against its checksum. Raises
        ``CorruptJournalError`` naming the first bad file (and the offsets
        missing or damaged), as a reader meets it; returns the fragments.
        ``exactly fsck`` checks all this and more (``check``)."""
        jd = self._dir(name)
        return verify_journal(jd, lambda: self.fragments(name), self._verify_fragment)

    def check(self, name: str, *, repair: bool = False) -> builtins.list[JournalProblem]:
        """Check every file of journal ``name``: the commit record, each sealed
        fragment (size and SHA-1), the open fragment, fragments missing
        between kept ones, files that do not belong. Returns the problems
        found (empty: all is well).

        With ``repair``, under the journal's lock, makes the journal readable
        and writable again while keeping every intact byte: damaged pieces
        are moved to quarantine files beside the journal, never deleted, and
        readers skip their offsets with a warning; offsets are never given
        out again. Each problem then says what was done (``.repair``)."""
        return check_journal(self._dir(name), repair=repair)

    def quarantined(self, name: str) -> builtins.list[str]:
        """Paths of the journal's quarantine files (damaged bytes moved aside), sorted."""
        return builtins.list(quarantine_files(self._dir(name)))

    # JournalClient -----------------------------------------------------------

    def append(self, name: str, data: bytes | bytearray | memoryview) -> Future[AppendResult]:
        """Queue ``data`` for appending; the future resolves once it is durable.

        Raises at once (changing nothing) for a closed store, an invalid or
        unknown journal, or data over ``max_append_size``."""
        if not isinstance(data, bytes):
            data = bytes(data)  # A caller's bytearray may change after we return.
        if len(data) > self.max_append_size:
            raise AppendTooLargeError(name, len(data), self.max_append_size)
        while True:
            # Lock-free fast path: a dict lookup is atomic, and a writer that
            # is stopped (store closed, journal deleted) refuses the append.
            writer = self._writers.get(name)
            if writer is None:
                writer = self._writer(name)
            try:
                return writer.submit(data)
            except JournalClosedError:
                self._check_open()
                # The writer was retired by a concurrent delete(): look again.
                if self._writers.get(name) is writer:
                    raise

    def _writer(self, name: str) -> JournalWriter:
        with self._lock:
            self._check_open()
            writer = self._writers.get(name)
        if writer is not None:
            return writer
        jd = self._dir(name)
        if not os.path.exists(jd.spec_path):
            raise JournalNotFoundError(name)
        watch = self._watcher.get(jd.path)
        with self._lock:
            self._check_open()
            writer = self._writers.get(name)
            if writer is None:
                writer = self._writers[name] = JournalWriter(
                    jd, fragment_size=self.fragment_size, on_commit=watch.notify
                )
            return writer

    def read(
        self, name: str, offset: int = 0, end_offset: int | None = None, *, block: bool = False
    ) -> LocalJournalReader:
        """A reader of ``[offset, end_offset)`` of the journal (see ``JournalReader``).

        ``offset=-1`` starts at the committed end. A non-blocking read past
        the committed end raises ``OffsetNotYetAvailableError``."""
        self._check_open()
        return open_reader(self._services(), self._dir(name), offset, end_offset, block)

    # Transient messages (journal/_local/transient.py) -----------------------------

    def emit(self, name: str, data: bytes | bytearray | memoryview) -> int:
        """Hand ``data`` — whole frames of the journal's framing, at most 64
        KiB — to every follower of journal ``name`` listening now
        (``listen``), in any process of this machine's user that has the
        store open; never stored, never in a later read, never counted in
        offsets. Returns how many listeners take it. Never waits for a
        listener: the journal's latest emits (``RING_SIZE`` bytes) wait for
        each in shared memory, and one that falls further behind loses the
        oldest (and counts them in its ``lost``). It follows every append
        that completed before the call."""
        self._check_open()
        return self._emitters.emit(name, bytes(data), self._dir)

    def listen(self, name: str) -> TransientListener:
        """Start receiving the emits of journal ``name``: a
        ``TransientListener``, from which ``take()`` the emits made since
        (one that falls more than ``RING_SIZE`` bytes of emits behind loses
        the oldest, and counts them). Its ``read()`` gives a following reader
        that stops waiting when an emit can be handed out. Close it when
        done."""
        from .transient import TransientListener, meeting_place

        self._check_open()
        jd = self._dir(name)
        read_spec(jd)
        services = self._services()

        def reader(
            listener: TransientListener, offset: int, end_offset: int | None
        ) -> LocalJournalReader:
            self._check_open()
            return open_reader(services, jd, offset, end_offset, True, listener)

        place = meeting_place(self._real_root, name)
        try:
            return TransientListener(
                name, place, wake=self._watcher.get(jd.path).notify, reader=reader
            )
        except OSError as err:
            raise JournalError(
                f"cannot listen to {name!r}: {err} (emits go through {place})"
            ) from err

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every append issued so far is resolved. Raises
        ``TimeoutError`` after ``timeout`` seconds, and ``JournalError``
        (chained to the first failure) if any of those appends failed."""
        with self._lock:
            writers = builtins.list(self._writers.values())
        flush_queues(writers, timeout)

    def close(self) -> None:
        """Finish pending appends (their futures report any failure), stop the
        writer threads, and wake following readers (their reads return b"")."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writers = builtins.list(self._writers.values())
        for w in writers:
            w.stop()
        self._emitters.close()
        self._watcher.close()

    @property
    def closed(self) -> bool:
        return self._closed


    # Internals -----------------------------------------------------------------

    def _dir(self, name: str) -> JournalDir:
        return journal_dir(self.root, self._real_root, name)

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosedError(repr(self))

    def _services(self) -> StoreServices:
        """What this store's readers need of it (see ``StoreServices``)."""
        return StoreServices(self._watcher, self._verify_fragment, lambda: self._closed,
                             self._warn_damaged_record, self.verify_checksums)

    def _warn_damaged_record(self, jd: JournalDir, rec: CommitRecord) -> None:
        """A reader found the commit slot beside the newest valid one damaged:
        say so once (per journal and record, per store); the next writer moves
        the bytes it may have covered to quarantine."""
        key = (jd.name, rec.seq)
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        try:
            extra = os.stat(open_fragment_path(jd, rec)).st_size - (rec.end - rec.begin)
        except OSError:
            extra = 0
        if extra > 0:
            LOG.warning(
                "journal %s: the newest commit record is damaged: bytes [%d, %d) past the"
                " last valid record (an append that may have been acknowledged) are not"
                " readable; the next append, or exactly fsck --repair, moves them to"
                " quarantine",
                jd.name,
                rec.end,
                rec.end + extra,
            )

    def _fsync_parents(self, jd: JournalDir) -> None:
        """Make a new journal's directories durable, from the root down."""
        path = jd.path
        while True:
            parent = os.path.dirname(path)
            fsync_dir(parent)
            if parent == self.root or len(parent) <= len(self.root):
                return
            path = parent

    def _verify_fragment(
        self, jd: JournalDir, frag: Fragment, fd: int, *, cached: bool = True
    ) -> None:
        """Raise ``CorruptJournalError`` unless the open file ``fd`` holds
        exactly the content its name claims: its size always, its SHA-1 too
        unless ``verify_fragments`` is off (once per file per store)."""
        self._fragment_checks.check(jd, frag, fd, sha1=self.verify_fragments or not cached,
                                    cached=cached)

    def _after_fork_in_child(self) -> None:
        """The child of a fork has none of our threads: start afresh (the
        parent's pending appends are the parent's business)."""
        for w in self._writers.values():
            w.forget_after_fork()
        self._lock = threading.Lock()
        self._fragment_checks = FragmentChecks()  # (its lock may be held by a thread gone)
        self._writers.clear()  # (the same dict: append's router reads it)
        self._emitters = Emitters(self._real_root)  # (its lock may be held by a thread gone)
        self._watcher.forget_after_fork()
        self._watcher = Watcher()
        weakref.finalize(self, self._watcher.close).atexit = False


def _initial_record() -> bytes:
    # Slot 0 holds seq 0 (open fragment at 0, nothing committed); slot 1 is
    # zeroed, hence invalid, until the first commit writes seq 1 there.
    return pack_slot(CommitRecord(0, 0, 0)) + bytes(len(pack_slot(CommitRecord(0, 0, 0))))
