"""``exactly read`` and ``exactly inspect``."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import orjson

from exactly._common import (
    CONTENT_TYPES,
    ArgumentsError,
    Progress,
    UsageError,
    counted,
    envelope_doc,
    every_journal,
    new_message_func,
    open_store,
    parse_duration,
    parse_time,
)


def cmd_read(args: argparse.Namespace) -> int:
    if args.format != "json":
        return _read_columns(args)
    if args.selector is not None or args.output is not None or args.schema is not None:
        raise ArgumentsError("--selector, --output and --schema go with --format arrow or parquet")
    if not args.name:
        raise ArgumentsError("name a journal to read")
    from framing import FramingError
    from message import ReadCommittedIter, ReadUncommittedIter, clock_to_unix_ns, get_clock

    since = parse_time(args.since) if args.since else None
    out = sys.stdout.buffer
    with open_store(args) as store:
        spec = store.get(args.name)
        if args.proto and spec.content_type != CONTENT_TYPES["proto"]:
            raise UsageError(f"--proto names the message class of a protobuf journal; {spec.name}"
                             f" is {spec.content_type}")
        new_message = new_message_func(spec, args.proto)
        offset = args.offset
        if since is not None and not offset:
            # Skip the fragments written before the time; messages are then
            # filtered by the time in their UUIDs.
            offset = store.offset_since(spec.name, since / 1e9)
        if args.transient and not args.follow:
            raise ArgumentsError(
                "--transient goes with --follow: emits reach following readers only")
        kwargs: dict[str, Any] = {"offset": offset, "block": args.follow,
                                  "skip_corrupt": args.skip_corrupt}
        if args.transient:
            kwargs["transient"] = True
        it: Any
        if args.uncommitted:
            it = ReadUncommittedIter(store, spec.name, new_message, **kwargs)
        else:
            it = ReadCommittedIter(store, spec.name, new_message, **kwargs)
        shown = 0
        try:
            for env in it if args.limit != 0 else ():
                if since is not None and not env.transient:
                    clock = get_clock(env.message.get_uuid())
                    if clock and clock_to_unix_ns(clock) < since:
                        continue
                out.write(orjson.dumps(envelope_doc(env), option=orjson.OPT_APPEND_NEWLINE))
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
        if args.transient and it.transient_lost:
            print(f"missed {counted(it.transient_lost, 'transient message')} (not keeping up)",
                  file=sys.stderr)
        if it.skipped:
            ranges = it.skipped_ranges
            frames = it.skipped - len(ranges)
            parts = [counted(frames, "corrupt frame")] if frames else []
            parts += [f"damaged offsets [{b}, {e})" for b, e in ranges]
            print(f"skipped {', '.join(parts)}", file=sys.stderr)
    return 0


# -- read as columns ---------------------------------------------------------------

_TYPES = {
    "string": "string", "str": "string", "long": "int64", "bigint": "int64",
    "int64": "int64", "int": "int32", "integer": "int32", "int32": "int32",
    "double": "float64", "float64": "float64", "float": "float32", "float32": "float32",
    "boolean": "bool_", "bool": "bool_", "timestamp": "timestamp",
}


def parse_schema(text: str) -> list[tuple[str, Any]]:
    """``"page string, n long"`` as ``(name, Arrow type)`` pairs."""
    import pyarrow as pa

    fields: list[tuple[str, Any]] = []
    for item in text.split(","):
        parts = item.replace(":", " ").split()
        if not parts:
            continue
        if len(parts) != 2 or parts[1].lower() not in _TYPES:
            raise UsageError(
                f"--schema: {item.strip()!r} is not 'name type' with a type among "
                f"{', '.join(sorted(set(_TYPES)))}"
            )
        typ = _TYPES[parts[1].lower()]
        fields.append((parts[0], pa.timestamp("us", tz="UTC") if typ == "timestamp"
                       else getattr(pa, typ)()))
    return fields


def _read_columns(args: argparse.Namespace) -> int:
    """``read --format arrow|parquet --output FILE``: the committed view of a
    journal (or of a selector's journals) as a columnar file."""
    try:
        from message.arrow import ReadCommittedArrow, ReadUncommittedArrow
    except ImportError as exc:
        raise UsageError(
            f"--format {args.format} needs pyarrow and numpy ({exc}): "
            "pip install 'exactly[arrow]'"
        ) from None
    import os
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from framing import FramingError
    from journal import CorruptJournalError

    if not args.output:
        raise ArgumentsError(f"--format {args.format} writes a file: name it with --output FILE")
    if bool(args.name) == bool(args.selector):
        raise ArgumentsError("name a journal, or give --selector, not both")
    for flag, given in (("--follow", args.follow), ("--since", args.since),
                        ("--limit", args.limit is not None)):
        if given:
            raise ArgumentsError(f"{flag} goes with --format json")
    if args.selector and args.offset:
        raise ArgumentsError("--offset goes with one journal, not --selector")
    schema = parse_schema(args.schema) if args.schema else None
    cls = ReadUncommittedArrow if args.uncommitted else ReadCommittedArrow
    # A regular file (or a new one) is written beside it under a name of its
    # own and renamed over it at the end, so that a failed read leaves it as
    # it was; through a symbolic link, the file it points to. Anything else
    # (a FIFO, /dev/stdout) is written to as it is.
    target = os.path.realpath(args.output)
    in_place = os.path.exists(target) and not os.path.isfile(target)
    tmp = target
    if not in_place:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target),
                                   prefix=f".{os.path.basename(target)}.", suffix=".part")
        os.close(fd)
    rows = 0
    with open_store(args) as store:
        try:
            reader = cls(
                store, args.name or None, selector=args.selector, schema=schema,
                proto_class=args.proto, offset=args.offset, skip_corrupt=args.skip_corrupt,
            )
            if not reader.specs:
                # A typo in a label would else make an empty file, silently.
                raise UsageError(f"no journal matches --selector {args.selector!r}")
            writer: Any = (
                pq.ParquetWriter(tmp, reader.schema) if args.format == "parquet"
                else pa.ipc.new_file(tmp, reader.schema)
            )
            try:
                progress = Progress(f"writing {args.output}")
                for batch in reader:
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    progress.update(rows)
                progress.done()
            finally:
                writer.close()
        except BaseException as exc:
            if not in_place and os.path.exists(tmp):
                os.unlink(tmp)  # no half-written file left behind
            if isinstance(exc, FramingError | CorruptJournalError):
                hint = "" if args.skip_corrupt else "; --skip-corrupt skips such frames"
                where = getattr(exc, "journal", None) or args.name or args.selector
                raise UsageError(f"journal {where}: {exc}{hint}") from None
            if isinstance(exc, ValueError):
                raise UsageError(str(exc)) from None
            raise
        if not in_place:
            # The mode of the file it replaces, or of a new file (mkstemp's is 0600).
            if os.path.isfile(target):
                mode = os.stat(target).st_mode & 0o7777
            else:
                mask = os.umask(0)
                os.umask(mask)
                mode = 0o666 & ~mask
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        what = "rows" if rows != 1 else "row"
        print(f"wrote {rows} {what} to {args.output}", file=sys.stderr)
        if reader.skipped:
            print(f"skipped {counted(reader.skipped, 'corrupt frame or damaged piece')}",
                  file=sys.stderr)
    return 0


