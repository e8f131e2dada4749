"""A process with metrics on, for tests/test_metrics.py: it serves them over
HTTP, plays a known scenario through the library, prints what it did as one
JSON line, then stays up (to be scraped) until its stdin closes.

    python -m tests.metrics_child ROOT [BROKER PREFIX]

Scenario, on the embedded store in ROOT (or the Gazette cluster at BROKER,
every journal's name after PREFIX):
- ``a/p0``: a Publisher publishes 10 messages committed, a transaction of 3
  it commits, one of 2 it rolls back; 4 frames are appended again
  (duplicates); a second Publisher leaves a transaction of 1 open. A
  committed reader with a ring of 2 envelopes reads it all (a replay) and
  checkpoints.
- ``in/p0`` holds 2000 messages that consumer shard ``s1`` reads slowly
  (a lag, served while it serves), publishing one message to ``out/p0``
  for each, until a second store instance fences it off.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

from prometheus_client import REGISTRY

from consumer import FencedError, JSONFileStore, Runner, Shard, ShardSpec
from journal import LocalJournalStore, metrics
from message import JsonDocument, Publisher, ReadCommittedIter, Sequencer

NDJSON = {"content-type": "application/x-ndjson"}
PREFIX = sys.argv[3] if len(sys.argv) > 3 else ""
A, IN, OUT = PREFIX + "a/p0", PREFIX + "in/p0", PREFIX + "out/p0"


def to(journal: str) -> Any:
    return lambda msg: (journal, "application/x-ndjson")


class CountingStore(JSONFileStore):
    def __init__(self, path: Any, facts: dict[str, Any], app: App) -> None:
        super().__init__(path)
        self.facts, self.app = facts, app

    def start_commit(self, shard: Shard, cp: Any) -> None:
        try:
            super().start_commit(shard, cp)
        except FencedError:
            self.facts["fenced"] = True
            raise
        self.facts["commits"] += 1
        self.facts["consumed_committed"] = self.app.consumed


class App:
    def __init__(self, root: str, facts: dict[str, Any]) -> None:
        self.root, self.facts = root, facts
        self.consumed = 0

    def new_store(self, shard: Shard) -> CountingStore:
        return CountingStore(f"{self.root}/state-{shard.id}", self.facts, self)

    def new_message(self, spec: Any) -> JsonDocument:
        return JsonDocument()

    def begin_txn(self, shard: Shard, store: Any) -> None:
        pass

    def consume_message(self, shard: Shard, store: Any, env: Any, publisher: Any) -> None:
        time.sleep(0.0005)
        publisher.publish_uncommitted(to(OUT), JsonDocument(n=env.message["n"]))
        self.consumed += 1
        self.facts["published_by_app"] += 1

    def finalize_txn(self, shard: Shard, store: Any, publisher: Any) -> None:
        self.facts["finalized"] += 1


def main() -> int:
    root = sys.argv[1]
    port = metrics.start_http_server(0)
    if len(sys.argv) > 2:
        from journal import GazetteClient
        store: Any = GazetteClient(sys.argv[2])
        for name in (A, IN, OUT):
            store.create(name, NDJSON, replication=1)
    else:
        store = LocalJournalStore(root)
        for name in (A, IN, OUT):
            store.create(name, NDJSON)
    facts: dict[str, Any] = {"port": port, "commits": 0, "finalized": 0, "fenced": False,
                             "published_by_app": 0, "consumed_committed": 0}

    # -- a/p0: publishing, duplicates, a roll-back, an open transaction, a replay --
    pub = Publisher(store)
    first = [pub.publish_committed(to(A), JsonDocument(n=i)) for i in range(10)]
    for n in (3, 2):
        for i in range(n):
            pub.publish_uncommitted(to(A), JsonDocument(txn=n, i=i))
        intents = pub.build_ack_intents() if n == 3 else pub.build_rollback_intents()
        for intent in intents:
            store.append(intent.journal, intent.intent).result()
    for f in first[:4]:
        r = f.result()
        with store.read(A, r.begin, r.end) as reader:
            store.append(A, reader.read()).result()
    Publisher(store).publish_uncommitted(to(A), JsonDocument(open=True)).result()
    store.flush()
    new = lambda spec: JsonDocument()  # noqa: E731
    with ReadCommittedIter(store, A, new, Sequencer(buffer=2)) as it:
        facts["read"] = sum(1 for _ in it)
        facts["replays"] = it.replays
        cp = it.checkpoint()
        facts["open_spans"] = sum(1 for s in cp.states if s.begin >= 0)
        facts["producers"] = len(cp.states)
        facts["a_head"] = store.head(A)
        # Stays open (so its open transaction stays reported) until the end.
        held = it

        # -- in/p0: a consumer shard that falls behind, then is fenced off -----
        feeder = Publisher(store)
        for i in range(2000):
            feeder.publish_committed(to(IN), JsonDocument(n=i))
        store.flush()
        app = App(root, facts)
        spec = ShardSpec("s1", [IN], max_txn_duration=0.05)
        runner = Runner(store, app, [spec])
        runner.start()
        while facts["commits"] < 2:
            time.sleep(0.01)
        # Behind while it serves (measured now, as a scrape does).
        facts["lag_seen"] = REGISTRY.get_sample_value(
            "exactly_consumer_source_lag_bytes", {"shard": "s1", "journal": IN})
        JSONFileStore(f"{root}/state-s1").restore_checkpoint(Shard(spec, store))  # fences
        while not facts["fenced"]:
            time.sleep(0.01)
        with contextlib.suppress(FencedError):
            runner.stop()
        cp = JSONFileStore(f"{root}/state-s1").restore_checkpoint(Shard(spec, store))
        facts["lag_bytes"] = store.head(IN) - cp.offsets[IN]
        facts["in_head"] = store.head(IN)
        print(json.dumps(facts), flush=True)
        sys.stdin.read()  # scraped meanwhile
        assert held is it
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
