"""Crash safety of LocalJournalStore, proven by SIGKILLing real processes.

Writer processes (tests/journal_child.py) append self-checking records with
many appends in flight and report each append as its future resolves. The
test kills them with SIGKILL at random moments, again and again on the same
journal, and after every kill checks, with a fresh store, that:

* the journal's content is exactly a sequence of whole, intact records (no
  partial frame is visible);
* every append reported as resolved is present, intact, at the offsets its
  future gave;
* each writer's records form a gap-free prefix of what it issued (appends
  apply in order, so none is lost in the middle);
* every fragment file matches its name (size and SHA-1).

The next child to append recovers the journal on its own. Following readers
are killed as well, and must disturb nothing.

``JOURNAL_CRASH_ITERATIONS`` (default 40) sets the number of kill rounds.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Final

import pytest

from journal import LocalJournalStore
from tests.journal_child import decode_records, encode_record

# A module run from the repository: as a script, its directory (tests/, whose
# package directories are named as the packages) would come first on sys.path.
CHILD: Final = "tests.journal_child"
REPO: Final = str(Path(__file__).resolve().parents[2])
ITERATIONS: Final = int(os.environ.get("JOURNAL_CRASH_ITERATIONS", "40"))
# Small fragments, so that kills also land in the middle of seals.
FRAGMENT_SIZE: Final = 2048
JOURNAL: Final = "crash/test"


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", CHILD, *args], cwd=REPO, stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_ready(report: Path, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if report.exists() and report.read_bytes().startswith(b"ready\n"):
            return
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"child exited early ({proc.returncode}): {err}")
        time.sleep(0.005)
    raise AssertionError("child not ready in time")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.stderr is not None:
        err = proc.stderr.read().decode()
        proc.stderr.close()
        # A writer killed by us has nothing to say; a traceback means it failed.
        assert "Traceback" not in err, err


def _resolved(report: Path) -> list[tuple[int, int, int, int]]:
    """(child, seq, begin, end) of each append the child saw resolve."""
    out = []
    for line in report.read_bytes().split(b"\n"):
        parts = line.split()
        if len(parts) == 4:
            c, s, b, e = (int(p) for p in parts)
            out.append((c, s, b, e))
    return out


def _verify(root: Path, acknowledged: list[tuple[int, int, int, int]]) -> dict[int, int]:
    """Check the invariants above; return the number of records per child."""
    with LocalJournalStore(root, fragment_size=FRAGMENT_SIZE) as store:
        store.verify(JOURNAL)
        head = store.head(JOURNAL)
        with store.read(JOURNAL) as r:
            data = r.read()
        assert len(data) == head
        frags = store.fragments(JOURNAL)
    # Fragments tile [0, head) and end on record boundaries.
    assert [f.begin for f in frags[1:]] == [f.end for f in frags[:-1]]
    assert (frags[0].begin, frags[-1].end) == (0, head) if frags else head == 0
    records = list(decode_records(data))  # Raises at any partial or corrupt frame.
    boundaries = {0} | {end for _, _, _, end in records}
    assert all(f.end in boundaries for f in frags)
    at = {begin: (child, seq, end) for child, seq, begin, end in records}
    for child, seq, begin, end in acknowledged:
        assert at.get(begin) == (child, seq, end), f"acknowledged append {child}/{seq} lost"
    per_child: dict[int, list[int]] = {}
    for child, seq, _, _ in records:
        per_child.setdefault(child, []).append(seq)
    for child, seqs in per_child.items():
        assert seqs == list(range(len(seqs))), f"child {child} has a gap or reordering"
    return {c: len(s) for c, s in per_child.items()}


def _setup(root: Path) -> None:
    with LocalJournalStore(root) as store:
        store.create(JOURNAL, {"kind": "bytes"})  # raw bytes: no content-type


@pytest.mark.slow
def test_sigkilled_writer_never_exposes_partial_appends_or_loses_acknowledged_ones(
    tmp_path: Path,
) -> None:
    """One writer SIGKILLed at random moments, round after round: the journal stays whole."""
    root = tmp_path / "root"
    _setup(root)
    rng = random.Random(1234)
    acknowledged: list[tuple[int, int, int, int]] = []
    for it in range(ITERATIONS):
        report = tmp_path / f"report-{it}"
        proc = _spawn("append", str(root), JOURNAL, str(it), str(FRAGMENT_SIZE), str(report))
        _wait_ready(report, proc)
        time.sleep(rng.uniform(0.0, 0.06))
        _kill(proc)
        got = _resolved(report)
        acknowledged += got
        counts = _verify(root, acknowledged)
        # Appends issued but never acknowledged may or may not have landed.
        assert counts.get(it, 0) >= len(got)
    assert acknowledged, "no append ever resolved"
    # A later writer recovers the journal and appends after everything else.
    with LocalJournalStore(root, fragment_size=FRAGMENT_SIZE) as store:
        head = store.head(JOURNAL)
        assert store.append(JOURNAL, b"").result().begin == head


class _Survivor:
    """A writer in this process that lives through every round, so that its
    store's writer thread keeps its view of the files while other writers
    die around it (and must still cut what they leave behind)."""

    CHILD: Final = 9999

    def __init__(self, root: Path) -> None:
        self.store = LocalJournalStore(root, fragment_size=FRAGMENT_SIZE)
        self.acknowledged: list[tuple[int, int, int, int]] = []
        self._seq = 0
        self._rng = random.Random(7)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def pause(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            burst = []
            for _ in range(self._rng.randrange(1, 20)):
                record = encode_record(self.CHILD, self._seq, self._rng.randrange(0, 300))
                burst.append((self._seq, self.store.append(JOURNAL, record)))
                self._seq += 1
            for seq, fut in burst:
                res = fut.result()
                self.acknowledged.append((self.CHILD, seq, res.begin, res.end))
            time.sleep(0.002)


@pytest.mark.slow
def test_sigkilled_concurrent_writers_and_readers(tmp_path: Path) -> None:
    """Writers and a follower killed at random beside a surviving writer: whole records only."""
    root = tmp_path / "root"
    _setup(root)
    rng = random.Random(99)
    acknowledged: list[tuple[int, int, int, int]] = []
    survivor = _Survivor(root)
    rounds = max(2, ITERATIONS // 2)
    try:
        for it in range(rounds):
            procs = []
            reports = []
            for k in range(2):
                child = 1000 + it * 2 + k
                report = tmp_path / f"w-{child}"
                procs.append(
                    _spawn(
                        "append", str(root), JOURNAL, str(child), str(FRAGMENT_SIZE), str(report)
                    )
                )
                reports.append(report)
            follow_report = tmp_path / f"r-{it}"
            follower = _spawn("follow", str(root), JOURNAL, str(follow_report))
            for p, rep in zip(procs, reports, strict=True):
                _wait_ready(rep, p)
            _wait_ready(follow_report, follower)
            survivor.start()
            # Kill in a random order at random moments.
            order = [*procs, follower]
            rng.shuffle(order)
            for p in order:
                time.sleep(rng.uniform(0.0, 0.04))
                _kill(p)
            survivor.pause()
            for rep in reports:
                acknowledged += _resolved(rep)
            _verify(root, acknowledged + survivor.acknowledged)
            # The follower checked every record it read; it only saw whole ones.
            offsets = [int(x) for x in follow_report.read_bytes().split()[1:]]
            assert offsets == sorted(offsets)
    finally:
        survivor.store.close()
    assert acknowledged and survivor.acknowledged, "no append ever resolved"


def test_writers_in_several_processes_append_whole_records(tmp_path: Path) -> None:
    """Three processes appending to one journal at once: records whole, each process in order."""
    root = tmp_path / "root"
    _setup(root)
    procs, reports = [], []
    for child in range(3):
        report = tmp_path / f"p-{child}"
        procs.append(
            _spawn("append", str(root), JOURNAL, str(child), str(FRAGMENT_SIZE), str(report), "400")
        )
        reports.append(report)
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode() if p.stderr else ""
        if p.stderr is not None:
            p.stderr.close()
    acknowledged = [r for rep in reports for r in _resolved(rep)]
    assert len(acknowledged) == 1200
    counts = _verify(root, acknowledged)
    assert counts == {0: 400, 1: 400, 2: 400}
