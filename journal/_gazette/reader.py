"""``GazetteReader``: a journal of a Gazette cluster as a readable stream.

A Read RPC answers with a stream of messages of two kinds: *metadata* (the
fragment that holds the requested offset, the journal's write head, and for
a fragment already persisted to a fragment store, its URL) followed by
*chunks* of that fragment's content. A non-blocking read ends with status
``OFFSET_NOT_YET_AVAILABLE`` at the write head; a blocking one waits for
further appends.

Reads ask brokers not to proxy persisted fragments (``do_not_proxy``): a
broker answers with the fragment's URL and ends the stream, and the reader
reads the fragment from its store itself (fragments.py: a ``file://`` store
mounted at the client's ``file_root``, or a cloud store's signed URL), then
asks the broker again from the fragment's end. A fragment the reader cannot
open or decode here is read through a broker instead, and so is the rest of
that reader's journal.

Offsets jump forward when the broker answers with a later offset than asked
for (the bytes were removed from the fragment store by retention); the jump
is logged, as for the other clients.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import IO, TYPE_CHECKING, Final, final

import grpc

from .._errors import BrokerError, JournalError
from .._reader import JournalStream, warn_jump
from . import broker_pb2 as pb
from .brokers import (
    TRANSIENT,
    Brokers,
    backoff,
    describe,
    refusal,
    rpc_error,
    status_error,
)
from .fragments import open_fragment

if TYPE_CHECKING:
    from collections.abc import Callable

    from _typeshed import WriteableBuffer

LOG: Final = logging.getLogger("journal")

# read1() with no size reads at most this much.
_READ1_DEFAULT: Final = 64 * 1024


@final
class GazetteReader(JournalStream):
    """A reader of ``[offset, end_offset)`` of one journal of a cluster.

    Made by ``GazetteClient.read``. Same contract as every ``JournalReader``:
    ``read(n)`` returns 1 to ``n`` bytes, or ``b""`` at the end (the end
    offset, or for a non-blocking reader the write head at the time of the
    call); ``offset`` is the journal offset of the next byte; ``close()``
    from another thread releases a blocked read, which returns ``b""``.
    """

    def __init__(
        self,
        on_close: Callable[[GazetteReader], None],
        brokers: Brokers,
        journal: str,
        offset: int,
        end_offset: int | None,
        block: bool,
        file_root: str | None,
        direct: bool = True,
    ) -> None:
        super().__init__(journal, offset, end_offset, block)
        self._on_close = on_close  # the client forgets its open readers
        self._brokers = brokers
        self._file_root = file_root
        # Ask brokers for the URLs of persisted fragments and read those
        # from their store (see fragments.py); False once one could not be.
        self._direct_ok = direct
        #: Persisted fragments this reader read from their store, not a broker.
        self.direct_fragments = 0
        self._lock = threading.Lock()  # Guards _call against close().
        self._call: grpc.Call | None = None
        self._stream: object = None  # The call's iterator of ReadResponse.
        self._endpoint = brokers.address
        # The current content chunk, and how much of it was read already.
        self._chunk = b""
        self._chunk_pos = 0
        # The last metadata: the fragment being read and its URL, if any.
        self._fragment: pb.Fragment | None = None
        self._fragment_url = ""
        self._direct: IO[bytes] | None = None  # A fragment file read directly.
        self._direct_end = 0
        self._at_head = False  # A non-blocking stream reached the write head.
        self._write_head: int | None = None  # As the last metadata or status said.
        self._primed_end = False  # prime() found the write head at the offset.
        self._closing = False
        self._failures = 0  # Attempts in a row that failed.
        # Brokers that lack content this reader needs (see _status).
        self._avoid: frozenset[str] = frozenset()
        # The broker the next attempt goes to, chosen by _status (the primary).
        self._ask: str | None = None
        self._retrying_since: float | None = None  # when attempts began to fail

    # The JournalReader protocol ------------------------------------------------

    def read(self, size: int = -1, /) -> bytes:
        """At least one and at most ``size`` bytes, or ``b""`` at the end.

        The broker's content chunks are handed out as they came when they
        fit, without a copy (readers ask for much more than one chunk)."""
        if size is None or size < 0:
            data = super().read(-1)
            return data if data is not None else b""
        self._check_open()
        return self._next_bytes(size) if size else b""

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        self._check_open()
        with memoryview(buffer) as view, view.cast("B") as mv:
            if len(mv) == 0:
                return 0
            data = self._next_bytes(len(mv))
            mv[: len(data)] = data
            return len(data)

    def close(self) -> None:
        """Release the reader; a read blocked in another thread returns b""."""
        if self.closed:
            return
        self._closing = True
        self._cancel()
        self._close_direct()
        self._on_close(self)
        super().close()

    # Reading -------------------------------------------------------------------

    def prime(self) -> int | None:
        """Start reading now (a non-blocking reader): the first answer says
        whether the journal exists and where its write head is, which this
        returns (None if the answer did not say)."""
        if not self._next_response():
            self._at_head = False  # The answer is fresh: the first read may trust it.
            self._primed_end = True
        return self._write_head

    def _next_bytes(self, size: int) -> bytes:
        """The next 1 to ``size`` bytes, or ``b""`` at the end."""
        if self._primed_end:
            self._primed_end = False
            return b""  # prime() just found the write head.
        if self._at_head:
            # The last call found the write head: start over, to see appends
            # made since (the head "at the time of the call").
            self._at_head = False
        while not self._closing:
            limit = size
            if self._end_offset is not None:
                limit = min(limit, self._end_offset - self._offset)
                if limit <= 0:
                    return b""
            if self._chunk:
                return self._take(limit)
            if self._direct is not None:
                data = self._read_direct(limit)
                if data:
                    return data
                continue
            if not self._next_response():
                return b""
        return b""

    def _take(self, size: int) -> bytes:
        """Up to ``size`` bytes of the current chunk (itself when it fits whole)."""
        chunk, pos = self._chunk, self._chunk_pos
        n = min(size, len(chunk) - pos)
        data = chunk if pos == 0 and n == len(chunk) else chunk[pos : pos + n]
        self._advance(n)
        return data

    def _advance(self, n: int) -> None:
        self._offset += n
        self._chunk_pos += n
        if self._chunk_pos == len(self._chunk):
            self._chunk, self._chunk_pos = b"", 0

    def _next_response(self) -> bool:
        """Take the next message of the Read RPC (starting one as needed);
        False at the end of a non-blocking read, or once closing."""
        if self._stream is None:
            self._start()
            if self._stream is None:
                return not self._closing
        try:
            resp: pb.ReadResponse = next(self._stream)  # type: ignore[call-overload]
        except StopIteration:
            return self._stream_ended()
        except grpc.RpcError as err:
            return self._failed(err)
        if resp.HasField("header"):
            self._brokers.learn(self._journal, resp.header.route)
        if resp.status != pb.OK:
            return self._status(resp)
        self._failures = 0
        self._retrying_since = None
        if self._avoid:
            self._avoid = frozenset()  # a broker served the read: start afresh next time
        self._brokers.mark_up(self._endpoint)
        if resp.offset > self._offset:
            if self._offset >= 0:
                warn_jump(self._journal, self._offset, resp.offset)
            self._offset = resp.offset
        if resp.content:
            if resp.offset != self._offset:
                raise BrokerError(
                    f"journal {self._journal!r}: the broker sent content at offset"
                    f" {resp.offset} for a read at {self._offset}",
                    status="OK", journal=self._journal, address=self._endpoint,
                )
            self._chunk, self._chunk_pos = resp.content, 0
        elif resp.HasField("fragment"):
            self._fragment = resp.fragment
            self._fragment_url = resp.fragment_url
            self._write_head = resp.write_head
        return True

    def _start(self) -> None:
        """Start a Read RPC at the current offset, on a broker of the journal."""
        self._close_call()
        direct = self._direct_ok
        request = pb.ReadRequest(
            journal=self._journal,
            offset=self._offset,
            block=self._block,
            do_not_proxy=direct,
            end_offset=self._end_offset or 0,
        )
        endpoint = self._ask or self._brokers.pick(self._journal, primary=False, avoid=self._avoid)
        self._ask = None
        self._endpoint = endpoint
        with self._lock:
            if self._closing:
                return
            try:
                call = self._brokers.stub(endpoint).read(request)
            except grpc.RpcError as err:
                self._failed(err)
                return
            self._call = call
            self._stream = call
        self._fragment, self._fragment_url = None, ""

    def _stream_ended(self) -> bool:
        """The broker closed the stream without an error status."""
        self._stream = None
        fragment, url = self._fragment, self._fragment_url
        if self._end_offset is not None and self._offset >= self._end_offset:
            return False
        if (
            fragment is not None and url and self._direct_ok
            and fragment.begin <= self._offset < fragment.end
        ):
            stream = open_fragment(url, fragment, self._offset, self._file_root)
            if stream is not None:
                self._direct = stream
                self._direct_end = fragment.end
                self.direct_fragments += 1
                return True
            # The broker will not proxy it and we cannot open it: read
            # through the broker (without do_not_proxy) from now on.
            self._direct_ok = False
        return True  # A broker closed the stream (shutting down, reassigned...): start again.

    def _status(self, resp: pb.ReadResponse) -> bool:
        status = resp.status
        if status == pb.OFFSET_NOT_YET_AVAILABLE:
            self._write_head = resp.write_head
        if status == pb.OFFSET_NOT_YET_AVAILABLE and not self._block:
            self._close_call()
            if resp.write_head > self._offset:
                # Content exists but this broker does not hold it: a broker
                # newly assigned to the journal indexes older content only
                # once it is persisted. Ask another one (or this one later).
                self._avoid = self._avoid | {self._endpoint}
                self._retry(
                    f"{self._endpoint} does not hold offset {self._offset}"
                    f" (write head {resp.write_head})"
                )
                return True
            primary = self._brokers.primary_of(self._journal)
            if primary is not None and primary != self._endpoint:
                # A replica's write head may lag the primary's (one just
                # assigned to the journal after a failover): ask the primary
                # once, whose head says where the journal ends.
                self._ask = primary
                return True
            self._at_head = True
            self._avoid = frozenset()
            return False
        if status in (pb.NOT_JOURNAL_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS,
                      pb.NO_JOURNAL_PRIMARY_BROKER, pb.NOT_JOURNAL_PRIMARY_BROKER,
                      pb.OFFSET_NOT_YET_AVAILABLE):
            self._close_call()
            self._retry(status_error(status, self._journal, self._endpoint).args[0])
            return True
        self._close_call()
        raise status_error(status, self._journal, self._endpoint)

    def _failed(self, err: grpc.RpcError) -> bool:
        self._close_call()
        if self._closing:
            return False
        code = err.code() if isinstance(err, grpc.Call) else None
        refused = refusal(err, f"read of {self._journal!r}", self._journal, self._endpoint,
                          self._brokers.security)
        if refused is not None:
            raise refused
        # Brokers end a Read with UNKNOWN ("context canceled", ...) when the
        # journal moves or goes away; a new attempt finds out which.
        if code is not None and code not in TRANSIENT and code != grpc.StatusCode.UNKNOWN:
            raise rpc_error(err, f"read of {self._journal!r}", self._journal, self._endpoint)
        if code in TRANSIENT:
            self._brokers.mark_down(self._endpoint)
            self._brokers.forget(self._journal)
        self._retry(describe(err))
        return True

    def _retry(self, why: str) -> None:
        """Wait before the next attempt; give up past the retry deadline."""
        now = time.monotonic()
        if self._retrying_since is None:
            self._retrying_since = now
        if self._brokers.expired(self._retrying_since, now):
            raise self._brokers.unavailable(
                f"read of {self._journal!r}", self._journal, self._endpoint, why)
        delay = backoff(self._failures)
        self._failures += 1
        end = time.monotonic() + delay
        while not self._closing and time.monotonic() < end:
            time.sleep(min(0.05, delay))

    # Direct reads of persisted fragments ---------------------------------------

    def _read_direct(self, size: int) -> bytes:
        """Up to ``size`` bytes of the fragment file; b"" once it is read."""
        assert self._direct is not None
        want = min(size, self._direct_end - self._offset)
        try:
            data = self._direct.read(want) if want > 0 else b""
        except Exception as err:  # a damaged stored fragment: the broker may still serve it
            LOG.warning("journal %s: reading a fragment from its store failed at offset %d"
                        " (%s): reading on through a broker", self._journal, self._offset, err)
            self._close_direct()
            self._direct_ok = False
            return b""
        if data:
            self._offset += len(data)
            return data
        if self._offset < self._direct_end:
            self._close_direct()
            raise JournalError(
                f"journal {self._journal!r}: fragment file ends at offset {self._offset},"
                f" before its end {self._direct_end}"
            )
        self._close_direct()  # The fragment is read: ask the broker for what follows.
        return b""

    def _close_direct(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    # Calls ---------------------------------------------------------------------

    def _cancel(self) -> None:
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def _close_call(self) -> None:
        with self._lock:
            call, self._call, self._stream = self._call, None, None
        if call is not None:
            call.cancel()
        self._chunk, self._chunk_pos = b"", 0
