"""``exactly append``: publish lines of input, committed or as one transaction."""

from __future__ import annotations

import argparse
import csv
import re
import signal
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import orjson

from exactly._common import (
    CONTENT_TYPES,
    Progress,
    UsageError,
    broker_of,
    counted,
    open_store,
    root_of,
)

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
    if ct == CONTENT_TYPES["csv"] and fmt == "lines":
        for n, raw in enumerate(lines, 1):  # each line as it is: a record of one field
            line = raw.rstrip(b"\r\n")
            if line.strip():
                yield n, CSVRecord(["", _decode_line(n, line)])
        return
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


# Where `append --transaction` keeps its ACK intents until they are written:
# a directory of the local store (`@` cannot begin a journal name, so it never
# collides with a journal), or journals under a prefix of the cluster's.
_INTENTS_DIR = "@intents"
_INTENTS_PREFIX = ".exactly/intents/"


def _intent_log(args: argparse.Namespace, store: Any, producer: bytes) -> Any:
    from message import IntentLog, JournalIntentLog

    if broker_of(args) is not None:
        return JournalIntentLog(store, f"{_INTENTS_PREFIX}{producer.hex()}")
    return IntentLog(root_of(args) / _INTENTS_DIR / f"{producer.hex()}.json")


def _recover_intents(args: argparse.Namespace, store: Any) -> None:
    """Write the ACK intents that an ``append --transaction`` cut short (killed
    after making them durable, before writing them all) left behind."""
    from message import IntentLog, JournalIntentLog

    if broker_of(args) is not None:
        n = JournalIntentLog.recover_all(store, _INTENTS_PREFIX)
        if n:
            print(f"finished an interrupted transaction: wrote {counted(n, 'ACK intent')}",
                  file=sys.stderr)
        return
    root = root_of(args)
    logs = [p for p in sorted((root / _INTENTS_DIR).glob("*.json"))
            if re.fullmatch(r"[0-9a-f]{12}\.json", p.name) and p.is_file()]
    for path in logs:
        log = IntentLog(path)
        n = log.recover(store)
        if n:
            print(f"finished an interrupted transaction: wrote {counted(n, 'ACK intent')} from"
                  f" {path}",
                  file=sys.stderr)
        log.remove()  # its producer is not used again


def _no_uuid_place(exc: TypeError) -> str:
    """What a document that cannot hold its UUID at _meta/uuid (a '_meta'
    that is not an object) is told on the command line."""
    return str(exc).split(": rename that key")[0].replace("JsonDocument keeps", "a line keeps") \
        + ": rename that key"


class _Interrupt:
    """Ctrl-C during an append, turned into a ``KeyboardInterrupt`` raised only
    while waiting for input (or before reading the next line), never in the
    middle of publishing or committing: a transaction is then rolled back as a
    whole. A second Ctrl-C interrupts at once."""

    #: SIGTERM and SIGHUP stop an append as Ctrl-C does (unless ignored,
    #: as under nohup); ``status`` is then 128 + the signal's number.
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.requested = False
        self.reading = False
        self.signum: int = signal.SIGINT
        self.previous: dict[int, Any] = {}

    @property
    def status(self) -> int:
        return 128 + self.signum

    def __enter__(self) -> _Interrupt:

        for sig in self.SIGNALS:
            try:
                if sig != signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                    continue
                self.previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                break
        return self

    def __exit__(self, *exc: object) -> None:

        for sig, previous in self.previous.items():
            signal.signal(sig, previous)

    def _handle(self, signum: int, frame: Any) -> None:

        if self.requested:
            raise KeyboardInterrupt  # a second one interrupts at once
        self.requested = True
        self.signum = signum
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


def cmd_emit(args: argparse.Namespace) -> int:
    """``exactly emit``: each input line, as ``append`` reads it, emitted to
    the journal's live followers (``read --follow --transient``), never stored."""
    from journal import AppendTooLargeError
    from message import Publisher

    src: IO[bytes] = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115
    count = reached = 0
    try:
        with _Interrupt() as interrupt, open_store(args) as store:
            spec = store.get(args.name)

            def mapping(_msg: Any) -> tuple[str, str]:
                return spec.name, spec.content_type or ""

            pub = Publisher(store)
            try:
                for n, msg in _input_messages(spec, interrupt.lines(src), args.format):
                    try:
                        reached = pub.emit(mapping, msg)
                    except AppendTooLargeError as exc:
                        raise UsageError(f"line {n}: {exc}") from None
                    except TypeError as exc:  # a document with no place for its UUID
                        raise UsageError(f"line {n}: {_no_uuid_place(exc)}") from None
                    count += 1
            except KeyboardInterrupt:
                print(f"exactly: interrupted: {counted(count, 'message')} emitted",
                      file=sys.stderr)
                return interrupt.status
            except UsageError as exc:
                raise UsageError(f"{exc}; {counted(count, 'message')} emitted before it") from None
        print(f"emitted {counted(count, 'message')} to {spec.name} (not stored; the last reached"
              f" {counted(reached, 'follower')})", file=sys.stderr)
    finally:
        if args.file:
            src.close()
    return 0


def cmd_append(args: argparse.Namespace) -> int:
    from collections import deque
    from concurrent.futures import Future

    from journal import AppendTooLargeError, JournalError
    from message import IntentLog, Publisher, Transaction

    src: IO[bytes] = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115
    progress = Progress(f"appending to {args.name}")
    count = 0
    try:
        with _Interrupt() as interrupt, open_store(args) as store:
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
                    except TypeError as exc:  # a document with no place for its UUID
                        raise UsageError(f"line {n}: {_no_uuid_place(exc)}") from None
                    sent(fut)

            try:
                if args.transaction:
                    log = _intent_log(args, store, pub.producer_id)
                    with Transaction(pub, log) as txn:
                        publish_all(txn.publish)
                    if isinstance(log, IntentLog):
                        log.remove()  # committed: its producer is not used again
                else:
                    publish_all(pub.publish_committed)
                store.flush()
            except KeyboardInterrupt:
                store.flush()
                progress.done()
                what = ("the transaction is rolled back" if args.transaction
                        else f"{counted(count, 'message')} appended")
                print(f"exactly: interrupted: {what}", file=sys.stderr)
                return interrupt.status
            except UsageError as exc:
                # A bad line stops the input: say what became of the lines before it.
                store.flush()
                if args.transaction:
                    raise UsageError(f"{exc}; the transaction is rolled back: nothing of this"
                                     " input was published") from None
                done = (f"{counted(count, 'message was', 'messages were')} published before it"
                        if count else "nothing was published")
                raise UsageError(f"{exc}; {done} (--transaction publishes all the lines or"
                                 " none)") from None
            except JournalError as exc:
                # The store failed (a full disk, say): say what became of the input.
                if args.transaction:
                    raise UsageError(f"{exc}; the transaction is not committed: nothing of this"
                                     " input was published") from None
                raise UsageError(f"{exc}; at most {counted(count, 'message')} of this input"
                                 " were published before it (read the journal to see which)"
                                 ) from None
            head = store.head(spec.name)
        progress.done()
        print(f"appended {counted(count, 'message')} to {spec.name} (now {head:,} bytes)",
              file=sys.stderr)
    finally:
        progress.done()
        if args.file:
            src.close()
    return 0
