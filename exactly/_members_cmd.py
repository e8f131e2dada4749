"""``exactly shards apply|list|delete`` (a consumer group's shards, kept in
etcd) and ``exactly serve`` (a member process that serves them).

etcd is named by ``--etcd URL`` (default ``$ETCD_ADDRESS``), the group by
``--etcd-prefix`` (default ``$EXACTLY_ETCD_PREFIX``, else
``consumer.DEFAULT_ETCD_PREFIX``).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson

from exactly._common import (
    ArgumentsError,
    UsageError,
    counted,
    non_empty,
    open_store,
    stop_requests,
)


def _etcd_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--etcd", metavar="URL", default=os.environ.get("ETCD_ADDRESS"),
                   help="etcd, where the group's shards and claims are kept, e.g."
                        " http://127.0.0.1:2379 (default: $ETCD_ADDRESS)")
    p.add_argument("--etcd-prefix", metavar="PREFIX", default=None, type=non_empty,
                   help="the group's etcd prefix: one per application (default:"
                        " $EXACTLY_ETCD_PREFIX, else /exactly/consumer)")
    p.add_argument("--etcd-trusted-ca-file", metavar="FILE",
                   default=os.environ.get("ETCD_TRUSTED_CA_FILE"),
                   help="with --etcd https://...: the CA etcd's certificate is checked against"
                        " (default: $ETCD_TRUSTED_CA_FILE, else the system's)")
    p.add_argument("--etcd-cert-file", metavar="FILE", default=os.environ.get("ETCD_CERT_FILE"),
                   help="a client certificate, for an etcd that asks for one"
                        " (default: $ETCD_CERT_FILE)")
    p.add_argument("--etcd-cert-key-file", metavar="FILE",
                   default=os.environ.get("ETCD_CERT_KEY_FILE"),
                   help="the client certificate's key (default: $ETCD_CERT_KEY_FILE)")
    return p


def add_member_commands(shards_sub: Any, sub: Any,
                        common: Sequence[argparse.ArgumentParser]) -> None:
    """``apply``, ``list`` and ``delete`` under ``exactly shards``; ``exactly serve``."""
    etcd = _etcd_options()
    ap = shards_sub.add_parser("apply", help="create, update or delete shards in etcd from a"
                                             " YAML or JSON file", parents=[etcd])
    ap.add_argument("file", help="the shard specs ('-': standard input); see docs/consumer.md")
    ap.add_argument("--dry-run", action="store_true", help="check the file, change nothing")
    ap.set_defaults(func=cmd_shards_apply)
    ls = shards_sub.add_parser("list", help="the shards in etcd, who serves each, and the"
                                            " members", parents=[etcd])
    ls.add_argument("--json", action="store_true", help="one JSON document")
    ls.set_defaults(func=cmd_shards_list)
    rm = shards_sub.add_parser("delete", help="delete shards from etcd (their members stop"
                                              " serving them)", parents=[etcd])
    rm.add_argument("shard_ids", nargs="+", metavar="SHARD")
    rm.set_defaults(func=cmd_shards_delete)

    sv = sub.add_parser("serve", help="serve a consumer application's shards as a member of"
                                      " its group in etcd, until SIGTERM or Ctrl-C",
                        parents=[*common, etcd])
    sv.add_argument("app", metavar="MODULE:APP",
                    help="the Application: an instance, or a class or function that makes"
                         " one, named by its module and attribute (my.module:WordCount)")
    sv.add_argument("--lease-ttl", type=_lease_ttl, default=None, metavar="SECONDS",
                    help="a dead member's shards move elsewhere within this (default 10)")
    sv.add_argument("--member-id", default=None, type=non_empty,
                    help="this member's name in the group (default: host, PID, random)")
    sv.add_argument("--host", default=None, type=non_empty,
                    help="the machine local stores live on; members sharing a filesystem"
                         " may give one name (default: this host's name)")
    sv.add_argument("--metrics", type=_listen_address, default=None, metavar="[ADDR:]PORT",
                    help="serve Prometheus metrics at http://ADDR:PORT/metrics (ADDR default"
                         " 127.0.0.1; PORT 0: any free one, logged); needs the metrics extra")
    sv.add_argument("--log-level", default="info",
                    choices=["debug", "info", "warning", "error"])
    sv.set_defaults(func=cmd_serve)


#: How long ``exactly serve`` waits for its shards to stop before it says
#: which are still in their application, and how to stop at once.
STOP_NOTICE_S = 5.0


def _lease_ttl(text: str) -> int:
    """A lease's TTL: a whole number of seconds, at least consumer.MIN_LEASE_TTL."""
    from consumer import MIN_LEASE_TTL

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < MIN_LEASE_TTL:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_LEASE_TTL} s, not {text}")
    return value


