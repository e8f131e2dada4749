"""journal.GazetteClient against a real Gazette cluster (etcd + 3 brokers on
127.0.0.1, started once per test run by the ``gazette_cluster`` fixture)."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from journal import (
    BrokerError,
    BrokerUnavailableError,
    GazetteClient,
    JournalError,
    JournalNotFoundError,
    JournalStore,
)
from journal.testing import CONFORMANCE_CHECKS, RETENTION_CHECKS
from message import (
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    modulo_mapping,
)
from tests.docblocks import ROOT, code_blocks

pytestmark = pytest.mark.gazette

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture
def client(gazette_cluster: Any) -> Iterator[GazetteClient]:
    with GazetteClient(gazette_cluster.address, retry_timeout=30) as c:
        yield c


def _wipe(c: GazetteClient) -> None:
    for spec in c.list():
        c.delete(spec.name)


@pytest.mark.parametrize(
    "check",
    [c for c in CONFORMANCE_CHECKS if c not in RETENTION_CHECKS],
    ids=lambda c: c.__name__,
)
def test_conformance(gazette_cluster: Any, check: Any) -> None:
    """The JournalStore conformance checks pass on the cluster (retention is
    the fragment store's on Gazette: see test_trim_prunes_persisted_fragments)."""

    def factory() -> GazetteClient:
        # With file_root, delete() removes persisted fragments too, so that
        # a journal deleted and created again is empty, as the checks want.
        c = GazetteClient(
            gazette_cluster.address, file_root=gazette_cluster.fragment_root, retry_timeout=30
        )
        _wipe(c)  # The checks want an empty store.
        return c

    check(factory)
    with factory():
        pass


def test_is_a_journal_store(client: GazetteClient) -> None:
    """GazetteClient satisfies the JournalStore protocol."""
    assert isinstance(client, JournalStore)


def test_broker_address_from_the_environment(
    gazette_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No address: BROKER_ADDRESS, as Gazette's tools; else localhost:8080."""
    monkeypatch.setenv("BROKER_ADDRESS", gazette_cluster.address)
    with GazetteClient() as c:
        assert c.address == gazette_cluster.address
        c.list()
    monkeypatch.delenv("BROKER_ADDRESS")
    with GazetteClient() as c:
        assert c.address == "http://localhost:8080"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_cluster_is_one_clear_error() -> None:
    """Nobody listening: BrokerUnavailableError naming the address, in bounded time."""
    address = f"http://127.0.0.1:{_free_port()}"
    with GazetteClient(address, retry_timeout=1.0) as c:
        start = time.monotonic()
        with pytest.raises(BrokerUnavailableError, match=address) as info:
            c.list()
        assert time.monotonic() - start < 10
        assert isinstance(info.value, JournalError)
        with pytest.raises(BrokerUnavailableError, match=address):
            c.create("some/journal", NDJSON)


def test_a_server_that_is_not_a_broker_is_one_clear_error() -> None:
    """An HTTP server that is not Gazette: one JournalError naming it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        with GazetteClient(address, retry_timeout=1.0) as c, pytest.raises(JournalError) as info:
            c.list()
        assert f"127.0.0.1:{server.server_address[1]}" in str(info.value)
    finally:
        server.shutdown()
        server.server_close()


def test_a_journal_the_cluster_cannot_replicate_says_why(
    gazette_cluster: Any, gazette_prefix: str
) -> None:
    """Replication 5 on a cluster of 3 brokers: appends fail once retried
    out, saying the brokers answered and what they said (too few brokers
    for the journal's replication), not that no broker answered. A name no
    journal can have is refused as the embedded store refuses it."""
    from journal import InvalidJournalNameError

    with GazetteClient(gazette_cluster.address, retry_timeout=2.0) as c:
        name = f"{gazette_prefix}under-replicated"
        c.create(name, NDJSON, replication=5)
        with pytest.raises(BrokerUnavailableError) as info:
            c.append(name, b'{"a": 1}\n').result(timeout=60)
        text = str(info.value)
        assert "INSUFFICIENT_JOURNAL_BROKERS" in text and "replication" in text, text
        assert "no Gazette broker answered" not in text and gazette_cluster.address in text
        assert info.value.status == "INSUFFICIENT_JOURNAL_BROKERS"
        c.delete(name)
        with pytest.raises(InvalidJournalNameError, match="bad name!"):
            c.get("bad name!")


def test_bad_addresses_and_settings_are_value_errors(tmp_path: Path) -> None:
    """Addresses, security files and journal settings Gazette would refuse
    fail at once."""
    for bad in ("localhost:8080", "ftp://x", "https://"):
        with pytest.raises(ValueError):
            GazetteClient(bad)
    with pytest.raises(ValueError, match="trusted_ca_file"):
        GazetteClient("https://127.0.0.1:1", trusted_ca_file=tmp_path / "no-such.pem")
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(ValueError, match="together"):
        GazetteClient("https://127.0.0.1:1", cert_file=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="base64"):
        GazetteClient("http://127.0.0.1:1", auth_keys="not base64!")
    with pytest.raises(ValueError, match="at least one"):
        GazetteClient("http://127.0.0.1:1", auth_keys=" , ")
    with pytest.raises(ValueError, match="connect_timeout"):
        GazetteClient("http://127.0.0.1:1", connect_timeout=0)
    with pytest.raises(ValueError, match="replication"):
        GazetteClient("http://127.0.0.1:1", replication=9)
    with pytest.raises(ValueError, match="fragment_length"):
        GazetteClient("http://127.0.0.1:1", fragment_length=10)
    with pytest.raises(ValueError, match="compression"):
        GazetteClient("http://127.0.0.1:1", compression="lz4")


def test_create_applies_defaults_and_options(
    client: GazetteClient, gazette_cluster: Any, gazette_prefix: str
) -> None:
    """create() writes replication, fragment settings and a file:// store
    (the cluster has one) into the JournalSpec; gazctl sees them."""
    name = gazette_prefix + "opts"
    client.create(name, NDJSON, replication=2, fragment_length=4096, compression="gzip",
                  flush_interval=120)
    out = gazette_cluster.gazctl("journals", "list", "-l", f"name={name}", "--format", "yaml")
    text = out.stdout.decode()
    assert "replication: 2" in text
    assert "length: 4096" in text
    assert "GZIP" in text
    assert "file:///" in text
    assert "flush_interval: 2m0s" in text
    # Idempotent for identical labels, whatever the other settings.
    assert client.create(name, NDJSON) == client.get(name)
    with pytest.raises(ValueError):
        client.create("abc", NDJSON)  # Gazette names have at least 4 bytes.


def test_bytes_written_by_gazctl_are_read_and_the_reverse(
    client: GazetteClient, gazette_cluster: Any, gazette_prefix: str
) -> None:
    """gazctl's appends read back byte for byte, and ours through gazctl."""
    name = gazette_prefix + "bytes"
    client.create(name, {"kind": "bytes"})  # raw bytes: no content-type
    blob = bytes(range(256)) * 300 + b"tail"
    gazette_cluster.gazctl("journals", "append", "-l", f"name={name}", input=blob)
    with client.read(name) as r:
        assert r.read() == blob
    ours = os.urandom(70000)
    res = client.append(name, ours).result(timeout=30)
    assert (res.begin, res.end) == (len(blob), len(blob) + len(ours))
    out = gazette_cluster.gazctl("journals", "read", "-l", f"name={name}")
    assert out.stdout == blob + ours


def test_pipelined_appends_land_whole_in_order(
    client: GazetteClient, gazette_prefix: str
) -> None:
    """Thousands of appends in flight: each future's offsets hold its bytes,
    in call order, and fewer RPCs than appends were needed."""
    name = gazette_prefix + "many"
    client.create(name, NDJSON)
    frames = [b'{"n": %d, "pad": "%s"}\n' % (i, b"x" * (i % 50)) for i in range(20000)]
    futures = [client.append(name, f) for f in frames]
    results = [f.result(timeout=60) for f in futures]
    assert [r.begin for r in results] == sorted(r.begin for r in results)
    with client.read(name) as r:
        content = r.read()
    for frame, res in zip(frames, results, strict=True):
        assert content[res.begin : res.end] == frame
    assert len(content) == sum(map(len, frames))
    assert client.head(name) == len(content)


def test_head_offset_since_and_fragments(client: GazetteClient, gazette_prefix: str) -> None:
    """head() is the write head; fragments() covers [0, head); offset_since
    finds recent appends and never the future."""
    name = gazette_prefix + "meta"
    client.create(name, NDJSON, fragment_length=1024)
    for i in range(100):
        client.append(name, b'{"i": %08d}\n' % i)
    client.flush(timeout=30)
    head = client.head(name)
    assert head == 100 * 16
    frags = client.fragments(name)
    assert frags[0].begin == 0 and frags[-1].end == head
    assert all(a.end == b.begin for a, b in itertools.pairwise(frags))
    assert client.offset_since(name, 0) == 0
    assert client.offset_since(name, time.time() + 60) == head


def _append_in_pieces(c: GazetteClient, name: str, count: int) -> list[bytes]:
    """``count`` 16-byte records, appended 64 at a time, each batch waited
    for: a broker closes a fragment only between Append RPCs, so 1 KiB
    fragments need appends that do not all go out as one RPC."""
    records = [b'{"i": %08d}\n' % i for i in range(count)]
    for i in range(0, count, 64):
        for rec in records[i : i + 64]:
            c.append(name, rec)
        c.flush(timeout=30)
    return records


def _wait_persisted(client: GazetteClient, name: str, count: int, timeout: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        persisted = [f for f in client.fragments(name) if f.sealed]
        if len(persisted) >= count:
            return persisted
        if time.monotonic() > deadline:
            raise AssertionError(f"fragments of {name} not persisted: {client.fragments(name)}")
        time.sleep(0.2)


def test_persisted_fragments_are_read_from_the_file_store(
    gazette_cluster: Any, gazette_prefix: str, tmp_path: Path
) -> None:
    """With file_root, persisted fragments are opened directly: a copy of
    the store with one byte changed shows the change, which no broker could."""
    name = gazette_prefix + "direct"
    # Brokers list the store each refresh interval: a short one, not to wait.
    with GazetteClient(gazette_cluster.address, refresh_interval=1) as c:
        c.create(name, NDJSON, fragment_length=1024)
        data = _append_in_pieces(c, name, 400)
        persisted = _wait_persisted(c, name, 2)
    content = b"".join(data)
    with GazetteClient(gazette_cluster.address, file_root=gazette_cluster.fragment_root) as c:
        with c.read(name) as r:
            assert r.read() == content
        # A copy of the store, one byte changed in the first persisted fragment.
        copy = tmp_path / "store"
        shutil.copytree(gazette_cluster.fragment_root, copy)
        first = persisted[0]
        assert first.path.startswith("file:///")  # No file_root: the store's URL.
        victim = copy / first.path[len("file:///") :]
        raw = bytearray(victim.read_bytes())
        raw[5] = ord("#")
        victim.write_bytes(bytes(raw))
    with GazetteClient(gazette_cluster.address, file_root=copy) as c, c.read(name) as r:
        got = r.read()
    assert got[first.begin + 5] == ord("#")
    assert got[: first.begin + 5] == content[: first.begin + 5]
    assert got[first.begin + 6 :] == content[first.begin + 6 :]


def test_fragments_the_client_cannot_open_are_read_through_brokers(
    gazette_cluster: Any, gazette_prefix: str, tmp_path: Path
) -> None:
    """A file_root without the fragments (another machine's mount point):
    the same bytes, read through the brokers."""
    name = gazette_prefix + "proxied"
    with GazetteClient(gazette_cluster.address, refresh_interval=1) as c:
        c.create(name, NDJSON, fragment_length=1024)
        data = b"".join(_append_in_pieces(c, name, 300))
        _wait_persisted(c, name, 1)
    with GazetteClient(gazette_cluster.address, file_root=tmp_path) as c, c.read(name) as r:
        assert r.read() == data


def test_trim_prunes_persisted_fragments(
    gazette_cluster: Any, gazette_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """trim() deletes persisted fragments from the file store (as gazctl
    journals prune); once brokers list the store again, readers jump over
    them with a warning. Without file_root it is one clear error."""
    name = gazette_prefix + "trim"
    with GazetteClient(gazette_cluster.address, refresh_interval=1) as c:
        c.create(name, NDJSON, fragment_length=1024)
        records = _append_in_pieces(c, name, 640)
        persisted = _wait_persisted(c, name, 3)
        with pytest.raises(BrokerError, match="gazctl journals prune") as info:
            c.trim(name, before_offset=persisted[1].end)
        assert info.value.status == "NOT_ALLOWED"
    content = b"".join(records)
    # The command line, as a user would trim (it opens the client with file_root).
    cli = [sys.executable, "-m", "exactly", "journals", "trim", name, "--before",
           str(persisted[1].end), "--broker", gazette_cluster.address]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--file-root DIR" in r.stderr, r.stderr
    r = subprocess.run([*cli, "--file-root", str(gazette_cluster.fragment_root)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first = persisted[2].begin
    assert r.stdout.splitlines() == [
        f"{name}: removed 2 fragments; first readable offset is now {first}"]
    with GazetteClient(
        gazette_cluster.address, file_root=gazette_cluster.fragment_root, refresh_interval=1
    ) as c:
        assert not os.path.exists(persisted[0].path) and not os.path.exists(persisted[1].path)
        assert c.head(name) == len(content)
        deadline = time.monotonic() + 30
        with caplog.at_level(logging.WARNING, logger="journal"):
            while True:
                with c.read(name, 0) as r:
                    got = r.read()
                    start = r.offset - len(got)
                if start == first or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        assert start == first
        assert got == content[first:]
        assert any("no longer available" in m for m in caplog.messages)


def test_blocking_reader_follows_appends_across_fragments(
    client: GazetteClient, gazette_prefix: str
) -> None:
    """A block=True reader delivers appends as they commit, across fragment rolls."""
    name = gazette_prefix + "follow"
    client.create(name, NDJSON, fragment_length=1024)
    got = bytearray()
    total = 200 * 16
    with client.read(name, 0, total, block=True) as r:

        def consume() -> None:
            while chunk := r.read(1000):
                got.extend(chunk)

        t = threading.Thread(target=consume)
        t.start()
        for i in range(200):
            client.append(name, b'{"i": %08d}\n' % i)
            if i % 50 == 0:
                time.sleep(0.05)
        t.join(30)
        assert not t.is_alive()
    assert bytes(got) == b"".join(b'{"i": %08d}\n' % i for i in range(200))


def test_publish_and_read_committed_over_the_cluster(
    client: GazetteClient, gazette_prefix: str
) -> None:
    """Publisher, transactions and ReadCommittedIter run unchanged on the cluster."""
    parts = [client.create(f"{gazette_prefix}part-{i}", NDJSON) for i in range(2)]
    mapping = modulo_mapping(lambda d: d["k"], lambda: parts)
    pub = Publisher(client)
    for i in range(50):
        pub.publish_committed(mapping, JsonDocument(k=str(i), v=i))
    for i in range(50, 60):
        pub.publish_uncommitted(mapping, JsonDocument(k=str(i), v=i))
    for intent in pub.build_ack_intents():
        client.append(intent.journal, intent.intent)
    for i in range(60, 70):
        pub.publish_uncommitted(mapping, JsonDocument(k=str(i), v=i))  # never acknowledged
    client.flush(timeout=30)
    seen = [
        env.message["v"]
        for p in parts
        for env in ReadCommittedIter(client, p.name, lambda _s: JsonDocument())
        if "v" in env.message
    ]
    assert sorted(seen) == list(range(60))
    raw = sum(
        1 for p in parts for _ in ReadUncommittedIter(client, p.name, lambda _s: JsonDocument())
    )
    assert raw == 70 + len(parts)  # every frame, the ACKs included


def test_checkpoint_resume_across_client_restart(gazette_cluster: Any, gazette_prefix: str) -> None:
    """A committed reader checkpointed mid-stream and resumed by a new
    client (a new process would do the same) loses and repeats nothing."""
    name = gazette_prefix + "ckpt"
    with GazetteClient(gazette_cluster.address) as c:
        spec = c.create(name, NDJSON)
        mapping = modulo_mapping(lambda d: d["k"], lambda: [spec])
        pubs = [Publisher(c) for _ in range(3)]
        expected = []
        for i in range(300):
            pub = pubs[i % 3]
            doc = JsonDocument(k=str(i), v=i)
            if i % 7 == 0:
                pub.publish_uncommitted(mapping, doc)
                if i % 2 == 0:
                    for intent in pub.build_ack_intents():
                        c.append(intent.journal, intent.intent)
                    expected.append(i)
                else:
                    for intent in pub.build_rollback_intents():
                        c.append(intent.journal, intent.intent)
            else:
                pub.publish_committed(mapping, doc)
                expected.append(i)
            if i % 25 == 24:
                # An append retried after its outcome was lost: its frame
                # lands a second time, before its producer appends again.
                c.flush(timeout=30)
                head = c.head(name)
                with c.read(name, max(0, head - 300)) as r:
                    tail = r.read()
                last = tail[tail.rfind(b"\n", 0, len(tail) - 1) + 1 :]
                c.append(name, last).result(timeout=30)
        c.flush(timeout=30)
        it = ReadCommittedIter(c, name, lambda _s: JsonDocument())
        first = []
        for env in it:
            if "v" in env.message:
                first.append(env.message["v"])
            if len(first) == 117:
                break
        ckpt = it.checkpoint().to_bytes()
        it.close()
    from message import Checkpoint

    with GazetteClient(gazette_cluster.address) as c:
        it = ReadCommittedIter(c, name, lambda _s: JsonDocument(),
                               checkpoint=Checkpoint.from_bytes(ckpt))
        rest = [env.message["v"] for env in it if "v" in env.message]
    assert sorted(first + rest) == sorted(expected)
    assert len(first + rest) == len(set(first + rest))


def test_deleted_journal_fails_queued_appends(client: GazetteClient, gazette_prefix: str) -> None:
    """After delete, appends fail with JournalNotFoundError; get raises too."""
    name = gazette_prefix + "gone"
    client.create(name, NDJSON)
    client.append(name, b"{}\n").result(timeout=30)
    client.delete(name)
    with pytest.raises(JournalNotFoundError):
        client.get(name)
    with pytest.raises(JournalNotFoundError):
        client.append(name, b"{}\n").result(timeout=30)


def test_failover_keeps_every_acknowledged_append(
    gazette_cluster: Any, gazette_prefix: str
) -> None:
    """SIGKILL the journal's primary broker while appends run (3 brokers,
    replication 2): every append whose future resolved is at its offsets in
    a later read through a surviving broker, no frame is torn, and appends
    resume without the caller doing anything."""
    name = gazette_prefix + "failover"
    with GazetteClient(gazette_cluster.address, replication=2, retry_timeout=120) as c:
        c.create(name, NDJSON)
        c.append(name, b'{"warm": true}\n').result(timeout=30)
        primary = c.route(name).primary_endpoint
        victim = gazette_cluster.addresses.index(primary)
        acked: list[tuple[bytes, Any]] = []
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                batch = []
                for _ in range(200):
                    frame = b'{"n": %d, "pad": "%s"}\n' % (i, b"p" * (i % 64))
                    batch.append((frame, c.append(name, frame)))
                    i += 1
                for frame, fut in batch:
                    with contextlib.suppress(JournalError):  # Failed: not acknowledged.
                        acked.append((frame, fut.result(timeout=120)))

        t = threading.Thread(target=produce)
        t.start()
        time.sleep(1.0)
        before = len(acked)
        gazette_cluster.kill_broker(victim)
        try:
            time.sleep(3.0)
            deadline = time.monotonic() + 60
            while len(acked) < before + 5000 and time.monotonic() < deadline:
                time.sleep(0.2)
            stop.set()
            t.join(180)
            assert not t.is_alive()
            assert len(acked) >= before + 5000, "appends did not resume after the failover"
            survivor = next(a for i, a in enumerate(gazette_cluster.addresses) if i != victim)
            with GazetteClient(survivor, retry_timeout=60) as rc, rc.read(name) as r:
                content = r.read()
            for frame, res in acked:
                assert content[res.begin : res.end] == frame
            for line in content.splitlines():
                orjson.loads(line)  # No torn frame anywhere.
        finally:
            stop.set()
            gazette_cluster.start_broker(victim)


def test_gazette_doc_example_runs(gazette_cluster: Any, tmp_path: Path) -> None:
    """docs/gazette.md's program runs against the embedded store and the
    cluster (BROKER_ADDRESS), printing the same pages for both."""
    import subprocess
    import sys

    blocks = code_blocks("docs/gazette.md")
    assert blocks
    for code in blocks:
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "BROKER_ADDRESS": gazette_cluster.address},
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        pages = "['/home', '/cart', '/pay']"
        assert f"embedded: {pages}" in r.stdout and f"cluster:  {pages}" in r.stdout


def run_python(script: str, *args: str) -> Any:
    """``script`` run by this interpreter in a process of its own, with the
    project importable; its CompletedProcess (output captured as bytes)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", script, *args],
                          env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, timeout=120)


_CRASHING_TXN = """
import os, signal, sys
from journal import GazetteClient
from message import IntentLog, JsonDocument, Publisher, modulo_mapping, write_intents

address, prefix, log_path, written = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = GazetteClient(address)
parts = [client.get(f"{prefix}part-{i}") for i in range(2)]
mapping = modulo_mapping(lambda d: d["k"], lambda: parts)
pub = Publisher(client)
for i in range(40):
    pub.publish_uncommitted(mapping, JsonDocument(k=str(i), v=i))
client.flush()
intents = pub.build_ack_intents()
log = IntentLog(log_path)
log.save(intents)                          # durable: the transaction is decided
write_intents(client, intents[:written])   # then the crash, part-way
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("written", [0, 1])
def test_transaction_intents_recovered_after_sigkill(
    gazette_cluster: Any, gazette_prefix: str, tmp_path: Path, written: int
) -> None:
    """A producer SIGKILLed after saving its ACK intents, having written none
    or one of them: IntentLog.recover on the cluster commits the whole
    transaction, each message read committed exactly once."""
    from message import IntentLog

    with GazetteClient(gazette_cluster.address) as c:
        for i in range(2):
            c.create(f"{gazette_prefix}part-{i}", NDJSON)
    log_path = tmp_path / "intents.json"
    r = run_python(_CRASHING_TXN, gazette_cluster.address, gazette_prefix,
                   str(log_path), str(written))
    assert r.returncode == -9, r.stderr.decode()
    parts = [f"{gazette_prefix}part-{i}" for i in range(2)]

    def committed(c: GazetteClient) -> list[int]:
        return sorted(
            env.message["v"]
            for p in parts
            for env in ReadCommittedIter(c, p, lambda _s: JsonDocument())
            if "v" in env.message
        )

    with GazetteClient(gazette_cluster.address) as c:
        if written == 0:
            assert committed(c) == []  # nothing acknowledged yet
        assert IntentLog(log_path).recover(c) == 2
        assert IntentLog(log_path).load() == []  # cleared
        assert committed(c) == list(range(40))


def test_transaction_pipeline_on_the_cluster_with_a_journal_intent_log(
    gazette_cluster: Any, gazette_prefix: str
) -> None:
    """Pipelined transactions through the brokers, their intents kept in a
    journal of the cluster: every transaction read committed whole, once,
    in the order they ended, and the log's journal gone once all are
    durable."""
    from message import JournalIntentLog, TransactionPipeline, modulo_mapping

    parts = [f"{gazette_prefix}part-{i}" for i in range(2)]
    with GazetteClient(gazette_cluster.address) as c:
        specs = [c.create(p, NDJSON) for p in parts]
        mapping = modulo_mapping(lambda d: f"{d['t']}/{d['i']}", lambda: specs)
        log = JournalIntentLog(c, f"{gazette_prefix}intents")
        with TransactionPipeline(c, log, in_flight=3) as pipeline:
            for t in range(40):
                with pipeline.transaction() as txn:
                    for i in range(1 + t % 7):
                        txn.publish(mapping, JsonDocument(t=t, i=i))
        assert log.load() == [] and not c.list(f"name={gazette_prefix}intents")
        per_part = [
            [(env.message["t"], env.message["i"])
             for env in ReadCommittedIter(c, p, lambda _s: JsonDocument()) if "t" in env.message]
            for p in parts
        ]
    expected = [(t, i) for t in range(40) for i in range(1 + t % 7)]
    assert sorted(m for msgs in per_part for m in msgs) == expected
    for msgs in per_part:
        assert [t for t, _ in msgs] == sorted(t for t, _ in msgs)


_FORGETFUL_PIPELINE = """
import sys
IMPORTS

address, prefix = sys.argv[1], sys.argv[2]
client = GazetteClient(address)
parts = [client.get(f"{prefix}part-{i}") for i in range(2)]
mapping = modulo_mapping(lambda d: f"{d['t']}/{d['i']}", lambda: parts)
pipeline = TransactionPipeline(client, JournalIntentLog(client, f"{prefix}intents"))
for t in range(20):
    with pipeline.transaction() as txn:
        for i in range(1 + t % 5):
            txn.publish(mapping, JsonDocument(t=t, i=i))
# exits without closing the pipeline or the client
"""


@pytest.mark.parametrize("message_first", [False, True], ids=["journal first", "message first"])
def test_transaction_pipeline_left_open_at_exit_on_the_cluster(
    gazette_cluster: Any, gazette_prefix: str, message_first: bool
) -> None:
    """A process that exits with its pipeline and its GazetteClient open:
    the pipeline is closed before the client (its last commits go through
    the client), whichever package the program imported first, so every
    transaction that ended is read committed, once."""
    with GazetteClient(gazette_cluster.address) as c:
        for i in range(2):
            c.create(f"{gazette_prefix}part-{i}", NDJSON)
    imports = [
        "from journal import GazetteClient",
        "from message import JournalIntentLog, JsonDocument, TransactionPipeline, modulo_mapping",
    ]
    script = _FORGETFUL_PIPELINE.replace(
        "IMPORTS", "\n".join(imports[::-1] if message_first else imports))
    r = run_python(script, gazette_cluster.address, gazette_prefix)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    with GazetteClient(gazette_cluster.address) as c:
        got = sorted(
            (env.message["t"], env.message["i"])
            for p in (f"{gazette_prefix}part-{i}" for i in range(2))
            for env in ReadCommittedIter(c, p, lambda _s: JsonDocument())
            if "t" in env.message
        )
        assert not c.list(f"name={gazette_prefix}intents")  # the last flush cleared the log
    assert got == [(t, i) for t in range(20) for i in range(1 + t % 5)]


_FORGETFUL_APPENDER = """
import sys
from journal import GazetteClient

client = GazetteClient(sys.argv[1])
for i in range(20_000):
    client.append(sys.argv[2], b'{"i": %d}\\n' % i)  # never waited for
# exits without flushing or closing the client
"""


def test_appends_still_queued_at_exit_are_written_to_the_cluster(
    gazette_cluster: Any, gazette_prefix: str
) -> None:
    """A program that exits with appends still queued and its client open:
    the client is closed at exit and every queued append reaches the
    brokers, in order, before the process ends."""
    name = f"{gazette_prefix}forgetful"
    with GazetteClient(gazette_cluster.address) as c:
        c.create(name, NDJSON)
    r = run_python(_FORGETFUL_APPENDER, gazette_cluster.address, name)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    with GazetteClient(gazette_cluster.address) as c, c.read(name) as reader:
        lines = reader.read().splitlines()
    assert lines == [b'{"i": %d}' % i for i in range(20_000)]


_FORKING_CLIENT = """
import os, sys
from journal import GazetteClient

client = GazetteClient(sys.argv[1])
name = sys.argv[2]
client.append(name, b'{"who": "parent", "i": 0}\\n').result()
pid = os.fork()
if pid == 0:
    # the child: the parent's client, its channels remade here
    for i in range(100):
        client.append(name, b'{"who": "child", "i": %d}\\n' % i)
    client.flush()
    with client.read(name) as r:
        print("child read", len(r.read().splitlines()), flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
for i in range(1, 101):
    client.append(name, b'{"who": "parent", "i": %d}\\n' % i)
client.flush()
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_forked_child_uses_the_parents_client(
    gazette_cluster: Any, gazette_prefix: str
) -> None:
    """A child made by fork appends and reads through the client its parent
    made (and used): its gRPC channels are made again in the child, and
    the parent's go on working after the child is gone."""
    name = f"{gazette_prefix}forked"
    with GazetteClient(gazette_cluster.address) as c:
        c.create(name, NDJSON)
    r = run_python(_FORKING_CLIENT, gazette_cluster.address, name)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    assert r.stdout.decode().split("\n")[:2] == ["child read 101", "child exit 0"], r.stdout
    with GazetteClient(gazette_cluster.address) as c, c.read(name) as reader:
        docs = [orjson.loads(line) for line in reader.read().splitlines()]
    assert [d["i"] for d in docs if d["who"] == "child"] == list(range(100))
    assert [d["i"] for d in docs if d["who"] == "parent"] == list(range(101))
