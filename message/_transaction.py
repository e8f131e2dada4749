"""Transactions with durable ACK intents, and their recovery.

A transaction commits when its ACK intents are written to *every* journal it
published to. A crash half-way through writing them would leave some
journals committed and others not — so the intents are first made durable
in an :class:`IntentLog`, then written, then the log is cleared. On restart,
:meth:`IntentLog.recover` writes whatever intents the log still holds:
writing an ACK twice is harmless (the second one rolls back nothing).

::

    log = IntentLog("state/intents.json")
    log.recover(client)                     # finish a commit a crash cut short
    with Transaction(publisher, log) as txn:
        txn.publish(mapping, msg)
        ...
    # committed on a clean exit; aborted (roll-back ACKs written) on an exception
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import weakref
import zlib
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson

from journal import PendingAppends
from journal.durable import fsync_dir, overwrite_synced, write_all

from ._errors import IntentLogError
from ._interfaces import MappingFunc, Message
from ._publisher import AckIntent, Publisher

if TYPE_CHECKING:
    from journal import AppendResult, JournalClient, JournalStore

LOG = logging.getLogger("message")
#: What a transaction's publish, commit or abort raises once it ended.
ENDED = "the transaction is already committed or aborted"

_OPEN_WRITE = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)


class IntentLog:
    """A file holding ACK intents that must be written.

    ``save`` overwrites the file in place and fdatasyncs it: one fsync a
    commit. The file starts with a line ``EXACTLY-INTENTS 1 <length>
    <crc32>``, then the intents as JSON; bytes past the length (the tail of
    a longer earlier save) are not read. A crash during a save can leave a
    file whose body does not match its line: that save never finished, so
    none of its intents was written yet (a Transaction writes them only
    after ``save`` returns), and ``load`` gives none, with a warning.
    ``clear`` overwrites the line with one of length 0, without an fsync: if
    a power loss undoes that, the intents are written again on recovery,
    which is harmless. A log written whole by an earlier version (a JSON
    array, no line) loads as it did.

    The file stays open between saves, and never shrinks: a save is then
    one write and one ``fdatasync`` of its bytes alone (no metadata), in a
    single call (``journal.durable.overwrite_synced``). A file removed or
    replaced meanwhile is opened again. :meth:`close` closes it (a log no
    longer referenced closes it too).

    One log holds the commits of one producer at a time: two processes, or
    a process and a child it made by ``fork`` (which shares the open file),
    saving to one log overwrite each other's intents. A child makes a log
    of its own, at a path of its own.
    """

    #: The first bytes of a log's line.
    MAGIC = b"EXACTLY-INTENTS "
    #: The line of a cleared log: no intents.
    CLEARED = MAGIC + b"1 0 00000000\n"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._closer: weakref.finalize[..., Any] | None = None

    def save(self, intents: list[AckIntent]) -> None:
        """Durably record ``intents`` (replacing what the log held)."""
        body = orjson.dumps([
            {"journal": i.journal, "intent": base64.b64encode(i.intent).decode()}
            for i in intents
        ])
        data = b"%s1 %d %08x\n%s" % (self.MAGIC, len(body), zlib.crc32(body), body)
        if self._fd is not None and overwrite_synced(self._fd, self.path, data):
            return
        self.close()  # (not open yet, or its file was removed or replaced)
        fd = self._open()
        write_all(fd, data, 0)
        os.fdatasync(fd)

    def _open(self) -> int:
        """The log's file, opened for writing (created, durably, if absent)."""
        try:
            fd = os.open(self.path, _OPEN_WRITE)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, _OPEN_WRITE | os.O_CREAT, 0o644)
            try:
                fsync_dir(self.path.parent)  # the new file's name must be durable too
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd
        self._closer = weakref.finalize(self, os.close, fd)
        # Not at exit: a TransactionPipeline closed then still saves here
        # (the process's end closes the file).
        self._closer.atexit = False
        return fd

    def close(self) -> None:
        """Close the log's file (a later save opens it again)."""
        if self._closer is not None:
            self._closer()
        self._fd = self._closer = None

    def load(self) -> list[AckIntent]:
        """The intents the log holds (none if it is absent, cleared, or its
        last save was cut short)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        if data.startswith(self.MAGIC):
            head, _, rest = data.partition(b"\n")
            try:
                _, version, length, crc = head.split(b" ")
                size = int(length)
                whole = version == b"1" and len(rest) >= size and \
                    zlib.crc32(rest[:size]) == int(crc, 16)
            except ValueError:
                whole = False
            if not whole:
                LOG.warning("%s: its last save was cut short, before any of its intents"
                            " was written: nothing to write again", self.path)
                return []
            data = rest[:size]
        if not data:  # an empty file, or a cleared log (its line says length 0)
            return []
        try:
            return [
                AckIntent(str(d["journal"]), base64.b64decode(d["intent"], validate=True))
                for d in orjson.loads(data)
            ]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise IntentLogError(f"{self.path}: not an intent log: {exc}") from exc

    def clear(self) -> None:
        """Forget the intents: they are all written (see the class docstring)."""
        if self._fd is not None:
            os.pwrite(self._fd, self.CLEARED, 0)
            return
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(self.path, _OPEN_WRITE)
            try:
                if os.fstat(fd).st_size:
                    os.pwrite(fd, self.CLEARED, 0)
            finally:
                os.close(fd)

    def recover(self, client: JournalClient) -> int:
        """Write the intents left by a commit that did not finish; returns how many."""
        intents = self.load()
        if intents:
            write_intents(client, intents)
            self.clear()
        return len(intents)

    def remove(self) -> None:
        """Remove the log's file if it holds no intents (cleared: its last
        commit is done), for a user done with it; a log that still holds
        intents stays, for ``recover``."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            with open(self.path, "rb") as f:
                head = f.read(len(self.CLEARED))
            if not head or head == self.CLEARED:
                self.path.unlink()


