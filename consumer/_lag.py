"""A shard's lag behind its sources, measured when metrics are scraped.

A running shard reports its lag to ``journal.metrics`` as a function the
scrape calls (``report_source_lag``), not as values it sets at its commits:
a shard stuck in ``consume_message`` commits nothing, and its lag must
still grow. At each commit the shard hands over what it committed (read
offsets, and the last message of each source); a scrape measures against
the write heads it asks for then. The series goes when the shard stops
serving here (``forget_source_lag``), so a member does not export the lag
of a shard another member took over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from message import Envelope, clock_to_unix_ns, get_clock

log = logging.getLogger("consumer")

#: Write heads are asked for at most this often (scrapes closer together
#: see the same heads).
HEAD_TTL: Final = 1.0


class SourceLag:
    """What a shard committed, and the write heads of its sources; ``measure``
    says how far behind it is.

    Write heads are asked for on a thread of their own, started by a scrape:
    a scrape waits for them until its deadline, then takes the heads known
    before (a cluster that does not answer makes a scrape late, not hang).
    """

    def __init__(self, shard: str, head: Callable[[str], int], journals: Sequence[str]) -> None:
        self._shard = shard
        self._head = head
        self._journals = tuple(journals)
        self._since = time.time_ns()  # when this start of the shard began serving
        # Replaced whole by the shard's thread, read by a scrape's.
        self._committed: Mapping[str, int] = {}
        self._last: Mapping[str, Envelope] = {}  # journal -> last message committed
        self._heads: dict[str, int] = {}
        self._lock = threading.Lock()
        self._asking: threading.Thread | None = None
        self._asked = float("-inf")

    def committed(self, offsets: Mapping[str, int], last: Mapping[str, Envelope]) -> None:
        """The shard committed read ``offsets``; ``last`` is the last message
        it consumed of each source so far (called at restore and at each
        commit; their times are read when scraped, not here)."""
        self._last = dict(last)
        self._committed = {j: offsets.get(j, 0) for j in self._journals}

    def measure(self, deadline: float) -> dict[str, tuple[int, float]]:
        """Source journal -> (bytes past the last commit, seconds): while
        behind, the age of the last message committed from it (before the
        first commit of this start, how long the shard has been serving);
        0 once caught up. A journal whose head was never learnt is left out."""
        heads = self._ask_heads(deadline)
        committed, last = self._committed, self._last
        now = time.time_ns()
        out = {}
        for journal in self._journals:
            head = heads.get(journal)
            if head is None:
                continue
            behind = max(0, head - committed.get(journal, 0))
            seconds = 0.0
            if behind:
                seconds = max(0, now - self._written(last.get(journal))) / 1e9
            out[journal] = (behind, seconds)
        return out

    def _written(self, env: Envelope | None) -> int:
        """When ``env`` was written (ns, from its UUID); with none or no
        clock, when this start of the shard began serving."""
        clock = 0 if env is None else get_clock(env.message.get_uuid())
        return clock_to_unix_ns(clock) if clock else self._since

    def _ask_heads(self, deadline: float) -> dict[str, int]:
        with self._lock:
            asking = self._asking
            now = time.monotonic()
            if asking is None and now - self._asked >= HEAD_TTL:
                self._asked = now
                asking = self._asking = threading.Thread(
                    target=self._ask, name=f"exactly lag of shard {self._shard}", daemon=True)
                asking.start()
        if asking is not None:
            asking.join(max(0.0, deadline - time.monotonic()))
        return dict(self._heads)

    def _ask(self) -> None:
        try:
            for journal in self._journals:
                try:
                    self._heads[journal] = self._head(journal)
                except Exception as exc:  # metrics never stop a shard
                    log.debug("shard %s: no write head of %s for metrics: %s",
                              self._shard, journal, exc)
        finally:
            with self._lock:
                self._asking = None
