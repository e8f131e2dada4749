"""``exactly lag``: how far a consumer is behind the journals it reads.

A consumer's position is a checkpoint: a checkpoint file (``--checkpoint``),
the checkpoints in a consumer runtime's store (``--store``, as ``shards
show`` reads them), or the last committed micro-batch of a Spark streaming
query (``--spark-checkpoint``, its checkpoint location). Against each
journal's write head it shows the bytes behind, the committed messages
behind (read from the position on, as the consumer will read them), how old
the oldest of those is (the consumer's lag in time) and how long ago the
newest committed message was written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from exactly._common import (
    PAST_HEAD_NOTE,
    ArgumentsError,
    Progress,
    UsageError,
    behind_and_past,
    new_message_func,
    non_empty,
    open_store,
    positive_seconds,
    stop_requests,
)


def add_lag_command(sub: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lag", help="how far a consumer (a checkpoint, consumer shards, or a Spark"
                                   " streaming query) is behind its journals",
                       parents=list(common))
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", metavar="FILE", type=non_empty,
                      help="a checkpoint file (JSON or protobuf)")
    what.add_argument("--store", metavar="STORE", type=non_empty,
                      help="a consumer runtime's store, as shards show takes it (json:DIR,"
                           " sqlite:PATH, postgresql://...)")
    what.add_argument("--spark-checkpoint", metavar="DIR", type=non_empty,
                      help="a Spark streaming query's checkpoint location")
    p.add_argument("shard_ids", nargs="*", metavar="SHARD", help="with --store: only these shards")
    p.add_argument("--watch", nargs="?", type=positive_seconds, const=2.0, metavar="SECONDS",
                   help="refresh every SECONDS (2 by default) until Ctrl-C")
    p.add_argument("--json", action="store_true", help="one JSON document per journal")
    p.add_argument("--proto", help="protobuf message class (module.Class) of a proto journal")
    p.set_defaults(func=cmd_lag)


@dataclass
class _Row:
    consumer: str
    journal: str
    offset: int
    head: int | None = None
    messages: int | None = None
    oldest_unread: int | None = None  # ns since the epoch
    newest: int | None = None

    def doc(self) -> dict[str, Any]:
        now = time.time_ns()
        behind, past = behind_and_past(self.head, self.offset)
        return {
            "consumer": self.consumer, "journal": self.journal, "offset": self.offset,
            "head": self.head, "bytes_behind": behind, "bytes_past_head": past,
            "messages_behind": self.messages,
            "oldest_unread_age_s": _secs(now, self.oldest_unread),
            "newest_message_age_s": _secs(now, self.newest),
        }


def _secs(now: int, ns: int | None) -> float | None:
    return None if ns is None else round(max(0, now - ns) / 1e9, 3)


def _positions(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """``(consumer, Checkpoint)`` of what the arguments name."""
    if args.checkpoint:
        from exactly._read_cmd import load_checkpoint

        try:
            return [(Path(args.checkpoint).name, load_checkpoint(args.checkpoint))]
        except FileNotFoundError:
            raise UsageError(f"no checkpoint file {args.checkpoint}") from None
    if args.store:
        from exactly._shards_cmd import checkpoints_of

        found = checkpoints_of(args.store)
        wanted = args.shard_ids or sorted(found)
        missing = [s for s in wanted if s not in found]
        if missing:
            raise UsageError(f"no shard {', '.join(missing)} in {args.store}")
        return [(f"shard {s}", found[s]) for s in wanted]
    try:
        from pipeline import committed_position
    except ImportError as exc:
        raise UsageError(f"--spark-checkpoint needs the spark extra ({exc})") from None
    try:
        cp = committed_position(args.spark_checkpoint)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    if cp is None:
        raise UsageError(f"{args.spark_checkpoint}: the query has committed no micro-batch yet")
    return [(Path(args.spark_checkpoint).name, cp)]


@dataclass(slots=True)
class _Counted:
    """What a refresh counted of one consumer's lag in one journal, so that
    the next (``--watch``) reads only what was appended since, as long as
    the consumer has not moved."""

    offset: int
    states: tuple[Any, ...]
    head: int
    resume: Any  # the Checkpoint the count stopped at
    messages: int
    oldest_unread: int | None
    newest: int | None


def _measure(store: Any, consumer: str, cp: Any, proto: str | None,
             counted: dict[tuple[str, str], _Counted] | None = None) -> list[_Row]:
    from journal import JournalNotFoundError
    from message import Checkpoint, ReadCommittedIter, clock_to_unix_ns, get_clock

    counted = {} if counted is None else counted
    rows = []
    for journal, offset in sorted(cp.offsets.items()):
        row = _Row(consumer, journal, offset)
        rows.append(row)
        try:
            spec = store.get(journal)
            row.head = store.head(journal)
        except JournalNotFoundError:
            continue  # gone (another journal error, such as a cluster that
            # does not answer, is the command's error: not a journal gone)
        if row.head <= offset:
            row.messages = 0
            continue
        states = tuple(s for s in cp.states if s.journal == journal)
        before = counted.get((consumer, journal))
        if before is not None and (before.offset, before.states) == (offset, states) \
                and before.head <= row.head:
            start, n = before.resume, before.messages  # only what is new since
            row.oldest_unread, row.newest = before.oldest_unread, before.newest
        else:
            start, n = Checkpoint({journal: offset}, list(states)), 0
        progress = Progress(f"counting what {consumer} has not read of {journal}")
        it = ReadCommittedIter(store, journal, new_message_func(spec, proto), checkpoint=start,
                               end_offset=row.head, skip_corrupt=True)
        try:
            for env in it:
                clock = get_clock(env.message.get_uuid())
                if clock:
                    at = clock_to_unix_ns(clock)
                    if row.oldest_unread is None:
                        row.oldest_unread = at
                    row.newest = at
                n += 1
                progress.update(n)
            resume = it.checkpoint()
        finally:
            it.close()
            progress.done()
        row.messages = n
        counted[(consumer, journal)] = _Counted(offset, states, row.head, resume, n,
                                                row.oldest_unread, row.newest)
    return rows


def _sleep_unless(stop: list[signal.Signals], seconds: float) -> bool:
    """Sleep ``seconds`` unless a stop is asked (``stop`` grows) first; say
    whether one was."""
    deadline = time.monotonic() + seconds
    while not stop and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))
    return bool(stop)


def _age(ns: int | None) -> str:
    if ns is None:
        return "-"
    s = max(0.0, (time.time_ns() - ns) / 1e9)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _print(rows: list[_Row]) -> None:
    cw = max([len("consumer")] + [len(r.consumer) for r in rows])
    jw = max([len("journal")] + [len(r.journal) for r in rows])
    print(f"{'consumer':{cw}}  {'journal':{jw}}  {'offset':>12}  {'head':>12}  {'bytes behind':>12}"
          f"  {'messages':>9}  {'oldest unread':>13}  {'newest message':>14}")
    any_past = False
    for r in rows:
        head = "gone" if r.head is None else f"{r.head}"
        bytes_behind, past = behind_and_past(r.head, r.offset)
        behind = "-" if bytes_behind is None else f"{bytes_behind}"
        if past:
            behind, any_past = f"past head {past}", True
        msgs = "-" if r.messages is None else f"{r.messages}"
        print(f"{r.consumer:{cw}}  {r.journal:{jw}}  {r.offset:>12}  {head:>12}  {behind:>12}"
              f"  {msgs:>9}  {_age(r.oldest_unread):>13}  {_age(r.newest):>14}")
    if any_past:
        print(PAST_HEAD_NOTE)


def cmd_lag(args: argparse.Namespace) -> int:
    if args.shard_ids and not args.store:
        raise ArgumentsError("naming shards goes with --store")
    if not args.watch:
        return _lag_once(args)
    # --watch ends on Ctrl-C or SIGTERM, between two refreshes (never in the
    # middle of reading a store or a journal), with status 0; a second Ctrl-C
    # interrupts at once.
    def second_interrupts(_signal: signal.Signals) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    with stop_requests(second_interrupts) as asked:
        return _lag_once(args, asked)


def _lag_once(args: argparse.Namespace, stop: list[signal.Signals] | None = None) -> int:
    counted: dict[tuple[str, str], _Counted] = {}
    with open_store(args) as store:
        while True:
            rows = [r for consumer, cp in _positions(args)
                    for r in _measure(store, consumer, cp, args.proto, counted)]
            if args.json:
                for r in rows:
                    print(orjson.dumps(r.doc()).decode())
            else:
                if args.watch:
                    print(dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
                if rows:
                    _print(rows)
                else:
                    print("the consumer has read no journal yet")
            sys.stdout.flush()
            if stop is None or _sleep_unless(stop, args.watch):
                return 0
            print()
