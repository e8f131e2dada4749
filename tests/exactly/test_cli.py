"""The ``exactly`` command line, run as a user would: in subprocesses.

The command line of docs/cli.md is checked here: the subcommands --help lists, journal
administration, append, read (uncommitted, committed, follow), the demo, and
one-line errors without a traceback (user mistakes exit 1, usage mistakes 2).
test_cli_gazette.py checks ``--broker`` (docs/gazette.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def run(root: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactly", "--root", str(root), *args],
        input=input, capture_output=True, text=True, timeout=60,
    )


def ok(root: Path, *args: str, input: str | None = None) -> str:
    r = run(root, *args, input=input)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_help_lists_subcommands(tmp_path: Path) -> None:
    """--help names every subcommand, run as the installed console script."""
    script = Path(sys.executable).parent / "exactly"
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for cmd in ("journals", "append", "read", "inspect", "demo", "bench"):
        assert cmd in r.stdout


def test_create_append_read_inspect(tmp_path: Path) -> None:
    """Create journals, append JSON lines, read them back committed with metadata."""
    root = tmp_path / "store"
    assert "created clicks/a" in ok(root, "journals", "create", "clicks/a", "clicks/b",
                                    "-l", "topic=clicks")
    listed = ok(root, "journals", "list", "--selector", "topic=clicks")
    assert "clicks/a" in listed and "clicks/b" in listed
    ok(root, "append", "clicks/a", input='{"page": "/a"}\n{"page": "/b"}\n\n')
    lines = [json.loads(x) for x in ok(root, "read", "clicks/a").splitlines()]
    assert [d["message"]["page"] for d in lines] == ["/a", "/b"]
    assert lines[0]["begin"] == 0 and lines[0]["end"] == lines[1]["begin"]
    assert lines[0]["flags"] == 0 and len(lines[0]["producer"]) == 12
    assert lines[0]["uuid"] == lines[0]["message"]["_meta"]["uuid"]
    assert len(ok(root, "read", "clicks/a", "--limit", "1").splitlines()) == 1
    inspected = ok(root, "inspect", "clicks/a")
    assert "2 frames, 2 committed" in inspected


def test_transaction_append_and_uncommitted_read(tmp_path: Path) -> None:
    """append --transaction writes CONTINUE_TXN messages and one ACK; all commit."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "t/j")
    ok(root, "append", "t/j", "--transaction", input='{"n": 1}\n{"n": 2}\n')
    flags = [json.loads(x)["flags"] for x in ok(root, "read", "t/j", "--uncommitted").splitlines()]
    assert flags == [1, 1, 2]
    committed = [json.loads(x)["message"] for x in ok(root, "read", "t/j").splitlines()]
    assert [m.get("n") for m in committed] == [1, 2, None]
    assert ok(root, "read", "t/j", "--committed") == ok(root, "read", "t/j")


def test_follow_prints_new_messages_promptly(tmp_path: Path) -> None:
    """read --follow prints a message appended after it started."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "f/j")
    proc = subprocess.Popen(
        [sys.executable, "-m", "exactly", "--root", str(root), "read", "f/j", "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(1.0)
        ok(root, "append", "f/j", input='{"hello": "world"}\n')
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(line)["message"]["hello"] == "world"
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        (("read", "no/such"), None, "no/such"),
        (("append", "j/x"), "not json\n", "line 1"),
        (("append", "j/x"), "[1, 2]\n", "JSON object"),
        (("journals", "create", "bad name!"), None, "bad name!"),
        (("read", "j/x", "--since", "yesterday-ish"), None, "not a time"),
        (("inspect", "--checkpoint", "missing.bin"), None, "missing.bin"),
        (("journals", "create", "j/y", "-l", "content-type=text/csv"), None, "--content-type"),
    ],
)
def test_user_mistakes_print_one_line(tmp_path: Path, args, stdin, needle) -> None:
    """A user mistake prints one 'exactly: error:' line, no traceback, and exits 1."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "j/x")
    r = run(root, *args, input=stdin)
    assert r.returncode == 1
    assert r.stderr.startswith("exactly: error:") and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert needle in r.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("append",), "required: name"),
        (("read", "j/x", "--limit", "many"), "not a number: 'many'"),
        (("no-such-command",), "invalid choice: 'no-such-command'"),
        # Malformed in ways the command sees, not the parser: the same status.
        (("read",), "name a journal to read"),
        (("inspect",), "name a journal to inspect"),
        (("journals", "trim", "j/x"), "--before"),
        (("read", "j/x", "--selector", "a=b"), "go with --format arrow or parquet"),
        (("--broker", "http://127.0.0.1:9", "journals", "list"), "not both"),
        (("journals", "create", "j/y", "--content-type", ""), "cannot be empty"),
    ],
)
def test_usage_mistakes_print_one_line(tmp_path: Path, args, needle) -> None:
    """A command line that does not parse, or misses an argument, or gives
    options that do not go together, prints one line naming the mistake, no
    usage block and no traceback, and exits 2."""
    r = run(tmp_path / "store", *args)
    assert r.returncode == 2
    assert "error:" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr


