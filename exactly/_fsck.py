"""``exactly fsck [--repair] [journal...]``: check journals, and repair a local store.

Two kinds of checks, each problem one line (journal, file, offsets, reason):

* **what the client can see**, for any ``JournalClient``: every journal
  readable from its first offset to its end, and every frame decodable by the
  journal's framing (``check_readable``);
* **the files**, for a ``LocalJournalStore``: every fragment and commit
  record (``LocalJournalStore.check``), which ``--repair`` makes readable and
  writable again, moving damaged pieces to quarantine files.

The exit status says whether anything is wrong: 0 nothing, 1 problems; with
``--repair``, 0 once everything found was repaired, 1 if anything is left
(the last line says which).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from exactly._common import Progress, every_journal
from journal import (
    CorruptJournalError,
    JournalClient,
    JournalNotFoundError,
    JournalProblem,
    LocalJournalStore,
)

# The read check is told of damage and jumps: the reader's own warnings would
# say it again.
_QUIET_LOGGERS = ("journal", "message")


def add_parser(sub: Any, common: Sequence[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``fsck`` on the subcommands of the ``exactly`` parser; return its parser."""
    p = sub.add_parser(
        "fsck",
        parents=common,
        help="check journals (every fragment, commit record and frame); --repair a local store",
        description="Check every fragment and commit record of the store's journals, and"
        " that each journal reads end to end with decodable frames. One line per"
        " problem; exit status 1 if any was found (with --repair: if any is left"
        " unrepaired).",
    )
    p.add_argument("journals", nargs="*", metavar="JOURNAL", help="only these (default: all)")
    p.add_argument(
        "--repair",
        action="store_true",
        help="make damaged journals readable and writable again, keeping every intact byte"
        " (damaged pieces are moved to quarantine files, never deleted)",
    )
    return p  # type: ignore[no-any-return]


def cmd_fsck(args: argparse.Namespace, client: JournalClient, out: Any = None) -> int:
    out = out or sys.stdout
    local = isinstance(client, LocalJournalStore)
    if args.repair and not local:
        print("exactly fsck: --repair works on a local store only; checking", file=sys.stderr)
    names = list(args.journals) or every_journal(client)
    found = repaired = 0
    journals = Progress(f"checking {len(names)} journals, done")
    for done, name in enumerate(names):
        journals.update(done)
        problems: list[JournalProblem] = []
        if isinstance(client, LocalJournalStore):
            try:
                problems += client.check(name, repair=args.repair)
            except JournalNotFoundError:
                problems.append(JournalProblem(name, None, None, None, "no such journal"))
                found += 1
                print(problems[-1], file=out)
                continue
        if not problems or args.repair:
            # Damaged files make reads fail too: say so once, by the files.
            readable = check_readable(client, name)
            if isinstance(client, LocalJournalStore) and readable:
                readable = _with_files(client, name, readable)
            problems += readable
        for problem in problems:
            print(problem, file=out)
        found += len(problems)
        repaired += sum(p.repair is not None for p in problems)
        if isinstance(client, LocalJournalStore):
            pieces = client.quarantined(name)
            if pieces:
                shown = ", ".join(os.path.basename(p) for p in pieces)
                print(f"journal {name}: in quarantine (kept, not readable): {shown}", file=out)
    journals.done()
    if local and not args.journals:
        assert isinstance(client, LocalJournalStore)
        for name in client.orphaned():
            # Not repaired: only its labels (content type) make it a journal again.
            found += 1
            print(JournalProblem(
                name, None, None, None,
                "its files are here but not its spec (@spec.json): `exactly journals create"
                f" {name}` with its content type and labels makes it a journal again, over"
                " them"), file=out)
    what = f"{found} problem{'s' if found != 1 else ''} found"
    left = found
    if found and args.repair and local:
        left = found - repaired
        what += f", {repaired} repaired, " + (
            f"{left} left unrepaired" if left else "nothing left to repair")
    checked = f"{len(names)} journal{'s' if len(names) != 1 else ''}"
    print(f"checked {checked}: {what if found else 'no problem found'}", file=out)
    return 1 if left else 0


def _with_files(
    store: LocalJournalStore, name: str, problems: list[JournalProblem]
) -> list[JournalProblem]:
    """Problems of frames, each with the fragment file that holds its offset."""
    try:
        frags = store.fragments(name)
    except (CorruptJournalError, JournalNotFoundError):
        return problems
    out = []
    for p in problems:
        if p.path is None and p.offset is not None:
            holder = next((f for f in frags if f.begin <= p.offset < f.end), None)
            if holder is not None:
                p = dataclasses.replace(p, path=holder.path)
        out.append(p)
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in _QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def check_readable(client: JournalClient, name: str) -> list[JournalProblem]:
    """What the client can see of journal ``name``: each damaged piece that
    stops reading, and each frame that does not decode. Works on any
    ``JournalClient``."""
    from framing import UnknownContentTypeError
    from message import ReadUncommittedIter

    problems: list[JournalProblem] = []

    def skipped(exc: Exception) -> None:
        offset = getattr(exc, "offset", None)
        end = getattr(exc, "end_offset", None)
        data = getattr(exc, "data", None)
        if end is None and isinstance(data, bytes) and offset is not None:
            end = offset + len(data)
        reason = getattr(exc, "reason", None) or str(exc)
        path = getattr(exc, "path", None)
        if isinstance(exc, CorruptJournalError):
            reason = f"not readable: {reason}"
        else:
            reason = f"a frame that does not decode ({type(exc).__name__}: {reason})"
        problems.append(JournalProblem(name, path, offset, end, reason))

    try:
        spec = client.get(name)
        with _quiet():
            try:
                it = ReadUncommittedIter(
                    client, name, _message_factory(spec.content_type),
                    skip_corrupt=True, on_skip=skipped,
                )
            except UnknownContentTypeError:
                _read_bytes(client, name, skipped)  # no framing: bytes only
                return problems
            progress = Progress(f"reading {name}, frames")
            with it:
                for n, _ in enumerate(it, 1):
                    if not n & 1023:
                        progress.update(n)
            progress.done()
    except (CorruptJournalError, OSError) as exc:
        problems.append(JournalProblem(name, getattr(exc, "path", None),
                                       getattr(exc, "offset", None),
                                       getattr(exc, "end_offset", None),
                                       f"not readable: {exc}"))
    return problems


def _read_bytes(client: JournalClient, name: str, skipped: Any) -> None:
    """Read every byte of a journal with no known framing, past damaged pieces."""
    offset = 0
    while True:
        reader = client.read(name, offset)
        try:
            while reader.read(1 << 20):
                pass
            return
        except CorruptJournalError as exc:
            if exc.end_offset is None or exc.end_offset <= reader.offset:
                raise
            skipped(exc)
            offset = exc.end_offset
        finally:
            reader.close()


def _message_factory(content_type: str | None) -> Any:
    """Empty messages to decode frames into: the types the command line reads
    with (a protobuf frame is checked as protobuf wire format)."""
    from framing import CONTENT_TYPE_CSV, CONTENT_TYPE_PROTO_FIXED
    from message import CSVRecord, JsonDocument

    if content_type == CONTENT_TYPE_CSV:
        return lambda _spec: CSVRecord()
    if content_type == CONTENT_TYPE_PROTO_FIXED:
        from google.protobuf import empty_pb2

        # Empty keeps every field it does not know: any valid payload parses.
        return lambda _spec: empty_pb2.Empty()
    return lambda _spec: JsonDocument()
