"""The ``exactly`` command line.

Every subcommand works on a journal store directory: ``--root``, or the
``EXACTLY_ROOT`` environment variable, or ``./exactly-store``; or on the
journals of a Gazette cluster: ``--broker URL``, or ``BROKER_ADDRESS``. User mistakes
print one line, ``exactly: error: ...``, and exit with status 1 (status 2,
still one line, for a malformed command line).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import orjson

from exactly import _fsck

CONTENT_TYPES = {
    "ndjson": "application/x-ndjson",
    "json": "application/x-ndjson",
    "csv": "text/csv",
    "proto": "application/x-protobuf-fixed",
}


class UsageError(Exception):
    """A mistake of the user's, reported as one line."""


def _count(n: int, thing: str, things: str | None = None) -> str:
    """``1 message``, ``2 messages``: a count in plain English."""
    return f"{n:,} {thing if n == 1 else (things or thing + 's')}"


# -- helpers ----------------------------------------------------------------------


def _root(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "root", None) or os.environ.get("EXACTLY_ROOT") or "exactly-store")


def _broker(args: argparse.Namespace) -> str | None:
    """The broker URL to use, or None for a local store directory: ``--broker``,
    else ``BROKER_ADDRESS`` (as Gazette's tools) unless a store directory is
    named (``--root`` or ``EXACTLY_ROOT``)."""
    broker = getattr(args, "broker", None)
    root = getattr(args, "root", None)
    if broker and root:
        raise UsageError("give --root (a local store) or --broker (a Gazette cluster), not both")
    if broker or root:
        return broker or None
    if os.environ.get("EXACTLY_ROOT"):
        return None
    return os.environ.get("BROKER_ADDRESS") or None


def _store(args: argparse.Namespace, *, must_exist: bool = True) -> Any:
    broker = _broker(args)
    if broker is not None:
        from journal import GazetteClient

        try:
            # A user waits: a cluster that does not answer is an error within seconds.
            return GazetteClient(broker, retry_timeout=10.0)
        except ValueError as exc:
            raise UsageError(f"--broker: {exc}") from None
    from journal import LocalJournalStore

    root = _root(args)
    if must_exist and not root.is_dir():
        raise UsageError(f"no journal store at {root} (create a journal first, or pass --root)")
    return LocalJournalStore(root)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``15m``, ``2h`` or ``7d``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise UsageError(f"not a duration: {text!r} (use e.g. 90s, 15m, 2h, 7d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _parse_time(text: str) -> int:
    """Unix nanoseconds of an ISO-8601 time, or of a duration ago (``15m``)."""
    try:
        return time.time_ns() - int(_parse_duration(text) * 1e9)
    except UsageError:
        pass
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"not a time: {text!r} (use ISO-8601 or a duration ago such as 15m)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1e9)


def _new_message_func(spec: Any, proto: str | None) -> Callable[[Any], Any]:
    from message import CSVRecord, JsonDocument, proto_message_type

    ct = spec.content_type
    if ct == CONTENT_TYPES["ndjson"]:
        return lambda _spec: JsonDocument()
    if ct == CONTENT_TYPES["csv"]:
        return lambda _spec: CSVRecord()
    if ct == CONTENT_TYPES["proto"]:
        if not proto:
            raise UsageError(f"{spec.name} holds protobuf frames: name the message class "
                             "with --proto module.Class")
        module, _, name = proto.rpartition(".")
        if "" not in sys.path and os.getcwd() not in sys.path:
            # As `python -m` would: modules generated next to the user's data
            # import, although the console script's own directory is on the path.
            sys.path.insert(0, os.getcwd())
        try:
            import importlib

            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UsageError(f"cannot import protobuf class {proto}: {exc}") from None
        from google.protobuf.message import Message as PbMessage

        if not (isinstance(cls, type) and issubclass(cls, PbMessage)
                and getattr(cls, "DESCRIPTOR", None) is not None):
            raise UsageError(f"{proto} is not a protobuf message class")
        wrapped = proto_message_type(cls)
        return lambda _spec: wrapped()
    raise UsageError(f"journal {spec.name} has no known content-type ({ct or 'none'})")


def _content(msg: Any) -> Any:
    if isinstance(msg, dict):
        return msg
    if isinstance(msg, list):
        return msg
    pb = getattr(msg, "pb", None)
    if pb is not None:
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(pb)
    return repr(msg)


def _envelope_doc(env: Any) -> dict[str, Any]:
    from message import clock_to_unix_ns, get_clock, get_flags, get_producer_id

    u = env.message.get_uuid()
    clock = get_clock(u)
    doc: dict[str, Any] = {
        "journal": env.journal.name,
        "begin": env.begin,
        "end": env.end,
        "uuid": str(u),
        "producer": get_producer_id(u).hex(),
        "clock": clock,
        "flags": get_flags(u),
    }
    if clock:
        ns = clock_to_unix_ns(clock)
        doc["time"] = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat()
    doc["message"] = _content(env.message)
    return doc


# -- journals ---------------------------------------------------------------------


def cmd_journals_create(args: argparse.Namespace) -> int:
    labels: dict[str, list[str]] = {}
    for item in args.label or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"a label is name=value, not {item!r}")
        labels.setdefault(key, []).append(value)
    if "content-type" in labels:
        raise UsageError("give the content type with --content-type, not as a label")
    ct = _content_type(args.content_type)
    labels["content-type"] = [ct]
    if _broker(args) is None:
        root = _root(args)
        if root.exists() and not root.is_dir():
            raise UsageError(f"the store {root} is not a directory")
        root.mkdir(parents=True, exist_ok=True)
    from journal import JournalNotFoundError

    with _store(args) as store:
        for name in args.names:
            try:
                existed = store.get(name) is not None
            except JournalNotFoundError:
                existed = False
            spec = store.create(name, labels)  # other labels: JournalExistsError
            if existed:
                print(f"{spec.name} already exists ({spec.content_type}): left as it is")
            else:
                print(f"created {spec.name} ({spec.content_type})")
    return 0


