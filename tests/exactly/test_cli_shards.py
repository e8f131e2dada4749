"""``exactly shards show``: a shard's checkpoint from its store, beside the
write heads of its sources (run as a user would, in subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from consumer import Runner, ShardSpec
from journal import LocalJournalStore
from tests.consumer_support import NDJSON, CountingApp, make_input

SOURCES = ["in/part-0", "in/part-1"]
OUTPUTS = ["out/part-0", "out/part-1"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exactly", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """A store of journals and a shard "count" that consumed them, in JSON
    and SQLite stores; then 20 more messages that it has not consumed."""
    with LocalJournalStore(tmp_path / "journals") as j:
        for name in SOURCES + OUTPUTS:
            j.create(name, NDJSON)
        make_input(j, SOURCES, 200, seed=1)
        for kind in (f"json:{tmp_path}/state/{{shard}}", f"sqlite:{tmp_path}/state.db"):
            app = CountingApp(kind, {"count": OUTPUTS})
            with Runner(j, app, [ShardSpec("count", SOURCES)]) as runner:
                runner.run_until_idle(timeout=60)
        make_input(j, SOURCES[:1], 20, seed=2, messy=False)
    return tmp_path


@pytest.mark.parametrize("store", ["state/count", "json:state/count", "state.db",
                                   "sqlite:state.db"])
def test_shows_offsets_lag_producers_and_intents(served: Path, store: str) -> None:
    """Offsets and lag per source, producers with open transactions, the ACK
    intents of the last commit; as JSON too."""
    r = run("--root", "journals", "shards", "show", "--store", store, "--json", cwd=served)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["shard"] == "count"
    with LocalJournalStore(served / "journals") as j:
        heads = {s: j.head(s) for s in SOURCES}
    lags = {s["journal"]: s["lag"] for s in doc["sources"]}
    assert lags["in/part-1"] == 0 and lags["in/part-0"] > 0  # 20 messages behind
    assert all(s["head"] == heads[s["journal"]] for s in doc["sources"])
    assert set(doc["ack_intents"]) == set(OUTPUTS)
    # make_input leaves some transactions never acknowledged: open spans
    assert any(p["open_since"] is not None for p in doc["producers"])
    text = run("--root", "journals", "shards", "show", "--store", store, cwd=served)
    assert text.returncode == 0, text.stderr
    assert "shard count" in text.stdout and "with a transaction open" in text.stdout
    assert f"{lags['in/part-0']:,}" in text.stdout


def test_without_journals_the_lag_is_unknown(served: Path) -> None:
    """With no journal store at hand, offsets are shown and the heads are '?'."""
    r = run("shards", "show", "--store", str(served / "state.db"), cwd=served / "state")
    assert r.returncode == 0, r.stderr
    assert "?" in r.stdout and "write heads unknown" in r.stdout


def test_a_cluster_that_does_not_answer_is_said_so_not_taken_for_journals_gone(
        served: Path) -> None:
    """Heads asked of a broker where nothing answers: `shards show` shows
    the checkpoint and says the heads are unknown, why and where; `lag`
    fails with one line naming the address (it printed `gone`, exit 0)."""
    dead = "http://127.0.0.1:9"
    r = run("--broker", dead, "shards", "show", "--store", "state.db", cwd=served)
    assert r.returncode == 0, r.stderr
    assert "shard count" in r.stdout
    assert "write heads unknown" in r.stdout and dead in r.stdout, r.stdout
    r = run("--broker", dead, "lag", "--store", "state.db", cwd=served)
    assert r.returncode == 1 and "gone" not in r.stdout, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("exactly: error:") and dead in lines[0]


@pytest.mark.parametrize(("args", "error"), [
    (["--store", "nowhere.db"], "no store at nowhere.db"),
    (["--store", "state.db", "other"], "no shard other in state.db (it holds: count)"),
    (["--store", "journals"], "journals holds no JSONFileStore state file"),
])
def test_mistakes_are_one_line(served: Path, args: list[str], error: str) -> None:
    """A store that is not there, a shard it does not hold: one line, exit 1."""
    r = run("shards", "show", *args, cwd=served)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [f"exactly: error: {error}"], r.stderr


def test_reading_a_sqlite_file_changes_nothing_in_it(tmp_path: Path) -> None:
    """shards show reads a SQLite file read-only (as lag does, through the
    same function): one that holds no store is said so, and left byte for
    byte as it was (no table made, no journal mode set)."""
    import sqlite3

    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (a)")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    for args in (["shards", "show", "--store", "sqlite:app.db"],
                 ["shards", "show", "--store", "app.db"]):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        assert r.stderr.splitlines() == [
            "exactly: error: app.db holds no SQLiteStore (no exactly_checkpoints table)"]
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_a_postgres_server_that_never_answers_is_one_line_within_seconds(
        tmp_path: Path) -> None:
    """A PostgreSQL address where something listens but never answers:
    one line within the command's connect timeout (5 s), not libpq's wait."""
    import socket
    import time

    pytest.importorskip("psycopg")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(5)
        port = silent.getsockname()[1]
        started = time.monotonic()
        r = run("shards", "show", "--store", f"postgresql://u@127.0.0.1:{port}/db", cwd=tmp_path)
        took = time.monotonic() - started
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "cannot open the PostgreSQL store" in r.stderr and took < 15


def _lag(served: Path, *args: str) -> dict[str, dict[str, object]]:
    r = run("--root", "journals", "lag", *args, "--json", cwd=served)
    assert r.returncode == 0, r.stderr
    return {d["journal"]: d for d in map(json.loads, r.stdout.splitlines())}


def test_lag_of_a_shard_a_checkpoint_file_and_a_spark_query(served: Path) -> None:
    """The shard consumed everything, then 20 committed messages came to
    in/part-0: 20 messages behind there (bytes: to the head), none on
    in/part-1; the same position as a checkpoint file, and as a Spark
    query's last committed micro-batch, gives the same figures."""
    with LocalJournalStore(served / "journals") as j:
        heads = {s: j.head(s) for s in SOURCES}
    lag = _lag(served, "--store", "state.db")
    assert lag["in/part-0"]["messages_behind"] == 20
    assert lag["in/part-1"]["messages_behind"] == 0
    for s in SOURCES:
        assert lag[s]["bytes_behind"] == heads[s] - lag[s]["offset"]  # type: ignore[operator]
    assert lag["in/part-1"]["oldest_unread_age_s"] is None
    assert isinstance(lag["in/part-0"]["oldest_unread_age_s"], float)

    from consumer import SQLiteStore

    store = SQLiteStore(served / "state.db")
    try:
        cp = store.read_checkpoints()["count"]
    finally:
        store.close()
    (served / "count.ckpt").write_bytes(cp.to_bytes())
    figures = ("offset", "head", "bytes_behind", "messages_behind")
    from_file = _lag(served, "--checkpoint", "count.ckpt")
    assert {k: [v[f] for f in figures] for k, v in from_file.items()} == {
        k: [v[f] for f in figures] for k, v in lag.items()
    }
    assert {v["consumer"] for v in from_file.values()} == {"count.ckpt"}

    # A Spark checkpoint location: batch 1 planned (to the heads), batch 0
    # committed (at the shard's position): the position is batch 0's.
    loc = served / "query"
    (loc / "offsets").mkdir(parents=True)
    (loc / "commits").mkdir()
    states: dict[str, dict[str, str]] = {}
    for s in cp.states:
        states.setdefault(s.journal, {})[s.producer.hex()] = f"{s.last_ack}:{s.begin}"
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":0}'
    batch0 = json.dumps({"offsets": dict(cp.offsets), "states": states})
    batch1 = json.dumps({"offsets": heads, "states": states})
    (loc / "offsets" / "0").write_text(f"v1\n{meta}\n{batch0}")
    (loc / "offsets" / "1").write_text(f"v1\n{meta}\n{batch1}")
    (loc / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    spark = _lag(served, "--spark-checkpoint", "query")
    assert {k: v["messages_behind"] for k, v in spark.items()} == {
        "in/part-0": 20, "in/part-1": 0}
    (loc / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}')
    spark = _lag(served, "--spark-checkpoint", "query")
    assert {k: v["messages_behind"] for k, v in spark.items()} == {
        "in/part-0": 0, "in/part-1": 0}


def test_an_offset_past_the_write_head_is_flagged_not_taken_for_caught_up(served: Path) -> None:
    """A journal that lost what the shard read (here made again, shorter):
    lag and shards show say the offset is past the head, and why it matters,
    rather than 0 behind."""
    with LocalJournalStore(served / "journals") as j:
        j.delete("in/part-1")
        j.create("in/part-1", NDJSON)
        j.append("in/part-1", b'{"n": 1}\n').result()
        head = j.head("in/part-1")
    lag = _lag(served, "--store", "state.db")
    past = lag["in/part-1"]["bytes_past_head"]
    assert past == lag["in/part-1"]["offset"] - head > 0  # type: ignore[operator]
    assert lag["in/part-1"]["bytes_behind"] == 0 and lag["in/part-0"]["bytes_past_head"] == 0
    text = run("--root", "journals", "lag", "--store", "state.db", cwd=served)
    assert f"past head {past}" in text.stdout and "never read" in text.stdout
    shown = run("--root", "journals", "shards", "show", "--store", "state.db", "--json",
                cwd=served)
    sources = {x["journal"]: x for x in json.loads(shown.stdout)["sources"]}
    assert sources["in/part-1"]["past_head"] == past and sources["in/part-0"]["past_head"] == 0
    text = run("--root", "journals", "shards", "show", "--store", "state.db", cwd=served)
    assert f"past head {past:,}" in text.stdout and "never read" in text.stdout


def test_lag_table_watch_and_mistakes(served: Path) -> None:
    r = run("--root", "journals", "lag", "--store", "state.db", cwd=served)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["consumer", "journal", "offset"]
    assert any("in/part-0" in x and " 20 " in x for x in lines)
    watch = subprocess.Popen(
        [sys.executable, "-m", "exactly", "--root", "journals", "lag", "--store", "state.db",
         "--watch", "0.2"], cwd=served, stdout=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        seen = 0
        for line in watch.stdout:
            seen += line.startswith("consumer")
            if seen == 2:
                break
    finally:
        watch.send_signal(2)  # SIGINT: it stops between two refreshes
        try:
            watch.communicate(timeout=60)  # (reading what it still prints)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.communicate()
            raise
    assert watch.returncode == 0
    for args, error in (
        (["--store", "state.db", "nope"], "no shard nope"),
        (["--checkpoint", "missing.ckpt"], "no checkpoint file"),
        (["--spark-checkpoint", "journals"], "not a streaming query's checkpoint location"),
    ):
        r = run("--root", "journals", "lag", *args, cwd=served)
        assert r.returncode == 1 and error in r.stderr, r.stderr


def test_lag_watch_counts_what_arrives_between_refreshes(tmp_path: Path) -> None:
    """`lag --watch` counts only what was appended since its last refresh
    while the consumer stays put, and gets the same figures as a fresh
    `lag`: a transaction open across a refresh is counted once it commits,
    and its roll-back never."""
    from message import Checkpoint, JsonDocument, Publisher, modulo_mapping

    root = tmp_path / "journals"
    with LocalJournalStore(root) as store:
        spec = store.create("in", NDJSON)
        to_in = modulo_mapping(lambda d: "k", lambda: [spec])
        pub = Publisher(store)
        for i in range(5):
            pub.publish_committed(to_in, JsonDocument(n=i))
        store.flush()
        (tmp_path / "at0.json").write_text(Checkpoint({"in": 0}, []).to_json())
    watch = subprocess.Popen(
        [sys.executable, "-m", "exactly", "--root", str(root), "lag", "--checkpoint",
         "at0.json", "--json", "--watch", "0.1"], cwd=tmp_path, stdout=subprocess.PIPE,
        text=True)

    def next_count(want: int) -> int:
        assert watch.stdout is not None
        for line in watch.stdout:
            if not line.strip():
                continue  # between two refreshes
            n = json.loads(line)["messages_behind"]
            if n == want:
                return n
        raise AssertionError("lag --watch ended")

    try:
        assert next_count(5) == 5
        with LocalJournalStore(root) as store:
            pub = Publisher(store)
            rolled = Publisher(store)
            for i in range(3):
                pub.publish_uncommitted(to_in, JsonDocument(n=10 + i))
                rolled.publish_uncommitted(to_in, JsonDocument(n=20 + i))
            store.flush()
            next_count(5)  # open: not counted yet
            for intent in pub.build_ack_intents() + rolled.build_rollback_intents():
                store.append(intent.journal, intent.intent).result()
            pub.publish_committed(to_in, JsonDocument(n=30))
            store.flush()
            # 5 + 3 committed by the ACK + its ACK + 1, as a fresh count says.
            fresh = json.loads(run("--root", str(root), "lag", "--checkpoint", "at0.json",
                                   "--json", cwd=tmp_path).stdout)["messages_behind"]
            assert fresh == 10
            assert next_count(fresh) == fresh
    finally:
        watch.send_signal(2)
        try:
            watch.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.communicate()
            raise
