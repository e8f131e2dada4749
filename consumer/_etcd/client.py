"""``EtcdClient``: etcd's KV and Lease services, called over one gRPC channel."""

from __future__ import annotations

import queue
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc

from journal import Closing

from .._errors import EtcdError
from . import etcd_pb2 as pb

#: How long one call may take before it fails (seconds), by default.
DEFAULT_TIMEOUT: Final = 5.0


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key of etcd as read: its ``value``, the ``revision`` that created it
    (``create_revision``), the last that changed it (``mod_revision``) and
    the lease it is attached to (0: none)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def prefix_end(prefix: str) -> bytes:
    """The end of etcd's range of the keys that begin with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b"\0"
    raw[-1] += 1
    return bytes(raw)


def _kv(kv: pb.KeyValue) -> KeyValue:
    return KeyValue(kv.key.decode(errors="replace"), kv.value, kv.create_revision,
                    kv.mod_revision, kv.lease)


def _target(address: str) -> tuple[str, bool]:
    """``http://host:port`` or ``https://host:port``: the gRPC target, and TLS."""
    url = urllib.parse.urlsplit(address.strip())
    if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/"):
        raise ValueError(
            f"etcd address {address!r}: give one URL as http://HOST:PORT or https://HOST:PORT")
    try:
        port = url.port or 2379
    except ValueError as exc:
        raise ValueError(f"etcd address {address!r}: {exc}") from exc
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{host}:{port}", url.scheme == "https"


