"""Exactly-once end to end on the LocalJournalStore: publisher processes
(some SIGKILLed mid-transaction) and readers that follow, resume, and skip
what retention removed."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from journal import LocalJournalStore
from message import (
    Flags,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    Transaction,
    get_flags,
)

# Every test runs with the C read loops and with the Python ones.
pytestmark = pytest.mark.usefixtures("read_loops")

NDJSON = {"content-type": "application/x-ndjson"}
J = "events/part-0"


def new_doc(_spec: object) -> JsonDocument:
    return JsonDocument()


def to_j(_msg: object) -> tuple[str, str]:
    return J, "application/x-ndjson"


def data_of(env) -> str | None:
    if get_flags(env.message.get_uuid()) == Flags.ACK_TXN:
        return None
    return env.message["v"]


def test_follow_delivers_committed_messages_as_they_commit(tmp_path: Path) -> None:
    """A blocking ReadCommittedIter yields a transaction only once its ACK lands."""
    with LocalJournalStore(tmp_path) as store:
        store.create(J, NDJSON)
        got: list[str] = []
        it = ReadCommittedIter(store, J, new_doc, block=True)

        def follow() -> None:
            for env in it:
                if data_of(env) is not None:
                    got.append(data_of(env))
                if len(got) == 3:
                    return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        pub = Publisher(store)
        txn = Transaction(pub)
        txn.publish(to_j, JsonDocument(v="t1"))
        txn.publish(to_j, JsonDocument(v="t2"))
        pub2 = Publisher(store)
        pub2.publish_committed(to_j, JsonDocument(v="c1")).result()
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == ["c1"]  # the transaction is still open
        txn.commit()
        t.join(5)
        assert got == ["c1", "t1", "t2"]
        it.close()


def test_reader_skips_what_retention_removed(tmp_path: Path, caplog) -> None:
    """After trim, a reader from offset 0 jumps to the first kept offset and warns."""
    with LocalJournalStore(tmp_path, fragment_size=200) as store:
        store.create(J, NDJSON)
        pub = Publisher(store)
        for i in range(30):
            pub.publish_committed(to_j, JsonDocument(v=f"m{i}")).result()
        fragments = store.fragments(J)
        assert len(fragments) > 3
        cut = fragments[2].begin
        first = store.trim(J, before_offset=cut)
        assert first == cut
        with caplog.at_level(logging.WARNING):
            envs = list(ReadUncommittedIter(store, J, new_doc))
        assert envs[0].begin == cut
        assert [e.message["v"] for e in envs] == [f"m{i}" for i in range(30)][-len(envs):]
        assert any("retention" in r.getMessage() for r in caplog.records)


PRODUCER = textwrap.dedent(
    """
    import sys, time
    from journal import LocalJournalStore
    from message import JsonDocument, Publisher, Transaction
    root, name, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    to = lambda _m: ("events/part-0", "application/x-ndjson")
    with LocalJournalStore(root) as store:
        pub = Publisher(store)
        for t in range(1000):
            if mode == "committed":
                pub.publish_committed(to, JsonDocument(v=f"{name}-{t}")).result()
                print(f"{name}-{t}", flush=True)
                continue
            txn = Transaction(pub)
            for i in range(3):
                txn.publish(to, JsonDocument(v=f"{name}-{t}-{i}"))
            txn.commit()
            print(" ".join(f"{name}-{t}-{i}" for i in range(3)), flush=True)
    """
)


@pytest.mark.slow
def test_publisher_processes_killed_mid_transaction(tmp_path: Path) -> None:
    """Several publisher processes share a journal; some are SIGKILLed at random
    moments. Every transaction reported committed is read exactly once, and
    nothing else of a killed producer's open transaction is."""
    with LocalJournalStore(tmp_path) as store:
        store.create(J, NDJSON)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, str(tmp_path), f"p{n}", mode],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        for n, mode in enumerate(["txn", "txn", "committed", "txn"])
    ]
    # Each has committed something (however slowly a loaded machine starts
    # them), then runs on a while before it is killed.
    reported: set[str] = set()
    for p in procs:
        assert p.stdout is not None
        reported.update(p.stdout.readline().split())
    time.sleep(0.5)
    for p in procs[:2] + procs[3:]:
        p.send_signal(signal.SIGKILL)
        time.sleep(0.05)
    procs[2].send_signal(signal.SIGKILL)
    for p in procs:
        out, _ = p.communicate()
        for line in out.splitlines():
            reported.update(line.split())
    assert reported, "producers reported nothing before being killed"

    with LocalJournalStore(tmp_path) as store:
        reader = ReadCommittedIter(store, J, new_doc, Sequencer(buffer=8))
        got = [v for v in map(data_of, reader) if v is not None]
        assert len(got) == len(set(got)), "a message was read twice"
        assert reported <= set(got), "a message reported committed was lost"
        # Whatever else is visible is whole transactions only.
        extra = set(got) - reported
        for v in extra:
            name, t, *rest = v.split("-")
            if rest:
                assert {f"{name}-{t}-{i}" for i in range(3)} <= set(got)


def test_a_retention_jump_is_reported_once(tmp_path: Path, caplog) -> None:
    """Reading megabytes past a trimmed start logs the jump once, and offsets
    stay contiguous after it."""
    with LocalJournalStore(tmp_path, fragment_size=64 << 10) as store:
        store.create(J, NDJSON)
        for i in range(400):
            store.append(J, b'{"v": "%05d", "pad": "%s"}\n' % (i, b"x" * 8000))
        store.flush()
        cut = store.fragments(J)[3].begin
        store.trim(J, before_offset=cut)
        with caplog.at_level(logging.WARNING):
            envs = list(ReadUncommittedIter(store, J, new_doc))
    assert envs[0].begin == cut and store_is_contiguous(envs)
    assert envs[-1].message["v"] == "00399"
    jumps = [r for r in caplog.records if "retention" in r.getMessage()]
    assert len(jumps) == 1, [r.getMessage() for r in jumps]


def store_is_contiguous(envs) -> bool:
    return all(a.end == b.begin for a, b in itertools.pairwise(envs))
