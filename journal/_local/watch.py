"""Wake-ups for following readers: in-process notifications plus inotify.

Each journal directory has a ``Watch``: a generation counter under a
Condition. A reader reads the counter, looks for data, and if there is none
waits until the counter moves, so no wake-up is lost between the look and
the wait. The counter moves when:

* a writer of this process commits (it calls ``notify`` directly), and
* on Linux, when inotify reports a change of the journal's ``@commit`` file,
  whoever made it: another process, or this one. One inotify instance per
  store serves all of its journals: instances are scarce (128 per user by
  default), so one per reader would not scale.

Without inotify (another OS, or no instance left) readers re-check every
``POLL_INTERVAL`` seconds; with it, every ``SAFETY_INTERVAL`` seconds in
case an event was missed (e.g. a journal deleted and created again).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import sys
import threading
from dataclasses import dataclass, field
from typing import Final

from .fragment import COMMIT_FILE

LOG: Final = logging.getLogger("journal")

POLL_INTERVAL: Final = 0.01
SAFETY_INTERVAL: Final = 1.0

# From <sys/inotify.h>.
_IN_MODIFY: Final = 0x00000002
_IN_CREATE: Final = 0x00000100
_IN_MOVED_TO: Final = 0x00000080
_IN_DELETE: Final = 0x00000200
_IN_DELETE_SELF: Final = 0x00000400
_IN_MOVE_SELF: Final = 0x00000800
_IN_Q_OVERFLOW: Final = 0x00004000
_IN_IGNORED: Final = 0x00008000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = 0o2000000
_MASK: Final = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_COMMIT_NAME: Final = COMMIT_FILE.encode()


@dataclass(slots=True, eq=False)
class Watch:
    """The change counter of one journal directory within one store."""

    path: str
    cond: threading.Condition = field(default_factory=threading.Condition)
    gen: int = 0
    readers: int = 0
    wd: int | None = None
    closed: bool = False

    def notify(self) -> None:
        with self.cond:
            self.gen += 1
            self.cond.notify_all()

    def token(self) -> int:
        with self.cond:
            return self.gen

    def wait(self, token: int, timeout: float) -> bool:
        """Wait until ``gen`` moves past ``token`` or ``timeout``; False once closed."""
        with self.cond:
            if self.closed:
                return False
            if self.gen == token:
                self.cond.wait(timeout)
            return not self.closed


class _Inotify:
    """A thin ctypes binding of inotify (Linux only)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._add.restype = ctypes.c_int
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = (ctypes.c_int, ctypes.c_int)
        self._rm.restype = ctypes.c_int
        init = libc.inotify_init1
        init.argtypes = (ctypes.c_int,)
        init.restype = ctypes.c_int
        fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd

    def add(self, path: str) -> int:
        wd = int(self._add(self.fd, os.fsencode(path), _MASK))
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return wd

    def rm(self, wd: int) -> None:
        self._rm(self.fd, wd)  # Fails harmlessly if the kernel already dropped it.

    def close(self) -> None:
        os.close(self.fd)


class Watcher:
    """The ``Watch`` of each journal directory of a store, fed by inotify."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, Watch] = {}
        self._by_wd: dict[int, Watch] = {}
        self._inotify: _Inotify | None = None
        self._inotify_failed = not sys.platform.startswith("linux")
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._closed = False

    @property
    def interval(self) -> float:
        """How long a reader waits before re-checking on its own."""
        return POLL_INTERVAL if self._inotify is None else SAFETY_INTERVAL

    def get(self, path: str) -> Watch:
        """The watch of ``path`` (no subscription: for writers to notify)."""
        with self._lock:
            w = self._watches.get(path)
            if w is None:
                w = self._watches[path] = Watch(path, closed=self._closed)
            return w

    def subscribe(self, path: str) -> Watch:
        """The watch of ``path``, with inotify events delivered to it until
        ``unsubscribe``. Call before looking for data, so no event is missed."""
        w = self.get(path)
        with self._lock:
            w.readers += 1
            if w.wd is None and not self._closed:
                self._add_watch(w)
        return w

    def refresh(self, w: Watch) -> None:
        """Re-add a watch the kernel dropped (the directory was removed)."""
        with self._lock:
            if w.wd is None and w.readers and not self._closed and self._inotify is not None:
                self._add_watch(w)

    def unsubscribe(self, w: Watch) -> None:
        with self._lock:
            w.readers -= 1
            if w.readers == 0 and w.wd is not None and self._inotify is not None:
                self._by_wd.pop(w.wd, None)
                self._inotify.rm(w.wd)
                w.wd = None

    def close(self) -> None:
        """Stop the inotify thread and make every wait return False."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watches = list(self._watches.values())
            thread = self._thread
        for w in watches:
            with w.cond:
                w.closed = True
                w.cond.notify_all()
        if thread is not None:
            os.write(self._wake_w, b"x")
            if thread is not threading.current_thread():  # E.g. a finalizer run by GC there.
                thread.join()
        with self._lock:
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
            self._by_wd.clear()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's descriptors without touching
        its inotify queue (reading it here would steal the parent's events)."""
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        if self._inotify is not None:
            os.close(self._inotify.fd)
        # Never touch those descriptor numbers again: they may be reused.
        self._wake_r = self._wake_w = -1
        self._inotify = None
        self._thread = None
        self._closed = True

    # Internals (called with self._lock held) ----------------------------

    def _add_watch(self, w: Watch) -> None:
        if self._inotify is None:
            if self._inotify_failed:
                return
            try:
                self._inotify = _Inotify()
            except (OSError, AttributeError) as err:
                # AttributeError: a libc without inotify symbols.
                LOG.debug("inotify unavailable, readers will poll: %s", err)
                self._inotify_failed = True
                return
            self._wake_r, self._wake_w = os.pipe()
            self._thread = threading.Thread(target=self._run, name="journal-inotify", daemon=True)
            self._thread.start()
        try:
            wd = self._inotify.add(w.path)
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENOSPC):
                raise
            # No such directory (yet), or no watch left: this reader polls.
            return
        w.wd = wd
        self._by_wd[wd] = w

    def _run(self) -> None:
        assert self._inotify is not None
        fd = self._inotify.fd
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {f for f, _ in poller.poll()}
            if self._wake_r in ready:
                return
            try:
                buf = os.read(fd, 64 * 1024)
            except BlockingIOError:
                continue
            self._dispatch(buf)

    def _dispatch(self, buf: bytes) -> None:
        hit: set[Watch] = set()
        with self._lock:
            pos = 0
            while pos + _EVENT.size <= len(buf):
                wd, mask, _cookie, size = _EVENT.unpack_from(buf, pos)
                name = buf[pos + _EVENT.size : pos + _EVENT.size + size].rstrip(b"\0")
                pos += _EVENT.size + size
                if mask & _IN_Q_OVERFLOW:
                    hit.update(self._by_wd.values())  # Events were lost: wake everyone.
                    continue
                w = self._by_wd.get(wd)
                if w is None:
                    continue
                if mask & _IN_IGNORED:
                    # The kernel dropped the watch (directory removed).
                    self._by_wd.pop(wd, None)
                    w.wd = None
                    hit.add(w)
                elif name == _COMMIT_NAME or mask & (_IN_DELETE_SELF | _IN_MOVE_SELF):
                    hit.add(w)
        for w in hit:
            w.notify()
