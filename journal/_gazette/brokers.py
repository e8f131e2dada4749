"""The brokers of a cluster, as one client sees them: gRPC channels by
endpoint, the routes of journals, and the retry policy.

Gazette clients route each RPC themselves: an append goes to the primary
broker of its journal, a read to any broker of its route. Brokers proxy a
misrouted request (unless told not to), and every response header carries
the journal's current route, which the client remembers for the next call.
A broker that stops answering is skipped: the next attempt goes to another
broker this client has heard of, so that losing the broker named by the
client's own address costs nothing once any other broker is known.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import grpc
import grpc.experimental

from .._errors import (
    BrokerAuthError,
    BrokerError,
    BrokerUnavailableError,
    JournalError,
    JournalNotFoundError,
)
from . import broker_pb2 as pb
from .auth import CAP_APPEND, CAP_APPLY, CAP_LIST, CAP_READ, KeyedAuth, journal_selector
from .security import Security

LOG: Final = logging.getLogger("journal")

#: Content of one AppendRequest / the largest message this client accepts.
#: Brokers refuse messages over 4 MiB by default (--broker.max-grpc-recv-size).
MAX_CHUNK: Final = 1 << 20
_MAX_RECEIVE: Final = 64 << 20
#: An endpoint that failed is tried after the others for this many seconds.
_DOWN_FOR: Final = 5.0

# gRPC codes after which a request is tried again (on another broker where
# there is one): the broker is down, restarting, overloaded or shutting down.
TRANSIENT: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)
# Gazette statuses after which a request is tried again: the journal's
# assignment is moving between brokers.
ROUTING_STATUSES: Final = frozenset(
    {
        pb.NOT_JOURNAL_PRIMARY_BROKER,
        pb.NO_JOURNAL_PRIMARY_BROKER,
        pb.NOT_JOURNAL_BROKER,
        pb.INSUFFICIENT_JOURNAL_BROKERS,
    }
)

class RerouteSignal(Exception):  # noqa: N818 (a signal to retry, not an error)
    """Raised by an attempt of ``Brokers.call`` whose broker answered with
    one of ROUTING_STATUSES: try again where the route now says (as a
    returned None does), remembering why, for the error given up with."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

    def __str__(self) -> str:
        why = _EXPLAIN.get(self.status, "the journal is being assigned")
        return f"{why} ({status_name(self.status)})"


_EXPLAIN: Final[dict[int, str]] = {
    pb.NOT_ALLOWED: "the journal's flags do not allow this operation",
    pb.WRONG_APPEND_OFFSET: "the append offset is not the journal's write head",
    pb.INDEX_HAS_GREATER_OFFSET: (
        "the journal's fragment store holds content past its replicas' offset"
        " (fragments of an earlier journal of the same name, or replication"
        " consistency lost to broker or etcd failures); `gazctl journals"
        " reset-head` resumes appends after them"
    ),
    pb.REGISTER_MISMATCH: "the journal's registers do not match",
    pb.SUSPENDED: "the journal is suspended",
    pb.FRAGMENT_STORE_UNHEALTHY: "the journal's fragment store is unhealthy",
    pb.INSUFFICIENT_JOURNAL_BROKERS: (
        "too few brokers are assigned to the journal for its replication"
        " (a cluster smaller than the journal's replication?)"
    ),
    pb.NO_JOURNAL_PRIMARY_BROKER: "the journal has no primary broker",
    pb.NOT_JOURNAL_PRIMARY_BROKER: "the broker is not the journal's primary",
    pb.NOT_JOURNAL_BROKER: "the broker does not serve the journal",
    pb.ETCD_TRANSACTION_FAILED: "the journal changed meanwhile (etcd transaction failed)",
}

T = TypeVar("T")


def status_name(status: int) -> str:
    return str(pb.Status.Name(status))