# -- inspect ----------------------------------------------------------------------


def load_checkpoint(path: str) -> Any:
    from message import Checkpoint

    data = Path(path).read_bytes()
    if data.lstrip()[:1] in (b"{", b"[", b'"'):  # JSON (of the wrong shape, for the last two)
        return Checkpoint.from_json(data)
    return Checkpoint.from_bytes(data)


class _Scan:
    """A journal read once through a Sequencer: what ``inspect`` and
    ``abort`` report on."""

    def __init__(self, store: Any, spec: Any, new_message: Any) -> None:
        from message import (
            Flags,
            ReadUncommittedIter,
            Sequencer,
            get_flags,
            get_producer_id,
            sequence_committed,
        )

        seq = Sequencer()
        self.frames = self.committed = 0
        self.per_producer: dict[bytes, list[int]] = {}  # frames, acks, committed
        self.last_message: dict[bytes, Any] = {}  # each producer's last message read
        it = ReadUncommittedIter(store, spec.name, new_message, skip_corrupt=True)
        progress = Progress(f"reading {spec.name}")

        def counted(envelopes: Any) -> Any:
            for env in envelopes:
                self.frames += 1
                progress.update(self.frames)
                u = env.message.get_uuid()
                producer = get_producer_id(u)
                stats = self.per_producer.setdefault(producer, [0, 0, 0])
                stats[0] += 1
                self.last_message[producer] = env.message
                if get_flags(u) == Flags.ACK_TXN:
                    stats[1] += 1
                yield env

        def replay(begin: int, end: int) -> Any:
            return ReadUncommittedIter(store, spec.name, new_message, offset=begin,
                                       end_offset=end)

        try:
            for c in sequence_committed(seq, counted(it), replay):
                self.committed += 1
                self.per_producer[get_producer_id(c.message.get_uuid())][2] += 1
        finally:
            progress.done()
            it.close()
        self.skipped = it.skipped
        self.states = {st.producer: st for st in seq.producer_states()}

    def open_spans(self, store: Any, spec: Any, new_message: Any) -> list[tuple[Any, int | None]]:
        """``(state, opened)`` of each producer with an open transaction:
        ``opened`` is the time (ns since the epoch) in the UUID of its first
        message, None if that cannot be read."""
        from message import published_at

        return [(st, published_at(store, spec.name, new_message, st.begin))
                for st in sorted(self.states.values(), key=lambda st: st.begin)
                if st.begin >= 0]


