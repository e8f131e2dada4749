"""The life of one shard: restore, recover, then transactions until stopped.

One thread runs a shard (``ShardLoop``). It restores the store's
checkpoint, appends the checkpoint's ACK intents again, opens its sources
(``message.CommittedSource``: each read committed over a Sequencer of its own, which drops
duplicates, holds transactions until their ACK and replays what its ring
no longer holds), and then runs transactions, as Gazette's consumer does
(``consumer/transaction.go``):

1. the first committed message ready begins a transaction
   (``begin_txn``); each committed message of a source goes to
   ``consume_message``, the sources taking turns; ACKs are not handed over;
2. the transaction ends once ``max_txn_duration`` has passed since it
   began, or when no message is ready and ``min_txn_duration`` has passed;
3. ``finalize_txn``; then, once every message the shard published (and the
   previous transaction's ACKs) is durable, the checkpoint — read offsets,
   producer states and the ACK intents of this transaction — is committed
   with the store's changes by ``start_commit`` (a store with
   ``prepare_commit`` prepares while the appends are still being made
   durable, and commits once they are: see ``prepared_commit``);
4. only then are the ACK intents appended: downstream readers see the
   output. A crash before step 3 leaves the output uncommitted (rolled back
   by the next start's re-appended intents where this producer wrote
   before); a crash after it is finished by the next start.

While a commit waits on fsyncs, the appends of the journals' writer
threads go on.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Final

from journal import CloseAtExit, JournalNotFoundError, TrackingClient, metrics
from message import (
    IMPLEMENTATION,
    Checkpoint,
    CommittedSource,
    Envelope,
    ProducerState,
    Publisher,
)

from ._errors import FencedError, StoreError
from ._lag import SourceLag
from ._shard import Shard, ShardSpec

if TYPE_CHECKING:
    from concurrent.futures import Future

    from journal import AppendResult, JournalClient

    from ._interfaces import Application, PreparedCommit, Store

log = logging.getLogger("consumer")

#: Producers idle this much longer than the newest of their journal are
#: forgotten at a checkpoint (Gazette's consumers use the same horizon).
PRUNE_HORIZON: Final = datetime.timedelta(hours=24)
#: A source hands over at most this many messages before the next source
#: with messages ready takes its turn.
TURN: Final = 256

#: At interpreter exit, how long a shard still serving may take to commit
#: its open transaction and stop (past it, the transaction is abandoned:
#: the shard's next start reads it again).
EXIT_TIMEOUT: Final = 10.0
_exit_deadline: list[float] = []  # set when the first of them is stopped at exit


def exit_deadline() -> float:
    """When what the consumer package stops at interpreter exit (members,
    then shards) must be done: EXIT_TIMEOUT after the first was asked to
    stop, one bound for them all."""
    if not _exit_deadline:
        _exit_deadline.append(time.monotonic() + EXIT_TIMEOUT)
    return _exit_deadline[0]


class ShardLoop:
    """Serves one shard on a thread of its own (see the module docstring).

    ``error`` is what stopped it, if anything did; ``finished`` is set once
    its thread is done. ``quiescent`` is True while it waits for input with
    no transaction open and every append of its own durable; ``on_progress``
    is called whenever it becomes quiescent and when it finishes.
    """

    def __init__(
        self,
        client: JournalClient,
        app: Application,
        spec: ShardSpec,
        on_progress: Callable[[], None],
        check_store: Callable[[Shard, Store], None] | None = None,
    ) -> None:
        self.spec = spec
        self.shard = Shard(spec, client)
        self._client = client
        self._app = app
        # The optional hooks: an application not made from Application may
        # leave them out; they then do nothing.
        self._begin_txn: Callable[..., None] = getattr(app, "begin_txn", _no_hook)
        self._finalize_txn: Callable[..., None] = getattr(app, "finalize_txn", _no_hook)
        self._on_progress = on_progress
        # Checks the store the application opened before its checkpoint is
        # restored (a Member: that the store can be reached from this host).
        self._check_store = check_store
        # Wakes the shard waiting for input: a source grew, one failed, stop.
        self._cond = threading.Condition()
        self._failure: tuple[str, BaseException] | None = None
        self._sources: list[CommittedSource] = []
        self._stop = False
        self._thread = threading.Thread(
            target=self._main, name=f"exactly shard {spec.id}", daemon=True
        )
        self.error: BaseException | None = None
        self.finished = False
        self.quiescent = False
        #: Transactions committed and messages consumed by them, since the start.
        self.transactions = 0
        self.messages = 0
        self._store: Store | None = None
        # The Publisher appends through it: a commit waits for this shard's
        # own appends, and sees their failures (see journal.TrackingClient).
        self._tracked = TrackingClient(client)
        self._appends = self._tracked.pending
        self._publisher: Publisher | None = None
        # The store's prepare_commit, if it is to be used (see prepared_commit).
        self._prepare: Callable[[Shard, Checkpoint], PreparedCommit] | None = None
        # Of the restored checkpoint, what concerns journals that are not
        # sources (kept in every checkpoint, in case they are again).
        self._other_offsets: dict[str, int] = {}
        self._other_states: list[ProducerState] = []
        self._next: Callable[[float | None], Envelope | None] = _not_started
        # The last envelope consumed of each source; what the shard
        # committed, for its lag (measured when metrics are scraped).
        self._last: dict[str, Envelope] = {}
        head = getattr(client, "head", None)  # (a client that cannot say has no lag)
        self._lag = None if head is None else SourceLag(spec.id, head, spec.sources)

    # -- control, from the runner's thread ------------------------------------

    def start(self) -> None:
        _SERVING.add(self)  # stopped at exit, before the clients it uses close
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the shard to commit its open transaction and stop."""
        self._stop = True
        self._wake()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def caught_up(self, head: Callable[[str], int]) -> bool:
        """True if the shard is quiescent and has read each source through
        ``head(journal)``, taken now."""
        if not self.quiescent:
            return False
        ends = [(s.journal, s.end, s.it is None) for s in self._sources]
        if not all(ended for _, _, ended in ends) or not self.quiescent:
            return False
        return all(end >= head(journal) for journal, end, _ in ends)

    # -- the shard's thread ----------------------------------------------------

    def _main(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            self.error = exc
            log.error("shard %s stopped: %s", self.spec.id, _describe(exc))
            if isinstance(exc, FencedError):
                metrics.record_fenced(self.spec.id)
        finally:
            metrics.forget_source_lag(self)
            self._shutdown()
            self.finished = True
            _SERVING.discard(self)
            self._on_progress()

    def _serve(self) -> None:
        spec, shard, app = self.spec, self.shard, self._app
        store = self._store = app.new_store(shard)
        if self._check_store is not None:
            self._check_store(shard, store)  # (raising, the store is closed on the way out)
        cp = _restore(store, shard)
        self._recover(cp)
        self._prepare = prepared_commit(store)
        # A Publisher of this start of the shard: a fresh producer ID, and
        # its own clock, which follows the wall clock.
        self._publisher = Publisher(self._tracked)
        sources = set(spec.sources)
        self._other_offsets = {j: o for j, o in cp.offsets.items() if j not in sources}
        self._other_states = [s for s in cp.states if s.journal not in sources]
        if self._lag is not None:
            self._lag.committed(cp.offsets, self._last)
            metrics.report_source_lag(self, spec.id, self._lag.measure)
        for journal in spec.sources:
            self._sources.append(CommittedSource(
                self._client, journal, app.new_message, offset=cp.offsets.get(journal, 0),
                states=[s for s in cp.states if s.journal == journal],
                notify=self._wake, fail=self._fail, include_acks=False,
            ))
        log.info(
            "shard %s serving %s from offsets %s (%d producers known, producer %s)",
            spec.id, ", ".join(spec.sources),
            {s.journal: s.end for s in self._sources}, len(cp.states),
            self._publisher.producer_id.hex(),
        )
        committed = self._committed()
        next(committed)
        self._next = committed.send
        try:
            while not self._stop and self._transaction():
                pass
        finally:
            committed.close()

    def _recover(self, cp: Checkpoint) -> None:
        """Append the restored checkpoint's ACK intents again: this commits a
        transaction whose ACKs a crash cut short, and rolls back what this
        store's last producer published after it."""
        if not cp.ack_intents:
            return
        futures: list[tuple[str, Future[AppendResult] | None]] = []
        for journal, intent in cp.ack_intents.items():
            try:
                futures.append((journal, self._client.append(journal, intent)))
            except JournalNotFoundError:
                futures.append((journal, None))
        for journal, future in futures:
            try:
                if future is None:
                    raise JournalNotFoundError(journal)
                future.result()
            except JournalNotFoundError:
                log.warning(
                    "shard %s: the recovered ACK intent of journal %s is dropped:"
                    " the journal no longer exists", self.spec.id, journal,
                )
        log.info("shard %s: appended the ACK intents of its last commit again (%s)",
                 self.spec.id, ", ".join(cp.ack_intents))

    def _transaction(self) -> bool:
        """Run one transaction; False if the shard stopped before one began."""
        nxt = self._next
        env = nxt(None)
        if env is None:
            return False
        spec, shard, app = self.spec, self.shard, self._app
        store, publisher = self._store, self._publisher
        assert store is not None and publisher is not None
        self._begin_txn(shard, store)
        began = time.monotonic()
        max_end = began + spec.max_txn_duration
        min_end = began + min(spec.min_txn_duration, spec.max_txn_duration)
        consume = app.consume_message
        monotonic = time.monotonic
        count = 0
        while True:
            consume(shard, store, env, publisher)
            count += 1
            last = env
            now = monotonic()
            if now >= max_end or self._stop:
                break
            env = nxt(0.0)
            if env is None:
                if now >= min_end:
                    break
                env = nxt(min_end - now)
                if env is None:
                    break
        self._last[last.journal.name] = last  # (and at the end of each source's turn)
        self._commit(count, began)
        return True

    def _committed(self) -> Generator[Envelope | None, float | None, None]:
        """The shard's committed messages, one per ``send(timeout)``: the next
        to consume (ACKs are skipped), or None if none came within
        ``timeout`` seconds (None: until the shard stops), or the shard is
        stopping. A generator, so that the per-message path finds what it
        uses in its locals, bound once."""
        sources = self._sources
        count = len(sources)
        turn = 0
        deadline: float | None = None
        timeout = yield None
        while True:
            src = None
            for k in range(count):
                candidate = sources[(turn + k) % count]
                if candidate.grown:
                    candidate.reopen()  # the journal grew: read on
                if candidate.it is not None:
                    src, turn = candidate, (turn + k + 1) % count
                    break
            if src is not None:
                self.quiescent = False  # see caught_up
                it = src.it
                assert it is not None
                left = TURN
                env = None
                for env in it:  # (ACKs are left out by the source)
                    deadline = None
                    timeout = yield env
                    left -= 1
                    if not left or self._stop:
                        break
                else:
                    src.ended()
                if env is not None:
                    self._last[src.journal] = env
                continue
            # Every source has handed over all there was.
            if self._failure is not None:
                journal, error = self._failure
                error.add_note(f"reading source {journal} of shard {self.spec.id}")
                raise error
            if self._stop or timeout == 0.0:
                deadline = None
                timeout = yield None
                continue
            if timeout is None:
                self._rest()
                self._wait(None)
                continue
            if deadline is None:
                deadline = time.monotonic() + timeout
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                deadline = None
                timeout = yield None
                continue
            self._wait(left_s)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _fail(self, journal: str, error: BaseException) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = (journal, error)
            self._cond.notify_all()

    def _wait(self, timeout: float | None) -> None:
        """Wait until a source grows or fails, the shard stops, or ``timeout``."""
        with self._cond:
            if (self._stop or self._failure is not None
                    or any(s.grown for s in self._sources)):
                return
            self._cond.wait(timeout)

    def _rest(self) -> None:
        """Nothing to do: once the last ACKs are durable, say so."""
        if self._appends.outstanding:
            self._appends.settle()
        if not self.quiescent:
            self.quiescent = True
            self._on_progress()

    def _commit(self, count: int, began: float) -> None:
        shard, store, publisher = self.shard, self._store, self._publisher
        assert store is not None and publisher is not None
        self._finalize_txn(shard, store, publisher)
        offsets = dict(self._other_offsets)
        states = list(self._other_states)
        for src in self._sources:
            # Valid between any two envelopes, even in the middle of a
            # committed sequence (then it resumes from its commit).
            part = src.checkpoint(PRUNE_HORIZON)
            offsets.update(part.offsets)
            states.extend(part.states)
        intents = publisher.build_ack_intents()
        cp = Checkpoint(offsets, states, {i.journal: i.intent for i in intents})
        # What the transaction published, and the last ACKs, must be
        # durable before a checkpoint that depends on them commits.
        if self._prepare is None:
            self._appends.settle()
            committing = time.monotonic()
            store.start_commit(shard, cp)  # what it raises, it raises as it is
        else:
            # The store's slow part first: the writers finish meanwhile.
            committing = time.monotonic()
            prepared = self._prepare(shard, cp)
            try:
                self._appends.settle()
            except BaseException:
                try:
                    prepared.abort()
                except Exception as exc:  # the append's failure is what stops the shard
                    log.warning("shard %s: dropping its prepared commit failed: %s",
                                shard.id, exc)
                raise
            prepared.commit()
        # Committed: now downstream readers may see what it published.
        append = self._tracked.append
        for i in intents:
            append(i.journal, i.intent)
        self.transactions += 1
        self.messages += count
        if self._lag is not None:
            self._lag.committed(offsets, self._last)
        if metrics.enabled():
            done = time.monotonic()
            metrics.record_transaction(shard.id, count, done - began, done - committing)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "shard %s: transaction %d committed: %d messages, %.1f ms consuming,"
                " %.1f ms committing", shard.id, self.transactions, count,
                (committing - began) * 1e3, (time.monotonic() - committing) * 1e3,
            )

    def _shutdown(self) -> None:
        """Release everything; on a failure, roll back the open transaction's
        output (its producer will never ACK it) rather than leave it pending."""
        for src in self._sources:
            src.close()
        publisher = self._publisher
        if self.error is not None and publisher is not None and publisher.has_open_transaction:
            try:
                for i in publisher.build_rollback_intents():
                    self._tracked.append(i.journal, i.intent)
                self._appends.settle(timeout=10.0)
            except Exception as exc:  # the shard failed already: say it, keep the first error
                log.warning("shard %s: its open transaction was not rolled back: %s",
                            self.spec.id, exc)
        elif self.error is None and self._appends.outstanding:
            try:
                self._appends.settle()  # the last ACKs are durable before stop() returns
            except Exception as exc:
                self.error = exc
        if self._store is not None:
            try:
                self._store.close()
            except Exception as exc:
                log.warning("shard %s: closing its store failed: %s", self.spec.id, exc)


