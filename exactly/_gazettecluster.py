"""The local Gazette cluster (``GazetteCluster``): one etcd and N brokers on
127.0.0.1, started, inspected and stopped from a work directory. See
``exactly.localcluster``, which offers it with the other cluster helpers."""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Self, final

from exactly._clusterbuild import (
    ETCD_VERSION,
    GAZETTE_VERSION,
    Binaries,
    ClusterError,
    Progress,
    ensure_binaries,
    log_tail,
)
from exactly._clustertls import ClusterSecurity
from exactly._clustertypes import (
    ClusterNotFoundError,
    ClusterStartError,
    JournalBrokers,
    ProcessInfo,
)
from exactly._gazctl import journal_route, journal_spec_yaml, run_gazctl
from exactly._procs import (
    Proc,
    alive,
    child_env,
    pick_ports,
    port_open,
    send_signal,
    spawn,
    wait_dead,
)

# The TTL of each broker's etcd lease, in seconds. A broker that dies without
# exiting cleanly (SIGKILL, a crash) keeps its journals until its lease
# expires; only then does the allocator hand them to the surviving brokers.
# Gazette's default is 20 s. Three seconds makes failover quick enough for
# tests, while leaving the keep-alive (sent every TTL/3 = 1 s) room for a
# loaded machine. Measured on 127.0.0.1 (3 brokers, replication 2, appends
# running): see GazetteCluster's docstring.
DEFAULT_ETCD_LEASE: Final = 3

# Where a broker's etcd member key lives: Gazette's default --etcd.prefix,
# allocator.MembersPrefix, then zone#id.
_MEMBERS_PREFIX: Final = "/gazette/cluster/members/"
_ZONE: Final = "local"
#: What a broker logs when its etcd client's first call did not answer within
#: Gazette's dial timeout, a twentieth of the lease (150 ms for 3 s); it then
#: exits. On a busy machine that is a passing delay, not a broken cluster: a
#: broker that exits so while starting is launched again, this many times.
_ETCD_DIAL_FAILED: Final = "failed to build Etcd client"
_RELAUNCHES: Final = 3


# -- the cluster ------------------------------------------------------------------