def _age(ns: int | None) -> str:
    if ns is None:
        return "?"
    s = max(0, int(dt.datetime.now(dt.UTC).timestamp() - ns / 1e9))
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _inspect_open(args: argparse.Namespace) -> int:
    """``inspect --open``: the open transactions of a journal, or of all."""
    older = parse_duration(args.older_than) if args.older_than else None
    now_ns = dt.datetime.now(dt.UTC).timestamp() * 1e9
    from framing import FramingError
    from journal import JournalError

    with open_store(args) as store:
        # Over every journal, one that cannot be looked into (damaged, or of
        # protobuf frames without --proto) is said so, and the others are.
        names = [args.name] if args.name else every_journal(store)
        rows = []
        passed: list[str] = []
        for name in names:
            try:
                spec = store.get(name)
                new_message = new_message_func(spec, args.proto)
                scan = _Scan(store, spec, new_message)
                spans = scan.open_spans(store, spec, new_message)
            except (UsageError, JournalError, FramingError) as exc:
                if args.name:
                    raise
                passed.append(f"exactly: journal {name} not looked into: {exc}")
                continue
            for st, opened in spans:
                if older is not None and (opened is None or now_ns - opened < older * 1e9):
                    continue
                rows.append((spec.name, st, opened))
        for line in passed:
            print(line, file=sys.stderr)
        if not rows:
            what = f" older than {args.older_than}" if older is not None else ""
            print(f"no open transaction{what} in {counted(len(names) - len(passed), 'journal')}")
            return 1 if passed else 0
        print(f"{'journal':24s}  producer      first offset  opened at{'':24s}  age")
        for name, st, opened in rows:
            when = ("?" if opened is None else
                    dt.datetime.fromtimestamp(opened / 1e9, dt.UTC).isoformat())
            print(f"{name:24s}  {st.producer.hex()}  {st.begin:12d}  {when:33s}  {_age(opened)}")
    print(f"{counted(len(rows), 'open transaction')}; 'exactly abort JOURNAL --producer ID'"
          " rolls one back", file=sys.stderr)
    return 1 if passed else 0


def cmd_abort(args: argparse.Namespace) -> int:
    """``exactly abort``: the roll-back ACK of a producer's open transaction,
    as a dead producer would have written it (an ACK whose clock is its last
    commit's: readers drop the transaction's messages and stop waiting)."""
    from framing import framing_by_content_type
    from message import Flags, build_uuid

    try:
        producer = bytes.fromhex(args.producer)
    except ValueError:
        producer = b""
    if len(producer) != 6:
        raise UsageError(f"--producer takes a producer ID: 12 hex digits, not {args.producer!r}")
    with open_store(args) as store:
        spec = store.get(args.name)
        new_message = new_message_func(spec, args.proto)
        scan = _Scan(store, spec, new_message)
        st = scan.states.get(producer)
        if st is None or st.begin < 0:
            known = "has no open transaction" if st is not None else "never wrote"
            raise UsageError(f"producer {producer.hex()} {known} in {spec.name}"
                             " (exactly inspect --open lists the open ones)")
        # The acknowledgement of one of its messages (a CSV record's is as
        # wide as that record, as readers such as Go's require).
        ack = scan.last_message[producer].new_acknowledgement(spec.name)
        ack.set_uuid(build_uuid(producer, st.last_ack, Flags.ACK_TXN))
        frame = framing_by_content_type(spec.content_type or "").marshal(ack)
        result = store.append(spec.name, frame).result()
    print(f"rolled back the open transaction of producer {producer.hex()} in {spec.name}: its"
          f" messages from offset {st.begin} on are dropped (roll-back ACK at"
          f" [{result.begin}, {result.end}))", file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from message import clock_to_unix_ns

    if args.checkpoint:
        if args.open:
            raise ArgumentsError("--open lists a journal's open transactions, not a checkpoint's")
        if args.name:
            raise ArgumentsError("name a journal, or give --checkpoint FILE, not both")
        try:
            cp = load_checkpoint(args.checkpoint)
        except FileNotFoundError:
            raise UsageError(f"no checkpoint file {args.checkpoint}") from None
        print(orjson.dumps(cp.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return 0
    if args.open or args.older_than:
        return _inspect_open(args)
    if not args.name:
        raise ArgumentsError("name a journal to inspect, or pass --checkpoint FILE or --open")
    with open_store(args) as store:
        spec = store.get(args.name)
        new_message = new_message_func(spec, args.proto)
        scan = _Scan(store, spec, new_message)
        frames, committed, states = scan.frames, scan.committed, scan.states
        print(f"journal {spec.name}: {store.head(spec.name)} bytes, {frames} frames, "
              f"{committed} committed, {frames - committed} dropped or pending"
              + (f", {scan.skipped} corrupt skipped" if scan.skipped else ""))
        print("producer      frames  acks  committed  last_ack                          open txn")
        for pid, (n, acks, comm) in sorted(scan.per_producer.items()):
            s = states.get(pid)
            when = "-"  # (a producer with nothing committed has no last ACK to show)
            if s is not None and s.last_ack and comm:
                ns = clock_to_unix_ns(s.last_ack)
                when = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat()
            txn = f"since offset {s.begin}" if s is not None and s.begin >= 0 else "-"
            print(f"{pid.hex()}  {n:6d}  {acks:4d}  {comm:9d}  {when:32s}  {txn}")
    return 0
