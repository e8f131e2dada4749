"""Errors of the ``message`` package.

::

    MessageError
     ├── MustStartReplay          the Sequencer needs a replay before it can dequeue
     ├── ReplayError              a replay iterator gave the wrong envelopes, or failed
     ├── EmptyPartitionsError     a mapping found no journal to map to
     ├── CheckpointError          a checkpoint could not be decoded (also a ValueError)
     ├── IntentLogError           an intent log exists but cannot be read
     └── TransactionAbortedError  a pipelined transaction was rolled back

Misuse of an API (dequeuing state out of order, a bad UUID argument) raises
``RuntimeError`` or ``ValueError``; a user's ``validate()`` error propagates
unchanged.
"""

from __future__ import annotations


class MessageError(Exception):
    """Base of every error raised by the ``message`` package."""


class MustStartReplay(MessageError):  # noqa: N818 -- name fixed by the public contract
    """A committed sequence is no longer wholly in the Sequencer's ring.

    Call ``Sequencer.replay_range()`` and pass a read-uncommitted iterator over
    exactly that range of ``journal`` to ``Sequencer.start_replay()``.
    """

    def __init__(self, journal: str, begin: int, end: int) -> None:
        super().__init__(f"must start a replay of {journal} [{begin}, {end})")
        self.journal = journal
        self.begin = begin
        self.end = end


class ReplayError(MessageError):
    """A replay iterator yielded an envelope outside the requested range, or
    raised (the original exception is chained as ``__cause__``)."""

    def __init__(self, message: str, *, journal: str, begin: int, end: int) -> None:
        super().__init__(f"replay of {journal} [{begin}, {end}): {message}")
        self.journal = journal
        self.begin = begin
        self.end = end


class EmptyPartitionsError(MessageError):
    """A mapping function's partitions() returned no journal."""

    def __init__(self) -> None:
        super().__init__("no journal partitions to map the message to")


class CheckpointError(MessageError, ValueError):
    """Bytes or JSON that do not decode to a Checkpoint."""


class IntentLogError(MessageError):
    """An intent log (``IntentLog``, ``JournalIntentLog``) exists but cannot be read."""


class TransactionAbortedError(MessageError):
    """A ``PipelinedTransaction`` was rolled back: aborted by its user, or
    ended after a transaction that could not commit (the error that stopped
    the pipeline is the ``__cause__``)."""
