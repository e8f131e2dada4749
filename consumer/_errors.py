"""Errors of the ``consumer`` package.

::

    ConsumerError
     ├── FencedError        another instance of the shard's store restored
     │                      since this one did: this instance may not commit
     │                      (.shard)
     ├── StoreError         a store provided here could not restore or commit
     │    │                 (.shard, .store); the cause is chained
     │    └── StoreElsewhereError  the shard's store is on another host's disk
     ├── SpecFileError      a file of shard specs that cannot be applied
     └── EtcdError          etcd, where members claim shards, failed or refused
                            a call (.code: gRPC's status name)

An exception raised by the application itself (``consume_message``,
``finalize_txn``, ..., and the store it made) is never wrapped: the runtime
stops the shard and raises it as it is. The stores provided here raise
``StoreError`` for what their database or file system refused. Journal
errors keep their own tree (``journal.JournalError``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class ConsumerError(Exception):
    """Base of every error raised by the ``consumer`` package."""

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled with its attributes (``.shard``, ...), which are keywords
        # of the constructor rather than ``args``.
        return (type(self), self.args, self.__dict__ or None)


class FencedError(ConsumerError):
    """A newer instance of this shard restored its store: this one is a
    zombie, and its transaction must not commit. A store of the
    application's raises it as any exception (``FencedError("...")``);
    ``shard``, the shard's id, is optional."""

    def __init__(self, message: str = "", *, shard: str | None = None) -> None:
        super().__init__(message)
        self.shard = shard


class StoreError(ConsumerError):
    """A store failed to restore a checkpoint or to commit one (the cause is
    chained), or holds something that is not a checkpoint."""

    def __init__(self, message: str, *, shard: str | None = None, store: str = "") -> None:
        super().__init__(message)
        self.shard = shard
        self.store = store


@contextlib.contextmanager
def store_failures(
    store: object, doing: str, shard: str, kinds: tuple[type[BaseException], ...]
) -> Iterator[None]:
    """Raise an exception of ``kinds`` (the database's or the file system's
    errors) as a ``StoreError`` of ``store`` chained to it."""
    try:
        yield
    except ConsumerError:
        raise
    except kinds as exc:
        raise StoreError(
            f"shard {shard}: {type(store).__name__} {doing}: {exc}",
            shard=shard, store=type(store).__name__,
        ) from exc


class EtcdError(ConsumerError):
    """etcd did not answer, or refused a call; ``code`` is gRPC's status name
    (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ...), empty when not known."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code

    @property
    def unreachable(self) -> bool:
        """etcd did not answer (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``): a
        later attempt may get through, unlike a call it refused."""
        return self.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