def status_error(
    status: int, journal: str | None, address: str, extra: str = ""
) -> JournalError:
    """The exception for a response's non-OK Gazette status."""
    if status == pb.JOURNAL_NOT_FOUND and journal is not None:
        return JournalNotFoundError(journal)
    name = status_name(status)
    what = _EXPLAIN.get(status, "the broker refused the request")
    subject = f"journal {journal!r}" if journal is not None else "request"
    detail = f": {extra}" if extra else ""
    return BrokerError(
        f"{subject}: {name} from {address}: {what}{detail}",
        status=name, journal=journal, address=address,
    )


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (Gazette's schedule,
    capped at one second so that a failover is noticed quickly)."""
    if attempt < 0:
        return 0.0
    return (0.05, 0.05, 0.1, 0.1, 0.25, 0.5)[attempt] if attempt < 6 else 1.0


@dataclass(frozen=True, slots=True)
class JournalRoute:
    """A journal's brokers, as the cluster routes it: their endpoint URLs,
    and the index of the primary among them (-1: none yet)."""

    endpoints: tuple[str, ...]
    primary: int

    @classmethod
    def of(cls, msg: pb.Route) -> JournalRoute:
        return cls(tuple(msg.endpoints), msg.primary)

    @property
    def primary_endpoint(self) -> str | None:
        if 0 <= self.primary < len(self.endpoints):
            return self.endpoints[self.primary]
        return None


def _target(endpoint: str) -> tuple[str, bool]:
    """The gRPC target of a Gazette endpoint URL (``http://host:port``, or
    ``https://`` for TLS), and whether it uses TLS."""
    parts = urlsplit(endpoint)
    if parts.scheme == "unix":
        return endpoint, False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"not a broker address: {endpoint!r} (expected http://host:port or"
            " https://host:port, as BROKER_ADDRESS)"
        )
    tls = parts.scheme == "https"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or (443 if tls else 80)}", tls


def check_address(address: str) -> str:
    """Validate a broker URL; return it without a trailing slash."""
    address = address.rstrip("/")
    _target(address)
    return address


def _as_is(data: bytes) -> bytes:
    return data


class Stub:
    """The Journal service's RPCs on one channel; with ``auth``, each RPC
    carries the authorization Gazette's ``AuthJournalClient`` would give it
    (the appender passes ``append_metadata(journal)`` itself: its requests
    are a stream)."""

    __slots__ = ("_auth", "append", "apply", "channel", "fragments", "list", "read",
                 "store_health")

    def __init__(self, channel: grpc.Channel, auth: KeyedAuth | None = None) -> None:
        self.channel = channel
        self._auth = auth
        self.list = channel.unary_stream(
            "/protocol.Journal/List",
            request_serializer=pb.ListRequest.SerializeToString,
            response_deserializer=pb.ListResponse.FromString,
        )
        self.apply = channel.unary_unary(
            "/protocol.Journal/Apply",
            request_serializer=pb.ApplyRequest.SerializeToString,
            response_deserializer=pb.ApplyResponse.FromString,
        )
        self.read = channel.unary_stream(
            "/protocol.Journal/Read",
            request_serializer=pb.ReadRequest.SerializeToString,
            response_deserializer=pb.ReadResponse.FromString,
        )
        # Append requests go out already serialized (see appender.py).
        self.append = channel.stream_unary(
            "/protocol.Journal/Append",
            request_serializer=_as_is,
            response_deserializer=pb.AppendResponse.FromString,
        )
        self.fragments = channel.unary_unary(
            "/protocol.Journal/ListFragments",
            request_serializer=pb.FragmentsRequest.SerializeToString,
            response_deserializer=pb.FragmentsResponse.FromString,
        )
        self.store_health = channel.unary_unary(
            "/protocol.Journal/FragmentStoreHealth",
            request_serializer=pb.FragmentStoreHealthRequest.SerializeToString,
            response_deserializer=pb.FragmentStoreHealthResponse.FromString,
        )
        if auth is not None:
            self.list = _authorized(self.list, auth, lambda r: (CAP_LIST, r.selector))
            self.apply = _authorized(self.apply, auth, lambda r: (CAP_APPLY, None))
            self.read = _authorized(
                self.read, auth, lambda r: (CAP_READ, journal_selector(r.journal)))
            self.fragments = _authorized(
                self.fragments, auth, lambda r: (CAP_READ, journal_selector(r.journal)))
            self.store_health = _authorized(self.store_health, auth, lambda r: (CAP_READ, None))

    def append_metadata(self, journal: str) -> tuple[tuple[str, str], ...] | None:
        """The metadata of an Append RPC to ``journal``."""
        if self._auth is None:
            return None
        return self._auth.metadata(CAP_APPEND, journal_selector(journal))


