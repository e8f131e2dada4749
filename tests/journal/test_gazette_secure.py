"""A secured Gazette cluster (docs/gazette.md): TLS with a throwaway CA, mutual TLS
and ``--broker.auth-keys``. Every journal operation works with the right
options, given or from the environment; without them, or with wrong ones,
one clear BrokerAuthError comes at once; an address where no broker answers
fails within connect_timeout; a blocking read outlives its token."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from journal import (
    BrokerAuthError,
    BrokerUnavailableError,
    GazetteClient,
    JournalNotFoundError,
)
from message import Checkpoint, JsonDocument, Publisher, ReadCommittedIter, modulo_mapping

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"secure/{name}-{secrets.token_hex(3)}/"


def client(cluster: Any, **override: Any) -> GazetteClient:
    return GazetteClient(cluster.address, replication=1,
                         **{**cluster.client_options(), **override})


def test_every_journal_operation_works_with_the_right_options(
        gazette_secure_cluster: Any, prefix: str) -> None:
    """create, list, get, append, read (and following), head, fragments,
    delete: all through TLS, a client certificate and signed authorizations."""
    c = gazette_secure_cluster
    assert c.address.startswith("https://")
    name = f"{prefix}ops"
    with client(c) as g:
        spec = g.create(name, NDJSON)
        assert [s.name for s in g.list(f"prefix={prefix}")] == [name]
        assert g.get(name) == spec
        res = g.append(name, b'{"n": 1}\n').result(timeout=30)
        assert (res.begin, res.end) == (0, 9) and g.head(name) == 9
        with g.read(name) as r:
            assert r.read() == b'{"n": 1}\n'
        got: list[bytes] = []
        with g.read(name, 9, block=True) as r:
            t = threading.Thread(target=lambda: got.append(r.read(9)))
            t.start()
            g.append(name, b'{"n": 2}\n').result(timeout=30)
            t.join(30)
        assert got == [b'{"n": 2}\n']
        assert g.fragments(name)
        g.delete(name)
        with pytest.raises(JournalNotFoundError):
            g.get(name)


def test_publisher_and_committed_reads_with_checkpoints(
        gazette_secure_cluster: Any, prefix: str) -> None:
    """A transaction published through the secured cluster is read committed
    once, across a checkpoint."""
    c = gazette_secure_cluster
    with client(c) as g:
        spec = g.create(f"{prefix}clicks", NDJSON)
        mapping = modulo_mapping(lambda d: d["n"], lambda: [spec])
        pub = Publisher(g)
        for n in range(10):
            pub.publish_uncommitted(mapping, JsonDocument(n=n))
        for intent in pub.build_ack_intents():
            g.append(intent.journal, intent.intent).result(timeout=30)
        it = ReadCommittedIter(g, spec.name, lambda s: JsonDocument())
        first = [next(it).message["n"] for _ in range(4)]
        cp = Checkpoint.from_bytes(it.checkpoint().to_bytes())
        it.close()
        rest = [e.message["n"] for e in
                ReadCommittedIter(g, spec.name, lambda s: JsonDocument(), checkpoint=cp)
                if "n" in e.message]
    assert first + rest == list(range(10))


def test_options_come_from_the_environment_as_gazctl_reads_them(
        gazette_secure_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Left out, each option is read from BROKER_TRUSTED_CA_FILE,
    BROKER_CERT_FILE, BROKER_CERT_KEY_FILE and BROKER_AUTH_KEYS; an option
    given overrides its variable."""
    c = gazette_secure_cluster
    for name, value in c.security.client_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("BROKER_ADDRESS", c.address)
    with GazetteClient() as g:
        g.list()
    with GazetteClient(auth_keys=base64.b64encode(b"k" * 32).decode()) as g, \
            pytest.raises(BrokerAuthError):
        g.list()
    # An empty option means none, whatever its variable says.
    for empty in ({"auth_keys": ""}, {"cert_file": "", "cert_key_file": ""}):
        with GazetteClient(**empty) as g, pytest.raises(BrokerAuthError):
            g.list()


