"""``exactly shards apply|list|delete`` against a real etcd, and ``exactly
serve`` as a user runs it (docs/consumer.md, "Members on several hosts");
files of shard specs as ``consumer.read_spec_file`` reads them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer import (
    Claim,
    GroupView,
    MemberInfo,
    ShardGroup,
    ShardSpec,
    SpecFileError,
    read_spec_file,
)
from tests.docblocks import code_blocks

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, input: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 60, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exactly", *args], input=input,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})


@contextlib.contextmanager
def serving(args: list[str], *, cwd: Path, env: dict[str, str],
            log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """An `exactly` process with ``args``, its output in ``log``; killed
    (by PID) if still running when the block ends."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exactly", *args], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(done: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path,
             timeout: float = 60) -> None:
    """Until ``done()``, while ``proc`` runs (its log is the failure's message)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


# -- spec files ---------------------------------------------------------------------


def test_a_spec_file_with_common_values_durations_and_deletes(tmp_path: Path) -> None:
    path = tmp_path / "shards.yaml"
    path.write_text(
        "common:\n  max_txn_duration: 1m30s\n"
        "shards:\n"
        "  - id: a\n    sources: [words-1]\n"
        "  - id: b\n    sources: [words-2, words-3]\n    max_txn_duration: 250ms\n"
        "    min_txn_duration: .1\n"
        "  - id: gone\n    delete: true\n")
    specs, deletes = read_spec_file(path)
    assert specs == [ShardSpec("a", ["words-1"], max_txn_duration=90.0),
                     ShardSpec("b", ["words-2", "words-3"], 0.25, 0.1)]
    assert deletes == ["gone"]
    # JSON is YAML too, and a bare list is a list of shards.
    specs, _ = read_spec_file("x.json", json.dumps([{"id": "c", "sources": ["j-01"]}]))
    assert specs == [ShardSpec("c", ["j-01"])]


@pytest.mark.parametrize(("text", "says"), [
    ("shards: [{id: a, sources: [words]}, {id: a, sources: [words]}]", "given twice"),
    ("shards: [{id: a}]", "needs an id and its sources"),
    ("shards: [{id: a, sources: words}]", "list of journal names"),
    ("shards: [{id: a, sources: [words], max_txn_duration: soon}]", "not a number of seconds"),
    ("shards: [{id: a, sources: [words], colour: red}]", "unknown field 'colour'"),
    ("shards: [{id: 'a b', sources: [words]}]", "shard id"),
    ("shards: {a: 1}", "list of 'shards'"),
    ("shard: []", "list of 'shards'"),
    ("shards: []\nextra: 1", "unknown field 'extra'"),
    ("shards: [1]", "expected a mapping"),
    ("shards: [{delete: true}]", "delete needs the shard's id"),
    ("{ not yaml", "not YAML or JSON"),
])
def test_a_bad_spec_file_says_where_and_why(text: str, says: str) -> None:
    with pytest.raises(SpecFileError, match=r"specs\.yaml") as err:
        read_spec_file("specs.yaml", text)
    assert says in str(err.value)


def test_quotas_share_evenly_the_first_members_take_the_rest() -> None:
    assert ShardGroup.quotas(["b", "a", "c"], 12) == {"a": 4, "b": 4, "c": 4}
    assert ShardGroup.quotas(["b", "a", "c"], 7) == {"a": 3, "b": 2, "c": 2}
    assert ShardGroup.quotas(["a"], 0) == {"a": 0}
    assert ShardGroup.quotas([], 5) == {}
    assert sum(ShardGroup.quotas([f"m{i}" for i in range(5)], 23).values()) == 23


def test_a_view_counts_the_claims_of_live_members_only() -> None:
    members = {m: MemberInfo(m, "h", 1, 7) for m in ("a", "b")}
    claims = {s: Claim(s, m, "h", 1, 7) for s, m in (("s1", "a"), ("s2", "a"), ("s3", "gone"))}
    view = GroupView(1, {}, members, claims, {}, [])
    assert view.held() == {"a": 2, "b": 0}


# -- the commands, against etcd ---------------------------------------------------


@pytest.fixture
def etcd(gazette_cluster: Any) -> dict[str, str]:
    """The environment naming the cluster's etcd and a prefix of this test."""
    return {"ETCD_ADDRESS": gazette_cluster.etcd_address,
            "EXACTLY_ETCD_PREFIX": f"/t/{secrets.token_hex(4)}"}


