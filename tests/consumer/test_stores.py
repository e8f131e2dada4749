"""The stores: each passes the Store contract (consumer.testing), commits the
application's changes with the checkpoint or not at all, and fences off
every instance restored before the newest."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from consumer import (
    ConsumerError,
    FencedError,
    JSONFileStore,
    PostgresStore,
    Shard,
    ShardSpec,
    SQLiteStore,
    StoreError,
)
from consumer.testing import check_store
from journal import MemoryJournalClient
from message import Checkpoint, ProducerState


def shard(shard_id: str = "s-1") -> Shard:
    return Shard(ShardSpec(shard_id, sources=["in"]), MemoryJournalClient())


def cp(n: int) -> Checkpoint:
    return Checkpoint({"in": n}, [ProducerState("in", b"\x01" * 6, n + 1, -1)],
                      {"out": b'{"ack":%d}\n' % n})


# -- the contract ---------------------------------------------------------------


def test_json_file_store_keeps_the_contract(tmp_path: Path) -> None:
    """JSONFileStore passes the Store conformance checks."""
    check_store(lambda: JSONFileStore(tmp_path / "store"))


def test_sqlite_store_keeps_the_contract(tmp_path: Path) -> None:
    """SQLiteStore passes the Store conformance checks, several shards in one file."""
    check_store(lambda: SQLiteStore(tmp_path / "store.db"), several_shards=True)


def test_postgres_store_keeps_the_contract(postgres_dsn: str) -> None:
    """PostgresStore passes the Store conformance checks on a real server."""
    check_store(lambda: PostgresStore(postgres_dsn), several_shards=True)


def test_the_contract_check_finds_a_store_that_does_not_fence(tmp_path: Path) -> None:
    """check_store fails a store whose commits ignore a newer restore."""

    class Unfenced(SQLiteStore):
        def restore_checkpoint(self, shard: Shard) -> Checkpoint:
            restored = super().restore_checkpoint(shard)
            self._fence = None  # forget the fence ...
            return restored

        def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None:
            self.connection.execute(  # ... and write whatever the row holds
                f"UPDATE {self.table} SET checkpoint = ? WHERE shard = ?",
                (checkpoint.to_bytes(), shard.id))
            self.connection.commit()

    with pytest.raises(AssertionError, match="FencedError"):
        check_store(lambda: Unfenced(tmp_path / "unfenced.db"))


# -- JSONFileStore ----------------------------------------------------------------


def test_json_state_commits_with_the_checkpoint(tmp_path: Path) -> None:
    """.state is restored as committed; changes never committed are not."""
    a = JSONFileStore(tmp_path / "s")
    assert a.restore_checkpoint(shard()) == Checkpoint() and a.state == {}
    a.state["words"] = {"cat": 2}
    a.start_commit(shard(), cp(1))
    a.state["words"]["dog"] = 1  # a transaction that never commits
    b = JSONFileStore(tmp_path / "s")
    assert b.restore_checkpoint(shard()) == cp(1)
    assert b.state == {"words": {"cat": 2}}


def test_json_prepared_commit_is_the_state_as_prepared(tmp_path: Path) -> None:
    """prepare_commit takes .state as it is then, written aside: a reader sees
    the last commit until commit(); what the application changes after the
    prepare belongs to the next commit."""
    a = JSONFileStore(tmp_path / "s")
    a.restore_checkpoint(shard())
    a.state["words"] = {"cat": 2}
    a.start_commit(shard(), cp(1))
    a.state["words"]["dog"] = 1
    prepared = a.prepare_commit(shard(), cp(2))
    a.state["words"]["emu"] = 5  # the next transaction, begun at once
    assert a.read_checkpoint()[1:] == (cp(1), {"words": {"cat": 2}})
    prepared.commit()
    assert a.read_checkpoint()[1:] == (cp(2), {"words": {"cat": 2, "dog": 1}})
    with pytest.raises(ConsumerError, match="committed or aborted already"):
        prepared.commit()
    prepared.abort()  # (after a commit: nothing to drop)
    a.start_commit(shard(), cp(3))
    b = JSONFileStore(tmp_path / "s")
    assert b.restore_checkpoint(shard()) == cp(3)
    assert b.state == {"words": {"cat": 2, "dog": 1, "emu": 5}}


def test_json_prepared_commit_aborted_or_fenced_leaves_nothing(tmp_path: Path) -> None:
    """An aborted prepared commit, or one fenced off at its commit(), leaves
    no file behind and the last commit standing."""
    a = JSONFileStore(tmp_path / "s")
    a.restore_checkpoint(shard())
    a.start_commit(shard(), cp(1))

    def temps() -> list[str]:
        return [p.name for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp")]

    prepared = a.prepare_commit(shard(), cp(2))
    assert len(temps()) == 1
    prepared.abort()
    assert temps() == []
    prepared = a.prepare_commit(shard(), cp(3))
    b = JSONFileStore(tmp_path / "s")
    assert b.restore_checkpoint(shard()) == cp(1)  # fences `a` off
    with pytest.raises(FencedError):
        prepared.commit()
    assert temps() == []
    a.close()
    with pytest.raises(StoreError, match="closed"):
        a.prepare_commit(shard(), cp(4))
    assert JSONFileStore(tmp_path / "s").restore_checkpoint(shard()) == cp(1)


def test_json_store_keeps_a_few_generations(tmp_path: Path) -> None:
    """Old generations are removed as commits go on; the newest is the state."""
    s = JSONFileStore(tmp_path / "s")
    s.restore_checkpoint(shard())
    for n in range(20):
        s.state["n"] = n
        s.start_commit(shard(), cp(n))
    files = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert len(files) <= 4, files
    again = JSONFileStore(tmp_path / "s")
    assert again.restore_checkpoint(shard()) == cp(19) and again.state == {"n": 19}


def test_json_store_ignores_a_temp_file_left_by_a_crash(tmp_path: Path) -> None:
    """A half-written temporary file (a crash during a commit) is not the state."""
    s = JSONFileStore(tmp_path / "s")
    s.restore_checkpoint(shard())
    s.state["n"] = 1
    s.start_commit(shard(), cp(1))
    (tmp_path / "s" / ".tmp-1234-abcdef").write_bytes(b'{"checkpoint": {"off')
    again = JSONFileStore(tmp_path / "s")
    assert again.restore_checkpoint(shard()) == cp(1) and again.state == {"n": 1}


def test_json_restore_removes_temp_files_crashes_left(tmp_path: Path) -> None:
    """A restore removes temporary files a minute old or more (left by a
    crash between writing and linking) and leaves younger ones, which may
    be another instance's, in flight."""
    s = JSONFileStore(tmp_path / "s")
    s.restore_checkpoint(shard())
    s.start_commit(shard(), cp(1))
    old, young = tmp_path / "s" / ".tmp-1-aaaa", tmp_path / "s" / ".tmp-2-bbbb"
    old.write_bytes(b'{"half')
    young.write_bytes(b'{"half')
    two_minutes_ago = time.time() - 120
    os.utime(old, (two_minutes_ago, two_minutes_ago))
    again = JSONFileStore(tmp_path / "s")
    assert again.restore_checkpoint(shard()) == cp(1)
    assert not old.exists() and young.exists()


