"""Helpers of the Spark source tests: a random workload of publishers doing
everything at once, and what ReadCommittedIter yields of it (the answer
Spark's reads are held to)."""

from __future__ import annotations

import random
from typing import Any

from journal import JournalClient, LocalJournalStore
from message import Flags, JsonDocument, Publisher, ReadCommittedIter, Transaction, get_flags

NDJSON = {"content-type": "application/x-ndjson"}


def committed_rows(
    client: JournalClient, journals: list[str], *, acks: bool
) -> list[tuple[str, int, str, Any]]:
    """(journal, begin, uuid, n) of what ReadCommittedIter yields of each
    journal in turn, its ACK_TXN messages too if ``acks``."""
    return [
        (j, e.begin, str(e.message.get_uuid()), e.message.get("n"))
        for j in journals
        for e in ReadCommittedIter(client, j, lambda _s: JsonDocument())
        if acks or get_flags(e.message.get_uuid()) != Flags.ACK_TXN
    ]


def random_workload(store: LocalJournalStore, rng: random.Random, journals: list[str]) -> None:
    """Publishers doing everything at once: committed publishes, transactions
    committed, aborted and abandoned, and frames appended twice."""
    for j in journals:
        store.create(j, {**NDJSON, "app": "w"})
    pubs = [Publisher(store) for _ in range(3)]
    txns: dict[int, Transaction] = {}
    frames: list[tuple[str, int, int]] = []

    def to(doc: Any) -> tuple[str, str]:
        return doc["j"], "application/x-ndjson"

    for n in range(300):
        p = rng.randrange(len(pubs))
        j = rng.choice(journals)
        action = rng.random()
        if action < 0.4:
            r = pubs[p].publish_committed(to, JsonDocument(n=n, j=j)).result()
            frames.append((r.journal, r.begin, r.end))
        elif action < 0.7:
            txn = txns.setdefault(p, Transaction(pubs[p]))
            r = txn.publish(to, JsonDocument(n=n, j=j)).result()
            frames.append((r.journal, r.begin, r.end))
        elif action < 0.8 and p in txns:
            txns.pop(p).commit()
        elif action < 0.85 and p in txns:
            txns.pop(p).abort()
        elif action < 0.88 and p in txns:
            txns.pop(p)  # abandoned: its producer goes away mid-transaction
            pubs[p] = Publisher(store)
        elif frames:
            jn, b, e = rng.choice(frames)
            with store.read(jn, b, e) as rd:
                store.append(jn, rd.read(e - b)).result()  # an at-least-once retry
    store.flush()