@pytest.mark.parametrize(("what", "override", "says"), [
    ("no authorization", {"auth_keys": None}, "auth_keys"),
    ("a wrong key", {"auth_keys": base64.b64encode(b"w" * 32).decode()}, "auth_keys"),
    ("no trusted CA", {"trusted_ca_file": None}, "trusted_ca_file"),
    ("no client certificate", {"cert_file": None, "cert_key_file": None}, "cert_file"),
])
def test_refused_credentials_are_one_clear_error_at_once(
        gazette_secure_cluster: Any, monkeypatch: pytest.MonkeyPatch,
        what: str, override: dict[str, Any], says: str) -> None:
    """Missing or wrong credentials, or a certificate that does not verify:
    one BrokerAuthError naming the address and what to check, within
    seconds, never retried as if transient."""
    for name in ("BROKER_TRUSTED_CA_FILE", "BROKER_CERT_FILE", "BROKER_CERT_KEY_FILE",
                 "BROKER_AUTH_KEYS"):
        monkeypatch.delenv(name, raising=False)
    c = gazette_secure_cluster
    started = time.monotonic()
    with client(c, **override) as g, pytest.raises(BrokerAuthError) as info:
        g.list()
    assert time.monotonic() - started < 3.0, what
    assert c.address in str(info.value) and info.value.address == c.address
    assert says in str(info.value)
    # An append or a read refused says that it was the append or the read.
    with client(c, **override) as g:
        with pytest.raises(BrokerAuthError, match=r"^append to 'any/journal'"):
            g.append("any/journal", b"{}\n")
        with pytest.raises(BrokerAuthError, match=r"^read 'any/journal'"):
            g.read("any/journal")


def test_a_client_certificate_of_another_ca_is_said_to_be_refused(
        gazette_secure_cluster: Any, tmp_path: Path) -> None:
    """Mutual TLS with a client certificate that no CA of the brokers
    signed: one BrokerAuthError at once, saying the certificate given was
    refused (not asking for one)."""
    from exactly.localcluster import ClusterSecurity

    other = ClusterSecurity.generate(tmp_path / "other", mutual=True)
    c = gazette_secure_cluster
    started = time.monotonic()
    with client(c, cert_file=str(other.client_cert_file),
                cert_key_file=str(other.client_key_file)) as g, \
            pytest.raises(BrokerAuthError) as info:
        g.list()
    assert time.monotonic() - started < 3.0
    assert c.address in str(info.value)
    assert "signed by a CA the brokers trust" in str(info.value), str(info.value)


def test_plain_text_to_a_tls_broker_fails_within_connect_timeout(
        gazette_secure_cluster: Any) -> None:
    """http:// to a TLS broker: no broker ever answers; the error comes within
    connect_timeout and says it may be a TLS broker."""
    c = gazette_secure_cluster
    started = time.monotonic()
    with GazetteClient(c.address.replace("https://", "http://"), connect_timeout=1.0) as g, \
            pytest.raises(BrokerUnavailableError) as info:
        g.list()
    assert time.monotonic() - started < 4.0
    assert "https://" in str(info.value)


def test_an_address_where_nothing_listens_fails_within_connect_timeout() -> None:
    """A port where nothing listens: one clear error naming the address after
    connect_timeout, not after retry_timeout."""
    from exactly._procs import free_ports

    address = f"http://127.0.0.1:{free_ports(1)[0]}"
    started = time.monotonic()
    with GazetteClient(address, connect_timeout=1.0, retry_timeout=60) as g, \
            pytest.raises(BrokerUnavailableError) as info:
        g.list()
    assert time.monotonic() - started < 4.0
    assert address in str(info.value) and "within 1 s" in str(info.value)
    # Each operation says what it was doing: create its journal (its first
    # request asks the brokers for their fragment store).
    with GazetteClient(address, connect_timeout=0.5) as g, \
            pytest.raises(BrokerUnavailableError, match=r"^create made/here: "):
        g.create("made/here", {"content-type": "application/x-ndjson"})


def test_a_blocking_read_outlives_its_token(gazette_secure_cluster: Any, prefix: str) -> None:
    """Tokens of two seconds: a following read that lasts several still
    delivers what is appended after its first token expired."""
    c = gazette_secure_cluster
    name = f"{prefix}long"
    with client(c, auth_token_ttl=2.0) as g:
        g.create(name, NDJSON)
        got: list[bytes] = []

        def follow() -> None:
            with g.read(name, 0, block=True) as r:
                while sum(map(len, got)) < 18:
                    got.append(r.read(18))

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        g.append(name, b'{"n": 1}\n').result(timeout=30)
        time.sleep(4.5)  # past the reader's first token, and the broker's 5 s leeway
        g.append(name, b'{"n": 2}\n').result(timeout=30)
        t.join(30)
        assert not t.is_alive()
    assert b"".join(got) == b'{"n": 1}\n{"n": 2}\n'


