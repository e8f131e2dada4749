"""Fragments in a cloud store, read straight from it: brokers persist to a
real S3-compatible server (SeaweedFS on 127.0.0.1), answer reads of
persisted fragments with signed URLs, and the reader fetches them over HTTP
itself, for every codec Gazette writes; gazctl reads the same bytes."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from journal import GazetteClient
from message import JsonDocument, ReadCommittedIter

NDJSON = {"content-type": "application/x-ndjson"}
CODECS = ["none", "gzip", "snappy", "zstandard", "gzip_offload"]


def _persisted(c: GazetteClient, name: str, count: int, records: int) -> bytes:
    """Append ``records`` 16-byte records (a batch at a time: brokers close
    1 KiB fragments between Append RPCs) and wait until ``count`` fragments
    are persisted to the store."""
    recs = [b'{"i": %8d}\n' % i for i in range(records)]  # 16 bytes, valid JSON
    for i in range(0, records, 64):
        for rec in recs[i : i + 64]:
            c.append(name, rec)
        c.flush(timeout=30)
    deadline = time.monotonic() + 60
    while sum(f.sealed for f in c.fragments(name)) < count:
        assert time.monotonic() < deadline, c.fragments(name)
        time.sleep(0.2)
    return b"".join(recs)


@pytest.mark.parametrize("codec", CODECS)
def test_persisted_fragments_are_read_from_the_store(
        gazette_s3_cluster: Any, s3_server: Any, codec: str) -> None:
    """Each codec: the reader fetches persisted fragments by their signed
    URLs (counted), decodes them, and reads what gazctl reads through the
    brokers; with direct_reads off, the same bytes come through a broker."""
    c = gazette_s3_cluster
    name = f"s3/{codec}-{secrets.token_hex(3)}"
    with GazetteClient(c.address, replication=1, refresh_interval=1) as g:
        g.create(name, NDJSON, fragment_stores=[s3_server.store_url("fragments/")],
                 fragment_length=1024, compression=codec)
        content = _persisted(g, name, 3, 400)
        with g.read(name) as r:
            assert r.read() == content
            assert r.direct_fragments >= 3
        with g.read(name, 1500) as r:  # from inside a fragment
            assert r.read() == content[1500:]
    with GazetteClient(c.address, direct_reads=False) as g, g.read(name) as r:
        assert r.read() == content and r.direct_fragments == 0
    assert c.gazctl("journals", "read", "-l", f"name={name}").stdout == content


def test_committed_reads_of_a_cloud_stored_journal(
        gazette_s3_cluster: Any, s3_server: Any) -> None:
    """ReadCommittedIter over a journal whose fragments are in the store."""
    c = gazette_s3_cluster
    name = f"s3/committed-{secrets.token_hex(3)}"
    with GazetteClient(c.address, replication=1, refresh_interval=1) as g:
        g.create(name, NDJSON, fragment_stores=[s3_server.store_url("fragments/")],
                 fragment_length=1024, compression="zstandard")
        _persisted(g, name, 2, 300)
        got = [e.message["i"] for e in ReadCommittedIter(g, name, lambda s: JsonDocument())]
    assert got == list(range(300))
