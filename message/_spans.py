"""Open transactions as ``journal.metrics`` shows them: how many a
Sequencer holds per journal, and since when the oldest is open.

A checkpoint's producer states say where each open transaction begins (its
first offset); when it began is the clock of the UUID of the message there,
read once per transaction and remembered while it stays open."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from journal import JournalError, metrics

from ._envelope import ProducerState
from ._interfaces import NewMessageFunc
from ._uuid import clock_to_unix_ns, get_clock

if TYPE_CHECKING:
    from journal import JournalClient

# (journal, producer, first offset) of each open transaction reported ->
# when it began (ns since the epoch), None if its first message is unreadable.
_began: dict[tuple[str, bytes, int], int | None] = {}
_lock: Final = threading.Lock()


def report_open_spans(
    owner: object, client: JournalClient, new_message: NewMessageFunc,
    states: Iterable[ProducerState],
) -> None:
    """Report ``states`` (a Sequencer's, ``owner``) to journal.metrics."""
    per: dict[str, tuple[int, int | None, int]] = {}
    keys = []
    for st in states:
        n, oldest, producers = per.get(st.journal, (0, None, 0))
        if st.begin >= 0:
            key = (st.journal, st.producer, st.begin)
            keys.append(key)
            with _lock:
                known = key in _began
                began = _began.get(key)
            if not known:
                began = _began_at(client, new_message, st.journal, st.begin)
                with _lock:
                    _began[key] = began
            n += 1
            if began is not None and (oldest is None or began < oldest):
                oldest = began
        per[st.journal] = (n, oldest, producers + 1)
    with _lock:
        # Forget the transactions of these journals that are open no more.
        live = set(keys)
        for key in [k for k in _began if k[0] in per and k not in live]:
            del _began[key]
    metrics.record_open_spans(owner, per)


def _began_at(client: JournalClient, new_message: NewMessageFunc, journal: str,
              begin: int) -> int | None:
    """When the message at ``begin`` of ``journal`` was published."""
    from ._reader import ReadUncommittedIter

    try:
        with ReadUncommittedIter(client, journal, new_message, offset=begin,
                                 skip_corrupt=True) as it:
            for env in it:
                clock = get_clock(env.message.get_uuid())
                return clock_to_unix_ns(clock) if clock else None
    except JournalError:
        return None
    return None
