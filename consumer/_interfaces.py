"""The contracts of the ``consumer`` package: what an application writes
(``Application``) and what a store must do (``Store``).

A transaction of a shard, as the runtime drives it::

    begin_txn(shard, store)                         first message ready
    consume_message(shard, store, envelope, pub)    each committed message
    ...                                             until max_txn_duration, or
                                                    nothing ready past min_txn_duration
    finalize_txn(shard, store, pub)
    store.start_commit(shard, checkpoint)           the commit point
    ACK intents appended                            downstream readers see the output
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from journal import JournalSpec
    from message import Checkpoint, Envelope, Message, Publisher

    from ._shard import Shard


@runtime_checkable
class Store(Protocol):
    """Where a shard keeps its state and its checkpoint, committed together.

    ``restore_checkpoint`` returns the last committed checkpoint (an empty
    one at first) and fences off every earlier instance of the same store: a
    commit by one of them raises ``FencedError`` from then on.
    ``start_commit`` commits the changes of the transaction and the
    checkpoint atomically and durably, or raises (``FencedError`` when
    fenced off); the changes are lost if it is never called.
    ``consumer.testing.check_store`` holds an implementation to this contract.

    A store may also have ``prepare_commit(shard, checkpoint) ->
    PreparedCommit``: ``start_commit`` in two steps, so that its slow part
    runs while the runtime still waits for the transaction's appends to be
    durable (``JSONFileStore`` writes and fsyncs its file then). The
    runtime uses it when the store's ``start_commit`` is the one defined
    with it (a store that overrides or wraps ``start_commit`` alone gets
    ``start_commit`` called).
    """

    def restore_checkpoint(self, shard: Shard) -> Checkpoint: ...

    def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None: ...

    def close(self) -> None: ...


class PreparedCommit(Protocol):
    """What a store's optional ``prepare_commit`` returns: the transaction's
    changes and checkpoint, as of the call, made ready to commit (written,
    even durably) without being the store's yet.

    ``commit()`` makes them the store's, atomically and durably, and raises
    as ``start_commit`` would (``FencedError`` when fenced off);
    ``abort()`` drops them. Exactly one of the two is called, and no other
    commit of the store runs between ``prepare_commit`` and it.
    """

    def commit(self) -> None: ...

    def abort(self) -> None: ...


class Application(abc.ABC):
    """What a consumer does with its messages: subclass it.

    Every method runs on the shard's own thread, one call at a time for a
    shard. One application serves every shard of a ``Runner`` or ``Member``,
    so calls for different shards run at once, on their threads: keep what
    belongs to one shard in its store, or under ``shard.id``, never in an
    attribute that all shards share.
    ``publisher`` belongs to this start of the shard (a fresh producer ID
    each time it starts): what ``consume_message`` or ``finalize_txn``
    publishes with ``publisher.publish_uncommitted`` commits with the
    transaction, or not at all. (``publish_committed`` messages are visible
    at once, outside the transaction: at-least-once.)

    ``consume_message`` may run more than once for a message (a crash before
    the commit replays it); exactly one of those transactions commits.
    """

    @abc.abstractmethod
    def new_store(self, shard: Shard) -> Store:
        """The store of ``shard``, opened (its checkpoint not yet restored)."""

    @abc.abstractmethod
    def new_message(self, spec: JournalSpec) -> Message:
        """An empty message to decode a frame of journal ``spec`` into."""

    @abc.abstractmethod
    def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope, publisher: Publisher
    ) -> None:
        """Apply one committed message of a source (ACK messages are not handed over)."""

    def begin_txn(self, shard: Shard, store: Store) -> None:  # noqa: B027 -- optional hook
        """Called before the first message of each transaction."""

    def finalize_txn(  # noqa: B027 -- optional hook
        self, shard: Shard, store: Store, publisher: Publisher
    ) -> None:
        """Called once a transaction has consumed its last message, before the
        commit: write what was kept in memory, publish what sums it up."""


def check_application(app: object) -> None:
    """Raise ``TypeError`` unless ``app`` has the methods an application must."""
    for name in ("new_store", "new_message", "consume_message"):
        if not callable(getattr(app, name, None)):
            raise TypeError(f"the application has no {name}() method")
