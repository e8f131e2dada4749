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

from itertools import accumulate, islice, repeat
from typing import TYPE_CHECKING, cast

import grpc

from .._append_queue import AppendQueue
from .._errors import BrokerError, JournalError
from .._spec import AppendResult
from . import broker_pb2 as pb
from .brokers import ROUTING_STATUSES, Brokers, Stub, chunks, status_error

if TYPE_CHECKING:
    from collections.abc import Iterator


class GazetteAppender(AppendQueue):
    """The append queue of one journal of a ``GazetteClient``."""

    def __init__(self, journal: str, brokers: Brokers, *, max_batch_bytes: int) -> None:
        super().__init__(journal, max_batch_bytes=max_batch_bytes)
        self._brokers = brokers

    def _write_batch(self, data: list[bytes]) -> tuple[list[AppendResult], BaseException | None]:
        journal = self.journal
        size = sum(map(len, data))

        def attempt(stub: Stub, endpoint: str) -> pb.Fragment | None:
            resp = stub.append(_requests(journal, data), timeout=self._brokers.rpc_timeout)
            if resp.HasField("header"):
                self._brokers.learn(journal, resp.header.route)
            if resp.status == pb.OK:
                return cast(pb.Fragment, resp.commit)
            if resp.status in ROUTING_STATUSES:
                return None  # The route learned above says where to go next.
            raise status_error(resp.status, journal, endpoint, resp.store_health_error)

        try:
            commit = self._brokers.call(f"append to {journal!r}", journal, attempt, primary=True)
        except JournalError as err:
            return [], err
        except grpc.RpcError as err:  # A non-transient gRPC failure.
            return [], BrokerError(
                f"append to {journal!r} failed: {err}", status="UNKNOWN", journal=journal
            )
        if commit.end - commit.begin != size:
            return [], BrokerError(
                f"append to {journal!r}: the broker committed [{commit.begin}, {commit.end}),"
                f" {commit.end - commit.begin} bytes, for an append of {size}",
                status="OK", journal=journal,
            )
        bounds = list(accumulate(map(len, data), initial=commit.begin))
        return list(map(AppendResult, repeat(journal), bounds, islice(bounds, 1, None))), None


def _requests(journal: str, data: list[bytes]) -> Iterator[pb.AppendRequest]:
    yield pb.AppendRequest(journal=journal)
    for chunk in chunks(data):
        yield pb.AppendRequest(content=chunk)
    yield pb.AppendRequest()  # The empty chunk: commit.
