"""Open transactions as ``journal.metrics`` shows them: how many a
Sequencer holds per journal, and since when the oldest is open.

A checkpoint's producer states say where each open transaction begins (its
first offset); when it began is the clock of the UUID of the message there,
read once per transaction and remembered while it stays open."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final

from journal import metrics

from ._envelope import ProducerState

# (journal, producer, first offset) of each open transaction reported ->
# when it began (ns since the epoch), None if its first message is unreadable.
_began: dict[tuple[str, bytes, int], int | None] = {}
_lock: Final = threading.Lock()


def report_open_spans(
    owner: object, states: Iterable[ProducerState],
    began_at: Callable[[str, int], int | None],
) -> None:
    """Report ``states`` (a Sequencer's, ``owner``) to journal.metrics;
    ``began_at(journal, offset)`` reads when the message there was
    published (ns since the epoch, None if unknown)."""
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
                began = began_at(st.journal, st.begin)
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

