"""The ``exactly`` command line on a Gazette cluster (``--broker URL`` or
``BROKER_ADDRESS``), run as a user would: in subprocesses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from journal import GazetteClient
from message import JournalIntentLog, JsonDocument, Publisher

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, input: str | None = None, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("BROKER_ADDRESS", "EXACTLY_ROOT")}
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args], input=input, capture_output=True, text=True,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=cwd, timeout=120,
    )


def ok(*args: str, **kw: Any) -> str:
    r = run(*args, **kw)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_create_append_read_on_the_cluster(gazette_cluster: Any, gazette_prefix: str,
                                           tmp_path: Path) -> None:
    """create, append and read take --broker before or after the subcommand,
    or BROKER_ADDRESS; nothing is written to the working directory."""
    url = gazette_cluster.address
    name = f"{gazette_prefix}clicks"
    out = ok("--broker", url, "journals", "create", name, "--content-type", "ndjson", cwd=tmp_path)
    assert f"created {name}" in out
    out = ok("journals", "create", name, "--broker", url, cwd=tmp_path)
    assert "already exists" in out
    ok("append", name, "--broker", url, input='{"page": "/a"}\n{"page": "/b"}\n', cwd=tmp_path)
    ok("append", name, "--transaction", input='{"page": "/c"}\n', cwd=tmp_path,
       env={"BROKER_ADDRESS": url})
    lines = ok("read", name, "--committed", env={"BROKER_ADDRESS": url}, cwd=tmp_path)
    docs = [json.loads(line) for line in lines.splitlines()]
    assert [d["message"]["page"] for d in docs if d["flags"] != 2] == ["/a", "/b", "/c"]
    listed = ok("journals", "list", "--broker", url, "--selector", f"prefix={gazette_prefix}")
    assert name in listed
    assert list(tmp_path.iterdir()) == []  # no store directory made here


def test_create_takes_a_replication_and_refuses_bad_names_clearly(
    gazette_cluster: Any, gazette_prefix: str, tmp_path: Path
) -> None:
    """--replication sets the spec's (a cluster of fewer brokers than 3
    needs it); a name no journal can have is the store's one clear line,
    not the broker's selector error; --replication without --broker is a
    usage error."""
    url = gazette_cluster.address
    name = f"{gazette_prefix}one-copy"
    ok("journals", "create", name, "--replication", "1", "--broker", url, cwd=tmp_path)
    out = gazette_cluster.gazctl("journals", "list", "-l", f"name={name}", "--format", "yaml")
    assert "replication: 1" in out.stdout.decode()
    r = run("journals", "create", "bad name!", "--broker", url, cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "exactly: error: invalid journal name 'bad name!': only letters, digits and the"
        " symbols -_+/.=% are allowed"], r.stderr
    r = run("--root", str(tmp_path), "journals", "create", "x", "--replication", "2")
    # (an option that does not go with the store: a malformed command line, status 2)
    assert r.returncode == 2 and "--replication is for journals of a Gazette cluster" in r.stderr


def test_interrupted_transaction_is_finished_from_the_cluster(
    gazette_cluster: Any, gazette_prefix: str
) -> None:
    """A transaction whose intents were saved in the cluster but never
    written (its process died) is finished by the next `exactly append`,
    from any machine: the intent log is a journal of the cluster."""
    url = gazette_cluster.address
    name = f"{gazette_prefix}txn"
    with GazetteClient(url) as c:
        spec = c.create(name, {"content-type": "application/x-ndjson"})
        pub = Publisher(c)
        for i in range(3):
            pub.publish_uncommitted(lambda _m: (spec.name, spec.content_type or ""),
                                    JsonDocument(i=i))
        c.flush()
        JournalIntentLog(c, f".exactly/intents/{pub.producer_id.hex()}").save(
            pub.build_ack_intents())
    assert ok("read", name, "--committed", "--broker", url) == ""  # not committed yet
    r = run("append", name, "--broker", url, input='{"i": 3}\n')
    assert r.returncode == 0, r.stderr
    assert "finished an interrupted transaction" in r.stderr
    after = ok("read", name, "--committed", "--broker", url)
    docs = [json.loads(line) for line in after.splitlines()]
    assert [d["message"]["i"] for d in docs if d["flags"] != 2] == [0, 1, 2, 3]
    with GazetteClient(url) as c:
        assert c.list("prefix=.exactly/intents/") == []  # the log is gone once written


def test_fsck_reads_cluster_journals(gazette_cluster: Any, gazette_prefix: str) -> None:
    """fsck on a cluster checks what the client can see: every journal reads
    end to end and every frame decodes; a foreign frame is one line, status 1."""
    url = gazette_cluster.address
    good, bad = f"{gazette_prefix}good", f"{gazette_prefix}bad"
    ok("journals", "create", good, bad, "--broker", url)
    ok("append", good, "--broker", url, input='{"x": 1}\n')
    with GazetteClient(url) as c:
        c.append(bad, b"this is not json\n").result(timeout=30)
    r = run("fsck", good, "--broker", url)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("fsck", good, bad, "--broker", url)
    assert r.returncode == 1
    assert bad in r.stdout and good not in r.stdout


def test_cluster_errors_are_one_line(tmp_path: Path) -> None:
    """--root with --broker, a bad URL, and a cluster that does not answer:
    one `exactly: error:` line each, exit status 1 (2 for the first: a
    malformed command line)."""
    r = run("journals", "list", "--root", str(tmp_path), "--broker", "http://127.0.0.1:1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not both" in r.stderr
    r = run("journals", "list", "--broker", "127.0.0.1:8080")
    assert r.returncode == 1 and r.stderr.startswith("exactly: error:")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run("journals", "list", "--broker", f"http://127.0.0.1:{port}")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in r.stderr, r.stderr


@pytest.mark.parametrize("where", ["env", "flag"])
def test_root_still_wins_over_broker_address(tmp_path: Path, where: str) -> None:
    """A store directory named with --root or EXACTLY_ROOT is used even when
    BROKER_ADDRESS is set (for Gazette's own tools)."""
    env = {"BROKER_ADDRESS": "http://127.0.0.1:1"}
    args = ["journals", "create", "local/j"]
    if where == "env":
        env["EXACTLY_ROOT"] = str(tmp_path)
    else:
        args += ["--root", str(tmp_path)]
    assert "created local/j" in ok(*args, env=env)
    assert (tmp_path / "local" / "j").is_dir()
