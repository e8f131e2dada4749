"""Exactly-once writes of rows into journals, whatever Spark retries.

Each task attempt publishes its rows *uncommitted*, under a Publisher of its
own (a fresh producer ID), and returns the ACK intents that would commit
them — plus the roll-back intents that would abort them. Nothing it wrote is
read-committed yet. Then, on the driver:

- ``commit_job``: the intents of the attempts Spark kept are made durable in
  an ``IntentLog`` under ``<root>/@pipeline/intents/``, written, and the log is
  removed. A driver that dies in between leaves the log behind, and
  ``recover`` (run before every read and write of the data source on that
  root) writes it again: writing an ACK twice is harmless.
- ``abort_job``: the roll-back intents are written, so readers drop the rows
  at once instead of waiting for an ACK that never comes.

An attempt that fails rolls its own transaction back before it re-raises.
One that dies without doing so (killed: Spark kills the running attempts of
a job that failed, and the losers of speculation) is rolled back by the
driver: before it first publishes to a journal, an attempt records the
roll-back ACK of its transaction there, durably, under
``<root>/@pipeline/attempts/<job>/``; when the driver commits or aborts the
job, it writes the roll-backs recorded by every attempt it did not commit,
and removes the job's records. Attempts Spark ran twice (speculation) count
once: only the intents of the attempt Spark reports are written. (An attempt
that goes on writing after its job ended, which Spark should not let happen,
can still leave a transaction open.)

Streaming sinks also remember, per sink, the last micro-batch they
committed (``<root>/@pipeline/sinks/``), so that a batch Spark replays after
a restart is rolled back instead of committed twice.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa

from framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, framing_by_content_type
from journal import JournalClient, JournalSpec, LocalJournalStore
from journal._files import fsync_dir
from message import (
    AckIntent,
    Clock,
    Flags,
    IntentLog,
    MappingFunc,
    Message,
    Publisher,
    build_uuid,
    modulo_mapping,
    rendezvous_mapping,
    write_intents,
)
from message._transaction import write_durably

from ._content import ContentSpec

log = logging.getLogger("pipeline")

STATE_DIR: Final = "@pipeline"  # "@" is outside the journal-name alphabet


def state_dir(root: str | os.PathLike[str], *parts: str) -> Path:
    return Path(root, STATE_DIR, *parts)


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
    hashing the ``key`` column (``modulo`` or ``rendezvous``)."""

    root: str
    journal: str | None = None
    selector: str | None = None
    key: str | None = None
    mapping: str = "modulo"
    hash: str = "mmh3"
    content: ContentSpec = field(default_factory=ContentSpec)

    def __post_init__(self) -> None:
        if (self.journal is None) == (self.selector is None):
            raise ValueError("give exactly one of the options journal and selector")
        if self.selector is not None and not self.key:
            raise ValueError("writing to a selector needs the option key (a column name)")
        if self.mapping not in ("modulo", "rendezvous"):
            raise ValueError(f"mapping must be modulo or rendezvous, not {self.mapping!r}")

    def partitions(self, client: JournalClient) -> list[JournalSpec]:
        if self.journal is not None:
            return [client.get(self.journal)]
        specs = client.list(self.selector or "")
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

    def mapping_func(self, client: JournalClient, names: list[str]) -> MappingFunc:
        specs = self.partitions(client)
        if self.journal is not None:
            ct = specs[0].content_type or ""
            return lambda msg: (specs[0].name, ct)
        key_of = _key_func(self.content_type(client), names, self.key or "")
        make = modulo_mapping if self.mapping == "modulo" else rendezvous_mapping
        return make(key_of, lambda: specs, hash=self.hash)


def _key_func(content_type: str, names: list[str], key: str) -> Callable[[Any], str | bytes]:
    if key not in names:
        raise ValueError(f"key column {key!r} is not among the columns {names}")
    if content_type == CONTENT_TYPE_JSON_LINES:
        return lambda doc: _key_text(doc.get(key))
    if content_type == CONTENT_TYPE_CSV:
        pos = 1 + names.index(key)
        return lambda rec: rec[pos]
    return lambda msg: _key_text(getattr(msg.pb, key))


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


class JobEndedError(RuntimeError):
    """A write task ran after the driver ended its job."""


def attempts_dir(root: str | os.PathLike[str], job: str) -> Path:
    """Where the attempts of write job ``job`` record their roll-backs."""
    return state_dir(root, "attempts", job)


def start_job(root: str, job: str) -> None:
    """Make the directory the job's attempts record their roll-backs in
    (durably: an attempt's record must not vanish with its directory)."""
    path = attempts_dir(root, job)
    path.mkdir(parents=True, exist_ok=True)
    for d in (path.parent, path.parent.parent):
        fsync_dir(str(d))


