"""``recover``: finish the commits that a driver which died while
committing left behind, of batch writes (pipeline/_write.py) and of
streaming sinks (pipeline/_sink.py) alike."""

from __future__ import annotations

import logging

from journal import JournalStore
from message import JournalIntentLog

from ._sink import _SinkState
from ._state import INTENTS, SINKS
from ._stores import StoreOptions

log = logging.getLogger("pipeline")


def recover(store: JournalStore | str) -> int:
    """Write the ACK intents of commits that a driver which died while
    committing left in ``store`` (a client, or a store directory); returns
    how many intents were written."""
    if isinstance(store, str):
        with StoreOptions.of({"root": store}).open(create=True) as client:
            return recover(client)
    n = JournalIntentLog.recover_all(store, INTENTS)
    for spec in store.list(f"prefix={SINKS}"):
        n += _SinkState(store, spec.name[len(SINKS):]).recover()
    if n:
        log.warning("re-wrote %d ACK intents of an interrupted commit", n)
    return n
