"""Exactly-once writes of rows into journals, whatever Spark retries.

Each task attempt publishes its rows *uncommitted*, under a Publisher of its
own (a fresh producer ID), and returns the ACK intents that would commit
them — plus the roll-back intents that would abort them. Nothing it wrote is
read-committed yet. Then, on the driver:

- ``commit_job``: the intents of the attempts Spark kept are made durable in
  an intent log (a ``JournalIntentLog``), written, and the log is removed. A
  driver that dies in between leaves the log behind, and ``recover`` (run
  before every read and write of the data source) writes it again: writing
  an ACK twice is harmless. Intents that all go to one journal are written
  in one append instead, which is atomic: they need no log.
- ``abort_job``: the roll-back intents are written, so readers drop the rows
  at once instead of waiting for an ACK that never comes.

An attempt that fails rolls its own transaction back before it re-raises.
One that dies without doing so (killed: Spark kills the running attempts of
a job that failed, and the losers of speculation; or its executor died) is
rolled back by the driver: before it first publishes to a journal, an
attempt records the roll-back ACK of its transaction there, durably, in the
job's attempts journal; when the driver commits or aborts the job, it writes
the roll-backs recorded by every attempt it did not commit, and ends the
job. Attempts Spark ran twice (speculation) count once: only the intents of
the attempt Spark reports are written. An attempt that starts after its job
ended finds no attempts journal and fails (``JobEndedError``).

An attempt can also still be publishing when the driver ends its job (Spark
cancels the running tasks of a failed job without waiting for them, and a
speculation loser runs on): the driver's roll-back ACK then lands between
its messages, and those after it would stay an open transaction. So the
driver first records that the job is ending (``begin_ending``), then reads
the roll-backs; an attempt, once its messages are durable, looks for that
record (or the job's end) after where the job's records stood when it
started, and if it is there, rolls back itself — after all of its messages
— and fails with ``JobEndedError``. An attempt that looked before the
driver's record has all its messages before the driver's roll-backs. What
no protocol here can reach is an attempt killed (SIGKILL) after the
driver's roll-back while it still publishes: its later messages stay an
open transaction, as a crashed producer's do.

Streaming sinks also remember, per sink, the last micro-batch they
committed, so that a batch Spark replays after a restart is rolled back
instead of committed twice.

**Where this state lives.** In journals of the same store as the data, under
``.exactly/pipeline/`` (``STATE_PREFIX``): ``intents/<id>`` (one journal per
commit in progress), ``attempts/<job>`` (the roll-backs attempts recorded),
``sinks/<sink>`` (a streaming sink's batches). On a Gazette cluster that is
what every executor and the driver reach anyway, with nothing shared but the
network; the same code serves the embedded store, where they are journals
under ``root``. Spark's checkpoint location was the other candidate: only
streaming queries have one, and executors' Python workers cannot write to
it (HDFS, S3) without Hadoop's clients.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, cast

import numpy as np
import pyarrow as pa

from framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, framing_by_content_type
from journal import JournalClient, JournalNotFoundError, JournalSpec, JournalStore
from message import (
    IMPLEMENTATION,
    AckIntent,
    Clock,
    Flags,
    JournalIntentLog,
    MappingFunc,
    Message,
    Publisher,
    build_uuid,
    modulo_mapping,
    rendezvous_mapping,
    write_intents,
)
from message.arrow import ArrowContent, json_values, ndjson_frames
from message.columns import uuid_strings

from ._content import message_from_row
from ._errors import JobEndedError
from ._state import (
    _STATE_LABELS,
    ATTEMPTS,
    INTENTS,
    _append_record,
    _b64,
    _records,
    _records_after_last,
    _unb64,
    forget_before,
)
from ._stores import STATE_PREFIX, StoreOptions

log = logging.getLogger("pipeline")



@dataclass(slots=True)
class PublishedBatch:
    """What a task attempt returns to the driver (a Spark WriterCommitMessage)."""

    producer: str
    rows: int
    intents: list[tuple[str, bytes]] = field(default_factory=list)
    rollbacks: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Target:
    """Where rows go: one journal, or the journals of a selector, picked by
    hashing the ``key`` column (``modulo`` or ``rendezvous``), in ``store``
    (a ``StoreOptions``, or a store directory)."""

    store: StoreOptions | str
    journal: str | None = None
    selector: str | None = None
    key: str | None = None
    mapping: str = "modulo"
    hash: str = "mmh3"
    content: ArrowContent = field(default_factory=ArrowContent)

    def __post_init__(self) -> None:
        if isinstance(self.store, str):
            object.__setattr__(self, "store", StoreOptions.of({"root": self.store}))
        if (self.journal is None) == (self.selector is None):
            raise ValueError("give exactly one of the options journal and selector")
        if self.selector is not None and not self.key:
            raise ValueError("writing to a selector needs the option key (a column name)")
        if self.mapping not in ("modulo", "rendezvous"):
            raise ValueError(f"mapping must be modulo or rendezvous, not {self.mapping!r}")

    @property
    def options(self) -> StoreOptions:
        assert isinstance(self.store, StoreOptions)
        return self.store

    def partitions(self, client: JournalClient) -> list[JournalSpec]:
        if self.journal is not None:
            return [client.get(self.journal)]
        specs = [s for s in client.list(self.selector or "")
                 if not s.name.startswith(STATE_PREFIX)]
        if not specs:
            raise ValueError(f"no journal matches the selector {self.selector!r}")
        return specs

    def content_type(self, client: JournalClient) -> str:
        types = {s.content_type for s in self.partitions(client)}
        if len(types) != 1:
            raise ValueError(f"the target journals have different content types: {types}")
        ct = types.pop()
        framing_by_content_type(ct or "")  # a clear error for an unknown one
        return ct or ""

    def check(self, client: JournalClient) -> None:
        """What a write's tasks would fail on, said once, on the driver,
        before any task runs: the journals' content type, the key column
        and the hash, a protobuf class, a column where the UUID goes."""
        ct = self.content_type(client)
        names = [name for name, _ in self.content.fields]
        self.mapping_func(client, names)
        if ct != CONTENT_TYPE_JSON_LINES:
            self.content.message_type(ct)  # (a protobuf class: given, importable)
            return
        first = self.content.uuid_path[0]
        typ = dict(self.content.fields).get(first)
        if typ is not None and not (pa.types.is_struct(typ) or pa.types.is_map(typ)):
            path = "/".join(self.content.uuid_path)
            raise ValueError(
                f"each row's UUID is written at {path} (the option uuid_path), but the column"
                f" {first!r} is {typ}, not a struct: rename the column, or choose another"
                " uuid_path"
            )

    def mapping_func(self, client: JournalClient, names: list[str]) -> MappingFunc:
        specs = self.partitions(client)
        if self.journal is not None:
            ct = specs[0].content_type or ""
            return lambda msg: (specs[0].name, ct)
        key_of = _key_func(self.content_type(client), names, self.key or "")
        return self._by_key(key_of, specs)

    def _by_key(self, key_of: Callable[[Any], str | bytes], specs: list[JournalSpec]
                ) -> MappingFunc:
        make = modulo_mapping if self.mapping == "modulo" else rendezvous_mapping
        return make(key_of, lambda: specs, hash=self.hash)

    def journal_of_key(self, client: JournalClient, names: list[str]) -> Callable[[Any], str]:
        """The journal of a row by its ``key`` column's value, as
        ``mapping_func`` maps the row's message (memoized per value)."""
        if self.journal is not None:
            journal = self.journal
            return lambda value: journal
        by_text = self._by_key(_same_text, self.partitions(client))
        memo: dict[str | bytes, str] = {}

        def journal_of(value: Any) -> str:
            text = _key_text(value)
            journal = memo.get(text)
            if journal is None:
                if len(memo) >= _MEMO_KEYS:
                    memo.clear()  # keys all different: memory stays bounded
                journal = memo[text] = by_text(text)[0]
            return journal

        return journal_of