def test_json_zombie_whose_prepared_file_was_removed_is_fenced(tmp_path: Path) -> None:
    """A zombie stopped for minutes between preparing and committing finds
    its file removed by the newer instance's restore: FencedError, and the
    newer instance's state stands."""
    a = JSONFileStore(tmp_path / "s")
    a.restore_checkpoint(shard())
    a.start_commit(shard(), cp(1))
    prepared = a.prepare_commit(shard(), cp(2))
    (tmp,) = (tmp_path / "s").glob(".tmp-*")
    os.utime(tmp, (time.time() - 300, time.time() - 300))
    b = JSONFileStore(tmp_path / "s")
    assert b.restore_checkpoint(shard()) == cp(1)
    assert not tmp.exists()
    with pytest.raises(FencedError):
        prepared.commit()
    b.start_commit(shard(), cp(3))
    assert JSONFileStore(tmp_path / "s").restore_checkpoint(shard()) == cp(3)


def test_json_zombie_whose_next_generation_was_removed_is_fenced(tmp_path: Path) -> None:
    """An instance left behind while a newer one committed many times (its
    next generation long removed) cannot commit: FencedError, and its file
    does not stay."""
    zombie = JSONFileStore(tmp_path / "s")
    zombie.restore_checkpoint(shard())
    zombie.state["who"] = "zombie"
    newer = JSONFileStore(tmp_path / "s")
    newer.restore_checkpoint(shard())
    for n in range(10):
        newer.state["who"] = f"newer {n}"
        newer.start_commit(shard(), cp(n))
    with pytest.raises(FencedError) as info:
        zombie.start_commit(shard(), cp(99))
    assert info.value.shard == "s-1"
    last = JSONFileStore(tmp_path / "s")
    assert last.restore_checkpoint(shard()) == cp(9) and last.state == {"who": "newer 9"}
    newer.state["who"] = "newer 10"
    with pytest.raises(FencedError):  # `last` restored: `newer` is fenced now
        newer.start_commit(shard(), cp(10))