def _content_type(text: str) -> str:
    """The content type that ``--content-type`` names (a short name or a full
    type), refused unless a framing knows it: journals of another type could
    be created, but neither appended to nor read."""
    from framing import framing_by_content_type, registered_content_types

    if not text.strip():
        raise UsageError("--content-type cannot be empty (ndjson, csv, proto, or a full type)")
    ct = CONTENT_TYPES.get(text, text)
    try:
        framing_by_content_type(ct)
    except ValueError:
        short = {v: k for k, v in reversed(CONTENT_TYPES.items())}
        known = ", ".join(
            f"{short[c]} ({c})" if c in short else c for c in registered_content_types()
        )
        raise UsageError(f"unknown content type {text!r}: no framing reads it; use one of"
                         f" {known}") from None
    return ct


def cmd_journals_list(args: argparse.Namespace) -> int:
    from journal import JournalError

    damaged: list[str] = []
    with _store(args) as store:
        specs = store.list(args.selector or "")
        for spec in specs:
            try:
                head: int | None = store.head(spec.name)
            except JournalError as exc:
                # One damaged journal does not hide the others.
                head = None
                damaged.append(f"exactly: error: {exc}")
            if args.json:
                doc = {"name": spec.name, "head": head, "labels": spec.labels.to_dict()}
                print(orjson.dumps(doc).decode())
            else:
                size = f"{head} bytes" if head is not None else "damaged"
                print(f"{spec.name}\t{spec.content_type or '-'}\t{size}")
        if not specs and not args.json:
            print("no journals", file=sys.stderr)
    for line in damaged:
        print(line, file=sys.stderr)
    if damaged:
        print("exactly: `exactly fsck` says more; `exactly fsck --repair` repairs",
              file=sys.stderr)
    return 1 if damaged else 0


