"""What a local cluster reports: the errors of starting one, a process of
it (``ProcessInfo``) and the brokers of a journal (``JournalBrokers``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exactly._clusterbuild import ClusterError, with_log_tail


class ClusterStartError(ClusterError):
    """A cluster process exited while starting, or did not become ready in
    time. ``process`` names it (``etcd``, ``broker-1``); ``log_path`` is its log
    and ``log_tail`` the log's last lines."""

    def __init__(self, message: str, *, process: str, log_path: Path | None,
                 log_tail: str = "") -> None:
        super().__init__(with_log_tail(message, log_path, log_tail))
        self.process = process
        self.log_path = log_path
        self.log_tail = log_tail


class ClusterNotFoundError(ClusterError):
    """No cluster was ever started in the directory given to ``attach``."""


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process of a cluster: ``name`` (``etcd``, ``broker-0``, ...), its
    ``pid`` (None if never started), ``address`` (client URL), ``log`` path,
    and whether it is ``running``."""

    name: str
    pid: int | None
    address: str
    log: Path
    running: bool


@dataclass(frozen=True, slots=True)
class JournalBrokers:
    """The brokers serving a journal, by index in the cluster: its ``primary``
    (None while unassigned) and all ``members`` (primary included)."""

    primary: int | None
    members: tuple[int, ...]
