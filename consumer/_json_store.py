"""``JSONFileStore``: a shard's state as one JSON document, rewritten at each commit.

The store is a directory. Each commit writes the whole state and the
checkpoint as one file, ``<generation>.json``, generation numbers counting
up; the newest file is the store. A commit writes a temporary file, fsyncs
it, then *links* it to the next generation's name and fsyncs the directory.
``link`` never replaces a name that exists: that is the fence.

- ``restore_checkpoint`` reads the newest generation ``g`` and links it
  again as ``g + 1``: an instance that restored earlier, whose next commit
  would be ``g + 1``, finds the name taken and raises ``FencedError``. (If
  that instance committed ``g + 1`` first, the restore sees it and tries
  again from there.)
- Old generations are removed, keeping the newest few. A zombie whose next
  name was removed since could link it again; it then finds a newer
  generation in the directory, removes its file and raises ``FencedError``.
- A crash between writing the temporary file and linking it leaves the
  file behind. A restore removes such files once they are a minute old
  (younger ones may be another instance's, in flight); a zombie whose file
  went that way raises ``FencedError`` at its commit.

Nothing is locked, so a stopped instance (SIGSTOP, a paused VM) never keeps
a new one from restoring. It holds on one machine, or on a shared file
system whose ``link`` is atomic and fails on an existing name (NFSv3+).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from journal.durable import fsync_dir, write_all
from message import Checkpoint, CheckpointError

from ._errors import ConsumerError, FencedError, StoreError, store_failures

if TYPE_CHECKING:
    from ._interfaces import PreparedCommit
    from ._shard import Shard

_NAME: Final = re.compile(r"(\d{16})\.json")
#: Generations kept besides the newest (a few, so that nothing is read
#: while being removed).
_KEEP: Final = 3
#: The name prefix of the temporary files a commit writes.
_TEMP: Final = ".tmp-"
#: A temporary file this many seconds old is left over from a crash: the
#: next restore removes it.
_STALE_TEMP: Final = 60.0


class _Prepared:
    """A commit of a ``JSONFileStore`` written, not yet made the store's."""

    __slots__ = ("_link", "_tmp")

    def __init__(self, link: Callable[[Path], None], tmp: Path) -> None:
        self._link = link
        self._tmp: Path | None = tmp

    def commit(self) -> None:
        tmp, self._tmp = self._tmp, None
        if tmp is None:
            raise ConsumerError("this commit was committed or aborted already")
        self._link(tmp)

    def abort(self) -> None:
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            tmp.unlink(missing_ok=True)