@final
class GazetteCluster:
    """An etcd server and ``brokers`` Gazette brokers on 127.0.0.1, run from
    ``workdir``.

    ``start()`` picks free ports, starts every process in its own session
    (so that a Ctrl-C at the terminal does not reach them), waits until etcd
    is healthy and every broker answers ``gazctl journals list``, and writes
    ``<workdir>/cluster.json``. ``stop()`` sends SIGTERM, then SIGKILL after
    a grace period, to each recorded PID, and waits for each; it is
    idempotent, and also runs at interpreter exit unless ``stop_at_exit`` is
    False (for a cluster meant to outlive its starter). A directory keeps its
    etcd data and fragments across stop and start: the journals persist.

    Failover: a broker that dies without exiting cleanly keeps its etcd lease
    (``etcd_lease`` seconds, default ``DEFAULT_ETCD_LEASE`` = 3) until it
    expires; then its journals are reassigned. Measured on 127.0.0.1 (SIGKILL
    of the primary of a journal with replication 2 on 3 brokers, appends
    running through a surviving broker): the journal had a new route, and the
    first append after the kill had committed, 3.1 to 3.3 s after the kill
    (2.2 s with a lease of 2 s, 4.2 s with 5 s: the lease, give or take the
    keep-alive interval and etcd's half-second expiry check). Appends started
    meanwhile wait, then commit.

    ``binaries`` defaults to ``ensure_binaries()`` (built at ``start()``).
    ``log_level`` is the brokers' (``debug``, ``info``, ``warn``, ...).
    ``security`` (a ``ClusterSecurity``) makes the brokers serve TLS
    (``https://`` addresses), ask for client certificates if ``mutual``,
    and check authorizations if it has ``auth_keys``; ``gazctl()`` and
    ``client_options()`` then carry the matching credentials. ``broker_env``
    is added to the brokers' environment (the credentials of a cloud
    fragment store, such as an ``S3Server``'s ``aws_env()``).
    """

    def __init__(self, workdir: str | os.PathLike[str], *, brokers: int = 3,
                 binaries: Binaries | None = None, etcd_lease: int = DEFAULT_ETCD_LEASE,
                 log_level: str = "info", stop_at_exit: bool = True,
                 security: ClusterSecurity | None = None,
                 broker_env: Mapping[str, str] | None = None) -> None:
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, not {brokers}")
        if etcd_lease < 2:
            # etcd raises shorter TTLs to its minimum (1.5 election timeouts,
            # 1.5 s by default) and Gazette truncates the TTL to whole seconds.
            raise ValueError(f"etcd_lease must be at least 2 seconds, not {etcd_lease}")
        self.workdir = Path(workdir).resolve()
        self.brokers = brokers
        self.etcd_lease = etcd_lease
        self.log_level = log_level
        self.stop_at_exit = stop_at_exit
        self.security = security
        self.broker_env = dict(broker_env or {})
        self._binaries = binaries
        self._etcd: Proc | None = None
        self._peer_port = 0
        self._brokers: list[Proc] = []
        self._lock = threading.RLock()
        self._at_exit_registered = False

    # -- paths and addresses -----------------------------------------------------

    @property
    def state_file(self) -> Path:
        """``<workdir>/cluster.json``: PIDs and addresses of the processes."""
        return self.workdir / "cluster.json"

    @property
    def fragment_root(self) -> Path:
        """The brokers' ``--broker.file-root``: a journal whose spec lists the
        ``file:///`` store persists its fragments under ``<root>/<journal>/``."""
        return self.workdir / "fragments"

    @property
    def log_dir(self) -> Path:
        """``<workdir>/logs``: ``etcd.log`` and ``broker-<i>.log``."""
        return self.workdir / "logs"

    @property
    def binaries(self) -> Binaries:
        """The binaries this cluster runs (built by ``start()`` if not given)."""
        if self._binaries is None:
            raise ClusterError("the cluster has no binaries yet: call start()")
        return self._binaries

    @property
    def address(self) -> str:
        """The first broker's URL, ``http://127.0.0.1:<port>`` (``BROKER_ADDRESS``)."""
        return self.addresses[0]

    @property
    def addresses(self) -> list[str]:
        """Every broker's URL, in broker order."""
        self._require_started()
        return [b.address for b in self._brokers]

    def client_options(self) -> dict[str, Any]:
        """``GazetteClient`` keyword arguments reaching this cluster's brokers
        (their TLS and authorization; none for a plain cluster)."""
        return self.security.client_options() if self.security is not None else {}

    @property
    def etcd_address(self) -> str:
        """etcd's client URL, ``http://127.0.0.1:<port>``."""
        self._require_started()
        assert self._etcd is not None
        return self._etcd.address

    @property
    def broker_pids(self) -> list[int | None]:
        """Each broker's PID (that of its last start), in broker order."""
        self._require_started()
        return [b.pid for b in self._brokers]

    @property
    def etcd_pid(self) -> int | None:
        """etcd's PID."""
        self._require_started()
        assert self._etcd is not None
        return self._etcd.pid

    def processes(self) -> list[ProcessInfo]:
        """Every process of the cluster, etcd first, and whether it runs."""
        self._require_started()
        assert self._etcd is not None
        return [ProcessInfo(p.name, p.pid, p.address, self._log_path(p.name), alive(p))
                for p in (self._etcd, *self._brokers)]

    def is_running(self) -> bool:
        """True if etcd and every broker run."""
        return self._etcd is not None and all(p.running for p in self.processes())

    def broker_running(self, i: int) -> bool:
        """True if broker ``i`` runs."""
        self._require_started()
        return alive(self._brokers[i])

    # -- start and stop ----------------------------------------------------------

    def start(self, timeout: float = 60.0, *, progress: Progress | None = None) -> Self:
        """Start etcd and the brokers, and wait (at most ``timeout`` seconds)
        until each serves. Builds the binaries first if none were given
        (``progress`` receives the build's lines). Raises ``ClusterStartError``
        (with the tail of the failing process's log) after stopping whatever it
        started, and ``ClusterError`` if a cluster already runs in ``workdir``."""
        with self._lock:
            if self._etcd is not None and any(p.running for p in self.processes()):
                raise ClusterError(f"the cluster in {self.workdir} is already started")
            previous = self._previous_ports()
            if self._binaries is None:
                self._binaries = ensure_binaries(progress=progress)
            for d in (self.workdir, self.fragment_root, self.log_dir):
                d.mkdir(parents=True, exist_ok=True)
            deadline = time.monotonic() + timeout
            for attempt in range(3):
                ports = pick_ports(self.brokers + 2, [] if attempt else previous)
                self._etcd = Proc("etcd", ports[0])
                self._peer_port = ports[1]
                scheme = "https" if self.security is not None else "http"
                self._brokers = [Proc(f"broker-{i}", port, scheme=scheme)
                                 for i, port in enumerate(ports[2:])]
                try:
                    self._start_all(deadline)
                    break
                except ClusterStartError as exc:
                    self._stop_processes(grace=0.0)
                    # Another program may have taken a port between our pick and
                    # the server's bind: pick again.
                    if "address already in use" not in exc.log_tail or attempt == 2:
                        raise
                except BaseException:  # KeyboardInterrupt included: leave nothing running
                    self._stop_processes(grace=0.0)
                    raise
            self._write_state()
            if self.stop_at_exit and not self._at_exit_registered:
                atexit.register(self._stop_at_exit)
                self._at_exit_registered = True
            return self

    def stop(self, grace: float = 2.0) -> None:
        """Stop every process by PID: SIGTERM, then SIGKILL after ``grace``
        seconds; wait for each to exit. Brokers stop first, etcd last.
        Idempotent; processes already gone are skipped.

        A broker given SIGTERM exits only once it has handed its journals to
        brokers that stay, so when all stop, those holding journals are
        killed after ``grace``. Their fragments not yet persisted (still
        being written: see ``journal_spec_yaml``) are lost; the journals
        themselves, and their persisted fragments, remain for a next start."""
        with self._lock:
            if self._etcd is None:
                return
            self._stop_processes(grace)
            if self._at_exit_registered:
                atexit.unregister(self._stop_at_exit)
                self._at_exit_registered = False

    def _stop_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def kill_broker(self, i: int, sig: int = signal.SIGKILL, *, timeout: float = 30.0) -> None:
        """Send ``sig`` to broker ``i`` and wait until it has exited. After
        SIGTERM a broker first hands its journals to others, which takes longer
        than SIGKILL's instant death. Raises ``ClusterError`` if the broker does
        not run, or still runs after ``timeout`` seconds."""
        with self._lock:
            self._require_started()
            proc = self._brokers[i]
            if not alive(proc):
                raise ClusterError(f"{proc.name} does not run")
            send_signal(proc, sig)
            if not wait_dead(proc, timeout):
                raise ClusterError(f"{proc.name} (pid {proc.pid}) still runs {timeout:g}s "
                                   f"after signal {signal.Signals(sig).name}")

    def start_broker(self, i: int, *, timeout: float = 30.0) -> None:
        """Start broker ``i`` again, with its former port and id, and wait until
        it serves. When the former process died without exiting cleanly, its
        etcd lease is revoked first (as its expiry would, only sooner): Gazette
        would otherwise wait for the lease to expire, then 10 s more, before the
        new process could announce itself."""
        with self._lock:
            self._require_started()
            proc = self._brokers[i]
            if alive(proc):
                raise ClusterError(f"{proc.name} already runs (pid {proc.pid})")
            if proc.popen is not None:
                proc.popen.wait()
            self._revoke_member_lease(proc.name)
            deadline = time.monotonic() + timeout
            self._launch_broker(proc)
            self._write_state()
            try:
                self._wait_broker(proc, deadline)
            finally:
                self._write_state()

    def restart_etcd(self, down: float = 0.0, *, sig: int = signal.SIGKILL,
                     timeout: float = 30.0) -> None:
        """Send etcd ``sig``, wait until it has exited, leave it down
        ``down`` seconds, and start it again on its former port and data:
        its keys and leases are kept (etcd renews every lease by its TTL on
        start)."""
        with self._lock:
            self._require_started()
            proc = self._etcd
            assert proc is not None
            if alive(proc):
                send_signal(proc, sig)
                if not wait_dead(proc, timeout):
                    raise ClusterError(f"etcd (pid {proc.pid}) still runs {timeout:g}s after"
                                       f" signal {signal.Signals(sig).name}")
            if proc.popen is not None:
                proc.popen.wait()
            time.sleep(down)
            deadline = time.monotonic() + timeout
            self._launch_etcd(proc)
            self._write_state()
            self._wait_etcd(proc, deadline)

    def ensure_brokers(self, timeout: float = 30.0) -> list[int]:
        """Start again every broker whose process has exited; return their
        indexes. (A broker exits by itself if it loses its etcd lease.)"""
        with self._lock:
            dead = [i for i, b in enumerate(self._brokers) if not alive(b)]
            for i in dead:
                self.start_broker(i, timeout=timeout)
            return dead

    # -- gazctl ------------------------------------------------------------------

    def gazctl(self, *args: str, input: bytes | None = None, check: bool = True,
               broker: int | None = None,
               timeout: float | None = 60.0) -> subprocess.CompletedProcess[bytes]:
        """Run ``gazctl args...`` against broker ``broker`` (by default the
        first one that runs) through ``BROKER_ADDRESS``, capturing its output.
        With ``check``, a non-zero exit raises ``GazctlError``."""
        if broker is None:
            running = [i for i, b in enumerate(self._brokers) if alive(b)]
            broker = running[0] if running else 0
        return self._gazctl(self.addresses[broker], args, input=input, check=check,
                            timeout=timeout)

    def create_journal(self, name: str, *, replication: int = 1,
                       content_type: str | None = "application/x-ndjson",
                       labels: Mapping[str, str | Sequence[str]] | None = None,
                       fragment_length: int = 1 << 20, compression: str = "NONE",
                       flush_interval: str | None = None,
                       timeout: float | None = 30.0) -> JournalBrokers:
        """Create (or update) journal ``name`` with ``gazctl journals apply``
        (see ``journal_spec_yaml`` for the arguments; its fragments persist
        under ``fragment_root``), then wait until brokers serve it: a primary
        and ``replication`` replicas assigned. Returns that route; with
        ``timeout`` None, returns at once (the route then may be empty)."""
        spec = journal_spec_yaml(name, replication=replication, content_type=content_type,
                                 labels=labels, fragment_length=fragment_length,
                                 compression=compression, flush_interval=flush_interval,
                                 revision=-1)
        self.gazctl("journals", "apply", input=spec.encode())
        if timeout is None:
            return self.journal_brokers(name)
        deadline = time.monotonic() + timeout
        while True:
            route = self.journal_brokers(name)
            if route.primary is not None and len(route.members) >= replication:
                return route
            if time.monotonic() >= deadline:
                raise ClusterError(f"journal {name} has no primary and {replication} "
                                   f"replicas after {timeout:g}s (route: {route})")
            time.sleep(0.02)

    def journal_brokers(self, name: str) -> JournalBrokers:
        """Which brokers serve journal ``name`` now (``gazctl journals list``).
        Raises ``ClusterError`` if there is no such journal."""
        r = self.gazctl("journals", "list", "-l", f"name={name}", "-o", "json")
        primary, suffixes = journal_route(r.stdout, name)
        names = [b.name for b in self._brokers]
        unknown = [s for s in suffixes if s not in names]
        if unknown:
            raise ClusterError(f"journal routed to an unknown broker {unknown[0]!r}")
        members = tuple(names.index(s) for s in suffixes)
        return JournalBrokers(None if primary is None else members[primary], members)

    # -- another process's cluster -----------------------------------------------

    @classmethod
    def attach(cls, workdir: str | os.PathLike[str]) -> GazetteCluster:
        """The cluster that a process (this one or another) started in
        ``workdir``, from its ``cluster.json``: ``stop()``, ``kill_broker()``,
        ``start_broker()`` and ``gazctl()`` work on it. It is not stopped at
        exit. Raises ``ClusterNotFoundError`` if no cluster was started there."""
        path = Path(workdir).resolve() / "cluster.json"
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ClusterNotFoundError(f"no cluster in {path.parent} (no cluster.json)") from None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {path}: {exc}") from None
        try:
            bins = doc["binaries"]
            cluster = cls(path.parent, brokers=len(doc["brokers"]),
                          binaries=Binaries(Path(bins["gazette"]), Path(bins["gazctl"]),
                                            Path(bins["etcd"])),
                          etcd_lease=int(doc["etcd_lease"]), log_level=str(doc["log_level"]),
                          stop_at_exit=False,
                          security=ClusterSecurity.from_json(doc["security"])
                          if doc.get("security") else None)
            cluster._etcd = Proc.from_json(doc["etcd"])
            cluster._peer_port = int(doc["etcd_peer_port"])
            cluster._brokers = [Proc.from_json(b) for b in doc["brokers"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterError(f"{path} is not a cluster state file ({exc!r})") from None
        return cluster

    def __enter__(self) -> Self:
        if self._etcd is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = ", ".join(self.addresses) if self._etcd is not None else "not started"
        return f"GazetteCluster({str(self.workdir)!r}, brokers={self.brokers}: {where})"

    # -- internals ---------------------------------------------------------------

    def _require_started(self) -> None:
        if self._etcd is None:
            raise ClusterError(f"the cluster in {self.workdir} was never started")

    def _log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _previous_ports(self) -> list[int]:
        """The ports of the last cluster in ``workdir`` (etcd's, its peer port,
        the brokers'), to be used again where free: then ``BROKER_ADDRESS``
        stays valid across a stop and a start."""
        try:
            old = GazetteCluster.attach(self.workdir)
        except ClusterError:
            return []
        if old._etcd is not None and any(p.running for p in old.processes()):
            raise ClusterError(f"a cluster already runs in {self.workdir} "
                               f"(stop it first: exactly cluster stop --dir {self.workdir})")
        assert old._etcd is not None
        return [old._etcd.port, old._peer_port, *(b.port for b in old._brokers)]

    def _start_all(self, deadline: float) -> None:
        # cluster.json is written as soon as a process starts, so that whatever
        # happens to this process, `attach(workdir).stop()` finds them all.
        assert self._etcd is not None
        self._launch_etcd(self._etcd)
        self._write_state()
        self._wait_etcd(self._etcd, deadline)
        for b in self._brokers:
            # A broker of a former run that was killed left its member key,
            # under a lease that etcd renewed on restart.
            self._revoke_member_lease(b.name)
        for b in self._brokers:
            self._launch_broker(b)
        self._write_state()
        for b in self._brokers:
            self._wait_broker(b, deadline)

    def _spawn(self, proc: Proc, argv: list[str], env: dict[str, str]) -> None:
        spawn(proc, argv, env, cwd=self.workdir, log_path=self._log_path(proc.name),
              what="exactly.localcluster")

    def _launch_etcd(self, proc: Proc) -> None:
        peer = f"http://127.0.0.1:{self._peer_port}"
        self._spawn(proc, [
            str(self.binaries.etcd), "--name", "exactly",
            "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", proc.address, "--advertise-client-urls", proc.address,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"exactly={peer}",
            "--log-level", "warn" if self.log_level in ("warn", "error", "fatal") else "info",
        ], child_env(["ETCD_"]))

    def _launch_broker(self, proc: Proc) -> None:
        self._spawn(proc, [
            str(self.binaries.gazette), "serve",
            f"--broker.zone={_ZONE}", f"--broker.id={proc.name}",
            "--broker.host=127.0.0.1", f"--broker.port={proc.port}",
            f"--broker.file-root={self.fragment_root}",
            f"--etcd.address={self.etcd_address}", f"--etcd.lease={self.etcd_lease}s",
            f"--log.level={self.log_level}",
            *(self.security.broker_flags() if self.security is not None else ()),
        ], {**child_env(["BROKER_", "ETCD_", "LOG_", "DEBUG_", "AUTH_"]), **self.broker_env})

    def _exited(self, proc: Proc, what: str) -> ClusterStartError:
        rc = proc.popen.poll() if proc.popen is not None else None
        log_path = self._log_path(proc.name)
        status = f" with status {rc}" if rc is not None else ""
        return ClusterStartError(
            f"{proc.name} exited{status} {what} (log: {log_path})",
            process=proc.name, log_path=log_path, log_tail=log_tail(log_path))

    def _timed_out(self, proc: Proc, what: str) -> ClusterStartError:
        log_path = self._log_path(proc.name)
        return ClusterStartError(
            f"{proc.name} did not {what} in time (log: {log_path})",
            process=proc.name, log_path=log_path, log_tail=log_tail(log_path))

    def _wait_etcd(self, proc: Proc, deadline: float) -> None:
        while True:
            if not alive(proc):
                raise self._exited(proc, "while starting")
            with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(
                    f"{proc.address}/health", timeout=1.0) as resp:
                if json.loads(resp.read()).get("health") == "true":
                    return
            if time.monotonic() >= deadline:
                raise self._timed_out(proc, "become healthy")
            time.sleep(0.05)

    def _wait_broker(self, proc: Proc, deadline: float) -> None:
        last = ""
        relaunches = 0
        while True:
            if not alive(proc):
                if (relaunches < _RELAUNCHES and time.monotonic() < deadline
                        and self._gave_up_on_etcd(proc)):
                    relaunches += 1
                    self._launch_broker(proc)
                    self._write_state()
                    continue
                raise self._exited(proc, "while starting")
            if port_open(proc.port):
                try:
                    r = self._gazctl(proc.address, ("journals", "list"), input=None,
                                     check=False, timeout=5.0)
                    if r.returncode == 0:
                        return
                    last = r.stderr.decode(errors="replace").strip()
                except ClusterError as exc:
                    last = str(exc)
            if time.monotonic() >= deadline:
                err = self._timed_out(proc, "serve `gazctl journals list`")
                if last:
                    err.args = (f"{err.args[0]}\n--- gazctl's last error ---\n{last}",)
                raise err
            time.sleep(0.1)

    def _gave_up_on_etcd(self, proc: Proc) -> bool:
        """Whether the last run of ``proc`` (a broker) exited because its etcd
        client's first call timed out (see ``_ETCD_DIAL_FAILED``)."""
        tail = log_tail(self._log_path(proc.name))
        last_run = tail.rpartition("\n=== ")[2]  # spawn() heads each run with a line
        return _ETCD_DIAL_FAILED in last_run

    def _gazctl(self, address: str, args: Sequence[str], *, input: bytes | None,
                check: bool, timeout: float | None) -> subprocess.CompletedProcess[bytes]:
        return run_gazctl(self.binaries.gazctl, address, args, input=input, check=check,
                          timeout=timeout,
                          env=self.security.client_env() if self.security is not None else None)

    def _stop_processes(self, grace: float) -> None:
        brokers = [b for b in self._brokers if alive(b)]
        for group in (brokers, [self._etcd] if self._etcd is not None else []):
            for p in group:
                send_signal(p, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for p in group:
                if not wait_dead(p, deadline - time.monotonic()):
                    send_signal(p, signal.SIGKILL)
                    wait_dead(p, 10.0)

    def _revoke_member_lease(self, broker_id: str) -> None:
        key = f"{_MEMBERS_PREFIX}{_ZONE}#{broker_id}".encode()
        found = self._etcd_call("/v3/kv/range", {"key": base64.b64encode(key).decode()})
        for kv in found.get("kvs", []):
            lease = kv.get("lease")
            if lease and lease != "0":
                self._etcd_call("/v3/lease/revoke", {"ID": lease})

    def _etcd_call(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A call to etcd's JSON gateway (etcd serves its gRPC API as JSON too)."""
        req = urllib.request.Request(f"{self.etcd_address}{path}", json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5.0) as resp:
                doc = json.loads(resp.read())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"etcd at {self.etcd_address} did not answer {path}: "
                               f"{exc}") from None
        return doc if isinstance(doc, dict) else {}

    def _write_state(self) -> None:
        assert self._etcd is not None
        doc = {
            "gazette_version": GAZETTE_VERSION,
            "etcd_version": ETCD_VERSION,
            "address": self._brokers[0].address,
            "etcd_address": self._etcd.address,
            "etcd_peer_port": self._peer_port,
            "etcd_lease": self.etcd_lease,
            "log_level": self.log_level,
            "fragment_root": str(self.fragment_root),
            "binaries": {"gazette": str(self.binaries.gazette),
                         "gazctl": str(self.binaries.gazctl),
                         "etcd": str(self.binaries.etcd)},
            "etcd": self._etcd.to_json(),
            "brokers": [b.to_json() for b in self._brokers],
            "security": self.security.to_json() if self.security is not None else None,
        }
        tmp = self.state_file.with_name(f".cluster.json.{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, self.state_file)