def test_json_state_that_is_not_json_is_a_store_error(tmp_path: Path) -> None:
    """A state that JSON cannot hold fails the commit and writes nothing."""
    s = JSONFileStore(tmp_path / "s")
    s.restore_checkpoint(shard())
    s.state[1] = "an int key"  # type: ignore[index]
    with pytest.raises(StoreError, match="not JSON"):
        s.start_commit(shard(), cp(1))
    again = JSONFileStore(tmp_path / "s")
    assert again.restore_checkpoint(shard()) == Checkpoint()
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp")]


def test_a_commit_the_file_system_refuses_is_a_store_error(tmp_path: Path) -> None:
    """A JSONFileStore whose directory is gone at its commit raises one
    StoreError naming the shard, chained to the file system's error."""
    s = JSONFileStore(tmp_path / "s")
    s.restore_checkpoint(shard())
    (tmp_path / "s").rename(tmp_path / "moved")
    (tmp_path / "s").write_text("not a directory")
    with pytest.raises(StoreError, match=r"s-1.*could not commit") as info:
        s.start_commit(shard(), cp(1))
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.shard == "s-1" and info.value.store == "JSONFileStore"


def test_a_commit_sqlite_refuses_is_a_store_error(tmp_path: Path) -> None:
    """A SQLiteStore that cannot take the write lock within its timeout (a
    connection of another program holds it) raises one StoreError chained to
    sqlite3's error; it commits once the lock is free."""
    s = SQLiteStore(tmp_path / "s.db", timeout=0.2)
    s.restore_checkpoint(shard())
    other = sqlite3.connect(tmp_path / "s.db")
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError, match=r"s-1.*could not commit") as info:
        s.start_commit(shard(), cp(1))
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    other.rollback()
    other.close()
    s.start_commit(shard(), cp(2))
    s.close()
    assert SQLiteStore(tmp_path / "s.db").restore_checkpoint(shard()) == cp(2)


def test_json_store_on_a_file_or_a_damaged_generation(tmp_path: Path) -> None:
    """A path that is a file, or a newest generation that is not a state
    file, is one StoreError naming it."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        JSONFileStore(tmp_path / "file")
    s = JSONFileStore(tmp_path / "s")
    s.restore_checkpoint(shard())
    s.start_commit(shard(), cp(1))
    newest = max((tmp_path / "s").glob("*.json"))
    newest.write_bytes(b"garbage")
    with pytest.raises(StoreError, match=newest.name):
        JSONFileStore(tmp_path / "s").restore_checkpoint(shard())


def test_json_read_checkpoint_fences_nothing(tmp_path: Path) -> None:
    """read_checkpoint (for inspection) leaves the serving instance able to commit."""
    s = JSONFileStore(tmp_path / "s")
    s.restore_checkpoint(shard())
    s.state["n"] = 1
    s.start_commit(shard(), cp(1))
    assert JSONFileStore(tmp_path / "s").read_checkpoint() == ("s-1", cp(1), {"n": 1})
    s.start_commit(shard(), cp(2))


# -- SQL stores -----------------------------------------------------------------


def test_sqlite_statements_commit_with_the_checkpoint(tmp_path: Path) -> None:
    """The application's statements commit with the checkpoint; those of a
    transaction never committed are not seen, nor restored."""
    db = tmp_path / "s.db"
    a = SQLiteStore(db)
    a.connection.execute("CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, n INTEGER)")
    a.restore_checkpoint(shard())
    a.connection.execute("INSERT INTO counts VALUES ('cat', 1)")
    a.start_commit(shard(), cp(1))
    a.connection.execute("INSERT INTO counts VALUES ('dog', 1)")  # never committed
    look = sqlite3.connect(db)
    assert look.execute("SELECT k FROM counts").fetchall() == [("cat",)]
    look.close()
    a.close()  # as a crash does: the open transaction is rolled back
    b = SQLiteStore(db)
    assert b.restore_checkpoint(shard()) == cp(1)
    assert b.connection.execute("SELECT k FROM counts").fetchall() == [("cat",)]
    b.close()


def test_sqlite_fenced_commit_rolls_back_the_statements(tmp_path: Path) -> None:
    """A commit of an instance fenced off writes neither its rows nor its checkpoint."""
    db = tmp_path / "s.db"
    a = SQLiteStore(db)
    a.connection.execute("CREATE TABLE counts (k TEXT PRIMARY KEY, n INTEGER)")
    a.restore_checkpoint(shard())
    b = SQLiteStore(db)
    b.restore_checkpoint(shard())  # fences `a`
    a.connection.execute("INSERT INTO counts VALUES ('cat', 1)")
    with pytest.raises(FencedError):
        a.start_commit(shard(), cp(1))
    assert a.connection.execute("SELECT count(*) FROM counts").fetchone() == (0,)
    look = sqlite3.connect(db)
    assert look.execute("SELECT count(*) FROM counts").fetchone() == (0,)
    assert SQLiteStore(db).read_checkpoints() == {"s-1": Checkpoint()}
    for s in (a, b):
        s.close()


def test_sqlite_set_up_statements_are_committed_by_restore(tmp_path: Path) -> None:
    """Rows written before restore_checkpoint (seed data) are committed by it."""
    db = tmp_path / "s.db"
    a = SQLiteStore(db)
    a.connection.execute("CREATE TABLE seed (k TEXT)")
    a.connection.execute("INSERT INTO seed VALUES ('x')")
    a.restore_checkpoint(shard())
    a.close()
    assert sqlite3.connect(db).execute("SELECT k FROM seed").fetchall() == [("x",)]


def test_sqlite_commits_are_durable_in_wal(tmp_path: Path) -> None:
    """The database runs in WAL mode with synchronous=FULL (a commit is fsynced)."""
    s = SQLiteStore(tmp_path / "s.db")
    assert s.connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert s.connection.execute("PRAGMA synchronous").fetchone() == (2,)


def test_sql_table_name_is_checked(tmp_path: Path) -> None:
    """A table name that is not a plain identifier is refused (no SQL injection)."""
    with pytest.raises(ValueError, match="table name"):
        SQLiteStore(tmp_path / "s.db", table="x; DROP TABLE y")


def test_sqlite_store_of_a_bad_path_is_a_store_error(tmp_path: Path) -> None:
    """A database that cannot be opened is one StoreError naming it."""
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreError, match=r"dir\.db"):
        SQLiteStore(tmp_path / "dir.db")


def test_postgres_fenced_commit_rolls_back_the_statements(postgres_dsn: str) -> None:
    """On PostgreSQL too: a fenced instance's rows and checkpoint are not committed."""
    a = PostgresStore(postgres_dsn)
    a.connection.execute("CREATE TABLE counts (k TEXT PRIMARY KEY, n INTEGER)")
    a.connection.commit()
    assert a.restore_checkpoint(shard()) == Checkpoint()
    a.connection.execute("INSERT INTO counts VALUES ('cat', 1)")
    a.start_commit(shard(), cp(1))
    b = PostgresStore(postgres_dsn)
    assert b.restore_checkpoint(shard()) == cp(1)
    a.connection.execute("INSERT INTO counts VALUES ('dog', 1)")
    with pytest.raises(FencedError):
        a.start_commit(shard(), cp(2))
    rows = b.connection.execute("SELECT k FROM counts ORDER BY k").fetchall()
    assert rows == [("cat",)]
    b.connection.rollback()
    assert b.read_checkpoints() == {"s-1": cp(1)}
    for s in (a, b):
        s.close()


