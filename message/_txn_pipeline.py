"""Transactions whose commits run in the background, in order.

A :class:`~message.Transaction` commits in three waits, one after the
other: its messages durable, its ACK intents saved in the log, its ACKs
durable. The thread that publishes does nothing meanwhile. A
:class:`TransactionPipeline` hands each ended transaction to a committer
thread, which makes the same three steps, and lets the next transaction
publish at once::

    log = IntentLog("state/intents.bin")
    log.recover(client)                      # finish commits a crash cut short
    with TransactionPipeline(client, log) as pipeline:
        for batch in batches:
            with pipeline.transaction() as txn:
                for msg in batch:
                    txn.publish(mapping, msg)
            # committing in the background: txn.committed is its future
    # on a clean exit, every transaction is committed (or the first failure raised)

**Why more than one producer.** A producer's ACK must be appended before any
further message of that producer to the same journal (SPEC section 3: a
message appended before its transaction's ACK, with a larger clock, is
dropped). The transaction after one still committing therefore publishes as
another producer: the pipeline keeps ``in_flight`` Publishers, each with its
own producer ID and clock, and gives each transaction the next one in turn,
once that producer's previous transaction has its ACKs (or roll-backs)
queued. Readers see ``in_flight`` producers instead of one.

**Order.** Transactions commit in the order they end (their ``commit`` or
clean exit): the committer settles them, saves their intents and queues
their ACKs in that order, so each journal holds their ACKs in that order
and read-committed readers see them in that order. If one cannot commit
(an append of its messages failed), it and every transaction ended after it
are rolled back: what commits is always a prefix of what ended. The
pipeline then refuses new transactions, and :meth:`TransactionPipeline.flush`
(or the clean exit) raises the error.

**The log.** Each save holds the intents of every transaction whose ACKs are
not yet known durable (the earlier ones' included), so a crash at any point
leaves in the log everything that decided to commit and may not be written:
``IntentLog.recover`` writes it (writing an ACK twice is harmless). The log
is cleared once every commit is durable, by :meth:`TransactionPipeline.flush`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, NamedTuple

from journal import CloseAtExit, Closing, PendingAppends

from ._errors import TransactionAbortedError
from ._interfaces import MappingFunc, Message
from ._publisher import AckIntent
from ._transaction import ENDED, CommitsOnExit, IntentLog, JournalIntentLog, append_intents

if TYPE_CHECKING:
    from journal import AppendResult, JournalClient

    from ._publisher import Publisher
else:
    from ._core import Publisher


class _Ended(NamedTuple):
    """A transaction ended: to commit (or roll back), as producer ``turn``."""

    txn: PipelinedTransaction
    commit: bool
    turn: int


class PipelinedTransaction(CommitsOnExit):
    """One transaction of a :class:`TransactionPipeline` (made by
    :meth:`TransactionPipeline.transaction`).

    :meth:`publish` publishes uncommitted, as its producer. :meth:`commit`
    (or a clean exit of the ``with`` block) hands it to the pipeline's
    committer and returns at once; :meth:`abort` (or an exception in the
    block) has it rolled back. :attr:`committed` is its outcome: a future
    that resolves, with the ACK intents written, once read-committed readers
    can see the transaction, and fails if it was rolled back or its outcome
    is not known (see :class:`TransactionPipeline`).
    """

    def __init__(
        self, publisher: Publisher, end: Callable[[PipelinedTransaction, bool], None]
    ) -> None:
        self.publisher = publisher
        self._end_with = end
        self._appends = PendingAppends()
        self._publish = self._appends.recorder(publisher.publish_uncommitted)
        # The instance's publish is the recorder itself: no Python call per
        # message; closed when the transaction ends (see Transaction).
        if type(self).publish is PipelinedTransaction.publish:
            self.publish = self._publish  # type: ignore[method-assign]
        self.committed: Future[list[AckIntent]] = Future()

    def publish(self, mapping: MappingFunc, msg: Message) -> Future[AppendResult]:
        """Publish ``msg`` as part of the transaction (``RuntimeError`` once
        it ended). An instance's ``publish`` is its recorder of the
        publisher's ``publish_uncommitted``, which does this."""
        return self._publish(mapping, msg)

    def commit(self) -> Future[list[AckIntent]]:
        """End the transaction and have it committed in the background;
        returns :attr:`committed`."""
        self._end(commit=True)
        return self.committed

    def abort(self) -> Future[list[AckIntent]]:
        """End the transaction and have it rolled back (readers discard its
        messages); :attr:`committed` then fails with ``TransactionAbortedError``."""
        self._end(commit=False)
        return self.committed

    def _end(self, commit: bool) -> None:
        if self._publish.closed:
            raise RuntimeError(ENDED)
        self._publish.close(ENDED)
        self._end_with(self, commit)

    @property
    def ended(self) -> bool:
        """True once :meth:`commit` or :meth:`abort` was called."""
        return self._publish.closed

    def settle(self) -> None:
        """Wait for the transaction's messages to be durable (raising the
        first append that failed); the committer's first step."""
        self._appends.settle()