def cmd_journals_trim(args: argparse.Namespace) -> int:
    if args.before is None and args.older_than is None:
        raise UsageError("say what to trim: --before OFFSET and/or --older-than DURATION")
    older = _parse_duration(args.older_than) if args.older_than else None
    with _store(args) as store:
        before = store.fragments(args.name)
        first = store.trim(args.name, before_offset=args.before, older_than=older)
        removed = len(before) - len(store.fragments(args.name))
        print(f"{args.name}: removed {_count(removed, 'fragment')}; first readable offset is"
              f" now {first}")
        if not removed:
            print("  (only whole sealed fragments are removed, never the one being written)",
                  file=sys.stderr)
    return 0


# -- append -----------------------------------------------------------------------


_LONG_DIGITS = re.compile(rb"\d{19}")


def _check_int(text: str) -> int:
    """An integer of a JSON line, refused when it does not fit in 64 bits: orjson
    (which frames the journal) would turn it into a float, losing digits."""
    value = int(text)
    if not -(1 << 63) <= value < (1 << 64):
        raise UsageError(f"the integer {text} does not fit in 64 bits (quote it as a string)")
    return value


def _decode_line(n: int, line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"line {n} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _csv_records(lines: Iterator[bytes]) -> Iterator[tuple[int, list[str]]]:
    """RFC 4180 records of CSV input lines: a record whose quoted field holds a
    newline spans several lines; a quote left open at the end is an error."""
    import csv

    first, pending = 0, ""
    for n, raw in enumerate(lines, 1):
        text = _decode_line(n, raw)
        if not pending:
            first = n
            if not text.strip():
                continue
        pending += text
        if pending.count('"') % 2:
            continue  # inside a quoted field: the record goes on
        try:
            fields = next(csv.reader([pending.rstrip("\r\n")], strict=True))
        except csv.Error as exc:
            raise UsageError(f"line {first}: not a CSV record ({exc})") from None
        pending = ""
        yield first, fields
    if pending:
        raise UsageError(f"line {first}: a quoted CSV field is never closed")


def _input_messages(spec: Any, lines: Iterator[bytes], fmt: str) -> Iterator[tuple[int, Any]]:
    import json

    from message import CSVRecord, JsonDocument

    ct = spec.content_type
    if ct == CONTENT_TYPES["csv"]:
        for n, fields in _csv_records(lines):
            yield n, CSVRecord(["", *fields])
        return
    if ct != CONTENT_TYPES["ndjson"]:
        raise UsageError(f"cannot append text lines to {spec.name} ({ct or 'no content-type'})")
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        if fmt == "lines":
            yield n, JsonDocument(text=_decode_line(n, line))
            continue
        try:
            doc = orjson.loads(line)
            if _LONG_DIGITS.search(line):
                json.loads(line, parse_int=_check_int)
        except orjson.JSONDecodeError as exc:
            _decode_line(n, line)  # bytes that are not text: say so first
            raise UsageError(f"line {n}: not a JSON document ({exc})") from None
        except UsageError as exc:
            raise UsageError(f"line {n}: {exc}") from None
        if not isinstance(doc, dict):
            raise UsageError(f"line {n}: a JSON object is needed, not {type(doc).__name__}")
        yield n, JsonDocument(doc)


# Appends in flight before the next one waits for the oldest: the store queues
# a copy of each, so an input faster than the disk would otherwise grow memory
# without bound.
_MAX_IN_FLIGHT = 10_000


class _Progress:
    """A progress line on stderr, redrawn at most a few times a second, and
    only when stderr is a terminal (so that logs and pipes stay clean)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.shown = False
        self.enabled = sys.stderr.isatty()
        self.next = time.monotonic() + 1.0

    def update(self, count: int) -> None:
        if self.enabled and time.monotonic() >= self.next:
            self.next = time.monotonic() + 0.25
            print(f"\r{self.what}: {count:,}", end="", file=sys.stderr, flush=True)
            self.shown = True
            _SHOWN.add(self)

    def done(self) -> None:
        if self.shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self.shown = False
            _SHOWN.discard(self)


# Progress lines on screen, cleared before an error is printed.
_SHOWN: set[_Progress] = set()


# Where `append --transaction` keeps its ACK intents until they are written:
# a directory of the local store (`@` cannot begin a journal name, so it never
# collides with a journal), or journals under a prefix of the cluster's.
_INTENTS_DIR = "@intents"
_INTENTS_PREFIX = ".exactly/intents/"


def _intent_log(args: argparse.Namespace, store: Any, producer: bytes) -> Any:
    from message import IntentLog, JournalIntentLog

    if _broker(args) is not None:
        return JournalIntentLog(store, f"{_INTENTS_PREFIX}{producer.hex()}")
    return IntentLog(_root(args) / _INTENTS_DIR / f"{producer.hex()}.json")


def _recover_intents(args: argparse.Namespace, store: Any) -> None:
    """Write the ACK intents that an ``append --transaction`` cut short (killed
    after making them durable, before writing them all) left behind."""
    from message import IntentLog, JournalIntentLog

    if _broker(args) is not None:
        n = JournalIntentLog.recover_all(store, _INTENTS_PREFIX)
        if n:
            print(f"finished an interrupted transaction: wrote {_count(n, 'ACK intent')}",
                  file=sys.stderr)
        return
    root = _root(args)
    logs = [p for p in sorted((root / _INTENTS_DIR).glob("*.json"))
            if re.fullmatch(r"[0-9a-f]{12}\.json", p.name) and p.is_file()]
    for path in logs:
        n = IntentLog(path).recover(store)
        if n:
            print(f"finished an interrupted transaction: wrote {_count(n, 'ACK intent')} from"
                  f" {path}",
                  file=sys.stderr)


class _Interrupt:
    """Ctrl-C during an append, turned into a ``KeyboardInterrupt`` raised only
    while waiting for input (or before reading the next line), never in the
    middle of publishing or committing: a transaction is then rolled back as a
    whole. A second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.reading = False
        self.previous: Any = None

    def __enter__(self) -> _Interrupt:
        import signal

        try:
            self.previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self.previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.requested = True
        if self.reading:
            raise KeyboardInterrupt

    def lines(self, src: IO[bytes]) -> Iterator[bytes]:
        while True:
            if self.requested:
                raise KeyboardInterrupt
            self.reading = True
            try:
                line = src.readline()
            finally:
                self.reading = False
            if not line:
                return
            yield line


def cmd_append(args: argparse.Namespace) -> int:
    from collections import deque
    from concurrent.futures import Future

    from journal import AppendTooLargeError
    from message import Publisher, Transaction

    src: IO[bytes] = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115
    progress = _Progress(f"appending to {args.name}")
    count = 0
    try:
        with _Interrupt() as interrupt, _store(args) as store:
            spec = store.get(args.name)
            _recover_intents(args, store)

            def mapping(_msg: Any) -> tuple[str, str]:
                return spec.name, spec.content_type or ""

            pub = Publisher(store)
            in_flight: deque[Future[Any]] = deque()

            def sent(fut: Future[Any]) -> None:
                nonlocal count
                count += 1
                in_flight.append(fut)
                if len(in_flight) > _MAX_IN_FLIGHT:
                    in_flight.popleft().result()
                progress.update(count)

            def publish_all(publish: Callable[[Any, Any], Future[Any]]) -> None:
                for n, msg in _input_messages(spec, interrupt.lines(src), args.format):
                    try:
                        fut = publish(mapping, msg)
                    except AppendTooLargeError as exc:
                        raise UsageError(f"line {n}: {exc}") from None
                    sent(fut)

            try:
                if args.transaction:
                    log = _intent_log(args, store, pub.producer_id)
                    with Transaction(pub, log) as txn:
                        publish_all(txn.publish)
                else:
                    publish_all(pub.publish_committed)
            except KeyboardInterrupt:
                store.flush()
                progress.done()
                what = ("the transaction is rolled back" if args.transaction
                        else f"{_count(count, 'message')} appended")
                print(f"exactly: interrupted: {what}", file=sys.stderr)
                return 130
            except UsageError as exc:
                # A bad line stops the input: say what became of the lines before it.
                store.flush()
                if args.transaction:
                    raise UsageError(f"{exc}; the transaction is rolled back: nothing of this"
                                     " input was published") from None
                done = (f"{_count(count, 'message was', 'messages were')} published before it"
                        if count else "nothing was published")
                raise UsageError(f"{exc}; {done} (--transaction publishes all the lines or"
                                 " none)") from None
            store.flush()
            head = store.head(spec.name)
        progress.done()
        print(f"appended {_count(count, 'message')} to {spec.name} (now {head:,} bytes)",
              file=sys.stderr)
    finally:
        progress.done()
        if args.file:
            src.close()
    return 0


# -- read -------------------------------------------------------------------------


def cmd_read(args: argparse.Namespace) -> int:
    from framing import FramingError
    from message import ReadCommittedIter, ReadUncommittedIter, clock_to_unix_ns, get_clock

    since = _parse_time(args.since) if args.since else None
    out = sys.stdout.buffer
    with _store(args) as store:
        spec = store.get(args.name)
        new_message = _new_message_func(spec, args.proto)
        offset = args.offset
        if since is not None and not offset:
            # Skip the fragments written before the time; messages are then
            # filtered by the time in their UUIDs.
            offset = store.offset_since(spec.name, since / 1e9)
        kwargs: dict[str, Any] = {"offset": offset, "block": args.follow,
                                  "skip_corrupt": args.skip_corrupt}
        it: Any
        if args.uncommitted:
            it = ReadUncommittedIter(store, spec.name, new_message, **kwargs)
        else:
            it = ReadCommittedIter(store, spec.name, new_message, **kwargs)
        shown = 0
        try:
            for env in it if args.limit != 0 else ():
                if since is not None:
                    clock = get_clock(env.message.get_uuid())
                    if clock and clock_to_unix_ns(clock) < since:
                        continue
                out.write(orjson.dumps(_envelope_doc(env), option=orjson.OPT_APPEND_NEWLINE))
                shown += 1
                if args.follow:
                    out.flush()
                if args.limit is not None and shown >= args.limit:
                    break
        except BrokenPipeError:
            pass
        except FramingError as exc:
            hint = "" if args.skip_corrupt else "; --skip-corrupt skips such frames"
            if offset and getattr(exc, "offset", None) == offset:
                hint = f"; is {offset} the offset of a frame's start?"
            raise UsageError(f"journal {spec.name}: {exc}{hint}") from None
        finally:
            it.close()
        if it.skipped:
            ranges = it.skipped_ranges
            frames = it.skipped - len(ranges)
            parts = [_count(frames, "corrupt frame")] if frames else []
            parts += [f"damaged offsets [{b}, {e})" for b, e in ranges]
            print(f"skipped {', '.join(parts)}", file=sys.stderr)
    return 0


# -- inspect ----------------------------------------------------------------------


def _load_checkpoint(path: str) -> Any:
    from message import Checkpoint

    data = Path(path).read_bytes()
    if data.lstrip()[:1] == b"{":
        return Checkpoint.from_json(data)
    return Checkpoint.from_bytes(data)


def cmd_inspect(args: argparse.Namespace) -> int:
    from message import (
        Flags,
        MustStartReplay,
        ReadUncommittedIter,
        Sequencer,
        clock_to_unix_ns,
        get_flags,
        get_producer_id,
    )

    if args.checkpoint:
        cp = _load_checkpoint(args.checkpoint)
        print(orjson.dumps(cp.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return 0
    if not args.name:
        raise UsageError("name a journal to inspect, or pass --checkpoint FILE")
    with _store(args) as store:
        spec = store.get(args.name)
        new_message = _new_message_func(spec, args.proto)
        seq = Sequencer()
        frames = committed = 0
        per_producer: dict[bytes, list[int]] = {}
        it = ReadUncommittedIter(store, spec.name, new_message, skip_corrupt=True)
        progress = _Progress(f"reading {spec.name}")
        for env in it:
            frames += 1
            progress.update(frames)
            u = env.message.get_uuid()
            stats = per_producer.setdefault(get_producer_id(u), [0, 0, 0])
            stats[0] += 1
            if get_flags(u) == Flags.ACK_TXN:
                stats[1] += 1
            seq.queue_uncommitted(env)
            while True:
                try:
                    c = seq.deque_committed()
                except MustStartReplay as need:
                    seq.start_replay(
                        ReadUncommittedIter(store, spec.name, new_message,
                                            offset=need.begin, end_offset=need.end)
                    )
                    continue
                if c is None:
                    break
                committed += 1
                per_producer[get_producer_id(c.message.get_uuid())][2] += 1
        progress.done()
        states = {s.producer: s for s in seq.producer_states()}
        print(f"journal {spec.name}: {store.head(spec.name)} bytes, {frames} frames, "
              f"{committed} committed, {frames - committed} dropped or pending"
              + (f", {it.skipped} corrupt skipped" if it.skipped else ""))
        print("producer      frames  acks  committed  last_ack                          open txn")
        for pid, (n, acks, comm) in sorted(per_producer.items()):
            s = states.get(pid)
            when = "-"
            if s is not None and s.last_ack:
                ns = clock_to_unix_ns(s.last_ack)
                when = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat()
            txn = f"since offset {s.begin}" if s is not None and s.begin >= 0 else "-"
            print(f"{pid.hex()}  {n:6d}  {acks:4d}  {comm:9d}  {when:32s}  {txn}")
    return 0


# -- fsck -------------------------------------------------------------------------


def cmd_fsck(args: argparse.Namespace) -> int:
    with _store(args) as client:
        return _fsck.cmd_fsck(args, client)


# -- demo and bench ---------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from exactly._quickdemo import run_quick_demo

    store = args.store or ("demo-cluster" if args.cluster else "demo-store")
    if args.quick:
        if args.cluster:
            raise UsageError("--quick runs without Spark or clusters: not with --cluster")
        return run_quick_demo(Path(store), sys.stdout)
    try:
        from pipeline.demo import run_demo  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:  # the spark extra is not installed
        if args.cluster:
            raise UsageError(f"the cluster demo needs the Spark pipeline ({exc}): install the"
                             " spark extra") from None
        print(f"the Spark pipeline is not available ({exc}); running the sequencing demo. "
              "Install the spark extra for the whole pipeline.", file=sys.stderr)
        return run_quick_demo(Path(store), sys.stdout)
    if not args.cluster:
        return int(run_demo(Path(store)) or 0)
    from exactly._clusterbuild import ClusterError
    from exactly._demo_cmd import run_cluster_demo

    try:
        return run_cluster_demo(Path(store))
    except ClusterError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.run import main as bench_main

    argv = (["--quick"] if args.quick else []) + [f"--only={o}" for o in args.only or []]
    return bench_main(argv)


# -- parser -----------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, like every other
    error (argparse alone prints the usage block first). Subcommand parsers
    inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _store_options() -> _Parser:
    """The options that say which journals a command works on. One parent
    parser, shared by the top-level parser and by every subcommand that works
    on journals, so that each is taken before the subcommand and after it.
    Their default is to be absent: given before the subcommand, a value is
    not overwritten by the subcommand's default."""
    p = _Parser(add_help=False)
    p.add_argument("--root", default=argparse.SUPPRESS,
                   help="journal store directory (default: $EXACTLY_ROOT or ./exactly-store)")
    p.add_argument("--broker", default=argparse.SUPPRESS, metavar="URL",
                   help="a Gazette broker of the cluster holding the journals, e.g."
                        " http://127.0.0.1:8080 (default: $BROKER_ADDRESS, unless a store"
                        " directory is named)")
    return p


def build_parser() -> argparse.ArgumentParser:
    common = [_store_options()]
    p = _Parser(
        prog="exactly",
        description="Exactly-once messaging over append-only journals.",
        parents=common,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    j = sub.add_parser("journals", help="create, list and trim journals", parents=common)
    jsub = j.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = jsub.add_parser("create", help="create journals", parents=common)
    c.add_argument("names", nargs="+", metavar="NAME")
    c.add_argument("--content-type", "-t", default="ndjson",
                   help="ndjson (default), csv, proto, or a full content type")
    c.add_argument("--label", "-l", action="append", metavar="NAME=VALUE")
    c.set_defaults(func=cmd_journals_create)
    ls = jsub.add_parser("list", help="list journals", parents=common)
    ls.add_argument("--selector", "-s", help="label selector, e.g. 'topic=clicks'")
    ls.add_argument("--json", action="store_true", help="one JSON document per journal")
    ls.set_defaults(func=cmd_journals_list)
    t = jsub.add_parser("trim", help="remove old fragments (retention)", parents=common)
    t.add_argument("name")
    t.add_argument("--before", type=int, metavar="OFFSET")
    t.add_argument("--older-than", metavar="DURATION", help="e.g. 7d, 12h")
    t.set_defaults(func=cmd_journals_trim)

    a = sub.add_parser("append", help="publish stdin lines (JSON documents) to a journal",
                       parents=common)
    a.add_argument("name")
    a.add_argument("--file", "-f", help="read from this file instead of stdin")
    a.add_argument("--format", choices=("json", "lines"), default="json",
                   help="json: one JSON object per line (default); lines: wrap each line "
                        "as {\"text\": line}")
    a.add_argument("--transaction", action="store_true",
                   help="publish all lines as one transaction, committed at the end")
    a.set_defaults(func=cmd_append)

    r = sub.add_parser("read", help="read messages as NDJSON with envelope metadata",
                       parents=common)
    r.add_argument("name")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--committed", action="store_true", help="committed only (default)")
    mode.add_argument("--uncommitted", action="store_true", help="every frame")
    r.add_argument("--offset", type=int, default=0, help="journal offset to start at")
    r.add_argument("--since", help="only messages published since a time (ISO-8601, or 15m)")
    r.add_argument("--follow", "-F", action="store_true", help="wait for new messages")
    r.add_argument("--limit", "-n", type=_non_negative, metavar="N",
                   help="stop after N messages")
    r.add_argument("--skip-corrupt", action="store_true", help="skip undecodable frames")
    r.add_argument("--proto", help="protobuf message class (module.Class) of a proto journal")
    r.set_defaults(func=cmd_read)

    i = sub.add_parser("inspect", help="producers and open transactions of a journal, "
                                       "or what a checkpoint holds", parents=common)
    i.add_argument("name", nargs="?")
    i.add_argument("--checkpoint", metavar="FILE", help="a checkpoint (JSON or protobuf)")
    i.add_argument("--proto", help="protobuf message class (module.Class) of a proto journal")
    i.set_defaults(func=cmd_inspect)

    _fsck.add_parser(sub, common).set_defaults(func=cmd_fsck)

    d = sub.add_parser("demo", help="run the demo pipeline end to end on a local store"
                                    " (or, with --cluster, on local Gazette and Spark clusters)")
    d.add_argument("--store", default=None,
                   help="directory of the demo's store, or of its clusters with --cluster"
                        " (default ./demo-store, or ./demo-cluster)")
    d.add_argument("--cluster", action="store_true",
                   help="start a Gazette cluster (etcd, 3 brokers) and a Spark standalone"
                        " cluster (a master, 2 workers) on 127.0.0.1, run the demo on them,"
                        " and stop them")
    d.add_argument("--quick", action="store_true",
                   help="only the sequencing demo: no Spark, a few seconds")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="run the benchmarks and print a table")
    b.add_argument("--quick", action="store_true", help="small sizes: check they run")
    b.add_argument("--only", action="append", metavar="NAME", help="only this benchmark")
    b.set_defaults(func=cmd_bench)

    from exactly._cluster_cmd import add_cluster_command

    add_cluster_command(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from framing import FramingError
    from journal import JournalError
    from message import MessageError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        for progress in list(_SHOWN):
            progress.done()
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`| head`): stop quietly, and keep
        # the interpreter from complaining when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, MessageError, FramingError, JournalError, ValueError, OSError) as exc:
        where = ""
        journal, offset = getattr(exc, "journal", None), getattr(exc, "offset", None)
        if journal and offset is not None and str(offset) not in str(exc):
            where = f" (journal {journal}, offset {offset})"
        for progress in list(_SHOWN):
            progress.done()
        print(f"exactly: error: {exc}{where}", file=sys.stderr)
        return 1
