"""SQL stores: the application's statements and the checkpoint in one SQL transaction.

The checkpoint lives in a table of the database, one row per shard, with a
fence column, as Gazette's ``SQLStore`` keeps it::

    CREATE TABLE exactly_checkpoints (
        shard      TEXT    PRIMARY KEY,
        fence      INTEGER NOT NULL,     -- incremented by each restore
        checkpoint BLOB    NOT NULL      -- message.Checkpoint.to_bytes()
    )

``restore_checkpoint`` increments the shard's fence and reads the
checkpoint in one transaction, and remembers the fence. ``start_commit``
writes the checkpoint only where the fence is still the one it read, in the
transaction that holds the application's statements, and commits: if
another instance restored meanwhile, no row matches, the transaction is
rolled back and ``FencedError`` is raised.

``SQLiteStore`` and ``PostgresStore`` differ only in how they connect and
in their SQL dialect; the rules above are ``SQLStore``'s.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import urllib.parse
from typing import TYPE_CHECKING, Any, ClassVar, Final

from message import Checkpoint, CheckpointError

from ._errors import ConsumerError, FencedError, StoreError, store_failures

if TYPE_CHECKING:
    from ._shard import Shard

log = logging.getLogger("consumer")

DEFAULT_TABLE: Final = "exactly_checkpoints"
_TABLE_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")


class SQLStore:
    """The checkpoint table and its fence over a DB-API ``connection``
    (see the module docstring); subclasses open the connection and say how
    their dialect bumps the fence (``_bump_fence``)."""

    #: The DB-API parameter marker of the driver.
    _MARK: ClassVar[str] = "?"
    #: The driver's errors: a restore or a commit raises them as StoreError.
    _driver_errors: tuple[type[BaseException], ...] = ()

    connection: Any

    def __init__(self, table: str = DEFAULT_TABLE) -> None:
        if not _TABLE_RE.fullmatch(table):
            raise ValueError(f"table name {table!r}: use letters, digits and _ (schema.table)")
        self.table = table
        self._fence: int | None = None
        self._closed = False

    def _bump_fence(self, shard: str) -> tuple[int, bytes]:
        """In a transaction of its own: increment the shard's fence (insert
        its row with fence 1 if there is none) and return the new fence and
        the checkpoint stored; committed when this returns."""
        raise NotImplementedError

    def restore_checkpoint(self, shard: Shard) -> Checkpoint:
        """The shard's last committed checkpoint (empty at first); fences off
        every instance that restored before."""
        with store_failures(self, "could not restore", shard.id, self._driver_errors):
            fence, data = self._bump_fence(shard.id)
        self._fence = fence
        try:
            return Checkpoint.from_bytes(bytes(data))
        except CheckpointError as exc:
            raise StoreError(
                f"shard {shard.id}: the checkpoint in {self.table} is not a checkpoint: {exc}",
                shard=shard.id, store=type(self).__name__,
            ) from exc

    def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` where the fence is still ours, then commit it
        with the application's statements; ``FencedError`` otherwise."""
        if self._fence is None:
            raise ConsumerError(
                f"{type(self).__name__}: restore_checkpoint() before start_commit()"
            )
        m = self._MARK
        with store_failures(self, "could not commit", shard.id, self._driver_errors):
            cur = self.connection.execute(
                f"UPDATE {self.table} SET checkpoint = {m} WHERE shard = {m} AND fence = {m}",
                (checkpoint.to_bytes(), shard.id, self._fence),
            )
            if cur.rowcount != 1:
                self.connection.rollback()
                raise FencedError(
                    f"shard {shard.id}: another instance restored it from {self.table}"
                    f" (its fence is no longer {self._fence})", shard=shard.id,
                )
            self.connection.commit()

    def read_checkpoints(self) -> dict[str, Checkpoint]:
        """Every shard's last committed checkpoint in the table, read without
        fencing anything (for inspection: ``exactly shards show``)."""
        rows = self.connection.execute(
            f"SELECT shard, checkpoint FROM {self.table} ORDER BY shard"
        ).fetchall()
        self.connection.rollback()  # end the read transaction a driver may have opened
        return {str(shard): Checkpoint.from_bytes(bytes(data)) for shard, data in rows}

    def close(self) -> None:
        """Roll back what was not committed, and close the connection (once:
        closing again does nothing). A closed store restores and commits no
        more (``StoreError``)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.connection.rollback()
        finally:
            self.connection.close()


class SQLiteStore(SQLStore):
    """A shard's store in a SQLite database file at ``path``.

    The application runs its statements in ``.connection`` (a
    ``sqlite3.Connection``, in Python's default transaction handling: a
    statement that writes opens a transaction); ``start_commit`` writes the
    checkpoint in that transaction and commits it, durably (WAL journal,
    ``synchronous=FULL``). Statements run before ``restore_checkpoint``
    (creating tables, say) are committed by it.

    SQLite has one writer at a time, and its write lock is held from a
    transaction's first write to its commit: another instance of the shard
    waits up to ``timeout`` seconds for it (a stopped process holding it
    keeps a new one waiting until it resumes or dies, when the lock is
    released). Prefer one database file per shard.
    """

    _MARK = "?"
    _driver_errors = (sqlite3.Error,)

    def __init__(
        self, path: str | os.PathLike[str], *, table: str = DEFAULT_TABLE, timeout: float = 60.0
    ) -> None:
        super().__init__(table)
        self.path = os.fspath(path)
        try:
            self.connection: sqlite3.Connection = sqlite3.connect(
                self.path, timeout=timeout, check_same_thread=False
            )
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")
            self.connection.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} (shard TEXT PRIMARY KEY,"
                " fence INTEGER NOT NULL, checkpoint BLOB NOT NULL)"
            )
            self.connection.commit()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the SQLite store: {exc}",
                             store="SQLiteStore") from exc

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    def _bump_fence(self, shard: str) -> tuple[int, bytes]:
        conn = self.connection
        if conn.in_transaction:
            conn.commit()  # the application's set-up statements
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(
                f"{self.path}: the database stayed locked ({exc}): another instance holds"
                " its write lock (a stopped process, mid-transaction?)",
                shard=shard, store="SQLiteStore",
            ) from exc
        try:
            cur = conn.execute(
                f"UPDATE {self.table} SET fence = fence + 1 WHERE shard = ?", (shard,)
            )
            if cur.rowcount == 0:
                conn.execute(
                    f"INSERT INTO {self.table} (shard, fence, checkpoint) VALUES (?, 1, ?)",
                    (shard, b""),
                )
            fence, data = conn.execute(
                f"SELECT fence, checkpoint FROM {self.table} WHERE shard = ?", (shard,)
            ).fetchone()
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        return int(fence), bytes(data)

    def read_checkpoints(self) -> dict[str, Checkpoint]:
        if self.connection.in_transaction:
            raise ConsumerError(f"{self!r}: a transaction is open")
        return super().read_checkpoints()

    @classmethod
    def inspect(cls, path: str | os.PathLike[str], *, table: str = DEFAULT_TABLE
                ) -> dict[str, Checkpoint]:
        """Every shard's last committed checkpoint in the database file at
        ``path``, read without changing the file at all (opened read-only:
        no table made, no journal mode set, nothing fenced), as ``exactly
        shards show`` reads it. ``StoreError`` if it holds no store."""
        uri = "file:" + urllib.parse.quote(os.path.abspath(os.fspath(path))) + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as exc:
            raise StoreError(f"{os.fspath(path)}: cannot open the SQLite store: {exc}",
                             store="SQLiteStore") from exc
        try:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                 (table,)).fetchone()
            if found is None:
                raise StoreError(f"{os.fspath(path)} holds no SQLiteStore (no {table} table)",
                                 store="SQLiteStore")
            rows = conn.execute(f"SELECT shard, checkpoint FROM {table} ORDER BY shard"
                                ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{os.fspath(path)}: cannot read the SQLite store: {exc}",
                             store="SQLiteStore") from exc
        finally:
            conn.close()
        return {str(shard): Checkpoint.from_bytes(bytes(data)) for shard, data in rows}


class PostgresStore(SQLStore):
    """A shard's store in a PostgreSQL database (the ``postgres`` extra:
    ``pip install 'exactly[postgres]'``, which brings psycopg 3).

    ``dsn`` is a libpq connection string or URL. The application runs its
    statements in ``.connection`` (a ``psycopg.Connection``, not in
    autocommit: its first statement opens the transaction);
    ``start_commit`` writes the checkpoint in it and commits. Rows keep
    their own locks, so a stopped instance holds back a new one only on the
    rows its open transaction wrote. ``connect_timeout``: seconds to wait
    for the server to answer at first (None: libpq's default, or what the
    DSN says).
    """

    _MARK = "%s"

    def __init__(self, dsn: str, *, table: str = DEFAULT_TABLE,
                 connect_timeout: float | None = None) -> None:
        super().__init__(table)
        try:
            import psycopg
        except ImportError as exc:
            raise ConsumerError(
                "PostgresStore needs psycopg: pip install 'exactly[postgres]'"
            ) from exc
        self._driver_errors = (psycopg.Error,)
        self.dsn = dsn
        try:
            if connect_timeout is None:
                self.connection: Any = psycopg.connect(dsn)
            else:  # (libpq counts whole seconds)
                self.connection = psycopg.connect(
                    dsn, connect_timeout=max(1, round(connect_timeout)))
            self._create_table()
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the PostgreSQL store: {exc}",
                             store="PostgresStore") from exc

    def __repr__(self) -> str:
        return f"PostgresStore(table={self.table!r})"

    def _create_table(self) -> None:
        import psycopg

        conn = self.connection
        exists = conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0]
        conn.commit()
        if exists is not None:
            return
        try:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} (shard TEXT PRIMARY KEY,"
                " fence BIGINT NOT NULL, checkpoint BYTEA NOT NULL)"
            )
            conn.commit()
        except psycopg.errors.UniqueViolation:
            conn.rollback()  # made by another instance at the same moment

    def _bump_fence(self, shard: str) -> tuple[int, bytes]:
        conn = self.connection
        if conn.info.transaction_status != 0:  # not idle: the set-up statements
            conn.commit()
        try:
            fence, data = conn.execute(
                f"INSERT INTO {self.table} AS t (shard, fence, checkpoint) VALUES (%s, 1, %s)"
                " ON CONFLICT (shard) DO UPDATE SET fence = t.fence + 1"
                " RETURNING fence, checkpoint",
                (shard, b""),
            ).fetchone()
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        return int(fence), bytes(data)