class JSONFileStore:
    """A shard's state, ``.state`` (a dict of JSON values), and its
    checkpoint, written whole and atomically at each commit into the
    directory ``path`` (created if needed; see the module docstring).

    ``restore_checkpoint`` loads ``.state`` as last committed (``{}`` at
    first). The application reads and changes ``.state`` in place during a
    transaction; ``start_commit`` writes it with the checkpoint. Suited to
    state of a few megabytes at most: all of it is written at every commit.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.state: dict[str, Any] = {}
        self._gen: int | None = None  # the generation this instance wrote last
        self._closed = False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise StoreError(f"{self.path}: not a directory: {exc}", store="JSONFileStore") from exc

    def __repr__(self) -> str:
        return f"JSONFileStore({str(self.path)!r})"

    # -- the generations -----------------------------------------------------

    def _file(self, gen: int) -> Path:
        return self.path / f"{gen:016d}.json"

    def _generations(self) -> list[int]:
        gens = []
        for name in os.listdir(self.path):
            m = _NAME.fullmatch(name)
            if m:
                gens.append(int(m.group(1)))
        gens.sort()
        return gens

    def _read(self, gen: int) -> tuple[Checkpoint, dict[str, Any], str | None]:
        """The checkpoint, state and shard id of generation ``gen``."""
        path = self._file(gen)
        try:
            doc = orjson.loads(path.read_bytes())
            state = doc["state"]
            if not isinstance(state, dict):
                raise TypeError(f"its state is a {type(state).__name__}, not an object")
            shard = doc.get("shard")
            return Checkpoint.from_dict(doc["checkpoint"]), state, shard
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, CheckpointError) as exc:
            raise StoreError(
                f"{path}: not a JSONFileStore state file: {exc}", store="JSONFileStore"
            ) from exc

    def _serialize(self, shard: str, checkpoint: Checkpoint, state: dict[str, Any]) -> bytes:
        try:
            return orjson.dumps(
                {"shard": shard, "checkpoint": checkpoint.to_dict(), "state": state}
            )
        except TypeError as exc:
            raise StoreError(
                f"{self.path}: the state is not JSON (str keys, JSON values): {exc}",
                store="JSONFileStore",
            ) from exc

    def _write_temp(self, data: bytes) -> Path:
        tmp = self.path / f"{_TEMP}{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    def _link(self, source: Path, gen: int) -> bool:
        """Make ``source`` generation ``gen``; False if that name is taken."""
        try:
            os.link(source, self._file(gen))
        except FileExistsError:
            return False
        fsync_dir(self.path)
        return True

    # -- Store -----------------------------------------------------------------

    def restore_checkpoint(self, shard: Shard) -> Checkpoint:
        """The last committed checkpoint, with ``.state`` as committed with
        it; fences off every instance that restored before."""
        self._check_open(shard)
        with store_failures(self, "could not restore", shard.id, (OSError,)):
            return self._restore(shard)

    def _restore(self, shard: Shard) -> Checkpoint:
        while True:
            gens = self._generations()
            if not gens:
                tmp = self._write_temp(self._serialize(shard.id, Checkpoint(), {}))
                try:
                    taken = self._link(tmp, 1)
                finally:
                    tmp.unlink(missing_ok=True)
                if taken:
                    self._gen, self.state = 1, {}
                    return Checkpoint()
                continue
            top = gens[-1]
            cp, state, _ = self._read(top)
            if self._link(self._file(top), top + 1):
                self._gen, self.state = top + 1, state
                self._remove_stale_temps()
                return cp

    def _remove_stale_temps(self) -> None:
        """Remove the temporary files that crashes left (see the module
        docstring)."""
        old = time.time() - _STALE_TEMP
        for name in os.listdir(self.path):
            if name.startswith(_TEMP):
                path = self.path / name
                try:
                    if path.stat().st_mtime < old:
                        path.unlink()
                except FileNotFoundError:
                    pass  # (linked and removed by its writer meanwhile)

    def start_commit(self, shard: Shard, checkpoint: Checkpoint) -> None:
        """Write ``.state`` and ``checkpoint`` as the next generation, durably;
        ``FencedError`` if another instance restored since this one did."""
        self.prepare_commit(shard, checkpoint).commit()

    def prepare_commit(self, shard: Shard, checkpoint: Checkpoint) -> PreparedCommit:
        """``start_commit`` in two steps (see ``consumer.PreparedCommit``):
        ``.state`` and ``checkpoint`` are written now to a file of their own,
        durably; its ``commit()`` makes that file the next generation (the
        commit point: ``FencedError`` if fenced off), its ``abort()`` removes
        it. The runtime prepares while the transaction's appends are still
        being made durable, so that the two waits overlap."""
        self._check_open(shard)
        if self._gen is None:
            raise ConsumerError(f"{self!r}: restore_checkpoint() before start_commit()")
        data = self._serialize(shard.id, checkpoint, self.state)
        with store_failures(self, "could not commit", shard.id, (OSError,)):
            return _Prepared(functools.partial(self._commit, shard), self._write_temp(data))

    def _commit(self, shard: Shard, tmp: Path) -> None:
        """Make the prepared file ``tmp`` the next generation."""
        if self._closed:
            tmp.unlink(missing_ok=True)
            self._check_open(shard)
        with store_failures(self, "could not commit", shard.id, (OSError,)):
            self._link_next(shard, tmp)

    def _link_next(self, shard: Shard, tmp: Path) -> None:
        assert self._gen is not None
        nxt = self._gen + 1
        try:
            taken = self._link(tmp, nxt)
        except FileNotFoundError:
            if not self.path.is_dir():
                raise
            # Our file was removed as a crash's by a newer instance's restore.
            taken = False
        finally:
            tmp.unlink(missing_ok=True)
        if not taken:
            raise FencedError(
                f"shard {shard.id}: {self.path} was restored by another instance",
                shard=shard.id,
            )
        gens = self._generations()
        if gens[-1] > nxt:
            # Our next name had been removed as old: a newer instance has
            # long committed past it. Ours is no commit.
            self._file(nxt).unlink(missing_ok=True)
            fsync_dir(self.path)
            raise FencedError(
                f"shard {shard.id}: {self.path} was restored by another instance",
                shard=shard.id,
            )
        self._gen = nxt
        for old in gens:
            if old > nxt - _KEEP:
                break
            self._file(old).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing is held open between commits; a closed store restores and
        commits no more (``StoreError``)."""
        self._closed = True

    def _check_open(self, shard: Shard) -> None:
        if self._closed:
            raise StoreError(f"shard {shard.id}: {self!r} is closed", shard=shard.id,
                             store="JSONFileStore")

    def read_checkpoint(self) -> tuple[str | None, Checkpoint, dict[str, Any]]:
        """The shard id, last committed checkpoint and state, read without
        fencing anything (for inspection: ``exactly shards show``); None,
        an empty checkpoint and ``{}`` before the first restore."""
        for _ in range(10):
            gens = self._generations()
            if not gens:
                return None, Checkpoint(), {}
            try:
                cp, state, shard = self._read(gens[-1])
            except StoreError as exc:
                if isinstance(exc.__cause__, FileNotFoundError):
                    continue  # removed as old while we looked: look again
                raise
            return shard, cp, state
        raise StoreError(f"{self.path}: its generations change too fast to read",
                         store="JSONFileStore")
