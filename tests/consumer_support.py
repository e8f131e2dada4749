"""What the consumer runtime's tests share: a messy input, a counting
application for every store, and the expected outcome to hold it to.

The input is at-least-once reality: committed messages, transactions that
commit, roll back or are abandoned (never acknowledged), and frames appended
twice. Each message is ``{"k": key, "n": number}``; keys are routed to
journals by key, so each key's messages are in one journal, in an order the
Sequencer fixes.

The application counts: for each committed message it adds one to the
key's count and ``n`` to a total, and publishes ``{"k", "n", "seen"}``
(``seen``: the key's count so far) to its outputs. Exactly-once means: the
committed output of each key is its committed input, in order, with seen =
1, 2, 3, ...; the final counts and total are those of the input; and a
chain of such shards passes the same on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from consumer import (
    Application,
    JSONFileStore,
    PostgresStore,
    Shard,
    SQLiteStore,
    SQLStore,
    Store,
)
from journal import JournalClient, JournalSpec
from message import (
    Envelope,
    Flags,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    get_flags,
    modulo_mapping,
)

NDJSON = {"content-type": "application/x-ndjson"}


def new_doc(spec: JournalSpec) -> JsonDocument:
    return JsonDocument()


def is_ack(env: Envelope) -> bool:
    return get_flags(env.message.get_uuid()) == Flags.ACK_TXN


def make_input(
    client: JournalClient, sources: Sequence[str], count: int, seed: int, *, messy: bool = True
) -> None:
    """Publish ``count`` numbered messages to ``sources`` (see the module
    docstring); with ``messy``, some in transactions that commit, roll back
    or are never acknowledged, and some frames appended twice."""
    rng = random.Random(seed)
    specs = [client.get(s) for s in sources]
    mapping = modulo_mapping(lambda d: d["k"], lambda: specs)
    pub = Publisher(client)
    n = 0
    while n < count:
        roll = rng.random()
        if not messy or roll < 0.4:
            fut = pub.publish_committed(mapping, JsonDocument(k=f"k{n % 23}", n=n))
            res = fut.result()
            n += 1
            if messy and rng.random() < 0.1:  # a retried append: the same frame again
                with client.read(res.journal, res.begin, res.end) as r:
                    client.append(res.journal, r.read()).result()
            continue
        size = rng.randint(1, 12)
        txn_pub = pub if roll < 0.8 else Publisher(client)
        futures = []
        for _ in range(min(size, count - n)):
            futures.append(txn_pub.publish_uncommitted(mapping, JsonDocument(k=f"k{n % 23}", n=n)))
            n += 1
        results = [f.result() for f in futures]
        if rng.random() < 0.15:  # duplicated frames inside the transaction
            res = rng.choice(results)
            with client.read(res.journal, res.begin, res.end) as r:
                client.append(res.journal, r.read()).result()
        if roll < 0.8:
            intents = txn_pub.build_ack_intents()
        elif roll < 0.9:
            intents = txn_pub.build_rollback_intents()  # rolled back
        else:
            intents = []  # abandoned: never acknowledged
        for i in intents:
            client.append(i.journal, i.intent).result()
            if rng.random() < 0.2:  # an ACK appended twice
                client.append(i.journal, i.intent).result()


def committed_by_key(client: JournalClient, journals: Sequence[str]) -> dict[str, list[int]]:
    """Each key's numbers in committed order, read committed from ``journals``."""
    out: dict[str, list[int]] = {}
    for name in journals:
        with ReadCommittedIter(client, name, new_doc) as it:
            for env in it:
                if not is_ack(env):
                    m = env.message
                    out.setdefault(m["k"], []).append(m["n"])
    return out


def output_by_key(
    client: JournalClient, journals: Sequence[str]
) -> dict[str, list[tuple[int, int]]]:
    """Each key's ``(n, seen)`` in the committed output of ``journals``."""
    out: dict[str, list[tuple[int, int]]] = {}
    for name in journals:
        with ReadCommittedIter(client, name, new_doc) as it:
            for env in it:
                if not is_ack(env):
                    m = env.message
                    out.setdefault(m["k"], []).append((m["n"], m["seen"]))
    return out


def expected_output(by_key: dict[str, list[int]]) -> dict[str, list[tuple[int, int]]]:
    return {k: [(n, i + 1) for i, n in enumerate(ns)] for k, ns in by_key.items()}


# -- stores ------------------------------------------------------------------------


def open_store(kind: str, shard: Shard) -> Store:
    """``json:DIR``, ``sqlite:PATH`` or ``postgres:DSN``; ``{shard}`` in it
    is the shard's id (``/`` as ``_``)."""
    scheme, _, where = kind.partition(":")
    where = where.replace("{shard}", shard.id.replace("/", "_"))
    if scheme == "json":
        return JSONFileStore(where)
    if scheme == "sqlite":
        return SQLiteStore(where)
    if scheme == "postgres":
        return PostgresStore(where)
    raise ValueError(f"unknown store kind {kind!r}")


