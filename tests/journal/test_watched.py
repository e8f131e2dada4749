"""WatchedList: the journals of a selector, kept current as they come and
go — on the embedded store by listing again, on a Gazette cluster by a List
RPC that watches — so that a publisher's mapping sees new partitions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from journal import GazetteClient, LocalJournalStore, MemoryJournalClient, WatchedList
from message import JsonDocument, Publisher, modulo_mapping

NDJSON = {"content-type": "application/x-ndjson"}


def _follows(client: Any, prefix: str, **kw: Any) -> None:
    client.create(f"{prefix}part-0", NDJSON)
    with WatchedList(client, f"prefix={prefix}", **kw) as parts:
        first = parts()
        assert [s.name for s in first] == [f"{prefix}part-0"]
        assert parts() is first  # the same object while nothing changes
        version = parts.version
        client.create(f"{prefix}part-1", NDJSON)
        assert parts.wait_for_change(version, timeout=20)
        assert [s.name for s in parts()] == [f"{prefix}part-0", f"{prefix}part-1"]
        # A publisher's mapping over it spreads keys over the new partition too.
        mapping = modulo_mapping(lambda d: d["k"], parts)
        pub = Publisher(client)
        landed = {pub.publish_committed(mapping, JsonDocument(k=str(i))).result().journal
                  for i in range(40)}
        assert landed == {f"{prefix}part-0", f"{prefix}part-1"}
        version = parts.version
        client.delete(f"{prefix}part-0")
        assert parts.wait_for_change(version, timeout=20)
        assert [s.name for s in parts()] == [f"{prefix}part-1"]


def test_follows_journals_of_the_embedded_store(tmp_path: Path) -> None:
    """New and deleted journals of a local store show within the interval."""
    with LocalJournalStore(tmp_path) as store:
        _follows(store, "clicks/", interval=0.05)


def test_follows_journals_in_memory() -> None:
    """Any JournalClient: the in-memory one too."""
    _follows(MemoryJournalClient(), "clicks/", interval=0.05)


def test_follows_journals_of_a_gazette_cluster(gazette_cluster: Any, gazette_prefix: str) -> None:
    """On a cluster, a watching List RPC sends each change."""
    with GazetteClient(gazette_cluster.address, replication=1) as client:
        _follows(client, gazette_prefix)


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        WatchedList(MemoryJournalClient(), interval=0)