class TransactionPipeline(Closing):
    """Transactions published one after another, each committed by a
    committer thread while the next ones publish. They commit in the order
    they end; if one cannot, it and every transaction ended after it are
    rolled back, the pipeline takes no more, and :meth:`flush` raises. Each
    save of the log holds the intents of every commit whose ACKs are not
    yet known durable, so ``log.recover`` after a crash finishes them all.
    An ACK that cannot be appended leaves its transaction decided (its
    intents stay in the log; ``recover`` makes it whole) and stops the
    pipeline as a failed commit does, but the transactions that committed
    before that append failed stay committed. Consecutive transactions
    publish as different producers, taking turns (a producer's ACK must be
    appended before its further messages).

    ``client``: where the messages go. ``log``: an :class:`IntentLog` or
    :class:`JournalIntentLog` holding the intents of the commits under way
    (``None``: a crash between two journals' ACKs may leave a transaction
    committed in some journals only). ``in_flight``: how many producers take
    turns, so how many transactions may be ended and not yet have their ACKs
    queued before :meth:`transaction` waits (1 commits one at a time, as
    :class:`Transaction` does, but without waiting for the ACKs). Readers
    hold a transaction's messages until its ACK lands: keep ``in_flight``
    times a transaction's messages per journal below their Sequencer's
    ring (4096 envelopes by default), or they replay.

    One thread opens and publishes the transactions; the futures may be
    waited on from any. A child process made by ``fork`` makes its own
    pipeline: the committer thread is not in the child, so there the
    parent's raises ``RuntimeError`` (and is not closed at the child's exit). ``with pipeline:``
    closes it on the way out; a pipeline still open when the interpreter
    exits is closed then (what ended commits).
    """

    def __init__(
        self,
        client: JournalClient,
        log: IntentLog | JournalIntentLog | None = None,
        *,
        in_flight: int = 4,
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self.client = client
        self.log = log
        self._publishers = [Publisher(client) for _ in range(in_flight)]
        # Per producer: set once its last transaction's ACKs (or
        # roll-backs) are queued, so that it may publish again.
        self._free = [threading.Event() for _ in range(in_flight)]
        for event in self._free:
            event.set()
        self._open: list[PipelinedTransaction | None] = [None] * in_flight
        self._turn = 0
        # What the committer takes in order: an ended transaction (with its
        # turn), a flush's barrier, or None to stop.
        self._ended: queue.SimpleQueue[_Ended | Future[None] | None] = queue.SimpleQueue()
        # The committer's state (its thread alone changes it).
        self._unconfirmed: list[tuple[list[AckIntent], list[Future[AppendResult]]]] = []
        self._error: BaseException | None = None  # the first failure: nothing after commits
        self._closed = False
        self._forked = False  # this object was copied into a child by fork
        self._committer = threading.Thread(
            target=self._commit_loop, name="exactly-txn-committer", daemon=True
        )
        self._committer.start()
        _OPEN.add(self)

    @property
    def producer_ids(self) -> list[bytes]:
        """The producers the transactions take turns as."""
        return [p.producer_id for p in self._publishers]

    def transaction(self) -> PipelinedTransaction:
        """A new transaction, as the next producer in turn (waiting until
        that producer's previous transaction has its ACKs queued)."""
        self._check_process()
        if self._closed:
            raise RuntimeError("the pipeline is closed")
        if self._error is not None:
            raise TransactionAbortedError(
                "an earlier transaction could not commit; the pipeline takes no more"
            ) from self._error
        turn = self._turn
        if self._open[turn] is not None:
            raise RuntimeError(
                f"the transaction opened {len(self._open)} transactions ago is still"
                " open: commit or abort it before opening another"
            )
        self._free[turn].wait()
        self._free[turn].clear()
        self._turn = (turn + 1) % len(self._publishers)

        def end(txn: PipelinedTransaction, commit: bool) -> None:
            if self._closed:  # (close rolled it back already)
                raise RuntimeError("the pipeline is closed")
            self._open[turn] = None
            self._ended.put(_Ended(txn, commit, turn))

        txn = self._open[turn] = PipelinedTransaction(self._publishers[turn], end)
        return txn

    def flush(self) -> None:
        """Wait until every transaction ended so far is committed or rolled
        back and its ACKs are durable; then clear the log. Raises the first
        failure of a commit (the log then keeps what may need writing). A
        closed pipeline has nothing left to flush."""
        self._check_process()
        if self._closed:
            return
        barrier: Future[None] = Future()
        self._ended.put(barrier)
        barrier.result()
        failure = self._error
        for _, acks in list(self._unconfirmed):
            for ack in acks:
                error = ack.exception()
                failure = failure or error
        if failure is not None:
            raise TransactionAbortedError("a transaction could not commit") from failure
        if self.log is not None:
            self.log.clear()

    def close(self) -> None:
        """Roll back the transactions still open (never ended), flush, then
        stop the committer thread."""
        self._check_process()
        if self._closed:
            return
        try:
            for txn in self._open:
                if txn is not None:
                    txn.abort()
            self.flush()
        finally:
            self._closed = True
            _OPEN.discard(self)
            self._ended.put(None)
            self._committer.join()

    def _check_process(self) -> None:
        if self._forked:
            raise RuntimeError(
                "this TransactionPipeline was made before a fork, and its committer"
                " thread is not in this process: make a new one here"
            )

    def _after_fork_in_child(self) -> None:
        """In a child made by ``fork``: the committer thread is not here, so
        this copy can neither commit nor wait for commits."""
        self._forked = True

    # -- the committer thread -------------------------------------------------

    def _commit_loop(self) -> None:
        while True:
            batch = [self._ended.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._ended.get_nowait())
            ended = [item for item in batch if isinstance(item, _Ended)]
            try:
                self._commit_batch(ended)
            except BaseException as exc:  # a bug: fail, do not hang
                self._error = self._error or exc
                for txn, _, turn in ended:
                    if not txn.committed.done():
                        txn.committed.set_exception(exc)
                    self._free[turn].set()
            for barrier in batch:
                if isinstance(barrier, Future):
                    barrier.set_result(None)
            if None in batch:
                return

    def _commit_batch(self, ended: list[_Ended]) -> None:
        commits: list[tuple[PipelinedTransaction, int, list[AckIntent]]] = []
        rollbacks: list[tuple[PipelinedTransaction, int, BaseException]] = []
        for txn, commit, turn in ended:
            failure: BaseException | None = None
            try:
                txn.settle()
            except BaseException as exc:  # reported by its future
                failure = exc
            why: BaseException
            if not commit:
                why = TransactionAbortedError("aborted")
            elif failure is not None:
                self._error = self._error or failure
                why = failure
            elif self._error is not None:
                why = TransactionAbortedError("an earlier transaction could not commit")
                why.__cause__ = self._error
            else:
                commits.append((txn, turn, txn.publisher.build_ack_intents()))
                continue
            rollbacks.append((txn, turn, why))
        if commits:
            try:
                self._save([i for _, _, intents in commits for i in intents])
            except BaseException as exc:
                # Not known whether the save is durable: none of these is
                # written now; a recovery may still write them.
                self._error = self._error or exc
                rollbacks += [(txn, turn, exc) for txn, turn, _ in commits]
                commits = []
        for txn, turn, intents in commits:
            acks = append_intents(self.client, intents)
            self._unconfirmed.append((intents, acks))
            self._free[turn].set()
            _resolve_when_durable(txn.committed, intents, acks, self._failed)
        for txn, turn, why in rollbacks:
            with contextlib.suppress(Exception):  # a client that fails cannot roll back
                append_intents(self.client, txn.publisher.build_rollback_intents())
            self._free[turn].set()
            txn.committed.set_exception(why)

    def _failed(self, error: BaseException) -> None:
        """An ACK could not be appended: its transaction is decided (its
        intents stay in the log, for ``recover``) but not visible; the
        transactions ended after it are rolled back from now on."""
        if self._error is None:
            self._error = error

    def _save(self, intents: list[AckIntent]) -> None:
        """Save ``intents`` with those of earlier commits not yet known durable."""
        self._unconfirmed = [
            (old, acks) for old, acks in self._unconfirmed if not _durable(acks)
        ]
        if self.log is not None:
            self.log.save([i for old, _ in self._unconfirmed for i in old] + intents)


def _after_fork_in_child(pipeline: TransactionPipeline) -> None:
    pipeline._after_fork_in_child()  # (the hook of this module's own class)


#: The pipelines not yet closed, closed at exit (before the clients they
#: write through: see journal.CloseAtExit). In a child made by ``fork``,
#: each is marked unusable there (its committer thread is the parent's) and
#: forgotten: the child's exit does not close it.
_OPEN: CloseAtExit = CloseAtExit(_after_fork_in_child, forget_in_child=True)


def _durable(acks: list[Future[AppendResult]]) -> bool:
    """True if every one of ``acks`` is done without failure (no wait)."""
    return all(a.done() and a.exception() is None for a in acks)


def _resolve_when_durable(
    committed: Future[list[AckIntent]], intents: list[AckIntent],
    acks: list[Future[AppendResult]], failed: Callable[[BaseException], None],
) -> None:
    """Resolve ``committed`` once every ACK append is done; if one failed,
    fail it with the first failure and tell ``failed``."""
    if not acks:
        committed.set_result(intents)
        return
    left = [len(acks)]
    lock = threading.Lock()

    def done(_: Future[AppendResult]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        error = next((a.exception() for a in acks if a.exception() is not None), None)
        if error is not None:
            failed(error)
            committed.set_exception(error)
        else:
            committed.set_result(intents)

    for ack in acks:
        ack.add_done_callback(done)