class EtcdClient(Closing):
    """etcd's v3 API at ``address`` (``http://127.0.0.1:2379``; ``https://``
    with ``trusted_ca_file`` and, for mutual TLS, ``cert_file`` and
    ``cert_key_file``). Every call fails with ``EtcdError`` after ``timeout``
    seconds, or at once when etcd refuses it; none is retried here: the
    caller knows what a retry means for it."""

    def __init__(self, address: str, *, timeout: float = DEFAULT_TIMEOUT,
                 trusted_ca_file: str | None = None, cert_file: str | None = None,
                 cert_key_file: str | None = None) -> None:
        target, tls = _target(address)
        self.address = address.strip().rstrip("/")
        self.timeout = timeout
        if tls:
            def read(path: str | None) -> bytes | None:
                return None if path is None else Path(path).read_bytes()

            creds = grpc.ssl_channel_credentials(
                root_certificates=read(trusted_ca_file), private_key=read(cert_key_file),
                certificate_chain=read(cert_file))
            self._channel = grpc.secure_channel(target, creds)
        else:
            if trusted_ca_file or cert_file or cert_key_file:
                raise ValueError(f"etcd address {address!r}: certificates need https://")
            self._channel = grpc.insecure_channel(target)
        def unary(service: str, method: str, req: Any, resp: Any) -> Any:
            return self._channel.unary_unary(f"/etcdserverpb.{service}/{method}",
                                             request_serializer=req.SerializeToString,
                                             response_deserializer=resp.FromString)

        self._range = unary("KV", "Range", pb.RangeRequest, pb.RangeResponse)
        self._put = unary("KV", "Put", pb.PutRequest, pb.PutResponse)
        self._delete = unary("KV", "DeleteRange", pb.DeleteRangeRequest, pb.DeleteRangeResponse)
        self._txn = unary("KV", "Txn", pb.TxnRequest, pb.TxnResponse)
        self._grant = unary("Lease", "LeaseGrant", pb.LeaseGrantRequest, pb.LeaseGrantResponse)
        self._revoke = unary("Lease", "LeaseRevoke", pb.LeaseRevokeRequest,
                             pb.LeaseRevokeResponse)
        self._watch = self._channel.stream_stream(
            "/etcdserverpb.Watch/Watch",
            request_serializer=pb.WatchRequest.SerializeToString,
            response_deserializer=pb.WatchResponse.FromString)
        self._keepalive = self._channel.stream_stream(
            "/etcdserverpb.Lease/LeaseKeepAlive",
            request_serializer=pb.LeaseKeepAliveRequest.SerializeToString,
            response_deserializer=pb.LeaseKeepAliveResponse.FromString)

    def __repr__(self) -> str:
        return f"EtcdClient({self.address!r})"

    def _call(self, rpc: Any, request: Any, what: str) -> Any:
        try:
            return rpc(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc, what) from None

    def _error(self, exc: grpc.RpcError, what: str) -> EtcdError:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code == grpc.StatusCode.UNAVAILABLE:
            why = f"not reachable ({details})"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            why = f"no answer within {self.timeout:g} s"
        else:
            why = f"{details} ({code.name if code else 'error'})"
        return EtcdError(f"etcd at {self.address}: {what}: {why}",
                         code=code.name if code else "")

    # -- keys --------------------------------------------------------------------

    def get(self, key: str, *, prefix: bool = False) -> tuple[int, list[KeyValue]]:
        """The key (or every key that begins with it, ``prefix``), sorted by
        key, and the store's revision they were read at."""
        req = pb.RangeRequest(key=key.encode(), range_end=prefix_end(key) if prefix else b"")
        resp = self._call(self._range, req, f"reading {key!r}")
        return resp.header.revision, [_kv(kv) for kv in resp.kvs]

    def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Set ``key``; return the revision that set it."""
        resp = self._call(self._put, pb.PutRequest(key=key.encode(), value=value, lease=lease),
                          f"writing {key!r}")
        return int(resp.header.revision)

    def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete the key (or every key that begins with it); return how many were."""
        req = pb.DeleteRangeRequest(key=key.encode(),
                                    range_end=prefix_end(key) if prefix else b"")
        return int(self._call(self._delete, req, f"deleting {key!r}").deleted)

    def txn(self, compare: Sequence[pb.Compare], success: Sequence[pb.RequestOp],
            failure: Sequence[pb.RequestOp] = ()) -> pb.TxnResponse:
        """One etcd transaction: ``success`` if every ``compare`` holds, else
        ``failure``; the response says which (``succeeded``)."""
        req = pb.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))
        resp: pb.TxnResponse = self._call(self._txn, req, "a transaction")
        return resp

    # -- the pieces of a transaction ---------------------------------------------

    @staticmethod
    def absent(key: str) -> pb.Compare:
        """Holds while ``key`` does not exist."""
        return pb.Compare(key=key.encode(), target=pb.Compare.CREATE,
                          result=pb.Compare.EQUAL, create_revision=0)

    @staticmethod
    def leased(key: str, lease: int) -> pb.Compare:
        """Holds while ``key`` exists under ``lease``."""
        return pb.Compare(key=key.encode(), target=pb.Compare.LEASE,
                          result=pb.Compare.EQUAL, lease=lease)

    @staticmethod
    def created_at(key: str, revision: int) -> pb.Compare:
        """Holds while ``key`` is the one created at ``revision``."""
        return pb.Compare(key=key.encode(), target=pb.Compare.CREATE,
                          result=pb.Compare.EQUAL, create_revision=revision)

    @staticmethod
    def put_op(key: str, value: bytes, *, lease: int = 0) -> pb.RequestOp:
        return pb.RequestOp(request_put=pb.PutRequest(key=key.encode(), value=value,
                                                      lease=lease))

    @staticmethod
    def get_op(key: str) -> pb.RequestOp:
        return pb.RequestOp(request_range=pb.RangeRequest(key=key.encode()))

    @staticmethod
    def delete_op(key: str) -> pb.RequestOp:
        return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key.encode()))

    def watch(self, prefix: str, *, start_revision: int = 0) -> Watch:
        """Changes of the keys that begin with ``prefix``, from
        ``start_revision`` (0: from now): see ``Watch``."""
        return Watch(self._watch, prefix, start_revision, self._error, self.address)

    # -- leases ------------------------------------------------------------------

    def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease of ``ttl`` seconds: its ID and the TTL etcd gave it."""
        resp = self._call(self._grant, pb.LeaseGrantRequest(TTL=ttl), "granting a lease")
        if resp.error:
            raise EtcdError(f"etcd at {self.address}: granting a lease: {resp.error}")
        return int(resp.ID), int(resp.TTL)

    def keep_alive(self, lease: int) -> int:
        """Renew ``lease``; return its TTL from now, 0 if it expired."""
        def one() -> Iterator[pb.LeaseKeepAliveRequest]:
            yield pb.LeaseKeepAliveRequest(ID=lease)

        try:
            stream = self._keepalive(one(), timeout=self.timeout)
            try:
                for resp in stream:
                    return int(resp.TTL)
            finally:
                stream.cancel()
        except grpc.RpcError as exc:
            raise self._error(exc, "renewing a lease") from None
        raise EtcdError(f"etcd at {self.address}: renewing a lease: no answer")

    def revoke(self, lease: int) -> None:
        """End ``lease`` now, and delete its keys (an expired one is no error)."""
        try:
            self._revoke(pb.LeaseRevokeRequest(ID=lease), timeout=self.timeout)
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.NOT_FOUND:
                return
            raise self._error(exc, "revoking a lease") from None

    def close(self) -> None:
        self._channel.close()


class Watch:
    """A watch of the keys under a prefix. Iterating it yields the revision
    of each change as etcd reports it (a batch of events is one revision),
    until :meth:`cancel`, or until etcd fails, which raises ``EtcdError``."""

    def __init__(self, rpc: Any, prefix: str, start_revision: int,
                 error: Callable[[grpc.RpcError, str], EtcdError], address: str) -> None:
        self._error = error
        self._address = address
        self._requests: queue.SimpleQueue[pb.WatchRequest | None] = queue.SimpleQueue()
        self._requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=prefix.encode(), range_end=prefix_end(prefix), start_revision=start_revision)))
        self._call = rpc(iter(self._requests.get, None))
        self._cancelled = False

    def __iter__(self) -> Iterator[int]:
        try:
            for resp in self._call:
                if resp.canceled:
                    raise EtcdError(f"etcd at {self._address}: the watch was cancelled:"
                                    f" {resp.cancel_reason or 'compacted'}")
                if resp.events:
                    yield int(resp.header.revision)
        except grpc.RpcError as exc:
            if self._cancelled:
                return
            raise self._error(exc, "watching") from None

    def cancel(self) -> None:
        self._cancelled = True
        self._requests.put(None)
        self._call.cancel()
