"""The ``exactly`` command line: its parser, and how errors are reported.

Every subcommand works on a journal store directory: ``--root``, or the
``EXACTLY_ROOT`` environment variable, or ``./exactly-store``; or on the
journals of a Gazette cluster: ``--broker URL``, or ``BROKER_ADDRESS``. User
mistakes print one line, ``exactly: error: ...``, and exit with status 1
(status 2, still one line, for a malformed command line). Each command group
lives in a module of its own; what they share is in ``exactly._common``.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from exactly import _fsck
from exactly._append_cmd import cmd_append, cmd_emit
from exactly._common import (
    SHOWN,
    ArgumentsError,
    UsageError,
    non_negative,
    open_store,
    security_in_flags,
)
from exactly._demo_cmd import cmd_demo
from exactly._journals_cmd import cmd_journals_create, cmd_journals_list, cmd_journals_trim
from exactly._lag_cmd import add_lag_command
from exactly._read_cmd import cmd_abort, cmd_inspect, cmd_read


def cmd_fsck(args: argparse.Namespace) -> int:
    with open_store(args) as client:
        return _fsck.cmd_fsck(args, client)


def cmd_bench(args: argparse.Namespace) -> int:
    from exactly.benchmarks.run import main as bench_main

    argv = (["--quick"] if args.quick else []) + [f"--only={o}" for o in args.only or []]
    return bench_main(argv)


# -- parser -------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, like every other
    error (argparse alone prints the usage block first). Subcommand parsers
    inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, and ``command_parser`` is the innermost (sub)command's
        parser: the one to say what was not understood after it."""
        ns, extra = super().parse_known_args(args, namespace)
        if getattr(ns, "command_parser", None) is None:
            ns.command_parser = self  # (a subcommand's parser set it first)
        return ns, extra


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
    p.add_argument("--trusted-ca-file", default=argparse.SUPPRESS, metavar="FILE",
                   help="with --broker https://...: the CA the brokers' certificate is"
                        " checked against (default: $BROKER_TRUSTED_CA_FILE, else the system's)")
    p.add_argument("--cert-file", default=argparse.SUPPRESS, metavar="FILE",
                   help="a client certificate, for brokers that ask for one"
                        " (default: $BROKER_CERT_FILE)")
    p.add_argument("--cert-key-file", default=argparse.SUPPRESS, metavar="FILE",
                   help="the client certificate's key (default: $BROKER_CERT_KEY_FILE)")
    p.add_argument("--auth-keys", default=argparse.SUPPRESS, metavar="KEYS",
                   help="the brokers' --broker.auth-keys, base64 keys separated by commas or"
                        " spaces: requests are signed with the first (default: $BROKER_AUTH_KEYS)")
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("exactly")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    common = [_store_options()]
    p = _Parser(
        prog="exactly",
        description="Exactly-once messaging over append-only journals.",
        parents=common,
    )
    p.add_argument("--version", action="version", version=f"exactly {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    j = sub.add_parser("journals", help="create, list and trim journals", parents=common)
    jsub = j.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = jsub.add_parser("create", help="create journals", parents=common)
    c.add_argument("names", nargs="+", metavar="NAME")
    c.add_argument("--content-type", "-t", default="ndjson",
                   help="ndjson (default), csv, proto, or a full content type")
    c.add_argument("--label", "-l", action="append", metavar="NAME=VALUE")
    c.add_argument("--replication", type=int, metavar="N",
                   help="with --broker: brokers holding each journal (default 3; a cluster"
                        " needs at least that many)")
    c.set_defaults(func=cmd_journals_create)
    ls = jsub.add_parser("list", help="list journals", parents=common)
    ls.add_argument("--selector", "-s", help="label selector, e.g. 'topic=clicks'")
    ls.add_argument("--json", action="store_true", help="one JSON document per journal")
    ls.set_defaults(func=cmd_journals_list)
    t = jsub.add_parser("trim", help="remove old fragments (retention)", parents=common)
    t.add_argument("name")
    t.add_argument("--before", type=int, metavar="OFFSET")
    t.add_argument("--older-than", metavar="DURATION", help="e.g. 7d, 12h")
    t.add_argument("--file-root", metavar="DIR",
                   help="with --broker: where the cluster's file:// fragment store is mounted"
                        " on this machine (the brokers' --broker.file-root): its persisted"
                        " fragments are removed there")
    t.set_defaults(func=cmd_journals_trim)

    # What append and emit read: a journal's name, lines of input.
    lines = _Parser(add_help=False)
    lines.add_argument("name")
    lines.add_argument("--file", "-f", help="read from this file instead of stdin")
    lines.add_argument("--format", choices=("json", "lines"), default="json",
                       help="json: one JSON object per line, or CSV records in a CSV journal"
                            " (default); lines: each line as it is ({\"text\": line} in an"
                            " NDJSON journal, a record of one field in a CSV one)")

    a = sub.add_parser("append", help="publish stdin lines (JSON documents) to a journal",
                       parents=[*common, lines])
    a.add_argument("--transaction", action="store_true",
                   help="publish all lines as one transaction, committed at the end")
    a.set_defaults(func=cmd_append)

    e = sub.add_parser("emit", help="emit stdin lines to a journal's live followers, never "
                                    "stored (transient messages; the embedded store)",
                       parents=[*common, lines])
    e.set_defaults(func=cmd_emit)

    r = sub.add_parser("read", help="read messages as NDJSON with envelope metadata, or "
                                    "write them to an Arrow or Parquet file",
                       parents=common)
    r.add_argument("name", nargs="?")
    r.add_argument("--selector", help="with --format arrow|parquet: every journal matching "
                                      "this label selector (e.g. app=clicks)")
    r.add_argument("--format", choices=("json", "arrow", "parquet"), default="json",
                   help="json: NDJSON on stdout (default); arrow (an Arrow IPC file, as "
                        "Feather) or parquet: columns, written to --output")
    r.add_argument("--output", "-o", metavar="FILE", help="the file --format arrow|parquet "
                                                           "writes")
    r.add_argument("--schema", help="with --format arrow|parquet: content columns, e.g. "
                                    "'page string, n long' (default: inferred from NDJSON)")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--committed", action="store_true", help="committed only (default)")
    mode.add_argument("--uncommitted", action="store_true", help="every frame")
    r.add_argument("--offset", type=int, default=0,
                   help="journal offset to start at (-1: the write head)")
    r.add_argument("--since", help="only messages published since a time (ISO-8601, or 15m)")
    r.add_argument("--follow", "-F", action="store_true", help="wait for new messages")
    r.add_argument("--transient", action="store_true",
                   help="with --follow: also messages emitted while following (never stored;"
                        " shown with \"transient\": true)")
    r.add_argument("--limit", "-n", type=non_negative, metavar="N",
                   help="stop after N messages")
    r.add_argument("--skip-corrupt", action="store_true", help="skip undecodable frames")
    r.add_argument("--proto", help="protobuf message class (module.Class) of a proto journal")
    r.set_defaults(func=cmd_read)

    i = sub.add_parser("inspect", help="producers and open transactions of a journal, "
                                       "or what a checkpoint holds", parents=common)
    i.add_argument("name", nargs="?")
    i.add_argument("--checkpoint", metavar="FILE", help="a checkpoint (JSON or protobuf)")
    i.add_argument("--proto", help="protobuf message class (module.Class) of a proto journal")
    i.add_argument("--open", action="store_true",
                   help="the open transactions (producers with pending messages) of the journal,"
                        " or of every journal: first offset and age")
    i.add_argument("--older-than", metavar="DURATION",
                   help="with --open: only those opened longer ago than this (e.g. 10m)")
    i.set_defaults(func=cmd_inspect)

    ab = sub.add_parser("abort", help="roll back a producer's open transaction (one that died"
                                      " mid-transaction), as it would have", parents=common)
    ab.add_argument("name")
    ab.add_argument("--producer", required=True, metavar="ID",
                    help="the producer ID (12 hex digits, as inspect --open shows it)")
    ab.add_argument("--proto", help="protobuf message class (module.Class) of a proto journal")
    ab.set_defaults(func=cmd_abort)

    _fsck.add_parser(sub, common).set_defaults(func=cmd_fsck)
    add_lag_command(sub, common)

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
    d.add_argument("--secure", action="store_true",
                   help="with --cluster: the Gazette brokers serve TLS (a throwaway CA), ask"
                        " for client certificates and check authorizations")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="run the benchmarks and print a table")
    b.add_argument("--quick", action="store_true", help="small sizes: check they run")
    b.add_argument("--only", action="append", metavar="NAME", help="only this benchmark")
    b.set_defaults(func=cmd_bench)

    from exactly._cluster_cmd import add_cluster_command
    from exactly._shards_cmd import add_shards_command

    add_shards_command(sub, common)
    add_cluster_command(sub)
    return p


