"""A throwaway PostgreSQL server on 127.0.0.1, for the tests and benchmarks
of ``consumer.PostgresStore``.

It uses the server programs of the machine (``initdb`` and ``postgres`` on
PATH, or Debian's ``/usr/lib/postgresql/<version>/bin``); where there are
none, it installs Debian's ``postgresql`` package when it can (as root, with
apt-get). PostgreSQL refuses to run as root: run by root, the server runs as
the ``postgres`` user (or ``nobody``) in a data directory it owns. It is
stopped by PID, and its data directory removed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from ._errors import ExactlyError
from ._procs import free_ports, port_open


class PostgresUnavailableError(ExactlyError, RuntimeError):
    """No PostgreSQL server could be found, installed or started here."""


def _find_bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                  key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0)
    for d in reversed(dirs):
        if os.path.exists(f"{d}/initdb") and os.path.exists(f"{d}/postgres"):
            return Path(d)
    return None


def server_bin_dir(install: bool = True) -> Path:
    """The directory of ``initdb`` and ``postgres``; installs Debian's
    package first if there are none and ``install`` (as root, with apt-get)."""
    found = _find_bin_dir()
    if found is not None:
        return found
    if install and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "postgresql"], env=env, capture_output=True, timeout=900, check=False)
        found = _find_bin_dir()
        if found is not None:
            return found
    raise PostgresUnavailableError(
        "no PostgreSQL server programs (initdb, postgres) here, and Debian's postgresql"
        " package could not be installed"
    )


def _run_as() -> pwd.struct_passwd | None:
    """The user the server runs as when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailableError("running as root, with no postgres or nobody user to run as")


class PostgresServer:
    """A PostgreSQL server of its own data directory; ``dsn`` connects to it.

    ``start()`` runs initdb and starts the server on a free port of
    127.0.0.1; ``stop()`` stops it by PID (fast shutdown, then SIGKILL) and
    removes the data directory. A context manager.
    """

    def __init__(self, base: str | os.PathLike[str] | None = None) -> None:
        self._base = base
        self.data_dir: Path | None = None
        self.port = 0
        self._popen: subprocess.Popen[bytes] | None = None
        self._user = _run_as()

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def dsn_of(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    def _as_user(self) -> dict[str, object]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def start(self, timeout: float = 60.0) -> None:
        bin_dir = server_bin_dir()
        # A directory of our own that the server's user can reach (pytest's
        # temporary directories are private to their owner).
        self.data_dir = Path(tempfile.mkdtemp(prefix="exactly-pg-", dir=self._base))
        if self._user is not None:
            os.chown(self.data_dir, self._user.pw_uid, self._user.pw_gid)
        data = str(self.data_dir / "data")
        log_path = self.data_dir / "server.log"
        init = subprocess.run(
            [str(bin_dir / "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
             "-E", "UTF8", "--no-sync"],
            capture_output=True, timeout=120, check=False, **self._as_user(),  # type: ignore[call-overload]
        )
        if init.returncode != 0:
            raise PostgresUnavailableError(
                f"initdb failed: {init.stderr.decode(errors='replace').strip()[-500:]}"
            )
        self.port = free_ports(1)[0]
        with open(log_path, "ab") as log:
            self._popen = subprocess.Popen(  # type: ignore[call-overload]
                [str(bin_dir / "postgres"), "-D", data, "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1",
                 "-c", f"unix_socket_directories={self.data_dir}", "-c", "max_connections=200"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, **self._as_user(),
            )
        if self._user is not None:
            with contextlib.suppress(OSError):
                os.chown(log_path, self._user.pw_uid, self._user.pw_gid)
        deadline = time.monotonic() + timeout
        while not self._ready(bin_dir):
            assert self._popen is not None
            if self._popen.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-800:]
                self.stop()
                raise PostgresUnavailableError(f"the PostgreSQL server did not start: {tail}")
            time.sleep(0.05)

    def _ready(self, bin_dir: Path) -> bool:
        """Accepting connections (not only listening: it may still be starting)."""
        if not port_open(self.port):
            return False
        probe = subprocess.run([str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                                str(self.port)], capture_output=True, timeout=30, check=False)
        return probe.returncode == 0

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its DSN."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_of(name)

    def stop(self) -> None:
        popen, self._popen = self._popen, None
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGINT)  # fast shutdown: rolls back, exits
            try:
                popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