def _key_func(content_type: str, names: list[str], key: str) -> Callable[[Any], str | bytes]:
    if key not in names:
        raise ValueError(f"key column {key!r} is not among the columns {names}")
    if content_type == CONTENT_TYPE_JSON_LINES:
        return lambda doc: _key_text(doc.get(key))
    if content_type == CONTENT_TYPE_CSV:
        pos = 1 + names.index(key)
        return lambda rec: rec[pos]
    return lambda msg: _key_text(getattr(msg.pb, key))


#: The keys whose journal a write task remembers.
_MEMO_KEYS: Final = 1 << 16


def _same_text(text: Any) -> str | bytes:
    return cast(str | bytes, text)


def _key_text(v: Any) -> str | bytes:
    return v if isinstance(v, str | bytes) else "" if v is None else str(v)


class _Mapped:
    """A mapping whose answer for the next message is computed before it is
    published (to record its roll-back first), and not computed again."""

    def __init__(self, inner: MappingFunc) -> None:
        self.inner = inner
        self.msg: Any = None
        self.result = ("", "")

    def prepare(self, msg: Any) -> str:
        self.msg, self.result = msg, self.inner(msg)
        return self.result[0]

    def __call__(self, msg: Any) -> tuple[str, str]:
        return self.result if msg is self.msg else self.inner(msg)