#: Commands that change things: when the reader of their output goes away
#: (`| head -1`), they finish their work and say nothing more.
_FINISH_WITHOUT_OUTPUT = frozenset({
    "cmd_journals_create", "cmd_journals_trim", "cmd_append", "cmd_emit", "cmd_abort",
    "cmd_fsck", "cmd_shards_apply", "cmd_shards_delete", "cmd_start", "cmd_stop",
})


def _quiet_stdout() -> None:
    """Standard output to /dev/null, its pipe's reader gone."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _OutputMayClose(io.TextIOBase):
    """Standard output that goes quiet, rather than raise, once its reader
    has gone away."""

    def __init__(self, out: Any) -> None:
        self._out = out

    def write(self, text: str) -> int:
        try:
            return int(self._out.write(text))
        except BrokenPipeError:
            _quiet_stdout()
            return len(text)

    def flush(self) -> None:
        try:
            self._out.flush()
        except BrokenPipeError:
            _quiet_stdout()

    def fileno(self) -> int:
        return int(self._out.fileno())

    @property
    def buffer(self) -> Any:
        return self._out.buffer


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core logs a TLS failure on stderr in lines of its own; the
    # error this command prints says it in one. (Before grpc is imported.)
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from consumer import ConsumerError
    from framing import FramingError
    from journal import BrokerAuthError, JournalError
    from message import MessageError

    # Started with standard input or output closed (`<&-`, `>&-`): as if
    # they were /dev/null (no input; output nobody reads).
    if sys.stdin is None:
        sys.stdin = open(os.devnull)  # noqa: SIM115 (for the life of the process)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the (sub)command they were given to, which points to its help
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.func.__name__ in _FINISH_WITHOUT_OUTPUT:
        sys.stdout = _OutputMayClose(sys.stdout)
    # SIGTERM and SIGHUP stop a command as Ctrl-C does: what it does on the
    # way out (roll back an open transaction, remove a half-written file)
    # is done, and the status says which signal it was (128 + its number).
    stopped_by: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopped_by.append(signum)
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:  # (not one nohup ignores)
            signal.signal(sig, stop)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        for progress in list(SHOWN):
            progress.done()
        return 128 + (stopped_by[0] if stopped_by else signal.SIGINT)
    except BrokenPipeError:
        # The reader of our output went away (`| head`): stop quietly, and keep
        # the interpreter from complaining when it flushes stdout at exit.
        _quiet_stdout()
        return 0
    except (UsageError, MessageError, FramingError, JournalError, ConsumerError, ValueError,
            OSError) as exc:
        where = ""
        journal, offset = getattr(exc, "journal", None), getattr(exc, "offset", None)
        if journal and offset is not None and str(offset) not in str(exc):
            where = f" (journal {journal}, offset {offset})"
        for progress in list(SHOWN):
            progress.done()
        # One line, whatever the error's text (a driver's or a parser's may span several).
        text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        if isinstance(exc, BrokerAuthError):
            text = security_in_flags(text)  # what to give, as this command takes it
        print(f"exactly: error: {text}{where}", file=sys.stderr)
        return 2 if isinstance(exc, ArgumentsError) else 1
