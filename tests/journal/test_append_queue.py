"""``AppendQueue``'s accounting of failed appends for ``flush``: each failed
append is reported once, by the first flush that covers it; appends that
landed or were cancelled never are. Batches here land as a seeded script
says: all of them, or a random part and then an error."""

from __future__ import annotations

import random
import re
import threading
import time
from typing import Any

import pytest

from journal import JournalError
from journal._append_queue import AppendQueue, flush_queues


class _Flaky(AppendQueue):
    """A queue over bytes in memory whose batches fail part-way at random."""

    def __init__(self, seed: int) -> None:
        super().__init__("j", max_batch_bytes=300)  # (batches split often)
        self.rng = random.Random(seed)
        self.bytes = bytearray()

    def _write_batch(self, data: list[bytes]) -> Any:
        time.sleep(0.001)  # (appends pile up meanwhile: batches of many)
        landed, error = len(data), None
        if self.rng.random() < 0.3:
            landed = self.rng.randrange(len(data))
            error = JournalError(f"injected after {landed} of {len(data)}")
        begin = len(self.bytes)
        self.bytes += b"".join(data[:landed])
        return begin, landed, error


def _reported(q: AppendQueue) -> int:
    try:
        flush_queues([q], timeout=30)
    except JournalError as exc:
        m = re.match(r"(\d+) append\(s\) failed: injected after", str(exc))
        assert m is not None, exc
        assert isinstance(exc.__cause__, JournalError)
        return int(m.group(1))
    return 0


@pytest.mark.parametrize("seed", range(4))
def test_flush_reports_each_failed_append_once(seed: int) -> None:
    q = _Flaky(seed)
    rng = random.Random(seed + 100)
    futures: list[Any] = []
    done = threading.Event()

    def submit() -> None:
        # Appends keep coming while the main thread flushes: batches then
        # straddle what one flush covers and what the next does.
        for i in range(3000):
            if i % 10 == 0:
                time.sleep(0.0002)  # (so that many flushes come in between)
            f = q.submit(b"x" * rng.randrange(1, 60))
            if rng.random() < 0.05:
                f.cancel()  # (succeeds only if its batch has not started)
            futures.append(f)
        done.set()

    t = threading.Thread(target=submit)
    t.start()
    reported = 0
    while not done.is_set():
        reported += _reported(q)
    t.join()
    reported += _reported(q)
    reported += _reported(q)  # (nothing left: a failure is reported once)
    q.stop()
    failed = sum(1 for f in futures if not f.cancelled() and f.exception() is not None)
    landed = [f.result() for f in futures if not f.cancelled() and f.exception() is None]
    assert failed > 0 and reported == failed
    assert sum(r.end - r.begin for r in landed) == len(q.bytes)


class _Gated(AppendQueue):
    """A queue whose batches wait for ``gate`` and land as ``script`` says:
    how many of each batch land before an error."""

    def __init__(self, script: list[int]) -> None:
        super().__init__("j")
        self.gate = threading.Event()
        self.script = script
        self.batches: list[int] = []

    def _write_batch(self, data: list[bytes]) -> Any:
        assert self.gate.wait(30)
        self.batches.append(len(data))
        landed = self.script.pop(0) if self.script else len(data)
        error = JournalError(f"injected after {landed}") if landed < len(data) else None
        return 0, landed, error


def test_a_flush_reports_the_failures_of_a_batch_up_to_where_it_covers() -> None:
    """A batch that failed part-way holds appends issued before a flush and
    after it: the flush reports those before, the next flush the others."""
    q = _Gated([1, 2])
    first = q.submit(b"a")  # the writer takes it at once, and waits at the gate
    for _ in range(5):
        q.submit(b"b")  # seqs 2 to 6, queued
    out: list[tuple[int, BaseException | None]] = []
    waiter = threading.Thread(target=lambda: out.append(q.wait(6, None, time.monotonic)))
    waiter.start()
    later = [q.submit(b"c") for _ in range(4)]  # seqs 7 to 10: the same batch
    q.gate.set()
    waiter.join(30)
    assert q.batches == [1, 9]  # (seqs 1; 2 to 10, of which 2 and 3 land)
    count, error = out[0]
    assert count == 3 and isinstance(error, JournalError)  # seqs 4, 5 and 6
    with pytest.raises(JournalError, match=r"^4 append\(s\) failed: injected after 2"):
        flush_queues([q], timeout=30)  # seqs 7 to 10
    flush_queues([q], timeout=30)  # nothing left to report
    assert first.result() is not None and all(f.exception() for f in later)
    q.stop()