# -- jobs and their attempts ------------------------------------------------------------


def attempts_journal(job: str) -> str:
    """The journal where the attempts of write job ``job`` record their roll-backs."""
    return ATTEMPTS + job


def start_job(client: JournalStore, job: str) -> None:
    """Create the journal the job's attempts record their roll-backs in."""
    client.create(attempts_journal(job), _STATE_LABELS)


def publish_rows(
    target: Target,
    batches: Iterable[pa.RecordBatch],
    client: JournalStore | None = None,
    *,
    job: str | None = None,
    bulk: bool | None = None,
) -> PublishedBatch:
    """Publish every row of ``batches`` uncommitted under a new producer, and
    return its ACK and roll-back intents. On failure, roll back and re-raise.
    With a ``job`` (see ``start_job``), the roll-back of each journal is
    recorded durably before the first message to it is published.

    Rows of NDJSON journals are framed a batch at a time (``_Attempt.bulk``)
    when the native core runs, or with ``bulk=True``; the row-by-row path
    (``_Attempt.rows``) is the reference, which ``EXACTLY_PURE_PYTHON=1``
    (or ``bulk=False``) runs, and which frames the same bytes."""
    own = client is None
    store: JournalStore = target.options.open() if client is None else client
    attempt = _Attempt(target, store, job, IMPLEMENTATION == "native" if bulk is None else bulk)
    try:
        attempt.check_job()
        for batch in batches:
            attempt.publish(batch)
        store.flush()  # every message durable before its ACK can be written
        # Durable, so the driver's roll-back, if it ends the job after this
        # check, lands after all of them; if it is ending already, roll back.
        attempt.check_job_goes_on()
        intents = attempt.publisher.build_ack_intents()
    except BaseException:
        try:
            attempt.roll_back()
        except Exception:
            log.exception("rolling back a failed write task")
        raise
    finally:
        if own:
            store.close()
    return PublishedBatch(
        attempt.publisher.producer_id.hex(),
        attempt.count,
        [(i.journal, i.intent) for i in intents],
        list(attempt.rollbacks.items()),
    )


