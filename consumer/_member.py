"""``Member``: one process of a consumer application that serves, with the
others, the shards kept in etcd (see ``consumer._group`` for the keys).

A member joins its group with an etcd lease, renewed every third of its
TTL. Every ``poll`` seconds it reads the group (specs, live members,
claims) at one revision and acts:

- a shard served here whose claim is gone (the lease expired while the
  process was paused, say), or whose spec was deleted or changed, is asked
  to stop: it commits its open transaction, or, fenced off by the store
  of a newer instance, abandons it; its claim is deleted once it stopped;
- the shards are shared evenly among the live members (``quotas``): below
  its share, a member claims unclaimed shards; above it, while another
  member is below its own, it releases one at a time (stopped cleanly
  first, claim deleted after). A shard left unclaimed for half a lease TTL
  is claimed by any member that can serve it, whatever its share;
- a member that loses its lease (etcd says it expired, or no renewal got
  through for a whole TTL) stops every shard at once and joins again with a
  new lease.

Claims are etcd transactions that hold only while the shard has no claim
and the member's key is still under its lease: two members never hold one
shard's claim at once. Between the moment a member's lease expires and the
moment it notices, it may still commit: the store's fence (restoring the
store in the new member fences off the old) is the safety net, and no
transaction commits twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final, Self, final

import mmh3
import orjson

from journal import CloseAtExit

from ._errors import EtcdError, FencedError, StoreError
from ._etcd import EtcdClient, Watch
from ._group import DEFAULT_ETCD_PREFIX, GroupView, ShardGroup, quotas
from ._interfaces import Application, check_application
from ._json_store import JSONFileStore
from ._sql_store import SQLiteStore
from ._txn import ShardLoop, exit_deadline

if TYPE_CHECKING:
    from types import TracebackType

    from journal import JournalClient

    from ._interfaces import Store
    from ._shard import Shard, ShardSpec

log = logging.getLogger("consumer.member")

#: A member's lease TTL unless told otherwise (seconds), as the issue of a
#: dead member's shards being served elsewhere within it.
DEFAULT_LEASE_TTL: Final = 10
#: etcd raises shorter TTLs to its minimum; refuse them instead.
MIN_LEASE_TTL: Final = 2


class StoreElsewhereError(StoreError):
    """The shard's store lives on the disk of another host: this member
    cannot serve it (see ``Member``)."""


def store_home(store: Store) -> tuple[str, str] | None:
    """``(kind, path)`` of a store kept on this host's disk, None for a
    store that any host reaches (``PostgresStore``, ...). A store of one's
    own on local disk says so with a ``local_path`` attribute."""
    if isinstance(store, JSONFileStore):
        return "JSONFileStore", _absolute(str(store.path))
    if isinstance(store, SQLiteStore):
        return "SQLiteStore", _absolute(store.path)
    path = getattr(store, "local_path", None)
    return (type(store).__name__, _absolute(os.fspath(path))) if path is not None else None


def _absolute(path: str) -> str:
    """A store's path as other hosts' members read it in etcd: absolute (a
    relative one names nothing there), SQLite's ``:memory:`` and ``file:``
    URIs as they are."""
    if path == ":memory:" or path.startswith("file:"):
        return path
    return os.path.abspath(path)


class _Served:
    """A shard served here: its loop, the revision of its claim (its term),
    and why it is being stopped, if it is."""

    __slots__ = ("loop", "revision", "stopping")

    def __init__(self, loop: ShardLoop, revision: int) -> None:
        self.loop = loop
        self.revision = revision
        self.stopping: str | None = None


@final
class Member:
    """A member of the consumer group kept in etcd at ``etcd`` (a URL, or an
    ``EtcdClient``) under ``prefix``: it serves its share of the group's
    shards with ``app``, reading and publishing through ``client``, until
    :meth:`stop`. See the module docstring for how shards are shared.

    ``lease_ttl``: seconds after which a member that died is gone and its
    shards are claimed by others (at least 2). ``member_id``: unique in the
    group (default: host, PID and a random suffix). ``host``: the machine
    whose disk local stores (``JSONFileStore``, ``SQLiteStore``) live on;
    members that share a filesystem may give the same name. A shard whose
    local store was first opened on another host is refused here, with an
    error in the log, and left to a member of that host. ``poll``: seconds
    between two looks at the group (default: a tenth of the TTL, at most 1).
    ``retry_failed``: seconds before a shard that failed here (an exception
    of the application, a store that failed) is claimed here again.
    """

    def __init__(
        self,
        client: JournalClient,
        app: Application,
        etcd: str | EtcdClient,
        *,
        prefix: str = DEFAULT_ETCD_PREFIX,
        lease_ttl: int = DEFAULT_LEASE_TTL,
        member_id: str | None = None,
        host: str | None = None,
        poll: float | None = None,
        retry_failed: float = 10.0,
    ) -> None:
        check_application(app)
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int) or \
                lease_ttl < MIN_LEASE_TTL:
            raise ValueError(f"lease_ttl must be a whole number of seconds, at least"
                             f" {MIN_LEASE_TTL}, not {lease_ttl!r}")
        self._owns_etcd = isinstance(etcd, str)
        # A call to etcd must fail well within a renewal period (a third of
        # the TTL), so that a lease is given up in time when etcd hangs.
        self._etcd = EtcdClient(etcd, timeout=min(5.0, max(0.5, lease_ttl / 3))) \
            if isinstance(etcd, str) else etcd
        self._group = ShardGroup(self._etcd, prefix)
        self.host = host or socket.gethostname()
        self.id = member_id or f"{self.host}-{os.getpid()}-{os.urandom(3).hex()}"
        if "/" in self.id or not self.id.strip():
            raise ValueError(f"member_id {self.id!r}: no '/', not empty")
        self._client = client
        self._app = app
        self._ttl = lease_ttl
        self._poll = poll if poll is not None else min(1.0, lease_ttl / 10)
        self._retry_failed = retry_failed
        self._lock = threading.Lock()
        self._served: dict[str, _Served] = {}
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        # Wakes the member's thread as soon as a key of the group changes
        # (a claim gone with its lease, a member joining): no wait for a poll.
        self._watcher: threading.Thread | None = None
        self._watching: Watch | None = None
        self._lease: int | None = None
        self._lease_deadline = 0.0
        self._next_renewal = 0.0
        self._old_leases: list[int] = []
        self._lost_at = 0.0
        self._id_taken = False
        self._failed: dict[str, float] = {}
        self._refused: dict[str, ShardSpec] = {}
        self._unclaimed_since: dict[str, float] = {}
        # Shards claimed past this member's share, because no other member
        # took them within the grace (one failing elsewhere): shard -> when.
        self._extra: dict[str, float] = {}
        self._etcd_down_since: float | None = None
        #: (shard id, exception) of the last 100 shards that stopped on an error here.
        self.errors: deque[tuple[str, BaseException]] = deque(maxlen=100)
        #: Shards this member will not serve, and why: their store is on the
        #: disk of another host.
        self.unservable: dict[str, str] = {}
        #: The last 1000 claims taken and given up: (event, shard, revision),
        #: event being ``claimed`` or ``released``.
        self.history: deque[tuple[str, str, int]] = deque(maxlen=1000)

    def __repr__(self) -> str:
        return f"Member({self.id!r}, prefix={self._group.prefix!r})"

    @property
    def prefix(self) -> str:
        return self._group.prefix

    @property
    def serving(self) -> tuple[str, ...]:
        """The shards this member serves now (not those it is stopping)."""
        return self._running(stopping=False)

    @property
    def stopping(self) -> tuple[str, ...]:
        """The shards this member is stopping and that have not stopped yet
        (each commits its open transaction once its application returns)."""
        return self._running(stopping=True)

    def _running(self, *, stopping: bool) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(s for s, v in self._served.items()
                                if (v.stopping is not None) == stopping
                                and not v.loop.finished))

    @property
    def lease(self) -> int | None:
        """The etcd lease this member holds now, if any."""
        return self._lease

    def start(self) -> None:
        """Join the group and serve in the background (if not already)."""
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._main, name=f"exactly member {self.id}",
                                        daemon=True)
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name=f"exactly member {self.id} watch")
        _MEMBERS.add(self)  # stopped at exit: it leaves the group then
        self._thread.start()
        self._watcher.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop every shard (each commits its open transaction, or abandons
        it if fenced off), give up their claims and leave the group."""
        thread = self._thread
        if thread is None:
            return
        self._stop = True
        self._wake.set()
        watch = self._watching
        if watch is not None:
            watch.cancel()
        deadline = None if timeout is None else time.monotonic() + timeout
        thread.join(timeout)
        if self._watcher is not None:
            self._watcher.join(None if deadline is None
                               else max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise TimeoutError(f"member {self.id} did not stop within {timeout} s")
        self._thread = None
        _MEMBERS.discard(self)
        if self._owns_etcd:
            self._etcd.close()

    def abandon(self) -> None:
        """For a process about to end without waiting for its shards (stuck
        in the application): give the member's lease back now, so that
        other members claim its shards at once rather than when the lease
        would have expired. Their stores' fences keep these shards off
        whatever they still try; their open transactions are read again
        where the shards next start."""
        for lease in (self._lease, *self._old_leases):
            if lease is None:
                continue
            try:
                self._etcd.revoke(lease)
            except EtcdError as exc:
                log.warning("member %s: giving its lease back: %s (it expires by itself)",
                            self.id, exc)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- the member's threads ------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop:
            try:
                watch = self._watching = self._etcd.watch(self.prefix + "/")
                if self._stop:
                    watch.cancel()
                for _ in watch:
                    self._wake.set()
            except EtcdError:
                pass  # the member's thread says what fails; watch again after a poll
            except Exception:
                log.exception("member %s: watching etcd failed", self.id)
            if not self._stop:
                time.sleep(self._poll)

    def _main(self) -> None:
        try:
            while not self._stop:
                try:
                    self._tick()
                    if self._etcd_down_since is not None:
                        log.info("member %s: etcd answers again", self.id)
                        self._etcd_down_since = None
                except EtcdError as exc:
                    now = time.monotonic()
                    if self._etcd_down_since is None:
                        self._etcd_down_since = now
                        log.warning("member %s: %s", self.id, exc)
                    if self._lease is not None and now >= self._lease_deadline:
                        self._lose(f"no renewal of its lease reached etcd for {self._ttl} s")
                except Exception:
                    log.exception("member %s: unexpected error; going on", self.id)
                self._wake.wait(self._poll)
                self._wake.clear()
        finally:
            self._leave()

    def _tick(self) -> None:
        self._reap()
        now = time.monotonic()
        if self._lease is None:
            if self._served and now - self._lost_at < self._ttl:
                return  # the shards of the lost lease are still stopping
            if not self._join():
                return
        elif now >= self._next_renewal:
            ttl = self._etcd.keep_alive(self._lease)
            if ttl <= 0:
                self._lose("its lease expired")
                return
            self._lease_deadline = now + ttl
            self._next_renewal = now + ttl / 3
        view = self._group.view()
        me = view.members.get(self.id)
        if me is None or me.lease != self._lease:
            self._lose("its member key is gone")
            return
        self._follow(view)
        self._balance(view)

    def _join(self) -> bool:
        """Join the group with a new lease; False while another live member
        has this member's id (a former process of it, until its lease expires)."""
        for old in list(self._old_leases):  # claims of a lease given up: free them now
            self._etcd.revoke(old)
            self._old_leases.remove(old)
        lease, ttl = self._etcd.grant(self._ttl)
        now = time.monotonic()
        key = self._group.keys.member(self.id)
        doc = orjson.dumps({"host": self.host, "pid": os.getpid(), "since": time.time()})
        try:
            resp = self._etcd.txn([EtcdClient.absent(key)],
                                  [EtcdClient.put_op(key, doc, lease=lease)])
        except EtcdError:
            with contextlib.suppress(EtcdError):
                self._etcd.revoke(lease)
            raise
        if not resp.succeeded:
            with contextlib.suppress(EtcdError):
                self._etcd.revoke(lease)
            if not self._id_taken:
                log.warning("member %s: another live member has this id (an earlier process"
                            " of it, until its lease expires?): waiting", self.id)
            self._id_taken = True
            return False
        self._id_taken = False
        self._lease, self._lease_deadline, self._next_renewal = lease, now + ttl, now + ttl / 3
        log.info("member %s joined %s (lease %x, TTL %d s)", self.id, self.prefix, lease, ttl)
        return True

    def _lose(self, why: str) -> None:
        """The lease is gone, or may be: every shard stops now."""
        lease = self._lease
        self._lease = None
        self._lost_at = time.monotonic()
        if lease is not None:
            self._old_leases.append(lease)
        with self._lock:
            served = [(s, v) for s, v in self._served.items() if v.stopping is None]
        log.warning("member %s lost its lease (%s): stopping %d shards", self.id, why,
                    len(served))
        for shard, v in served:
            self._stop_shard(shard, v, "the member lost its lease")

    def _stop_shard(self, shard: str, v: _Served, why: str) -> None:
        v.stopping = why
        v.loop.request_stop()
        log.info("member %s: stopping shard %s: %s", self.id, shard, why)

    def _reap(self) -> None:
        """Forget the shards that stopped; delete their claims."""
        with self._lock:
            done = [(s, v) for s, v in self._served.items() if v.loop.finished]
        for shard, v in done:
            if self._lease is not None:
                key = self._group.keys.claim(shard)
                self._etcd.txn([EtcdClient.created_at(key, v.revision),
                                EtcdClient.leased(key, self._lease)],
                               [EtcdClient.delete_op(key)])
            err = v.loop.error
            if err is not None:
                self.errors.append((shard, err))
                if isinstance(err, StoreElsewhereError):
                    self._refused[shard] = v.loop.spec
                    self.unservable[shard] = str(err)
                elif not isinstance(err, FencedError):
                    self._failed[shard] = time.monotonic()
            with self._lock:
                del self._served[shard]
            self._extra.pop(shard, None)
            self.history.append(("released", shard, v.revision))
            log.info("member %s released shard %s%s", self.id, shard,
                     "" if err is None else f" ({type(err).__name__}: {err})")

    def _follow(self, view: GroupView) -> None:
        """Stop the shards that lost their claim, or whose spec changed."""
        with self._lock:
            served = [(s, v) for s, v in self._served.items() if v.stopping is None]
        for shard, v in served:
            claim = view.claims.get(shard)
            spec = view.specs.get(shard)
            if claim is None or claim.revision != v.revision:
                self._stop_shard(shard, v, "its claim is gone")
            elif spec is None:
                self._stop_shard(shard, v, "its spec was deleted")
            elif spec != v.loop.spec:
                self._stop_shard(shard, v, "its spec changed")

    def _balance(self, view: GroupView) -> None:
        now = time.monotonic()
        share = quotas(view.members, len(view.specs))
        held = view.held()
        mine, quota = held.get(self.id, 0), share.get(self.id, 0)
        unclaimed = [s for s in view.specs if s not in view.claims]
        self._unclaimed_since = {s: self._unclaimed_since.get(s, now) for s in unclaimed}
        candidates = sorted(
            (s for s in unclaimed if self._may_serve(s, view, now)),
            key=lambda s: mmh3.hash(f"{self.id}\0{s}", signed=False))
        grace = self._ttl / 2
        for shard in candidates:
            if self._stop or self._lease is None:
                return
            within = mine < quota
            if (within or now - self._unclaimed_since[shard] >= grace) and \
                    self._claim(shard, view.specs[shard]):
                if not within:
                    self._extra[shard] = now
                mine += 1
        # A shard claimed past the share because nobody else took it (it
        # failed on the member short of its share, which waits before
        # retrying it) does not count for a while: handing another over for
        # it would move healthy shards back and forth around a failing one.
        fresh = {s for s, at in self._extra.items() if now - at < self._retry_failed}
        if mine - len(fresh) > quota and not any(v.stopping for v in self._served.values()):
            short = [m for m in view.members if held.get(m, 0) < share.get(m, 0)]
            movable = [s for s in self.serving if s not in fresh]
            if short and movable:
                # One taken past the share first, else the last in order.
                shard = ([s for s in movable if s in self._extra] or movable)[-1]
                self._stop_shard(shard, self._served[shard],
                                 f"handing it over ({mine} shards here, a share is {quota})")

    def _may_serve(self, shard: str, view: GroupView, now: float) -> bool:
        if shard in self._served:
            return False  # still stopping here
        spec = view.specs[shard]
        if self._refused.get(shard) == spec:
            return False
        failed = self._failed.get(shard)
        if failed is not None and now - failed < self._retry_failed:
            return False
        home = view.homes.get(shard)
        if home is None or home.get("host") == self.host:
            return True
        if shard not in self.unservable:
            why = (f"its {home.get('store')} is at {home.get('path')} on host {home.get('host')};"
                   f" this member runs on {self.host}")
            self.unservable[shard] = why
            log.warning("member %s will not serve shard %s: %s", self.id, shard, why)
        return False

    def _claim(self, shard: str, spec: ShardSpec) -> bool:
        assert self._lease is not None
        keys = self._group.keys
        doc = orjson.dumps({"member": self.id, "host": self.host})
        resp = self._etcd.txn(
            [EtcdClient.absent(keys.claim(shard)), EtcdClient.leased(keys.member(self.id),
                                                                     self._lease)],
            [EtcdClient.put_op(keys.claim(shard), doc, lease=self._lease)])
        if not resp.succeeded:
            return False
        revision = int(resp.header.revision)
        self._unclaimed_since.pop(shard, None)
        def progressed() -> None:
            if loop.finished:
                self._wake.set()  # reap it now, not at the next poll

        loop = ShardLoop(self._client, self._app, spec, progressed, check_store=self.check_home)
        with self._lock:
            self._served[shard] = _Served(loop, revision)
        self.history.append(("claimed", shard, revision))
        log.info("member %s claimed shard %s (revision %d)", self.id, shard, revision)
        loop.start()
        return True

    def check_home(self, shard: Shard, store: Store) -> None:
        """Refuse (``StoreElsewhereError``) a store on local disk that the shard
        first opened on another host; record this host as its home if none is."""
        home = store_home(store)
        if home is None:
            return
        kind, path = home
        key = self._group.keys.home(shard.id)
        doc = orjson.dumps({"host": self.host, "store": kind, "path": path})
        resp = self._home_txn(shard.id, key, doc)
        if resp.succeeded:
            return
        kvs = resp.responses[0].response_range.kvs
        there: dict[str, Any] = orjson.loads(kvs[0].value) if kvs else {}
        if there.get("host") != self.host:
            raise StoreElsewhereError(
                f"shard {shard.id}: its {there.get('store', kind)} is at {there.get('path')} on"
                f" host {there.get('host')}; this member runs on {self.host} and cannot reach"
                " it. Serve it from members of that host (or sharing its filesystem, with the"
                " same host name), or keep its state in a store every host reaches, such as"
                " PostgresStore", shard=shard.id, store=kind)

    def _home_txn(self, shard: str, key: str, doc: bytes) -> Any:
        """Record ``doc`` as the shard's home unless one is; return the txn's
        answer. etcd out of reach (restarting, say) is waited out while the
        shard is still to run here: its claim holds as long as the member's
        lease, and the member stops the shard when it gives the lease up."""
        delay = 0.05
        while True:
            try:
                return self._etcd.txn([EtcdClient.absent(key)], [EtcdClient.put_op(key, doc)],
                                      [EtcdClient.get_op(key)])
            except EtcdError as exc:
                with self._lock:
                    v = self._served.get(shard)
                    wanted = v is not None and v.stopping is None and not self._stop
                if not wanted or not exc.unreachable:
                    raise
                log.info("member %s: shard %s waits for etcd: %s", self.id, shard, exc)
            time.sleep(delay)
            delay = min(2 * delay, 0.5)

    def _leave(self) -> None:
        """Stop every shard, wait for them, give up the claims and the lease."""
        with self._lock:
            served = list(self._served.items())
        for shard, v in served:
            if v.stopping is None:
                self._stop_shard(shard, v, "the member is stopping")
        for _, v in served:
            v.loop.join()
        try:
            self._reap()
            if self._lease is not None:
                self._etcd.revoke(self._lease)
            for old in self._old_leases:
                self._etcd.revoke(old)
            log.info("member %s left %s", self.id, self.prefix)
        except EtcdError as exc:
            log.warning("member %s: leaving the group: %s (its lease expires by itself)",
                        self.id, exc)
        finally:
            with self._lock:
                self._served.clear()
            self._lease = None


def _stop_at_exit(members: list[Member]) -> None:
    """Members still serving when the interpreter exits: each stops its
    shards (they commit their open transactions) and leaves the group, so
    that others take its shards now rather than once its lease expires;
    all within EXIT_TIMEOUT (with the shards stopped after them)."""
    deadline = exit_deadline()
    for member in members:
        try:
            member.stop(max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # the next member is stopped all the same
            log.warning("member %s did not stop cleanly at the interpreter's exit: %s",
                        member.id, exc)


#: The members serving in this process, stopped at exit: before their
#: shards' registry and the journal clients' (see journal.CloseAtExit). A
#: child made by fork has none (their threads and etcd channel are the parent's).
_MEMBERS: Final = CloseAtExit(close_all=_stop_at_exit, forget_in_child=True)