class CountingState:
    """The application's state in any of the stores: counts per key and a
    total. SQL stores keep the transaction's changes in memory and write
    them in finalize_txn (so SQLite's write lock is held only while
    committing)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cache: dict[str, int] = {}
        self.total_delta = 0
        if isinstance(store, SQLStore):
            mark = "%s" if isinstance(store, PostgresStore) else "?"
            self.mark = mark
            store.connection.execute(
                "CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, c BIGINT NOT NULL)")
            store.connection.commit()

    def add(self, key: str, n: int) -> int:
        store = self.store
        if isinstance(store, JSONFileStore):
            counts = store.state.setdefault("counts", {})
            counts[key] = c = counts.get(key, 0) + 1
            store.state["total"] = store.state.get("total", 0) + n
            return int(c)
        if key not in self.cache:
            assert isinstance(store, SQLStore)
            row = store.connection.execute(
                f"SELECT c FROM counts WHERE k = {self.mark}", (key,)).fetchone()
            self.cache[key] = 0 if row is None else int(row[0])
        self.cache[key] += 1
        self.total_delta += n
        return self.cache[key]

    def flush(self) -> None:
        store = self.store
        if not isinstance(store, SQLStore):
            return
        m = self.mark
        conn = store.connection
        for key, c in self.cache.items():
            conn.execute(f"INSERT INTO counts (k, c) VALUES ({m}, {m}) ON CONFLICT (k)"
                         " DO UPDATE SET c = excluded.c", (key, c))
        if self.total_delta:
            conn.execute(f"INSERT INTO counts (k, c) VALUES ('#total', {m}) ON CONFLICT (k)"
                         " DO UPDATE SET c = counts.c + excluded.c", (self.total_delta,))
        self.cache.clear()
        self.total_delta = 0

    def snapshot(self) -> tuple[dict[str, int], int]:
        """(counts, total) as committed."""
        store = self.store
        if isinstance(store, JSONFileStore):
            return dict(store.state.get("counts", {})), int(store.state.get("total", 0))
        assert isinstance(store, SQLStore)
        rows = dict(store.connection.execute("SELECT k, c FROM counts").fetchall())
        store.connection.rollback()
        total = rows.pop("#total", 0)
        return {k: int(v) for k, v in rows.items()}, int(total)


class CountingApp(Application):
    """The counting application (see the module docstring). ``outputs``
    maps a shard id to its output journals; ``store_kind`` is an
    ``open_store`` kind, or makes the store of a shard. Hooks
    (``on_message``, ``on_finalize``) let a test act at a precise point."""

    def __init__(
        self,
        store_kind: str | Callable[[Shard], Store],
        outputs: dict[str, Sequence[str]],
        *,
        on_message: Callable[[Shard, Envelope], None] | None = None,
        on_finalize: Callable[[Shard], None] | None = None,
    ) -> None:
        self.store_kind = store_kind
        self.outputs = outputs
        self.on_message = on_message
        self.on_finalize = on_finalize
        self.states: dict[int, CountingState] = {}
        self.mappings: dict[str, Any] = {}
        self.begun = 0
        self.finalized = 0
        self.consumed = 0

    def new_store(self, shard: Shard) -> Store:
        kind = self.store_kind
        store = open_store(kind, shard) if isinstance(kind, str) else kind(shard)
        self.states[id(store)] = CountingState(store)
        specs = [shard.client.get(j) for j in self.outputs[shard.id]]
        # Not the inputs' routing: a key's output lands in another partition
        # than its input did, so a transaction writes to every output.
        self.mappings[shard.id] = modulo_mapping(lambda d: "out " + d["k"], lambda: specs)
        return store

    def new_message(self, spec: JournalSpec) -> JsonDocument:
        return JsonDocument()

    def begin_txn(self, shard: Shard, store: Store) -> None:
        self.begun += 1

    def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope, publisher: Publisher
    ) -> None:
        if self.on_message is not None:
            self.on_message(shard, envelope)
        m = envelope.message
        seen = self.states[id(store)].add(m["k"], m["n"])
        publisher.publish_uncommitted(
            self.mappings[shard.id], JsonDocument(k=m["k"], n=m["n"], seen=seen))
        self.consumed += 1

    def finalize_txn(self, shard: Shard, store: Store, publisher: Publisher) -> None:
        self.states[id(store)].flush()
        self.finalized += 1
        if self.on_finalize is not None:
            self.on_finalize(shard)


def committed_state(store_kind: str, shard: Shard) -> tuple[dict[str, int], int]:
    """The counts and total a fresh instance of the shard's store restores."""
    store = open_store(store_kind, shard)
    try:
        state = CountingState(store)
        store.restore_checkpoint(shard)
        return state.snapshot()
    finally:
        store.close()


def expected_state(by_key: dict[str, list[int]]) -> tuple[dict[str, int], int]:
    return {k: len(v) for k, v in by_key.items()}, sum(sum(v) for v in by_key.values())