class _Attempt:
    """The rows one task attempt publishes, under a producer of its own."""

    def __init__(self, target: Target, store: JournalStore, job: str | None, bulk: bool) -> None:
        self.target, self.store, self.job, self.bulk_wanted = target, store, job, bulk
        # A clock of our own, which only publishing moves (one tick a
        # message): the first message to a journal gets the clock after the
        # one recorded.
        self.clock = Clock()
        self.publisher = Publisher(store, clock=self.clock)
        self.record = None if job is None else attempts_journal(job)
        self.record_from = 0  # the job's records from here on are this attempt's time
        self.rollbacks: dict[str, bytes] = {}  # per journal, the ACK that rolls this attempt back
        self.count = 0
        self.content_type: str | None = None
        self.mapping: _Mapped | None = None
        self.journal_of_key: Callable[[Any], str] | None = None
        self.bulk_ok = False

    def check_job(self) -> None:
        if self.record is not None:
            try:
                self.record_from = self.store.head(self.record)
            except JournalNotFoundError:
                raise JobEndedError(f"write job {self.job} has ended") from None

    def check_job_goes_on(self) -> None:
        """Raise JobEndedError if the driver began to end the job (commit or
        abort) since this attempt started: it then writes the roll-backs of
        what it does not commit, maybe before some of this attempt's
        messages, which only the attempt's own roll-back can follow."""
        if self.record is None:
            return
        try:
            records = _records(self.store, self.record, self.record_from)
        except JournalNotFoundError:
            raise JobEndedError(f"write job {self.job} has ended") from None
        if any(_ENDING in doc or _ENDED in doc for doc in records):
            raise JobEndedError(f"write job {self.job} ended while this attempt wrote")

    def publish(self, batch: pa.RecordBatch) -> None:
        if self.mapping is None:
            target, names = self.target, batch.schema.names
            ct = self.content_type = target.content_type(self.store)
            self.mapping = _Mapped(target.mapping_func(self.store, names))
            uuid_path = target.content.uuid_path
            self.bulk_ok = (self.bulk_wanted and ct == CONTENT_TYPE_JSON_LINES
                            and bool(uuid_path) and uuid_path[0] not in names)
            if self.bulk_ok:
                self.journal_of_key = target.journal_of_key(self.store, names)
        self.clock.update()  # timestamps follow the wall clock, batch by batch
        if self.bulk_ok:
            self.bulk(batch)
        else:
            self.rows(batch)

    def first_to(self, journal: str, msg: Message, clock: int | None = None) -> None:
        """Before the first message to ``journal`` (whose clock is after
        ``clock``, by default the clock's value): its roll-back, recorded."""
        if journal not in self.rollbacks:
            self.rollbacks[journal] = _rollback(
                self.store, self.publisher.producer_id, journal, msg,
                self.clock.value if clock is None else clock)
            if self.record is not None:
                _record_rollbacks(self.store, self.record, self.publisher.producer_id,
                                  self.rollbacks)

    def rows(self, batch: pa.RecordBatch) -> None:
        """The reference: a message per row, published one by one."""
        assert self.mapping is not None
        content, ct, mapping = self.target.content, self.content_type, self.mapping
        if ct == CONTENT_TYPE_JSON_LINES:  # each value as a JSON object's field holds it
            names = batch.schema.names
            rows = [dict(zip(names, values, strict=True))
                    for values in zip(*(json_values(c) for c in batch.columns), strict=True)]
        else:
            rows = batch.to_pylist()
        for row in rows:
            msg = message_from_row(content, ct, row)
            self.first_to(mapping.prepare(msg), msg)
            self.publisher.publish_uncommitted(mapping, msg)
            self.count += 1

    def bulk(self, batch: pa.RecordBatch) -> None:
        """NDJSON rows framed a batch at a time: the rows of each journal
        stamped with consecutive clocks and framed in one go
        (``message.arrow.ndjson_frames``), appended in one append."""
        assert self.journal_of_key is not None
        n = batch.num_rows
        if n == 0:
            return
        template = self.target.content.message_type(self.content_type)()
        producer, uuid_path = self.publisher.producer_id, self.target.content.uuid_path
        groups: list[tuple[str, pa.RecordBatch]]
        if self.target.journal is not None:
            groups = [(self.target.journal, batch)]
        else:
            codes: dict[str, int] = {}
            journal_of = self.journal_of_key
            keys = batch.column(self.target.key or "").to_pylist()
            per_row = np.fromiter((codes.setdefault(journal_of(k), len(codes)) for k in keys),
                                  dtype=np.int64, count=n)
            groups = [(journal, batch.take(pa.array(np.flatnonzero(per_row == code))))
                      for journal, code in codes.items()]
        for journal, rows in groups:
            m = rows.num_rows
            # The clocks the Publisher takes next: only this attempt's
            # Publisher moves its clock, one tick a message.
            first = self.clock.value + 1
            data = ndjson_frames(rows, uuid_strings(producer, first, m, Flags.CONTINUE_TXN),
                                 uuid_path)
            assert data is not None  # bulk_ok: no column is named like the UUID's path
            # Recorded before the frames are appended: an attempt killed in
            # between leaves a roll-back of messages never written (an ACK
            # readers see first).
            self.first_to(journal, template, first - 1)

            def frame(taken: int, first: int = first, data: bytes = data) -> bytes:
                if taken != first:  # the clock moved under the attempt
                    raise RuntimeError(f"framed for clock {first}, but the Publisher took {taken}")
                return data

            self.publisher.publish_uncommitted_frames(journal, m, frame, template)
            self.count += m

    def roll_back(self) -> None:
        write_intents(self.store, [AckIntent(j, b) for j, b in self.rollbacks.items()])
        if self.record is not None and self.rollbacks:
            # Rolled back: nothing left to the driver (if it still reads).
            with contextlib.suppress(JobEndedError):
                _record_rollbacks(self.store, self.record, self.publisher.producer_id, {})


def _record_rollbacks(
    client: JournalClient, record: str, producer: bytes, rollbacks: dict[str, bytes]
) -> None:
    try:
        _append_record(client, record,
                       {"producer": producer.hex(), "rollbacks": _b64(rollbacks.items())})
    except JournalNotFoundError:
        raise JobEndedError(f"write job of {record} has ended") from None


def _rollback(client: JournalClient, producer: bytes, journal: str, msg: Message,
              clock: int) -> bytes:
    """The roll-back ACK of a fresh producer's transaction in ``journal``,
    whose first message will have the clock after ``clock``: an ACK with
    ``clock``, where a reader that first saw this producer there starts it."""
    ack = msg.new_acknowledgement(journal)
    ack.set_uuid(build_uuid(producer, clock, Flags.ACK_TXN))
    ct = client.get(journal).content_type or ""
    return framing_by_content_type(ct).marshal(ack)