def _listen_address(text: str) -> tuple[str, int]:
    """``[ADDR:]PORT`` to listen on: (address, port), 127.0.0.1 by default."""
    addr, _, port = text.rpartition(":")
    addr = addr.removeprefix("[").removesuffix("]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not [ADDR:]PORT: {text!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {port}")
    return addr, number


def _start_metrics(where: tuple[str, int]) -> None:
    """Serve this process's metrics over HTTP (``exactly serve --metrics``)."""
    from journal import metrics

    addr, port = where
    try:
        bound = metrics.start_http_server(port, addr)
    except ImportError as exc:  # prometheus-client missing: what to install
        raise UsageError(f"--metrics: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--metrics: cannot listen on {addr}:{port}: {exc.strerror or exc}"
                         ) from None
    host = f"[{addr}]" if ":" in addr else addr
    logging.getLogger("consumer.member").info("metrics at http://%s:%d/metrics", host, bound)


def _group(args: argparse.Namespace, timeout: float = 5.0) -> Any:
    from consumer import DEFAULT_ETCD_PREFIX, EtcdClient, ShardGroup

    if not args.etcd:
        raise ArgumentsError("name etcd: --etcd URL, or $ETCD_ADDRESS")
    prefix = args.etcd_prefix or os.environ.get("EXACTLY_ETCD_PREFIX") or DEFAULT_ETCD_PREFIX
    try:
        etcd = EtcdClient(args.etcd, timeout=timeout,
                          trusted_ca_file=args.etcd_trusted_ca_file or None,
                          cert_file=args.etcd_cert_file or None,
                          cert_key_file=args.etcd_cert_key_file or None)
    except ValueError as exc:  # a malformed address, or options that do not go with it
        raise ArgumentsError(f"--etcd: {exc}") from None
    try:
        return ShardGroup(etcd, prefix)
    except ValueError as exc:  # a prefix that is not a path
        etcd.close()
        raise ArgumentsError(f"--etcd-prefix: {exc}") from None


def cmd_shards_apply(args: argparse.Namespace) -> int:
    from consumer import read_spec_file

    if args.file == "-":
        specs, deletes = read_spec_file("<stdin>", sys.stdin.read())
    else:
        specs, deletes = read_spec_file(args.file)
    if args.dry_run:
        print(f"{args.file}: {counted(len(specs), 'shard')} to apply,"
              f" {counted(len(deletes), 'shard')} to delete")
        return 0
    group = _group(args)
    with group.etcd:
        result = group.apply(specs, deletes)
    for shard, what in result.items():
        print(f"{shard}: {what}")
    return 0


def cmd_shards_delete(args: argparse.Namespace) -> int:
    group = _group(args)
    with group.etcd:
        result = group.delete(args.shard_ids)
    missing = [s for s, what in result.items() if what == "absent"]
    for shard, what in result.items():
        print(f"{shard}: {'no such shard' if what == 'absent' else what}")
    return 1 if missing else 0


def cmd_shards_list(args: argparse.Namespace) -> int:
    group = _group(args)
    with group.etcd:
        view = group.view()

    shards = []
    for shard, spec in sorted(view.specs.items()):
        claim = view.claims.get(shard)
        home = view.homes.get(shard)
        shards.append({
            "id": shard, "sources": list(spec.sources),
            "max_txn_duration": spec.max_txn_duration,
            "min_txn_duration": spec.min_txn_duration,
            "member": claim.member if claim else None,
            "claimed_at_revision": claim.revision if claim else None,
            "store_home": home,
        })
    share = group.quotas(view.members, len(view.specs))
    served = view.held()
    members = [{"id": m.id, "host": m.host, "pid": m.pid, "lease": f"{m.lease:x}",
                "shards": served[m.id], "share": share[m.id]}
               for m in sorted(view.members.values(), key=lambda m: m.id)]
    if args.json:
        doc = {"prefix": group.prefix, "revision": view.revision, "shards": shards,
               "members": members, "unreadable": view.unreadable}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(f"{group.prefix} at revision {view.revision}: {counted(len(shards), 'shard')},"
          f" {counted(len(members), 'live member')}")
    if shards:
        width = max(len(s["id"]) for s in shards)
        hosts = {m["host"] for m in members}
        for s in shards:
            who = s["member"] or "-- not claimed --"
            home = ""
            host = (s["store_home"] or {}).get("host")
            if host is not None:
                # A store on local disk: only a member on its host serves it.
                home = f"  (store on host {host}"
                home += ")" if host in hosts else ": no live member there)"
            print(f"  {s['id']:<{width}}  {who:<28}  {', '.join(s['sources'])}{home}")
    for m in members:
        print(f"  member {m['id']} on {m['host']} (pid {m['pid']}):"
              f" {counted(m['shards'], 'shard')}, share {m['share']}")
    for line in view.unreadable:
        print(f"  unreadable: {line}")
    return 0


