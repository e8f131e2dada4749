"""Conformance checks for ``Store`` implementations: a store written for an
application passes ``check_store`` as the provided ones do.

::

    from consumer.testing import check_store

    def test_my_store(tmp_path):
        check_store(lambda: MyStore(tmp_path / "db"))

``new_store()`` must return a new instance over the *same* storage each
time it is called: the checks restore, commit and fence across instances,
as successive starts (and zombie copies) of a shard do.
"""

from __future__ import annotations

from collections.abc import Callable

from journal import MemoryJournalClient
from message import Checkpoint, ProducerState

from ._errors import ConsumerError, FencedError
from ._interfaces import Store
from ._shard import Shard, ShardSpec


def _shard(shard_id: str) -> Shard:
    return Shard(ShardSpec(shard_id, sources=("conformance/source",)), MemoryJournalClient())


def _checkpoint(n: int) -> Checkpoint:
    producer = bytes([1, 2, 3, 4, 5, n % 256])
    return Checkpoint(
        offsets={"conformance/source": 100 * n, "conformance/other": 7 * n},
        states=[ProducerState("conformance/source", producer, (n << 8) + 1, -1),
                ProducerState("conformance/other", producer, 1 << 40, 3 * n)],
        ack_intents={"conformance/out": f'{{"ack": {n}}}\n'.encode(), "conformance/empty": b""},
    )


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"store contract: {what}")


def check_store(
    new_store: Callable[[], Store], *, several_shards: bool = False,
    shard_id: str = "conformance-shard",
) -> None:
    """Hold a store implementation to the ``Store`` contract (see the module
    docstring); raises ``AssertionError`` naming the first rule broken.
    ``several_shards``: the storage keeps several shards' checkpoints apart
    (a SQL table does; a ``JSONFileStore`` directory holds one shard)."""
    shard = _shard(shard_id)

    first = new_store()
    _expect(isinstance(first, Store), "a store has restore_checkpoint, start_commit, close")
    try:
        cp = first.restore_checkpoint(shard)
        _expect(isinstance(cp, Checkpoint), "restore_checkpoint returns a message.Checkpoint")
        _expect(cp == Checkpoint(), f"a new store restores an empty checkpoint, not {cp}")
        first.start_commit(shard, _checkpoint(1))
        first.start_commit(shard, _checkpoint(2))
    finally:
        first.close()

    again = new_store()
    try:
        cp = again.restore_checkpoint(shard)
        _expect(cp == _checkpoint(2), f"restore returns the last committed checkpoint, not {cp}")
        other = new_store()
        try:
            other.restore_checkpoint(shard)  # fences `again` off
            try:
                again.start_commit(shard, _checkpoint(3))
            except FencedError:
                pass
            else:
                raise AssertionError(
                    "store contract: a commit after another instance restored raises FencedError"
                )
            _expect(isinstance(FencedError("x", shard="y"), ConsumerError),
                    "FencedError is a ConsumerError")
            other.start_commit(shard, _checkpoint(4))
        finally:
            other.close()
    finally:
        again.close()

    last = new_store()
    try:
        cp = last.restore_checkpoint(shard)
        _expect(cp == _checkpoint(4),
                f"a fenced commit changes nothing; the newer one stands (restored {cp})")
        if callable(getattr(last, "prepare_commit", None)):
            _check_prepared(last, new_store, shard)
        if several_shards:
            other_shard = _shard("conformance-other")
            peer = new_store()
            try:
                fresh = peer.restore_checkpoint(other_shard)
                _expect(fresh == Checkpoint(), "another shard's checkpoint starts empty")
            finally:
                peer.close()
    finally:
        last.close()


def _check_prepared(store: Store, new_store: Callable[[], Store], shard: Shard) -> None:
    """The optional ``prepare_commit`` (see ``consumer.PreparedCommit``):
    nothing is committed until ``commit()``; ``abort()`` commits nothing;
    a prepared commit of an instance fenced off meanwhile raises
    ``FencedError`` at ``commit()`` and changes nothing."""
    prepare = store.prepare_commit  # type: ignore[attr-defined]

    def restored() -> Checkpoint:
        reader = new_store()  # (fences `store` off: used last)
        try:
            return reader.restore_checkpoint(shard)
        finally:
            reader.close()

    prepare(shard, _checkpoint(5)).abort()
    prepared = prepare(shard, _checkpoint(6))
    prepared.commit()
    prepared = prepare(shard, _checkpoint(7))
    cp = restored()
    _expect(cp == _checkpoint(6), "prepare_commit commits nothing until commit(), and"
            f" abort() nothing at all (restored {cp}, not the 6th checkpoint)")
    try:
        prepared.commit()
    except FencedError:
        pass
    else:
        raise AssertionError("store contract: a prepared commit of an instance fenced off"
                             " since raises FencedError at commit()")
    cp = restored()
    _expect(cp == _checkpoint(6), f"a fenced prepared commit changes nothing (restored {cp})")