def publish_rows(
    target: Target,
    batches: Iterable[pa.RecordBatch],
    client: JournalClient | None = None,
    *,
    job: str | None = None,
) -> PublishedBatch:
    """Publish every row of ``batches`` uncommitted under a new producer, and
    return its ACK and roll-back intents. On failure, roll back and re-raise.
    With a ``job`` (see ``start_job``), the roll-back of each journal is
    recorded durably before the first message to it is published."""
    own = client is None
    store: JournalClient = LocalJournalStore(target.root) if client is None else client
    # A clock of our own, which only publishing moves (one tick a message):
    # the first message to a journal gets the clock after the one recorded.
    clock = Clock()
    publisher = Publisher(store, clock)
    producer = publisher.producer_id
    record = None if job is None else attempts_dir(target.root, job) / f"{producer.hex()}.json"
    rollbacks: dict[str, bytes] = {}  # per journal, the ACK that rolls this attempt back
    rows = 0
    try:
        if record is not None and not record.parent.is_dir():
            raise JobEndedError(f"write job {job} has ended")
        ct: str | None = None
        mapping: _Mapped | None = None
        for batch in batches:
            if mapping is None:
                ct = target.content_type(store)
                mapping = _Mapped(target.mapping_func(store, batch.schema.names))
            clock.update()  # timestamps follow the wall clock, batch by batch
            for row in batch.to_pylist():
                msg = target.content.message_from_row(ct, row)
                journal = mapping.prepare(msg)
                if journal not in rollbacks:
                    rollbacks[journal] = _rollback(store, producer, journal, msg, clock.value)
                    if record is not None:
                        write_durably(record, _encode(rollbacks), create_dirs=False)
                publisher.publish_uncommitted(mapping, msg)
                rows += 1
        store.flush()  # every message durable before its ACK can be written
        intents = publisher.build_ack_intents()
    except BaseException:
        try:
            write_intents(store, [AckIntent(j, b) for j, b in rollbacks.items()])
            if record is not None:
                record.unlink(missing_ok=True)  # rolled back: nothing left to the driver
        except Exception:
            log.exception("rolling back a failed write task")
        raise
    finally:
        if own:
            store.close()
    return PublishedBatch(
        producer.hex(),
        rows,
        [(i.journal, i.intent) for i in intents],
        list(rollbacks.items()),
    )


def _rollback(client: JournalClient, producer: bytes, journal: str, msg: Message,
              clock: int) -> bytes:
    """The roll-back ACK of a fresh producer's transaction in ``journal``,
    whose first message will have the clock after ``clock``: an ACK with
    ``clock``, where a reader that first saw this producer there starts it."""
    ack = msg.new_acknowledgement(journal)
    ack.set_uuid(build_uuid(producer, clock, Flags.ACK_TXN))
    ct = client.get(journal).content_type or ""
    return framing_by_content_type(ct).marshal(ack)


def _encode(rollbacks: dict[str, bytes]) -> bytes:
    return orjson.dumps([[j, base64.b64encode(b).decode()] for j, b in rollbacks.items()])


def _unreported_rollbacks(
    root: str, job: str | None, reported: Iterable[PublishedBatch | None]
) -> list[AckIntent]:
    """The roll-backs recorded by the job's attempts not in ``reported``."""
    if job is None:
        return []
    keep = {m.producer for m in reported if m is not None}
    out = []
    path = attempts_dir(root, job)
    for rec in sorted(path.glob("*.json")) if path.is_dir() else []:
        if rec.stem in keep:
            continue
        try:
            out += [AckIntent(j, base64.b64decode(b)) for j, b in orjson.loads(rec.read_bytes())]
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring the unreadable attempt record %s: %s", rec, exc)
    if out:
        log.info("job %s: rolling back %d transactions of attempts that did not report",
                 job, len(out))
    return out


def end_job(root: str, job: str | None, *, keep_dir: bool = False) -> None:
    """Forget the job's attempt records (all rolled back or committed)."""
    if job is None:
        return
    path = attempts_dir(root, job)
    if not path.is_dir():
        return
    for rec in path.glob("*.json"):
        rec.unlink(missing_ok=True)
    if not keep_dir:
        with contextlib.suppress(OSError):
            path.rmdir()
    fsync_dir(str(path.parent))


def _intents(batches: Iterable[PublishedBatch | None], attr: str) -> list[AckIntent]:
    return [AckIntent(j, b) for m in batches if m is not None for j, b in getattr(m, attr)]