class JournalIntentLog:
    """An intent log kept in a journal of its own, in the store of the
    journals it commits: whoever can reach the store can finish a commit that
    a crash cut short — on a Gazette cluster, any host, with nothing on the
    local disk. Same methods as :class:`IntentLog`.

    ``save`` creates journal ``name`` (NDJSON) and appends the intents as one
    record, durable once the append resolves; ``clear`` deletes the journal.
    A journal that exists therefore holds a commit not known to be finished,
    and :meth:`recover_all` finds every one under a prefix with one listing.
    """

    #: The label that marks intent-log journals (value ``"intents"``).
    LABEL = "exactly.state"

    def __init__(self, client: JournalStore, name: str) -> None:
        self.client = client
        self.name = name

    def save(self, intents: list[AckIntent]) -> None:
        """Durably record ``intents`` (replacing what the log held)."""
        self.client.create(
            self.name, {"content-type": "application/x-ndjson", self.LABEL: "intents"}
        )
        record = [[i.journal, base64.b64encode(i.intent).decode()] for i in intents]
        self.client.append(self.name, orjson.dumps(record) + b"\n").result()

    def load(self) -> list[AckIntent]:
        """The intents of the last record (none if the log does not exist)."""
        from journal import JournalNotFoundError

        try:
            with self.client.read(self.name) as r:
                data = r.read()
        except JournalNotFoundError:
            return []
        lines = data.splitlines()
        if not lines:
            return []
        try:
            return [AckIntent(str(j), base64.b64decode(b, validate=True))
                    for j, b in orjson.loads(lines[-1])]
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise IntentLogError(f"journal {self.name}: not an intent log: {exc}") from exc

    def clear(self) -> None:
        """Forget the intents: they are all written."""
        from journal import JournalNotFoundError

        with contextlib.suppress(JournalNotFoundError):
            self.client.delete(self.name)

    def recover(self, client: JournalClient | None = None) -> int:
        """Write the intents left by a commit that did not finish; returns how many."""
        intents = self.load()
        if intents:
            write_intents(client or self.client, intents)
        self.clear()
        return len(intents)

    @classmethod
    def recover_all(cls, client: JournalStore, prefix: str) -> int:
        """Finish every commit whose log is a journal under ``prefix`` (which
        ends in ``/``); returns how many intents were written."""
        selector = f"prefix={prefix},{cls.LABEL}=intents"
        return sum(cls(client, spec.name).recover() for spec in client.list(selector))