def test_apply_list_delete(etcd: dict[str, str], tmp_path: Path) -> None:
    specs = tmp_path / "shards.yaml"
    specs.write_text("shards:\n  - {id: count-1, sources: [words-1]}\n"
                     "  - {id: count-2, sources: [words-2]}\n")
    r = run("shards", "apply", str(specs), env=etcd)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["count-1: created", "count-2: created"]
    assert run("shards", "apply", str(specs), env=etcd).stdout.splitlines() == [
        "count-1: unchanged", "count-2: unchanged"]
    r = run("shards", "apply", "-", env=etcd,
            input="shards: [{id: count-2, sources: [words-2, words-3]}, {id: count-1,"
                  " delete: true}]")
    assert r.stdout.splitlines() == ["count-2: updated", "count-1: deleted"], r.stderr
    listed = run("shards", "list", env=etcd)
    assert "1 shard, 0 live members" in listed.stdout
    assert "count-2  -- not claimed --" in listed.stdout and "words-2, words-3" in listed.stdout
    doc = json.loads(run("shards", "list", "--json", env=etcd).stdout)
    assert [(s["id"], s["sources"], s["member"]) for s in doc["shards"]] == [
        ("count-2", ["words-2", "words-3"], None)]
    r = run("shards", "delete", "count-2", "nothing", env=etcd)
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["count-2: deleted", "nothing: no such shard"]
    assert json.loads(run("shards", "list", "--json", env=etcd).stdout)["shards"] == []
    assert "shard 1 (x)" in run("shards", "apply", "-", input="shards: [{id: x}]",
                                env=etcd).stderr
    assert run("shards", "apply", "--dry-run", str(specs)).stdout.startswith(
        f"{specs}: 2 shards to apply")


