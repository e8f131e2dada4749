"""The Go interop program (tests/gazette_interop) against the session cluster:
what Gazette's Go Publisher writes, Gazette's Go ReadCommittedIter reads
committed, exactly once. The reference the Python side is held to."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest

from exactly.localcluster import GazetteCluster

pytestmark = pytest.mark.gazette


def interop(program: Path, *args: str) -> str:
    r = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120)
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