def append_intents(client: JournalClient, intents: list[AckIntent]) -> list[Future[AppendResult]]:
    """Append each intent to its journal; their futures."""
    return [client.append(i.journal, i.intent) for i in intents]


def write_intents(client: JournalClient, intents: list[AckIntent]) -> list[AppendResult]:
    """Append each intent to its journal and wait until all are durable."""
    return [f.result() for f in append_intents(client, intents)]


class CommitsOnExit:
    """A transaction as a ``with`` block: committed on a clean exit, aborted
    on an exception, left alone if it already ended (``ended``)."""

    @property
    def ended(self) -> bool:
        """True once the transaction was committed or aborted."""
        raise NotImplementedError

    def commit(self) -> object:
        raise NotImplementedError

    def abort(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.ended:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class Transaction(CommitsOnExit):
    """Publishes messages uncommitted, then commits them all at once (or none).

    On a clean exit of the ``with`` block (or :meth:`commit`), it waits for
    the messages to be durable, builds the ACK intents, saves them to the
    ``log`` (when given), writes them, and clears the log. If a message could
    not be appended, the commit raises that error instead, after writing
    roll-back ACKs. On an exception in the block (or :meth:`abort`) it writes
    roll-back ACKs, so that readers drop the messages at once instead of
    waiting for an ACK that will never come. Its memory does not grow with
    its size: it keeps only the appends not yet done.
    """

    def __init__(
        self, publisher: Publisher, log: IntentLog | JournalIntentLog | None = None
    ) -> None:
        self.publisher = publisher
        self.log = log
        # Its messages' appends, until they are durable (or one failed):
        # publish_uncommitted made to keep each future there.
        self._appends = PendingAppends()
        self._publish = self._appends.recorder(publisher.publish_uncommitted)
        # The instance's publish is the recorder itself: no Python call per
        # message. Closed when the transaction ends, so that a publish bound
        # before then raises after it too (see the method below). A subclass
        # that overrides publish keeps its own.
        if type(self).publish is Transaction.publish:
            self.publish = self._publish  # type: ignore[method-assign]

    @property
    def client(self) -> JournalClient:
        return self.publisher.client

    def publish(self, mapping: MappingFunc, msg: Message) -> Future[AppendResult]:
        """Publish ``msg`` as part of the transaction (``RuntimeError`` once
        it ended). An instance's ``publish`` is its recorder of the
        publisher's ``publish_uncommitted``, which does this."""
        return self._publish(mapping, msg)

    def _end(self) -> None:
        if self._publish.closed:
            raise RuntimeError(ENDED)
        self._publish.close(ENDED)

    def commit(self) -> list[AckIntent]:
        """Make the transaction's messages visible to read-committed readers."""
        self._end()
        try:
            self._appends.settle()  # the messages must be durable before their ACKs are
        except BaseException:
            # Not all of it was written: it cannot commit. Roll back what
            # was, so that readers do not wait for it (if the client still
            # works), and report why.
            with contextlib.suppress(Exception):
                write_intents(self.client, self.publisher.build_rollback_intents())
            raise
        intents = self.publisher.build_ack_intents()
        if self.log is not None:
            self.log.save(intents)
        write_intents(self.client, intents)
        if self.log is not None:
            self.log.clear()
        return intents

    def abort(self) -> list[AckIntent]:
        """Roll the transaction back: readers discard its messages."""
        self._end()
        with contextlib.suppress(Exception):  # a failed append needs no roll-back
            self._appends.settle()
        intents = self.publisher.build_rollback_intents()
        write_intents(self.client, intents)
        return intents

    @property
    def ended(self) -> bool:
        """True once :meth:`commit` or :meth:`abort` was called."""
        return self._publish.closed