def test_postgres_store_without_a_server_is_a_store_error() -> None:
    """An address where no server answers is one StoreError."""
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError, match="cannot open"):
        PostgresStore("host=127.0.0.1 port=1 user=postgres dbname=x connect_timeout=2")


def test_stores_leave_no_file_open(tmp_path: Path) -> None:
    """Closing a SQLite store closes its connection."""
    s = SQLiteStore(tmp_path / "s.db")
    s.restore_checkpoint(shard())
    s.close()
    with pytest.raises(sqlite3.ProgrammingError):
        s.connection.execute("SELECT 1")
    assert os.path.exists(tmp_path / "s.db")


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_closed_store_closes_again_quietly_and_commits_no_more(
        tmp_path: Path, kind: str) -> None:
    """close() twice is no error (the runtime closes a store, and so may its
    application); a closed store's restore and commit are StoreErrors."""
    s: JSONFileStore | SQLiteStore = (
        JSONFileStore(tmp_path / "j") if kind == "json" else SQLiteStore(tmp_path / "s.db"))
    s.restore_checkpoint(shard())
    s.start_commit(shard(), cp(1))
    s.close()
    s.close()
    with pytest.raises(StoreError):
        s.start_commit(shard(), cp(2))
    with pytest.raises(StoreError):
        s.restore_checkpoint(shard())
    again = JSONFileStore(tmp_path / "j") if kind == "json" else SQLiteStore(tmp_path / "s.db")
    assert again.restore_checkpoint(shard()) == cp(1)  # the refused commit wrote nothing
    again.close()


def test_fenced_error_is_raised_as_any_exception_and_pickles() -> None:
    """A store of one's own raises FencedError("...") (the shard is optional);
    it pickles with its attributes, as the other consumer errors do."""
    import pickle

    e = FencedError("another instance restored")
    assert str(e) == "another instance restored" and e.shard is None
    for err in (e, FencedError("m", shard="s-1"),
                StoreError("x", shard="s-1", store="SQLiteStore")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and back.args == err.args
        assert back.__dict__ == err.__dict__
