"""The commit rules of exactly-once reading, in one place.

Every Sequencer applies these rules: the Python one (``message/_sequencer.py``,
the readable definition, which decides with :func:`decide` and then applies
the outcome), the native one (``message/_native_src/sequencer.inc.c``) and the
column forms the Arrow and Spark readers use (``message/_columns_sequencer.py`` in
numpy, ``message/_native_src/columns_sequencer.inc.c``). The test suite holds each of
them to these rules.

Per (journal, producer), a reader keeps ``last_ack``, the clock of the
producer's last commit (a producer first seen with clock ``c`` starts at
``c - 1``), and ``max_clock``, the largest clock of its open transaction
(``last_ack`` when none is open). Each envelope read is then one
:class:`QueueOutcome`, as Gazette's ``Sequencer.QueueUncommitted`` names
them:

============================  ======================  ===================================
flags                         clock                   outcome
============================  ======================  ===================================
any, clock 0 (no clock)                               ``COMMIT_UNTRACKED``
OUTSIDE_TXN (or unknown)      <= last_ack             ``DUPLICATE``
OUTSIDE_TXN (or unknown)      > last_ack              ``COMMIT_OUTSIDE`` (an open
                                                      transaction is discarded)
CONTINUE_TXN                  <= max_clock            ``DUPLICATE``
CONTINUE_TXN                  > max_clock             ``EXTEND_SPAN`` (opens one if none)
ACK_TXN                       <= last_ack             ``ROLLBACK`` to this clock: any
                                                      open transaction is discarded (an
                                                      ACK read again changes nothing)
ACK_TXN                       > last_ack, span open   ``COMMIT_SPAN``
ACK_TXN                       > last_ack, no span     ``COMMIT_ACK`` (commits alone)
============================  ======================  ===================================

When a span commits, its messages are emitted in order by
:func:`span_emits`, then its ACK by :func:`ack_emits`: the same rule
whether they come from memory or are read again from the journal, so the
output does not depend on how much a reader holds in memory.
"""

from __future__ import annotations

import enum

from .layout import ACK_TXN, CONTINUE_TXN

__all__ = ["QueueOutcome", "decide", "outside_commits", "span_emits", "ack_emits"]


class QueueOutcome(enum.Enum):
    """What reading one envelope does (see the module docstring)."""

    #: No clock (clock 0): commits at once, and its producer is not tracked.
    COMMIT_UNTRACKED = "commit untracked"
    #: OUTSIDE_TXN (or unknown flags) past ``last_ack``: commits itself.
    COMMIT_OUTSIDE = "commit outside"
    #: Seen before: dropped.
    DUPLICATE = "duplicate"
    #: CONTINUE_TXN past ``max_clock``: opens or extends the open transaction.
    EXTEND_SPAN = "extend span"
    #: ACK_TXN past ``last_ack`` with a transaction open: commits it.
    COMMIT_SPAN = "commit span"
    #: ACK_TXN past ``last_ack`` with no transaction open: commits alone.
    COMMIT_ACK = "commit ack"
    #: ACK_TXN at or below ``last_ack``: ``last_ack`` becomes its clock and
    #: the open transaction, if any, is discarded; nothing commits.
    ROLLBACK = "rollback"


def decide(flags: int, clock: int, last_ack: int, max_clock: int, span_open: bool
           ) -> QueueOutcome:
    """The outcome of an envelope with ``flags`` and ``clock``, for a
    producer whose last commit is ``last_ack``, whose open transaction's
    largest clock is ``max_clock`` and which has one open (``span_open``)."""
    if not clock:
        return QueueOutcome.COMMIT_UNTRACKED
    if flags == CONTINUE_TXN:
        return QueueOutcome.EXTEND_SPAN if clock > max_clock else QueueOutcome.DUPLICATE
    if flags == ACK_TXN:
        if clock <= last_ack:
            return QueueOutcome.ROLLBACK
        return QueueOutcome.COMMIT_SPAN if span_open else QueueOutcome.COMMIT_ACK
    return QueueOutcome.COMMIT_OUTSIDE if outside_commits(clock, last_ack) else (
        QueueOutcome.DUPLICATE)


def outside_commits(clock: int, last_ack: int) -> bool:
    """An OUTSIDE_TXN message (or one of unknown flags) commits, else it is a duplicate."""
    return clock > last_ack


def span_emits(clock: int, running: int, ack: int) -> bool:
    """A span message is emitted at its ACK: its clock exceeds ``running``
    (every clock of the producer seen before it in the span, starting from
    ``last_ack``) and does not exceed the ACK's."""
    return running < clock <= ack


def ack_emits(ack: int, emitted: int) -> bool:
    """The ACK of a span is emitted after it, unless the largest clock
    ``emitted`` from the span (``last_ack`` if none) is the ACK's own."""
    return ack > emitted
