"""A producer SIGKILLed in the middle of a transaction, on the embedded
store and on a Gazette cluster: ``exactly inspect --open`` finds its
transaction, ``exactly lag`` counts only committed messages behind a
checkpoint, and ``exactly abort`` ends the transaction."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from message import Checkpoint, JsonDocument, ReadCommittedIter

ROOT = Path(__file__).resolve().parents[2]

# Publishes 10 committed messages, then 3 of a transaction it never ends,
# says so, and waits to be killed.
_PRODUCER = r"""
import sys, time
from message import JsonDocument, Publisher
where, journal = sys.argv[1], sys.argv[2]
if where.startswith("http"):
    from journal import GazetteClient
    store = GazetteClient(where)
    store.create(journal, {"content-type": "application/x-ndjson"}, replication=1)
else:
    from journal import LocalJournalStore
    store = LocalJournalStore(where)
    store.create(journal, {"content-type": "application/x-ndjson"})
to = lambda _m: (journal, "application/x-ndjson")
pub = Publisher(store)
for n in range(10):
    pub.publish_committed(to, JsonDocument(n=n))
store.flush()
first = pub.publish_uncommitted(to, JsonDocument(n=100)).result()
for n in (101, 102):
    pub.publish_uncommitted(to, JsonDocument(n=n)).result()
print(pub.producer_id.hex(), first.begin, flush=True)
time.sleep(600)
"""


def cli(where: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BROKER_ADDRESS", "EXACTLY_ROOT")}
    return subprocess.run(
        [sys.executable, "-m", "exactly", *where, *args], capture_output=True, text=True,
        env={**env, "PYTHONPATH": str(ROOT)}, timeout=120,
    )


def ok(where: list[str], *args: str) -> str:
    r = cli(where, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def killed_mid_transaction(where: str, journal: str) -> tuple[str, int]:
    """Run the producer, SIGKILL it with its transaction open; its producer
    ID and the offset of the transaction's first message."""
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, where, journal], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=30)[1]
        producer, first = line.split()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return producer, int(first)


def check_stuck_transaction(store: Any, where: list[str], address: str, journal: str,
                            tmp_path: Path) -> None:
    producer, first = killed_mid_transaction(address, journal)

    # A consumer read 4 of the 10 committed messages, and checkpointed.
    with ReadCommittedIter(store, journal, lambda spec: JsonDocument()) as it:
        for _, _env in zip(range(4), it, strict=False):
            pass
        cp = it.checkpoint()
    ckpt = tmp_path / "consumer.ckpt"
    ckpt.write_text(cp.to_json())
    head = store.head(journal)

    rows = [x.split() for x in ok(where, "inspect", journal, "--open").splitlines()[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [(journal, producer, str(first))]
    older = ok(where, "inspect", "--open", journal, "--older-than", "10m")
    assert "no open transaction older than 10m" in older

    def lag() -> dict[str, Any]:
        docs = [json.loads(x) for x in
                ok(where, "lag", "--checkpoint", str(ckpt), "--json").splitlines()]
        assert [d["journal"] for d in docs] == [journal]
        return docs[0]

    before = lag()
    offset = Checkpoint.from_json(ckpt.read_text()).offsets[journal]
    assert before["offset"] == offset and before["head"] == head
    assert before["bytes_behind"] == head - offset
    assert before["messages_behind"] == 6  # the open transaction's 3 are not committed

    r = cli(where, "abort", journal, "--producer", producer)
    assert r.returncode == 0, r.stderr
    assert "no open transaction" in ok(where, "inspect", journal, "--open")
    after = lag()
    assert after["messages_behind"] == 6  # rolled back: never to be read
    assert after["bytes_behind"] > before["bytes_behind"]  # the roll-back ACK
    with ReadCommittedIter(store, journal, lambda spec: JsonDocument()) as it:
        got = [env.message.get("n") for env in it]
    assert [n for n in got if n is not None] == list(range(10))


def test_stuck_transaction_on_the_embedded_store(tmp_path: Path) -> None:
    from journal import LocalJournalStore

    root = tmp_path / "store"
    root.mkdir()
    with LocalJournalStore(root) as store:
        check_stuck_transaction(store, ["--root", str(root)], str(root), "clicks/part-0",
                                tmp_path)


@pytest.mark.slow
def test_stuck_transaction_on_a_gazette_cluster(gazette_cluster: Any, gazette_prefix: str,
                                                tmp_path: Path) -> None:
    from journal import GazetteClient

    url = gazette_cluster.address
    with GazetteClient(url) as store:
        check_stuck_transaction(store, ["--broker", url], url, f"{gazette_prefix}clicks",
                                tmp_path)