def load_app(name: str) -> Any:
    """The Application ``MODULE:ATTR`` names: an instance, or what makes one."""
    from consumer import Application

    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ArgumentsError(f"{name!r}: name the application as MODULE:APP")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would find the module
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{name}: cannot import {module_name}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{name}: {module_name} has no {attr}") from None
    if not isinstance(obj, Application):
        if not callable(obj):
            raise UsageError(f"{name} is not an Application, nor makes one")
        try:
            obj = obj()
        except Exception as exc:
            raise UsageError(f"{name}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Application):
        raise UsageError(f"{name} made a {type(obj).__name__}, not a consumer.Application")
    return obj


#: The collector's threshold for the youngest objects in ``exactly serve``
#: (Python's default is 700; see settle_collector).
YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Tell the cyclic garbage collector that start-up is over, as
    docs/consumer.md advises a service to (settings of the whole process,
    which ``exactly serve`` owns): what start-up made is frozen, never gone
    over again, and the youngest objects are collected less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def _stop(member: Any, asked: list[signal.Signals]) -> None:
    """Stop ``member``: its shards commit their open transactions. A shard
    stuck in its application holds that up; a signal asked again while it
    does ends the process at once, as a SIGKILL would (exactly-once holds:
    the open transactions are read again where the shards next start),
    having given the member's lease back first."""
    log = logging.getLogger("consumer.member")
    before, since, told = len(asked), time.monotonic(), False
    while True:
        try:
            member.stop(timeout=0.2)
            return
        except TimeoutError:
            pass
        if len(asked) > before:
            log.warning("stopping now (%s again): shards %s abandon their open transactions"
                        " (read again where they next start)", asked[-1].name, _names(member))
            member.abandon()
            logging.shutdown()
            sys.stderr.flush()
            os._exit(1)
        if not told and time.monotonic() - since >= STOP_NOTICE_S:
            told = True
            log.warning("still waiting for shards %s to stop (each commits its open"
                        " transaction once its application returns); Ctrl-C or SIGTERM again"
                        " stops at once, abandoning them", _names(member))


def _names(member: Any) -> str:
    """The shards ``member`` still serves or stops, for a log line."""
    return ", ".join(sorted({*member.serving, *member.stopping})) or "-"


def cmd_serve(args: argparse.Namespace) -> int:
    from consumer import DEFAULT_LEASE_TTL, Member

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = load_app(args.app)
    if args.metrics is not None:
        _start_metrics(args.metrics)
    ttl = DEFAULT_LEASE_TTL if args.lease_ttl is None else args.lease_ttl
    # A call to etcd fails well within a renewal period (a third of the TTL).
    group = _group(args, timeout=min(5.0, max(0.5, ttl / 3)))
    try:
        group.view()  # etcd answers, and the prefix reads: say so now if not
    except BaseException:
        group.etcd.close()
        raise
    try:
        with stop_requests() as asked, \
                open_store(args, must_exist=False, service=True) as client:
            member = Member(client, app, group.etcd, prefix=group.prefix,
                            lease_ttl=ttl,
                            member_id=args.member_id, host=args.host)
            logging.getLogger("consumer.member").info(
                "serving %s as member %s of %s at %s", args.app, member.id, group.prefix,
                args.etcd)
            settle_collector()
            member.start()
            try:
                while not asked:
                    time.sleep(0.2)
            finally:
                logging.getLogger("consumer.member").info(
                    "stopping (%s): each shard commits its open transaction",
                    asked[0].name if asked else "an error")
                _stop(member, asked)
    finally:
        group.etcd.close()
    return 0
