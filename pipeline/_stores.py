"""Where the journals of a read or write of the data source live: the
embedded store under ``root``, or a Gazette cluster at ``broker``.

The options travel with every task, and each task opens its own client: on
a Spark cluster nothing but the network is shared, so an executor reaches a
Gazette cluster itself (and, with ``file_root``, reads persisted fragments
straight from the fragment store mounted there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from journal import GazetteClient, JournalSpec, JournalStore, LocalJournalStore

from ._values import bool_option, given, positive_option, seconds_option

#: Journals the pipeline keeps its own state in (intent logs, attempt records,
#: streaming sinks' progress): under this prefix, in the same store as the
#: data, so that the driver and every executor reach them. Reads by selector
#: leave them out.
STATE_PREFIX: Final = ".exactly/pipeline/"

#: The data source's options for a secured cluster: GazetteClient's keyword
#: arguments of the same names.
SECURITY_OPTIONS: Final = ("trusted_ca_file", "cert_file", "cert_key_file", "auth_keys")
#: The data source's options for how a task's client waits and reads: seconds
#: for GazetteClient's keyword arguments of the same names (``retry_timeout``
#: may be 0), and ``direct_reads`` (``true`` or ``false``).
SECONDS_OPTIONS: Final = ("connect_timeout", "retry_timeout", "auth_token_ttl")


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """``root`` (a store directory) or ``broker`` (a Gazette broker URL), and
    for a broker, ``file_root``: where its ``file://`` fragment store is
    mounted on the hosts that run tasks, if it is."""

    root: str | None = None
    broker: str | None = None
    file_root: str | None = None
    #: With ``broker``: GazetteClient's options for a secured cluster
    #: (``trusted_ca_file``, ``cert_file``, ``cert_key_file``, ``auth_keys``),
    #: those given; the rest are read from each task's environment.
    security: tuple[tuple[str, str], ...] = ()
    #: With ``broker``: the replication of every journal the job creates,
    #: its own state journals included (option ``replication``; None: the
    #: client's default).
    replication: int | None = None
    #: With ``broker``: the options of ``SECONDS_OPTIONS`` and
    #: ``direct_reads`` given, as GazetteClient's keyword arguments.
    client: tuple[tuple[str, float | bool], ...] = ()

    @classmethod
    def of(cls, options: Mapping[str, str]) -> StoreOptions:
        root, broker = options.get("root"), options.get("broker")
        if bool(root) == bool(broker):
            raise ValueError(
                "the journal data source needs the option root (a store directory) or the"
                " option broker (a Gazette broker URL, e.g. http://127.0.0.1:8080)"
                + (": give one, not both" if root else ": neither was given")
            )
        if root:
            # Absolute: executors resolve relative paths in their own working directory.
            return cls(root=os.path.abspath(root))
        # (An empty one is kept: it means none, whatever the task's
        # environment says, as for GazetteClient.)
        security = tuple((k, v) for k in SECURITY_OPTIONS if (v := options.get(k)) is not None)
        replication = positive_option(options, "replication",
                                      "a whole number of brokers, at least 1")
        return cls(broker=broker, file_root=options.get("file_root") or None, security=security,
                   replication=replication, client=_client_options(options))

    def open(self, *, create: bool = False) -> JournalStore:
        """A client of the store (to be closed by the caller). A store
        directory must exist unless ``create``."""
        if self.broker is not None:
            given = dict(self.security)
            # The client's own default unless the job says otherwise.
            extra: dict[str, Any] = {}
            if self.replication is not None:
                extra["replication"] = self.replication
            extra.update(self.client)
            return GazetteClient(
                self.broker, file_root=self.file_root, **extra,
                trusted_ca_file=given.get("trusted_ca_file"), cert_file=given.get("cert_file"),
                cert_key_file=given.get("cert_key_file"), auth_keys=given.get("auth_keys"),
            )
        assert self.root is not None
        if not create and not os.path.isdir(self.root):
            raise ValueError(f"no journal store at {self.root} (option root)")
        return LocalJournalStore(self.root)

    def describe(self) -> str:
        return f"the cluster at {self.broker}" if self.broker else f"the store at {self.root}"


def _client_options(options: Mapping[str, str]) -> tuple[tuple[str, float | bool], ...]:
    out: list[tuple[str, float | bool]] = []
    for name in SECONDS_OPTIONS:
        seconds = seconds_option(options, name, zero_ok=name == "retry_timeout")  # 0: no retry
        if seconds is not None:
            out.append((name, seconds))
    if given(options, "direct_reads"):
        out.append(("direct_reads", bool_option(options, "direct_reads", True)))
    return tuple(out)


def select_journals(client: JournalStore, options: Mapping[str, str]) -> list[JournalSpec]:
    """The journals named by the options ``journal`` or ``selector`` (the
    pipeline's own state journals are never selected)."""
    journal, selector = options.get("journal"), options.get("selector")
    if (journal is None) == (selector is None):
        raise ValueError("give exactly one of the options journal and selector")
    if journal is not None:
        return [client.get(journal)]
    return [s for s in client.list(selector or "") if not s.name.startswith(STATE_PREFIX)]