def commit_job(
    root: str, messages: Iterable[PublishedBatch | None], job: str | None = None
) -> int:
    """Commit the write job's transactions (see the module docstring), and
    roll back those of its attempts that did not report; returns how many
    ACK intents were written to commit."""
    messages = list(messages)
    intents = _intents(messages, "intents")
    rollbacks = _unreported_rollbacks(root, job, messages)
    if intents or rollbacks:
        with LocalJournalStore(root) as store:
            if intents:
                ilog = IntentLog(state_dir(root, "intents", f"{uuid.uuid4().hex}.json"))
                ilog.save(intents)
                write_intents(store, intents)
                ilog.clear()
            write_intents(store, rollbacks)
    end_job(root, job)
    return len(intents)


def abort_job(
    root: str, messages: Iterable[PublishedBatch | None], job: str | None = None,
    *, keep_dir: bool = False,
) -> int:
    """Roll back the transactions of the job's attempts, those that reported
    and those that recorded theirs; returns how many roll-backs were written."""
    messages = list(messages)
    rollbacks = _intents(messages, "rollbacks") + _unreported_rollbacks(root, job, messages)
    if rollbacks:
        with LocalJournalStore(root) as store:
            write_intents(store, rollbacks)
    end_job(root, job, keep_dir=keep_dir)
    return len(rollbacks)


def recover(root: str) -> int:
    """Write the ACK intents that a driver which died while committing left
    under ``root``; returns how many intents were written."""
    n = 0
    intents = state_dir(root, "intents")
    sinks = state_dir(root, "sinks")
    logs = sorted(intents.glob("*.json")) if intents.is_dir() else []
    pending = sorted(sinks.glob("*.pending")) if sinks.is_dir() else []
    if not logs and not pending:
        return 0
    with LocalJournalStore(root) as store:
        for path in logs:
            n += IntentLog(path).recover(store)
        for path in pending:
            n += _SinkState(root, path.stem).recover(store)
    if n:
        log.warning("%s: re-wrote %d ACK intents of an interrupted commit", root, n)
    return n


# -- streaming sinks --------------------------------------------------------------


def sink_id_of(target: Target) -> str:
    """The default identity of a streaming sink: its target."""
    what = f"{target.journal}|{target.selector}|{target.key}|{target.mapping}|{target.hash}"
    return hashlib.sha256(what.encode()).hexdigest()[:16]


class _SinkState:
    """The last micro-batch a streaming sink committed, and the one it is
    committing (``<id>.pending``: its batch ID and ACK intents)."""

    def __init__(self, root: str, sink_id: str) -> None:
        self.root = root
        base = state_dir(root, "sinks")
        self.done = base / f"{sink_id}.json"
        self.pending = base / f"{sink_id}.pending"

    def last_batch(self) -> int:
        try:
            return int(orjson.loads(self.done.read_bytes())["batch_id"])
        except FileNotFoundError:
            return -1

    def recover(self, client: JournalClient) -> int:
        try:
            doc = orjson.loads(self.pending.read_bytes())
        except FileNotFoundError:
            return 0
        intents = [AckIntent(j, base64.b64decode(b)) for j, b in doc["intents"]]
        write_intents(client, intents)
        write_durably(self.done, orjson.dumps({"batch_id": doc["batch_id"]}))
        self.pending.unlink(missing_ok=True)
        return len(intents)

    def commit(self, client: JournalClient, batch_id: int, intents: list[AckIntent]) -> None:
        doc = {
            "batch_id": batch_id,
            "intents": [(i.journal, base64.b64encode(i.intent).decode()) for i in intents],
        }
        write_durably(self.pending, orjson.dumps(doc))
        self.recover(client)


def sink_job(sink_id: str) -> str:
    """The job under which a streaming sink's attempts record their
    roll-backs: one per sink, so that a restarted query cleans up after the
    attempts of the one before."""
    return f"sink-{sink_id}"


def commit_stream_batch(
    target: Target, sink_id: str, batch_id: int, messages: Iterable[PublishedBatch | None]
) -> bool:
    """Commit micro-batch ``batch_id`` of a streaming sink once: a batch Spark
    replays after a restart, already committed, is rolled back instead.
    Attempts that did not report are rolled back. Returns True if the batch
    was committed now."""
    messages = list(messages)
    job = sink_job(sink_id)
    with LocalJournalStore(target.root) as store:
        state = _SinkState(target.root, sink_id)
        state.recover(store)
        last = state.last_batch()
        if batch_id == last:
            write_intents(store, _intents(messages, "rollbacks"))
            log.info("sink %s: batch %d was already committed; rolled back its replay",
                     sink_id, batch_id)
            committed = False
        else:
            if batch_id < last:
                # Spark only replays its latest batch: a smaller ID means a new
                # query (a new checkpoint location) writing to the same sink.
                log.warning("sink %s: batch %d follows batch %d: a new query, committing",
                            sink_id, batch_id, last)
            state.commit(store, batch_id, _intents(messages, "intents"))
            committed = True
        write_intents(store, _unreported_rollbacks(target.root, job, messages))
    end_job(target.root, job, keep_dir=True)
    return committed




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
