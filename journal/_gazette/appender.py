"""Appends to a Gazette journal: each batch of the queue is one Append RPC.

An Append RPC is atomic: its content lands contiguously, or not at all.
The stream is the request (journal, ...), then content chunks, then an
empty chunk that commits it; a stream that ends without the empty chunk is
rolled back by the broker, so a batch is never torn. The broker answers
with the committed span ``[begin, end)``, from which each append's offsets
follow.

Failures are retried with backoff, against the journal's primary as the
brokers route it: a batch whose RPC failed before its answer arrived may
have been committed anyway, so it may land twice (at-least-once; readers'
Sequencers drop the duplicates), but always whole.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate, islice
from typing import TYPE_CHECKING, Final, cast

import grpc

from .._append_queue import AppendQueue, BatchLanded
from .._errors import BrokerError, JournalError
from . import broker_pb2 as pb
from .brokers import MAX_CHUNK, ROUTING_STATUSES, Brokers, RerouteSignal, Stub, status_error

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class GazetteAppender(AppendQueue):
    """The append queue of one journal of a ``GazetteClient``.

    A batch's RPC is sent asynchronously: while the brokers replicate and
    commit it, this thread resolves the futures of the batch before (see
    ``AppendQueue._overlap``). The next batch is sent only once this one is
    committed, so batches land in order even when one must be retried."""

    _overlap = True
    client_kind = "gazette"

    def __init__(self, journal: str, brokers: Brokers, *, max_batch_bytes: int) -> None:
        super().__init__(journal, max_batch_bytes=max_batch_bytes)
        self._brokers = brokers

    def _start_batch(self, data: list[bytes]) -> Callable[[], BatchLanded]:
        journal = self.journal
        endpoint = self._brokers.pick(journal, primary=True)
        try:
            stub = self._brokers.stub(endpoint)
            call = stub.append.future(
                _requests(journal, data), timeout=self._brokers.rpc_timeout,
                metadata=stub.append_metadata(journal),
            )
        except grpc.RpcError:
            return lambda: self._write_batch(data)

        def outcome() -> BatchLanded:
            try:
                resp = call.result()
            except grpc.RpcError:
                return self._write_batch(data)  # The retry loop decides what comes next.
            if resp.HasField("header"):
                self._brokers.learn(journal, resp.header.route)
            if resp.status != pb.OK:
                return self._write_batch(data)
            self._brokers.mark_up(endpoint)
            return self._results(data, resp.commit)

        return outcome

    def _write_batch(self, data: list[bytes]) -> BatchLanded:
        journal = self.journal

        def attempt(stub: Stub, endpoint: str) -> pb.Fragment | None:
            resp = stub.append(_requests(journal, data), timeout=self._brokers.rpc_timeout,
                               metadata=stub.append_metadata(journal))
            if resp.HasField("header"):
                self._brokers.learn(journal, resp.header.route)
            if resp.status == pb.OK:
                return cast(pb.Fragment, resp.commit)
            if resp.status in ROUTING_STATUSES:
                raise RerouteSignal(resp.status)  # the route learned above says where next
            raise status_error(resp.status, journal, endpoint, resp.store_health_error)

        try:
            commit = self._brokers.call(f"append to {journal!r}", journal, attempt, primary=True)
        except JournalError as err:
            return 0, 0, err
        except grpc.RpcError as err:  # A non-transient gRPC failure.
            return 0, 0, BrokerError(
                f"append to {journal!r} failed: {err}", status="UNKNOWN", journal=journal
            )
        return self._results(data, commit)

    def _results(self, data: list[bytes], commit: pb.Fragment) -> BatchLanded:
        journal = self.journal
        size = sum(map(len, data))
        if commit.end - commit.begin != size:
            return 0, 0, BrokerError(
                f"append to {journal!r}: the broker committed [{commit.begin}, {commit.end}),"
                f" {commit.end - commit.begin} bytes, for an append of {size}",
                status="OK", journal=journal,
            )
        return commit.begin, len(data), None


def _requests(journal: str, data: list[bytes]) -> Iterator[bytes]:
    """The Append RPC's messages, serialized: the request, the content
    chunks, and the empty chunk that commits."""
    yield pb.AppendRequest(journal=journal).SerializeToString()
    yield from content_messages(data)
    yield b""  # An empty AppendRequest: commit.


# An AppendRequest holding only content is field 4 (bytes): the tag byte
# 0x22, the length as a varint, then the bytes. Writing that header in the
# same join that gathers the appends makes each chunk with one copy, and no
# protobuf message object (which would copy the bytes again).
_CONTENT_TAG: Final = b"\x22"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def content_messages(data: list[bytes], limit: int = MAX_CHUNK) -> Iterator[bytes]:
    """Serialized content-only AppendRequests carrying ``data``'s bytes in
    order, each of about ``limit`` bytes: appends are gathered whole, and
    only an append larger than ``limit`` is split (the broker refuses
    messages over a few MiB; the RPC keeps the append atomic anyway)."""
    ends = list(accumulate(map(len, data)))
    i, n, base = 0, len(data), 0
    while i < n:
        j = bisect_right(ends, base + limit, i)
        if j == i:  # data[i] alone is larger than limit: split it.
            view = memoryview(data[i])
            for k in range(0, len(view), limit):
                piece = view[k : k + limit]
                yield b"".join((_CONTENT_TAG, _varint(len(piece)), piece))
            base, i = ends[i], i + 1
            continue
        size = ends[j - 1] - base
        if size:
            yield b"".join([_CONTENT_TAG, _varint(size), *islice(data, i, j)])
        base, i = ends[j - 1], j