def _unreported_rollbacks(
    client: JournalStore, job: str | None, reported: Iterable[PublishedBatch | None]
) -> list[AckIntent]:
    """The roll-backs recorded by the job's attempts not in ``reported``
    (since the job's attempts journal last ended a batch)."""
    if job is None:
        return []
    keep = {m.producer for m in reported if m is not None}
    latest: dict[str, Any] = {}
    try:
        # (A streaming sink's earlier micro-batches are settled: what follows
        # the last one ended is all that is read.)
        records = _records_after_last(client, attempts_journal(job), lambda d: _ENDED in d)
    except JournalNotFoundError:
        records = []
    for doc in records:
        if "producer" in doc:
            latest[str(doc["producer"])] = doc.get("rollbacks") or []
    out: list[AckIntent] = []
    for producer, pairs in latest.items():
        if producer in keep:
            continue
        try:
            out += _unb64(pairs)
        except (TypeError, ValueError) as exc:
            log.warning("ignoring the unreadable attempt record of %s: %s", producer, exc)
    if out:
        log.info("job %s: rolling back %d transactions of attempts that did not report",
                 job, len(out))
    return out


#: The keys of the driver's records in a job's attempts journal: it begins to end the
#: job (attempts that see it roll back themselves), and, in a streaming
#: sink's journal kept across micro-batches, it ended one.
_ENDING: Final = "ending"
_ENDED: Final = "end"


def begin_ending(client: JournalClient, job: str | None) -> None:
    """Tell the job's attempts still running that it ends (before reading
    their roll-backs): each sees it at the end of its rows and rolls back
    itself, after all of its messages, so that none is left past the
    roll-backs the driver writes."""
    if job is None:
        return
    with contextlib.suppress(JournalNotFoundError):
        _append_record(client, attempts_journal(job), {_ENDING: True})


def end_job(client: JournalStore, job: str | None, *, keep: bool = False) -> None:
    """Forget the job's attempt records (all rolled back or committed): remove
    its attempts journal, or, to ``keep`` it (a streaming sink's), mark what
    it holds as settled (and let retention take what came before the mark)."""
    if job is None:
        return
    name = attempts_journal(job)
    try:
        if keep:
            mark = _append_record(client, name, {_ENDED: True})
            forget_before(client, name, mark.begin)
        else:
            client.delete(name)
    except JournalNotFoundError:
        pass


def _intents(batches: Iterable[PublishedBatch | None], attr: str) -> list[AckIntent]:
    return [AckIntent(j, b) for m in batches if m is not None for j, b in getattr(m, attr)]


def commit_job(
    client: JournalStore, messages: Iterable[PublishedBatch | None], job: str | None = None
) -> int:
    """Commit the write job's transactions (see the module docstring), and
    roll back those of its attempts that did not report; returns how many
    ACK intents were written to commit."""
    messages = list(messages)
    intents = _intents(messages, "intents")
    begin_ending(client, job)
    rollbacks = _unreported_rollbacks(client, job, messages)
    if len({i.journal for i in intents}) == 1:
        # One append is atomic (JournalClient.append): the intents of a job
        # that wrote one journal commit whole or not at all, and need no log.
        client.append(intents[0].journal, b"".join(i.intent for i in intents)).result()
    elif intents:
        ilog = JournalIntentLog(client, f"{INTENTS}{uuid.uuid4().hex}")
        ilog.save(intents)
        write_intents(client, intents)
        ilog.clear()
    write_intents(client, rollbacks)
    end_job(client, job)
    return len(intents)


def abort_job(
    client: JournalStore, messages: Iterable[PublishedBatch | None], job: str | None = None,
    *, keep: bool = False,
) -> int:
    """Roll back the transactions of the job's attempts, those that reported
    and those that recorded theirs; returns how many roll-backs were written."""
    messages = list(messages)
    begin_ending(client, job)
    rollbacks = _intents(messages, "rollbacks") + _unreported_rollbacks(client, job, messages)
    write_intents(client, rollbacks)
    end_job(client, job, keep=keep)
    return len(rollbacks)


def iter_batches(iterator: Iterator[Any]) -> Iterator[pa.RecordBatch]:
    """Spark's writer input as Arrow batches (it gives batches, or Rows)."""
    rows: list[dict[str, Any]] = []
    for item in iterator:
        if isinstance(item, pa.RecordBatch):
            yield item
        else:
            rows.append(item.asDict(recursive=True))
            if len(rows) >= 4096:
                yield pa.RecordBatch.from_pylist(rows)
                rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows)
