"""The soak: crash and checkpoint fault loops, run for minutes (``make soak``).

Kept out of CI (pytest does not collect this file). Round after round, until
the time is up, it alternates two loops on the same journals:

* **writers**: writer processes append self-checking records (many appends in
  flight, small fragments so that seals happen all the time) beside a
  follower and a writer thread of this process that survives every round;
  they are SIGKILLed at random moments. After each round a fresh store must
  see only whole, intact records, every acknowledged append at its offsets,
  each writer's records as a gap-free prefix of what it issued, and every
  fragment matching its name (the invariants of tests/journal/test_journal_crash.py).
* **consumers**: publisher processes publish committed messages and
  transactions (some aborted) to an NDJSON journal, while a consumer process
  reads it committed with ``block=True`` and a small Sequencer ring, writes
  each message to an output file and checkpoints (output length and
  ``ReadCommittedIter.checkpoint()``, atomically) every few messages. Both
  are SIGKILLed at random; the next round's consumer resumes from the last
  checkpoint. After each round the output, caught up, must be exactly what a
  fresh read-committed pass gives: none twice, none lost, in order; every
  transaction a publisher reported committed is in it, and nothing of one
  it did not finish is, unless whole.

It prints progress every minute and, at the end, ``rounds``, ``kills`` and
``violations``; it exits 1 if there was any violation.

    python -m tests.soak --minutes 10 [--dir DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Final

from tests.journal import test_journal_crash as crash

REPO: Final = str(Path(__file__).resolve().parent.parent)
# Run as a module from the repository (not as a script: the script's own
# directory, tests/, would come first on sys.path, and its package
# directories would shadow the packages they test).
CHILD: Final = "tests.journal_child"
# The writers loop checks what tests/journal/test_journal_crash.py checks, on its journal.
CRASH_JOURNAL: Final = crash.JOURNAL
EVENTS: Final = "soak/events"
WRITER_FRAGMENT: Final = crash.FRAGMENT_SIZE
EVENTS_FRAGMENT: Final = 4096
CHECKPOINT_EVERY: Final = 3


class ViolationError(Exception):
    """An invariant did not hold."""


# -- children -------------------------------------------------------------------------


def _publisher(root: str, name: str, mode: str, seed: str) -> None:
    """Publish until killed; print each value once it is committed (or, for
    an aborted transaction, ``aborted`` values, which must never be read)."""
    from journal import LocalJournalStore
    from message import JsonDocument, Publisher, Transaction

    rng = random.Random(int(seed))
    store = LocalJournalStore(root, fragment_size=EVENTS_FRAGMENT)

    def to(_m: object) -> tuple[str, str]:
        return EVENTS, "application/x-ndjson"

    pub = Publisher(store)
    print("ready", flush=True)
    for t in range(10**9):
        if mode == "committed":
            value = f"{name}-{t}"
            pub.publish_committed(to, JsonDocument(v=value)).result()
            print(value, flush=True)
            continue
        size = rng.randrange(1, 5)
        values = [f"{name}-{t}-{i}-of-{size}" for i in range(size)]
        txn = Transaction(pub)
        for v in values:
            txn.publish(to, JsonDocument(v=v))
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0, 0.003))
        if rng.random() < 0.2:
            txn.abort()
            print("aborted " + " ".join(values), flush=True)
        else:
            txn.commit()
            print(" ".join(values), flush=True)


def _consumer(root: str, state_dir: str, seed: str) -> None:
    """Read committed, following, from the last checkpoint; write each value
    to the output and checkpoint every few messages; until killed."""
    from journal import LocalJournalStore
    from message import Flags, JsonDocument, ReadCommittedIter, Sequencer, get_flags

    rng = random.Random(int(seed))
    state = Path(state_dir)
    out_path, cp_path = state / "output", state / "checkpoint.json"
    cp, out_len = _load_state(cp_path)
    with open(out_path, "ab") as f:
        f.truncate(out_len)  # what was written after the checkpoint comes again
    store = LocalJournalStore(root)
    it = ReadCommittedIter(
        store, EVENTS, lambda _s: JsonDocument(), Sequencer(buffer=rng.randrange(1, 6)),
        block=True, checkpoint=cp,
    )
    out = os.open(out_path, os.O_WRONLY | os.O_APPEND)
    print("ready", flush=True)
    for n, env in enumerate(it, 1):
        if get_flags(env.message.get_uuid()) != Flags.ACK_TXN:
            os.write(out, env.message["v"].encode() + b"\n")
        if n % CHECKPOINT_EVERY == 0:
            _save_state(cp_path, it.checkpoint(), os.fstat(out).st_size)


def _load_state(cp_path: Path) -> tuple[Any, int]:
    from message import Checkpoint

    if not cp_path.exists():
        return None, 0
    doc = json.loads(cp_path.read_text())
    return Checkpoint.from_json(doc["checkpoint"]), int(doc["output_bytes"])


def _save_state(cp_path: Path, cp: Any, out_len: int) -> None:
    tmp = cp_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"checkpoint": cp.to_json(), "output_bytes": out_len}))
    os.replace(tmp, cp_path)  # a kill leaves the old state or the new one


# -- the parent -----------------------------------------------------------------------


class Soak:
    def __init__(self, work: Path, seed: int) -> None:
        self.work = work
        self.rng = random.Random(seed)
        self.rounds = 0
        self.kills = 0
        self.violations = 0
        self.checked_appends = 0  # acknowledged appends found in place, summed over rounds
        self.checked_messages = 0  # consumer output compared, summed over rounds
        self.generation = 0
        self._fresh()

    def _fresh(self) -> None:
        """New journals: at the start, and after a violation (whose state is suspect)."""
        self.generation += 1
        base = self.work / f"gen-{self.generation}"
        self.root = base / "journals"
        self.state = base / "consumer"
        self.state.mkdir(parents=True)
        (self.state / "output").write_bytes(b"")
        self.acknowledged: list[tuple[int, int, int, int]] = []
        self.reported: set[str] = set()
        self.aborted: set[str] = set()
        self.child_id = 0
        from journal import LocalJournalStore

        with LocalJournalStore(self.root) as store:
            store.create(CRASH_JOURNAL, {"kind": "bytes"})  # raw bytes
            store.create(EVENTS, {"content-type": "application/x-ndjson"})
        self.survivor = crash._Survivor(self.root)

    def close(self) -> None:
        self.survivor.store.close()

    # -- processes --

    def _spawn(self, *args: str, script: str | None = None) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", script, *args] if script else [
            sys.executable, "-m", "tests.soak", *args
        ]
        # Unbuffered: the "ready" line is read alone, and communicate() then
        # reads the rest from the pipe itself; a buffered reader would keep
        # (and lose) what it had read ahead, and could split a line in two.
        return subprocess.Popen(
            cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, bufsize=0,
        )

    def _kill(self, proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            self.kills += 1
        out, err = proc.communicate()
        if b"Traceback" in err:
            raise ViolationError(f"a child failed:\n{err.decode(errors='replace')}")
        return out, err

    @staticmethod
    def _ready_line(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            raise ViolationError(f"a child did not start: {line!r}")

    # -- the writers loop --

    def writers_round(self) -> None:
        procs, reports = [], []
        for _ in range(self.rng.randrange(1, 3)):
            self.child_id += 1
            report = self.root.parent / f"w-{self.child_id}"
            procs.append(self._spawn(
                "append", str(self.root), CRASH_JOURNAL, str(self.child_id),
                str(WRITER_FRAGMENT), str(report), script=CHILD,
            ))
            reports.append(report)
        follow_report = self.root.parent / f"f-{self.rounds}"
        follower = self._spawn("follow", str(self.root), CRASH_JOURNAL, str(follow_report),
                               script=CHILD)
        for p, rep in zip(procs, reports, strict=True):
            crash._wait_ready(rep, p)
        crash._wait_ready(follow_report, follower)
        self.survivor.start()
        order = [*procs, follower]
        self.rng.shuffle(order)
        try:
            for p in order:
                time.sleep(self.rng.uniform(0.0, 0.08))
                self._kill(p)
        finally:
            self.survivor.pause()
        for rep in reports:
            self.acknowledged += crash._resolved(rep)
        try:
            crash._verify(self.root, self.acknowledged + self.survivor.acknowledged)
        except AssertionError as exc:
            raise ViolationError(f"journal invariants: {exc}") from exc
        self.checked_appends += len(self.acknowledged) + len(self.survivor.acknowledged)
        offsets = [int(x) for x in follow_report.read_bytes().split()[1:]]
        if offsets != sorted(offsets):
            raise ViolationError("the follower went backwards")

    # -- the consumers loop --

    def consumers_round(self) -> None:
        pubs = []
        for _ in range(self.rng.randrange(1, 4)):
            self.child_id += 1
            mode = self.rng.choice(["txn", "txn", "committed"])
            pubs.append(self._spawn("publisher", str(self.root), f"p{self.child_id}", mode,
                                    str(self.rng.randrange(1 << 30))))
        consumer = self._spawn("consumer", str(self.root), str(self.state),
                               str(self.rng.randrange(1 << 30)))
        for p in [*pubs, consumer]:
            self._ready_line(p)
        order = [*pubs, consumer]
        self.rng.shuffle(order)
        outputs = []
        for p in order:
            time.sleep(self.rng.uniform(0.0, 0.3))
            if p is not consumer:
                outputs.append(self._kill(p)[0])
            else:
                self._kill(p)
        for out in outputs:
            for line in out.decode().splitlines():
                if line.startswith("aborted "):
                    self.aborted.update(line.split()[1:])
                elif line != "ready":
                    self.reported.update(line.split())
        self._check_consumer()

    def _check_consumer(self) -> None:
        """Catch the consumer's output up from its checkpoint (in this process)
        and compare it with a fresh read-committed pass."""
        from journal import LocalJournalStore
        from message import Flags, JsonDocument, ReadCommittedIter, Sequencer, get_flags

        cp, out_len = _load_state(self.state / "checkpoint.json")
        output = (self.state / "output").read_bytes()[:out_len].decode().splitlines()
        with LocalJournalStore(self.root) as store:
            new = lambda _s: JsonDocument()  # noqa: E731
            rest = ReadCommittedIter(store, EVENTS, new, Sequencer(buffer=3), checkpoint=cp)
            output += [e.message["v"] for e in rest
                       if get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
            fresh = [e.message["v"] for e in ReadCommittedIter(store, EVENTS, new)
                     if get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
        if output != fresh:
            dup = len(output) - len(set(output))
            raise ViolationError(f"consumer output differs from a fresh read: {len(output)} vs"
                            f" {len(fresh)} values, {dup} duplicated")
        self.checked_messages += len(output)
        got = set(fresh)
        if len(got) != len(fresh):
            raise ViolationError("a message was read twice")
        if not self.reported <= got:
            raise ViolationError(f"lost committed messages: {sorted(self.reported - got)[:5]}")
        if self.aborted & got:
            raise ViolationError(f"aborted messages read: {sorted(self.aborted & got)[:5]}")
        for v in got - self.reported:  # committed but killed before reporting: whole only
            parts = v.split("-")
            if len(parts) == 5:
                name, t, _, _, size = parts
                whole = {f"{name}-{t}-{i}-of-{size}" for i in range(int(size))}
                if not whole <= got:
                    raise ViolationError(f"part of a transaction read: {v}")

    # -- the loop --

    def run(self, minutes: float) -> None:
        start = time.monotonic()
        deadline = start + minutes * 60
        next_report = start + 60
        while time.monotonic() < deadline:
            try:
                if self.rounds % 2 == 0:
                    self.writers_round()
                else:
                    self.consumers_round()
            except ViolationError as exc:
                self.violations += 1
                print(f"VIOLATION in round {self.rounds}: {exc}", flush=True)
                traceback.print_exc()
                self.close()
                self._fresh()
            self.rounds += 1
            if time.monotonic() >= next_report:
                next_report += 60
                print(f"[{(time.monotonic() - start) / 60:4.1f} min] rounds {self.rounds},"
                      f" kills {self.kills}, violations {self.violations}", flush=True)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "publisher":
        _publisher(*argv[1:5])
        return 0
    if argv and argv[0] == "consumer":
        _consumer(*argv[1:4])
        return 0
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="exactly-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"soak: {args.minutes:g} minutes, seed {seed}, in {work}", flush=True)
    soak = Soak(work, seed)
    started = time.monotonic()
    try:
        soak.run(args.minutes)
    finally:
        soak.close()
    print(f"soak done in {(time.monotonic() - started) / 60:.1f} min: rounds {soak.rounds},"
          f" kills {soak.kills}, violations {soak.violations}", flush=True)
    print(f"  (checked {soak.checked_appends} acknowledged appends and"
          f" {soak.checked_messages} consumed messages, summed over rounds)", flush=True)
    if not args.dir and not soak.violations:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if soak.violations else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
