"""Processes of local clusters: started in their own session, logged to a
file, known by PID and start time (so that a PID reused by another program is
never signalled), and stopped by PID. Shared by the Gazette and Spark clusters."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class Proc:
    name: str
    port: int
    pid: int | None = None
    #: "https" for a process that serves TLS.
    scheme: str = "http"
    # Start time (clock ticks since boot, from /proc): guards against
    # signalling an unrelated process that reused a dead one's PID.
    start_time: int | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "port": self.port, "pid": self.pid,
                "start_time": self.start_time, "address": self.address}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Proc:
        return cls(name=str(doc["name"]), port=int(doc["port"]),
                   pid=None if doc.get("pid") is None else int(doc["pid"]),
                   start_time=None if doc.get("start_time") is None
                   else int(doc["start_time"]),
                   scheme=str(doc.get("address", "http://")).split("://", 1)[0])


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(proc: Proc) -> bool:
    """Whether ``proc`` runs: the same process (by start time), not a zombie."""
    if proc.pid is None:
        return False
    if proc.popen is not None and proc.popen.poll() is not None:
        return False
    if os.path.isdir("/proc"):
        stat = proc_stat(proc.pid)
        if stat is None or stat[0] in ("Z", "X"):
            if proc.popen is not None:
                proc.popen.poll()  # our child, exited since the poll above: reap it
            return False
        return proc.start_time is None or stat[1] == proc.start_time
    try:
        os.kill(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def send_signal(proc: Proc, sig: int) -> None:
    if alive(proc):
        assert proc.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def wait_dead(proc: Proc, timeout: float) -> bool:
    """Wait until ``proc`` has exited (reaping it if it is our child)."""
    deadline = time.monotonic() + timeout
    if proc.popen is not None:
        try:
            proc.popen.wait(timeout=max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False
    while alive(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now (the kernel's picks)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pick_ports(n: int, wanted: Sequence[int]) -> list[int]:
    """``n`` distinct free ports: ``wanted[i]`` for slot ``i`` where it is
    free, a port the kernel picks otherwise."""
    fresh = free_ports(n + len(wanted))
    chosen: list[int] = []
    for i in range(n):
        if i < len(wanted) and wanted[i] not in chosen and port_free(wanted[i]):
            chosen.append(wanted[i])
        else:
            chosen.append(next(p for p in fresh if p not in chosen and p not in wanted))
    return chosen


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As Go's listeners do: a port whose last connections linger in
        # TIME_WAIT can be listened on again.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def child_env(drop_prefixes: Sequence[str]) -> dict[str, str]:
    """Our environment less the variables a server would read as its own
    configuration (gazette reads BROKER_*, ETCD_*, LOG_*; etcd reads ETCD_*)."""
    return {k: v for k, v in os.environ.items()
            if not any(k.startswith(p) for p in drop_prefixes)}




def spawn(proc: Proc, argv: list[str], env: dict[str, str], *, cwd: Path, log_path: Path,
          what: str) -> None:
    """Start ``argv`` for ``proc`` in a session of its own, its output
    appended to ``log_path`` after a line saying who started it."""
    with open(log_path, "ab") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {what} "
                  f"starts: {' '.join(argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    proc.popen, proc.pid = popen, popen.pid
    stat = proc_stat(popen.pid)
    proc.start_time = stat[1] if stat else None


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
