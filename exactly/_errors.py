"""Errors of the ``exactly`` package (the command line and its local
clusters)::

    ExactlyError
     ├── UsageError                 a mistake of the user's, reported as one line
     │    └── ArgumentsError        a malformed command line (exit status 2)
     ├── ClusterError               exactly.localcluster: building or running a cluster
     │    ├── BuildError            a binary could not be built
     │    │    └── GoNotFoundError  no Go toolchain on PATH
     │    ├── ClusterStartError     a cluster process exited or was not ready in time
     │    ├── ClusterNotFoundError  no cluster was started in the directory given
     │    └── GazctlError           a gazctl command failed (also a CalledProcessError)
     └── PostgresUnavailableError   no PostgreSQL server to find, install or start
                                    (also a RuntimeError)

Errors of the library packages (``JournalError``, ``MessageError``,
``ConsumerError``, ...) reach the command line unchanged, and it reports
them as one line too.
"""

from __future__ import annotations


class ExactlyError(Exception):
    """Base of every error the ``exactly`` package raises itself."""


class UsageError(ExactlyError):
    """A mistake of the user's, reported as one line."""


class ArgumentsError(UsageError):
    """A malformed command line that the parser alone cannot see: a missing
    argument, options that do not go together. Exit status 2, as for the
    parser's own (status 1 is for what the command could not do)."""
