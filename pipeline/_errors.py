"""Errors of the ``pipeline`` package::

    PipelineError
     └── JobEndedError   a write task ran after the driver ended its job
                         (also a RuntimeError)

Bad options of the ``journal`` data source raise ``ValueError`` naming the
option, as Spark's own sources do; errors of the packages below
(``JournalError``, ``MessageError``) reach Spark unchanged.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error the ``pipeline`` package raises itself."""


class JobEndedError(PipelineError, RuntimeError):
    """A write task ran after the driver ended its job."""
