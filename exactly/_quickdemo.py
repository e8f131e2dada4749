"""A short demo of sequencing, with no Spark: publish through duplicates,
commits, roll-backs and an abandoned transaction, then read uncommitted and
committed side by side."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import TextIO, cast

from exactly._common import counted
from journal import LocalJournalStore
from message import (
    Flags,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    Transaction,
    get_flags,
)

JOURNAL = "demo/orders"


def run_quick_demo(store: Path, out: TextIO) -> int:
    marker = store / "@quick-demo"
    if store.exists() and any(store.iterdir()):
        # Either demo's store (the full demo marks its own with @demo) may go.
        if not (marker.exists() or (store / "@demo").exists()):
            raise ValueError(f"{store} exists and is not a demo store: pass another --store")
        shutil.rmtree(store)
    store.mkdir(parents=True, exist_ok=True)
    marker.write_text("created by `exactly demo --quick`; safe to delete\n")
    print(f"store: {store.resolve()}", file=out)
    with LocalJournalStore(store) as client:
        client.create(JOURNAL, {"content-type": "application/x-ndjson"})

        def mapping(_msg: object) -> tuple[str, str]:
            return JOURNAL, "application/x-ndjson"

        alice, bob, carol = (Publisher(client) for _ in range(3))
        expected = []
        for i in range(5):  # committed messages; each one also appended twice
            doc = JsonDocument(order=f"a{i}", by="alice")
            res = alice.publish_committed(mapping, doc).result()
            client.append(JOURNAL, bytes(_frame(client, res.begin, res.end))).result()
            expected.append(f"a{i}")
        with Transaction(bob) as txn:  # a transaction that commits
            for i in range(3):
                txn.publish(mapping, JsonDocument(order=f"b{i}", by="bob"))
        expected += [f"b{i}" for i in range(3)]
        try:  # a transaction that fails and is rolled back
            with Transaction(bob) as txn:
                txn.publish(mapping, JsonDocument(order="b-rolled-back", by="bob"))
                raise RuntimeError("payment declined")
        except RuntimeError:
            pass
        for i in range(2):  # a transaction never acknowledged: its producer "crashed"
            carol.publish_uncommitted(mapping, JsonDocument(order=f"c{i}", by="carol"))
        client.flush()

        new = lambda _spec: JsonDocument()  # noqa: E731
        raw = list(ReadUncommittedIter(client, JOURNAL, new))
        kinds = Counter(Flags(get_flags(e.message.get_uuid())).name for e in raw)
        shown = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        print(f"read uncommitted: {counted(len(raw), 'frame')} ({shown})", file=out)
        it = ReadCommittedIter(client, JOURNAL, new, Sequencer(buffer=2), include_acks=False)
        got = [cast(JsonDocument, e.message)["order"] for e in it]
        print(f"read committed:   {counted(len(got), 'message')}, with"
              f" {counted(it.replays, 'replay')} from a 2-envelope ring: {', '.join(got)}",
              file=out)
        if it.sequencer.has_pending({}):
            pending = "carol's transaction: never acknowledged, so its 2 messages are not delivered"
        else:
            pending = "nothing"
        print(f"still pending:    {pending}", file=out)
        ok = got == expected
        print("exactly once:     " + ("yes" if ok else f"NO, expected {expected}"), file=out)
        return 0 if ok else 1


def _frame(client: LocalJournalStore, begin: int, end: int) -> bytes:
    with client.read(JOURNAL, begin, end) as r:
        data = b""
        while len(data) < end - begin:
            data += r.read(end - begin - len(data))
        return data
