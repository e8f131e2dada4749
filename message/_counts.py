"""What the Python Publisher and Sequencer count, per message: the same
fields as the native core's ``COUNTS`` (message/_native_src/common.inc.c), read
by ``journal.metrics`` when scraped (see ``counts``)."""

from __future__ import annotations

from typing import Final


class Counts:
    """Totals since the process started, in ``FIELDS`` order."""

    __slots__ = ("begun", "committed", "duplicates", "published", "rollbacks", "rolled_back")

    def __init__(self) -> None:
        self.published = 0  # messages published
        self.begun = 0  # transactions begun (a first uncommitted message)
        self.committed = 0  # transactions committed (ACK intents built)
        self.rolled_back = 0  # transactions rolled back (roll-back intents built)
        self.duplicates = 0  # envelopes a Sequencer dropped as duplicates
        self.rollbacks = 0  # open spans a Sequencer discarded on a roll-back ACK


#: The Python implementation's counts (the native core keeps its own).
COUNTS: Final = Counts()

#: Each field's metric in journal.metrics.COUNTED, in the native counts() order.
FIELDS: Final = (
    ("published", "exactly_messages_published_total"),
    ("begun", "exactly_transactions_begun_total"),
    ("committed", "exactly_transactions_committed_total"),
    ("rolled_back", "exactly_transactions_rolled_back_total"),
    ("duplicates", "exactly_sequencer_duplicates_total"),
    ("rollbacks", "exactly_sequencer_rollbacks_total"),
)


def totals(native_counts: tuple[int, ...] | None) -> dict[str, int]:
    """Metric name -> total of both implementations (``native_counts`` is
    the native ``counts()``, None where it is not built)."""
    out = {metric: getattr(COUNTS, field) for field, metric in FIELDS}
    if native_counts is not None:
        for (_, metric), n in zip(FIELDS, native_counts, strict=True):
            out[metric] += n
    return out