def _stop_at_exit(loops: list[ShardLoop]) -> None:
    """Shards still serving when the interpreter exits (their runner never
    stopped): each commits its open transaction and stops, all within
    EXIT_TIMEOUT, before the journal clients close under them."""
    for loop in loops:
        loop.request_stop()
    deadline = exit_deadline()
    for loop in loops:
        loop.join(max(0.0, deadline - time.monotonic()))
        if not loop.finished:
            log.warning("shard %s did not stop within %.0f s of the interpreter's exit: its"
                        " open transaction is abandoned (read again at its next start)",
                        loop.spec.id, EXIT_TIMEOUT)


#: The shards serving in this process, stopped at exit. Made after the
#: journal clients' registry, so closed before it (see journal.CloseAtExit).
#: A child made by fork has none (their threads are the parent's).
_SERVING: Final = CloseAtExit(close_all=_stop_at_exit, forget_in_child=True)


def _no_hook(*args: object) -> None:
    """An optional hook the application left out."""


def _not_started(timeout: float | None) -> Envelope | None:
    raise RuntimeError("the shard is not serving")


def prepared_commit(store: Store) -> Callable[[Shard, Checkpoint], PreparedCommit] | None:
    """The store's ``prepare_commit`` if the runtime is to commit through it:
    the store has one, and its ``start_commit`` is the one defined with it
    (a store that overrides or wraps ``start_commit`` alone gets its own
    ``start_commit`` called). None where the Python implementation runs
    (``message.IMPLEMENTATION``; ``EXACTLY_PURE_PYTHON=1``): every store
    then commits by ``start_commit``, the definition of the same."""
    if IMPLEMENTATION == "python":
        return None
    prepare = getattr(store, "prepare_commit", None)
    if not callable(prepare) or "start_commit" in getattr(store, "__dict__", {}):
        return None
    owners = [next((c for c in type(store).__mro__ if name in vars(c)), None)
              for name in ("prepare_commit", "start_commit")]
    return prepare if owners[0] is owners[1] else None


def _restore(store: Store, shard: Shard) -> Checkpoint:
    cp = store.restore_checkpoint(shard)  # what it raises, it raises as it is
    if not isinstance(cp, Checkpoint):
        raise StoreError(
            f"shard {shard.id}: {type(store).__name__}.restore_checkpoint returned"
            f" {type(cp).__name__}, not a message.Checkpoint",
            shard=shard.id, store=type(store).__name__,
        )
    return cp


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FencedError):
        return f"fenced off: {exc}"
    return f"{type(exc).__name__}: {exc}"
