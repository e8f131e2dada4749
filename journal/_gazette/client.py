"""``GazetteClient``: a ``JournalStore`` whose journals live on a Gazette
broker cluster (brokers + etcd), spoken to with Gazette's broker gRPC
protocol (service ``protocol.Journal``).

Everything above the ``JournalClient`` protocol (publishers, transactions,
read iterators, checkpoints, the command line, the Spark source) works on
it unchanged. docs/gazette.md tells the whole story; in short:

- ``create`` applies a JournalSpec with this client's defaults for what
  labels do not say (replication, fragment length, compression, fragment
  stores, flush interval), then waits until brokers are assigned to it;
- ``append`` queues the bytes; one thread per journal sends what is queued
  as one Append RPC to the journal's primary broker, so many appends are in
  flight at once and each future resolves with the broker's committed
  offsets once every replica has the bytes;
- ``read`` streams a Read RPC, and reads persisted fragments straight from
  a ``file://`` fragment store when ``file_root`` says where it is mounted;
- transient failures (a broker down, a journal moving between brokers) are
  retried with backoff for ``retry_timeout`` seconds, then raised as
  ``BrokerUnavailableError`` naming the address.
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Final, NoReturn, cast, final

import grpc

from .._append_queue import append_router, flush_queues
from .._closing import CLIENTS, Closing
from .._errors import (
    AppendTooLargeError,
    BrokerError,
    InvalidJournalNameError,
    JournalClosedError,
    JournalError,
    JournalExistsError,
    JournalNotFoundError,
    OffsetNotYetAvailableError,
)
from .._labels import LabelSelector, LabelSet, LabelsInit, parse_label_selector
from .._spec import AppendResult, Fragment, JournalSpec, validate_journal_name
from .._util import age_seconds, check_offsets
from . import broker_pb2 as pb
from . import wire
from .appender import GazetteAppender
from .brokers import (
    ROUTING_STATUSES,
    Brokers,
    JournalRoute,
    RerouteSignal,
    Stub,
    backoff,
    refusal,
    status_error,
)
from .filestore import FILE_STORE, has_file_store, prune, remove_persisted
from .reader import GazetteReader
from .security import security_of

#: Where a client connects when given no address and no ``BROKER_ADDRESS``.
DEFAULT_BROKER_ADDRESS: Final = "http://localhost:8080"
#: Default bound on one append, as for the other clients.
DEFAULT_MAX_APPEND_SIZE: Final = 16 << 20
# How long create() waits for brokers to take up a new journal: for a
# primary, and for as many brokers as its replication asks for.
_ASSIGN_TIMEOUT: Final = 30.0
_FULL_ASSIGN_TIMEOUT: Final = 5.0
LOG: Final = logging.getLogger("journal")
#: A watching List RPC ends after this many seconds and is opened again,
#: so that its watcher notices soon that it was stopped.
_WATCH_DEADLINE: Final = 5.0

@final
class GazetteClient(Closing):
    """Journals on a Gazette broker cluster.

    ``address`` is a broker URL such as ``"http://127.0.0.1:8080"``; None
    takes ``BROKER_ADDRESS`` from the environment, as Gazette's own tools
    do, else ``http://localhost:8080``. Any broker of the cluster will do:
    requests are routed to the brokers of each journal.

    Defaults for the journals ``create`` makes (each also a keyword of
    ``create``): ``replication`` (brokers holding each journal; a cluster
    needs at least that many brokers), ``fragment_length`` (bytes after
    which a fragment is closed and persisted), ``compression`` (``"none"``,
    ``"gzip"``, ``"zstandard"``, ``"snappy"`` or ``"gzip_offload"``), ``fragment_stores`` (URLs
    where fragments persist; None: ``file:///`` if the cluster has a file
    store, else none), ``flush_interval`` (persist at least this often;
    None: only when full), ``refresh_interval`` (how often brokers list the
    stores), ``retention`` (recorded in the spec for ``gazctl journals
    prune``).

    ``file_root``: the local directory where the cluster's ``file://``
    fragment store is mounted (the brokers' ``--broker.file-root``).
    ``direct_reads``: read persisted fragments straight from their store
    where this client can (files under ``file_root``; a cloud store's signed
    URLs, fetched over HTTP(S), every codec Gazette writes), instead of
    through a broker; a fragment that cannot be is read through a broker.
    ``connect_timeout``: seconds to wait for the first answer of any broker
    (an address where none answers fails that soon). ``retry_timeout``:
    seconds to keep retrying a request that fails for transient reasons once
    the cluster has answered (a failover; None: forever). ``rpc_timeout``:
    seconds one RPC may take. ``max_append_size``: larger appends raise
    ``AppendTooLargeError``.

    Secured clusters, as Gazette's tools reach them (each option, left out,
    is read from the environment variable in brackets): an ``https://``
    address uses TLS, checked against ``trusted_ca_file``
    (``BROKER_TRUSTED_CA_FILE``; else the system's CAs); ``cert_file`` and
    ``cert_key_file`` (``BROKER_CERT_FILE``, ``BROKER_CERT_KEY_FILE``) are
    the client's certificate, for brokers that ask for one (mutual TLS);
    ``auth_keys`` (``BROKER_AUTH_KEYS``) are the brokers' ``--auth-keys``,
    base64 keys separated by commas or spaces: each request carries an
    authorization signed with the first, as ``auth.KeyedAuth`` does
    (``auth_token_ttl`` seconds long; a blocking read outliving it is
    opened again with a new one). A request refused for its credentials,
    or a certificate that does not verify, raises ``BrokerAuthError`` at
    once.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        replication: int = 3,
        fragment_length: int = 16 << 20,
        compression: str = "none",
        fragment_stores: tuple[str, ...] | list[str] | None = None,
        flush_interval: float | timedelta | None = None,
        refresh_interval: float | timedelta = 30.0,
        retention: float | timedelta | None = None,
        file_root: str | os.PathLike[str] | None = None,
        max_append_size: int = DEFAULT_MAX_APPEND_SIZE,
        retry_timeout: float | None = 60.0,
        rpc_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        trusted_ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        cert_key_file: str | os.PathLike[str] | None = None,
        auth_keys: str | None = None,
        auth_token_ttl: float = 3600.0,
        direct_reads: bool = True,
    ) -> None:
        address = address or os.environ.get("BROKER_ADDRESS") or DEFAULT_BROKER_ADDRESS
        if max_append_size < 1:
            raise ValueError(f"max_append_size must be positive ({max_append_size})")
        if retry_timeout is not None and retry_timeout < 0:
            raise ValueError(f"retry_timeout must be >= 0 ({retry_timeout})")
        if rpc_timeout <= 0:
            raise ValueError(f"rpc_timeout must be positive ({rpc_timeout})")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be positive ({connect_timeout})")
        security = security_of(trusted_ca_file, cert_file, cert_key_file, auth_keys,
                               auth_token_ttl)
        self._stores_given = fragment_stores is not None
        refresh = wire.to_timedelta(refresh_interval)
        assert refresh is not None
        self._defaults = wire.SpecDefaults(
            replication=replication,
            fragment_length=fragment_length,
            compression=compression,
            stores=tuple(fragment_stores or ()),
            flush_interval=wire.to_timedelta(flush_interval),
            refresh_interval=refresh,
            retention=wire.to_timedelta(retention),
        )
        self._defaults.check()
        self._brokers = Brokers(address, retry_timeout=retry_timeout, rpc_timeout=rpc_timeout,
                                connect_timeout=connect_timeout, security=security)
        self.address: Final = self._brokers.address
        self.file_root: Final = os.path.abspath(os.fspath(file_root)) if file_root else None
        self.direct_reads: Final = direct_reads
        self.max_append_size: Final = max_append_size
        self._lock = threading.Lock()
        self._appenders: dict[str, GazetteAppender] = {}
        # append() without Python code in the common case (journal/_append_queue.py).
        router = append_router(self, GazetteClient.append, self._appenders, max_append_size)
        if router is not None:
            self.append = router  # type: ignore[assignment]
        self._known: set[str] = set()  # Journals seen to exist.
        self._readers: weakref.WeakSet[GazetteReader] = weakref.WeakSet()
        self._file_store: bool | None = None  # Does the cluster have a file store?
        self._closed = False
        CLIENTS.add(self)  # closed at exit

    def __repr__(self) -> str:
        return f"GazetteClient({self.address!r})"

    # Administration ----------------------------------------------------------

    def create(
        self,
        name: str,
        labels: LabelSet | LabelsInit | None = None,
        *,
        replication: int | None = None,
        fragment_length: int | None = None,
        compression: str | None = None,
        fragment_stores: tuple[str, ...] | list[str] | None = None,
        flush_interval: float | timedelta | None = None,
        retention: float | timedelta | None = None,
    ) -> JournalSpec:
        """Apply a JournalSpec for ``name`` with ``labels``; return its spec.

        Idempotent for identical labels (other settings of an existing
        journal are left as they are); ``JournalExistsError`` if it exists
        with other labels. Returns once brokers are assigned to the journal,
        so that appends and reads may follow at once."""
        spec = JournalSpec(name, labels)
        spec.validate()
        if len(name.encode()) < wire.MIN_JOURNAL_NAME_LEN:
            raise InvalidJournalNameError(
                name, f"Gazette needs at least {wire.MIN_JOURNAL_NAME_LEN} bytes"
            )
        self._check_open()
        settings = self._defaults.overridden(
            replication=replication, fragment_length=fragment_length, compression=compression,
            stores=(tuple(fragment_stores) if fragment_stores is not None
                    else self._default_stores(f"create {name}")),
            flush_interval=None if flush_interval is None else wire.to_timedelta(flush_interval),
            retention=None if retention is None else wire.to_timedelta(retention),
        )
        settings.check()
        while True:
            existing = self._lookup(name)
            if existing is not None:
                current = wire.journal_spec(existing.spec)
                if current.labels != spec.labels:
                    raise JournalExistsError(name, current.labels.to_dict())
                self._await_assignment(name, existing)
                return current
            change = pb.ApplyRequest.Change(
                expect_mod_revision=0, upsert=settings.spec(name, spec.labels)
            )
            status = self._apply(change, name)
            if status == pb.OK:
                break
            if status != pb.ETCD_TRANSACTION_FAILED:
                raise status_error(status, name, self.address)
            # Created by someone else meanwhile: compare with theirs.
        with self._lock:
            self._known.add(name)
        self._await_assignment(name, None)
        return spec

    def delete(self, name: str) -> None:
        """Remove the journal; ``JournalNotFoundError`` if absent.

        Appends still queued for it fail with ``JournalNotFoundError``. The
        brokers forget the journal's spec; its fragments already persisted
        to a fragment store stay there unless this client has ``file_root``,
        in which case it removes them from the ``file://`` store too (as
        ``gazctl journals prune`` would). Fragments left in a store are found
        again by a journal created under the same name."""
        while True:
            existing = self._lookup(name)
            if existing is None:
                raise JournalNotFoundError(name)
            change = pb.ApplyRequest.Change(
                expect_mod_revision=existing.mod_revision, delete=name
            )
            status = self._apply(change, name)
            if status == pb.OK:
                break
            if status != pb.ETCD_TRANSACTION_FAILED:
                raise status_error(status, name, self.address)
        with self._lock:
            self._known.discard(name)
            appender = self._appenders.pop(name, None)
        self._brokers.forget(name)
        if appender is not None:
            appender.stop()
        if self.file_root is not None:
            remove_persisted(self.file_root, name)

    def get(self, name: str) -> JournalSpec:
        """The journal's spec; ``JournalNotFoundError`` if absent."""
        found = self._lookup(name)
        if found is None:
            raise JournalNotFoundError(name)
        return wire.journal_spec(found.spec)

    def list(self, selector: str | LabelSelector = "") -> builtins.list[JournalSpec]:
        """Specs of the journals matching ``selector``, sorted by name."""
        sel = parse_label_selector(selector)
        self._check_open()
        responses = self._brokers.list_stream(pb.ListRequest(selector=wire.selector(sel)), None)
        specs = [wire.journal_spec(j.spec) for r in responses for j in r.journals]
        with self._lock:
            self._known.update(s.name for s in specs)
        # The cluster applied the selector; matching again here keeps the
        # semantics identical to the other clients' to the letter.
        return sorted((s for s in specs if sel.matches(s)), key=lambda s: s.name)

    def watch_list(
        self, selector: str | LabelSelector, stopped: Callable[[], bool]
    ) -> Iterator[builtins.list[JournalSpec]]:
        """Snapshots of the journals matching ``selector``, as ``list`` gives
        them: the first at once, then one at each change, as long as
        ``stopped()`` is false (looked at least every few seconds). A List RPC
        that watches, resumed where it left off after a failure or its
        deadline (see ``journal.WatchedList``)."""
        sel = parse_label_selector(selector)
        request = pb.ListRequest(selector=wire.selector(sel), watch=True)
        attempt = 0
        while not stopped():
            self._check_open()
            endpoint = self._brokers.pick(None, primary=False)
            snapshot: builtins.list[pb.ListResponse.Journal] | None = None
            try:
                call = self._brokers.stub(endpoint).list(request, timeout=_WATCH_DEADLINE)
                for resp in call:
                    if resp.status != pb.OK:
                        raise status_error(resp.status, None, endpoint)
                    if snapshot is None:  # a snapshot's first response
                        snapshot = list(resp.journals)
                        request.watch_resume.CopyFrom(resp.header)
                    elif resp.journals:
                        snapshot.extend(resp.journals)
                    else:  # an empty response ends the snapshot
                        specs = [wire.journal_spec(j.spec) for j in snapshot]
                        snapshot = None
                        attempt = 0
                        self._brokers.mark_up(endpoint)
                        yield sorted((s for s in specs if sel.matches(s)),
                                     key=lambda s: s.name)
                    if stopped():
                        call.cancel()
                        return
            except grpc.RpcError as err:
                refused = refusal(err, "watch journals", None, endpoint, self._brokers.security)
                if refused is not None:
                    raise refused from None
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue  # no change for a while: watch again from where it was
                time.sleep(backoff(attempt))
                attempt += 1

    def route(self, name: str) -> JournalRoute:
        """The journal's brokers as the cluster routes it now: their endpoint
        URLs, and which one is primary (``primary_endpoint``)."""
        found = self._lookup(name)
        if found is None:
            raise JournalNotFoundError(name)
        return JournalRoute.of(found.route)

    def head(self, name: str) -> int:
        """The journal's write head: the offset of the next append."""
        self._check_open()
        request = pb.ReadRequest(journal=name, offset=-1, block=False, metadata_only=True)

        def attempt(stub: Stub, endpoint: str) -> int | None:
            for resp in stub.read(request, timeout=self._brokers.rpc_timeout):
                if resp.HasField("header"):
                    self._brokers.learn(name, resp.header.route)
                if resp.status in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                    return int(resp.write_head)
                if resp.status in ROUTING_STATUSES:
                    raise RerouteSignal(resp.status)
                raise status_error(resp.status, name, endpoint)
            return None

        return self._brokers.call(f"head of {name!r}", name, attempt)

    def fragments(self, name: str) -> builtins.list[Fragment]:
        """The journal's fragments in offset order, as its brokers index them.

        ``sealed`` is True for a fragment persisted to a fragment store;
        ``path`` is its local path under ``file_root`` where the client has
        one, else its store URL (empty while not yet persisted); ``mtime``
        is its modification time in the store (0 while not persisted)."""
        out: builtins.list[Fragment] = []
        request = pb.FragmentsRequest(journal=name, page_limit=1000)

        def attempt(stub: Stub, endpoint: str) -> pb.FragmentsResponse | None:
            resp = stub.fragments(request, timeout=self._brokers.rpc_timeout)
            if resp.HasField("header"):
                self._brokers.learn(name, resp.header.route)
            if resp.status == pb.OK:
                return cast(pb.FragmentsResponse, resp)
            if resp.status in ROUTING_STATUSES:
                raise RerouteSignal(resp.status)
            raise status_error(resp.status, name, endpoint)

        while True:
            resp = self._brokers.call(f"fragments of {name!r}", name, attempt)
            out.extend(self._fragment(name, f.spec) for f in resp.fragments)
            if not resp.next_page_token:
                break
            request.next_page_token = resp.next_page_token
        out.sort(key=lambda f: (f.begin, f.end))
        return out

    def offset_since(self, name: str, when: float | datetime) -> int:
        """Where to replay from to see everything appended since ``when``:
        the begin of the first fragment persisted at or after ``when`` or not
        persisted yet, else the write head. Fragment granularity, as
        Gazette's ``begin_mod_time``: the replay may start somewhat earlier."""
        cutoff = when.timestamp() if isinstance(when, datetime) else float(when)
        head = self.head(name)
        if cutoff > time.time():
            return head  # Nothing was appended in the future.
        for f in self.fragments(name):
            if f.mtime == 0 or f.mtime >= cutoff:
                return f.begin
        return head

    def trim(
        self,
        name: str,
        *,
        before_offset: int | None = None,
        older_than: float | timedelta | None = None,
    ) -> int:
        """Retention: remove persisted fragments from the start of the journal,
        as ``gazctl journals prune`` does.

        Brokers offer no RPC that removes content; retention belongs to the
        fragment store. What a client can do is what ``gazctl journals
        prune`` does: delete persisted fragments from the store itself. This
        client can for a ``file://`` store mounted at ``file_root``: it
        removes, oldest first, each persisted fragment that ends at or before
        ``before_offset`` and/or was persisted more than ``older_than``
        seconds ago, stopping at the first to keep (or not yet persisted).
        Returns the first offset still readable. Brokers notice on their next
        listing of the store (the journal's refresh interval); until then
        they may still offer the removed offsets. Without ``file_root``,
        raises ``BrokerError`` (status ``NOT_ALLOWED``) saying so."""
        age = age_seconds(before_offset, older_than)
        if self.file_root is None:
            raise BrokerError(
                f"journal {name!r}: this client cannot trim: retention on a Gazette cluster"
                " belongs to the fragment store (set retention on the journal spec and run"
                " `gazctl journals prune`; or, where its file:// store is mounted on this"
                " machine, give its directory: GazetteClient(file_root=...), `exactly"
                " journals trim --file-root DIR`)",
                status="NOT_ALLOWED", journal=name, address=self.address,
            )
        frags = self.fragments(name)
        removed = prune(frags, self.file_root, before_offset,
                        time.time() - age if age is not None else None)
        return frags[removed].begin if removed < len(frags) else self.head(name)

    # JournalClient -----------------------------------------------------------

    def append(self, name: str, data: bytes | bytearray | memoryview) -> Future[AppendResult]:
        """Queue ``data`` for appending; the future resolves with the broker's
        committed offsets once every replica of the journal has the bytes."""
        appender = self._appenders.get(name)
        if appender is not None and type(data) is bytes and len(data) <= self.max_append_size:
            return appender.submit(data)  # The common case, in as few steps as possible.
        if len(data) > self.max_append_size:
            raise AppendTooLargeError(name, len(data), self.max_append_size)
        if appender is None:
            appender = self._appender(name)
        return appender.submit(bytes(data))

    def read(
        self, name: str, offset: int = 0, end_offset: int | None = None, *, block: bool = False
    ) -> GazetteReader:
        """A reader of ``[offset, end_offset)`` of the journal (see ``JournalReader``).

        ``offset=-1`` starts at the write head. A non-blocking read past the
        write head raises ``OffsetNotYetAvailableError``."""
        self._check_open()
        self._ensure_known(name, f"read {name!r}")
        if offset == -1:
            offset = self.head(name)
        # The head is known only once the read starts (prime() below): the
        # range first, then OffsetNotYetAvailableError as check_read_args says.
        check_offsets(offset, end_offset)
        reader = GazetteReader(
            self._reader_closed, self._brokers, name, offset, end_offset, block, self.file_root,
            self.direct_reads,
        )
        with self._lock:
            self._readers.add(reader)
        if not block and end_offset != offset:
            head = reader.prime()
            if head is not None and head < offset:
                reader.close()
                raise OffsetNotYetAvailableError(name, offset, head)
        return reader

    def emit(self, name: str, data: bytes | bytearray | memoryview) -> int:
        """Gazette has no transient path: raises ``JournalError``."""
        raise JournalError(
            f"cannot emit to {name!r}: Gazette brokers have no transient messages, every"
            " message they carry is appended (emit works on the embedded store,"
            " LocalJournalStore)"
        )

    def listen(self, name: str) -> NoReturn:
        """Gazette has no transient path: raises ``JournalError``."""
        raise JournalError(
            f"cannot listen to {name!r}: Gazette brokers have no transient messages"
            " (LocalJournalStore has)"
        )

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every append issued so far is resolved. Raises
        ``TimeoutError`` after ``timeout`` seconds, and ``JournalError``
        (chained to the first failure) if any of those appends failed."""
        with self._lock:
            appenders = builtins.list(self._appenders.values())
        flush_queues(appenders, timeout)

    def close(self) -> None:
        """Finish pending appends (their futures report any failure), release
        blocked readers (their reads return b"") and close the connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            appenders = builtins.list(self._appenders.values())
            readers = builtins.list(self._readers)
        for a in appenders:
            a.stop()
        for r in readers:
            r.close()
        self._brokers.close()

    @property
    def closed(self) -> bool:
        return self._closed


    # Internals -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosedError(repr(self))

    def _reader_closed(self, reader: GazetteReader) -> None:
        with self._lock:
            self._readers.discard(reader)

    def _appender(self, name: str) -> GazetteAppender:
        self._ensure_known(name, f"append to {name!r}")
        with self._lock:
            self._check_open()
            appender = self._appenders.get(name)
            if appender is None:
                appender = self._appenders[name] = GazetteAppender(
                    name, self._brokers, max_batch_bytes=8 << 20
                )
            return appender

    def _ensure_known(self, name: str, what: str) -> None:
        """Raise ``JournalNotFoundError`` now, rather than from a future or a
        read, for a journal that does not exist (an error of the lookup
        says ``what`` it was for)."""
        if name in self._known:
            return
        if self._lookup(name, what) is None:
            raise JournalNotFoundError(name)

    def _lookup(self, name: str, what: str | None = None) -> pb.ListResponse.Journal | None:
        """The cluster's listing of journal ``name``, or None
        (``InvalidJournalNameError`` for a name no journal can have, as the
        embedded store says, rather than the broker's selector error). Its
        errors name ``what`` it was for (else: looking the journal up)."""
        self._check_open()
        validate_journal_name(name)
        by_name = pb.LabelSet(labels=[pb.Label(name="name", value=name)])
        request = pb.ListRequest(selector=pb.LabelSelector(include=by_name))
        doing = f"{what}: look the journal up" if what else f"look up journal {name!r}"
        for resp in self._brokers.list_stream(request, name, doing):
            for j in resp.journals:
                if j.spec.name == name:
                    with self._lock:
                        self._known.add(name)
                    return cast(pb.ListResponse.Journal, j)
        with self._lock:
            self._known.discard(name)
        return None

    def _apply(self, change: pb.ApplyRequest.Change, name: str) -> int:
        request = pb.ApplyRequest(changes=[change])

        def attempt(stub: Stub, endpoint: str) -> int:
            return int(stub.apply(request, timeout=self._brokers.rpc_timeout).status)

        return self._brokers.call(f"apply the spec of {name!r}", None, attempt)

    def _await_assignment(self, name: str, listed: pb.ListResponse.Journal | None) -> None:
        """Wait (bounded) until brokers have taken up the journal: a primary,
        and as many brokers as its replication asks for. Appends made before
        would wait for them anyway, and land in extra fragments."""
        start = time.monotonic()
        delay = 0.01
        while True:
            if listed is not None:
                route, want = listed.route, listed.spec.replication
                if route.primary >= 0 and len(route.members) >= want:
                    return
                waited = time.monotonic() - start
                if route.primary >= 0 and waited >= _FULL_ASSIGN_TIMEOUT:
                    LOG.warning(
                        "journal %s has %d of its %d brokers: appends wait until the cluster"
                        " has enough brokers (INSUFFICIENT_JOURNAL_BROKERS); a smaller"
                        " cluster needs journals of a smaller replication",
                        name, len(route.members), want,
                    )
                    return
                if waited >= _ASSIGN_TIMEOUT:
                    return  # Appends and reads will wait and retry on their own.
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
            listed = self._lookup(name)
            if listed is None:
                raise JournalNotFoundError(name)

    def _default_stores(self, what: str) -> tuple[str, ...]:
        if self._stores_given:
            return self._defaults.stores
        if self._file_store is None:
            self._file_store = has_file_store(self._brokers, what)
        return (FILE_STORE,) if self._file_store else ()

    def _fragment(self, name: str, f: pb.Fragment) -> Fragment:
        return wire.fragment_of(name, f, self.file_root)

    def _after_fork_in_child(self) -> None:
        """A forked child has none of our threads, and gRPC channels do not
        survive a fork: start afresh."""
        self._lock = threading.Lock()
        self._appenders.clear()  # (the same dict: append's router reads it)
        self._readers = weakref.WeakSet()
        self._brokers = self._brokers.afresh()