def test_errors_are_one_line(tmp_path: Path) -> None:
    no_etcd = {"ETCD_ADDRESS": ""}
    for args, says in [
        (("shards", "list"), "name etcd: --etcd URL"),
        (("shards", "list", "--etcd", "http://127.0.0.1:9"), "not reachable"),
        (("shards", "list", "--etcd", "127.0.0.1:2379"), "http://HOST:PORT"),
        (("shards", "list", "--etcd", "http://127.0.0.1:9", "--etcd-prefix", "rel"),
         "give a path"),
        (("shards", "apply", str(tmp_path / "none.yaml")), "No such file"),
        (("serve", "no.such.module:App", "--etcd", "http://127.0.0.1:9"), "cannot import"),
        (("serve", "json:dumps", "--etcd", "http://127.0.0.1:9"), "json:dumps() failed"),
        (("serve", "json:__name__", "--etcd", "http://127.0.0.1:9"),
         "nor makes one"),
        (("serve", "json:JSONEncoder", "--etcd", "http://127.0.0.1:9"),
         "not a consumer.Application"),
        (("serve", "json", "--etcd", "http://127.0.0.1:9"), "MODULE:APP"),
        (("serve", "exactly.benchmarks.bench_members:BenchApp", "--etcd",
          "http://127.0.0.1:9"), "not reachable"),
        (("serve", "exactly.benchmarks.bench_members:BenchApp", "--etcd", "foo"),
         "http://HOST:PORT"),
    ]:
        began = time.monotonic()
        r = run(*args, env=no_etcd)
        # A malformed command line (no etcd named, an address or a prefix
        # that cannot be one, no MODULE:APP) ends with status 2.
        malformed = {"name etcd: --etcd URL", "http://HOST:PORT", "give a path", "MODULE:APP"}
        assert r.returncode == (2 if says in malformed else 1), (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("exactly: error:"), (args, r.stderr)
        assert says in lines[0], (args, lines[0])
        assert time.monotonic() - began < 30
    for ttl, says in (("0", "at least 2 s"), ("1.5", "not a whole number")):
        r = run("serve", "json:dumps", "--etcd", "http://127.0.0.1:9", "--lease-ttl", ttl)
        assert r.returncode == 2 and says in r.stderr, r.stderr


def test_serve_claims_serves_and_gives_all_up_on_sigterm(
        etcd: dict[str, str], tmp_path: Path) -> None:
    """`exactly serve` on the embedded store: it joins, claims both shards,
    processes the input exactly once, logs what it claims, and on SIGTERM
    commits, gives up its claims and leaves the group, exiting 0."""
    root = tmp_path / "journals"
    words = [("in-1", "a"), ("in-2", "b"), ("in-1", "c")]
    r = run("--root", str(root), "journals", "create", "in-1", "in-2", "out-1")
    assert r.returncode == 0, r.stderr
    for journal, word in words:
        r = run("--root", str(root), "append", journal, input=json.dumps({"k": word, "n": 1}))
        assert r.returncode == 0, r.stderr
    run("shards", "apply", "-", env=etcd, input=(
        "shards: [{id: s1, sources: [in-1]}, {id: s2, sources: [in-2]}]"))
    config = {"store": f"sqlite:{tmp_path}/{{shard}}.db",
              "outputs": {"s1": ["out-1"], "s2": ["out-1"]}}
    env = {**os.environ, **etcd, "PYTHONPATH": str(ROOT),
           "EXACTLY_TEST_MEMBER": json.dumps(config)}
    log = tmp_path / "serve.log"
    with serving(["--root", str(root), "serve", "tests.member_app:MemberApp", "--member-id",
                  "solo", "--lease-ttl", "3", "--metrics", "0"], cwd=ROOT, env=env,
                 log=log) as proc:
        wait_for(lambda: log.read_text().count("committing") >= 2, proc, log)
        doc = json.loads(run("shards", "list", "--json", env=etcd).stdout)
        assert [(s["id"], s["member"]) for s in doc["shards"]] == [("s1", "solo"),
                                                                    ("s2", "solo")]
        assert [(m["id"], m["shards"], m["share"]) for m in doc["members"]] == [("solo", 2, 2)]
        # --metrics: its shards' commits and lag, at the address it logged.
        found = re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", log.read_text())
        assert found, log.read_text()

        def scraped() -> bool:  # (the log says "committing" just before a commit)
            page = urllib.request.urlopen(found.group(1), timeout=10).read().decode()
            return bool(re.search(r'^exactly_consumer_transactions_total\{shard="s1"\} [1-9]',
                                  page, re.M)) and \
                'exactly_consumer_source_lag_bytes{journal="in-2",shard="s2"} 0.0' in page

        wait_for(scraped, proc, log, timeout=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    text = log.read_text()
    assert "claimed shard s1" in text and "claimed shard s2" in text
    assert "stopping (SIGTERM)" in text and "left" in text
    doc = json.loads(run("shards", "list", "--json", env=etcd).stdout)
    assert doc["members"] == [] and all(s["member"] is None for s in doc["shards"])
    out = run("--root", str(root), "read", "out-1", "--committed")
    got = sorted(json.loads(line)["message"]["k"] for line in out.stdout.splitlines()
                 if "k" in json.loads(line)["message"])
    assert got == ["a", "b", "c"]


def _doc_block(lang: str, marker: str) -> str:
    """The one ``lang`` block of docs/consumer.md that holds ``marker``."""
    blocks = [b for b in code_blocks("docs/consumer.md", lang) if marker in b]
    assert len(blocks) == 1, marker
    return blocks[0]


def test_the_docs_serving_walkthrough_runs_as_written(
        etcd: dict[str, str], tmp_path: Path) -> None:
    """docs/consumer.md's "Members on several hosts", on the embedded store:
    its wordcount.py served by `exactly serve` with its shards.yaml counts
    each partition's words once, in each shard's table, and `exactly shards
    show` reads a shard's store as the doc shows."""
    import sqlite3
    from collections import Counter

    (tmp_path / "wordcount.py").write_text(_doc_block("python", "# wordcount.py"))
    (tmp_path / "shards.yaml").write_text(_doc_block("yaml", "count-1"))
    root = str(tmp_path / "journals")
    r = run("--root", root, "journals", "create", "lines/part-0", "lines/part-1", "counts")
    assert r.returncode == 0, r.stderr
    r = run("shards", "apply", str(tmp_path / "shards.yaml"), env=etcd)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["count-1: created", "count-2: created"]
    texts = {0: ["the cat sat", "a cat"], 1: ["the dog sat", "the end"]}
    for part, lines in texts.items():
        r = run("--root", root, "append", f"lines/part-{part}",
                input="".join(json.dumps({"text": t}) + "\n" for t in lines))
        assert r.returncode == 0, r.stderr
    expected = {f"count-{p + 1}": Counter(" ".join(t).split()) for p, t in texts.items()}
    env = {**os.environ, **etcd, "PYTHONPATH": str(ROOT),
           "WORDCOUNT_STATE": str(tmp_path / "state")}
    log = tmp_path / "serve.log"

    def counts(shard: str) -> Counter[str]:
        path = tmp_path / "state" / f"{shard}.db"
        if not path.exists():
            return Counter()
        with sqlite3.connect(path) as db:
            try:
                return Counter(dict(db.execute("SELECT word, n FROM words")))
            except sqlite3.OperationalError:  # not made yet
                return Counter()

    with serving(["--root", root, "serve", "wordcount:WordCount", "--lease-ttl", "3"],
                 cwd=tmp_path, env=env, log=log) as proc:
        wait_for(lambda: all(counts(shard) == want for shard, want in expected.items()),
                 proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    for shard, want in expected.items():
        assert counts(shard) == want
    shown = run("shards", "show", "--store", "state/count-1.db", "--root", "journals", "--json",
                cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["shard"] == "count-1"
    assert [(s["journal"], s["lag"]) for s in doc["sources"]] == [("lines/part-0", 0)], doc


@pytest.fixture
def tls_etcd(gazette_binaries: Any, tmp_path: Path) -> Any:
    """An etcd on 127.0.0.1 serving TLS and asking clients for a certificate
    signed by a throwaway CA: yields (address, ClusterSecurity)."""
    import socket

    from exactly.localcluster import ClusterSecurity

    sec = ClusterSecurity.generate(tmp_path / "tls", mutual=True, auth=False)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    client_url, peer_url = (f"https://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
    with open(tmp_path / "etcd.log", "wb") as log:
        proc = subprocess.Popen(
            [str(gazette_binaries.etcd), "--data-dir", str(tmp_path / "etcd"),
             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"default={peer_url}",
             "--cert-file", str(sec.server_cert_file), "--key-file", str(sec.server_key_file),
             "--client-cert-auth", "--trusted-ca-file", str(sec.ca_file)],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            r = run("shards", "list", "--etcd", client_url, "--etcd-trusted-ca-file",
                    str(sec.ca_file), "--etcd-cert-file", str(sec.client_cert_file),
                    "--etcd-cert-key-file", str(sec.client_key_file))
            if r.returncode == 0:
                break
            assert proc.poll() is None, (tmp_path / "etcd.log").read_text()
            assert time.monotonic() < deadline, r.stderr
            time.sleep(0.3)
        yield client_url, sec
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_an_etcd_that_serves_tls_and_asks_for_a_certificate(tls_etcd: Any) -> None:
    """With the CA and a client certificate (options or $ETCD_* variables)
    the shards are applied and listed; without them, one clear line."""
    url, sec = tls_etcd
    tls = {"ETCD_ADDRESS": url, "ETCD_TRUSTED_CA_FILE": str(sec.ca_file),
           "ETCD_CERT_FILE": str(sec.client_cert_file),
           "ETCD_CERT_KEY_FILE": str(sec.client_key_file)}
    r = run("shards", "apply", "-", input="shards: [{id: s, sources: [words]}]", env=tls)
    assert r.returncode == 0 and r.stdout == "s: created\n", r.stderr
    doc = json.loads(run("shards", "list", "--json", env=tls).stdout)
    assert [s["id"] for s in doc["shards"]] == ["s"]
    no_cert = {**tls, "ETCD_CERT_FILE": "", "ETCD_CERT_KEY_FILE": ""}
    no_ca = {**tls, "ETCD_TRUSTED_CA_FILE": ""}
    for env in (no_cert, no_ca):
        began = time.monotonic()
        r = run("shards", "list", env=env)
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"exactly: error: etcd at {url}"), lines
        assert time.monotonic() - began < 30


def test_empty_values_are_malformed_not_the_default() -> None:
    """An empty --etcd-prefix (an unset $PREFIX in a script) would have
    meant the default group, changed silently; an empty --member-id or
    --host a made-up one. Each is a malformed command line: one line, 2."""
    etcd = ("--etcd", "http://127.0.0.1:9")
    for args in (("shards", "list", *etcd, "--etcd-prefix", ""),
                 ("shards", "apply", "-", *etcd, "--etcd-prefix", ""),
                 ("serve", "x:y", *etcd, "--member-id", ""),
                 ("serve", "x:y", *etcd, "--host", " ")):
        r = run(*args, input="shards: []")
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "cannot be empty" in r.stderr