def test_the_command_line_takes_the_same_options(
        gazette_secure_cluster: Any, prefix: str, tmp_path: Path) -> None:
    """--trusted-ca-file, --cert-file, --cert-key-file and --auth-keys with
    --broker; without them, one error line, exit 1, within seconds."""
    c = gazette_secure_cluster
    sec = c.security
    flags = ["--broker", c.address, "--trusted-ca-file", str(sec.ca_file),
             "--cert-file", str(sec.client_cert_file), "--cert-key-file",
             str(sec.client_key_file), "--auth-keys", sec.auth_keys]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "exactly", *args], capture_output=True,
                              text=True, timeout=60, env=env, cwd=tmp_path)

    name = f"{prefix}cli"
    with client(c) as g:  # replication 1: the cluster has two brokers, not the CLI's three
        g.create(name, NDJSON)
    r = run("journals", "list", *flags)
    assert r.returncode == 0 and name in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "exactly", "append", name, *flags],
                       input='{"page": "/a"}\n', capture_output=True, text=True, timeout=60,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("read", name, *flags)
    assert r.returncode == 0 and '"/a"' in r.stdout, r.stderr
    started = time.monotonic()
    r = run("journals", "list", "--broker", c.address, "--trusted-ca-file", str(sec.ca_file))
    assert r.returncode == 1 and time.monotonic() - started < 20
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("exactly: error:"), r.stderr
    assert c.address in lines[0]
    # What to give, as the command line takes it.
    assert "give --cert-file and --cert-key-file" in lines[0], lines[0]
    # Settings the client refuses are said in the command line's words: the
    # flag given, or the variable a setting came from.
    r = run("journals", "list", "--broker", c.address, "--trusted-ca-file", "nope.pem")
    assert r.stderr.splitlines() == [
        "exactly: error: --trusted-ca-file 'nope.pem': No such file or directory"], r.stderr
    r = run("journals", "list", "--broker", c.address, "--cert-file", str(sec.client_cert_file))
    assert "give --cert-file and --cert-key-file together" in r.stderr, r.stderr
    env["BROKER_AUTH_KEYS"] = "not base64!"
    r = run("journals", "list", "--broker", c.address)
    assert r.returncode == 1 and r.stderr.startswith("exactly: error: BROKER_AUTH_KEYS:"), r.stderr


_FORKED_SECURE_CLIENT = """
import os, sys
from journal import GazetteClient

address, ca, cert, key, keys, name = sys.argv[1:]
client = GazetteClient(address, trusted_ca_file=ca, cert_file=cert, cert_key_file=key,
                       auth_keys=keys, connect_timeout=1.5, replication=1)
client.append(name, b'{"who": "parent"}\\n').result(timeout=30)
pid = os.fork()
if pid == 0:
    try:
        client.append(name, b'{"who": "child"}\\n').result(timeout=30)
        with client.read(name) as r:
            print("child read", len(r.read().splitlines()), flush=True)
    except Exception as exc:
        print("child failed:", type(exc).__name__, exc, flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_forked_child_keeps_the_clients_tls_and_credentials(
        gazette_secure_cluster: Any, prefix: str) -> None:
    """A child made by fork (multiprocessing's default here) uses the
    client its parent made: its channels are made again there with the
    same TLS settings, client certificate and keys (Brokers.afresh, which
    keeps the timeouts too), not from the environment (empty here)."""
    c = gazette_secure_cluster
    sec = c.security
    name = f"{prefix}forked"
    with client(c) as g:
        g.create(name, NDJSON)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-c", _FORKED_SECURE_CLIENT, c.address, str(sec.ca_file),
         str(sec.client_cert_file), str(sec.client_key_file), sec.auth_keys, name],
        env={**env, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=120)
    assert r.stdout.splitlines() == [
        "child read 2", "child exit 0"], (r.stdout, r.stderr)
