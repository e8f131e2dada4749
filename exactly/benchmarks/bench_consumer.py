"""The consumer runtime: consume-transform-produce through ``consumer.Runner``,
and transactional publishing, each beside its baseline in the same run.

- ctp, per store (JSON file, SQLite, and PostgreSQL where a server can be
  started here): a shard reads two journals of ~114-byte JSON messages
  (written in transactions of 1000), and for each message updates its store
  and publishes one derived message to two output journals; transactions
  of about 1000 messages (max_txn_duration 10 ms). Baseline: a plain
  ``ReadCommittedIter`` over the same journals. Every commit is durable:
  the output appends and the store are fsynced.
- what exactly-once costs that loop: the JSON file store's ctp beside the
  same loop written by hand at-least-once (read committed, count, and
  ``publish_committed`` each derived message; no store, no checkpoint, one
  flush at the end), on the same messages: the runtime's publisher against
  ``publish_committed``. Both read the two sources in turns, as a shard and
  ``ReadCommittedSelectorIter`` do (see ``_at_least_once``).
- transactional publishing: ``Transaction`` (with a durable ``IntentLog``)
  publishing the same messages in transactions of 1000, beside
  ``publish_committed`` of them (each then flushed); and the same with a
  ``TransactionPipeline``, whose commits run while the next transactions
  publish (flushed at the end: every commit durable and visible).

Kafka's exactly-once loop through confluent-kafka is measured beside these
by ``../shared/anchors/kafka-eos`` (see docs/performance.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

from consumer import (
    Application,
    JSONFileStore,
    PostgresStore,
    Runner,
    ShardSpec,
    SQLiteStore,
    Store,
)
from exactly.benchmarks._harness import Result, interleaved
from journal import LocalJournalStore
from message import (
    IntentLog,
    JsonDocument,
    PipelinedTransaction,
    Publisher,
    ReadCommittedIter,
    ReadCommittedSelectorIter,
    Transaction,
    TransactionPipeline,
    modulo_mapping,
)

NDJSON = {"content-type": "application/x-ndjson"}
AGENT = "Mozilla/5.0 (X11; Linux x86_64)"
#: The input journals' names begin with this (and no other journal's does).
INPUT = "in/"


def _doc(i: int) -> JsonDocument:
    return JsonDocument(session=f"s{i % 5003:04d}", page=f"/products/{i % 1000:05d}", n=i,
                        ts=1_700_000_000 + i, agent=AGENT)


def _session(doc: Any) -> str:
    return str(doc["session"])


def _new_doc(spec: Any) -> JsonDocument:
    return JsonDocument()


def _write_input(store: LocalJournalStore, n: int) -> list[str]:
    ins = [store.create(f"{INPUT}part-{i}", NDJSON) for i in range(2)]
    mapping = modulo_mapping(_session, lambda: ins)
    pub = Publisher(store)
    for first in range(0, n, 1000):
        with Transaction(pub) as txn:
            for i in range(first, min(n, first + 1000)):
                txn.publish(mapping, _doc(i))
    return [s.name for s in ins]


def _read(store: LocalJournalStore, names: list[str]) -> int:
    count = 0
    for name in names:
        with ReadCommittedIter(store, name, _new_doc) as it:
            for _ in it:
                count += 1
    return count


class _Derive(Application):
    """For each message: count its session in the store, publish a derived one."""

    def __init__(self, mapping: Any, make_store: Callable[[Any], Store] | None = None) -> None:
        self.make_store = make_store  # (None: consumed outside a shard)
        self.mapping = mapping
        self.consumed = 0
        self.counts: dict[str, int] = {}

    def new_store(self, shard: Any) -> Store:
        assert self.make_store is not None
        return self.make_store(shard)

    def new_message(self, spec: Any) -> JsonDocument:
        return JsonDocument()

    def consume_message(self, shard: Any, store: Any, envelope: Any, publisher: Any) -> None:
        m = envelope.message
        counts = self.counts
        counts[m["session"]] = counts.get(m["session"], 0) + 1
        publisher.publish_uncommitted(
            self.mapping, JsonDocument(session=m["session"], page=m["page"], n=m["n"]))
        self.consumed += 1

    def finalize_txn(self, shard: Any, store: Any, publisher: Any) -> None:
        # What the transaction changed goes to the store, with the checkpoint.
        if isinstance(store, JSONFileStore):
            store.state.setdefault("sessions", {}).update(self.counts)
        elif isinstance(store, SQLiteStore):
            # One statement for the whole set of rows: SQLite reads them from JSON.
            store.connection.execute(
                "INSERT INTO sessions (k, c) SELECT key, value FROM json_each(?) WHERE 1"
                " ON CONFLICT (k) DO UPDATE SET c = c + excluded.c",
                (orjson.dumps(self.counts),))
        elif isinstance(store, PostgresStore):
            # One statement, one round trip, for the whole set of rows.
            store.connection.execute(
                "INSERT INTO sessions (k, c) SELECT * FROM unnest(%s::text[], %s::bigint[])"
                " ON CONFLICT (k) DO UPDATE SET c = sessions.c + excluded.c",
                (list(self.counts), list(self.counts.values())))
        self.counts = {}


def _ctp(store: LocalJournalStore, sources: list[str], work: Path, kind: str, run: int,
         n: int, dbs: Any = None) -> None:
    outs = [store.create(f"out{run}/part-{i}", NDJSON) for i in range(2)]
    mapping = modulo_mapping(_session, lambda: outs)

    def make_store(shard: Any) -> Store:
        if kind == "json":
            return JSONFileStore(work / f"json-{run}")
        s: SQLiteStore | PostgresStore
        if kind == "postgres":
            s = PostgresStore(next(dbs))  # a database of its own, made beforehand
        else:
            s = SQLiteStore(work / f"sqlite-{run}.db")
        s.connection.execute(
            "CREATE TABLE IF NOT EXISTS sessions (k TEXT PRIMARY KEY, c BIGINT NOT NULL)")
        s.connection.commit()
        return s

    app = _Derive(mapping, make_store)
    spec = ShardSpec("ctp", sources=sources, max_txn_duration=0.01)
    with Runner(store, app, [spec]) as runner:
        runner.run_until_idle(timeout=600)
    if app.consumed != n:
        raise RuntimeError(f"ctp consumed {app.consumed} messages, not {n}")


def _at_least_once(store: LocalJournalStore, sources: list[str], run: int, n: int) -> None:
    """The ctp loop without exactly-once: read committed, and hand each
    message to the same application's ``consume_message``, whose publishes
    go out committed (no transaction, no store, no checkpoint); durable once
    flushed at the end.

    The sources are read as the shard reads them, in turns of a few hundred
    messages (``ReadCommittedSelectorIter``, as an at-least-once reader of
    several journals would). Read one after the other, the loop would
    publish to one output journal at a time (inputs and outputs are
    partitioned by the same key), leaving the other journal's writer
    thread idle; taking turns keeps both writers busy, and their hand-offs
    of the interpreter lock cost the loop about an eighth of its speed: a
    difference of reading order, not of exactly-once."""
    outs = [store.create(f"alo{run}/part-{i}", NDJSON) for i in range(2)]
    app = _Derive(modulo_mapping(_session, lambda: outs))
    consume = app.consume_message
    committed = SimpleNamespace(publish_uncommitted=Publisher(store).publish_committed)
    with ReadCommittedSelectorIter(store, f"name:prefix={INPUT}", _new_doc, block=False,
                                   include_acks=False) as it:
        if sorted(it.journals) != sorted(sources):
            raise RuntimeError(f"the selector reads {it.journals}, not the sources {sources}")
        for envelope in it:
            consume(None, None, envelope, committed)
    store.flush()
    if app.consumed != n:
        raise RuntimeError(f"the at-least-once loop consumed {app.consumed} messages, not {n}")


def _publish_committed(root: Path, n: int, docs: list[JsonDocument]) -> None:
    with LocalJournalStore(root) as store:
        outs = [store.create(f"out/part-{i}", NDJSON) for i in range(2)]
        mapping = modulo_mapping(_session, lambda: outs)
        publish = Publisher(store).publish_committed
        for d in docs:
            publish(mapping, d)
        store.flush()


def _publish_transactions(
    root: Path, n: int, docs: list[JsonDocument], *, pipelined: bool = False
) -> None:
    """``docs`` in transactions of 1000 with a durable ``IntentLog``: each a
    ``Transaction`` (its commit waits), or ``pipelined`` a transaction of a
    ``TransactionPipeline`` (committed while the next ones publish; all
    committed when the pipeline closes)."""
    with LocalJournalStore(root) as store, contextlib.ExitStack() as stack:
        outs = [store.create(f"out/part-{i}", NDJSON) for i in range(2)]
        mapping = modulo_mapping(_session, lambda: outs)
        log = IntentLog(root / "intents.json")
        begin: Callable[[], Transaction | PipelinedTransaction] = (
            stack.enter_context(TransactionPipeline(store, log)).transaction if pipelined
            else functools.partial(Transaction, Publisher(store), log)
        )
        for first in range(0, n, 1000):
            with begin() as txn:
                publish = txn.publish
                for d in docs[first:first + 1000]:
                    publish(mapping, d)
        stack.close()
        store.flush()


def _postgres_server() -> Any:
    """A PostgreSQL server of this run, or None where none can start."""
    try:
        import psycopg  # noqa: F401 -- the postgres extra

        from exactly._postgres import PostgresServer, PostgresUnavailableError
    except ImportError:
        return None
    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailableError:
        return None
    return server


def run(scale: float) -> list[Result]:
    n = max(2000, int(300_000 * scale))
    pg = _postgres_server()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        kinds = ["json", "sqlite"] + (["postgres"] if pg is not None else [])
        try:
            with LocalJournalStore(work / "journals") as store:
                sources = _write_input(store, n)
                runs = iter(range(1000))
                dbs = iter([pg.create_database(f"bench_{i}") for i in range(3)] if pg else [])
                fns: dict[str, Callable[[], object]] = {
                    "read": lambda: _read(store, sources),
                    "at-least-once": lambda: _at_least_once(store, sources, next(runs), n),
                }
                for kind in kinds:
                    fns[kind] = (lambda k: lambda: _ctp(store, sources, work, k, next(runs),
                                                        n, dbs))(kind)
                best = interleaved(fns, repeat=3)
        finally:
            if pg is not None:
                pg.stop()
        docs = [_doc(i) for i in range(n)]
        fresh = iter(range(1000))

        def root() -> Path:
            path = work / f"publish-{next(fresh)}"
            shutil.rmtree(path, ignore_errors=True)
            return path

        pub = interleaved(
            {
                "committed": lambda: _publish_committed(root(), n, docs),
                "transactions": lambda: _publish_transactions(root(), n, docs),
                "pipelined": lambda: _publish_transactions(root(), n, docs, pipelined=True),
            },
            repeat=3,
        )
    rows = [
        Result(
            name=f"consumer: read, update {kind}, publish (txns ~10 ms)",
            value=n / best[kind],
            unit="msg/s",
            baseline_name="ReadCommittedIter",
            baseline=n / best["read"],
            target=0.5,
        )
        for kind in kinds
    ]
    # What exactly-once costs the same loop: the runtime's transactional
    # publishing (and its store's commits) against publishing committed.
    rows.append(Result(
        name="consumer: read, update JSON file, publish through Runner (txns ~10 ms)",
        value=n / best["json"],
        unit="msg/s",
        baseline_name="same loop at-least-once (publish_committed, no store)",
        baseline=n / best["at-least-once"],
        target=0.8,
    ))
    rows += [
        Result(
            name=f"consumer: {what} + IntentLog, txns of 1000",
            value=n / pub[key],
            unit="msg/s",
            baseline_name="publish_committed",
            baseline=n / pub["committed"],
            target=0.8,
        )
        for key, what in (("transactions", "Transaction"), ("pipelined", "TransactionPipeline"))
    ]
    return rows


if __name__ == "__main__":
    from exactly.benchmarks._harness import format_table

    t0 = time.perf_counter()
    print(format_table(run(float(os.environ.get("BENCH_SCALE", "1")))))
    print(f"({time.perf_counter() - t0:.1f} s)")
