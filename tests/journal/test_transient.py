"""Transient messages: emitted to live followers, never stored.

Real processes follow a journal of a real store; others emit and append.
Followers must receive every emit made while they follow, once, after the
appends that completed before it; nobody else ever sees an emit; a follower
stopped with SIGSTOP loses emits and says how many, and the emitter never
waits for it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from journal import (
    MAX_EMIT,
    RING_SIZE,
    AppendTooLargeError,
    JournalError,
    JournalNotFoundError,
    LocalJournalStore,
    MemoryJournalClient,
)
from message import (
    TRANSIENT_OFFSET,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
)

NDJSON = {"content-type": "application/x-ndjson"}
J = "live/j"
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _to(_msg: object) -> tuple[str, str]:
    return J, "application/x-ndjson"


def _new(_spec: object) -> JsonDocument:
    return JsonDocument()


def _content(env: object) -> dict[str, object]:
    doc = dict(env.message)  # type: ignore[attr-defined]
    doc.pop("_meta", None)
    return doc


# A follower process: follows J (committed, with transient messages), writes
# one JSON line per envelope to stdout, and stops once it has seen a
# transient {"stop": true} for every emitter (argv[2] of them) and argv[3]
# stored messages; then prints {"lost": ...}. It says "ready" on stderr once
# it listens.
_FOLLOWER = r"""
import json, sys
from journal import LocalJournalStore
from message import JsonDocument, ReadCommittedIter
root, stops, stored_wanted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with LocalJournalStore(root) as store:
    it = ReadCommittedIter(store, "live/j", lambda _s: JsonDocument(), block=True, transient=True)
    print("ready", file=sys.stderr, flush=True)
    stored = stopped = 0
    for env in it:
        doc = dict(env.message)
        doc.pop("_meta", None)
        print(json.dumps({"t": env.transient, "begin": env.begin, "doc": doc}), flush=True)
        if env.transient:
            stopped += bool(doc.get("stop"))
        else:
            stored += 1
        if stopped >= stops and stored >= stored_wanted:
            break
    print(json.dumps({"lost": it.transient_lost, "checkpoint": it.checkpoint().to_dict()}),
          flush=True)
    it.close()
"""

# A writer process: argv[3] rounds of (append {"w": w, "i": i}, wait for it,
# emit {"w": w, "after": i}), then emits {"stop": true}.
_WRITER = r"""
import sys
from journal import LocalJournalStore
from message import JsonDocument, Publisher
root, w, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
to = lambda _m: ("live/j", "application/x-ndjson")
with LocalJournalStore(root) as store:
    pub = Publisher(store)
    for i in range(rounds):
        pub.publish_committed(to, JsonDocument(w=w, i=i)).result()
        pub.emit(to, JsonDocument(w=w, after=i))
    pub.emit(to, JsonDocument(stop=True, w=w))