def test_bad_append_changes_nothing(tmp_path: Path) -> None:
    """A bad line stops the append: lines before it are published, it and those
    after it are not."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "j/x")
    r = run(root, "append", "j/x", input='{"a": 1}\nnope\n{"a": 3}\n')
    assert r.returncode == 1
    got = [json.loads(x)["message"]["a"] for x in ok(root, "read", "j/x").splitlines()]
    assert got == [1]


def test_inspect_checkpoint_file(tmp_path: Path) -> None:
    """inspect --checkpoint prints what a protobuf or JSON checkpoint holds."""
    from message import Checkpoint, ProducerState

    cp = Checkpoint({"a/b": 42}, [ProducerState("a/b", b"\x01" * 6, 99, -1)], {"a/b": b"x"})
    (tmp_path / "cp.bin").write_bytes(cp.to_bytes())
    (tmp_path / "cp.json").write_text(cp.to_json())
    for name in ("cp.bin", "cp.json"):
        doc = json.loads(ok(tmp_path, "inspect", "--checkpoint", str(tmp_path / name)))
        assert doc["offsets"] == {"a/b": 42}
        assert doc["states"][0]["producer"] == "010101010101"


def test_quick_demo_is_exactly_once(tmp_path: Path) -> None:
    """exactly demo --quick publishes through faults and reads each message once."""
    r = subprocess.run(
        [sys.executable, "-m", "exactly", "demo", "--quick", "--store", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "exactly once:     yes" in r.stdout
    assert "replay" in r.stdout and "with 0 replays" not in r.stdout


def test_read_since_a_time(tmp_path: Path) -> None:
    """read --since shows only messages published after the given time."""
    import datetime as dt

    root = tmp_path / "store"
    ok(root, "journals", "create", "s/j")
    ok(root, "append", "s/j", input='{"n": 1}\n')
    time.sleep(0.05)
    middle = dt.datetime.now(dt.UTC).isoformat()
    time.sleep(0.05)
    ok(root, "append", "s/j", input='{"n": 2}\n')
    got = [json.loads(x)["message"]["n"] for x in ok(root, "read", "s/j", "--since", middle)
           .splitlines()]
    assert got == [2]
    assert len(ok(root, "read", "s/j", "--since", "1h").splitlines()) == 2


def test_demo_refuses_to_replace_a_directory_it_did_not_create(tmp_path: Path) -> None:
    """The demo never deletes a directory that is not one of its own stores."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    r = subprocess.run(
        [sys.executable, "-m", "exactly", "demo", "--quick", "--store", str(precious)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 1 and "not a demo store" in r.stderr
    assert (precious / "thesis.txt").read_text() == "years of work"


def test_journals_list_json(tmp_path: Path) -> None:
    """journals list --json prints one document per journal, labels as lists."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "c/a", "-l", "topic=clicks")
    docs = [json.loads(x) for x in ok(root, "journals", "list", "-s", "topic=clicks",
                                      "--json").splitlines()]
    assert docs == [{"name": "c/a", "head": 0,
                     "labels": {"content-type": ["application/x-ndjson"],
                                "topic": ["clicks"]}}]


def test_append_refuses_integers_beyond_64_bits(tmp_path: Path) -> None:
    """An integer that JSON framing would turn into a float is refused, not rounded."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "j/x")
    r = run(root, "append", "j/x", input='{"n": 123456789012345678901234567890}\n')
    assert r.returncode == 1 and r.stderr.startswith("exactly: error: line 1:")
    assert "64 bits" in r.stderr
    ok(root, "append", "j/x", input='{"n": 18446744073709551615, "m": -9223372036854775808, '
                                    '"s": "12345678901234567890"}\n')
    [doc] = [json.loads(x)["message"] for x in ok(root, "read", "j/x").splitlines()]
    assert (doc["n"], doc["m"], doc["s"]) == (2**64 - 1, -(2**63), "12345678901234567890")


def test_append_refuses_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """Input that is not UTF-8 is an error, never replaced by U+FFFD."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "j/x", "--content-type", "ndjson")
    ok(root, "journals", "create", "c/x", "--content-type", "csv")
    for name, extra in (("j/x", ["--format", "lines"]), ("c/x", [])):
        r = subprocess.run(
            [sys.executable, "-m", "exactly", "--root", str(root), "append", name, *extra],
            input=b"ok\nbad \xff\n", capture_output=True, timeout=60,
        )
        assert r.returncode == 1
        assert r.stderr.decode().startswith("exactly: error: line 2 is not UTF-8 text")


def test_append_csv_records(tmp_path: Path) -> None:
    """CSV input is read as RFC 4180 records: quoted newlines span lines; a quote
    left open or a stray quote is an error, not a silently different record."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "c/x", "--content-type", "csv")
    ok(root, "append", "c/x", input='a,"multi\nline",z\n\n"q""q",\n')
    got = [json.loads(x)["message"][1:] for x in ok(root, "read", "c/x").splitlines()]
    assert got == [["a", "multi\nline", "z"], ['q"q', ""]]
    for bad, needle in (('a,"open\n', "never closed"), ('a,"b"c\n', "not a CSV record")):
        r = run(root, "append", "c/x", input=bad)
        assert r.returncode == 1 and r.stderr.startswith("exactly: error: line 1:")
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert len(ok(root, "read", "c/x").splitlines()) == 2


def _proto_journal(root: Path) -> None:
    from journal import LocalJournalStore
    from message import Publisher, proto_message_type
    from tests.examples_pb2 import PageView

    view = proto_message_type(PageView)
    ok(root, "journals", "create", "p/j", "--content-type", "proto")
    with LocalJournalStore(root) as store:
        pub = Publisher(store)
        pub.publish_committed(lambda _m: ("p/j", "application/x-protobuf-fixed"),
                              view(PageView(page="/p"))).result()


def test_read_proto_class_from_the_working_directory(tmp_path: Path) -> None:
    """--proto imports a module of the working directory, as `python -m` would,
    even when the console script's directory is first on the path."""
    root = tmp_path / "store"
    _proto_journal(root)
    # The generated module, as a user's own generated code beside their data.
    (tmp_path / "mine_pb2.py").write_bytes(
        (Path(__file__).resolve().parents[1] / "examples_pb2.py").read_bytes())
    r = subprocess.run(
        [sys.executable, "-P", "-m", "exactly", "--root", str(root),
         "read", "p/j", "--proto", "mine_pb2.PageView"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["message"]["page"] == "/p"


@pytest.mark.parametrize("cls", ["json.dumps", "os.path", "google.protobuf.message.Message",
                                 "tests.examples_pb2.Nope", "nope"])
def test_read_proto_class_that_is_not_one(tmp_path: Path, cls: str) -> None:
    """--proto naming something that is not a protobuf message class is one line."""
    root = tmp_path / "store"
    _proto_journal(root)
    r = run(root, "read", "p/j", "--proto", cls)
    assert r.returncode == 1 and r.stderr.startswith("exactly: error:")
    assert len(r.stderr.strip().splitlines()) == 1 and cls in r.stderr


def test_append_finishes_a_transaction_cut_short(tmp_path: Path) -> None:
    """ACK intents an interrupted `append --transaction` made durable under
    @intents/ are written by the next append, so its transaction commits."""
    from journal import LocalJournalStore
    from message import IntentLog, JsonDocument, Publisher

    root = tmp_path / "store"
    ok(root, "journals", "create", "t/j")
    with LocalJournalStore(root) as store:
        pub = Publisher(store)
        pub.publish_uncommitted(lambda _m: ("t/j", "application/x-ndjson"),
                                JsonDocument(n=1)).result()
        # Killed right after making its intents durable, before writing them.
        IntentLog(root / "@intents" / f"{pub.producer_id.hex()}.json").save(
            pub.build_ack_intents())
    assert ok(root, "read", "t/j") == ""
    r = run(root, "append", "t/j", input='{"n": 2}\n')
    assert r.returncode == 0 and "interrupted transaction" in r.stderr
    got = [json.loads(x)["message"].get("n") for x in ok(root, "read", "t/j").splitlines()]
    assert sorted(got, key=str) == [1, 2, None]
    assert not list((root / "@intents").glob("*.json"))


def test_append_many_lines_keeps_every_one(tmp_path: Path) -> None:
    """An input longer than the appends kept in flight is appended whole, in order."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "m/j")
    n = 25_000
    ok(root, "append", "m/j", input="".join(f'{{"n": {i}}}\n' for i in range(n)))
    got = [json.loads(x)["message"]["n"] for x in ok(root, "read", "m/j").splitlines()]
    assert got == list(range(n))


def test_append_line_over_the_maximum_size_names_its_line(tmp_path: Path) -> None:
    """A line too large for one append stops the command with its line number;
    the lines before it are kept. Empty input appends nothing, successfully."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "h/j")
    ok(root, "append", "h/j", input="")
    big = '{"a": "' + "x" * (16 << 20) + '"}\n'
    r = run(root, "append", "h/j", input='{"ok": 1}\n' + big + '{"ok": 2}\n')
    assert r.returncode == 1 and r.stderr.startswith("exactly: error: line 2:")
    assert "maximum append size" in r.stderr
    got = [json.loads(x)["message"] for x in ok(root, "read", "h/j").splitlines()]
    assert [m.get("ok") for m in got] == [1]


@pytest.mark.parametrize(("transaction", "signum"), [
    (False, signal.SIGINT), (True, signal.SIGINT), (True, signal.SIGTERM), (True, signal.SIGHUP)])
def test_ctrl_c_during_append(tmp_path: Path, transaction: bool, signum: int) -> None:
    """Ctrl-C (or SIGTERM, or SIGHUP) while append waits for input:
    committed lines stay; a transaction is rolled back as a whole (roll-back
    ACK written); one line, status 128 + the signal's number."""

    root = tmp_path / "store"
    ok(root, "journals", "create", "i/j")
    extra = ["--transaction"] if transaction else []
    # SIGTERM and SIGHUP as a terminal's session has them (the test may run
    # under nohup, whose ignored SIGHUP the command leaves ignored, as it
    # should): the command is started from a Python that restores them.
    start = ("import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL);"
             " signal.signal(signal.SIGTERM, signal.SIG_DFL); sys.argv[0] = 'exactly';"
             " runpy.run_module('exactly', run_name='__main__')")
    proc = subprocess.Popen(
        [sys.executable, "-c", start, "--root", str(root), "append", "i/j", *extra],
        # No preexec_fn: in a process that has used a GazetteClient, gRPC's
        # fork handlers abort such a child now and then (SIGABRT). The
        # command installs its own SIGINT handler, even where SIGINT was
        # ignored when it started (a background job).
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write('{"i": 0}\n{"i": 1}\n')
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while (len(ok(root, "read", "i/j", "--uncommitted").splitlines()) < 2
           and time.monotonic() < deadline):
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, err
    assert err.startswith("exactly: interrupted:") and "Traceback" not in err
    frames = [json.loads(x) for x in ok(root, "read", "i/j", "--uncommitted").splitlines()]
    committed = ok(root, "read", "i/j").splitlines()
    if transaction:
        assert [f["flags"] for f in frames] == [1, 1, 2] and committed == []
    else:
        assert [json.loads(x)["message"]["i"] for x in committed] == [0, 1]


@pytest.mark.parametrize("transaction", [False, True])
def test_a_store_failing_under_append_says_what_became_of_the_input(
        tmp_path: Path, transaction: bool) -> None:
    """The journal deleted while append runs (as a full disk would fail it):
    one line with the store's error and what became of the input."""
    from journal import LocalJournalStore

    root = tmp_path / "store"
    ok(root, "journals", "create", "f/j")
    extra = ["--transaction"] if transaction else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "exactly", "--root", str(root), "append", "f/j", *extra],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    proc.stdin.write('{"i": 0}\n')
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not ok(root, "read", "f/j", "--uncommitted") and time.monotonic() < deadline:
        time.sleep(0.05)
    with LocalJournalStore(root) as store:
        store.delete("f/j")
    _, err = proc.communicate('{"i": 1}\n' * 3, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    if transaction:
        assert "the transaction is not committed: nothing of this input was published" in err
    else:
        assert "of this input were published before it" in err


def test_read_limit_and_root_mistakes(tmp_path: Path) -> None:
    """--limit N shows N messages (0: none); a negative limit and a store path
    that is a file are one-line errors."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "l/j")
    ok(root, "append", "l/j", input='{"n": 1}\n{"n": 2}\n')
    assert len(ok(root, "read", "l/j", "--limit", "1").splitlines()) == 1
    assert ok(root, "read", "l/j", "--limit", "0") == ""
    r = run(root, "read", "l/j", "--limit", "-1")
    assert r.returncode == 2 and "must be 0 or more" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    afile = tmp_path / "afile"
    afile.write_text("")
    r = run(afile, "journals", "create", "l/j")
    assert r.returncode == 1
    assert r.stderr == f"exactly: error: the store {afile} is not a directory\n"


def test_quick_demo_replaces_the_full_demos_store(tmp_path: Path) -> None:
    """`exactly demo` then `exactly demo --quick` share ./demo-store: either may
    replace the other's store."""
    store = tmp_path / "demo-store"
    store.mkdir()
    (store / "@demo").write_text("created by `exactly demo`; safe to delete\n")
    (store / "journals").mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "exactly", "demo", "--quick", "--store", str(store)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "exactly once:     yes" in r.stdout


def test_read_corrupt_frame_names_journal_and_the_way_out(tmp_path: Path) -> None:
    """A frame that does not decode: one line naming the journal and offset, and
    --skip-corrupt; an --offset inside a frame is pointed out."""
    from journal import LocalJournalStore

    root = tmp_path / "store"
    ok(root, "journals", "create", "n/j")
    ok(root, "append", "n/j", input='{"a": 1}\n')
    with LocalJournalStore(root) as store:
        end = store.append("n/j", b"garbage\n").result().begin
    ok(root, "append", "n/j", input='{"a": 2}\n')
    r = run(root, "read", "n/j")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("exactly: error: journal n/j:")
    assert f"offset {end}" in r.stderr and "--skip-corrupt" in r.stderr
    r = run(root, "read", "n/j", "--skip-corrupt")
    assert [json.loads(x)["message"]["a"] for x in r.stdout.splitlines()] == [1, 2]
    assert "skipped 1 corrupt frame" in r.stderr and "frames" not in r.stderr
    r = run(root, "read", "n/j", "--offset", "3")
    assert r.returncode == 1 and "is 3 the offset of a frame's start?" in r.stderr


def test_output_closed_early_is_not_an_error(tmp_path: Path) -> None:
    """`exactly journals list | head -1`: the closed pipe ends the command quietly."""
    root = tmp_path / "store"
    ok(root, "journals", "create", *[f"j/{i}" for i in range(2000)])
    assert _close_after_first_line(root, ["journals", "list"], b"j/") == 0


def _close_after_first_line(root: Path, args: list[str], first: bytes) -> int:
    """Run the command, read the first line of its output (it begins with
    ``first``), close the pipe as `| head -1` does; its status, once it
    ended with nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "exactly", "--root", str(root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(first)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    status = proc.wait(timeout=120)
    assert err == b"", err
    return status


def test_more_mistakes_are_one_line_never_a_traceback(tmp_path: Path) -> None:
    """A line whose '_meta' has no room for its UUID (append, --transaction,
    emit), empty names and bad intervals for lag, and closed standard input
    or output: one line (or none), never a traceback."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "m/j")
    for args in (["append", "m/j"], ["append", "m/j", "--transaction"], ["emit", "m/j"]):
        r = run(root, *args, input='{"a": 1}\n{"_meta": "x"}\n')
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("exactly: error: line 2: a line keeps its UUID at _meta/uuid")
    for args in (["--store", ""], ["--checkpoint", ""], ["--store", "x", "--watch", "-1"],
                 ["--store", "x", "--watch", "nan"], ["--store", "x", "--watch", "0"]):
        r = run(root, "lag", *args)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, (args, r.stderr)
    for args, says in ((["--root", "", "journals", "list"], "--root cannot be empty"),
                       (["--broker", "", "journals", "list"], "--broker cannot be empty"),
                       (["--root", str(root), "demo", "--quick"], "not --root")):
        r = subprocess.run([sys.executable, "-m", "exactly", *args], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
        # (malformed command lines: status 2)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "demo-store").exists()
    # An option a (sub)command does not take: said by it, pointing to its help.
    for args, prog in ((["read", "m/j", "--bogus"], "exactly read"),
                       (["--bogus", "journals", "list"], "exactly journals list"),
                       (["journals", "create", "x", "--bogus"], "exactly journals create")):
        r = run(root, *args)
        assert r.returncode == 2 and r.stderr == (
            f"{prog}: error: unrecognized arguments: --bogus (see '{prog} --help')\n"), r.stderr
    for args, says, status in ((["read", "m/j", "--proto", "x.Y"],
                                "--proto names the message class", 1),
                               (["inspect", "m/j", "--checkpoint", "c"], "not both", 2),
                               (["inspect", "--checkpoint", "nope"], "no checkpoint file nope", 1)):
        r = run(root, *args)
        assert r.returncode == status and says in r.stderr, (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1
    assert ok(root, "--version").startswith("exactly ")
    # --format lines: each line as it is, in a CSV journal a record of one field.
    ok(root, "journals", "create", "m/c", "-t", "csv")
    ok(root, "append", "m/c", "--format", "lines", input='a,b "c\n')
    (doc,) = [json.loads(x) for x in ok(root, "read", "m/c").splitlines()]
    assert doc["message"][1:] == ['a,b "c']
    for redirect in ("<&-", ">&-"):
        args = "append m/j" if redirect == "<&-" else "read m/j"
        r = subprocess.run(f"{sys.executable} -m exactly --root {root} {args} {redirect}",
                           shell=True, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_one_unreadable_spec_hides_no_other_journal(tmp_path: Path) -> None:
    """A journal whose spec is garbage: `journals list` shows the others and
    it as damaged (status 1); `inspect --open` over every journal looks into
    the others, and says which it could not (it, and a protobuf journal
    without --proto)."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "a", "b", "c")
    ok(root, "journals", "create", "p", "-t", "proto")
    r = run(root, "append", "c", "--transaction", input='{"n": 1}\n')
    (root / "b" / "@spec.json").write_text("garbage")
    r = run(root, "journals", "list")
    assert r.returncode == 1
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == ["a", "b", "c", "p"]
    assert "b\t?\tdamaged" in r.stdout and "unreadable journal spec" in r.stderr
    r = run(root, "inspect", "--open")
    assert r.returncode == 1 and "no open transaction in 2 journals" in r.stdout, r.stdout
    assert "journal b not looked into" in r.stderr and "journal p not looked into" in r.stderr


def test_commands_that_change_things_finish_when_their_output_closes(tmp_path: Path) -> None:
    """`exactly journals create ... | head -1`: the journals are all
    created (the closed pipe only silences the command), status 0."""
    root = tmp_path / "store"
    names = [f"k/{i}" for i in range(3000)]
    assert _close_after_first_line(root, ["journals", "create", *names], b"created k/") == 0
    listed = ok(root, "journals", "list").splitlines()
    assert len(listed) == len(names)


def test_journal_named_like_a_directory_of_the_cli(tmp_path: Path) -> None:
    """A journal may be named `.intents`: transactions of append keep their
    intents where no journal can be."""
    root = tmp_path / "store"
    ok(root, "journals", "create", ".intents", "t/j")
    ok(root, "append", "t/j", "--transaction", input='{"n": 1}\n')
    ok(root, "append", ".intents", "--transaction", input='{"n": 2}\n')
    assert "2 frames, 2 committed" in ok(root, "inspect", ".intents")
    assert "t/j" in ok(root, "journals", "list")
    # Each run's intent log is emptied by its commit, then removed.
    assert not list((root / "@intents").iterdir())


def test_read_skips_a_csv_line_whose_first_field_is_no_uuid(tmp_path: Path) -> None:
    """One foreign line in a CSV journal is a corrupt frame: `read` names it in
    one line, and `read --skip-corrupt` skips it and reads on."""
    from journal import LocalJournalStore

    root = tmp_path / "store"
    ok(root, "journals", "create", "c/j", "--content-type", "csv")
    ok(root, "append", "c/j", input="a,1\n")
    with LocalJournalStore(root) as store:
        foreign = store.append("c/j", b"hello,world\n").result().begin
    ok(root, "append", "c/j", input="b,2\n")
    r = run(root, "read", "c/j")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "not a UUID" in r.stderr and f"offset {foreign}" in r.stderr
    r = run(root, "read", "c/j", "--skip-corrupt")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["message"][1:] for x in r.stdout.splitlines()] == [["a", "1"], ["b", "2"]]
    assert "skipped 1 corrupt frame" in r.stderr


@pytest.mark.parametrize("ct", ["xml", "../../x", "application/xml"])
def test_create_refuses_a_content_type_no_framing_knows(tmp_path: Path, ct: str) -> None:
    """An unknown content type is refused at create, listing the known ones,
    instead of failing at the first append or read."""
    root = tmp_path / "store"
    r = run(root, "journals", "create", "x/j", "--content-type", ct)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert f"unknown content type {ct!r}" in r.stderr
    for known in ("ndjson", "csv", "proto", "application/x-protobuf-fixed"):
        assert known in r.stderr
    assert run(root, "journals", "list").stdout == ""
    assert "created x/j (text/csv)" in ok(root, "journals", "create", "x/j", "-t", "text/csv")


def test_append_says_what_was_published_before_a_bad_line(tmp_path: Path) -> None:
    """A bad line stops the append: the error says how many messages were
    published before it, and that --transaction makes it all or nothing."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "j/x")
    r = run(root, "append", "j/x", input='{"ok":1}\n{bad\n')
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "line 2: not a JSON document" in r.stderr
    assert "1 message was published before it" in r.stderr and "--transaction" in r.stderr
    r = run(root, "append", "j/x", input='{"ok":2}\n{"ok":3}\n{bad\n')
    assert "2 messages were published before it" in r.stderr
    r = run(root, "append", "j/x", "--transaction", input='{"ok":4}\n{bad\n')
    assert r.returncode == 1 and "rolled back" in r.stderr and "nothing" in r.stderr
    got = [json.loads(x)["message"].get("ok") for x in ok(root, "read", "j/x").splitlines()]
    assert got == [1, 2, 3]


def test_binary_input_to_an_ndjson_append_is_not_utf8_text(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in JSON input: `line N is not UTF-8 text`."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "j/x")
    r = subprocess.run(
        [sys.executable, "-m", "exactly", "--root", str(root), "append", "j/x"],
        input=b'{"a": 1}\n{"b": "\xff\xfe"}\n', capture_output=True, timeout=60,
    )
    err = r.stderr.decode()
    assert r.returncode == 1 and "line 2 is not UTF-8 text" in err and "surrogates" not in err
    assert "1 message was published before it" in err


@pytest.mark.parametrize(
    "args",
    [
        ("journals", "list"),
        ("journals", "list", "--json"),
        ("read", "r/j"),
        ("inspect", "r/j"),
        ("fsck",),
    ],
)
def test_root_is_taken_after_the_subcommand_too(tmp_path: Path, args: tuple[str, ...]) -> None:
    """--root works before the subcommand and after it, the same way."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "r/j")
    ok(root, "append", "r/j", input='{"n": 1}\n')
    before = subprocess.run(
        [sys.executable, "-m", "exactly", "--root", str(root), *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    after = subprocess.run(
        [sys.executable, "-m", "exactly", *args, "--root", str(root)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert before.returncode == 0 and after.returncode == 0, (before.stderr, after.stderr)
    assert before.stdout.strip() and _same(before.stdout, after.stdout)
    assert not (tmp_path / "exactly-store").exists()


def _same(a: str, b: str) -> bool:
    """The same output, but for what changes from run to run (times)."""
    return a.splitlines()[0].split("\t")[0][:40] == b.splitlines()[0].split("\t")[0][:40]


def test_root_after_the_subcommand_for_create_append_and_trim(tmp_path: Path) -> None:
    """Every command that works on a store takes --root after its arguments."""
    root = tmp_path / "store"

    def after(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "exactly", *args, "--root", str(root)],
            input=input, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )

    assert after("journals", "create", "a/j").returncode == 0
    assert after("append", "a/j", input='{"n": 1}\n').returncode == 0
    assert after("journals", "trim", "a/j", "--before", "0").returncode == 0
    assert "a/j" in after("journals", "list").stdout
    assert not (tmp_path / "exactly-store").exists()


def test_recreating_a_journal_says_it_already_exists(tmp_path: Path) -> None:
    """Creating a journal that exists says so (and changes nothing); with other
    labels it is an error."""
    root = tmp_path / "store"
    assert "created a/j (application/x-ndjson)" in ok(root, "journals", "create", "a/j")
    out = ok(root, "journals", "create", "a/j")
    assert "a/j already exists" in out and "created" not in out
    r = run(root, "journals", "create", "a/j", "-t", "csv")
    assert r.returncode == 1 and "already exists with other labels" in r.stderr


def test_counts_are_plain_english(tmp_path: Path) -> None:
    """`appended 1 message`, not `1 messages`; the quick demo says what is pending in words."""
    root = tmp_path / "store"
    ok(root, "journals", "create", "a/j")
    r = run(root, "append", "a/j", input='{"n": 1}\n')
    assert "appended 1 message to a/j" in r.stderr
    r = run(root, "append", "a/j", input='{"n": 1}\n{"n": 2}\n')
    assert "appended 2 messages to a/j" in r.stderr
    demo = subprocess.run([sys.executable, "-m", "exactly", "demo", "--quick", "--store",
                           str(tmp_path / "demo")], capture_output=True, text=True, timeout=60)
    assert demo.returncode == 0, demo.stderr
    out = demo.stdout
    assert "(True)" not in out and "(False)" not in out
    assert "still pending:    carol's transaction: never acknowledged" in out


def test_read_a_journal_with_a_damaged_fragment(tmp_path: Path) -> None:
    """A fragment cut short in the middle: `read` prints the messages before it
    and one error line naming it; `read --skip-corrupt` reads on after it."""
    from journal import LocalJournalStore
    from message import JsonDocument, Publisher

    root = tmp_path / "store"
    with LocalJournalStore(root, fragment_size=150) as store:
        store.create("d/j", {"content-type": "application/x-ndjson"})
        pub = Publisher(store)
        for i in range(12):
            pub.publish_committed(lambda _m: ("d/j", "application/x-ndjson"),
                                  JsonDocument(n=i)).result()
        victim = store.fragments("d/j")[1]
    os.truncate(victim.path, 10)
    r = run(root, "read", "d/j")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert Path(victim.path).name in r.stderr and f"[{victim.begin}, {victim.end})" in r.stderr
    before = [json.loads(x)["end"] for x in r.stdout.splitlines()]
    assert before and before[-1] == victim.begin
    r = run(root, "read", "d/j", "--skip-corrupt")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["message"]["n"] == 11
    assert f"damaged offsets [{victim.begin}, {victim.end})" in r.stderr


def test_read_committed_to_arrow_and_parquet(tmp_path: Path) -> None:
    """read --format arrow|parquet --output FILE writes the committed view of a
    journal or a selector; pandas (and DuckDB, where installed) open it."""
    pa = pytest.importorskip("pyarrow")
    pd = pytest.importorskip("pandas")
    root = tmp_path / "store"
    ok(root, "journals", "create", "clicks/a", "clicks/b", "-l", "app=clicks")
    ok(root, "append", "clicks/a", input='{"page": "/", "n": 1}\n{"page": "/cart", "n": 2}\n')
    ok(root, "append", "clicks/b", "--transaction", input='{"page": "/buy", "n": 3}\n')
    parquet, arrow = tmp_path / "c.parquet", tmp_path / "c.arrow"
    r = run(root, "read", "--selector", "app=clicks", "--format", "parquet",
            "--output", str(parquet))
    assert r.returncode == 0 and "wrote 3 rows" in r.stderr, r.stderr
    df = pd.read_parquet(parquet)
    assert sorted(df["n"]) == [1, 2, 3] and set(df["journal"]) == {"clicks/a", "clicks/b"}
    assert (df["flags"] != 2).all()  # no ACK rows
    ok(root, "read", "clicks/a", "--format", "arrow", "--output", str(arrow),
       "--schema", "page string, n long")
    import pyarrow.feather

    table = pyarrow.feather.read_table(arrow)
    assert table["page"].to_pylist() == ["/", "/cart"]
    assert table.schema.field("n").type == pa.int64()
    assert arrow.stat().st_mode & 0o777 == 0o666 & ~_umask()

    # Through a symbolic link: the file it points to is written, the link
    # stays; a file of the user's named like a temporary one is left alone;
    # a read that fails leaves the output as it was and no temporary file.
    link, mine = tmp_path / "link.arrow", tmp_path / "c.arrow.part"
    link.symlink_to(arrow)
    mine.write_text("mine")
    before = arrow.read_bytes()
    ok(root, "read", "clicks/b", "--format", "arrow", "--output", str(link))
    assert link.is_symlink() and arrow.read_bytes() != before and mine.read_text() == "mine"
    ok(root, "journals", "create", "bad")
    ok(root, "append", "bad", input='{"n": 1}\n')
    (frag,) = (root / "bad").glob("@open-*")
    frag.write_bytes(frag.read_bytes()[:-2] + b"x\n")  # a corrupt frame
    written = arrow.read_bytes()
    r = run(root, "read", "bad", "--format", "arrow", "--output", str(arrow))
    assert r.returncode == 1 and "--skip-corrupt" in r.stderr, r.stderr
    assert arrow.read_bytes() == written
    assert sorted(p.name for p in tmp_path.iterdir() if "part" in p.name) == ["c.arrow.part"]
    try:
        import duckdb
    except ImportError:
        return
    got = duckdb.sql(f"SELECT sum(n) FROM '{parquet}'").fetchone()
    assert got is not None and got[0] == 6


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_sigterm_during_a_columnar_read_leaves_no_file(tmp_path: Path) -> None:
    """SIGTERM while read --format parquet writes: status 143, and neither
    the output nor its temporary file is left behind."""
    pytest.importorskip("pyarrow")
    root = tmp_path / "store"
    ok(root, "journals", "create", "big")
    ok(root, "append", "big", input="".join(f'{{"n": {i}, "pad": "{"x" * 200}"}}\n'
                                            for i in range(300_000)))
    out = tmp_path / "big.parquet"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exactly", "--root", str(root), "read", "big", "--format",
         "parquet", "--output", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".big.parquet.*.part")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the read finished before the signal")  # (a fast machine)
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


@pytest.mark.parametrize("args, message", [
    (["--format", "arrow"], "--output FILE"),
    (["clicks/a", "--format", "parquet", "-o", "x", "--follow"], "--follow goes with"),
    (["clicks/a", "--format", "arrow", "-o", "x", "--schema", "page strng"], "--schema"),
    (["--selector", "app=x"], "--format arrow or parquet"),
    (["--selector", "app=x", "--format", "arrow", "-o", "x"], "no journal matches"),
    (["--selector", "app=", "--format", "parquet", "-o", "x"], "selector"),
])
def test_read_columns_mistakes_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    root = tmp_path / "store"
    ok(root, "journals", "create", "clicks/a")
    r = run(root, "read", *args)
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()


_DEAD_PRODUCERS = r"""
import sys, time
from journal import LocalJournalStore
from message import Clock, JsonDocument, Publisher, new_clock
to = lambda _m: ("t/j", "application/x-ndjson")
with LocalJournalStore(sys.argv[1]) as s:
    s.create("t/j", {"content-type": "application/x-ndjson"})
    s.create("t/k", {"content-type": "application/x-ndjson"})
    old = Publisher(s, Clock(new_clock(time.time_ns() - 3600 * 10**9)))  # an hour ago
    old.publish_uncommitted(to, JsonDocument(n=1)).result()
    new = Publisher(s)
    new.publish_uncommitted(to, JsonDocument(n=2)).result()
    Publisher(s).publish_committed(to, JsonDocument(n=3)).result()
    print(old.producer_id.hex(), new.producer_id.hex())
"""


def test_abort_of_a_csv_transaction_writes_an_ack_as_wide_as_its_records(
        tmp_path: Path) -> None:
    """In a CSV journal, abort's roll-back ACK has as many fields as the
    producer's records: a reader that requires it (Go's, new_unmarshal_func)
    reads the whole journal."""
    from journal import LocalJournalStore
    from message import CSVRecord, Publisher, modulo_mapping
    from tests.csv_support import strict_csv_records

    root = tmp_path / "store"
    with LocalJournalStore(root) as store:
        spec = store.create("t/csv", {"content-type": "text/csv"})
        pub = Publisher(store)
        mapping = modulo_mapping(lambda r: r[1], lambda: [spec])
        pub.publish_committed(mapping, CSVRecord(["", "a", "1"])).result()
        pub.publish_uncommitted(mapping, CSVRecord(["", "b", "2"])).result()  # never ACKed
    r = run(root, "abort", "t/csv", "--producer", pub.producer_id.hex())
    assert r.returncode == 0, r.stderr
    with LocalJournalStore(root) as store:
        widths = [len(r) for r in strict_csv_records(store.read("t/csv"))]
    assert widths == [3, 3, 3]
    assert [json.loads(x)["message"][1:] for x in ok(root, "read", "t/csv").splitlines()] == [
        ["a", "1"]]


def test_inspect_open_lists_stuck_transactions_and_abort_rolls_one_back(tmp_path: Path) -> None:
    """Two producers died mid-transaction, one an hour ago: inspect --open
    lists both with their first offsets, --older-than 10m only the old one;
    abort rolls it back (its message is never read, the other stays
    pending); a second abort of it, or of a producer that never wrote, is
    refused."""
    root = tmp_path / "store"
    r = subprocess.run([sys.executable, "-c", _DEAD_PRODUCERS, str(root)], capture_output=True,
                       text=True, timeout=60, check=True)
    old, new = r.stdout.split()
    rows = [x.split() for x in ok(root, "inspect", "--open").splitlines()[1:]]
    assert [(x[0], x[1], x[2]) for x in rows] == [("t/j", old, "0"), ("t/j", new, "64")]
    assert rows[0][4] == "1h00m"
    rows = [x.split() for x in ok(root, "inspect", "--open", "--older-than", "10m")
            .splitlines()[1:]]
    assert [x[1] for x in rows] == [old]
    assert "no open transaction" in ok(root, "inspect", "t/k", "--open")
    # In the journal's table, the producers that never committed have no last ACK.
    table = {x.split()[0]: x.split() for x in ok(root, "inspect", "t/j").splitlines()[2:]}
    assert table[old][3:5] == ["0", "-"] and table[new][3:5] == ["0", "-"]

    r = run(root, "abort", "t/j", "--producer", old)
    assert r.returncode == 0 and "from offset 0 on are dropped" in r.stderr, r.stderr
    assert [x.split()[1] for x in ok(root, "inspect", "--open").splitlines()[1:]] == [new]
    r = run(root, "abort", "t/j", "--producer", old)
    assert r.returncode == 1 and "has no open transaction" in r.stderr
    r = run(root, "abort", "t/j", "--producer", "00" * 6)
    assert r.returncode == 1 and "never wrote" in r.stderr
    r = run(root, "abort", "t/j", "--producer", "xyz")
    assert r.returncode != 0 and "12 hex digits" in r.stderr

    # Rolled back: readers drop its message; the other producer's stays pending.
    docs = [json.loads(x)["message"] for x in ok(root, "read", "t/j").splitlines()]
    assert [d.get("n") for d in docs] == [3]
    docs = [json.loads(x)["message"] for x in ok(root, "read", "t/j", "--uncommitted")
            .splitlines()]
    assert [d.get("n") for d in docs] == [1, 2, 3, None]  # the roll-back ACK last