def _authorized(rpc: Any, auth: KeyedAuth, claims: Callable[[Any], tuple[int, Any]]) -> Any:
    """``rpc`` whose every call carries the authorization of ``claims(request)``."""

    def call(request: Any, **kwargs: Any) -> Any:
        capability, selector = claims(request)
        return rpc(request, metadata=auth.metadata(capability, selector), **kwargs)

    return call


class Brokers:
    """Channels, routes and retries of one client (thread-safe).

    Until a broker of the cluster has answered once, a request that finds
    none gives up after ``connect_timeout`` seconds (an address where
    nothing listens, or nothing Gazette); afterwards, transient failures
    (a failover) are retried for ``retry_timeout``."""

    def __init__(
        self,
        address: str,
        *,
        retry_timeout: float | None,
        rpc_timeout: float,
        connect_timeout: float = 5.0,
        security: Security | None = None,
    ) -> None:
        self.address = check_address(address)
        self.retry_timeout = retry_timeout
        self.rpc_timeout = rpc_timeout
        self.connect_timeout = connect_timeout
        self.security = security or Security()
        self._answered = False
        self._lock = threading.Lock()
        self._stubs: dict[str, Stub] = {}
        self._routes: dict[str, JournalRoute] = {}
        # Every endpoint heard of, the client's address first; those that
        # failed last are tried last.
        self._known: dict[str, None] = {self.address: None}
        self._down: dict[str, float] = {}
        self._closed = False

    def afresh(self) -> Brokers:
        """Brokers of the same address and settings (timeouts, TLS,
        credentials), with no channel, route or state of this one's: for a
        child made by ``fork``, where gRPC channels do not survive."""
        return Brokers(self.address, retry_timeout=self.retry_timeout,
                       rpc_timeout=self.rpc_timeout, connect_timeout=self.connect_timeout,
                       security=self.security)

    # Channels ----------------------------------------------------------------

    def stub(self, endpoint: str) -> Stub:
        with self._lock:
            stub = self._stubs.get(endpoint)
            if stub is None:
                if self._closed:
                    raise grpc.RpcError("client closed")
                target, tls = _target(endpoint)
                options = [
                        ("grpc.max_receive_message_length", _MAX_RECEIVE),
                        ("grpc.max_send_message_length", _MAX_RECEIVE),
                        # Reconnect to a restarted broker quickly (gRPC's
                        # default backoff grows to two minutes).
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.min_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 1000),
                        ("grpc.enable_retries", 0),
                        # Read streams are consumed on the reading thread
                        # itself, not handed over by gRPC's channel thread:
                        # two thread wake-ups less for each 32 KB chunk (about
                        # twice the read throughput).
                        (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
                ]
                if tls:
                    channel = grpc.secure_channel(
                        target, self.security.credentials(), options=options)
                else:
                    channel = grpc.insecure_channel(target, options=options)
                stub = self._stubs[endpoint] = Stub(channel, self.security.auth)
            return stub

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stubs, self._stubs = list(self._stubs.values()), {}
        for stub in stubs:
            stub.channel.close()

    # Routes ------------------------------------------------------------------

    def learn(self, journal: str, route: pb.Route) -> None:
        """Remember ``journal``'s route from a response (ignoring empty ones)."""
        if not route.endpoints:
            return
        r = JournalRoute.of(route)
        with self._lock:
            self._routes[journal] = r
            for endpoint in r.endpoints:
                self._known.setdefault(endpoint, None)

    def primary_of(self, journal: str) -> str | None:
        """The endpoint of ``journal``'s primary broker, if its route is known."""
        with self._lock:
            route = self._routes.get(journal)
        return None if route is None else route.primary_endpoint

    def forget(self, journal: str) -> None:
        with self._lock:
            self._routes.pop(journal, None)

    def mark_down(self, endpoint: str) -> None:
        """``endpoint`` failed: try others first for a while."""
        with self._lock:
            self._down[endpoint] = time.monotonic()

    def mark_up(self, endpoint: str) -> None:
        self._answered = True
        if endpoint in self._down:
            with self._lock:
                self._down.pop(endpoint, None)

    def pick(
        self, journal: str | None, *, primary: bool, avoid: frozenset[str] = frozenset()
    ) -> str:
        """The endpoint to send a request about ``journal`` to: its primary
        if known and up; unless ``primary`` is required, then another broker
        of its route; else the known endpoint that failed longest ago.
        Endpoints in ``avoid`` are taken last: after the route's others, but
        before brokers outside the route (which do not serve the journal).

        Reads go to the primary first too: after a broker failed, a broker
        newly added to a route indexes the journal's older content only once
        it is persisted and listed, while the primary has it all."""
        with self._lock:
            route = self._routes.get(journal) if journal is not None else None
            since = time.monotonic() - _DOWN_FOR
            down = {e: t for e, t in self._down.items() if t > since}
            candidates: list[str] = []
            if route is not None:
                p = route.primary_endpoint
                if p is not None:
                    candidates.append(p)
                if not primary:
                    candidates += [e for e in route.endpoints if e != p]
            for endpoint in candidates:
                if endpoint not in down and endpoint not in avoid:
                    return endpoint
            for endpoint in candidates:
                if endpoint not in down:
                    return endpoint
            known = list(self._known)
            for endpoint in known:
                if endpoint not in down and endpoint not in avoid:
                    return endpoint
            return min(known, key=lambda e: (e in avoid, down.get(e, 0.0)))

    def endpoints(self) -> list[str]:
        with self._lock:
            return list(self._known)

    def expired(self, started: float, now: float) -> bool:
        """Should a request begun at ``started`` (monotonic) stop retrying?
        Before any broker answered, after ``connect_timeout``; then after
        ``retry_timeout`` (None: never)."""
        if not self._answered and now - started >= self.connect_timeout:
            return True
        return self.retry_timeout is not None and now - started >= self.retry_timeout

    def unavailable(self, what: str, journal: str | None, endpoint: str,
                    last: str) -> BrokerUnavailableError:
        """The error of a request that found no broker in time."""
        if not self._answered:
            how = (f"no Gazette broker answered at {self.address} within"
                   f" {self.connect_timeout:g} s")
            if "https" not in self.address and "Socket closed" in last:
                how += " (is it a TLS broker? its address would begin with https://)"
        else:
            how = f"no Gazette broker answered at {self.address}"
        return BrokerUnavailableError(
            f"{what}: {how} (last tried {endpoint}: {last})",
            status="UNAVAILABLE", journal=journal, address=endpoint,
        )

    # Retries -----------------------------------------------------------------

    def call(
        self,
        what: str,
        journal: str | None,
        attempt_fn: Callable[[Stub, str], T | None],
        *,
        primary: bool = False,
        deadline: float | None = None,
    ) -> T:
        """Run ``attempt_fn(stub, endpoint)`` until it returns a value.

        It returns None (or raises ``RerouteSignal``) to ask for another attempt
        (after a backoff), and raises anything else to give up. A transient
        gRPC error marks the endpoint down and tries again. Past the retry
        deadline the last problem is raised as ``BrokerUnavailableError``,
        naming the address."""
        started = time.monotonic()
        attempt = 0
        last = "no answer"
        endpoint = self.address
        while True:
            endpoint = self.pick(journal, primary=primary)
            rerouted: RerouteSignal | None = None
            try:
                result = attempt_fn(self.stub(endpoint), endpoint)
            except RerouteSignal as reroute:
                self.mark_up(endpoint)
                rerouted, last = reroute, str(reroute)
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, grpc.Call) else None
                refused = refusal(err, what, journal, endpoint, self.security)
                if refused is not None:
                    raise refused from None
                if code not in TRANSIENT and code is not None:
                    raise rpc_error(err, what, journal, endpoint) from None
                if self._closed:
                    raise BrokerError(
                        f"{what}: the client is closed", status="CANCELLED",
                        journal=journal, address=endpoint,
                    ) from None
                last = describe(err)
                self.mark_down(endpoint)
                if journal is not None:
                    self.forget(journal)
                result = None
            else:
                self.mark_up(endpoint)
                if result is not None:
                    return result
                last = "the journal's brokers are changing"
            now = time.monotonic()
            if self.expired(started, now) or (deadline is not None and now >= deadline):
                if rerouted is not None:
                    raise BrokerUnavailableError(
                        f"{what}: the cluster at {self.address} did not serve the journal in"
                        f" time (last answer, from {endpoint}: {last})",
                        status=status_name(rerouted.status), journal=journal, address=endpoint,
                    )
                raise self.unavailable(what, journal, endpoint, last)
            time.sleep(backoff(attempt))
            attempt += 1

    def list_stream(self, request: pb.ListRequest, journal: str | None,
                    what: str = "list journals") -> list[pb.ListResponse]:
        """A List RPC's whole answer (retried)."""

        def attempt(stub: Stub, endpoint: str) -> list[pb.ListResponse]:
            out = list(stub.list(request, timeout=self.rpc_timeout))
            for resp in out:
                if resp.status != pb.OK:
                    raise status_error(resp.status, None, endpoint)
                for j in resp.journals:
                    self.learn(j.spec.name, j.route)
            return out

        return self.call(what, journal, attempt)


