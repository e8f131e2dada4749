"""The counting application (tests/consumer_support.py) as ``exactly serve``
runs it in the member tests: ``exactly serve tests.member_app:MemberApp``.

Its configuration is the JSON of ``$EXACTLY_TEST_MEMBER``::

    {"store": "sqlite:DIR/{shard}.db", "outputs": {"shard": ["journal", ...]},
     "slow": 0.0}

Each start of a shard's store is a term (``PID:n``). In every transaction
it commits, a SQL store also records the term in a ``terms`` table, so
that a test can check that no two members ever committed one shard in
overlapping terms. After each commit it prints ``committed SHARD TERM
UNIX_TIME`` on standard output.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import time
from typing import Any

import orjson

from consumer import Shard, SQLStore, Store
from message import Envelope, Publisher
from tests.consumer_support import CountingApp

_TERMS = itertools.count(1)


class MemberApp(CountingApp):
    def __init__(self) -> None:
        config: dict[str, Any] = orjson.loads(os.environ["EXACTLY_TEST_MEMBER"])
        super().__init__(config["store"], config["outputs"])
        self.slow = float(config.get("slow", 0.0))
        self.terms: dict[int, str] = {}

    def new_store(self, shard: Shard) -> Store:
        # What exactly serve told the collector (tests/consumer/test_members.py).
        sys.stdout.write(
            f"gc: {gc.get_freeze_count()} frozen, threshold {gc.get_threshold()[0]}\n")
        sys.stdout.flush()  # one write: the log's other lines come from other threads
        store = super().new_store(shard)
        self.terms[id(store)] = f"{os.getpid()}:{next(_TERMS)}"
        if isinstance(store, SQLStore):
            store.connection.execute(
                "CREATE TABLE IF NOT EXISTS terms (seq INTEGER PRIMARY KEY, term TEXT NOT NULL)")
            store.connection.commit()
        return store

    def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope, publisher: Publisher
    ) -> None:
        if self.slow:
            time.sleep(self.slow)
        super().consume_message(shard, store, envelope, publisher)

    def finalize_txn(self, shard: Shard, store: Store, publisher: Publisher) -> None:
        super().finalize_txn(shard, store, publisher)
        if isinstance(store, SQLStore):
            store.connection.execute(
                "INSERT INTO terms (seq, term) VALUES ((SELECT COALESCE(MAX(seq), 0) + 1"
                " FROM terms), ?)", (self.terms[id(store)],))
        # Printed before the commit: "about to commit"; a test reads the
        # terms table for what did commit.
        print(f"committing {shard.id} {self.terms[id(store)]} {time.time():.3f}", flush=True)

