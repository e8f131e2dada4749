"""``exactly cluster``: build, start, inspect and stop a local Gazette cluster.

The work is ``exactly.localcluster``'s; this module is its command line.
Errors print one line, ``exactly: error: ...``, and exit with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from exactly.localcluster import ClusterSecurity

DEFAULT_DIR = "exactly-cluster"


class _SubParsers(Protocol):
    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_cluster_command(sub: _SubParsers) -> None:
    """Add ``cluster build|start|status|stop`` to the subcommands ``sub``."""
    c = sub.add_parser("cluster", help="build, start, inspect and stop a local Gazette cluster")
    csub = c.add_subparsers(dest="action", metavar="ACTION", required=True)

    b = csub.add_parser("build", help="build (or find cached) gazette, gazctl and etcd")
    b.set_defaults(func=cmd_build)

    s = csub.add_parser("start", help="start etcd and brokers on 127.0.0.1, in the background")
    _dir_option(s)
    s.add_argument("--brokers", type=_positive, default=3, metavar="N",
                   help="number of brokers (default 3)")
    s.add_argument("--secure", action="store_true",
                   help="brokers serve TLS (a throwaway CA in DIR/tls) and check authorizations"
                        " (--broker.auth-keys); prints the BROKER_* settings that reach them")
    s.add_argument("--mutual-tls", action="store_true",
                   help="with --secure: brokers also ask clients for a certificate")
    s.set_defaults(func=cmd_start)

    st = csub.add_parser("status", help="the cluster's processes and addresses")
    _dir_option(st)
    st.set_defaults(func=cmd_status)

    sp = csub.add_parser("stop", help="stop the cluster's processes")
    _dir_option(sp)
    sp.set_defaults(func=cmd_stop)


def _dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=DEFAULT_DIR, type=Path,
                   help=f"the cluster's directory (default ./{DEFAULT_DIR})")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _fail(exc: Exception) -> int:
    # The first line of a ClusterError stands alone; the rest is a log's tail,
    # which the message names.
    print(f"exactly: error: {str(exc).splitlines()[0]}", file=sys.stderr)
    return 1


def cmd_build(args: argparse.Namespace) -> int:
    from exactly.localcluster import ClusterError, ensure_binaries

    try:
        bins = ensure_binaries(progress=_progress)
    except ClusterError as exc:
        return _fail(exc)
    print(f"gazette\t{bins.gazette}\ngazctl\t{bins.gazctl}\netcd\t{bins.etcd}")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from exactly.localcluster import ClusterError, ClusterSecurity, GazetteCluster

    if args.mutual_tls and not args.secure:
        return _fail(ValueError("--mutual-tls goes with --secure"))
    kept = _kept_security(args.dir)
    if kept is not None and not args.secure:
        return _fail(ClusterError(
            f"the cluster in {args.dir} was started with --secure: start it with --secure again"
            f" (its CA, certificates and keys in {args.dir / 'tls'} are kept), or remove"
            f" {args.dir / 'tls'} to start it without TLS"))
    security = None
    if kept is not None:
        # A restart: the same CA, certificates and keys, so that the
        # settings clients already have keep working.
        security = dataclasses.replace(kept, mutual=args.mutual_tls)
        print(f"reusing the CA, certificates and keys in {args.dir / 'tls'}", file=sys.stderr)
    elif args.secure:
        try:
            security = ClusterSecurity.generate(args.dir / "tls", mutual=args.mutual_tls)
        except RuntimeError as exc:
            return _fail(exc)
    cluster = GazetteCluster(args.dir, brokers=args.brokers, stop_at_exit=False,
                             security=security)
    try:
        cluster.start(progress=_progress)
    except ClusterError as exc:
        return _fail(exc)
    print(f"BROKER_ADDRESS={cluster.address}", flush=True)
    if security is not None:
        env = security.client_env()
        if not security.mutual:
            env.pop("BROKER_CERT_FILE")
            env.pop("BROKER_CERT_KEY_FILE")
        for name, value in env.items():
            print(f"{name}={shlex.quote(value)}", flush=True)
    where = shlex.quote(str(args.dir))
    print(f"started etcd and {args.brokers} broker(s) in {cluster.workdir} "
          f"(logs in {cluster.log_dir}); stop them with: exactly cluster stop --dir {where}",
          file=sys.stderr)
    return 0


def _kept_security(workdir: Path) -> ClusterSecurity | None:
    """The security of the cluster last started in ``workdir``, if it was
    secured and its files are all still there; else None."""
    from exactly.localcluster import ClusterError, GazetteCluster

    try:
        security = GazetteCluster.attach(workdir).security
    except ClusterError:
        return None  # never started there (or its state is unreadable: start afresh)
    if security is None:
        return None
    files = (security.ca_file, security.server_cert_file, security.server_key_file,
             security.client_cert_file, security.client_key_file)
    return security if all(f.is_file() for f in files) else None


def cmd_status(args: argparse.Namespace) -> int:
    from exactly.localcluster import ClusterError, GazetteCluster

    try:
        cluster = GazetteCluster.attach(args.dir)
        procs = cluster.processes()
    except ClusterError as exc:
        return _fail(exc)
    for p in procs:
        state = "running" if p.running else "stopped"
        print(f"{p.name:<10} {state:<8} pid {p.pid or '-':<8} {p.address}  log {p.log}")
    running = sum(p.running for p in procs)
    if running == len(procs):
        print(f"BROKER_ADDRESS={cluster.address}")
        if cluster.security is not None:
            for name, value in cluster.security.client_env().items():
                print(f"{name}={shlex.quote(value)}")
        return 0
    if running == 0:
        return _fail(ClusterError(f"the cluster in {cluster.workdir} is stopped"))
    return _fail(ClusterError(f"{len(procs) - running} of the {len(procs)} processes of "
                              f"the cluster in {cluster.workdir} are not running"))


def cmd_stop(args: argparse.Namespace) -> int:
    from exactly.localcluster import ClusterError, GazetteCluster

    try:
        cluster = GazetteCluster.attach(args.dir)
        running = [p for p in cluster.processes() if p.running]
        cluster.stop()
    except ClusterError as exc:
        return _fail(exc)
    if running:
        print(f"stopped {', '.join(p.name for p in running)} in {cluster.workdir}",
              file=sys.stderr)
    else:
        print(f"nothing was running in {cluster.workdir}", file=sys.stderr)
    return 0