#: Words of a failed RPC's details that mean a TLS handshake failed: the
#: broker's certificate did not verify, or the broker refused the client's.
_TLS_FAILURES: Final = ("handshake", "certificate", "CERTIFICATE", "SSL_ERROR", "tlsv1 alert")


def refusal(
    err: grpc.RpcError, what: str, journal: str | None, endpoint: str, security: Security
) -> BrokerAuthError | None:
    """The error of an RPC the cluster refused this client (credentials,
    or a certificate that does not verify), or None for any other failure.
    Such a refusal is never retried."""
    code = err.code() if isinstance(err, grpc.Call) else None
    details = describe(err)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        hint = ("the client signs no authorization: give auth_keys (BROKER_AUTH_KEYS)"
                if security.auth is None else
                "its authorization was refused: are auth_keys the brokers' --broker.auth-keys?")
        return BrokerAuthError(
            f"{what}: {endpoint} refused the request ({details}): {hint}",
            status=code.name, journal=journal, address=endpoint,
        )
    if (code == grpc.StatusCode.UNAVAILABLE and endpoint.startswith("https:")
            and "Unwrap failed" in details):
        # The broker ended the TLS session at once, with an alert: as it
        # does when it asks for a client certificate and gets none, or one
        # that no CA it trusts signed.
        hint = (" did it refuse the client certificate? cert_file (BROKER_CERT_FILE) must be"
                " signed by a CA the brokers trust" if security.cert is not None else
                " does it ask for a client certificate? give cert_file and cert_key_file"
                " (BROKER_CERT_FILE, BROKER_CERT_KEY_FILE)")
        return BrokerAuthError(
            f"{what}: {endpoint} closed the TLS connection ({details}):{hint}",
            status="UNAVAILABLE", journal=journal, address=endpoint,
        )
    if code == grpc.StatusCode.UNAVAILABLE and any(w in details for w in _TLS_FAILURES):
        return BrokerAuthError(
            f"{what}: the TLS handshake with {endpoint} failed ({details}): check"
            " trusted_ca_file (BROKER_TRUSTED_CA_FILE) against the brokers' certificate, and"
            " cert_file / cert_key_file where the brokers ask for a client certificate",
            status="UNAVAILABLE", journal=journal, address=endpoint,
        )
    return None


def describe(err: grpc.RpcError) -> str:
    if isinstance(err, grpc.Call):
        details = err.details() or ""
        return f"{err.code().name}: {details}".rstrip(": ")
    return str(err)


def rpc_error(err: grpc.RpcError, what: str, journal: str | None, address: str) -> BrokerError:
    """A failed RPC as a ``BrokerError`` (``BrokerUnavailableError`` for a
    peer that is not a Gazette broker)."""
    code = err.code() if isinstance(err, grpc.Call) else None
    name = code.name if code is not None else "UNKNOWN"
    text = describe(err)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return BrokerUnavailableError(
            f"{what}: {address} is not a Gazette broker ({text})",
            status=name, journal=journal, address=address,
        )
    return BrokerError(f"{what}: {address}: {text}", status=name, journal=journal, address=address)
