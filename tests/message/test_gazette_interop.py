"""Messages through Gazette brokers, between Gazette's Go ``message`` package
(the program in tests/gazette_interop) and this library: what either side
publishes, the other reads committed exactly once, in the same order."""

from __future__ import annotations

import json
import random
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from exactly.localcluster import GazetteCluster
from framing import framing_by_content_type
from journal import GazetteClient
from message import (
    Checkpoint,
    Flags,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    Sequencer,
    get_flags,
    modulo_mapping,
)

pytestmark = pytest.mark.gazette


def interop(program: Path, *args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_go_publish_then_go_read_committed(gazette_cluster: GazetteCluster,
                                           gazette_prefix: str, gazette_interop: Path) -> None:
    """Committed messages, acknowledged transactions, transactions never
    acknowledged and duplicate frames: Go's committed reader yields exactly the
    committed ids, each once, in publish order."""
    c = gazette_cluster
    journal = f"{gazette_prefix}go-to-go"
    route = c.create_journal(journal, replication=2)
    published = json.loads(interop(gazette_interop, "publish", "--broker", c.address,
                                   "--journal", journal, "--seed", "7", "--count", "200"))
    committed, uncommitted = published["committed"], published["uncommitted"]
    assert committed and uncommitted and not set(committed) & set(uncommitted)

    # The journal really holds the hard cases: duplicates, never-committed
    # messages, ACKs (whose id is empty).
    raw = [json.loads(line) for line in c.gazctl(
        "journals", "read", "-l", f"name={journal}").stdout.splitlines()]
    per_id = Counter(doc["id"] for doc in raw)
    assert any(n > 1 for id_, n in per_id.items() if id_)
    assert set(uncommitted) <= set(per_id) and per_id[""] > 0
    assert len(per_id) - 1 == len(committed) + len(uncommitted)

    other = next(i for i in range(3) if i != route.primary)
    read = [json.loads(line) for line in interop(
        gazette_interop, "read", "--broker", c.addresses[other], "--journal", journal
    ).splitlines()]
    assert [doc["id"] for doc in read] == committed
    for doc in read:
        u = uuid.UUID(doc["_meta"]["uuid"])
        assert u.version == 1 and doc["kind"] in ("committed", "txn")


def test_interop_program_reports_bad_usage(gazette_interop: Path) -> None:
    """A missing --journal is one error line and status 1."""
    r = subprocess.run([str(gazette_interop), "read"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1
    assert r.stderr == "gazette-interop: read needs --journal\n"


# -- Python and Go, through the brokers ----------------------------------------


def _python_ids(client: GazetteClient, journal: str, **kw: Any) -> list[str]:
    """The ids of the committed messages ReadCommittedIter yields, ACKs left out."""
    return [
        env.message["id"]
        for env in ReadCommittedIter(client, journal, lambda _s: JsonDocument(), **kw)
        if get_flags(env.message.get_uuid()) != Flags.ACK_TXN
    ]


def test_go_publishes_python_reads_committed(gazette_cluster: GazetteCluster,
                                             gazette_prefix: str, gazette_interop: Path) -> None:
    """What Go's Publisher writes (committed, transactions, transactions never
    acknowledged, re-appended frames) ReadCommittedIter yields exactly once,
    in the order Go's own committed reader yields it, for every ring size and
    across a checkpoint."""
    c = gazette_cluster
    journal = f"{gazette_prefix}go-to-python"
    c.create_journal(journal, replication=2)
    published = json.loads(interop(gazette_interop, "publish", "--broker", c.address,
                                   "--journal", journal, "--seed", "11", "--count", "300"))
    go_read = [json.loads(line)["id"] for line in interop(
        gazette_interop, "read", "--broker", c.address, "--journal", journal).splitlines()]
    assert go_read == published["committed"]
    with GazetteClient(c.address) as client:
        for ring in (1, 7, 4096):
            assert _python_ids(client, journal, sequencer=Sequencer(buffer=ring)) == go_read
        it = ReadCommittedIter(client, journal, lambda _s: JsonDocument())
        first = []
        for env in it:
            if get_flags(env.message.get_uuid()) != Flags.ACK_TXN:
                first.append(env.message["id"])
            if len(first) == len(go_read) // 2:
                break
        ckpt = Checkpoint.from_bytes(it.checkpoint().to_bytes())
        it.close()
    with GazetteClient(c.address) as client:
        rest = _python_ids(client, journal, checkpoint=ckpt)
    assert first + rest == go_read


def _publish_mix(client: GazetteClient, journal: str, seed: int, count: int) -> dict[str, list]:
    """The Go program's mix, from Python: committed messages, acknowledged
    transactions (an ACK sometimes written twice), transactions whose producer
    "crashed", and earlier frames appended again verbatim."""
    spec = client.get(journal)
    mapping = modulo_mapping(lambda d: d["id"], lambda: [spec])
    framing = framing_by_content_type(spec.content_type or "")
    rng = random.Random(seed)
    pub = Publisher(client)
    out: dict[str, list[str]] = {"committed": [], "uncommitted": []}
    frames: list[bytes] = []
    n = 0

    def doc(kind: str) -> JsonDocument:
        nonlocal n
        n += 1
        return JsonDocument(id=f"{kind}-{seed}-{n}", kind=kind)

    while n < count:
        r = rng.randrange(10)
        if r < 4:
            d = doc("committed")
            pub.publish_committed(mapping, d)
            out["committed"].append(d["id"])
            frames.append(framing.marshal(d))
        elif r < 7:
            for _ in range(1 + rng.randrange(4)):
                d = doc("txn")
                pub.publish_uncommitted(mapping, d)
                out["committed"].append(d["id"])
                frames.append(framing.marshal(d))
            for intent in pub.build_ack_intents():
                client.append(intent.journal, intent.intent)
                if rng.randrange(3) == 0:
                    client.append(intent.journal, intent.intent)
        elif r < 8:
            crashed = Publisher(client)
            for _ in range(1 + rng.randrange(3)):
                d = doc("aborted")
                crashed.publish_uncommitted(mapping, d)
                out["uncommitted"].append(d["id"])
                frames.append(framing.marshal(d))
        else:
            for _ in range(1 + rng.randrange(3)):
                if frames:
                    client.append(journal, frames[rng.randrange(len(frames))])
    client.flush(timeout=60)
    return out


def test_python_publishes_go_reads_committed(gazette_cluster: GazetteCluster,
                                             gazette_prefix: str, gazette_interop: Path) -> None:
    """The same mix published by Python: Go's ReadCommittedIter yields exactly
    the committed messages once, in the order ReadCommittedIter yields them."""
    c = gazette_cluster
    journal = f"{gazette_prefix}python-to-go"
    with GazetteClient(c.address) as client:
        client.create(journal, {"content-type": "application/x-ndjson"}, replication=2)
        published = _publish_mix(client, journal, seed=5, count=300)
        ours = _python_ids(client, journal)
    assert published["uncommitted"] and ours == published["committed"]
    raw = c.gazctl("journals", "read", "-l", f"name={journal}").stdout.splitlines()
    assert len(raw) > len(published["committed"]) + len(published["uncommitted"])  # dups, ACKs
    go_read = [json.loads(line) for line in interop(
        gazette_interop, "read", "--broker", c.addresses[1], "--journal", journal).splitlines()]
    assert [d["id"] for d in go_read] == published["committed"]
    assert all(uuid.UUID(d["_meta"]["uuid"]).version == 1 for d in go_read)


def test_an_ack_reusing_a_span_clock_is_dropped_by_go_and_by_us(
        gazette_cluster: GazetteCluster, gazette_prefix: str, gazette_interop: Path) -> None:
    """A producer that reuses a clock: CONTINUE_TXN c, then ACK_TXN c. Go's
    Sequencer emits the span message and drops the ACK; ReadCommittedIter
    commits the same messages, ACKs included, in the same order (with the
    native core and with the Python implementation)."""
    from message import _core, build_uuid
    from message._sequencer import Sequencer as PySequencer

    c = gazette_cluster
    journal = f"{gazette_prefix}reused-clock"
    framing = framing_by_content_type("application/x-ndjson")
    a, b = bytes([1, 2, 3, 4, 5, 6]), bytes([1, 2, 3, 4, 5, 7])
    steps = [(a, 100, Flags.CONTINUE_TXN), (b, 100, Flags.OUTSIDE_TXN),
             (a, 101, Flags.CONTINUE_TXN), (a, 101, Flags.ACK_TXN),      # reused: ACK dropped
             (a, 102, Flags.CONTINUE_TXN), (b, 101, Flags.CONTINUE_TXN),
             (a, 103, Flags.ACK_TXN), (b, 101, Flags.ACK_TXN),           # b reused too
             (a, 104, Flags.OUTSIDE_TXN)]
    with GazetteClient(c.address) as client:
        client.create(journal, {"content-type": "application/x-ndjson"}, replication=2)
        for n, (p, clock, flags) in enumerate(steps):
            doc = JsonDocument(id=str(n), kind=flags.name)
            doc.set_uuid(build_uuid(p, clock, flags))
            client.append(journal, framing.marshal(doc))
        client.flush(timeout=60)
        types = [PySequencer] + ([_core.NATIVE.Sequencer] if _core.NATIVE else [])
        ours = [[e.message["id"] for e in ReadCommittedIter(
            client, journal, lambda _s: JsonDocument(), t(buffer=2))] for t in types]
    go_read = [json.loads(line)["id"] for line in interop(
        gazette_interop, "read", "--acks", "--broker", c.address, "--journal", journal
    ).splitlines()]
    assert go_read == ["1", "0", "2", "4", "6", "5", "8"]
    assert all(o == go_read for o in ours)


def test_python_publishes_csv_transactions_go_reads_them(
        gazette_cluster: GazetteCluster, gazette_prefix: str, gazette_interop: Path) -> None:
    """CSV records published by Python, in transactions and outside: Go's
    ReadCommittedIter of message.CSVRecord reads the committed ones, in order
    (its CSV reader requires every record, ACKs included, to be as wide as
    the first)."""
    from message import CSVRecord

    c = gazette_cluster
    journal = f"{gazette_prefix}python-csv-to-go"
    with GazetteClient(c.address) as client:
        spec = client.create(journal, {"content-type": "text/csv"}, replication=2)
        mapping = modulo_mapping(lambda r: r[1], lambda: [spec])
        pub = Publisher(client)
        for n in range(12):
            fields = [f"k{n}", f"value, {n}"]
            if n % 4 == 3:
                pub.publish_committed(mapping, CSVRecord(["", *fields]))
                continue
            pub.publish_uncommitted(mapping, CSVRecord(["", *fields]))
            if n % 4 == 2:
                intents = pub.build_ack_intents() if n != 10 else pub.build_rollback_intents()
                for intent in intents:
                    client.append(intent.journal, intent.intent)
        client.flush(timeout=60)
        # 8, 9 and 10 were rolled back.
        want = [[f"k{n}", f"value, {n}"] for n in range(12) if n not in (8, 9, 10)]
        ours = [list(e.message[1:]) for e in ReadCommittedIter(
            client, journal, lambda _s: CSVRecord())
            if get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
    go_read = [json.loads(line)[1:] for line in interop(
        gazette_interop, "read", "--csv", "--broker", c.address, "--journal", journal
    ).splitlines()]
    assert go_read == ours == want


def test_go_and_python_agree_through_a_secured_cluster(
        gazette_secure_cluster: GazetteCluster, gazette_interop: Path) -> None:
    """Through TLS, mutual TLS and signed authorizations, both ways: what Go's
    Publisher writes, ReadCommittedIter reads exactly once, in Go's order;
    what Python publishes, Go's committed reader reads as Python's does."""
    import os
    import secrets

    c = gazette_secure_cluster
    assert c.security is not None
    env = {**os.environ, **c.security.client_env()}
    journal, back = (f"secure/interop-{secrets.token_hex(3)}/{d}" for d in ("go", "py"))
    with GazetteClient(c.address, replication=1, **c.client_options()) as client:
        for name in (journal, back):
            client.create(name, {"content-type": "application/x-ndjson"})
        published = json.loads(interop(gazette_interop, "publish", "--broker", c.address,
                                       "--journal", journal, "--seed", "5", "--count", "150",
                                       env=env))
        assert _python_ids(client, journal) == published["committed"]
        ours = _publish_mix(client, back, seed=6, count=150)
        client.flush()
        assert _python_ids(client, back) == ours["committed"]
    go_read = [json.loads(line)["id"] for line in interop(
        gazette_interop, "read", "--broker", c.address, "--journal", back, env=env).splitlines()]
    assert go_read == ours["committed"]
