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

An attempt that fails rolls its own transaction back before it re-raises;
one that dies without doing so leaves a transaction nobody acknowledges,
which read-committed readers never emit. Attempts Spark ran twice
(speculation) count once: only the intents of the attempt Spark reports
are written.

Streaming sinks also remember, per sink, the last micro-batch they
committed (``<root>/@pipeline/sinks/``), so that a batch Spark replays after
a restart is rolled back instead of committed twice.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa

from framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, framing_by_content_type
from journal import JournalClient, JournalSpec, LocalJournalStore
from message import (
    AckIntent,
    Flags,
    IntentLog,
    MappingFunc,
    Message,
    Publisher,
    build_uuid,
    get_clock,
    modulo_mapping,
    rendezvous_mapping,
    write_intents,
)

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


class _Recorder:
    """Wraps a mapping to learn each message's journal, for roll-backs."""

    def __init__(self, inner: MappingFunc) -> None:
        self.inner = inner
        self.journal = ""

    def __call__(self, msg: Any) -> tuple[str, str]:
        journal, ct = self.inner(msg)
        self.journal = journal
        return journal, ct


def publish_rows(
    target: Target, batches: Iterable[pa.RecordBatch], client: JournalClient | None = None
) -> PublishedBatch:
    """Publish every row of ``batches`` uncommitted under a new producer, and
    return its ACK and roll-back intents. On failure, roll back and re-raise."""
    own = client is None
    store: JournalClient = LocalJournalStore(target.root) if client is None else client
    publisher = Publisher(store)
    first: dict[str, Message] = {}  # per journal, its first message (clock known)
    rows = 0
    try:
        ct: str | None = None
        mapping: _Recorder | None = None
        for batch in batches:
            if mapping is None:
                ct = target.content_type(store)
                mapping = _Recorder(target.mapping_func(store, batch.schema.names))
            for row in batch.to_pylist():
                msg = target.content.message_from_row(ct, row)
                publisher.publish_uncommitted(mapping, msg)
                first.setdefault(mapping.journal, msg)
                rows += 1
        store.flush()  # every message durable before its ACK can be written
        intents = publisher.build_ack_intents()
    except BaseException:
        try:
            write_intents(store, _rollbacks(store, publisher.producer_id, first))
        except Exception:
            log.exception("rolling back a failed write task")
        raise
    finally:
        if own:
            store.close()
    return PublishedBatch(
        publisher.producer_id.hex(),
        rows,
        [(i.journal, i.intent) for i in intents],
        [(i.journal, i.intent) for i in _rollbacks(store, publisher.producer_id, first)],
    )


def _rollbacks(
    client: JournalClient, producer: bytes, first: dict[str, Message]
) -> list[AckIntent]:
    """Roll-back ACKs of a fresh producer's transaction: in each journal, an
    ACK with the clock just below its first message's, where a reader that
    first saw this producer there starts it."""
    out = []
    for journal, msg in first.items():
        ack = msg.new_acknowledgement(journal)
        ack.set_uuid(build_uuid(producer, get_clock(msg.get_uuid()) - 1, Flags.ACK_TXN))
        ct = client.get(journal).content_type or ""
        out.append(AckIntent(journal, framing_by_content_type(ct).marshal(ack)))
    return out


def _intents(batches: Iterable[PublishedBatch | None], attr: str) -> list[AckIntent]:
    return [AckIntent(j, b) for m in batches if m is not None for j, b in getattr(m, attr)]


def commit_job(root: str, messages: Iterable[PublishedBatch | None]) -> int:
    """Commit the write job's transactions (see the module docstring); returns
    how many ACK intents were written."""
    intents = _intents(messages, "intents")
    if not intents:
        return 0
    with LocalJournalStore(root) as store:
        ilog = IntentLog(state_dir(root, "intents", f"{uuid.uuid4().hex}.json"))
        ilog.save(intents)
        write_intents(store, intents)
        ilog.clear()
    return len(intents)


def abort_job(root: str, messages: Iterable[PublishedBatch | None]) -> int:
    """Roll back the transactions of the attempts that reported; returns how many."""
    rollbacks = _intents(messages, "rollbacks")
    if rollbacks:
        with LocalJournalStore(root) as store:
            write_intents(store, rollbacks)
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
        _write_atomically(self.done, orjson.dumps({"batch_id": doc["batch_id"]}))
        self.pending.unlink(missing_ok=True)
        return len(intents)

    def commit(self, client: JournalClient, batch_id: int, intents: list[AckIntent]) -> None:
        doc = {
            "batch_id": batch_id,
            "intents": [(i.journal, base64.b64encode(i.intent).decode()) for i in intents],
        }
        _write_atomically(self.pending, orjson.dumps(doc))
        self.recover(client)


def commit_stream_batch(
    target: Target, sink_id: str, batch_id: int, messages: Iterable[PublishedBatch | None]
) -> bool:
    """Commit micro-batch ``batch_id`` of a streaming sink once: a batch Spark
    replays after a restart, already committed, is rolled back instead.
    Returns True if the batch was committed now."""
    messages = list(messages)
    with LocalJournalStore(target.root) as store:
        state = _SinkState(target.root, sink_id)
        state.recover(store)
        last = state.last_batch()
        if batch_id == last:
            write_intents(store, _intents(messages, "rollbacks"))
            log.info("sink %s: batch %d was already committed; rolled back its replay",
                     sink_id, batch_id)
            return False
        if batch_id < last:
            # Spark only replays its latest batch: a smaller ID means a new
            # query (a new checkpoint location) writing to the same sink.
            log.warning("sink %s: batch %d follows batch %d: a new query, committing",
                        sink_id, batch_id, last)
        state.commit(store, batch_id, _intents(messages, "intents"))
        return True


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


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
