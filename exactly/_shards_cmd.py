"""``exactly shards show``: what a consumer shard's store says it has done.

For each shard of a store: each source's checkpoint offset beside the
journal's write head (the lag, in bytes), the producers its Sequencer
tracks (and those with a transaction still open), and the ACK intents the
next start would append again.

The store is named by ``--store``: a ``JSONFileStore`` directory
(``json:DIR``, or a directory), a SQLite file (``sqlite:PATH``, or a path
ending in .db, .sqlite or .sqlite3), or a PostgreSQL URL
(``postgresql://...``). Reading it fences nothing: a running shard goes on.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from exactly._common import (
    PAST_HEAD_NOTE,
    UsageError,
    behind_and_past,
    counted,
    non_empty,
    open_store,
)

#: Open transactions listed by the table (the oldest first); --json has all.
_OPEN_SHOWN = 8


def add_shards_command(sub: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("shards", help="consumer shards: what their stores committed (show),"
                                      " and the shards kept in etcd (apply, list, delete)",
                       parents=list(common))
    ssub = s.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = ssub.add_parser("show", help="each shard's checkpoint from its store, and the lag"
                                        " of its sources", parents=list(common))
    show.add_argument("shard_ids", nargs="*", metavar="SHARD",
                      help="only these shards (default: every shard of the store)")
    show.add_argument("--store", required=True, type=non_empty,
                      help="json:DIR (a JSONFileStore), sqlite:PATH, or postgresql://...")
    show.add_argument("--json", action="store_true", help="one JSON document per shard")
    show.set_defaults(func=cmd_shards_show)
    from exactly._members_cmd import add_member_commands

    add_member_commands(ssub, sub, common)


def checkpoints_of(spec: str) -> dict[str, Any]:
    """Shard id -> Checkpoint, as the store ``spec`` names it."""
    from consumer import JSONFileStore, PostgresStore, SQLiteStore

    scheme, sep, rest = spec.partition(":")
    if spec.startswith(("postgres://", "postgresql://")):
        store = PostgresStore(spec, connect_timeout=5.0)  # a user waits: as for brokers
        try:
            return store.read_checkpoints()
        finally:
            store.close()
    path = Path(rest if sep and scheme in ("json", "sqlite") else spec)
    kind = scheme if sep and scheme in ("json", "sqlite") else (
        "sqlite" if path.suffix in (".db", ".sqlite", ".sqlite3") else "json")
    if not path.exists():
        raise UsageError(f"no store at {path}")
    if kind == "sqlite":
        if not path.is_file():
            raise UsageError(f"{path} is not a SQLite file")
        return SQLiteStore.inspect(path)  # (read-only: the file is left as it is)
    if not path.is_dir():
        raise UsageError(f"{path} is not a JSONFileStore directory")
    shard, cp, _ = JSONFileStore(path).read_checkpoint()
    if shard is None:
        if any(path.iterdir()):
            raise UsageError(f"{path} holds no JSONFileStore state file")
        return {}
    return {shard: cp}


def _when(clock: int) -> str:
    from message import clock_to_unix_ns

    if not clock:
        return "-"
    ns = clock_to_unix_ns(clock)
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(shard: str, cp: Any, heads: dict[str, int | None]) -> dict[str, Any]:
    sources = []
    for journal, offset in sorted(cp.offsets.items()):
        head = heads.get(journal)
        lag, past = behind_and_past(head, offset)
        sources.append({"journal": journal, "offset": offset, "head": head, "lag": lag,
                        "past_head": past})
    producers = [
        {"journal": s.journal, "producer": s.producer.hex(), "last_ack": s.last_ack,
         "last_ack_time": _when(s.last_ack), "open_since": s.begin if s.begin >= 0 else None}
        for s in sorted(cp.states, key=lambda s: (s.journal, s.producer))
    ]
    intents = {j: len(b) for j, b in sorted(cp.ack_intents.items())}
    return {"shard": shard, "sources": sources, "producers": producers, "ack_intents": intents}


def cmd_shards_show(args: argparse.Namespace) -> int:
    from journal import JournalError, JournalNotFoundError

    checkpoints = checkpoints_of(args.store)
    wanted = args.shard_ids or sorted(checkpoints)
    missing = [s for s in wanted if s not in checkpoints]
    if missing:
        known = ", ".join(sorted(checkpoints)) or "none"
        raise UsageError(f"no shard {', '.join(missing)} in {args.store} (it holds: {known})")
    if not wanted:
        print(f"{args.store}: no shard has committed yet")
        return 0
    journals = {j for s in wanted for j in checkpoints[s].offsets}
    heads: dict[str, int | None] = dict.fromkeys(journals)
    note = ""
    try:
        with open_store(args) as client:
            for j in sorted(journals):
                try:
                    heads[j] = client.head(j)
                except JournalNotFoundError:
                    heads[j] = None  # (shown as ?: the journal is gone)
    except (UsageError, JournalError) as exc:
        # The checkpoints are the store's, and shown; the heads are not known.
        note = f"(write heads unknown: {exc})"
    for shard in wanted:
        doc = _describe(shard, checkpoints[shard], heads)
        if args.json:
            print(orjson.dumps(doc).decode())
            continue
        _print(doc)
    if note and not args.json:
        print(note)
    return 0


def _print(doc: dict[str, Any]) -> None:
    print(f"shard {doc['shard']}")
    width = max([len("source")] + [len(s["journal"]) for s in doc["sources"]])
    print(f"  {'source':{width}}  {'offset':>14}  {'head':>14}  {'lag (bytes)':>14}")
    for s in doc["sources"]:
        head = "?" if s["head"] is None else f"{s['head']:,}"
        lag = "?" if s["lag"] is None else f"{s['lag']:,}"
        if s["past_head"]:
            lag = f"past head {s['past_head']:,}"
        print(f"  {s['journal']:{width}}  {s['offset']:>14,}  {head:>14}  {lag:>14}")
    if any(s["past_head"] for s in doc["sources"]):
        print(f"  {PAST_HEAD_NOTE}")
    producers = doc["producers"]
    open_ = [p for p in producers if p["open_since"] is not None]
    print(f"  {counted(len(producers), 'producer')} tracked, "
          f"{len(open_)} with a transaction open")
    shown_open = sorted(open_, key=lambda p: p["open_since"])
    for p in shown_open[:_OPEN_SHOWN]:
        print(f"    {p['producer']} in {p['journal']}: open since offset {p['open_since']:,}"
              f" (last ACK {p['last_ack_time']})")
    if len(open_) > _OPEN_SHOWN:
        print(f"    ... and {len(open_) - _OPEN_SHOWN} more (--json lists them all)")
    intents = doc["ack_intents"]
    if intents:
        shown = ", ".join(f"{j} ({counted(n, 'byte')})" for j, n in intents.items())
        print(f"  ACK intents of the last commit: {shown}")
    else:
        print("  ACK intents of the last commit: none")
