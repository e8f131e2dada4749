"""Local clusters on 127.0.0.1: Gazette (pinned binaries, etcd plus brokers)
and Spark standalone (``SparkCluster``: a master and workers from the
installed ``pyspark``), for the tests, the cluster demo and the benchmarks.

A Gazette cluster is one etcd server and N ``gazette`` brokers. This module
builds pinned versions of both (and of ``gazctl``) with the Go toolchain,
caches them outside any work tree, and starts, inspects and stops clusters
whose every process listens on 127.0.0.1 only::

    from exactly.localcluster import GazetteCluster

    with GazetteCluster("my-cluster", brokers=3) as cluster:  # builds on first use
        cluster.create_journal("demo/events", replication=2)
        cluster.gazctl("journals", "append", "-l", "name=demo/events", input=b"hi\\n")
        print(cluster.gazctl("journals", "read", "-l", "name=demo/events").stdout)

Binaries are cached under ``$EXACTLY_CACHE``, else ``$XDG_CACHE_HOME/exactly``,
else ``~/.cache/exactly``: ``gazette-v0.103.0/bin/{gazette,gazctl}`` and
``etcd-v3.6.5/bin/etcd``. A cold build takes minutes (Gazette has many
dependencies, and one of them needs cgo); later calls return at once.

A cluster lives in a work directory::

    <workdir>/cluster.json     PIDs and addresses (read by GazetteCluster.attach)
    <workdir>/etcd/            etcd's data
    <workdir>/fragments/       the brokers' file:// fragment store root
    <workdir>/logs/*.log       one log per process (etcd.log, broker-0.log, ...)

Errors::

    ClusterError                 anything this module raises
     ├── BuildError              a binary could not be built (.log_path, .log_tail)
     │    └── GoNotFoundError    no Go toolchain on PATH
     ├── ClusterStartError       a process exited, or did not become ready in
     │                           time (.process, .log_path, .log_tail)
     ├── ClusterNotFoundError    attach: no cluster.json in the directory
     └── GazctlError             a gazctl command failed (also a
                                 subprocess.CalledProcessError)

The first line of every error's message stands alone (the command line
prints only it); the lines after it, if any, are the tail of a log.
"""

from __future__ import annotations

from exactly._clusterbuild import (
    ETCD_VERSION,
    GAZETTE_VERSION,
    Binaries,
    BuildError,
    ClusterError,
    GoNotFoundError,
    Progress,
    build_go_program,
    default_cache_dir,
    ensure_binaries,
)
from exactly._clustertls import ClusterSecurity
from exactly._clustertypes import (
    ClusterNotFoundError,
    ClusterStartError,
    JournalBrokers,
    ProcessInfo,
)
from exactly._gazctl import GazctlError, journal_spec_yaml
from exactly._gazettecluster import DEFAULT_ETCD_LEASE, GazetteCluster
from exactly._sparkcluster import SparkCluster

__all__ = [
    "SparkCluster",
    "ClusterSecurity",
    "GAZETTE_VERSION",
    "ETCD_VERSION",
    "DEFAULT_ETCD_LEASE",
    "Binaries",
    "ProcessInfo",
    "JournalBrokers",
    "GazetteCluster",
    "ensure_binaries",
    "build_go_program",
    "default_cache_dir",
    "journal_spec_yaml",
    "Progress",
    "ClusterError",
    "BuildError",
    "GoNotFoundError",
    "ClusterStartError",
    "ClusterNotFoundError",
    "GazctlError",
]
