"""What the ``exactly`` commands share: user errors, where the journals are
(a store directory or a Gazette cluster), parsing of times and durations,
messages as output, and the progress line."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from exactly._errors import ArgumentsError as ArgumentsError
from exactly._errors import UsageError as UsageError

CONTENT_TYPES = {
    "ndjson": "application/x-ndjson",
    "json": "application/x-ndjson",
    "csv": "text/csv",
    "proto": "application/x-protobuf-fixed",
}


def counted(n: int, thing: str, things: str | None = None) -> str:
    """``1 message``, ``2 messages``: a count in plain English."""
    return f"{n:,} {thing if n == 1 else (things or thing + 's')}"



def root_of(args: argparse.Namespace) -> Path:
    root = _given(args, "root") or os.environ.get("EXACTLY_ROOT") or "exactly-store"
    return Path(os.path.expanduser(root))  # (`--root=~/x`: no shell expands that ~)


def _given(args: argparse.Namespace, option: str) -> str | None:
    """The value of ``--option``, if given; an empty one is a mistake (it
    would else quietly mean the default)."""
    value: str | None = getattr(args, option, None)
    if value is not None and not value.strip():
        raise ArgumentsError(f"--{option} cannot be empty")
    return value


def broker_of(args: argparse.Namespace) -> str | None:
    """The broker URL to use, or None for a local store directory: ``--broker``,
    else ``BROKER_ADDRESS`` (as Gazette's tools) unless a store directory is
    named (``--root`` or ``EXACTLY_ROOT``)."""
    broker = _given(args, "broker")
    root = _given(args, "root")
    if broker and root:
        raise ArgumentsError(
            "give --root (a local store) or --broker (a Gazette cluster), not both")
    if broker or root:
        return broker or None
    if os.environ.get("EXACTLY_ROOT"):
        return None
    return os.environ.get("BROKER_ADDRESS") or None


#: Said under a lag report that has a read offset past its journal's write head.
PAST_HEAD_NOTE = (
    "past head: the read offset is past its journal's write head, so the journal no longer"
    " holds what was read there (open fragments lost in a cluster restart, or a broker not"
    " yet caught up after a failover). The consumer waits until the head passes its offset;"
    " messages appended before then are never read."
)


def behind_and_past(head: int | None, offset: int) -> tuple[int | None, int]:
    """A read offset against its journal's write head: the bytes it is
    behind (None where the head is unknown) and the bytes it is past the
    head (0 but where the journal lost what was read, see PAST_HEAD_NOTE)."""
    if head is None:
        return None, 0
    return max(0, head - offset), max(0, offset - head)


def every_journal(store: Any) -> list[str]:
    """Every journal's name; of a local store, those whose spec cannot be
    read included (which ``list()`` refuses): each command that goes over
    all journals reports on those rather than stopping at them."""
    from journal import LocalJournalStore

    if isinstance(store, LocalJournalStore):
        return store.names()
    return [spec.name for spec in store.list()]


def open_store(args: argparse.Namespace, *, must_exist: bool = True,
               service: bool = False) -> Any:
    """The journals the command works on. ``service``: a long-running
    command (``serve``), which rides out a broker's failover as long as
    the client does by default, rather than fail a waiting user in seconds."""
    broker = broker_of(args)
    if broker is not None:
        from journal import GazetteClient

        given = security_options(args)
        if getattr(args, "file_root", None):
            given["file_root"] = args.file_root
        try:
            # A user waits: a cluster that does not answer is an error within seconds.
            if service:
                return GazetteClient(broker, **given)
            return GazetteClient(broker, retry_timeout=10.0, **given)
        except ValueError as exc:
            raise UsageError(_in_flags(str(exc), given)) from None
    from journal import LocalJournalStore

    if getattr(args, "file_root", None):
        raise ArgumentsError("--file-root is for a Gazette cluster's fragment store (--broker)")
    root = root_of(args)
    if must_exist and not root.is_dir():
        raise UsageError(f"no journal store at {root} (create a journal first, or pass --root)")
    return LocalJournalStore(root)


#: The command line's options that reach a secured cluster, by the name of
#: GazetteClient's keyword argument (each else from its BROKER_* variable).
SECURITY_OPTIONS = ("trusted_ca_file", "cert_file", "cert_key_file", "auth_keys")


def _in_flags(text: str, given: dict[str, Any]) -> str:
    """A GazetteClient's complaint about its settings, in the command line's
    words: each keyword as the flag given, or as the variable it came from."""
    named = False
    for option in SECURITY_OPTIONS:
        if option in text:
            variable = f"BROKER_{option.upper()}"
            from_env = option not in given and os.environ.get(variable)
            text = text.replace(option, variable if from_env else "--" + option.replace("_", "-"))
            named = True
    return text if named else f"--broker: {text}"


def security_in_flags(text: str) -> str:
    """A refusal's advice (``give auth_keys (BROKER_AUTH_KEYS)``) in the
    command line's words: each GazetteClient keyword as its flag."""
    for option in SECURITY_OPTIONS:
        text = re.sub(rf"\b{option}\b", "--" + option.replace("_", "-"), text)
    return text


def security_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--trusted-ca-file`` ... ``--auth-keys`` given, as GazetteClient
    keyword arguments."""
    return {k: getattr(args, k) for k in SECURITY_OPTIONS if getattr(args, k, None) is not None}


@contextlib.contextmanager
def stop_requests(on_request: Callable[[signal.Signals], None] | None = None,
                  ) -> Iterator[list[signal.Signals]]:
    """Ctrl-C and SIGTERM while the block runs, for a command that stops at
    a point of its own choosing: each is recorded, in order, in the list
    yielded, and ``on_request(signal)`` is called; nothing is raised. The
    handlers are only that (they run between two bytecodes of the main
    thread, which may hold any lock then); the ones before are restored
    after the block."""
    asked: list[signal.Signals] = []

    def record(signum: int, _frame: object) -> None:
        asked.append(signal.Signals(signum))
        if on_request is not None:
            on_request(asked[-1])

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield asked
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def non_empty(text: str) -> str:
    """An argument that names something: not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("cannot be empty")
    return text


def positive_seconds(text: str) -> float:
    """A number of seconds above 0 (an interval to wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return value


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``15m``, ``2h``, ``7d`` (``journal.parse_duration``)."""
    from journal import parse_duration as seconds_of

    try:
        return seconds_of(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def parse_time(text: str) -> int:
    """Unix nanoseconds of an ISO-8601 time, or of a duration ago (``15m``)."""
    try:
        return time.time_ns() - int(parse_duration(text) * 1e9)
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


def new_message_func(spec: Any, proto: str | None) -> Callable[[Any], Any]:
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


def content_of(msg: Any) -> Any:
    if isinstance(msg, dict):
        return msg
    if isinstance(msg, list):
        return msg
    pb = getattr(msg, "pb", None)
    if pb is not None:
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(pb)
    return repr(msg)


def envelope_doc(env: Any) -> dict[str, Any]:
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
    if env.begin < 0:
        doc["transient"] = True  # emitted, never stored: no offsets
    if clock:
        ns = clock_to_unix_ns(clock)
        doc["time"] = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat()
    doc["message"] = content_of(env.message)
    return doc



#: Without a terminal, a line every this many seconds of a long piece of work
#: (``EXACTLY_PROGRESS_EVERY`` sets it).
LOG_EVERY = float(os.environ.get("EXACTLY_PROGRESS_EVERY") or 10.0)


class Progress:
    """Progress of a long piece of work, on stderr: on a terminal, a line
    redrawn a few times a second (after the first second); otherwise (a log,
    a pipe) a line every ``LOG_EVERY`` seconds, so that a long command is
    never silent for a minute, and a short one prints nothing."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.shown = False
        self.tty = sys.stderr.isatty()
        self.next = time.monotonic() + (1.0 if self.tty else LOG_EVERY)

    def update(self, count: int) -> None:
        if time.monotonic() < self.next:
            return
        if self.tty:
            self.next = time.monotonic() + 0.25
            print(f"\r{self.what}: {count:,}", end="", file=sys.stderr, flush=True)
            self.shown = True
            SHOWN.add(self)
        else:
            self.next = time.monotonic() + LOG_EVERY
            print(f"{self.what}: {count:,} so far", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self.shown = False
            SHOWN.discard(self)


# Progress lines on screen, cleared before an error is printed.
SHOWN: set[Progress] = set()