"""


def _start_followers(root: Path, n: int, stops: int, stored: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _FOLLOWER, str(root), str(stops), str(stored)],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stderr is not None
        assert p.stderr.readline().strip() == "ready"
    return procs


def _finish(p: subprocess.Popen[str]) -> tuple[list[dict[str, object]], dict[str, object]]:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    return lines[:-1], lines[-1]


def test_followers_in_other_processes_get_emits_once_after_the_appends_before(
    tmp_path: Path,
) -> None:
    """Three writer processes interleave appends and emits; two follower
    processes see every stored frame as a plain reader does, and every emit,
    each once, each after the append its writer completed before it."""
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
    writers, rounds = 3, 150
    followers = _start_followers(root, 2, writers, writers * rounds)
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(root), str(w), str(rounds)], env=ENV)
        for w in range(writers)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    with LocalJournalStore(root) as s:
        stored = [(e.begin, _content(e)) for e in ReadCommittedIter(s, J, _new)]
        head = s.head(J)
    assert len(stored) == writers * rounds
    for f in followers:
        seen, last = _finish(f)
        assert last["lost"] == 0
        assert [(x["begin"], x["doc"]) for x in seen if not x["t"]] == stored  # as before
        emits = [x for x in seen if x["t"]]
        assert all(x["begin"] == TRANSIENT_OFFSET for x in emits)
        after = sorted((d["w"], d["after"]) for x in emits if "after" in (d := x["doc"]))
        assert after == sorted((w, i) for w in range(writers) for i in range(rounds))  # once each
        # Each emit comes after the append its writer finished before emitting it.
        position = {(x["doc"]["w"], x["doc"]["i"]): n for n, x in enumerate(seen) if not x["t"]}
        for n, x in enumerate(seen):
            if x["t"] and "after" in x["doc"]:
                assert position[(x["doc"]["w"], x["doc"]["after"])] < n
        # Checkpoints know nothing of emits: they end at the stored head.
        assert last["checkpoint"]["offsets"] == {J: head}


def test_emits_are_never_stored_nor_seen_by_later_or_non_following_readers(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
        pub = Publisher(s)
        pub.publish_committed(_to, JsonDocument(n=1)).result()
        assert pub.emit(_to, JsonDocument(nobody="listens")) == 0
        head = s.head(J)
        with s.listen(J) as listener, listener.read(0) as reader:
            assert reader.read(1 << 16) == s.read(J).read()  # the stored bytes
            assert pub.emit(_to, JsonDocument(typing=True)) == 1
            assert reader.read(1 << 16) == b""  # returns for the emit, stays open
            (t,) = listener.take(reader.offset)
            assert json.loads(t.data)["typing"] is True and t.head == head
            pub.publish_committed(_to, JsonDocument(n=2)).result()
            assert json.loads(reader.read(1 << 16))["n"] == 2  # and reads on
        assert s.head(J) == head + 64  # the emits took no offsets
        assert [_content(e) for e in ReadUncommittedIter(s, J, _new)] == [{"n": 1}, {"n": 2}]
        with pytest.raises(ValueError, match="block=True"):
            ReadCommittedIter(s, J, _new, transient=True)
        assert not list(root.rglob("*sock*"))  # nothing of it in the store's files


def test_a_stopped_follower_loses_emits_and_says_how_many(tmp_path: Path) -> None:
    """SIGSTOP a follower, emit more than the ring holds (3000 emits of 2 KiB,
    the ring holding 4 MiB): the emitter finishes (it never waits for the
    follower); the follower, resumed, gets the latest emits, reports what it
    lost, and what it got plus what it lost is everything emitted."""
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
    (follower,) = _start_followers(root, 1, 1, 0)
    os.kill(follower.pid, signal.SIGSTOP)
    try:
        emitter = subprocess.Popen(
            [sys.executable, "-c", (
                "import sys\nfrom journal import LocalJournalStore\n"
                "pad = b'x' * 2000\n"
                "with LocalJournalStore(sys.argv[1]) as s:\n"
                "    for i in range(3000):\n"
                "        s.emit('live/j', b'{\"n\": %d, \"pad\": \"%s\"}\\n' % (i, pad))\n"
            ), str(root)],
            env=ENV,
        )
        assert emitter.wait(timeout=120) == 0
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    with LocalJournalStore(root) as s:
        assert s.emit(J, b'{"stop": true}\n') == 1
    seen, last = _finish(follower)
    received = [x["doc"]["n"] for x in seen if "n" in x["doc"]]
    assert 0 < len(received) < 3000
    assert received == list(range(3000 - len(received), 3000))  # the latest, in order
    assert last["lost"] == 3000 - len(received)
    assert RING_SIZE // 2100 <= len(received) <= RING_SIZE // 2000


def test_a_listener_that_falls_a_ring_behind_counts_what_it_lost(tmp_path: Path) -> None:
    with LocalJournalStore(tmp_path / "store") as s:
        s.create(J, NDJSON)
        with s.listen(J) as listener:
            pad = b"y" * (MAX_EMIT - 100)
            laps = RING_SIZE // MAX_EMIT + 10
            for i in range(laps):
                s.emit(J, b'{"n": %d, "pad": "%s"}\n' % (i, pad))
            got = [json.loads(t.data)["n"] for t in listener.take()]
            assert got == list(range(laps - len(got), laps)) and got
            assert listener.lost == laps - len(got)
            assert listener.take() == []
            s.emit(J, b'{"n": -1}\n')
            (t,) = listener.take()
            assert t.seq == laps + 1 and listener.lost == laps - len(got)


def test_emit_refuses_what_is_not_whole_frames_and_clients_without_it(tmp_path: Path) -> None:
    with LocalJournalStore(tmp_path / "store") as s:
        s.create(J, NDJSON)
        with pytest.raises(ValueError, match="whole frames"):
            s.emit(J, b'{"n": 1}')  # no newline: not an NDJSON frame
        with pytest.raises(AppendTooLargeError):
            s.emit(J, b'{"x": "' + b"a" * (1 << 17) + b'"}\n')
        with pytest.raises(JournalNotFoundError):
            s.emit("no/such", b"{}\n")
        with pytest.raises(ValueError):
            s.emit(J, b"")
    mem = MemoryJournalClient()
    mem.create(J, NDJSON)
    with pytest.raises(JournalError, match="no transient messages"):
        mem.emit(J, b"{}\n")
    with pytest.raises(JournalError, match="no transient messages"):
        Publisher(mem).emit(_to, JsonDocument(n=1))
    with pytest.raises(JournalError, match="no transient messages"):
        ReadUncommittedIter(mem, J, _new, block=True, transient=True)


def test_gazette_client_says_it_has_no_transient_path() -> None:
    from journal import GazetteClient

    with GazetteClient("http://127.0.0.1:9", connect_timeout=0.5) as client:
        with pytest.raises(JournalError, match="Gazette brokers have no transient messages"):
            client.emit("a/b", b"{}\n")
        with pytest.raises(JournalError, match="Gazette brokers have no transient messages"):
            client.listen("a/b")


def test_cli_emit_and_read_follow_transient(tmp_path: Path) -> None:
    root = tmp_path / "store"
    exactly = [sys.executable, "-m", "exactly"]
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
    follower = subprocess.Popen(
        [*exactly, "read", J, "--follow", "--transient", "--limit", "3", "--root", str(root)],
        env=ENV, stdout=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until it listens
            r = subprocess.run([*exactly, "emit", J, "--root", str(root)], input='{"ping": 1}\n',
                               env=ENV, capture_output=True, text=True, check=True)
            if "reached 1 follower" in r.stderr:
                break
            time.sleep(0.2)
        subprocess.run([*exactly, "append", J, "--root", str(root)], input='{"n": 1}\n',
                       env=ENV, check=True, capture_output=True, text=True)
        subprocess.run([*exactly, "emit", J, "--root", str(root)], input='{"typing": true}\n',
                       env=ENV, check=True, capture_output=True, text=True)
        out, _ = follower.communicate(timeout=60)
    finally:
        follower.kill()
    docs = [json.loads(x) for x in out.splitlines()]
    assert [(d.get("transient", False), d["begin"]) for d in docs] == [
        (True, -1), (False, 0), (True, -1)
    ]
    assert docs[2]["message"]["typing"] is True
    r = subprocess.run([*exactly, "read", J, "--transient", "--root", str(root)],
                       env=ENV, capture_output=True, text=True)
    assert r.returncode != 0 and "--transient goes with --follow" in r.stderr


def test_uncommitted_reads_with_skip_corrupt_yield_emits_between_stored_frames(
    tmp_path: Path,
) -> None:
    """In one process, through the native or the Python loop: an emit made
    while the reader waits comes between the frames around it; a damaged
    frame is still skipped and counted."""
    import threading

    with LocalJournalStore(tmp_path / "store") as s:
        s.create(J, NDJSON)
        s.append(J, b'{"n": 1}\nnot json\n').result()
        it = ReadUncommittedIter(s, J, _new, block=True, transient=True, skip_corrupt=True)
        got: list[tuple[bool, dict[str, object]]] = []
        first = threading.Event()

        def follow() -> None:
            for env in it:
                got.append((env.transient, _content(env)))
                first.set()

        t = threading.Thread(target=follow)
        t.start()
        assert first.wait(30)
        deadline = time.monotonic() + 30
        while s.emit(J, b'{"ping": 1}\n') == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        s.append(J, b'{"n": 2}\n').result()
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        it.interrupt()
        t.join(30)
        it.close()
    assert got == [(False, {"n": 1}), (True, {"ping": 1}), (False, {"n": 2})]
    assert it.skipped == 1 and it.transient_lost == 0


def test_an_unusable_meeting_place_is_one_clear_error(tmp_path: Path) -> None:
    """Emits go through $XDG_RUNTIME_DIR when it is usable: a file where the
    meeting place's directory should be makes emit and listen fail with one
    JournalError naming it, not an OSError from deep down."""
    runtime = tmp_path / "run"
    runtime.mkdir()
    (runtime / f"exactly-transient-{os.getuid()}").write_text("not a directory")
    env = {**ENV, "XDG_RUNTIME_DIR": str(runtime)}
    code = (
        "import sys\n"
        "from journal import JournalError, LocalJournalStore\n"
        "with LocalJournalStore(sys.argv[1]) as s:\n"
        "    s.create('live/j', {'content-type': 'application/x-ndjson'})\n"
        "    for call in (lambda: s.emit('live/j', b'{}\\n'), lambda: s.listen('live/j')):\n"
        "        try:\n"
        "            call()\n"
        "        except JournalError as exc:\n"
        "            print(exc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("cannot emit to 'live/j'") and str(runtime) in lines[0]
    assert lines[1].startswith("cannot listen to 'live/j'")


def test_cli_follower_says_how_many_emits_it_missed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    exactly = [sys.executable, "-m", "exactly"]
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
    follower = subprocess.Popen(
        [*exactly, "read", J, "--follow", "--transient", "--limit", "2", "--root", str(root)],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        with LocalJournalStore(root) as s:
            while s.emit(J, b'{"ping": 1}\n') == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)  # it takes the ping
            os.kill(follower.pid, signal.SIGSTOP)
            try:
                pad = b"x" * 2000
                for i in range(3000):
                    s.emit(J, b'{"n": %d, "pad": "%s"}\n' % (i, pad))
            finally:
                os.kill(follower.pid, signal.SIGCONT)
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    docs = [json.loads(x)["message"] for x in out.splitlines()]
    assert docs[0]["ping"] == 1 and docs[1]["n"] > 0
    missed = int(err.split("missed ")[1].split()[0].replace(",", ""))
    assert missed == docs[1]["n"]  # everything before the first it got


def test_emit_counts_exactly_the_listeners_that_get_it(tmp_path: Path) -> None:
    """Listeners come up while another thread emits: each emit's count is the
    number of listeners that take it (a listener set up under the ring's
    lock gets every emit from the next one on, and only those)."""
    import threading

    with LocalJournalStore(tmp_path / "store") as s:
        s.create(J, NDJSON)
        counts: dict[int, int] = {}
        done = threading.Event()

        def emitter() -> None:
            for i in range(400):
                counts[i] = s.emit(J, b'{"n": %d}\n' % i)
            done.set()

        t = threading.Thread(target=emitter)
        listeners = []
        t.start()
        while not done.is_set() and len(listeners) < 25:
            listeners.append(s.listen(J))
            time.sleep(0.002)
        t.join(60)
        got: dict[int, int] = {}
        for listener in listeners:
            for tr in listener.take():
                n = json.loads(tr.data)["n"]
                got[n] = got.get(n, 0) + 1
            assert listener.lost == 0
            listener.close()
    assert {i: got.get(i, 0) for i in range(400)} == counts
    assert len(set(counts.values())) > 1  # listeners came up while it emitted
