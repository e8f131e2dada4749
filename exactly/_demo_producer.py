"""A producer process of the demo: ``python -m exactly._demo_producer STORE ROLE SEED``,
STORE being a store directory or a Gazette broker URL.

Publishes a synthetic clickstream to the ``clicks/part-*`` journals in one of
three roles, and prints a JSON report of what it *committed* (the views per
page and per session, and each session's final state) on its last line:

- ``committed``: every click published committed; some sessions end with a
  logout (a message with no content but the session: a delete).
- ``transactions``: clicks in transactions, two of three committed and one
  of three aborted (roll-back ACKs written).
- ``killed``: clicks in a transaction that never ends: it prints ``ready``
  once they are durable, and waits to be killed with SIGKILL.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from typing import Any

import orjson

from journal import JournalStore
from message import JsonDocument, Publisher, Transaction, modulo_mapping
from pipeline import StoreOptions

PAGES = ["/", "/search", "/product/1", "/product/2", "/product/3", "/cart", "/checkout"]


def _session(doc: Any) -> str:
    return str(doc["session"])


def _mapping(store: JournalStore) -> Any:
    parts = store.list("app=clicks")
    return modulo_mapping(_session, lambda: parts)


def main(root: str, role: str, seed: int) -> None:
    rng = random.Random(seed)
    pages: Counter[str] = Counter()
    sessions: Counter[str] = Counter()
    final: dict[str, str | None] = {}
    where = StoreOptions.of({"broker": root} if "://" in root else {"root": root})
    with where.open() as store:
        mapping = _mapping(store)
        publisher = Publisher(store)

        def click(session: str) -> JsonDocument:
            return JsonDocument(
                session=session, page=rng.choice(PAGES), ms=rng.randrange(50, 5000)
            )

        if role == "committed":
            names = [f"{role}{seed}-s{i}" for i in range(40)]
            for _ in range(3000):
                session = rng.choice(names)
                doc = click(session)
                publisher.publish_committed(mapping, doc)
                pages[doc["page"]] += 1
                sessions[session] += 1
                final[session] = doc["page"]
            for session in names[:8]:  # logouts: deletes of the session's state
                publisher.publish_committed(mapping, JsonDocument(session=session))
                final[session] = None
            store.flush()
        elif role == "transactions":
            names = [f"{role}{seed}-s{i}" for i in range(30)]
            for n in range(60):
                txn = Transaction(Publisher(store))
                docs = [click(rng.choice(names)) for _ in range(rng.randrange(5, 40))]
                for doc in docs:
                    txn.publish(mapping, doc)
                if n % 3 == 2:
                    txn.abort()
                    continue
                txn.commit()
                for doc in docs:
                    pages[doc["page"]] += 1
                    sessions[doc["session"]] += 1
                    final[doc["session"]] = doc["page"]
        elif role == "killed":
            txn = Transaction(publisher)
            for _ in range(500):
                txn.publish(mapping, click(f"{role}{seed}-s{rng.randrange(10)}"))
            store.flush()
            print("ready", flush=True)
            time.sleep(600)  # killed long before
            return
        else:
            raise SystemExit(f"unknown role {role!r}")
    report = {"pages": pages, "sessions": sessions, "final": final}
    sys.stdout.write(orjson.dumps(report).decode() + "\n")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    except KeyboardInterrupt:  # the demo was stopped (Ctrl-C reaches its whole group)
        sys.exit(130)
    except BrokenPipeError:  # the demo went away before reading the report
        sys.exit(1)
